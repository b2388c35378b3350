//! Time passing: retry backoffs and the reconcile grace after a restart.

use super::*;

impl Coordinator {
    /// A task journaled as assigned to a worker that is gone, and not reported by anyone:
    /// it is placed again.
    pub(super) fn release_ghost(
        &mut self,
        tref: TaskRef,
        attempt: u32,
        msg: String,
        out: &mut Vec<Command>,
    ) {
        if self.ghosts.get(&tref).is_none_or(|g| g.attempt != attempt) {
            return;
        }
        self.ghosts.remove(&tref);
        let j = self.job(tref.job);
        let rt = &mut j.tasks[tref.task.index()];
        if rt.attempt == attempt && matches!(rt.state, TaskState::Assigned | TaskState::Running) {
            rt.worker = None;
            if j.is_active() {
                j.runnable(tref.task, Some(msg), out);
            } else {
                j.set_state(tref.task, TaskState::Cancelled, Some(msg), out);
            }
        }
    }

    pub(super) fn run_timers(&mut self, out: &mut Vec<Command>) {
        let now = self.now;
        while let Some(&Reverse((due, tref, attempt))) = self.backoff.peek() {
            if due > now {
                break;
            }
            self.backoff.pop();
            let Some(j) = self.jobs.get_mut(&tref.job) else {
                continue;
            };
            let rt = &j.tasks[tref.task.index()];
            if rt.state == TaskState::Backoff && rt.attempt == attempt {
                j.runnable(tref.task, None, out);
            }
        }
        while let Some(&Reverse((due, tref, attempt))) = self.grace.peek() {
            if due > now {
                break;
            }
            self.grace.pop();
            let Some(g) = self.ghosts.get(&tref) else {
                continue;
            };
            if g.attempt != attempt {
                continue;
            }
            let msg = format!("worker {} did not come back after the restart", g.worker);
            self.release_ghost(tref, attempt, msg, out);
        }
        if self.grace_until.is_some_and(|g| g <= now) {
            self.grace_until = None;
        }
    }

    pub(super) fn in_grace(&self) -> bool {
        self.grace_until.is_some_and(|g| self.now < g)
    }
}
