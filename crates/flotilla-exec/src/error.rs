//! The crate's error type: only for attempts that could not start (a task that ran and failed
//! is an [`Outcome`](crate::Outcome), not an error).

use std::io;
use std::path::PathBuf;

/// Why an attempt could not be started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process spec had an empty `cmd`.
    #[error("empty command: a process task needs at least a program name")]
    EmptyCommand,
    /// The working directory does not exist or is not a directory.
    #[error("working directory {} does not exist or is not a directory", path.display())]
    CwdMissing {
        /// The directory that was asked for.
        path: PathBuf,
    },
    /// The program was not found (not on `PATH`, or no such file).
    #[error("command `{command}` not found (working directory {})", cwd.display())]
    CommandNotFound {
        /// The program name as given in `cmd[0]`.
        command: String,
        /// The working directory it was looked up from.
        cwd: PathBuf,
    },
    /// The program exists but could not be started (permissions, exec format, a limit that
    /// could not be applied, ...).
    #[error("could not start `{command}` in {}: {source}", cwd.display())]
    Spawn {
        /// The program name as given in `cmd[0]`.
        command: String,
        /// The working directory.
        cwd: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A stdout/stderr capture file could not be created.
    #[error("could not create output file {}: {source}", path.display())]
    OutputFile {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A cgroup could not be set up.
    #[error("could not {what} for cgroup {}: {source}", path.display())]
    Cgroup {
        /// What was being done, e.g. "create the directory" or "write memory.max".
        what: &'static str,
        /// The cgroup directory.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// Waiting for the child failed (should not happen).
    #[error("waiting for process {pid} failed: {source}")]
    Wait {
        /// The child's pid.
        pid: i32,
        /// What the operating system said.
        source: io::Error,
    },
    /// The executor's timer thread could not be started.
    #[error("could not start the executor's {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// What the operating system said.
        source: io::Error,
    },
    /// A WASM module file could not be read.
    #[error("could not read wasm module {}: {source}", path.display())]
    ModuleRead {
        /// The module file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A WASM module did not compile or link (invalid binary or text, unknown imports).
    #[error("invalid wasm module {}: {message}", path.display())]
    ModuleInvalid {
        /// The module file.
        path: PathBuf,
        /// wasmtime's explanation.
        message: String,
    },
    /// The shared wasmtime engine could not be created.
    #[error("could not set up the wasm engine: {message}")]
    Engine {
        /// wasmtime's explanation.
        message: String,
    },
    /// A WASM attempt could not be set up (missing entry export, preopen dir, engine).
    #[error("cannot run wasm module {}: {message}", path.display())]
    WasmSetup {
        /// The module file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
