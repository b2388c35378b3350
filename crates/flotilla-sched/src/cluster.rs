//! The cluster's placement, problem → solution: a pure function from one task's options
//! (its resources, or one per variant) and a snapshot of the workers ([`Node`]s: each one's
//! [`Ledger`], queue length and hardware class) to a [`Decision`]. No state changes here: the
//! coordinator (`flotilla-cluster`) applies the decision, and a simulation may drive the same
//! function with workers of its own.
//!
//! | task | rule |
//! | --- | --- |
//! | plain | a worker where it fits in the free resources: most input bytes held there (transfer staging), then most free CPUs, then lowest id; else queue it (no GPUs) on the worker with room in its queue: most input bytes, then shortest queue, then lowest id |
//! | variants | every (worker, variant) pair that fits free or may queue (never queued when a variant uses GPUs); an uncalibrated pair (the model says Unknown) that fits free is explored first, round-robin (StarPU's calibration); otherwise the earliest predicted finish (a queued start waits `(queue length + 1) × prediction`), ties to most input bytes, then lowest id, then variant order; only when no pair is known, an uncalibrated queued pair |
//! | gang ([`place_gang`]) | all members or none: each member in turn as above but never queued, on the workers' ledgers with the members placed before it already reserved; every member runs the variant the first one got |
//! | chained successor ([`chain`]) | a task whose only unfinished predecessor runs on worker W goes to W, to start there when that predecessor succeeds: only a plain task (one option, no GPUs), only while W holds fewer than the chain depth, only if it could ever fit on W |

use std::collections::HashMap;

use flotilla_core::ledger::{GpuShares, Ledger};
use flotilla_core::{Resources, WorkerId};
use serde::{Deserialize, Serialize};

use crate::model::Prediction;

/// Why a task was placed where it was.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    /// `"eager"`, `"locality"`, `"dmda"` or `"explore"`.
    pub policy: String,
    /// Predicted execution time there, if the model knows.
    pub predicted_s: Option<f64>,
    /// Other candidates (`"w2"` or `"w2/gpu"`) with their predicted finish.
    pub alternatives: Vec<(String, Option<f64>)>,
    /// In words.
    pub why: String,
}

/// A live worker as placement sees it.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Its id.
    pub id: WorkerId,
    /// Its hardware class (the performance model's key).
    pub hw_class: &'a str,
    /// Its capacity and what is reserved on it.
    pub ledger: &'a Ledger,
    /// Attempts queued there beyond its free resources.
    pub queued: usize,
}

impl Node<'_> {
    /// Whether `need` may be queued here beyond the free resources: never with GPUs, only
    /// while the queue is shorter than `depth`, and only if it could ever run here.
    pub fn can_queue(&self, need: &Resources, depth: usize) -> bool {
        need.gpus <= 0.0 && need.gpu_mem == 0 && self.queued < depth && self.ledger.fits_total(need)
    }
}

/// Where and how to run one task.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The worker.
    pub worker: WorkerId,
    /// Index of the variant, for a task with variants.
    pub variant: Option<usize>,
    /// GPU positions and shares in the worker's ledger (empty when queued).
    pub gpus: GpuShares,
    /// Fits in the free resources (else queued).
    pub reserved: bool,
    /// An uncalibrated pair was explored (advance the round-robin).
    pub explored: bool,
    /// Why.
    pub reason: Reason,
}

/// One task's placement problem.
pub struct Problem<'a> {
    /// `(variant name, resources)`: one entry with no name for a plain task.
    pub options: Vec<(Option<&'a str>, &'a Resources)>,
    /// Input bytes each worker holds (transfer staging; empty otherwise).
    pub local_bytes: &'a HashMap<WorkerId, u64>,
    /// The worker queue depth.
    pub queue_depth: usize,
    /// The round-robin position for exploring.
    pub explore: usize,
}

