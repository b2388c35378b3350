//! Placement policies: a pure function from a ready task and a snapshot of the machine to a
//! [`Decision`].
//!
//! The runtime (or the [simulator](crate::sim)) calls [`Policy::place`] once per task when
//! the task becomes ready, then carries the decision out:
//!
//! | policy | decision |
//! | --- | --- |
//! | `eager` | [`Decision::Central`]: one shared queue, any capable idle unit pulls |
//! | `ws` | [`Decision::Local`]: the submitter's deque; idle units steal |
//! | `random` | a uniformly random capable unit (seeded) |
//! | `dmda` | the unit with the earliest expected finish, counting data transfers ([`Dmda`]) |
//! | `heft` | online, the same as `dmda`; HEFT proper is the static planner in [`crate::heft()`] |

use std::fmt;
use std::str::FromStr;

use flotilla_core::UnitId;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::SchedError;
use crate::model::{PerfModel, Prediction};
use crate::platform::Platform;

/// One input of a task, as the policy sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InputView {
    /// Its size.
    pub bytes: u64,
    /// Bitmask over `MemNodeId::index()`: bit `n` is set when node `n` holds a valid copy.
    /// An input with no bit set (not yet produced anywhere) costs no transfer.
    pub valid_on: u64,
}

/// A ready task, as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct TaskView<'a> {
    /// The codelet's name (performance-model key).
    pub codelet: &'a str,
    /// The task's size footprint (performance-model key).
    pub footprint: u64,
    /// Its priority (higher runs first); the built-in policies ignore it.
    pub priority: i32,
    /// Per unit, indexed by `UnitId::index()`: whether the unit can run this task. A unit
    /// past the end of the slice cannot.
    pub can_run: &'a [bool],
    /// The data it reads.
    pub inputs: &'a [InputView],
    /// The unit whose task made this one ready, if any.
    pub submitter: Option<UnitId>,
}

impl TaskView<'_> {
    /// Whether unit `u` can run this task.
    pub fn can_run_on(&self, u: UnitId) -> bool {
        self.can_run.get(u.index()).copied().unwrap_or(false)
    }
}

/// How busy the units are.
#[derive(Clone, Copy, Debug)]
pub struct Load<'a> {
    /// The current time, in seconds.
    pub now: f64,
    /// Per unit, indexed by `UnitId::index()`: when its queued work is expected to finish
    /// (`>= now` for busy units). A missing or past entry means "free now".
    pub free_at: &'a [f64],
}

impl Load<'_> {
    /// When unit `u` is expected to be free: `max(now, free_at[u])` (`now` when the entry is
    /// missing or NaN).
    pub fn free(&self, u: UnitId) -> f64 {
        self.free_at
            .get(u.index())
            .copied()
            .filter(|t| !t.is_nan())
            .map_or(self.now, |t| t.max(self.now))
    }
}

/// Where a ready task goes.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Decision {
    /// This unit's queue.
    Unit {
        /// The unit.
        unit: UnitId,
        /// Expected execution seconds, when the model has a prediction.
        predicted: Option<f64>,
    },
    /// The shared queue: any capable unit pulls it.
    Central,
    /// The deque of `task.submitter` (work stealing); `Central` if there is no submitter.
    Local,
}

/// A placement policy. Policies are pure: everything they may look at is passed in.
pub trait Policy: Send {
    /// The policy's name, e.g. `"dmda"`.
    fn name(&self) -> &str;
    /// Decides where a ready task goes.
    fn place(
        &mut self,
        task: &TaskView<'_>,
        platform: &Platform,
        load: &Load<'_>,
        model: &PerfModel,
    ) -> Decision;
}

/// The built-in policies by name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// One shared queue.
    Eager,
    /// Per-unit deques with work stealing.
    Ws,
    /// A uniformly random capable unit.
    Random,
    /// Deque model data aware: earliest expected finish, counting transfers.
    Dmda,
    /// Heterogeneous earliest finish time: the static planner in the simulator, `dmda` online.
    Heft,
}

