//! Chained dispatch: successors assigned to the worker that runs their last unfinished
//! predecessor, released or retracted when it ends.

use super::*;

impl Coordinator {
    /// Chains the successors of `t` (attempt `attempt`, placed on `worker`) whose only
    /// unfinished predecessor it is: they are assigned to the same worker now, to start there
    /// the moment `t` succeeds, with no round trip to the coordinator (a chain of dependent
    /// tasks then costs a local hand-off per hop). Only plain tasks (no variants, no gang, no
    /// GPUs) in shared staging, at most `chain_depth` waiting per worker; chains recursively.
    pub(super) fn chain_successors(
        &mut self,
        job: JobId,
        t: TaskId,
        attempt: u32,
        worker: WorkerId,
        out: &mut Vec<Command>,
    ) {
        let depth = self.config.chain_depth;
        let j = &self.jobs[&job];
        // A pool job's successors are placed (and held for) one by one.
        if depth == 0 || j.staging != Staging::Shared || !j.is_active() || j.pool.is_some() {
            return;
        }
        let pred = (self.jobs[&job].tref(t), attempt);
        let succs: Vec<TaskId> = self.jobs[&job].graph.succs(t).to_vec();
        for s in succs {
            // Not onto a worker that leaves (its time left is checked task by task when
            // each is placed).
            let Some(w) = self
                .workers
                .get(&worker)
                .filter(|w| !w.unavailable && !self.leaves_at.contains_key(&w.id))
            else {
                return;
            };
            let j = &self.jobs[&job];
            let rt = &j.tasks[s.index()];
            let inst = j.graph.task(s);
            if rt.state == TaskState::Assigned && rt.worker == Some(worker) {
                // Chained here already: extend the chain below it.
                let key = (j.tref(s), rt.attempt);
                if w.slots.get(&key).is_some_and(|sl| sl.after == Some(pred)) {
                    self.chain_successors(job, s, key.1, worker, out);
                }
                continue;
            }
            if rt.state != TaskState::Waiting || rt.unmet != 1 {
                continue;
            }
            let candidate = sched::ChainCandidate {
                need: &inst.resources,
                plain: matches!(inst.kind, TaskKind::Command { .. } | TaskKind::Wasm(_))
                    && inst.gang.is_none(),
                chained: w.chained(),
                depth,
                after: &j.graph.task(t).name,
            };
            let Some(d) = sched::chain(&candidate, w.node()) else {
                continue;
            };
            self.assign_member(job, s, d, Vec::new(), None, Some(pred), out);
            let a = self.jobs[&job].tasks[s.index()].attempt;
            self.chain_successors(job, s, a, worker, out);
        }
    }

    /// `pred` ended (`succeeded` on `ran_on`, or not): its chained successors on `ran_on`
    /// join that worker's queue (the caller promotes it: returns whether any did); every
    /// other one (elsewhere, or after a failure) is retracted and placed again once it is
    /// `Ready`.
    pub(super) fn settle_chained(
        &mut self,
        pred: (TaskRef, u32),
        succeeded: bool,
        ran_on: WorkerId,
        out: &mut Vec<Command>,
    ) -> bool {
        let job = pred.0.job;
        let Some(j) = self.jobs.get(&job) else {
            return false;
        };
        let mut released = false;
        let mut holders: Vec<WorkerId> = Vec::new();
        for &s in j.graph.succs(pred.0.task) {
            let rt = &j.tasks[s.index()];
            if rt.state == TaskState::Assigned {
                if let Some(w) = rt.worker {
                    if !holders.contains(&w) {
                        holders.push(w);
                    }
                }
            }
        }
        for wid in holders {
            let Some(w) = self.workers.get_mut(&wid) else {
                continue;
            };
            if succeeded && wid == ran_on {
                released |= w.release_chained(pred);
                continue;
            }
            for key in w.chained_on(pred) {
                if let Some(slot) = w.slots.get_mut(&key) {
                    if slot.cancel_sent {
                        continue;
                    }
                    slot.cancel_sent = true;
                }
                out.push(Command::Retract {
                    worker: wid,
                    task: key.0,
                    attempt: key.1,
                });
            }
        }
        released
    }
}
