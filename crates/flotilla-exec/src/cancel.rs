//! Cancelling a running attempt from another thread.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::reaper::{Attempt, StopReason};

/// Cancels one attempt from any thread: a process gets SIGTERM, then SIGKILL after its grace
/// period (the whole process group); a WASM module is interrupted at its next epoch check
/// (within about 10 ms). Cancelling before the attempt starts makes it end at once as
/// [`Termination::Cancelled`](crate::Termination::Cancelled) without running anything.
///
/// Use a fresh handle per attempt: once cancelled, a handle stays cancelled.
#[derive(Clone, Default)]
pub struct CancelHandle {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    /// The process attempt currently running under this handle, if any.
    running: Mutex<Option<Arc<Attempt>>>,
    /// The grace period of a [`CancelHandle::cancel_with_grace`].
    grace: Mutex<Option<std::time::Duration>>,
}

impl CancelHandle {
    /// A handle that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the attempt (now, or as soon as it starts). Idempotent.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let running = self.inner.running.lock();
        if let Some(attempt) = running.as_ref() {
            attempt.stop(StopReason::Cancelled);
        }
    }

    /// Cancels with `grace` between SIGTERM and SIGKILL instead of the attempt's own: a
    /// preempted task gets its worker's grace period to write its checkpoint. Idempotent;
    /// an attempt already being stopped keeps its first deadline.
    pub fn cancel_with_grace(&self, grace: std::time::Duration) {
        *self.inner.grace.lock() = Some(grace);
        self.inner.cancelled.store(true, Ordering::SeqCst);
        let running = self.inner.running.lock();
        if let Some(attempt) = running.as_ref() {
            attempt.stop_with(StopReason::Cancelled, Some(grace));
        }
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Registers a started process attempt; stops it at once if the handle was already
    /// cancelled. Checking the flag under the same lock as `cancel` closes the race.
    pub(crate) fn attach(&self, attempt: &Arc<Attempt>) {
        let mut running = self.inner.running.lock();
        *running = Some(Arc::clone(attempt));
        if self.is_cancelled() {
            attempt.stop_with(StopReason::Cancelled, *self.inner.grace.lock());
        }
    }

    /// Forgets the process attempt (it has ended).
    pub(crate) fn detach(&self) {
        self.inner.running.lock().take();
    }
}

impl fmt::Debug for CancelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelHandle")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