impl PolicyKind {
    /// Every built-in policy.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Eager,
        PolicyKind::Ws,
        PolicyKind::Random,
        PolicyKind::Dmda,
        PolicyKind::Heft,
    ];

    /// The policy's name, as parsed by `FromStr`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Eager => "eager",
            PolicyKind::Ws => "ws",
            PolicyKind::Random => "random",
            PolicyKind::Dmda => "dmda",
            PolicyKind::Heft => "heft",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = SchedError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| SchedError::UnknownPolicy(s.to_owned()))
    }
}

/// StarPU's `dmda` (deque model data aware) policy.
///
/// For each capable unit `u`: `exec` is the model's prediction for
/// `(codelet, arch(u), footprint)`; `transfer` sums, over the inputs without a valid copy on
/// `node(u)`, the cheapest [`Platform::transfer_time`] from a node that holds one;
/// `finish = max(free(u), now + transfer) + exec`. The task goes to the unit with the
/// smallest `finish` (ties: the lowest unit id). Estimated predictions count like calibrated
/// ones.
///
/// Exploration: when a capable unit's arch has [`Prediction::Unknown`] for this
/// `(codelet, footprint)`, the task goes to the least-loaded unit among the units with an
/// unknown arch, with `predicted: None`, so that arch gets calibrated. Ties among equally
/// loaded units go round-robin (the first at or after the unit after the last one explored),
/// so a burst of tasks submitted before any measurement comes back, when the caller cannot
/// advance `free_at` for lack of a prediction, spreads over those units instead of piling
/// onto one.
///
/// A task that no unit can run gets [`Decision::Central`]; the caller reports it.
#[derive(Clone, Debug, Default)]
pub struct Dmda {
    /// Index of the unit after the last one chosen by exploration.
    next_explore: usize,
}

impl Dmda {
    /// The policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Seconds to bring every input of `task` to unit `u`'s memory node.
    pub fn transfer_time(task: &TaskView<'_>, platform: &Platform, u: UnitId) -> f64 {
        let node = platform.unit(u).node;
        let mut total = 0.0;
        for input in task.inputs {
            if input.valid_on == 0 || input.valid_on & node_bit(node.index()) != 0 {
                continue;
            }
            let cheapest = (0..platform.node_count().min(64))
                .filter(|&n| input.valid_on & node_bit(n) != 0)
                .map(|n| {
                    let from = flotilla_core::MemNodeId::new(n as u32);
                    platform.transfer_time(from, node, input.bytes)
                })
                .fold(f64::INFINITY, f64::min);
            // A copy only on nodes the platform does not know: charge the default link.
            total += if cheapest.is_finite() {
                cheapest
            } else {
                platform.default_link().time(input.bytes)
            };
        }
        total
    }
}

fn node_bit(n: usize) -> u64 {
    if n < 64 {
        1u64 << n
    } else {
        0
    }
}

impl Policy for Dmda {
    fn name(&self) -> &str {
        "dmda"
    }

    fn place(
        &mut self,
        task: &TaskView<'_>,
        platform: &Platform,
        load: &Load<'_>,
        model: &PerfModel,
    ) -> Decision {
        let capable = || platform.units().iter().filter(|u| task.can_run_on(u.id));
        // Exploration: the least-loaded unit of an arch the model knows nothing about.
        let unknown: Vec<UnitId> = capable()
            .filter(|u| model.predict(task.codelet, &u.arch, task.footprint) == Prediction::Unknown)
            .map(|u| u.id)
            .collect();
        if let Some(least) = unknown.iter().map(|&u| load.free(u)).min_by(f64::total_cmp) {
            let tied: Vec<UnitId> = unknown
                .into_iter()
                .filter(|&u| load.free(u) == least)
                .collect();
            let unit = tied
                .iter()
                .copied()
                .find(|u| u.index() >= self.next_explore)
                .unwrap_or(tied[0]);
            self.next_explore = unit.index() + 1;
            return Decision::Unit {
                unit,
                predicted: None,
            };
        }
        let mut best: Option<(f64, UnitId, f64)> = None;
        for u in capable() {
            let exec = model
                .predict(task.codelet, &u.arch, task.footprint)
                .seconds()
                .unwrap_or(0.0);
            let transfer = Self::transfer_time(task, platform, u.id);
            let finish = load.free(u.id).max(load.now + transfer) + exec;
            if best.is_none_or(|(f, _, _)| finish < f) {
                best = Some((finish, u.id, exec));
            }
        }
        match best {
            Some((_, unit, exec)) => Decision::Unit {
                unit,
                predicted: Some(exec),
            },
            None => Decision::Central,
        }
    }
}

