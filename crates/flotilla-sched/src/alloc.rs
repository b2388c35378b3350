//! How many worker allocations to ask a batch system (Slurm) for, and which to give back:
//! the policy of `flotilla alloc`, pure so that the simulator (`flotilla bench alloc`) and
//! the coordinator's allocator decide alike.
//!
//! An allocation is `workers_per_alloc` workers for at most `time_limit_s`, which start only
//! after waiting in the batch system's queue. Two rules:
//!
//! - [`Rule::Reactive`] (HyperQueue's): while tasks wait that no connected worker can take,
//!   keep up to `backlog` allocations queued, never more than the waiting tasks can use.
//!   It asks only once the queue has already stalled.
//! - [`Rule::Predictive`]: ask now for what the work will use when a new allocation would
//!   start. The work left (ready, blocked behind dependencies, the rest of what runs), timed
//!   by the learned performance models, is laid out as soon as its dependencies allow
//!   ([`mean_width`]); the CPUs that layout uses between the learned queue wait and a little
//!   after are what to have then, raised by deadlines. Allocations that end (time limit)
//!   before a new one could start are replaced ahead. Twice the shortfall waits in the batch
//!   queue ([`HEDGE`]: its waits vary widely, and the first to start are used); once the
//!   need is met the rest is cancelled while still queued, which costs nothing, so none
//!   starts only to sit idle. Running ones with nothing to do leave after their idle
//!   timeout. It never keeps fewer queued than the reactive rule would for the tasks
//!   waiting now.

/// One allocation queue's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocParams {
    /// Workers started by one allocation.
    pub workers_per_alloc: u32,
    /// CPUs each of those workers offers.
    pub cpus_per_worker: f64,
    /// The most allocations queued and running at once.
    pub max_allocs: u32,
    /// The most allocations waiting in the batch queue at once.
    pub backlog: u32,
    /// An allocation's time limit, seconds.
    pub time_limit_s: f64,
}

impl AllocParams {
    /// CPUs one allocation brings.
    pub fn cpus_per_alloc(&self) -> f64 {
        self.workers_per_alloc.max(1) as f64 * self.cpus_per_worker.max(1e-9)
    }
}

/// Which rule sizes the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Rule {
    /// Ask while tasks wait that no worker can take (HyperQueue's autoalloc).
    Reactive,
    /// Ask for what the remaining work needs, before the queue stalls.
    #[default]
    Predictive,
}

/// The allocations of one queue as the allocator sees them now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fleet {
    /// Waiting in the batch queue.
    pub queued: u32,
    /// Running, each with the seconds left before its time limit.
    pub running_left_s: Vec<f64>,
}

/// What is left to do, as the coordinator knows it now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand {
    /// Ready tasks that no connected worker can take now, in CPUs they ask.
    pub waiting_cpus: f64,
    /// The CPUs the work left uses, laid out as soon as possible, over the window a new
    /// allocation would serve ([`mean_width`] from the queue wait on).
    pub future_cpus: f64,
    /// CPU-seconds of the work not done yet, estimated from the performance models.
    pub remaining_cpu_s: f64,
    /// Seconds until the earliest deadline of the work left, if any.
    pub deadline_s: Option<f64>,
    /// The learned wait of an allocation in the batch queue, seconds.
    pub queue_wait_s: f64,
}

/// One task left to do, for [`mean_width`].
#[derive(Clone, Debug, PartialEq)]
pub struct Left {
    /// CPUs it asks.
    pub cpus: f64,
    /// Seconds it still needs (the model's estimate, less what it has run).
    pub secs: f64,
    /// Its predecessors among the tasks left: indices of earlier entries.
    pub preds: Vec<usize>,
}

/// The CPUs `left` (in topological order) uses on average between `from` and `to` seconds
/// from now, each task starting as soon as its predecessors end (as many workers as it
/// takes).
pub fn mean_width(left: &[Left], from: f64, to: f64) -> f64 {
    if to <= from {
        return 0.0;
    }
    let mut finish = vec![0.0f64; left.len()];
    let mut used = 0.0;
    for (i, t) in left.iter().enumerate() {
        let start = t
            .preds
            .iter()
            .filter(|&&p| p < i)
            .map(|&p| finish[p])
            .fold(0.0, f64::max);
        finish[i] = start + t.secs.max(0.0);
        let overlap = finish[i].min(to) - start.max(from);
        if overlap > 0.0 {
            used += overlap * t.cpus;
        }
    }
    used / (to - from)
}

/// What the allocator does now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Allocations to submit.
    pub submit: u32,
    /// Queued allocations to cancel (not yet started: nothing is lost).
    pub cancel_queued: u32,
}