/// Solves one placement problem over the live workers (in id order, which breaks ties);
/// `None` when the task fits nowhere now. `predict(variant, hw_class)` asks the performance
/// model.
pub fn place<'w, I>(
    p: &Problem<'_>,
    workers: I,
    predict: &dyn Fn(Option<usize>, &str) -> Prediction,
) -> Option<Decision>
where
    I: Iterator<Item = Node<'w>> + Clone,
{
    if p.options.len() == 1 && p.options[0].0.is_none() {
        place_plain(p, p.options[0].1, workers, predict)
    } else {
        place_variants(p, workers, predict)
    }
}

/// Places a gang, all members or none: each member in turn, on reserved resources only
/// (never queued, so all start at once), over the workers' ledgers with the members placed
/// before it already reserved (on copies: nothing here changes the workers). Every member runs
/// the variant the first member got. `predict(member, variant, hw_class)` asks the model for
/// member `member`'s variant (an index in that member's own options). `None` when some
/// member fits nowhere now.
pub fn place_gang<'w, I>(
    members: &[Problem<'_>],
    workers: I,
    predict: &dyn Fn(usize, Option<usize>, &str) -> Prediction,
) -> Option<Vec<Decision>>
where
    I: Iterator<Item = Node<'w>>,
{
    let nodes: Vec<Node<'w>> = workers.collect();
    let mut ledgers: Vec<Ledger> = nodes.iter().map(|n| n.ledger.clone()).collect();
    let mut decisions = Vec::with_capacity(members.len());
    let mut leader_variant: Option<usize> = None;
    for (k, m) in members.iter().enumerate() {
        let (options, offset) = match leader_variant {
            Some(v) => (vec![*m.options.get(v)?], v),
            None => (m.options.clone(), 0),
        };
        let problem = Problem {
            options,
            local_bytes: m.local_bytes,
            queue_depth: 0,
            explore: m.explore,
        };
        let views = nodes
            .iter()
            .zip(&ledgers)
            .map(|(n, l)| Node { ledger: l, ..*n });
        let shifted = |v: Option<usize>, hw: &str| predict(k, v.map(|v| v + offset), hw);
        let mut d = place(&problem, views, &shifted)?;
        if leader_variant.is_some() {
            d.variant = d.variant.map(|v| v + offset);
            d.explored = false;
        } else {
            leader_variant = d.variant;
        }
        let need = m.options.get(d.variant.unwrap_or(0))?.1;
        let i = nodes.iter().position(|n| n.id == d.worker)?;
        ledgers[i].reserve(&Ledger::charge(need), &d.gpus);
        d.reason.why = format!(
            "{} (gang of {}: every member placed at once)",
            d.reason.why,
            members.len()
        );
        decisions.push(d);
    }
    Some(decisions)
}

/// What chaining needs to know of a successor whose only unfinished predecessor runs on `node`.
#[derive(Clone, Copy, Debug)]
pub struct ChainCandidate<'a> {
    /// Its resources.
    pub need: &'a Resources,
    /// A command or WASM task with no variants and no gang.
    pub plain: bool,
    /// Successors already chained on that worker.
    pub chained: usize,
    /// The most a worker may hold chained (0: chaining is off).
    pub depth: usize,
    /// The predecessor's name, for the reason.
    pub after: &'a str,
}

/// Chains a successor onto the worker that runs its last unfinished predecessor, to start
/// there the moment that one succeeds (no round trip to the coordinator), or says no: only a
/// plain task with no GPUs, only while the worker holds fewer than `depth` chained, and only
/// if the task could ever run there.
pub fn chain(c: &ChainCandidate<'_>, node: Node<'_>) -> Option<Decision> {
    let gpu = c.need.gpus > 0.0 || c.need.gpu_mem > 0;
    if !c.plain || gpu || c.chained >= c.depth || !node.ledger.fits_total(c.need) {
        return None;
    }
    Some(Decision {
        worker: node.id,
        variant: None,
        gpus: Vec::new(),
        reserved: false,
        explored: false,
        reason: Reason {
            policy: "chain".into(),
            predicted_s: None,
            alternatives: Vec::new(),
            why: format!(
                "{}: starts there as soon as {} (its last unfinished predecessor) succeeds there",
                node.id, c.after
            ),
        },
    })
}

