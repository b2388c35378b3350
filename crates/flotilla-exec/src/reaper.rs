//! The shared timer that stops process attempts: one thread for the whole executor, however
//! many attempts run.
//!
//! # Protocol
//!
//! Each process attempt is an [`Attempt`]: the child's process-group id, the SIGTERM→SIGKILL
//! grace period and a small state (`done`, the first stop reason, whether SIGTERM was sent,
//! the timer keys it owns). The waiting thread blocks in `waitid(WNOWAIT)`, so the exited
//! child stays a zombie and its pid (hence its process-group id) cannot be reused; it then
//! calls [`Attempt::finish`], which sets `done` under the attempt lock, and only after that
//! reaps the child. The timer and [`CancelHandle`](crate::CancelHandle) signal the group only
//! under the same lock and only while `done` is false, so they can never signal a reused id.
//!
//! Deadlines live in a `BTreeMap` keyed by `(instant, sequence)`; finishing removes an
//! attempt's keys, so a long timeout on a short task leaves nothing behind. Lock order:
//! cancel slot → attempt state → timer queue. The timer thread never holds its queue lock
//! while it takes an attempt lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{const_mutex, Condvar, Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Why the executor stopped an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    TimedOut,
    Cancelled,
}

type Key = (Instant, u64);

#[derive(Debug, Clone, Copy)]
enum Action {
    /// SIGTERM the group (recording why), then SIGKILL after the grace period.
    Stop(StopReason),
    /// SIGKILL the group.
    Kill,
}

/// One running process attempt, shared by its waiting thread, the timer and its cancel handle.
#[derive(Debug)]
pub(crate) struct Attempt {
    pgid: libc::pid_t,
    /// In a bubblewrap sandbox of its own, the task's process group (bwrap's `--new-session`
    /// puts it in a session of its own); 0 when none. SIGTERM goes to it alone: SIGTERM to
    /// bwrap would kill bwrap, and with it (`--die-with-parent`) the task, with no grace.
    inner: std::sync::atomic::AtomicI32,
    grace: Duration,
    state: Mutex<AttemptState>,
}

#[derive(Debug, Default)]
struct AttemptState {
    done: bool,
    reason: Option<StopReason>,
    term_sent: bool,
    keys: Vec<Key>,
}

impl Attempt {
    /// An attempt whose child leads process group `pgid`.
    pub(crate) fn new(pgid: libc::pid_t, grace: Duration) -> Arc<Self> {
        Arc::new(Attempt {
            pgid,
            inner: std::sync::atomic::AtomicI32::new(0),
            grace,
            state: Mutex::new(AttemptState::default()),
        })
    }

    /// The task's own process group inside a bubblewrap sandbox (see `inner`).
    pub(crate) fn set_inner(&self, pgid: libc::pid_t) {
        if pgid > 1 {
            self.inner.store(pgid, Ordering::Release);
        }
    }

    /// Stops the attempt with [`StopReason::TimedOut`] at `at`.
    pub(crate) fn arm_timeout(self: &Arc<Self>, at: Instant) -> Result<()> {
        let timer = timer()?;
        let mut state = self.state.lock();
        if !state.done {
            let key = timer.schedule(at, Arc::clone(self), Action::Stop(StopReason::TimedOut));
            state.keys.push(key);
        }
        Ok(())
    }

    /// SIGTERMs the group now and SIGKILLs it after the grace period, unless the attempt has
    /// ended or is already being stopped. The first reason given is the one reported.
    pub(crate) fn stop(self: &Arc<Self>, reason: StopReason) {
        self.stop_with(reason, None);
    }

    /// [`Attempt::stop`] with `grace` instead of the attempt's own grace period, if given.
    pub(crate) fn stop_with(self: &Arc<Self>, reason: StopReason, grace: Option<Duration>) {
        let grace = grace.unwrap_or(self.grace);
        let mut state = self.state.lock();
        if state.done {
            return;
        }
        state.reason.get_or_insert(reason);
        if state.term_sent {
            return;
        }
        state.term_sent = true;
        if grace.is_zero() {
            self.signal(libc::SIGKILL);
            return;
        }
        self.signal(libc::SIGTERM);
        // A stopped (SIGSTOP) process would not see SIGTERM until continued.
        self.signal(libc::SIGCONT);
        match timer() {
            Ok(timer) => {
                let key = timer.schedule(Instant::now() + grace, Arc::clone(self), Action::Kill);
                state.keys.push(key);
            }
            // Without a timer thread there is no grace period: kill at once.
            Err(_) => self.signal(libc::SIGKILL),
        }
    }

