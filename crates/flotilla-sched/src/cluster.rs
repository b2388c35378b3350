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

fn local(p: &Problem<'_>, w: WorkerId) -> u64 {
    p.local_bytes.get(&w).copied().unwrap_or(0)
}

fn place_plain<'w>(
    p: &Problem<'_>,
    need: &Resources,
    workers: impl Iterator<Item = Node<'w>> + Clone,
    predict: &dyn Fn(Option<usize>, &str) -> Prediction,
) -> Option<Decision> {
    struct Fit<'w> {
        worker: Node<'w>,
        gpus: GpuShares,
        bytes: u64,
        free: f64,
    }
    let mut best: Option<Fit<'_>> = None;
    for w in workers.clone() {
        let Some(gpus) = w.ledger.fit_free(need) else {
            continue;
        };
        let (bytes, free) = (local(p, w.id), w.ledger.free_cpus());
        let better = match &best {
            None => true,
            Some(b) => bytes > b.bytes || (bytes == b.bytes && free > b.free + 1e-9),
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
    if let Some(Fit {
        worker: w,
        gpus,
        bytes,
        free,
    }) = best
    {
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
        return Some(Decision {
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
        });
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
    let (w, bytes, q) = best?;
    Some(Decision {
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
                "{}: queued behind {q} (no worker has free resources; it holds {bytes} input bytes)",
                w.id
            ),
        },
    })
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