fn local(p: &Problem<'_>, w: WorkerId) -> u64 {
    p.local_bytes.get(&w).copied().unwrap_or(0)
}

fn place_plain<'w>(
    p: &Problem<'_>,
    need: &Resources,
    workers: impl Iterator<Item = Node<'w>> + Clone,
    predict: &dyn Fn(Option<usize>, &str) -> Prediction,
) -> Option<Decision> {
    if let Some(fit) = best_fit(p, need, workers.clone()) {
        return Some(fit.decision(predict));
    }
    let mut best: Option<(Node<'_>, u64, usize)> = None;
    for w in workers {
        if !w.can_queue(need, p.queue_depth) {
            continue;
        }
        let (bytes, q) = (local(p, w.id), w.queued);
        let better = match &best {
            None => true,
            Some((_, b, bq)) => bytes > *b || (bytes == *b && q < *bq),
        };
        if better {
            best = Some((w, bytes, q));
        }
    }
    let (w, bytes, _) = best?;
    Some(queued_decision(w, bytes, predict))
}

/// The workers a plain task may go to, each list in the order of preference of [`place`]'s
/// rule for a plain task, for [`place_plain_ranked`].
pub struct Ranked<I, F, Q> {
    /// The available workers holding some of its input bytes (any order; few).
    pub holders: I,
    /// Every available worker (with GPUs only, for a task that asks for some): most free
    /// CPUs first, then lowest id.
    pub by_free: F,
    /// Every available worker: shortest queue first, then lowest id.
    pub by_queue: Q,
}

/// [`place`] for a plain task (one option, no variant name) over workers given in
/// preference order ([`Ranked`]): the same decision as [`place`] over the same workers (up to
/// CPU amounts within 1e-9 of each other), found at the first worker that fits instead of
/// after weighing every one. With most free CPUs first, the walk stops at the first worker
/// with too few free CPUs, and with shortest queues first at the first full queue: a
/// placement costs the holders plus the workers passed over for memory or GPUs.
pub fn place_plain_ranked<'w, I, F, Q>(
    p: &Problem<'_>,
    need: &Resources,
    ranked: Ranked<I, F, Q>,
    predict: &dyn Fn(Option<usize>, &str) -> Prediction,
) -> Option<Decision>
where
    I: Iterator<Item = Node<'w>> + Clone,
    F: Iterator<Item = Node<'w>>,
    Q: Iterator<Item = Node<'w>>,
{
    // Holders first: any input bytes beat none.
    let holders = ranked.holders.clone().filter(|w| local(p, w.id) > 0);
    if let Some(fit) = best_fit(p, need, holders) {
        return Some(fit.decision(predict));
    }
    for w in ranked.by_free {
        let free = w.ledger.free_cpus();
        if free + 1e-6 < need.cpus {
            break; // every one after it has fewer free CPUs still
        }
        if let Some(gpus) = w.ledger.fit_free(need) {
            let fit = Fit {
                worker: w,
                gpus,
                bytes: 0,
                free,
            };
            return Some(fit.decision(predict));
        }
    }
    let mut best: Option<(Node<'_>, u64, usize)> = None;
    for w in ranked.holders {
        let (bytes, q) = (local(p, w.id), w.queued);
        if bytes == 0 || !w.can_queue(need, p.queue_depth) {
            continue;
        }
        let better = match &best {
            None => true,
            Some((b, bb, bq)) => {
                bytes > *bb || (bytes == *bb && (q < *bq || (q == *bq && w.id < b.id)))
            }
        };
        if better {
            best = Some((w, bytes, q));
        }
    }
    if let Some((w, bytes, _)) = best {
        return Some(queued_decision(w, bytes, predict));
    }
    for w in ranked.by_queue {
        if w.queued >= p.queue_depth {
            break; // every one after it is as full
        }
        if w.can_queue(need, p.queue_depth) {
            return Some(queued_decision(w, 0, predict));
        }
    }
    None
}

/// Where a plain task fits in the free resources: most input bytes, then most free CPUs,
/// then lowest id.
fn best_fit<'w>(
    p: &Problem<'_>,
    need: &Resources,
    workers: impl Iterator<Item = Node<'w>>,
) -> Option<Fit<'w>> {
    let mut best: Option<Fit<'w>> = None;
    for w in workers {
        let Some(gpus) = w.ledger.fit_free(need) else {
            continue;
        };
        let (bytes, free) = (local(p, w.id), w.ledger.free_cpus());
        let better = match &best {
            None => true,
            Some(b) => {
                bytes > b.bytes
                    || (bytes == b.bytes
                        && (free > b.free + 1e-9 || (free >= b.free - 1e-9 && w.id < b.worker.id)))
            }
        };
        if better {
            best = Some(Fit {
                worker: w,
                gpus,
                bytes,
                free,
            });
        }
    }
    best
}

