//! Idle CPU workers park here and are woken when work arrives.
//!
//! # Protocol
//! A worker that found no work marks itself sleeping (`SeqCst`), looks for work once more,
//! and only then parks. Whoever pushes work issues a `SeqCst` fence and, if any worker is
//! marked sleeping, unparks one (or the one it targeted). `crossbeam_utils::sync::Parker`
//! keeps the unpark token, so an unpark that lands between the last look and `park` is not
//! lost: `park` returns at once. Either the worker's second look sees the push, or the
//! pusher sees the sleeping mark; the `SeqCst` ordering of the mark, the fence and the
//! loads rules out both missing each other.
//!
//! Waking costs a system call, so (as in rayon) a push wakes nobody while some worker is
//! *awake but idle* (spinning before it parks): that worker will find the job. A worker
//! stops counting as idle-awake only after it has marked itself sleeping and before its
//! last look, so a pusher that saw it idle-awake pushed before that last look.

use crate::sync::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering, Parker, Unparker};

/// The sleeping state of all CPU workers.
pub(crate) struct Sleep {
    sleeping: Vec<AtomicBool>,
    n_sleeping: AtomicUsize,
    idle_awake: AtomicUsize,
    /// Counts pushes; an idle worker that sees it move stays awake instead of parking
    /// (work is flowing, so it will likely be needed soon, and a wake-up is a system call).
    posted: AtomicU64,
    unparkers: Vec<Unparker>,
}

impl Sleep {
    /// Makes the state for `n` workers, returning the parkers each worker keeps.
    pub(crate) fn new(n: usize) -> (Self, Vec<Parker>) {
        let parkers: Vec<Parker> = (0..n).map(|_| Parker::new()).collect();
        let unparkers = parkers.iter().map(|p| p.unparker().clone()).collect();
        let sleeping = (0..n).map(|_| AtomicBool::new(false)).collect();
        (
            Self {
                sleeping,
                n_sleeping: AtomicUsize::new(0),
                idle_awake: AtomicUsize::new(0),
                posted: AtomicU64::new(0),
                unparkers,
            },
            parkers,
        )
    }

    /// A worker found no work and starts spinning.
    pub(crate) fn start_idle(&self) {
        self.idle_awake.fetch_add(1, Ordering::SeqCst);
    }

    /// A spinning worker found work.
    pub(crate) fn end_idle(&self) {
        self.idle_awake.fetch_sub(1, Ordering::SeqCst);
    }

    /// Parks idle worker `idx` unless `has_work` finds something after the sleeping mark is
    /// set. The worker must have called `start_idle`; it is no longer idle-awake after this.
    pub(crate) fn sleep(&self, idx: usize, parker: &Parker, has_work: impl Fn() -> bool) {
        self.sleeping[idx].store(true, Ordering::SeqCst);
        self.n_sleeping.fetch_add(1, Ordering::SeqCst);
        self.idle_awake.fetch_sub(1, Ordering::SeqCst);
        if !has_work() {
            parker.park();
        }
        self.n_sleeping.fetch_sub(1, Ordering::SeqCst);
        self.sleeping[idx].store(false, Ordering::SeqCst);
    }

    /// How many pushes there have been.
    pub(crate) fn posted(&self) -> u64 {
        self.posted.load(Ordering::Relaxed)
    }

    /// After pushing shared work: wakes one sleeping worker, if any.
    pub(crate) fn wake_any(&self) {
        self.posted.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.n_sleeping.load(Ordering::SeqCst) == 0 || self.idle_awake.load(Ordering::SeqCst) > 0
        {
            return;
        }
        for (i, s) in self.sleeping.iter().enumerate() {
            if s.load(Ordering::SeqCst) {
                self.unparkers[i].unpark();
                return;
            }
        }
    }

