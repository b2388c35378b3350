//! Workers joining, rejoining after a restart, and lost; outputs rebuilt from lineage when
//! their last holder goes.

use super::*;
use crate::state::job::{Span, MAX_SPANS};

impl Coordinator {
    pub(super) fn worker_joined(
        &mut self,
        mut w: Worker,
        running: Vec<(TaskRef, u32)>,
        held: Vec<(TaskRef, ObjectRef)>,
        out: &mut Vec<Command>,
    ) {
        let id = w.id;
        self.next_worker = self.next_worker.max(id.0 + 1);
        for (tref, attempt) in running {
            let adopted = self.adopt(&mut w, tref, attempt, out);
            if !adopted {
                out.push(Command::Cancel {
                    worker: id,
                    task: tref,
                    attempt,
                });
            }
        }
        for (tref, obj) in held {
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            if j.staging != Staging::Transfer
                || tref.task.index() >= j.len()
                || j.tasks[tref.task.index()].state != TaskState::Done
            {
                continue;
            }
            // Only what its previous id was recorded holding, object for object: a worker
            // cannot claim outputs it never made (gather would write them into the user's
            // folder), nor another worker's.
            let was_holder = w
                .previous
                .is_some_and(|p| j.holders.get(&tref.task).is_some_and(|hs| hs.contains(&p)));
            let recorded = j
                .outputs
                .get(&tref.task)
                .is_some_and(|objs| objs.contains(&obj));
            if !was_holder || !recorded {
                continue;
            }
            let hs = j.holders.entry(tref.task).or_default();
            if !hs.contains(&id) {
                hs.push(id);
            }
            w.holds.insert(tref);
        }
        if w.spec.provider.is_some() {
            self.provider_workers += 1;
        }
        self.pool_worker_joined(id, &w.spec);
        self.workers.insert(id, w);
    }

    /// A rejoining worker reports an attempt running: it becomes `Running` there if it is the
    /// current attempt, assigned to a worker that is gone, and fits.
    pub(super) fn adopt(
        &mut self,
        w: &mut Worker,
        tref: TaskRef,
        attempt: u32,
        out: &mut Vec<Command>,
    ) -> bool {
        let Some(j) = self.jobs.get_mut(&tref.job) else {
            return false;
        };
        if tref.task.index() >= j.len() || !j.is_active() {
            return false;
        }
        let rt = &j.tasks[tref.task.index()];
        // Only an attempt given to the id it proved it had before.
        let current = matches!(rt.state, TaskState::Assigned | TaskState::Running)
            && rt.attempt == attempt
            && rt.worker.is_some_and(|o| {
                o != w.id && w.previous == Some(o) && !self.workers.contains_key(&o)
            });
        if !current {
            return false;
        }
        let need = resources_of(j, tref.task, rt.variant).clone();
        let ghost = self.ghosts.get(&tref);
        let gpus = ghost
            .and_then(|g| w.gpu_positions(&g.gpu_indices, &need))
            .filter(|g| w.fits_free_on(&need, g))
            .or_else(|| w.fit_free(&need));
        let Some(gpus) = gpus else {
            // It does not fit (the worker shrank?): cancel there and place it again.
            self.ghosts.remove(&tref);
            j.tasks[tref.task.index()].worker = None;
            j.runnable(
                tref.task,
                Some(format!(
                    "{} reported it running but it does not fit there",
                    w.id
                )),
                out,
            );
            return false;
        };
        self.ghosts.remove(&tref);
        w.add((tref, attempt), &need, gpus, true);
        if let Some(s) = w.slots.get_mut(&(tref, attempt)) {
            s.started = true;
        }
        j.tasks[tref.task.index()].worker = Some(w.id);
        j.set_state(
            tref.task,
            TaskState::Running,
            Some(format!("reconciled: running on {}", w.id)),
            out,
        );
        true
    }