/// A plain task fits in a worker's free resources.
struct Fit<'w> {
    worker: Node<'w>,
    gpus: GpuShares,
    bytes: u64,
    free: f64,
}

impl Fit<'_> {
    fn decision(self, predict: &dyn Fn(Option<usize>, &str) -> Prediction) -> Decision {
        let Fit {
            worker: w,
            gpus,
            bytes,
            free,
        } = self;
        let predicted_s = predict(None, w.hw_class).seconds();
        let (policy, why) = if bytes > 0 {
            ("locality", format!("{} holds {bytes} input bytes", w.id))
        } else {
            (
                "eager",
                format!(
                    "{}: most free cpus ({free} of {})",
                    w.id,
                    w.ledger.cap().cpus
                ),
            )
        };
        Decision {
            worker: w.id,
            variant: None,
            gpus,
            reserved: true,
            explored: false,
            reason: Reason {
                policy: policy.into(),
                predicted_s,
                alternatives: Vec::new(),
                why,
            },
        }
    }
}

/// A plain task queued on `w` (no worker has it fit in its free resources).
fn queued_decision(
    w: Node<'_>,
    bytes: u64,
    predict: &dyn Fn(Option<usize>, &str) -> Prediction,
) -> Decision {
    Decision {
        worker: w.id,
        variant: None,
        gpus: Vec::new(),
        reserved: false,
        explored: false,
        reason: Reason {
            policy: if bytes > 0 { "locality" } else { "eager" }.into(),
            predicted_s: predict(None, w.hw_class).seconds(),
            alternatives: Vec::new(),
            why: format!(
                "{}: queued behind {} (no worker has free resources; it holds {bytes} input bytes)",
                w.id, w.queued
            ),
        },
    }
}

struct Pair<'w> {
    worker: Node<'w>,
    variant: usize,
    gpus: Option<GpuShares>,
    pred: Prediction,
    /// Predicted finish, seconds from now, when the model knows.
    finish: Option<f64>,
    bytes: u64,
}

impl Pair<'_> {
    fn label(&self, p: &Problem<'_>) -> String {
        format!(
            "{}/{}",
            self.worker.id,
            p.options[self.variant].0.unwrap_or_default()
        )
    }
}

