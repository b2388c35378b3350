//! What the work left asks of a batch queue's workers (`flotilla alloc`): read by the
//! allocator, which sizes its requests with [`flotilla_sched::alloc::decide`].

use std::collections::HashMap;

use flotilla_sched::alloc::Left;

use super::*;

/// The work left that workers of one shape could run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkLeft {
    /// CPUs asked by the ready tasks that fit such a worker and that no connected worker
    /// took.
    pub waiting_cpus: f64,
    /// The tasks not ended that fit such a worker, in topological order, each with its
    /// predecessors among them and its time (the performance model's, or the default given).
    pub left: Vec<Left>,
    /// Whether `left` stops at the limit given (the work goes on beyond it).
    pub truncated: bool,
    /// Seconds until the earliest deadline (`[pool] deadline`) of a job with work here, if
    /// any (0 once passed).
    pub deadline_s: Option<f64>,
    /// CPU-seconds of the tasks in `left` whose jobs have a deadline.
    pub due_cpu_s: f64,
    /// Tasks not ended that fit such a worker but need more time than one offers
    /// ([`WorkerShape::time_s`]; an attempt cut with no checkpoint tells), left out of the
    /// rest.
    pub too_long: u64,
    /// The one of them that needs the most: its name (`job-1/sim[4]`) and seconds.
    pub longest: Option<(String, f64)>,
}

/// A batch queue's workers, as [`Coordinator::work_left`] reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerShape {
    /// CPUs one offers.
    pub cpus: f64,
    /// GPUs one offers.
    pub gpus: f64,
    /// Its hardware class, once one has joined (the model's key); else the classes of the
    /// live workers stand in.
    pub hw_class: Option<String>,
    /// The longest a task may run on one (`Queue::task_time_s`: its limit in the allocation
    /// less its grace and leaving); `None`: no limit.
    pub time_s: Option<f64>,
}

impl Coordinator {
    /// The work of the running jobs (oldest first) that a worker of `shape` could take:
    /// the waiting CPUs, and at most `limit` tasks left timed by the performance model
    /// (`default_secs` where it knows nothing yet). A task whose every option asks more than
    /// the shape offers is left out (such a worker cannot run it; what depends on it is
    /// laid out as if it could start at once). So is a task that needs more than such a
    /// worker's whole time ([`WorkLeft::too_long`]).
    pub fn work_left(&self, shape: &WorkerShape, default_secs: f64, limit: usize) -> WorkLeft {
        const SLACK: f64 = 1e-9;
        let fits = |r: &flotilla_core::Resources| {
            r.cpus <= shape.cpus + SLACK && r.gpus <= shape.gpus + SLACK
        };
        let stand_ins: Vec<&str> = match &shape.hw_class {
            Some(hw) => vec![hw.as_str()],
            None => {
                let mut v: Vec<&str> = self
                    .workers
                    .values()
                    .map(|w| w.spec.hw_class.as_str())
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            }
        };
        let mut out = WorkLeft::default();
        for job in &self.active {
            let Some(j) = self.jobs.get(job) else {
                continue;
            };
            // The tasks that need more than a worker of the shape offers.
            let mut long: HashMap<TaskId, f64> = HashMap::new();
            if let Some(limit) = shape.time_s {
                for &t in j.cut.keys() {
                    let needs = stand_ins
                        .iter()
                        .filter_map(|hw| self.needs(j, t, hw))
                        .min_by(f64::total_cmp);
                    let fits_one = j.options(t).iter().any(|(_, r)| fits(r));
                    if let Some(needs) = needs.filter(|s| *s > limit && fits_one) {
                        long.insert(t, needs);
                    }
                }
            }
            let ended = |t: TaskId| {
                matches!(
                    j.tasks[t.index()].state,
                    TaskState::Done | TaskState::Failed | TaskState::Cancelled
                )
            };
            for (&t, &needs) in &long {
                if ended(t) {
                    continue;
                }
                out.too_long += 1;
                if out.longest.as_ref().is_none_or(|(_, s)| needs > *s) {
                    let name = format!("{}/{}", j.id, j.graph.task(t).name);
                    out.longest = Some((name, needs));
                }
            }
            // Per class: the CPUs of its first option that fits (None: it does not fit),
            // and its time.
            let mut classes: HashMap<usize, Option<(f64, f64)>> = HashMap::new();
            let mut class_of = |t: TaskId| -> Option<(f64, f64)> {
                let c = j.class_of(t);
                *classes.entry(c).or_insert_with(|| {
                    let cpus = j.options(t).iter().find(|(_, r)| fits(r))?.1.cpus;
                    let secs = stand_ins
                        .iter()
                        .filter_map(|hw| self.predicted(j, t, hw))
                        .min_by(f64::total_cmp)
                        .unwrap_or(default_secs);
                    Some((cpus.max(0.0), secs.max(0.0)))
                })
            };
            for c in &j.classes {
                if c.ready.is_empty() {
                    continue;
                }
                if let Some((cpus, _)) = class_of(TaskId::new(c.first)) {
                    let ready = if long.is_empty() {
                        c.ready.len()
                    } else {
                        c.ready
                            .iter()
                            .filter(|&&i| !long.contains_key(&TaskId::new(i)))
                            .count()
                    };
                    out.waiting_cpus += cpus * ready as f64;
                }
            }
            if out.truncated {
                continue;
            }
            let due = j
                .pool
                .as_deref()
                .and_then(|p| p.spec.deadline)
                .map(|d| j.submitted.saturating_add(d.as_millis() as Millis));
            let mut at: HashMap<TaskId, usize> = HashMap::new();
            for &t in j.graph.topological_order() {
                if ended(t) || long.contains_key(&t) {
                    continue;
                }
                let Some((cpus, secs)) = class_of(t) else {
                    continue;
                };
                let secs = match j.cut.get(&t) {
                    Some(ran) => secs.max(ran * CUT_MARGIN),
                    None => secs,
                };
                if out.left.len() >= limit {
                    out.truncated = true;
                    break;
                }
                let preds = j
                    .graph
                    .preds(t)
                    .iter()
                    .filter_map(|p| at.get(p).copied())
                    .collect();
                at.insert(t, out.left.len());
                out.left.push(Left { cpus, secs, preds });
                if let Some(due) = due {
                    out.due_cpu_s += cpus * secs;
                    let in_s = due.saturating_sub(self.now) as f64 / 1000.0;
                    out.deadline_s = Some(out.deadline_s.map_or(in_s, |d| d.min(in_s)));
                }
            }
        }
        out
    }
}
