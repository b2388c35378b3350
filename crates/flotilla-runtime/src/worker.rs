//! The CPU worker's main loop.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::sync::Parker;
use crossbeam_deque::Worker;

use crate::job::Job;
use crate::registry::{Registry, WorkerThread};

/// How many times an idle worker looks again (spinning, then yielding) before it parks.
const SPINS: u32 = 32;
const YIELDS: u32 = 64;

/// Runs CPU worker `index` until the runtime terminates.
pub(crate) fn run(
    registry: Arc<Registry>,
    index: usize,
    local: Worker<Job>,
    parker: Parker,
    core: Option<core_affinity::CoreId>,
) {
    if let Some(core) = core {
        // Pinning is best effort: a refused pin leaves the thread where the OS put it.
        let _ = core_affinity::set_for_current(core);
    }
    let me = WorkerThread {
        registry,
        index,
        local,
        completing: std::cell::Cell::new(false),
    };
    me.install(|| main_loop(&me, &parker));
}

fn main_loop(me: &WorkerThread, parker: &Parker) {
    let reg = &*me.registry;
    let mut idle_rounds = 0u32;
    let mut seen_posted = 0u64;
    loop {
        if let Some(job) = me.find_work() {
            if idle_rounds > 0 {
                reg.sleep.end_idle();
                idle_rounds = 0;
            }
            execute(me, job);
            continue;
        }
        if reg.terminate.load(Ordering::Acquire) {
            if idle_rounds > 0 {
                reg.sleep.end_idle();
            }
            return;
        }
        if idle_rounds == 0 {
            reg.sleep.start_idle();
            seen_posted = reg.sleep.posted();
        }
        idle_rounds += 1;
        if idle_rounds <= SPINS {
            std::hint::spin_loop();
        } else if idle_rounds <= SPINS + YIELDS {
            std::thread::yield_now();
        } else if reg.sleep.posted() != seen_posted {
            // Others are pushing work: stay awake (rayon does the same).
            seen_posted = reg.sleep.posted();
            idle_rounds = SPINS;
            std::thread::yield_now();
        } else {
            reg.sleep.sleep(me.index, parker, || {
                reg.has_work_for(me.index) || reg.terminate.load(Ordering::Acquire)
            });
            idle_rounds = 0;
        }
    }
}

/// Runs one job on this worker.
pub(crate) fn execute(me: &WorkerThread, job: Job) {
    match job {
        Job::Closure(f) => f(),
        Job::Task(t) => crate::task::run_on_cpu(&me.registry, me.index, t),
    }
}
