//! The worker agent's state: which attempts are queued and running on this worker, what they
//! hold of its resources, which chained attempts may start, and what to tell the coordinator.
//! Like the coordinator's [`state`](crate::state), it is pure: events in ([`Agent::message`],
//! [`Agent::finished`], [`Agent::rejoin`]), commands out ([`Command`]), time passed in. The
//! I/O shell ([`worker`](crate::worker)) owns the session, runs the attempts (processes, WASM,
//! staging) and carries the commands out in the order they are given.
//!
//! # An attempt's way through the agent
//!
//! | state | event | becomes | commands |
//! | --- | --- | --- | --- |
//! | (new) | assigned, fits the worker as offered | queued | — |
//! | (new) | assigned, can never fit (or names a GPU the worker lacks) | ended | `Finished` (failed, retryable) |
//! | (new) | assigned again while queued or running | unchanged | — (the duplicate is dropped) |
//! | queued | its `after` attempt succeeded here (or it has none) and its resources are free | running | `Started`, then `Start` |
//! | queued | cancelled | ended | `Finished` (cancelled) |
//! | queued | retracted | ended | `Returned` |
//! | queued | the session is rebuilt ([`Agent::rejoin`]) | ended (dropped) | — (the coordinator places again what the worker does not report running) |
//! | running | cancelled | running | `Kill` (its finish follows) |
//! | running | finished (any outcome) | ended | `Finished`, then the starts its freed resources allow |
//! | queued | the worker is reclaimed ([`Agent::reclaim`]) | ended | `Returned` |
//! | (new) | assigned while reclaimed | ended | `Returned` |
//!
//! Every assignment therefore ends exactly once: reported finished, reported returned, or
//! dropped at a rejoin. Queued attempts start in arrival order where they fit; a later one may
//! start around an earlier one that does not fit yet (backfill).
//!
//! # Invariants
//! - **Never over-committed.** An attempt starts only when its charge fits in the [`Ledger`]
//!   (the same type the coordinator places with) on the GPUs the coordinator chose, and gives
//!   it back when it finishes.
//! - **A finish is reported before any start that uses what it freed**: [`Agent::finished`]
//!   returns the `Finished` report ahead of the starts it allows, and the shell sends commands
//!   in order.
//! - **Chained attempts** (`after`) start only once that attempt of their predecessor has
//!   succeeded on this worker (the last [`SUCCEEDED_KEPT`] successes are remembered).
//! - **Results survive a broken session**: finishes of the last [`RESEND_MS`] are kept and
//!   re-sent at [`Agent::rejoin`]; the coordinator applies each result at most once.

use std::collections::{BTreeMap, HashSet, VecDeque};

use flotilla_core::ledger::{GpuShares, Ledger};
use flotilla_core::Resources;

use crate::state::{AttemptOutcome, AttemptResult, Millis, TaskRef, Usage};

#[cfg(test)]
mod cosim;
#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

/// An attempt of a task: the task and the attempt number.
pub(crate) type Attempt = (TaskRef, u32);

/// How many recent successes the agent remembers for chained assignments.
pub(crate) const SUCCEEDED_KEPT: usize = 4096;

/// How long finishes are kept for re-sending after a broken session, in milliseconds.
pub(crate) const RESEND_MS: Millis = 60_000;

/// An assignment as the agent sees it. `payload` is whatever the shell needs to run it; the
/// state never looks inside.
#[derive(Clone, Debug)]
pub(crate) struct Work<P> {
    /// The attempt.
    pub(crate) key: Attempt,
    /// What it needs.
    pub(crate) need: Resources,
    /// The GPUs (device indices) the coordinator chose for it.
    pub(crate) gpus: Vec<u32>,
    /// Chained: starts only after this attempt succeeded here.
    pub(crate) after: Option<Attempt>,
    /// What the shell runs.
    pub(crate) payload: P,
}

/// What the coordinator is told.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Report {
    /// The attempt started.
    Started(Attempt),
    /// The attempt ended (succeeded, failed or cancelled).
    Finished(Attempt, AttemptResult),
    /// The queued attempt was given back after a retraction.
    Returned(Attempt),
}

/// What the shell does, in the order given.
#[derive(Debug)]
pub(crate) enum Command<P> {
    /// Tell the coordinator.
    Report(Report),
    /// Run the attempt now: its resources are reserved. Its end comes back through
    /// [`Agent::finished`].
    Start {
        /// The attempt.
        key: Attempt,
        /// What to run.
        payload: P,
    },
    /// Stop the running attempt; its end still comes back through [`Agent::finished`].
    Kill(Attempt),
}

