//! What workers report about attempts: started, returned, finished (succeeded, failed,
//! cancelled), and assignments replayed from the journal.

use super::*;
use crate::state::job::{Span, MAX_SPANS};

/// A success to apply (see [`Coordinator::attempt_succeeded`]).
pub(super) struct Succeeded {
    pub(super) task: TaskRef,
    /// The worker that really ran it.
    pub(super) ran_on: WorkerId,
    /// Its hardware class, to record the time under.
    pub(super) hw_class: Option<String>,
    pub(super) variant: Option<String>,
    pub(super) usage: super::super::Usage,
    pub(super) outputs: Vec<ObjectRef>,
}

impl Coordinator {
    pub(super) fn task_started(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        let w = self
            .workers
            .get_mut(&worker)
            .expect("callers checked the worker");
        let key = (task, attempt);
        let Some(slot) = w.slots.get_mut(&key) else {
            return Ok(()); // stale
        };
        // A chained task starts when its predecessor succeeded there, which the worker
        // reported first; clear the mark in case that report was stale here.
        slot.after = None;
        if !slot.reserved && !w.promote_one(key) {
            return Err(StateError::Conflict {
                task,
                attempt,
                worker,
                reason: "started a queued task beyond the worker's free resources".into(),
            });
        }
        let slot = w.slots.get_mut(&key).expect("present above");
        slot.started = true;
        let thief = slot.thief.take();
        if let Some(t) = thief.and_then(|t| self.workers.get_mut(&t)) {
            t.incoming = t.incoming.saturating_sub(1);
        }
        let j = self.job(task.job);
        let rt = &j.tasks[task.task.index()];
        if rt.state == TaskState::Assigned && rt.attempt == attempt && rt.worker == Some(worker) {
            j.set_state(task.task, TaskState::Running, None, out);
            let inst = j.graph.task(task.task);
            if inst.gang.is_none() && !matches!(inst.kind, TaskKind::Variants(_)) {
                self.chain_successors(task.job, task.task, attempt, worker, out);
            }
        }
        Ok(())
    }

    pub(super) fn task_returned(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        let w = self
            .workers
            .get_mut(&worker)
            .expect("callers checked the worker");
        let key = (task, attempt);
        let Some(slot) = w.slots.get(&key) else {
            return Ok(()); // stale
        };
        if slot.started {
            return Err(StateError::Conflict {
                task,
                attempt,
                worker,
                reason: "returned a task it had reported started".into(),
            });
        }
        let slot = w.remove(key).expect("present above");
        if let Some(t) = slot.thief.and_then(|t| self.workers.get_mut(&t)) {
            t.incoming = t.incoming.saturating_sub(1);
        }
        let j = self.job(task.job);
        j.broken.remove(&(task.task, attempt));
        let rt = &mut j.tasks[task.task.index()];
        if rt.state == TaskState::Assigned && rt.attempt == attempt && rt.worker == Some(worker) {
            rt.worker = None;
            if j.is_active() {
                j.runnable(task.task, Some(format!("returned by {worker}")), out);
            } else {
                j.set_state(task.task, TaskState::Cancelled, None, out);
            }
        }
        self.settle_chained((task, attempt), false, worker, out);
        // A job that keeps going may have waited only for this (a successor of a failed
        // task, placed ahead on a worker's queue, coming back to wait for good).
        self.check_job_end(task.job, out);
        Ok(())
    }

    /// Transfer staging: the attempt's inputs took `secs` to fetch (`bytes`) before it ran:
    /// a `transfer` span ending where its span starts (the trace; not journaled).
    pub fn note_transfer(&mut self, task: TaskRef, attempt: u32, secs: f64, bytes: u64) {
        if self.pool.replaying || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let Some(j) = self.jobs.get_mut(&task.job) else {
            return;
        };
        // Its span was the last pushed for this attempt (just now).
        let Some(s) = j
            .spans
            .iter()
            .rev()
            .take(64)
            .find(|s| s.task == task.task && s.attempt == attempt && s.outcome != "transfer")
        else {
            return;
        };
        if j.spans.len() >= MAX_SPANS {
            return;
        }
        let span = Span {
            outcome: "transfer",
            start: s
                .start
                .saturating_sub((secs * 1000.0).round() as Millis)
                .max(j.submitted),
            end: s.start,
            bytes,
            worker_name: s.worker_name.clone(),
            ..*s
        };
        j.spans.push(span);
    }