    pub(super) fn worker_lost(&mut self, id: WorkerId, reason: &str, out: &mut Vec<Command>) {
        let w = self
            .workers
            .remove(&id)
            .expect("callers checked the worker");
        self.retired.insert(id);
        self.leaves_at.remove(&id);
        self.left_names.insert(id, w.spec.name.clone());
        if self.left_names.len() > super::LEFT_NAMES {
            self.left_names.pop_first();
        }
        if w.spec.provider.is_some() {
            self.provider_workers = self.provider_workers.saturating_sub(1);
        }
        for ((_, _), slot) in &w.slots {
            if let Some(thief) = slot.thief.and_then(|t| self.workers.get_mut(&t)) {
                thief.incoming = thief.incoming.saturating_sub(1);
            }
        }
        // A thief's retractions are of queued attempts: only workers with a queue hold any.
        self.workers.refresh();
        let queued: Vec<WorkerId> = self.workers.longest_queues().map(|w| w.id).collect();
        for other in queued {
            let Some(other) = self.workers.get_mut(&other) else {
                continue;
            };
            for s in other.slots.values_mut() {
                if s.thief == Some(id) {
                    s.thief = None;
                }
            }
        }
        let message = format!("worker {id} lost: {reason}");
        let mut gang_hit: Vec<TaskRef> = Vec::new();
        for &(tref, attempt) in w.slots.keys() {
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            let rt = &mut j.tasks[tref.task.index()];
            let current = matches!(rt.state, TaskState::Assigned | TaskState::Running)
                && rt.attempt == attempt
                && rt.worker == Some(id);
            if !current {
                continue;
            }
            rt.worker = None;
            j.broken.remove(&(tref.task, attempt));
            let slot = &w.slots[&(tref, attempt)];
            if let (Some(start), false, true) = (
                slot.started_at,
                self.pool.replaying,
                j.spans.len() < MAX_SPANS,
            ) {
                j.spans.push(Span {
                    task: tref.task,
                    attempt,
                    worker: id,
                    worker_name: w.spec.name.clone(),
                    gpu: slot.gpus.first().map(|g| g.0 as u32),
                    start,
                    end: self.now.max(start),
                    outcome: "lost",
                    bytes: 0,
                });
            }
            if j.is_active() {
                j.runnable(tref.task, Some(message.clone()), out);
                if j.graph.task(tref.task).gang.is_some() {
                    gang_hit.push(tref);
                }
            } else {
                j.set_state(tref.task, TaskState::Cancelled, Some(message.clone()), out);
            }
        }
        for tref in gang_hit {
            self.break_gang(tref.job, tref.task, None, &message, out);
        }
        // Lineage: outputs that only this worker held.
        let mut lost: BTreeMap<JobId, Vec<TaskId>> = BTreeMap::new();
        for tref in &w.holds {
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            if let Some(hs) = j.holders.get_mut(&tref.task) {
                hs.retain(|h| *h != id);
            }
            // A task that declared no outputs left nothing here: nothing to rebuild.
            let made_some = j.outputs.get(&tref.task).is_some_and(|o| !o.is_empty());
            if made_some && j.is_active() && j.tasks[tref.task.index()].state == TaskState::Done {
                lost.entry(tref.job).or_default().push(tref.task);
            }
        }
        for (job, tasks) in lost {
            for t in tasks {
                // Every output of a job is gathered at its end, not only those a later task
                // needs: all are rebuilt before the job may be declared done.
                if self.has_live_holder(job, t) {
                    continue;
                }
                self.rerun(
                    job,
                    t,
                    &format!("its outputs were lost with worker {id}"),
                    out,
                );
            }
        }
    }

    /// The outputs only worker `leaver` holds among the live workers, of done tasks of
    /// jobs still known (transfer staging), each with the peer to copy them to: the live,
    /// available worker other than `leaver` holding the fewest tasks' outputs (then the
    /// lowest id), counting those this plan gives it. Empty when no peer can take them.
    pub fn handoff(&self, leaver: WorkerId) -> Vec<super::super::Handoff> {
        let Some(w) = self.workers.get(&leaver) else {
            return Vec::new();
        };
        let mut peers: Vec<(usize, WorkerId)> = self
            .workers
            .values()
            .filter(|p| p.id != leaver && !p.unavailable)
            .map(|p| (p.holds.len(), p.id))
            .collect();
        if peers.is_empty() {
            return Vec::new();
        }
        let mut plan = Vec::new();
        let mut held: Vec<TaskRef> = w.holds.iter().copied().collect();
        held.sort_unstable();
        for tref in held {
            let Some(j) = self.jobs.get(&tref.job) else {
                continue;
            };
            let Some(objects) = j.outputs.get(&tref.task).filter(|o| !o.is_empty()) else {
                continue;
            };
            if j.tasks[tref.task.index()].state != TaskState::Done {
                continue;
            }
            let elsewhere = j.holders.get(&tref.task).is_some_and(|hs| {
                hs.iter()
                    .any(|h| *h != leaver && self.workers.contains_key(h))
            });
            if elsewhere {
                continue;
            }
            let Some(best) = peers.iter_mut().min() else {
                continue;
            };
            best.0 += 1;
            plan.push(super::super::Handoff {
                task: tref,
                objects: objects.clone(),
                to: best.1,
            });
        }
        plan
    }

