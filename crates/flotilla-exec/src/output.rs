//! Where an attempt's stdout and stderr go.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where one output stream of an attempt goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Output {
    /// Discarded (`/dev/null`).
    #[default]
    Null,
    /// Written to this file, created (with its parent folders) or truncated. When stdout and
    /// stderr name the same file they share one open file, so their lines interleave in order
    /// instead of overwriting each other. `flotilla logs` follows these files. For a WASM
    /// module the file is created at the first byte written, so a module that prints nothing
    /// leaves none (a process needs it open before it starts).
    File(PathBuf),
    /// Shared with the executor's own stream (for tests and interactive use).
    Inherit,
}

/// An output stream, opened.
#[derive(Debug)]
pub(crate) enum Opened {
    Null,
    File(File),
    Inherit,
}

fn create(path: &Path) -> Result<File> {
    let err = |source| Error::OutputFile {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            fs::create_dir_all(parent).map_err(err)?;
        }
    }
    File::create(path).map_err(err)
}

fn open(output: &Output) -> Result<Opened> {
    Ok(match output {
        Output::Null => Opened::Null,
        Output::Inherit => Opened::Inherit,
        Output::File(path) => Opened::File(create(path)?),
    })
}

/// Opens stdout and stderr; the same path twice yields one file description shared by both.
pub(crate) fn open_pair(stdout: &Output, stderr: &Output) -> Result<(Opened, Opened)> {
    if let (Output::File(a), Output::File(b)) = (stdout, stderr) {
        if a == b {
            let file = create(a)?;
            let twin = file.try_clone().map_err(|source| Error::OutputFile {
                path: a.clone(),
                source,
            })?;
            return Ok((Opened::File(file), Opened::File(twin)));
        }
    }
    Ok((open(stdout)?, open(stderr)?))
}