    pub(super) fn task_finished(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        result: AttemptResult,
        out: &mut Vec<Command>,
    ) {
        // A ghost's attempt is reported by the worker it was given to, which rejoined
        // under a new id; any other live worker's word on it is refused. (A worker that is
        // not live is a replayed record: accepted when it was live.)
        let speaks = |g: &Ghost| {
            g.attempt == attempt
                && self
                    .workers
                    .get(&worker)
                    .is_none_or(|w| w.speaks_for(g.worker))
        };
        let ghost = match self.ghosts.get(&task) {
            Some(g) if speaks(g) => self.ghosts.remove(&task),
            _ => None,
        };
        let mut hw_class = ghost.as_ref().map(|g| g.hw_class.clone());
        let owner = ghost.as_ref().map_or(worker, |g| g.worker);
        // Whether the attempt held resources on `worker` that queued attempts may now take.
        let mut freed = false;
        // When it was heard to start, and its first GPU (the trace).
        let mut began: (Option<Millis>, Option<u32>) = (None, None);
        // The CPUs it held (the task's own when the slot is gone: a ghost's report).
        let mut held_cpus = None;
        if let Some(w) = self.workers.get_mut(&worker) {
            // Promotion waits until the chained attempts this end releases are queued.
            if let Some(slot) = w.take((task, attempt)) {
                freed = slot.reserved;
                held_cpus = Some(slot.res.cpus);
                began.0 = slot.started_at;
                began.1 = slot.gpus.first().map(|g| g.0 as u32);
                if let Some(t) = slot.thief.and_then(|t| self.workers.get_mut(&t)) {
                    t.incoming = t.incoming.saturating_sub(1);
                }
            }
            let w = self.workers.get_mut(&worker).expect("present above");
            if result.usage.cpu_seconds.is_finite() && result.usage.cpu_seconds > 0.0 {
                w.busy_cpu_s += result.usage.cpu_seconds;
            }
            hw_class.get_or_insert_with(|| w.spec.hw_class.clone());
        }
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let t = task.task;
        let rt = &j.tasks[t.index()];
        let current = matches!(rt.state, TaskState::Assigned | TaskState::Running)
            && rt.attempt == attempt
            && rt.worker == Some(owner);
        if !current {
            // Stale or duplicate: no effect but the freed slot.
            if let Some(w) = self.workers.get_mut(&worker).filter(|_| freed) {
                w.promote_queued();
            }
            return;
        }
        // The worker that really ran it (a rejoined worker reporting a ghost's attempt).
        let ran_on = if self.workers.contains_key(&worker) {
            worker
        } else {
            owner
        };
        let succeeded = matches!(result.outcome, AttemptOutcome::Succeeded)
            && !j.broken.contains(&(t, attempt));
        if !self.pool.replaying && j.spans.len() < MAX_SPANS {
            // The worker's own measure of its run, ending now; what the coordinator saw of
            // its start when the worker reported none.
            let end = self.now;
            let wall = result.usage.wall_seconds;
            let start = if wall.is_finite() && wall > 0.0 {
                end.saturating_sub((wall * 1000.0).round() as Millis)
            } else {
                began.0.unwrap_or(end)
            };
            j.spans.push(Span {
                task: t,
                attempt,
                worker: ran_on,
                // Only for a span: no copy on the report path otherwise.
                worker_name: self
                    .workers
                    .get(&ran_on)
                    .map_or_else(String::new, |w| w.spec.name.clone()),
                gpu: began.1,
                start: start.max(j.submitted),
                end,
                outcome: match &result.outcome {
                    AttemptOutcome::Succeeded if succeeded => "succeeded",
                    AttemptOutcome::Succeeded | AttemptOutcome::Cancelled => "cancelled",
                    AttemptOutcome::Failed { .. } => "failed",
                    AttemptOutcome::Preempted { .. } => "preempted",
                },
                bytes: 0,
            });
        }
        let released = self.settle_chained((task, attempt), succeeded, ran_on, out);
        if freed || (released && ran_on == worker) {
            if let Some(w) = self.workers.get_mut(&worker) {
                w.promote_queued();
            }
        }
        if released && ran_on != worker {
            if let Some(w) = self.workers.get_mut(&ran_on) {
                w.promote_queued();
            }
        }
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let active = j.is_active();
        let wall = result.usage.wall_seconds;
        if wall.is_finite() && wall > 0.0 {
            let cpus = held_cpus.unwrap_or_else(|| j.graph.task(t).resources.cpus);
            let busy = j.busy.entry(ran_on).or_default();
            busy.0 += wall;
            busy.1 += wall * cpus;
            if matches!(
                result.outcome,
                AttemptOutcome::Failed { .. } | AttemptOutcome::Cancelled
            ) {
                // A failed (or timed-out) attempt's time is the task's time so far; so is a
                // cancelled one's that ran (`logs` then does not say it never ran).
                j.tasks[t.index()].ext().usage = Some(result.usage);
            }
        }
        if j.broken.remove(&(t, attempt)) {
            // Its gang broke while it ran, or an input it read was wrong: whatever it says,
            // it runs again.
            let gang = j.graph.task(t).gang.is_some();
            if let (true, AttemptOutcome::Preempted { checkpoint }) = (gang, result.outcome) {
                // Its worker was reclaimed too, as the gang stopped: the checkpoint it left
                // is the gang's newest (a data-parallel job's rank 0 may be the one).
                j.keep_checkpoint(t, checkpoint);
            }
            let why = if gang {
                "stopped with its gang"
            } else {
                "stopped: an input it read was computed again"
            };
            j.tasks[t.index()].worker = None;
            if active {
                j.runnable(t, Some(format!("attempt {attempt} {why}")), out);
            } else {
                j.set_state(t, TaskState::Cancelled, None, out);
            }
            return;
        }
        match result.outcome {
            AttemptOutcome::Succeeded => {
                // (Checked first: a job without a pool pays nothing for the copies.)
                let pooled = self.jobs[&task.job].pool.is_some();
                if pooled
                    && self.pool_succeeded(
                        task,
                        attempt,
                        ran_on,
                        hw_class.clone(),
                        result.variant.clone(),
                        result.usage,
                        result.outputs.clone(),
                        out,
                    )
                {
                    return;
                }
                let outcome = Succeeded {
                    task,
                    ran_on,
                    hw_class,
                    variant: result.variant,
                    usage: result.usage,
                    outputs: result.outputs,
                };
                self.attempt_succeeded(outcome, out);
            }
            AttemptOutcome::Failed { message, retryable } => {
                self.attempt_failed(task, attempt, message, retryable, out);
            }
            AttemptOutcome::Cancelled => self.attempt_cancelled(task, attempt, worker, out),
            AttemptOutcome::Preempted { checkpoint } => {
                self.attempt_preempted(task, attempt, ran_on, checkpoint, result.usage, out)
            }
        }
    }