    /// [`Event::ObjectsCopied`]: `worker` holds `task`'s outputs (a live worker, a done task
    /// of a job still known; anything else is stale and ignored).
    pub(super) fn objects_copied(&mut self, worker: WorkerId, task: TaskRef) {
        let Some(j) = self.jobs.get_mut(&task.job) else {
            return;
        };
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let done = j
            .tasks
            .get(task.task.index())
            .is_some_and(|rt| rt.state == TaskState::Done);
        if !done || j.outputs.get(&task.task).is_none_or(|o| o.is_empty()) {
            return;
        }
        let hs = j.holders.entry(task.task).or_default();
        if !hs.contains(&worker) {
            hs.push(worker);
        }
        w.holds.insert(task);
    }

    pub(super) fn has_live_holder(&self, job: JobId, t: TaskId) -> bool {
        self.jobs[&job]
            .holders
            .get(&t)
            .is_some_and(|hs| hs.iter().any(|h| self.workers.contains_key(h)))
    }

    pub(super) fn has_ghost_holder(&self, job: JobId, t: TaskId) -> bool {
        self.jobs[&job]
            .holders
            .get(&t)
            .is_some_and(|hs| hs.iter().any(|h| !self.workers.contains_key(h)))
    }

    /// Lineage: reruns `Done` task `t` and, recursively, its `Done` predecessors whose outputs
    /// no live worker holds. Successors that were assigned but not started are taken back
    /// (their inputs named the lost worker).
    pub(super) fn rerun(&mut self, job: JobId, t: TaskId, message: &str, out: &mut Vec<Command>) {
        let mut set: Vec<TaskId> = Vec::new();
        let mut seen: BTreeSet<TaskId> = BTreeSet::new();
        let mut stack = vec![t];
        while let Some(p) = stack.pop() {
            if !seen.insert(p) || self.jobs[&job].tasks[p.index()].state != TaskState::Done {
                continue;
            }
            set.push(p);
            let preds: Vec<TaskId> = self.jobs[&job].graph.preds(p).to_vec();
            for q in preds {
                let j = &self.jobs[&job];
                let has_outputs = j.outputs.get(&q).is_some_and(|o| !o.is_empty());
                if has_outputs && !self.has_live_holder(job, q) {
                    stack.push(q);
                }
            }
        }
        if set.is_empty() {
            return;
        }
        // Journaled: a replay must rerun the same tasks (it knows nothing of the loss), or a
        // job whose other tasks end meanwhile would replay as finished before the rerun's
        // assignment.
        if !self.pool.replaying {
            self.journal.push(JournalRecord::JobReopened {
                job,
                tasks: set.clone(),
            });
        }
        // Successors assigned but not started would fetch from the lost worker.
        let mut take_back: Vec<(TaskId, WorkerId, u32)> = Vec::new();
        {
            let j = &self.jobs[&job];
            for &p in &set {
                for &s in j.graph.succs(p) {
                    let rt = &j.tasks[s.index()];
                    if rt.state != TaskState::Assigned {
                        continue;
                    }
                    if let Some(w) = rt.worker.and_then(|w| self.workers.get(&w)) {
                        let started = w
                            .slots
                            .get(&(j.tref(s), rt.attempt))
                            .is_some_and(|sl| sl.started);
                        if !started {
                            take_back.push((s, w.id, rt.attempt));
                        }
                    }
                }
            }
        }
        take_back.sort();
        take_back.dedup();
        for (s, w, attempt) in take_back {
            let tref = TaskRef { job, task: s };
            if let Some(slot) = self
                .workers
                .get_mut(&w)
                .and_then(|w| w.slots.get_mut(&(tref, attempt)))
            {
                slot.cancel_sent = true;
            }
            out.push(Command::Cancel {
                worker: w,
                task: tref,
                attempt,
            });
            let j = self.job(job);
            j.tasks[s.index()].worker = None;
            j.runnable(s, Some(format!("taken back: {message}")), out);
        }
        let j = self.job(job);
        j.undo_done(&set, &format!("rerun: {message}"), out);
    }
}