/// The built-in policies, plus an arm for a user's own.
pub enum BuiltinPolicy {
    /// [`Decision::Central`] for every task.
    Eager,
    /// [`Decision::Local`] for every task.
    Ws,
    /// A uniformly random capable unit, drawn from this generator.
    Random(SmallRng),
    /// [`Dmda`].
    Dmda(Dmda),
    /// Any other policy.
    Custom(Box<dyn Policy>),
}

impl fmt::Debug for BuiltinPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BuiltinPolicy({})", self.name())
    }
}

impl BuiltinPolicy {
    /// The built-in policy `kind`; `seed` seeds `random`. `heft` gives [`Dmda`]: online,
    /// tasks arrive one at a time, so HEFT's earliest-finish rule is dmda's (HEFT proper, with
    /// upward ranks and insertion, is the static planner [`crate::heft::heft`]).
    pub fn from_kind(kind: PolicyKind, seed: u64) -> Self {
        match kind {
            PolicyKind::Eager => BuiltinPolicy::Eager,
            PolicyKind::Ws => BuiltinPolicy::Ws,
            PolicyKind::Random => BuiltinPolicy::Random(SmallRng::seed_from_u64(seed)),
            PolicyKind::Dmda | PolicyKind::Heft => BuiltinPolicy::Dmda(Dmda::new()),
        }
    }
}

impl Policy for BuiltinPolicy {
    fn name(&self) -> &str {
        match self {
            BuiltinPolicy::Eager => "eager",
            BuiltinPolicy::Ws => "ws",
            BuiltinPolicy::Random(_) => "random",
            BuiltinPolicy::Dmda(d) => d.name(),
            BuiltinPolicy::Custom(p) => p.name(),
        }
    }

