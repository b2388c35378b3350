//! The shared state of one runtime: queues, sleeping workers, devices, data, the
//! scheduler's state, and the thread-local view a worker has of it.
//!
//! # Queues
//! - `injector`: the central queue (`eager`, and work submitted from outside a worker).
//! - one `crossbeam_deque::Worker` per CPU worker (LIFO for the owner, FIFO steals): the
//!   `ws` policy and closures spawned from inside a worker go there.
//! - `mailboxes`: one per CPU worker for tasks a policy placed on that unit (`dmda`,
//!   `random`); only the owner takes from its mailbox.
//! - one channel per device for tasks placed on that device (see `device.rs`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use parking_lot::{Condvar, Mutex};

use crate::data::DataManager;
use crate::device::DeviceQueue;
use crate::error::RuntimeError;
use crate::job::Job;
use crate::place::{SchedState, UnitTable};
use crate::runtime::LinkObservations;
use crate::sleep::Sleep;
use crate::trace::Tracer;
use flotilla_sched::PolicyKind;

/// Everything the workers of one runtime share.
pub(crate) struct Registry {
    pub(crate) injector: Injector<Job>,
    pub(crate) stealers: Vec<Stealer<Job>>,
    pub(crate) mailboxes: Vec<Injector<Job>>,
    pub(crate) sleep: Sleep,
    pub(crate) terminate: AtomicBool,
    pub(crate) n_cpu: usize,
    pub(crate) devices: Vec<DeviceQueue>,
    pub(crate) policy_kind: PolicyKind,
    pub(crate) units: UnitTable,
    pub(crate) sched: Mutex<SchedState>,
    pub(crate) links: Arc<LinkObservations>,
    pub(crate) data: DataManager,
    pub(crate) tracer: Option<Arc<Tracer>>,
    /// Codelet tasks submitted and not yet finished.
    pub(crate) outstanding: AtomicUsize,
    pub(crate) idle_lock: Mutex<()>,
    pub(crate) idle_cv: Condvar,
    /// Failures since the last `wait_all`.
    pub(crate) failures: Mutex<Vec<RuntimeError>>,
    pub(crate) failure_count: AtomicUsize,
    /// Codelet tasks executed per unit.
    pub(crate) executed: Vec<std::sync::atomic::AtomicU64>,
}

thread_local! {
    static CURRENT: Cell<*const WorkerThread> = const { Cell::new(std::ptr::null()) };
}

/// What a CPU worker thread knows about itself; reachable through a thread-local while the
/// worker runs.
pub(crate) struct WorkerThread {
    pub(crate) registry: Arc<Registry>,
    pub(crate) index: usize,
    pub(crate) local: Worker<Job>,
    /// Set while this worker completes a task: it goes back to its loop right after, so a
    /// task it readies onto its empty deque needs no wake-up (it takes it itself).
    pub(crate) completing: std::cell::Cell<bool>,
}

impl WorkerThread {
    /// Runs `f` with this worker installed as the current thread's worker.
    pub(crate) fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(std::ptr::null()));
            }
        }
        CURRENT.with(|c| c.set(self as *const WorkerThread));
        let _reset = Reset;
        f()
    }

    /// The current thread's worker, if this thread is a CPU worker of some runtime.
    pub(crate) fn with_current<R>(f: impl FnOnce(Option<&WorkerThread>) -> R) -> R {
        CURRENT.with(|c| {
            let p = c.get();
            // SAFETY: the pointer is set by `install` for the duration of the worker's main
            // loop, which outlives every use on this thread, and reset when it returns.
            let w = if p.is_null() {
                None
            } else {
                Some(unsafe { &*p })
            };
            f(w)
        })
    }

    /// Looks for work: own deque, own mailbox, the central queue, then the others' deques.
    pub(crate) fn find_work(&self) -> Option<Job> {
        if let Some(j) = self.local.pop() {
            return Some(j);
        }
        let reg = &*self.registry;
        loop {
            let mut retry = false;
            match reg.mailboxes[self.index].steal() {
                Steal::Success(j) => return Some(j),
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
            match reg.injector.steal_batch_and_pop(&self.local) {
                Steal::Success(j) => {
                    if !reg.injector.is_empty() {
                        reg.sleep.wake_any();
                    }
                    return Some(j);
                }
                Steal::Retry => retry = true,
                Steal::Empty => {}
            }
            let n = reg.stealers.len();
            for k in 1..n {
                let victim = (self.index + k) % n;
                match reg.stealers[victim].steal() {
                    Steal::Success(j) => return Some(j),
                    Steal::Retry => retry = true,
                    Steal::Empty => {}
                }
            }
            if !retry {
                return None;
            }
        }
    }
}

impl Registry {
    /// Whether any queue a CPU worker `idx` may take from holds work.
    pub(crate) fn has_work_for(&self, idx: usize) -> bool {
        !self.mailboxes[idx].is_empty()
            || !self.injector.is_empty()
            || self.stealers.iter().any(|s| !s.is_empty())
    }

    /// Pushes a closure: on the current worker's deque if called from a worker of this
    /// runtime, else on the central queue.
    pub(crate) fn push_closure(self: &Arc<Self>, job: Job) {
        self.push_local_or_central(job);
    }

    /// Pushes work on the current worker's deque (work stealing) or the central queue.
    pub(crate) fn push_local_or_central(self: &Arc<Self>, job: Job) {
        let (job, quiet) = WorkerThread::with_current(|w| match w {
            Some(w) if Arc::ptr_eq(&w.registry, self) => {
                let quiet = w.completing.get() && w.local.is_empty();
                w.local.push(job);
                (None, quiet)
            }
            _ => (Some(job), false),
        });
        if let Some(job) = job {
            self.injector.push(job);
        }
        if !quiet {
            self.sleep.wake_any();
        }
    }

    /// Pushes work on the central queue.
    pub(crate) fn push_central(&self, job: Job) {
        self.injector.push(job);
        self.sleep.wake_any();
    }

    /// Pushes work into CPU worker `idx`'s mailbox.
    pub(crate) fn push_mailbox(&self, idx: usize, job: Job) {
        self.mailboxes[idx].push(job);
        self.sleep.wake(idx);
    }

    /// Counts a finished (or failed) codelet task; wakes `wait_all` when none is left.
    pub(crate) fn task_finished(&self) {
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _g = self.idle_lock.lock();
            self.idle_cv.notify_all();
        }
    }

    /// Records a task failure for `wait_all` to report.
    pub(crate) fn record_failure(&self, e: RuntimeError) {
        self.failure_count.fetch_add(1, Ordering::AcqRel);
        let mut f = self.failures.lock();
        if f.len() < 16 {
            f.push(e);
        }
    }
}