    /// The current attempt was stopped because its worker was reclaimed: ready again with
    /// no retry counted, resuming from the checkpoint it left (a gang member breaks its gang;
    /// spot semantics: a provider is paid for the work its checkpoint carries forward).
    fn attempt_preempted(
        &mut self,
        task: TaskRef,
        attempt: u32,
        worker: WorkerId,
        checkpoint: Vec<ObjectRef>,
        usage: super::super::Usage,
        out: &mut Vec<Command>,
    ) {
        let t = task.task;
        let files = checkpoint.len();
        let carried = self.preempted_pay((task, attempt), worker, files > 0, &usage);
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let rt = &mut j.tasks[t.index()];
        rt.worker = None;
        j.keep_checkpoint(t, checkpoint);
        if !j.is_active() {
            j.set_state(t, TaskState::Cancelled, None, out);
            return;
        }
        // In shared staging its checkpoint files stay in the job's folder, where the next
        // attempt finds them: nothing is shipped, so nothing tells whether it wrote them. A
        // task that declares them is taken to have (it was held back, for want of a worker
        // with the whole run left, as one that restarts from nothing).
        let shared_checkpoint =
            j.staging != Staging::Transfer && !j.graph.task(t).checkpoint.is_empty();
        let kept = j.tasks[t.index()]
            .ext
            .as_ref()
            .map_or(0, |e| e.resume.len());
        let from = if files > 0 {
            // It moved on: what it needs now is less than it ran.
            j.cut.remove(&t);
            format!("; resumes from its {files} checkpoint file(s)")
        } else if kept > 0 {
            // It wrote nothing new since it was given its checkpoint (or a gang's peer's).
            format!("; resumes from the {kept} checkpoint file(s) it was given (none changed)")
        } else if shared_checkpoint {
            j.cut.remove(&t);
            "; resumes from the checkpoint files it left in the job's folder".to_string()
        } else if usage.wall_seconds > 0.0 {
            let ran = j.cut.entry(t).or_insert(0.0);
            *ran = ran.max(usage.wall_seconds);
            let secs = |s: f64| {
                flotilla_core::duration::format_duration(std::time::Duration::from_secs(
                    s.ceil() as u64
                ))
            };
            format!(
                " after {}, with no checkpoint: it goes to a worker that leaves only if that \
                 worker has {} left",
                secs(usage.wall_seconds),
                secs(*ran * super::CUT_MARGIN)
            )
        } else {
            String::new()
        };
        let paid = if carried {
            " (paid: work carried forward)"
        } else {
            ""
        };
        j.runnable(
            t,
            Some(format!(
                "attempt {attempt} preempted on {worker}{from}{paid}"
            )),
            out,
        );
        if j.graph.task(t).gang.is_some() {
            let why = format!("a member was preempted on {worker}");
            self.break_gang(task.job, t, None, &why, out);
        }
    }

