//! The plain closure API: `spawn`, `scope` and `parallel_for` (OpenMP's `schedule`).

use std::any::Any;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::job::Job;
use crate::registry::{Registry, WorkerThread};

/// How `parallel_for` hands out iterations, as OpenMP's `schedule` clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// One contiguous block per worker, decided up front.
    Static,
    /// Blocks of `k` iterations taken by whichever worker is free (`schedule(dynamic, k)`).
    Dynamic(usize),
    /// Blocks that shrink as the range is consumed, never below `k` (`schedule(guided, k)`).
    Guided(usize),
}

/// A counter that one thread waits on until it reaches zero.
pub(crate) struct CountLatch {
    count: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl CountLatch {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            count: AtomicUsize::new(n),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }
    pub(crate) fn increment(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }
    pub(crate) fn decrement(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }
    pub(crate) fn is_done(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }
    /// Blocks a thread that is not a worker until the count is zero.
    pub(crate) fn wait_blocking(&self) {
        let mut g = self.lock.lock();
        while !self.is_done() {
            self.cv.wait(&mut g);
        }
    }
    /// Waits until zero; a worker of `registry` runs other work meanwhile.
    pub(crate) fn wait(&self, registry: &Arc<Registry>) {
        let helped = WorkerThread::with_current(|w| match w {
            Some(w) if Arc::ptr_eq(&w.registry, registry) => {
                let mut spins = 0u32;
                while !self.is_done() {
                    if let Some(job) = w.find_work() {
                        crate::worker::execute(w, job);
                        spins = 0;
                    } else if spins < 64 {
                        spins += 1;
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                true
            }
            _ => false,
        });
        if !helped {
            self.wait_blocking();
        }
    }
}

/// A scope in which closures borrowing the caller's stack may be spawned; it returns only
/// when every one of them has finished. A panic in any of them is re-raised by `scope`.
pub struct Scope<'scope> {
    registry: Arc<Registry>,
    latch: CountLatch,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    _marker: PhantomData<&'scope mut &'scope ()>,
}

impl<'scope> Scope<'scope> {
    /// Spawns `f` into the scope; it may borrow anything that outlives the scope.
    pub fn spawn<F>(&self, f: F)
    where
        F: FnOnce(&Scope<'scope>) + Send + 'scope,
    {
        self.latch.increment();
        let scope_ptr = ScopePtr(self as *const Scope<'scope>);
        let job: Box<dyn FnOnce() + Send + 'scope> = Box::new(move || {
            let scope_ptr = scope_ptr;
            // SAFETY: the scope outlives every job spawned in it: `scope` waits on the
            // latch, which this job decrements only after its last use of the scope.
            let scope = unsafe { &*scope_ptr.0 };
            let r = panic::catch_unwind(AssertUnwindSafe(|| f(scope)));
            if let Err(p) = r {
                let mut slot = scope.panic.lock();
                if slot.is_none() {
                    *slot = Some(p);
                }
            }
            scope.latch.decrement();
        });
        // SAFETY: erasing 'scope to 'static is sound because `scope` does not return before
        // the job has run to completion (see the latch above), so nothing it borrows dies
        // while it may still run.
        let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
        self.registry.push_closure(Job::Closure(job));
    }
}

struct ScopePtr<'scope>(*const Scope<'scope>);
// SAFETY: a `Scope` is shared by reference between the threads running its jobs; all its
// fields are `Sync`.
unsafe impl Send for ScopePtr<'_> {}

/// Runs `f` with a new scope on the current thread, waits for the scope's jobs, and
/// re-raises the first panic.
pub(crate) fn in_scope<'scope, R>(
    registry: &Arc<Registry>,
    f: impl FnOnce(&Scope<'scope>) -> R,
) -> R {
    let scope = Scope {
        registry: registry.clone(),
        latch: CountLatch::new(1),
        panic: Mutex::new(None),
        _marker: PhantomData,
    };
    let r = panic::catch_unwind(AssertUnwindSafe(|| f(&scope)));
    scope.latch.decrement();
    scope.latch.wait(registry);
    if let Some(p) = scope.panic.lock().take() {
        panic::resume_unwind(p);
    }
    match r {
        Ok(r) => r,
        Err(p) => panic::resume_unwind(p),
    }
}

/// Runs `f` inside a scope on a worker of `registry` (as rayon does), blocking the caller.
pub(crate) fn scope<'scope, R, F>(registry: &Arc<Registry>, f: F) -> R
where
    F: FnOnce(&Scope<'scope>) -> R + Send,
    R: Send,
{
    let on_worker =
        WorkerThread::with_current(|w| matches!(w, Some(w) if Arc::ptr_eq(&w.registry, registry)));
    if on_worker || registry.n_cpu == 0 {
        return in_scope(registry, f);
    }
    let result: Mutex<Option<std::thread::Result<R>>> = Mutex::new(None);
    let done = CountLatch::new(1);
    {
        let reg = registry.clone();
        let result_ref = &result;
        let done_ref = &done;
        let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
            let r = panic::catch_unwind(AssertUnwindSafe(|| in_scope(&reg, f)));
            *result_ref.lock() = Some(r);
            done_ref.decrement();
        });
        // SAFETY: we block on `done` below until the job has finished with its borrows.
        let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
        registry.push_central(Job::Closure(job));
    }
    done.wait_blocking();
    let r = result.lock().take();
    match r {
        Some(Ok(r)) => r,
        Some(Err(p)) => panic::resume_unwind(p),
        None => unreachable!("the scope job always stores a result before releasing the latch"),
    }
}

/// Calls `f(i)` for every `i` in `range`, spread over the CPU workers as `schedule` says.
pub(crate) fn parallel_for<F>(
    registry: &Arc<Registry>,
    range: Range<usize>,
    schedule: Schedule,
    f: F,
) where
    F: Fn(usize) + Sync + Send,
{
    let len = range.end.saturating_sub(range.start);
    if len == 0 {
        return;
    }
    let workers = registry.n_cpu.max(1);
    let f = &f;
    scope(registry, |s| match schedule {
        Schedule::Static => {
            let per = len.div_ceil(workers);
            let mut lo = range.start;
            while lo < range.end {
                let hi = (lo + per).min(range.end);
                s.spawn(move |_| (lo..hi).for_each(f));
                lo = hi;
            }
        }
        Schedule::Dynamic(k) => {
            let k = k.max(1);
            let next = Arc::new(AtomicUsize::new(range.start));
            for _ in 0..workers.min(len.div_ceil(k)) {
                let next = next.clone();
                let end = range.end;
                s.spawn(move |_| loop {
                    let lo = next.fetch_add(k, Ordering::Relaxed);
                    if lo >= end {
                        break;
                    }
                    (lo..(lo + k).min(end)).for_each(f);
                });
            }
        }
        Schedule::Guided(k) => {
            let k = k.max(1);
            let next = Arc::new(AtomicUsize::new(range.start));
            for _ in 0..workers {
                let next = next.clone();
                let end = range.end;
                s.spawn(move |_| loop {
                    let mut lo = next.load(Ordering::Relaxed);
                    let hi = loop {
                        if lo >= end {
                            return;
                        }
                        let chunk = ((end - lo) / (2 * workers)).max(k);
                        let hi = (lo + chunk).min(end);
                        match next.compare_exchange_weak(
                            lo,
                            hi,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        ) {
                            Ok(_) => break hi,
                            Err(cur) => lo = cur,
                        }
                    };
                    (lo..hi).for_each(f);
                });
            }
        }
    });
}
