//! A live worker as the coordinator sees it: capacity, reserved and queued slots, GPUs.
//!
//! | slot | counts against capacity | GPUs | becomes |
//! | --- | --- | --- | --- |
//! | queued | no | never | reserved, when resources free up (first fit, in assignment order) or when the worker reports it started and it fits |
//! | reserved | yes | chosen indices | released when the worker reports the attempt ended or returned, or is lost |
//!
//! What counts against capacity is kept in a [`Ledger`] (flotilla-core), the same type the
//! worker agent uses to start only what fits; its module doc has the GPU rules.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::ledger::{GpuShares, Ledger};
use flotilla_core::{Resources, WorkerId};
use flotilla_sched::cluster::Node;

use super::{Millis, TaskRef, WorkerSpec};

/// One attempt on a worker.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    /// What it is charged (GPUs rounded up when whole GPUs are taken).
    pub(crate) res: Resources,
    /// GPU indices (positions in the ledger's GPUs) and the share taken on each.
    pub(crate) gpus: GpuShares,
    /// Counts against capacity.
    pub(crate) reserved: bool,
    /// The worker said it started.
    pub(crate) started: bool,
    /// When the coordinator heard it started (the trace's start of a lost attempt).
    pub(crate) started_at: Option<Millis>,
    /// Assignment order, for promotion.
    pub(crate) seq: u64,
    /// A `Retract` was sent on behalf of this idle worker.
    pub(crate) thief: Option<WorkerId>,
    /// A `Cancel` was sent.
    pub(crate) cancel_sent: bool,
    /// Chained: waits for this attempt of a predecessor to succeed here; not in the queue
    /// (never promoted, never stolen) until then.
    pub(crate) after: Option<(TaskRef, u32)>,
    /// A `Retract` was sent: it would not end before the worker leaves.
    pub(crate) late: bool,
}

/// A live worker.
#[derive(Clone, Debug)]
pub(crate) struct Worker {
    pub(crate) id: WorkerId,
    pub(crate) spec: WorkerSpec,
    /// Capacity and the reserved slots' sum, per GPU too (the same ledger the agent keeps).
    pub(crate) ledger: Ledger,
    /// Attempts on it, by `(task, attempt)`.
    pub(crate) slots: BTreeMap<(TaskRef, u32), Slot>,
    /// Queued (not reserved) slots in assignment order.
    pub(crate) queue: BTreeMap<u64, (TaskRef, u32)>,
    next_seq: u64,
    /// Tasks whose outputs it holds (transfer staging).
    pub(crate) holds: BTreeSet<TaskRef>,
    pub(crate) joined: Millis,
    /// CPU seconds of the attempts it finished.
    pub(crate) busy_cpu_s: f64,
    /// Retractions pending on its behalf.
    pub(crate) incoming: u32,
    /// The id it proved it had before it rejoined: it speaks for that id's attempts and
    /// outputs, and no other worker does.
    pub(crate) previous: Option<WorkerId>,
    /// Reclaimed by its owner (or drained): nothing more is placed here.
    pub(crate) unavailable: bool,
}

impl Worker {
    /// A worker with nothing on it. Refuses negative, NaN or infinite amounts.
    pub(crate) fn new(
        id: WorkerId,
        spec: WorkerSpec,
        now: Millis,
    ) -> std::result::Result<Worker, String> {
        let ledger = spec.ledger().map_err(|e| e.to_string())?;
        Ok(Worker {
            id,
            ledger,
            slots: BTreeMap::new(),
            queue: BTreeMap::new(),
            next_seq: 0,
            holds: BTreeSet::new(),
            joined: now,
            busy_cpu_s: 0.0,
            incoming: 0,
            previous: None,
            unavailable: spec.unavailable,
            spec,
        })
    }

    /// Whether it may report for `owner`'s attempts: it is `owner`, or rejoined as `owner`.
    pub(crate) fn speaks_for(&self, owner: WorkerId) -> bool {
        self.id == owner || self.previous == Some(owner)
    }

    /// Capacity.
    pub(crate) fn cap(&self) -> &Resources {
        self.ledger.cap()
    }

    /// Sum of reserved slots.
    pub(crate) fn used(&self) -> &Resources {
        self.ledger.used()
    }

    /// Whether the worker has no attempt at all.
    pub(crate) fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    /// What a request is charged: whole GPUs rounded up, `gpu_mem` once per index taken.
    pub(crate) fn charge(need: &Resources) -> Resources {
        Ledger::charge(need)
    }

    /// What the worker offers in all.
    pub(crate) fn ledger_cap(&self) -> &flotilla_core::Resources {
        self.ledger.cap()
    }

    /// Whether the request could ever run here (on an empty worker).
    pub(crate) fn fits_total(&self, need: &Resources) -> bool {
        self.ledger.fits_total(need)
    }

    /// Whether the request fits in what is free now; the GPU positions and shares it would
    /// take.
    pub(crate) fn fit_free(&self, need: &Resources) -> Option<GpuShares> {
        self.ledger.fit_free(need)
    }