    /// The current attempt succeeded: record its time, the outputs it holds, and mark it done.
    pub(super) fn attempt_succeeded(&mut self, s: Succeeded, out: &mut Vec<Command>) {
        let Succeeded {
            task,
            ran_on,
            hw_class,
            variant,
            usage,
            outputs,
        } = s;
        let t = task.task;
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let variant = variant
            .as_deref()
            .and_then(|v| variant_index(j, t, v))
            .or(j.tasks[t.index()].variant);
        j.set_variant(t, variant);
        {
            let rt = &mut j.tasks[t.index()];
            rt.worker = Some(ran_on);
            rt.ext().usage = Some(usage);
        }
        if let Some(hw) = &hw_class {
            let c = j.class_of(t);
            let codelet = match j.variant_name(t, variant) {
                Some(v) => format!("{}/{v}", j.classes[c].codelet),
                None => j.classes[c].codelet.clone(),
            };
            self.model.record(&codelet, hw, 0, usage.wall_seconds);
            self.pool.samples += 1;
        }
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        if j.staging == Staging::Transfer {
            let made_some = !outputs.is_empty();
            j.outputs.insert(t, outputs);
            j.holders.insert(t, vec![ran_on]);
            // It fetched its predecessors' outputs: it holds them too.
            let preds: Vec<TaskId> = j.graph.preds(t).to_vec();
            let live = self.workers.get_mut(&ran_on);
            let mut held = Vec::new();
            for p in preds {
                if j.outputs.get(&p).is_some_and(|o| !o.is_empty()) {
                    let hs = j.holders.entry(p).or_default();
                    if !hs.contains(&ran_on) {
                        hs.push(ran_on);
                    }
                    held.push(j.tref(p));
                }
            }
            if let Some(w) = live {
                if made_some {
                    w.holds.insert(task);
                }
                w.holds.extend(held);
            }
        }
        j.mark_done(t, out);
        self.check_job_end(task.job, out);
    }

