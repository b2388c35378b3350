//! A WASI stdout/stderr that creates its file at the first byte written.
//!
//! Most WASM tasks print nothing; creating and deleting two log files per attempt then costs
//! more than running the module (ext4 inode allocation shows at the top of a profile of a
//! chain of no-op tasks). With this stream a module that prints nothing leaves no file.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// The file behind one or two streams (stdout and stderr may share it), opened on demand.
#[derive(Clone)]
pub(crate) struct LazyFile {
    path: Arc<PathBuf>,
    file: Arc<Mutex<Option<File>>>,
}

impl LazyFile {
    pub(crate) fn new(path: PathBuf) -> Self {
        LazyFile {
            path: Arc::new(path),
            file: Arc::new(Mutex::new(None)),
        }
    }

    fn write_all(&self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut guard = self.file.lock();
        if guard.is_none() {
            if let Some(parent) = self.path.parent() {
                if !parent.as_os_str().is_empty() && !parent.is_dir() {
                    std::fs::create_dir_all(parent)?;
                }
            }
            *guard = Some(File::create(&*self.path)?);
        }
        match guard.as_mut() {
            Some(f) => f.write_all(bytes),
            None => Ok(()),
        }
    }

    fn flush(&self) -> std::io::Result<()> {
        match self.file.lock().as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl IsTerminal for LazyFile {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LazyFile {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for LazyFile {
    async fn ready(&mut self) {}
}

impl OutputStream for LazyFile {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_all(&bytes)
            .map_err(|e| StreamError::LastOperationFailed(wasmtime::format_err!(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        LazyFile::flush(self)
            .map_err(|e| StreamError::LastOperationFailed(wasmtime::format_err!(e)))
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(1 << 20)
    }
}

impl AsyncWrite for LazyFile {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.write_all(buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(LazyFile::flush(&self))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