/// Decides for one queue.
pub fn decide(rule: Rule, params: &AllocParams, fleet: &Fleet, demand: &Demand) -> Decision {
    let running = fleet.running_left_s.len() as u32;
    let in_flight = fleet.queued + running;
    let room = params
        .max_allocs
        .saturating_sub(in_flight)
        .min(params.backlog.saturating_sub(fleet.queued));
    let per_alloc = params.cpus_per_alloc();
    match rule {
        Rule::Reactive => {
            if demand.waiting_cpus <= 0.0 {
                return Decision::default();
            }
            // No more than the waiting tasks can use, counting what is already queued.
            let useful = (demand.waiting_cpus / per_alloc).ceil() as u32;
            Decision {
                submit: room.min(useful.saturating_sub(fleet.queued)),
                cancel_queued: 0,
            }
        }
        Rule::Predictive => {
            // Never fewer queued than the tasks waiting now can use (the reactive rule's
            // floor): the layout starts them at once, so work that would be over within the
            // learned queue wait asked for nothing while no worker was there to run it
            // (found with a 2-minute queue wait and 20-second tasks: no allocation, ever).
            let waiting = (demand.waiting_cpus.max(0.0) / per_alloc).ceil() as u32;
            let need = predicted_need(params, demand);
            // Running allocations that end before a new one could start count as gone.
            let lasting = fleet
                .running_left_s
                .iter()
                .filter(|&&left| left > demand.queue_wait_s)
                .count() as u32;
            // Twice the shortfall is kept queued (batch queue waits vary widely: the first
            // to start are used), and what is still queued once it is met is cancelled,
            // which costs nothing.
            let short = need.saturating_sub(lasting);
            let keep = params.backlog.min(short.saturating_mul(HEDGE).max(waiting));
            if fleet.queued < keep {
                Decision {
                    submit: room.min(keep - fleet.queued),
                    cancel_queued: 0,
                }
            } else {
                Decision {
                    submit: 0,
                    cancel_queued: fleet.queued - keep,
                }
            }
        }
    }
}

/// Allocations kept queued per allocation short (see [`decide`]).
pub const HEDGE: u32 = 2;

