//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong in a device backend or a kernel.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DevicesError {
    /// A kernel or device call got arguments that do not describe valid matrices or buffers
    /// (a leading dimension below the row count, a slice or buffer too short, a buffer of
    /// another device, an output aliasing an input, a size that does not fit the backend).
    #[error("bad arguments to {op}: {reason}")]
    BadArgs {
        /// The operation that rejected its arguments (`"gemm"`, `"upload"`, ...).
        op: &'static str,
        /// What is wrong with them.
        reason: String,
    },
    /// An allocation did not fit in the device's memory.
    #[error("out of memory on {device}: requested {requested} bytes, {available} available")]
    OutOfMemory {
        /// The device's name.
        device: String,
        /// Bytes requested.
        requested: u64,
        /// Bytes still free according to the device's accounting (or 0 when unknown).
        available: u64,
    },
    /// The device cannot run this operation (e.g. f64 without `cl_khr_fp64`).
    #[error("{what} is not supported on {device}")]
    Unsupported {
        /// The device's name.
        device: String,
        /// The unsupported operation or type.
        what: String,
    },
    /// Cholesky factorisation found a non-positive pivot.
    #[error("matrix is not positive definite: non-positive pivot in column {column}")]
    NotPositiveDefinite {
        /// The 0-based column of the first non-positive pivot.
        column: usize,
    },
    /// The backend library (OpenCL, CUDA, cuBLAS, cuSOLVER) reported a failure.
    #[error("{backend} error on {device} during {op}: {message}")]
    Backend {
        /// `"opencl"` or `"cuda"`.
        backend: &'static str,
        /// The device's name.
        device: String,
        /// The operation that failed.
        op: &'static str,
        /// The backend's message or error code.
        message: String,
    },
}

/// The crate's result type.
pub type Result<T, E = DevicesError> = std::result::Result<T, E>;

impl DevicesError {
    /// Shorthand for [`DevicesError::BadArgs`].
    pub(crate) fn bad_args(op: &'static str, reason: impl Into<String>) -> Self {
        DevicesError::BadArgs {
            op,
            reason: reason.into(),
        }
    }
}