/// What a new session reports, from [`Agent::rejoin`].
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Rejoin {
    /// The attempts running here.
    pub(crate) running: Vec<Attempt>,
    /// Finishes of the last [`RESEND_MS`], to send again.
    pub(crate) resend: Vec<(Attempt, AttemptResult)>,
    /// Queued attempts dropped: the coordinator places them again.
    pub(crate) dropped: Vec<Attempt>,
}

/// A running attempt's reservation.
#[derive(Clone, Debug)]
struct Held {
    charge: Resources,
    gpus: GpuShares,
}

/// The agent's state.
#[derive(Debug)]
pub(crate) struct Agent<P> {
    ledger: Ledger,
    /// Queued attempts in arrival order.
    queue: VecDeque<Work<P>>,
    /// Running attempts and what they hold.
    running: BTreeMap<Attempt, Held>,
    /// Recent successes here (for `after`), and their order for forgetting.
    succeeded: HashSet<Attempt>,
    succeeded_order: VecDeque<Attempt>,
    /// Finishes reported lately, for re-sending after a rejoin.
    recent: VecDeque<(Millis, Attempt, AttemptResult)>,
    /// Reclaimed by its owner: new assignments are given back at once, nothing starts.
    paused: bool,
}

impl<P> Agent<P> {
    /// An agent with nothing queued or running on a worker with this ledger.
    pub(crate) fn new(ledger: Ledger) -> Self {
        Agent {
            ledger,
            queue: VecDeque::new(),
            running: BTreeMap::new(),
            succeeded: HashSet::new(),
            succeeded_order: VecDeque::new(),
            recent: VecDeque::new(),
            paused: false,
        }
    }

    /// The worker is reclaimed (drained, its availability window ended, its owner came
    /// back): every queued attempt is given back (`Returned`), and so is every assignment
    /// that still arrives, until [`Agent::resume`]. Running attempts are the shell's to
    /// stop (each ends through [`Agent::finished`], preempted).
    pub(crate) fn reclaim(&mut self) -> Vec<Command<P>> {
        self.paused = true;
        self.queue
            .drain(..)
            .map(|w| Command::Report(Report::Returned(w.key)))
            .collect()
    }

    /// The worker takes work again.
    pub(crate) fn resume(&mut self) {
        self.paused = false;
    }

