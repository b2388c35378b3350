//! The runtime's errors.

use thiserror::Error;

/// What went wrong in the runtime.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// A task's implementation returned an error or panicked.
    #[error("task {task} ({codelet}) failed on {unit}: {message}")]
    TaskFailed {
        /// The task's number in submission order.
        task: u64,
        /// The codelet's name.
        codelet: String,
        /// Where it ran.
        unit: String,
        /// What the implementation said.
        message: String,
    },
    /// A task was not run because a task it depends on failed.
    #[error("task {task} ({codelet}) not run: a task it depends on failed")]
    DependencyFailed {
        /// The task's number in submission order.
        task: u64,
        /// The codelet's name.
        codelet: String,
    },
    /// Data read back (`read`, `unregister`) whose last writer failed: it holds what it
    /// held before, not what the program computed.
    #[error("data {data}: the last task that wrote it failed, so it does not hold what the program computed (wait_all() returns that failure; a task that writes it whole, with .write, makes it valid again)")]
    Poisoned {
        /// The data's id.
        data: String,
    },
    /// A submitted task can run nowhere on this runtime.
    #[error("codelet {codelet}: no implementation for any unit of this runtime (has: {has})")]
    NoImplementation {
        /// The codelet's name.
        codelet: String,
        /// The kinds it has implementations for.
        has: String,
    },
    /// A submission is malformed (e.g. the same data written twice by one task).
    #[error("bad submission of codelet {codelet}: {reason}")]
    BadSubmission {
        /// The codelet's name.
        codelet: String,
        /// Why.
        reason: String,
    },
    /// A device operation failed.
    #[error("device {device}: {source}")]
    Device {
        /// The device's name.
        device: String,
        /// The backend's error.
        #[source]
        source: flotilla_devices::DevicesError,
    },
    /// A device's memory is full of replicas pinned by running or prefetched tasks.
    #[error("device {device}: out of memory for data {data} ({bytes} bytes): {used} of {capacity} bytes are pinned by running or prefetched tasks")]
    DeviceFull {
        /// The device's name.
        device: String,
        /// The data that did not fit.
        data: String,
        /// Its size.
        bytes: u64,
        /// Bytes in use on the device.
        used: u64,
        /// The device's capacity for Flotilla.
        capacity: u64,
    },
    /// Reading or writing the performance model store or the trace failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime could not be configured as asked.
    #[error("runtime configuration: {0}")]
    Config(String),
    /// Several tasks failed; the first errors are listed.
    #[error("{count} task(s) failed; first: {first}")]
    Many {
        /// How many failed.
        count: usize,
        /// The first failure.
        first: Box<RuntimeError>,
    },
}

/// The runtime's result type.
pub type Result<T> = std::result::Result<T, RuntimeError>;