    /// The worker as placement sees it.
    pub(crate) fn node(&self) -> Node<'_> {
        Node {
            id: self.id,
            hw_class: &self.spec.hw_class,
            ledger: &self.ledger,
            queued: self.queue.len(),
        }
    }

    /// The device indices of GPU positions.
    pub(crate) fn gpu_indices(&self, gpus: &[(usize, f64)]) -> Vec<u32> {
        self.ledger.indices(gpus)
    }

    /// GPU positions for device indices, with the request's share; `None` if one is unknown.
    pub(crate) fn gpu_positions(&self, indices: &[u32], need: &Resources) -> Option<GpuShares> {
        self.ledger.positions(indices, need)
    }

    /// Whether these exact GPU positions (and the scalar resources) are free for `need`.
    pub(crate) fn fits_free_on(&self, need: &Resources, gpus: &[(usize, f64)]) -> bool {
        self.ledger.fits_free_on(need, gpus)
    }

    /// Adds an attempt: reserved with `gpus` when `reserved`, queued otherwise.
    pub(crate) fn add(
        &mut self,
        key: (TaskRef, u32),
        need: &Resources,
        gpus: Vec<(usize, f64)>,
        reserved: bool,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut slot = Slot {
            res: Self::charge(need),
            gpus,
            reserved: false,
            started: false,
            started_at: None,
            seq,
            thief: None,
            cancel_sent: false,
            after: None,
            late: false,
        };
        if reserved {
            self.reserve(&mut slot);
        } else {
            self.queue.insert(seq, key);
        }
        self.slots.insert(key, slot);
    }

    fn reserve(&mut self, slot: &mut Slot) {
        self.ledger.reserve(&slot.res, &slot.gpus);
        slot.reserved = true;
    }

    fn unreserve(&mut self, slot: &Slot) {
        self.ledger.release(&slot.res, &slot.gpus);
    }

    /// Reserves a queued slot that the worker reports started, if it fits. Returns whether
    /// it is (now) reserved.
    pub(crate) fn promote_one(&mut self, key: (TaskRef, u32)) -> bool {
        let Some(slot) = self.slots.get(&key) else {
            return false;
        };
        if slot.reserved {
            return true;
        }
        let res = slot.res.clone();
        let seq = slot.seq;
        if self.fit_free(&res).is_none() {
            return false;
        }
        let mut slot = self.slots.remove(&key).expect("looked up above");
        self.reserve(&mut slot);
        self.queue.remove(&seq);
        self.slots.insert(key, slot);
        true
    }

    /// Removes an attempt, releasing what it reserved, then promotes queued attempts (first
    /// fit, in assignment order).
    pub(crate) fn remove(&mut self, key: (TaskRef, u32)) -> Option<Slot> {
        let slot = self.take(key)?;
        self.promote_queued();
        Some(slot)
    }

    /// Removes an attempt, releasing what it reserved, without promoting: the caller promotes
    /// ([`Worker::promote_queued`]) once the chained attempts this end releases are queued,
    /// so that promotion sees them in assignment order, as the agent does.
    pub(crate) fn take(&mut self, key: (TaskRef, u32)) -> Option<Slot> {
        let slot = self.slots.remove(&key)?;
        if slot.reserved {
            self.unreserve(&slot);
        } else {
            self.queue.remove(&slot.seq);
        }
        Some(slot)
    }

    /// Adds a chained attempt: queued behind `after` (a predecessor's attempt running or
    /// queued here), outside the queue until [`Worker::release_chained`].
    pub(crate) fn add_chained(
        &mut self,
        key: (TaskRef, u32),
        need: &Resources,
        after: (TaskRef, u32),
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = Slot {
            res: Self::charge(need),
            gpus: Vec::new(),
            reserved: false,
            started: false,
            started_at: None,
            seq,
            thief: None,
            cancel_sent: false,
            after: Some(after),
            late: false,
        };
        self.slots.insert(key, slot);
    }

    /// Chained attempts waiting for `pred`.
    pub(crate) fn chained_on(&self, pred: (TaskRef, u32)) -> Vec<(TaskRef, u32)> {
        self.slots
            .iter()
            .filter(|(_, s)| s.after == Some(pred))
            .map(|(k, _)| *k)
            .collect()
    }

    /// How many chained attempts wait here.
    pub(crate) fn chained(&self) -> usize {
        self.slots.values().filter(|s| s.after.is_some()).count()
    }

    /// `pred` succeeded: its chained attempts join the queue (in the order they were
    /// assigned); whether there were any. The caller promotes ([`Worker::promote_queued`]).
    pub(crate) fn release_chained(&mut self, pred: (TaskRef, u32)) -> bool {
        let keys = self.chained_on(pred);
        let released = !keys.is_empty();
        for k in keys {
            if let Some(s) = self.slots.get_mut(&k) {
                s.after = None;
                let seq = s.seq;
                self.queue.insert(seq, k);
            }
        }
        released
    }

    /// Reserves queued attempts that fit, first fit in assignment order.
    pub(crate) fn promote_queued(&mut self) {
        let keys: Vec<(TaskRef, u32)> = self.queue.values().copied().collect();
        for key in keys {
            self.promote_one(key);
        }
    }

    /// CPU utilization since it joined: busy CPU seconds over `cpus × uptime`.
    pub(crate) fn utilization(&self, now: Millis) -> f64 {
        let uptime = now.saturating_sub(self.joined) as f64 / 1000.0;
        if uptime <= 0.0 || self.cap().cpus <= 0.0 {
            0.0
        } else {
            (self.busy_cpu_s / (self.cap().cpus * uptime)).clamp(0.0, 1.0)
        }
    }
}