    /// Whether it is reclaimed.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// The resources and what running attempts hold of them.
    pub(crate) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Whether nothing runs or waits here.
    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty()
    }

    /// The running attempts.
    #[cfg(test)]
    pub(crate) fn running(&self) -> impl Iterator<Item = &Attempt> + '_ {
        self.running.keys()
    }

    /// The queued attempts, in arrival order.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> impl Iterator<Item = &Work<P>> + '_ {
        self.queue.iter()
    }

    /// A message from the coordinator: cancellations, retractions, then new assignments.
    /// Returns what to do, starts included.
    pub(crate) fn message(
        &mut self,
        cancel: &[Attempt],
        retract: &[Attempt],
        assign: Vec<Work<P>>,
        now: Millis,
    ) -> Vec<Command<P>> {
        let mut out = Vec::new();
        for key in cancel {
            if self.running.contains_key(key) {
                out.push(Command::Kill(*key));
            } else if self.unqueue(key) {
                let result = AttemptResult {
                    outcome: AttemptOutcome::Cancelled,
                    usage: Usage::default(),
                    outputs: Vec::new(),
                    variant: None,
                };
                self.report_finish(*key, result, now, &mut out);
            }
        }
        for key in retract {
            if self.unqueue(key) {
                out.push(Command::Report(Report::Returned(*key)));
            }
        }
        for work in assign {
            self.accept(work, now, &mut out);
        }
        self.start_ready(&mut out);
        out
    }

    /// A running attempt ended with `result`. Returns the `Finished` report, then the starts
    /// that what it freed allows. An attempt that is not running here is ignored.
    pub(crate) fn finished(
        &mut self,
        key: Attempt,
        result: AttemptResult,
        now: Millis,
    ) -> Vec<Command<P>> {
        let mut out = Vec::new();
        let Some(held) = self.running.remove(&key) else {
            return out;
        };
        self.ledger.release(&held.charge, &held.gpus);
        if result.outcome == AttemptOutcome::Succeeded && self.succeeded.insert(key) {
            self.succeeded_order.push_back(key);
            if self.succeeded_order.len() > SUCCEEDED_KEPT {
                if let Some(old) = self.succeeded_order.pop_front() {
                    self.succeeded.remove(&old);
                }
            }
        }
        self.report_finish(key, result, now, &mut out);
        self.start_ready(&mut out);
        out
    }

    /// A new session begins: queued attempts are dropped (the coordinator places again
    /// whatever this worker does not report running), and the session reports what runs and
    /// re-sends the finishes of the last [`RESEND_MS`].
    pub(crate) fn rejoin(&mut self, now: Millis) -> Rejoin {
        self.forget_old(now);
        Rejoin {
            running: self.running.keys().copied().collect(),
            resend: self
                .recent
                .iter()
                .map(|(_, k, r)| (*k, r.clone()))
                .collect(),
            dropped: self.queue.drain(..).map(|w| w.key).collect(),
        }
    }

    fn report_finish(
        &mut self,
        key: Attempt,
        result: AttemptResult,
        now: Millis,
        out: &mut Vec<Command<P>>,
    ) {
        self.forget_old(now);
        self.recent.push_back((now, key, result.clone()));
        out.push(Command::Report(Report::Finished(key, result)));
    }

    fn forget_old(&mut self, now: Millis) {
        while self
            .recent
            .front()
            .is_some_and(|(t, _, _)| now.saturating_sub(*t) > RESEND_MS)
        {
            self.recent.pop_front();
        }
    }

    /// Removes a queued attempt; whether it was queued.
    fn unqueue(&mut self, key: &Attempt) -> bool {
        match self.queue.iter().position(|w| w.key == *key) {
            Some(pos) => {
                self.queue.remove(pos);
                true
            }
            None => false,
        }
    }

    /// Queues a new assignment, or refuses one that can never run here.
    fn accept(&mut self, work: Work<P>, now: Millis, out: &mut Vec<Command<P>>) {
        if self.running.contains_key(&work.key) || self.queue.iter().any(|w| w.key == work.key) {
            return;
        }
        if self.paused {
            // Sent before the coordinator heard this worker was reclaimed.
            out.push(Command::Report(Report::Returned(work.key)));
            return;
        }
        let offered = || {
            let gpus: Vec<u32> = self.ledger.gpus().iter().map(|g| g.gpu.index).collect();
            format!("this worker offers {} on GPUs {gpus:?}", self.ledger.cap())
        };
        let problem = match self.ledger.positions(&work.gpus, &work.need) {
            Some(on) if self.ledger.fits_total_on(&work.need, &on) => None,
            _ => Some(format!(
                "it needs {} on GPUs {:?} and {}",
                work.need,
                work.gpus,
                offered()
            )),
        };
        match problem {
            None => self.queue.push_back(work),
            Some(why) => {
                let result = AttemptResult {
                    outcome: AttemptOutcome::Failed {
                        message: format!("the worker cannot run this attempt: {why}"),
                        retryable: true,
                    },
                    usage: Usage::default(),
                    outputs: Vec::new(),
                    variant: None,
                };
                self.report_finish(work.key, result, now, out);
            }
        }
    }

    /// Starts every queued attempt that may start and fits, in arrival order.
    fn start_ready(&mut self, out: &mut Vec<Command<P>>) {
        let mut i = 0;
        while i < self.queue.len() {
            let w = &self.queue[i];
            // Cheap refusals first: a chained attempt whose predecessor has not succeeded,
            // one that needs more CPUs than are free.
            if w.after.is_some_and(|a| !self.succeeded.contains(&a))
                || w.need.cpus > self.ledger.free_cpus() + flotilla_core::ledger::EPS
            {
                i += 1;
                continue;
            }
            let gpus = self.ledger.positions(&w.gpus, &w.need);
            let Some(gpus) = gpus.filter(|g| self.ledger.fits_free_on(&w.need, g)) else {
                i += 1;
                continue;
            };
            let Some(work) = self.queue.remove(i) else {
                break;
            };
            let charge = Ledger::charge(&work.need);
            self.ledger.reserve(&charge, &gpus);
            self.running.insert(work.key, Held { charge, gpus });
            out.push(Command::Report(Report::Started(work.key)));
            out.push(Command::Start {
                key: work.key,
                payload: work.payload,
            });
        }
    }
}

/// The attempts a batch of commands starts, in order (for tests and tracing).
#[cfg(test)]
pub(crate) fn started<P>(commands: &[Command<P>]) -> Vec<Attempt> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Start { key, .. } => Some(*key),
            _ => None,
        })
        .collect()
}
