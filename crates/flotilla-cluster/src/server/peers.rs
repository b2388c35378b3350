//! Connections per peer on the coordinator's gRPC listener: a peer address (IP) may hold at
//! most a given number of connections at once; one more is closed as soon as it is accepted,
//! before TLS or HTTP/2 cost anything. Streams per token are bounded separately
//! (`rpc::StreamCounts`); this bounds what a peer can hold open before it even
//! authenticates.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Open connections per peer address.
#[derive(Default)]
struct Counts {
    open: HashMap<IpAddr, usize>,
    /// When a refusal was last logged (one line a minute, not one per connection).
    logged: Option<Instant>,
}

/// An accepted connection, counted against its peer until dropped.
pub(crate) struct Counted {
    stream: TcpStream,
    peer: Option<IpAddr>,
    counts: Arc<Mutex<Counts>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(ip) = self.peer {
            let mut c = self.counts.lock();
            if let Some(n) = c.open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    c.open.remove(&ip);
                }
            }
        }
    }
}

impl Connected for Counted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections of `listener`, at most `per_peer` open at once from one IP address (more
/// are closed at once, logged once a minute); accept errors are passed on.
pub(crate) fn incoming(
    listener: TcpListener,
    per_peer: usize,
) -> impl Stream<Item = io::Result<Counted>> {
    let counts = Arc::new(Mutex::new(Counts::default()));
    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| {
        let counts = counts.clone();
        async move {
            let stream = match accepted {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            // tonic sets TCP_NODELAY only on the sockets it accepts itself: without it, a
            // reply's frames written apart wait for the client's delayed ACK (40 ms a request).
            let _ = stream.set_nodelay(true);
            let peer = stream.peer_addr().ok().map(|a| a.ip());
            if let Some(ip) = peer {
                let mut c = counts.lock();
                let n = c.open.entry(ip).or_default();
                if *n >= per_peer {
                    if c.logged
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
                    {
                        c.logged = Some(Instant::now());
                        tracing::warn!(
                            "refusing connections from {ip}: it holds {per_peer} already \
                             (`flotilla server --max-connections-per-peer`)"
                        );
                    }
                    // Dropped: closed before TLS or HTTP/2 begin.
                    return None;
                }
                *n += 1;
            }
            Some(Ok(Counted {
                stream,
                peer,
                counts,
            }))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: the sockets this listener accepts had Nagle's algorithm on (tonic sets
    /// TCP_NODELAY only on those it accepts itself), so every reply waited ~40 ms for the
    /// client's delayed ACK.
    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(incoming(listener, 4));
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.stream.nodelay().unwrap(), "TCP_NODELAY is off");
    }
}