    fn kill(&self) {
        let state = self.state.lock();
        if !state.done {
            self.signal(libc::SIGKILL);
        }
    }

    /// Sends `sig` to the whole group (SIGTERM and SIGCONT to the sandboxed task's group
    /// alone, when it has one). Callers hold the state lock with `done == false`.
    fn signal(&self, sig: libc::c_int) {
        let inner = self.inner.load(Ordering::Acquire);
        if inner > 1 {
            // SAFETY: killpg has no memory-safety preconditions. The inner group is led by
            // the sandbox's init, a child of bwrap, which leads `pgid` and has not exited
            // (`done` is false); once the init exits, bwrap exits with it.
            unsafe {
                libc::killpg(inner, sig);
            }
            if sig != libc::SIGKILL {
                return;
            }
        }
        // SAFETY: killpg has no memory-safety preconditions; the group id is still ours (see
        // the module doc). ESRCH (the group is gone) is fine to ignore.
        unsafe {
            libc::killpg(self.pgid, sig);
        }
    }

    /// Marks the attempt ended (nothing will signal its group afterwards), drops its timers
    /// and returns why the executor stopped it, if it did.
    pub(crate) fn finish(&self) -> Option<StopReason> {
        let (keys, reason) = {
            let mut state = self.state.lock();
            state.done = true;
            (std::mem::take(&mut state.keys), state.reason)
        };
        if !keys.is_empty() {
            TIMER.cancel(&keys);
        }
        reason
    }
}

struct Timer {
    queue: Mutex<BTreeMap<Key, (Arc<Attempt>, Action)>>,
    seq: Mutex<u64>,
    wake: Condvar,
}

static TIMER: Timer = Timer {
    queue: const_mutex(BTreeMap::new()),
    seq: const_mutex(0),
    wake: Condvar::new(),
};
static STARTED: AtomicBool = AtomicBool::new(false);
static START_LOCK: Mutex<()> = const_mutex(());

/// The timer, its thread started on first use.
fn timer() -> Result<&'static Timer> {
    if !STARTED.load(Ordering::Acquire) {
        let _guard = START_LOCK.lock();
        if !STARTED.load(Ordering::Acquire) {
            std::thread::Builder::new()
                .name("flotilla-exec-timer".into())
                .spawn(|| TIMER.run())
                .map_err(|source| Error::Thread {
                    what: "timer",
                    source,
                })?;
            STARTED.store(true, Ordering::Release);
        }
    }
    Ok(&TIMER)
}

impl Timer {
    fn schedule(&self, at: Instant, attempt: Arc<Attempt>, action: Action) -> Key {
        let key = {
            let mut seq = self.seq.lock();
            *seq += 1;
            (at, *seq)
        };
        let mut queue = self.queue.lock();
        let earliest = queue
            .first_key_value()
            .is_none_or(|(first, _)| key < *first);
        queue.insert(key, (attempt, action));
        if earliest {
            self.wake.notify_one();
        }
        key
    }

    fn cancel(&self, keys: &[Key]) {
        let mut queue = self.queue.lock();
        for key in keys {
            queue.remove(key);
        }
    }

    fn run(&'static self) {
        let mut queue = self.queue.lock();
        loop {
            let Some((&key, _)) = queue.first_key_value() else {
                self.wake.wait(&mut queue);
                continue;
            };
            if key.0 > Instant::now() {
                self.wake.wait_until(&mut queue, key.0);
                continue;
            }
            let Some((attempt, action)) = queue.remove(&key) else {
                continue;
            };
            MutexGuard::unlocked(&mut queue, move || match action {
                Action::Stop(reason) => attempt.stop(reason),
                Action::Kill => attempt.kill(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finishing_removes_pending_deadlines() {
        // A pgid that cannot exist, so a stray signal would fail harmlessly.
        let attempt = Attempt::new(i32::MAX - 7, Duration::from_secs(1));
        attempt
            .arm_timeout(Instant::now() + Duration::from_secs(3600))
            .expect("timer starts");
        let before = TIMER
            .queue
            .lock()
            .values()
            .filter(|(a, _)| Arc::ptr_eq(a, &attempt))
            .count();
        assert_eq!(before, 1);
        assert_eq!(attempt.finish(), None);
        let after = TIMER
            .queue
            .lock()
            .values()
            .filter(|(a, _)| Arc::ptr_eq(a, &attempt))
            .count();
        assert_eq!(after, 0);
        // Once done, stop() records nothing.
        attempt.stop(StopReason::Cancelled);
        assert_eq!(attempt.state.lock().reason, None);
    }
}