fn place_variants<'w>(
    p: &Problem<'_>,
    workers: impl Iterator<Item = Node<'w>>,
    predict: &dyn Fn(Option<usize>, &str) -> Prediction,
) -> Option<Decision> {
    // A task with a GPU variant is never queued (GPU work never is): queued CPU variants
    // would take the CPU cores the GPU variant needs as they free up, and starve the GPU.
    let queue_ok = !p.options.iter().any(|(_, r)| r.gpus > 0.0);
    let mut pairs: Vec<Pair<'_>> = Vec::new();
    for w in workers {
        for (vi, (_, need)) in p.options.iter().enumerate() {
            let gpus = w.ledger.fit_free(need);
            if gpus.is_none() && !(queue_ok && w.can_queue(need, p.queue_depth)) {
                continue;
            }
            let pred = predict(Some(vi), w.hw_class);
            let finish = pred.seconds().map(|s| match gpus {
                Some(_) => s,
                None => (w.queued as f64 + 1.0) * s + s,
            });
            pairs.push(Pair {
                worker: w,
                variant: vi,
                gpus,
                pred,
                finish,
                bytes: local(p, w.id),
            });
        }
    }
    if pairs.is_empty() {
        return None;
    }
    let alternatives: Vec<(String, Option<f64>)> =
        pairs.iter().map(|x| (x.label(p), x.finish)).collect();
    let unknown_free: Vec<usize> = (0..pairs.len())
        .filter(|&i| pairs[i].pred == Prediction::Unknown && pairs[i].gpus.is_some())
        .collect();
    let (chosen, explored, policy) = if !unknown_free.is_empty() {
        (
            unknown_free[p.explore % unknown_free.len()],
            true,
            "explore",
        )
    } else {
        let mut best: Option<usize> = None;
        for (i, x) in pairs.iter().enumerate() {
            let Some(f) = x.finish else { continue };
            let better = match best {
                None => true,
                Some(b) => {
                    let (bf, bb) = (pairs[b].finish.unwrap_or(f64::INFINITY), pairs[b].bytes);
                    f < bf - 1e-12 || ((f - bf).abs() <= 1e-12 && x.bytes > bb)
                }
            };
            if better {
                best = Some(i);
            }
        }
        match best {
            Some(b) => (b, false, "dmda"),
            None => {
                let unknown: Vec<usize> = (0..pairs.len()).collect();
                (unknown[p.explore % unknown.len()], true, "explore")
            }
        }
    };
    let x = &pairs[chosen];
    let label = x.label(p);
    let why = match (explored, x.gpus.is_some()) {
        (true, _) => format!("{label}: not calibrated yet, run it to learn"),
        (false, true) => format!(
            "{label}: earliest predicted finish ({:.3}s)",
            x.finish.unwrap_or_default()
        ),
        (false, false) => format!(
            "{label}: earliest predicted finish ({:.3}s) even queued",
            x.finish.unwrap_or_default()
        ),
    };
    Some(Decision {
        worker: x.worker.id,
        variant: Some(x.variant),
        reserved: x.gpus.is_some(),
        gpus: x.gpus.clone().unwrap_or_default(),
        explored,
        reason: Reason {
            policy: policy.into(),
            predicted_s: x.pred.seconds(),
            alternatives,
            why,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpus: f64, gpus: f64) -> Resources {
        Resources {
            cpus,
            gpus,
            ..Resources::zero()
        }
    }

    fn ledger(cpus: f64, gpus: f64) -> Ledger {
        Ledger::new(res(cpus, gpus), &[]).expect("valid capacity")
    }

    fn nodes<'a>(ledgers: &'a [Ledger], hw: &'a [&'a str]) -> Vec<Node<'a>> {
        ledgers
            .iter()
            .zip(hw)
            .enumerate()
            .map(|(i, (l, h))| Node {
                id: WorkerId::new(i as u32 + 1),
                hw_class: h,
                ledger: l,
                queued: 0,
            })
            .collect()
    }

    fn unknown(_: usize, _: Option<usize>, _: &str) -> Prediction {
        Prediction::Unknown
    }

    #[test]
    fn a_gang_fills_workers_member_by_member_and_leaves_them_untouched() {
        let ledgers = [ledger(2.0, 0.0), ledger(1.0, 0.0)];
        let none = HashMap::new();
        let one = res(1.0, 0.0);
        let member = || Problem {
            options: vec![(None, &one)],
            local_bytes: &none,
            queue_depth: 8,
            explore: 0,
        };
        let ns = nodes(&ledgers, &["cpu", "cpu"]);
        let three = [member(), member(), member()];
        let d = place_gang(&three, ns.iter().copied(), &unknown).expect("three cpus free");
        let workers: Vec<u32> = d.iter().map(|d| d.worker.0).collect();
        assert_eq!(
            workers,
            vec![1, 1, 2],
            "most free cpus first, then the rest"
        );
        assert!(d.iter().all(|d| d.reserved));
        assert!(d[0].reason.why.contains("gang of 3"));
        // The workers' own ledgers are not changed by the trial.
        assert_eq!(ledgers[0].used().cpus, 0.0);
        // A fourth member fits nowhere, and a gang is never queued: all or nothing.
        let four = [member(), member(), member(), member()];
        assert_eq!(place_gang(&four, ns.iter().copied(), &unknown), None);
    }

    #[test]
    fn every_gang_member_runs_the_variant_the_first_one_got() {
        let ledgers = [ledger(4.0, 0.0), ledger(4.0, 2.0)];
        let none = HashMap::new();
        let (cpu, gpu) = (res(1.0, 0.0), res(1.0, 1.0));
        let member = || Problem {
            options: vec![(Some("cpu"), &cpu), (Some("gpu"), &gpu)],
            local_bytes: &none,
            queue_depth: 0,
            explore: 0,
        };
        // The GPU variant is fastest where there is a GPU.
        let predict = |_: usize, v: Option<usize>, hw: &str| match (v, hw) {
            (Some(1), "gpu") => Prediction::Calibrated(1.0),
            (Some(1), _) => Prediction::Unknown,
            _ => Prediction::Calibrated(10.0),
        };
        let ns = nodes(&ledgers, &["cpu", "gpu"]);
        let gang = [member(), member()];
        let d = place_gang(&gang, ns.iter().copied(), &predict).expect("fits");
        assert!(d.iter().all(|d| d.variant == Some(1) && d.worker.0 == 2));
        assert_ne!(d[0].gpus, d[1].gpus, "one GPU each");
        // Two GPUs only: a third member cannot take the GPU variant, and may not fall back
        // to the CPU one, so the gang does not fit.
        let three = [member(), member(), member()];
        assert_eq!(place_gang(&three, ns.iter().copied(), &predict), None);
        // With a CPU-only gang every member stays on the CPU variant.
        let ledgers = [ledger(4.0, 0.0)];
        let ns = nodes(&ledgers, &["cpu"]);
        let d = place_gang(&gang, ns.iter().copied(), &predict).expect("fits on cpus");
        assert!(d.iter().all(|d| d.variant == Some(0)));
    }

    #[test]
    fn chaining_takes_only_plain_tasks_within_depth_that_could_fit() {
        let ledgers = [ledger(2.0, 1.0)];
        let ns = nodes(&ledgers, &["cpu"]);
        let (one, three, gpu) = (res(1.0, 0.0), res(3.0, 0.0), res(1.0, 0.5));
        let c = |need, plain, chained| ChainCandidate {
            need,
            plain,
            chained,
            depth: 2,
            after: "a",
        };
        let d = chain(&c(&one, true, 1), ns[0]).expect("plain, within depth, fits");
        assert_eq!(d.reason.policy, "chain");
        assert!(!d.reserved && d.gpus.is_empty());
        assert!(d.reason.why.contains("as soon as a"));
        assert_eq!(chain(&c(&one, true, 2), ns[0]), None, "depth reached");
        assert_eq!(chain(&c(&one, false, 0), ns[0]), None, "variants or gang");
        assert_eq!(chain(&c(&three, true, 0), ns[0]), None, "never fits");
        assert_eq!(chain(&c(&gpu, true, 0), ns[0]), None, "uses a GPU");
        let off = ChainCandidate {
            depth: 0,
            ..c(&one, true, 0)
        };
        assert_eq!(chain(&off, ns[0]), None, "chaining off");
    }

    mod ranked {
        //! `place_plain_ranked` over workers in preference order decides as `place` does
        //! over every worker.

        use proptest::prelude::*;

        use super::*;

        /// A worker: CPUs, GPUs, CPUs and GPUs reserved, queued attempts, input bytes held.
        type W = (u8, u8, u8, u8, u8, u8);

        fn worker() -> impl Strategy<Value = W> {
            // Reserved CPUs often reach the capacity, so queues are weighed too.
            (1u8..9, 0u8..3, 0u8..24, 0u8..3, 0u8..4, 0u8..3)
        }

        proptest! {
            #[test]
            fn decides_as_the_full_walk(
                ws in prop::collection::vec(worker(), 1..24),
                need_cpus in 0u8..6,
                need_gpus in 0u8..3,
                depth in 0usize..4,
            ) {
                let mut ledgers = Vec::new();
                for &(c, g, uc, ug, _, _) in &ws {
                    let mut l = ledger(f64::from(c) / 2.0, f64::from(g));
                    let r = res((f64::from(uc) / 2.0).min(f64::from(c) / 2.0), 0.0);
                    l.reserve(&r, &[]);
                    if ug > 0 && g > 0 {
                        let take = ug.min(g);
                        let shares: Vec<(usize, f64)> =
                            (0..usize::from(take)).map(|i| (i, 1.0)).collect();
                        l.reserve(&res(0.0, f64::from(take)), &shares);
                    }
                    ledgers.push(l);
                }
                let nodes: Vec<Node<'_>> = ledgers
                    .iter()
                    .zip(&ws)
                    .enumerate()
                    .map(|(i, (l, w))| Node {
                        id: WorkerId::new(i as u32 + 1),
                        hw_class: "cpu",
                        ledger: l,
                        queued: usize::from(w.4),
                    })
                    .collect();
                let local: HashMap<WorkerId, u64> = nodes
                    .iter()
                    .zip(&ws)
                    .filter(|(_, w)| w.5 > 0)
                    .map(|(n, w)| (n.id, u64::from(w.5) * 100))
                    .collect();
                let need = res(f64::from(need_cpus) / 2.0, f64::from(need_gpus) / 2.0);
                let problem = Problem {
                    options: vec![(None, &need)],
                    local_bytes: &local,
                    queue_depth: depth,
                    explore: 0,
                };
                let predict = |_: Option<usize>, _: &str| Prediction::Unknown;
                let full = place(&problem, nodes.iter().copied(), &predict);
                let mut by_free: Vec<Node<'_>> = nodes
                    .iter()
                    .copied()
                    .filter(|n| need.gpus <= 0.0 || n.ledger.cap().gpus > 0.0)
                    .collect();
                by_free.sort_by(|a, b| {
                    b.ledger
                        .free_cpus()
                        .total_cmp(&a.ledger.free_cpus())
                        .then(a.id.cmp(&b.id))
                });
                let mut by_queue = nodes.clone();
                by_queue.sort_by_key(|n| (n.queued, n.id));
                // Holders in reverse id order: their order must not matter.
                let holders: Vec<Node<'_>> = nodes
                    .iter()
                    .rev()
                    .copied()
                    .filter(|n| local.contains_key(&n.id))
                    .collect();
                let ranked = place_plain_ranked(
                    &problem,
                    &need,
                    Ranked {
                        holders: holders.into_iter(),
                        by_free: by_free.into_iter(),
                        by_queue: by_queue.into_iter(),
                    },
                    &predict,
                );
                prop_assert_eq!(full, ranked);
            }
        }
    }
}