    /// After pushing work only worker `idx` may take: wakes it.
    pub(crate) fn wake(&self, idx: usize) {
        fence(Ordering::SeqCst);
        if self.sleeping[idx].load(Ordering::SeqCst) {
            self.unparkers[idx].unpark();
        }
    }

    /// Wakes every worker (shutdown).
    pub(crate) fn wake_all(&self) {
        fence(Ordering::SeqCst);
        for u in &self.unparkers {
            u.unpark();
        }
    }
}

/// Shuttle models of the protocol: many interleavings of workers going to sleep and pushers
/// waking them (depth first, up to 50,000 schedules, for one worker; random and PCT schedules
/// for two). A lost wake-up leaves every thread blocked, which shuttle reports as a deadlock.
/// Checked against the classic bug: with `sleep` looking for work *before* setting its
/// sleeping mark, the two-worker model reports the deadlock (13 s on the 2-core machine).
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_models {
    use shuttle::sync::{Arc, Condvar, Mutex};

    use super::*;

    /// Jobs pushed and not yet taken, and how many were taken (with a condition variable the
    /// test waits on).
    struct Work {
        queued: AtomicUsize,
        taken: Mutex<usize>,
        taken_cv: Condvar,
        terminate: AtomicBool,
    }

    impl Work {
        fn try_take(&self) -> bool {
            let took = self
                .queued
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if took {
                *self.taken.lock().expect("not poisoned") += 1;
                self.taken_cv.notify_all();
            }
            took
        }

        fn has_work(&self) -> bool {
            self.queued.load(Ordering::SeqCst) > 0 || self.terminate.load(Ordering::SeqCst)
        }
    }

    /// A CPU worker's loop as `worker.rs` runs it: take work, else go idle and look once
    /// more, else sleep.
    fn worker(sleep: &Sleep, idx: usize, parker: &Parker, work: &Work) {
        loop {
            if work.try_take() {
                continue;
            }
            if work.terminate.load(Ordering::SeqCst) {
                return;
            }
            sleep.start_idle();
            if work.has_work() {
                sleep.end_idle();
                continue;
            }
            sleep.sleep(idx, parker, || work.has_work());
        }
    }

    fn scenario(workers: usize, jobs: usize) -> impl Fn() + Send + Sync + 'static {
        move || {
            let (sleep, parkers) = Sleep::new(workers);
            let sleep = Arc::new(sleep);
            let work = Arc::new(Work {
                queued: AtomicUsize::new(0),
                taken: Mutex::new(0),
                taken_cv: Condvar::new(),
                terminate: AtomicBool::new(false),
            });
            let mut threads = Vec::new();
            for (i, parker) in parkers.into_iter().enumerate() {
                let (s, w) = (sleep.clone(), work.clone());
                threads.push(shuttle::thread::spawn(move || worker(&s, i, &parker, &w)));
            }
            let (s, w) = (sleep.clone(), work.clone());
            let pusher = shuttle::thread::spawn(move || {
                for _ in 0..jobs {
                    w.queued.fetch_add(1, Ordering::SeqCst);
                    s.wake_any();
                }
            });
            pusher.join().expect("the pusher ends");
            // Every job is taken without any further wake-up: if one was lost, every thread
            // blocks here and shuttle reports the deadlock.
            let mut taken = work.taken.lock().expect("not poisoned");
            while *taken < jobs {
                taken = work.taken_cv.wait(taken).expect("not poisoned");
            }
            drop(taken);
            work.terminate.store(true, Ordering::SeqCst);
            sleep.wake_all();
            for t in threads {
                t.join().expect("a worker ends");
            }
        }
    }

    #[test]
    fn shuttle_one_worker_never_misses_a_push() {
        shuttle::check_dfs(scenario(1, 1), Some(50_000));
    }

    #[test]
    fn shuttle_two_workers_take_every_push_while_one_spins_idle() {
        shuttle::check_random(scenario(2, 2), 20_000);
        shuttle::check_pct(scenario(2, 3), 20_000, 3);
    }
}