    fn place(
        &mut self,
        task: &TaskView<'_>,
        platform: &Platform,
        load: &Load<'_>,
        model: &PerfModel,
    ) -> Decision {
        match self {
            BuiltinPolicy::Eager => Decision::Central,
            BuiltinPolicy::Ws => Decision::Local,
            BuiltinPolicy::Random(rng) => {
                let capable: Vec<_> = platform
                    .units()
                    .iter()
                    .filter(|u| task.can_run_on(u.id))
                    .collect();
                if capable.is_empty() {
                    return Decision::Central;
                }
                let u = capable[rng.gen_range(0..capable.len())];
                Decision::Unit {
                    unit: u.id,
                    predicted: model
                        .predict(task.codelet, &u.arch, task.footprint)
                        .seconds(),
                }
            }
            BuiltinPolicy::Dmda(d) => d.place(task, platform, load, model),
            BuiltinPolicy::Custom(p) => p.place(task, platform, load, model),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{Link, UnitKind};

    /// host with 2 CPU units, gpu node with 1 CUDA unit, 1 GB/s between them.
    fn cpu_gpu() -> Platform {
        let mut p = Platform::new();
        let host = p.add_node("host");
        let gpu = p.add_node("gpu0");
        p.add_unit(UnitKind::Cpu, host, "cpu");
        p.add_unit(UnitKind::Cpu, host, "cpu");
        p.add_unit(UnitKind::Cuda, gpu, "cuda:test");
        p.set_link(
            host,
            gpu,
            Link {
                bandwidth: 1e9,
                latency: 0.0,
            },
        );
        p
    }

    fn model(cpu: f64, gpu: f64) -> PerfModel {
        let mut m = PerfModel::with_min_samples(1);
        m.record("k", "cpu", 1, cpu);
        m.record("k", "cuda:test", 1, gpu);
        m
    }

    fn view<'a>(can_run: &'a [bool], inputs: &'a [InputView]) -> TaskView<'a> {
        TaskView {
            codelet: "k",
            footprint: 1,
            priority: 0,
            can_run,
            inputs,
            submitter: None,
        }
    }

    const ALL: [bool; 3] = [true, true, true];
    const IDLE: [f64; 3] = [0.0, 0.0, 0.0];

    #[test]
    fn dmda_prefers_the_unit_holding_the_data_when_transfer_dominates() {
        let p = cpu_gpu();
        let m = model(0.010, 0.002); // GPU 5x faster ...
        let on_gpu = [InputView {
            bytes: 1_000_000_000, // ... but 1 s to move the input off it
            valid_on: 0b10,
        }];
        let load = Load {
            now: 0.0,
            free_at: &IDLE,
        };
        let d = Dmda::new().place(&view(&ALL, &on_gpu), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(2),
                predicted: Some(0.002)
            }
        );
        // Same data on the host: the CPU finishes in 0.010 s, the GPU in 1.002 s.
        let on_host = [InputView {
            bytes: 1_000_000_000,
            valid_on: 0b01,
        }];
        let d = Dmda::new().place(&view(&ALL, &on_host), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(0),
                predicted: Some(0.010)
            }
        );
        // A copy on both nodes: nothing to move, the GPU is faster.
        let both = [InputView {
            bytes: 1_000_000_000,
            valid_on: 0b11,
        }];
        assert_eq!(
            Dmda::transfer_time(&view(&ALL, &both), &p, UnitId::new(2)),
            0.0
        );
        assert_eq!(
            Dmda::transfer_time(&view(&ALL, &on_host), &p, UnitId::new(2)),
            1.0
        );
        let d = Dmda::new().place(&view(&ALL, &both), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(2),
                predicted: Some(0.002)
            }
        );
    }

    #[test]
    fn dmda_prefers_the_faster_arch_when_compute_dominates() {
        let p = cpu_gpu();
        let m = model(1.0, 0.05);
        let small = [InputView {
            bytes: 1_000_000, // 1 ms over the link
            valid_on: 0b01,
        }];
        let load = Load {
            now: 5.0,
            free_at: &[5.0, 5.0, 5.0],
        };
        let d = Dmda::new().place(&view(&ALL, &small), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(2),
                predicted: Some(0.05)
            }
        );
        // When the GPU is busy long enough, the second (idle) CPU wins; ties go to the
        // lowest id, so a busy CPU 0 hands it to CPU 1.
        let load = Load {
            now: 5.0,
            free_at: &[5.5, 5.0, 7.0],
        };
        let d = Dmda::new().place(&view(&ALL, &small), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(1),
                predicted: Some(1.0)
            }
        );
        // A unit that cannot run the task is never chosen.
        let no_gpu = [true, true, false];
        let load = Load {
            now: 5.0,
            free_at: &[5.0, 5.0, 5.0],
        };
        let d = Dmda::new().place(&view(&no_gpu, &small), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(0),
                predicted: Some(1.0)
            }
        );
    }

    #[test]
    fn dmda_explores_an_unknown_arch_on_its_least_loaded_unit() {
        let mut p = cpu_gpu();
        let gpu_node = p.unit(UnitId::new(2)).node;
        p.add_unit(UnitKind::Cuda, gpu_node, "cuda:test");
        let mut m = PerfModel::with_min_samples(1);
        m.record("k", "cpu", 1, 0.001); // CPU calibrated and fast; GPU never seen
        let all = [true; 4];
        let load = Load {
            now: 0.0,
            free_at: &[0.0, 0.0, 3.0, 2.0],
        };
        let d = Dmda::new().place(&view(&all, &[]), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(3),
                predicted: None
            }
        );
        // Equally loaded unknown units take turns, so a burst does not pile onto one.
        let idle = [0.0; 4];
        let mut dmda = Dmda::new();
        let picks: Vec<usize> = (0..4)
            .map(|_| {
                match dmda.place(
                    &view(&all, &[]),
                    &p,
                    &Load {
                        now: 0.0,
                        free_at: &idle,
                    },
                    &m,
                ) {
                    Decision::Unit {
                        unit,
                        predicted: None,
                    } => unit.index(),
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        assert_eq!(picks, [2, 3, 2, 3]);
        // Once the GPU arch has a sample, dmda goes back to earliest finish.
        m.record("k", "cuda:test", 1, 0.5);
        let d = Dmda::new().place(&view(&all, &[]), &p, &load, &m);
        assert_eq!(
            d,
            Decision::Unit {
                unit: UnitId::new(0),
                predicted: Some(0.001)
            }
        );
    }

    #[test]
    fn dmda_uses_estimates_and_does_not_explore_them() {
        let p = cpu_gpu();
        let mut m = PerfModel::with_min_samples(1);
        m.record("k", "cpu", 1, 1.0);
        // GPU seen at other sizes only: an estimate of 0.1 s at size 1.
        m.record("k", "cuda:test", 10, 1.0);
        m.record("k", "cuda:test", 100, 10.0);
        assert!(matches!(
            m.predict("k", "cuda:test", 1),
            Prediction::Estimated(_)
        ));
        let d = Dmda::new().place(
            &view(&ALL, &[]),
            &p,
            &Load {
                now: 0.0,
                free_at: &IDLE,
            },
            &m,
        );
        let Decision::Unit {
            unit,
            predicted: Some(t),
        } = d
        else {
            panic!("{d:?}");
        };
        assert_eq!(unit, UnitId::new(2));
        assert!((t - 0.1).abs() < 1e-9);
    }

    #[test]
    fn simple_policies_decide_as_documented() {
        let p = cpu_gpu();
        let m = model(1.0, 1.0);
        let load = Load {
            now: 0.0,
            free_at: &IDLE,
        };
        let t = view(&ALL, &[]);
        assert_eq!(
            BuiltinPolicy::from_kind(PolicyKind::Eager, 0).place(&t, &p, &load, &m),
            Decision::Central
        );
        assert_eq!(
            BuiltinPolicy::from_kind(PolicyKind::Ws, 0).place(&t, &p, &load, &m),
            Decision::Local
        );
        assert_eq!(BuiltinPolicy::from_kind(PolicyKind::Heft, 0).name(), "dmda");
        // Random: only capable units, all of them eventually, reproducible from the seed.
        let only = [false, true, true];
        let draw = |seed| {
            let mut r = BuiltinPolicy::from_kind(PolicyKind::Random, seed);
            (0..200)
                .map(|_| match r.place(&view(&only, &[]), &p, &load, &m) {
                    Decision::Unit { unit, .. } => unit.index(),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert!(a.iter().all(|&u| u == 1 || u == 2));
        assert!(a.contains(&1) && a.contains(&2));
        assert_eq!(
            BuiltinPolicy::from_kind(PolicyKind::Random, 1).place(
                &view(&[false; 3], &[]),
                &p,
                &load,
                &m
            ),
            Decision::Central
        );
    }

    #[test]
    fn builtin_policies_can_move_to_a_scheduler_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<BuiltinPolicy>();
    }

    #[test]
    fn policy_kind_parses_and_displays_every_name() {
        for k in PolicyKind::ALL {
            assert_eq!(k.to_string().parse::<PolicyKind>().unwrap(), k);
        }
        let err = "fifo".parse::<PolicyKind>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown policy `fifo` (expected eager, ws, random, dmda or heft)"
        );
    }
}
