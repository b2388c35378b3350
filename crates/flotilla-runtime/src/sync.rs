//! The primitives of the concurrency protocols that are model-checked: std's atomics and
//! crossbeam's parker in a normal build, shuttle's under `--features shuttle` (as tokio's
//! `src/loom/` swaps in loom's). Only what the models cover goes through here: the
//! sleep/wake protocol of the CPU workers (`sleep.rs`) and the data manager's replica
//! states (`data.rs`: its locks and atomics).
//!
//! Why shuttle and not loom: the protocol is a store-then-load handshake on both sides (a
//! worker marks itself sleeping then looks for work; a pusher publishes work then looks for
//! sleepers) whose correctness rests on `SeqCst`. Loom models `SeqCst` as acquire/release and
//! so reports a lost wake-up that cannot happen (tried: it did); shuttle explores thread
//! interleavings under sequential consistency, which is what `SeqCst` gives.
//!
//! `cargo test -p flotilla-runtime --features shuttle --lib shuttle` runs the models. With
//! the feature on, the runtime itself cannot run outside a model: build it only for them.

#[cfg(not(feature = "shuttle"))]
pub(crate) use crossbeam_utils::sync::{Parker, Unparker};
#[cfg(not(feature = "shuttle"))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

#[cfg(feature = "shuttle")]
pub(crate) use mutex::Mutex;
#[cfg(feature = "shuttle")]
pub(crate) use parker::{Parker, Unparker};
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// parking_lot's `Mutex` API (no poisoning; `try_lock` gives an `Option`) on shuttle's.
#[cfg(feature = "shuttle")]
mod mutex {
    pub(crate) struct Mutex<T>(shuttle::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(shuttle::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> shuttle::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn try_lock(&self) -> Option<shuttle::sync::MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }
}

/// crossbeam's `Parker` semantics (an unpark before the park is kept as a token) on
/// shuttle's mutex and condition variable, so the model sees every interleaving around it.
#[cfg(feature = "shuttle")]
mod parker {
    use shuttle::sync::{Arc, Condvar, Mutex};

    struct Inner {
        token: Mutex<bool>,
        cv: Condvar,
    }

    /// Parks the thread that owns it until unparked (or at once if a token is waiting).
    pub(crate) struct Parker {
        unparker: Unparker,
    }

    /// Wakes the parker it came from.
    #[derive(Clone)]
    pub(crate) struct Unparker {
        inner: Arc<Inner>,
    }

    impl Parker {
        pub(crate) fn new() -> Self {
            Parker {
                unparker: Unparker {
                    inner: Arc::new(Inner {
                        token: Mutex::new(false),
                        cv: Condvar::new(),
                    }),
                },
            }
        }

        pub(crate) fn park(&self) {
            let inner = &self.unparker.inner;
            let mut token = inner.token.lock().expect("not poisoned");
            while !*token {
                token = inner.cv.wait(token).expect("not poisoned");
            }
            *token = false;
        }

        pub(crate) fn unparker(&self) -> &Unparker {
            &self.unparker
        }
    }

    impl Unparker {
        pub(crate) fn unpark(&self) {
            *self.inner.token.lock().expect("not poisoned") = true;
            self.inner.cv.notify_one();
        }
    }
}