    /// The current attempt failed: retry after a backoff while retries are left (a gang
    /// member takes its gang with it), else fail the task and its job.
    fn attempt_failed(
        &mut self,
        task: TaskRef,
        attempt: u32,
        message: String,
        retryable: bool,
        out: &mut Vec<Command>,
    ) {
        let now = self.now;
        let t = task.task;
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        if !j.is_active() {
            j.set_state(t, TaskState::Cancelled, Some(message), out);
            return;
        }
        let gang = j.graph.task(t).gang;
        let retries = j.graph.task(t).retries;
        let rt = &mut j.tasks[t.index()];
        rt.failures += 1;
        let failures = rt.failures;
        if !(retryable && failures <= retries) {
            let why = if retryable {
                format!("{message} (no retries left)")
            } else {
                message
            };
            j.set_state(t, TaskState::Failed, Some(why), out);
            self.failed_for_good(task.job, t, out);
            return;
        }
        j.retries += 1;
        let shift = (failures - 1).min(40);
        let delay = self
            .config
            .retry_backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.config.max_backoff_ms);
        self.backoff
            .push(Reverse((now.saturating_add(delay), task, attempt)));
        j.set_state(
            t,
            TaskState::Backoff,
            Some(format!(
                "{message} (retry {failures} of {retries} in {delay} ms)"
            )),
            out,
        );
        if gang.is_some() {
            self.break_gang(task.job, t, Some(failures), &message, out);
        }
    }

    /// The current attempt was cancelled on `worker`: ready again while the job runs (a gang
    /// member breaks its gang), cancelled otherwise.
    fn attempt_cancelled(
        &mut self,
        task: TaskRef,
        attempt: u32,
        worker: WorkerId,
        out: &mut Vec<Command>,
    ) {
        let t = task.task;
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        j.tasks[t.index()].worker = None;
        if !j.is_active() {
            j.set_state(t, TaskState::Cancelled, None, out);
            return;
        }
        j.runnable(
            t,
            Some(format!("attempt {attempt} cancelled on {worker}")),
            out,
        );
        if j.graph.task(t).gang.is_some() {
            let why = format!("a member was cancelled on {worker}");
            self.break_gang(task.job, t, None, &why, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn task_assigned(
        &mut self,
        worker: WorkerId,
        task: TaskRef,
        attempt: u32,
        variant: Option<String>,
        gpu_indices: Vec<u32>,
        hw_class: String,
        out: &mut Vec<Command>,
    ) -> Result<()> {
        let conflict = |reason: &str| StateError::Conflict {
            task,
            attempt,
            worker,
            reason: reason.into(),
        };
        if self.workers.contains_key(&worker) {
            return Err(conflict(
                "assignments are made by the coordinator; only a replay may apply one",
            ));
        }
        let j = self
            .jobs
            .get_mut(&task.job)
            .expect("callers checked the job");
        let rt = &j.tasks[task.task.index()];
        let done_for_good = rt.state == TaskState::Done && !j.is_active();
        if done_for_good || matches!(rt.state, TaskState::Failed | TaskState::Cancelled) {
            return Err(conflict("the task is finished"));
        }
        if attempt <= rt.attempt {
            return Err(conflict("an attempt at least as new was seen already"));
        }
        if rt.worker.is_some_and(|w| self.workers.contains_key(&w)) {
            return Err(conflict("the task is on a live worker"));
        }
        let v = match &variant {
            Some(name) => Some(
                variant_index(j, task.task, name)
                    .ok_or_else(|| conflict(&format!("no variant named {name:?}")))?,
            ),
            None => None,
        };
        self.retired.insert(worker);
        self.next_worker = self.next_worker.max(worker.0 + 1);
        if j.tasks[task.task.index()].state == TaskState::Done {
            // Rerun from lineage before the restart (its outputs were lost).
            j.undo_done(&[task.task], "rerun: its outputs were lost", out);
        }
        j.set_variant(task.task, v);
        let rt = &mut j.tasks[task.task.index()];
        rt.attempt = attempt;
        rt.worker = Some(worker);
        if j.is_active() {
            j.set_state(task.task, TaskState::Assigned, None, out);
            self.ghosts.insert(
                task,
                Ghost {
                    worker,
                    attempt,
                    gpu_indices,
                    hw_class,
                },
            );
            if self.grace_until.is_some() {
                let due = self.now.saturating_add(self.config.reconcile_grace_ms);
                self.grace.push(Reverse((due, task, attempt)));
            }
        } else {
            j.set_state(task.task, TaskState::Cancelled, None, out);
        }
        Ok(())
    }
}