/// The allocations the work needs when a new one would start (before the caps on what may
/// be in flight): its [`Demand::future_cpus`], or more when a deadline asks for it.
pub fn predicted_need(params: &AllocParams, demand: &Demand) -> u32 {
    let mut cpus = demand.future_cpus.max(0.0);
    if let Some(deadline) = demand.deadline_s {
        // Work due sooner must be done by then.
        let span = (deadline - demand.queue_wait_s).max(1.0);
        cpus = cpus.max(demand.remaining_cpu_s / span);
    }
    if cpus <= 0.0 {
        return 0;
    }
    let need = (cpus / params.cpus_per_alloc()).ceil();
    need.min(params.max_allocs as f64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params() -> AllocParams {
        AllocParams {
            workers_per_alloc: 2,
            cpus_per_worker: 4.0,
            max_allocs: 10,
            backlog: 3,
            time_limit_s: 3600.0,
        }
    }

    #[test]
    fn reactive_asks_only_while_tasks_wait_and_no_more_than_they_use() {
        let p = params();
        let idle = Demand {
            remaining_cpu_s: 1e6,
            future_cpus: 100.0,
            ..Demand::default()
        };
        assert_eq!(
            decide(Rule::Reactive, &p, &Fleet::default(), &idle).submit,
            0
        );
        let waiting = Demand {
            waiting_cpus: 12.0,
            ..idle.clone()
        };
        // 12 CPUs wait: two allocations of 8.
        assert_eq!(
            decide(Rule::Reactive, &p, &Fleet::default(), &waiting).submit,
            2
        );
        // One already queued: one more.
        let one = Fleet {
            queued: 1,
            ..Fleet::default()
        };
        assert_eq!(decide(Rule::Reactive, &p, &one, &waiting).submit, 1);
        // Many waiting: the backlog caps it.
        let many = Demand {
            waiting_cpus: 1000.0,
            ..idle
        };
        assert_eq!(
            decide(Rule::Reactive, &p, &Fleet::default(), &many).submit,
            3
        );
    }

    #[test]
    fn the_width_of_the_work_left_laid_out_as_soon_as_possible() {
        // a (10 s) then b (10 s); c (20 s) beside them; d (2 CPUs, 5 s) after b and c.
        let left = [
            Left {
                cpus: 1.0,
                secs: 10.0,
                preds: vec![],
            },
            Left {
                cpus: 1.0,
                secs: 10.0,
                preds: vec![0],
            },
            Left {
                cpus: 1.0,
                secs: 20.0,
                preds: vec![],
            },
            Left {
                cpus: 2.0,
                secs: 5.0,
                preds: vec![1, 2],
            },
        ];
        assert_eq!(mean_width(&left, 0.0, 20.0), 2.0);
        assert_eq!(mean_width(&left, 20.0, 25.0), 2.0);
        assert_eq!(mean_width(&left, 10.0, 30.0), 1.5);
        assert_eq!(mean_width(&left, 25.0, 100.0), 0.0);
        assert_eq!(mean_width(&[], 0.0, 10.0), 0.0);
    }

    #[test]
    fn predictive_asks_ahead_for_blocked_work_and_gives_back_what_it_does_not_need() {
        let p = params();
        // Nothing waits yet (all blocked behind one task), but when a new allocation would
        // start the work will use 64 CPUs: allocations are asked before the queue stalls.
        let coming = Demand {
            waiting_cpus: 0.0,
            future_cpus: 64.0,
            remaining_cpu_s: 16.0 * 3600.0,
            queue_wait_s: 600.0,
            deadline_s: None,
        };
        let d = decide(Rule::Predictive, &p, &Fleet::default(), &coming);
        assert_eq!(d.submit, 3, "the backlog caps the first request: {d:?}");
        assert_eq!(predicted_need(&p, &coming), 8);
        // Little work by then: the queued allocations beyond the need are cancelled.
        let little = Demand {
            future_cpus: 1.0,
            remaining_cpu_s: 600.0,
            ..coming.clone()
        };
        let fleet = Fleet {
            queued: 3,
            running_left_s: vec![3000.0],
        };
        assert_eq!(
            decide(Rule::Predictive, &p, &fleet, &little),
            Decision {
                submit: 0,
                cancel_queued: 3
            }
        );
        // A running allocation about to hit its limit is replaced ahead (two queued for
        // the one needed: the second to start is cancelled).
        let ending = Fleet {
            queued: 0,
            running_left_s: vec![60.0],
        };
        assert_eq!(decide(Rule::Predictive, &p, &ending, &little).submit, 2);
        let replaced = Fleet {
            queued: 1,
            running_left_s: vec![60.0, 3600.0],
        };
        assert_eq!(
            decide(Rule::Predictive, &p, &replaced, &little),
            Decision {
                submit: 0,
                cancel_queued: 1
            }
        );
        // Nothing left by then: nothing asked.
        let done = Demand {
            future_cpus: 0.0,
            ..little
        };
        assert_eq!(predicted_need(&p, &done), 0);
    }

    #[test]
    fn predictive_asks_for_waiting_work_however_long_the_queue_wait() {
        // Work that, started now, would be over before a new allocation could start: the
        // layout uses no CPUs after the wait, but nothing runs it meanwhile.
        let d = decide(
            Rule::Predictive,
            &params(),
            &Fleet::default(),
            &Demand {
                waiting_cpus: 4.0,
                future_cpus: 0.0,
                remaining_cpu_s: 80.0,
                deadline_s: None,
                queue_wait_s: 600.0,
            },
        );
        let reactive = decide(
            Rule::Reactive,
            &params(),
            &Fleet::default(),
            &Demand {
                waiting_cpus: 4.0,
                ..Demand::default()
            },
        );
        assert!(
            d.submit >= reactive.submit && d.submit > 0,
            "{d:?} {reactive:?}"
        );
    }

    #[test]
    fn a_deadline_raises_the_need() {
        let p = params();
        let d = Demand {
            future_cpus: 8.0,
            remaining_cpu_s: 8.0 * 3600.0,
            queue_wait_s: 0.0,
            ..Demand::default()
        };
        assert_eq!(predicted_need(&p, &d), 1);
        let due = Demand {
            deadline_s: Some(900.0),
            ..d
        };
        assert_eq!(
            predicted_need(&p, &due),
            4,
            "8 CPU-hours in 15 minutes: 32 CPUs"
        );
    }

    proptest! {
        /// Whatever the state, a decision never exceeds the caps, never both submits and
        /// cancels, and cancels only what is queued.
        #[test]
        fn decisions_respect_the_caps(
            queued in 0u32..20,
            running in proptest::collection::vec(0.0f64..7200.0, 0..20),
            waiting in 0.0f64..1e4,
            future in 0.0f64..1e4,
            remaining in 0.0f64..1e7,
            wait in 0.0f64..7200.0,
            deadline in proptest::option::of(0.0f64..1e5),
            predictive in any::<bool>(),
        ) {
            let p = params();
            let fleet = Fleet { queued, running_left_s: running };
            let demand = Demand {
                waiting_cpus: waiting,
                future_cpus: future,
                remaining_cpu_s: remaining,
                deadline_s: deadline,
                queue_wait_s: wait,
            };
            let rule = if predictive { Rule::Predictive } else { Rule::Reactive };
            let d = decide(rule, &p, &fleet, &demand);
            let in_flight = queued + fleet.running_left_s.len() as u32;
            prop_assert!(d.submit == 0 || d.cancel_queued == 0);
            prop_assert!(d.cancel_queued <= queued);
            prop_assert!(in_flight + d.submit <= p.max_allocs.max(in_flight));
            prop_assert!(queued + d.submit <= p.backlog.max(queued));
        }
    }
}
