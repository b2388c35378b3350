//! The live workers, with indexes kept as they change, so that what the coordinator asks of
//! them on every event costs O(log workers) instead of a walk over all of them: where a
//! plain task fits (most free CPUs first, shortest queue first), whether anything is free at
//! all, the cluster's capacity, the idle workers, the workers with room and the longest
//! queues (work stealing).
//!
//! Reads go through `Deref` to the map. Every way to change a worker (`get_mut`, `insert`,
//! `remove`) marks it, and [`Workers::refresh`] indexes the marked ones again; a reader of
//! an index calls it first (it costs O(changed × log workers)). Index entries compare
//! exactly what the walk compared: free CPUs as an `f64` (its bits, which order as the
//! numbers do for non-negative values), queue lengths, ids.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Deref;

use flotilla_core::WorkerId;

use super::worker::Worker;

/// What a worker is indexed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    /// Placement may use it.
    available: bool,
    /// Free CPUs, `f64` bits (never negative).
    free: u64,
    /// It has GPUs.
    gpus: bool,
    /// Attempts queued beyond its free resources.
    queued: usize,
    /// Nothing assigned or running, no retraction pending on its behalf.
    idle: bool,
    /// Queued attempts an idle worker may take (not started, no cancel or retraction sent).
    stealable: usize,
    /// Busy in part, with CPUs free, nothing queued and nothing incoming: it may take
    /// queued attempts that fit its free resources now.
    room: bool,
}

impl Key {
    fn of(w: &Worker) -> Key {
        // Never negative, and never -0.0 (whose bits would sort before every other amount).
        let d = w.cap().cpus - w.used().cpus;
        let free = if d > 0.0 { d } else { 0.0 };
        let idle = w.is_idle() && w.incoming == 0;
        Key {
            available: !w.unavailable,
            free: free.to_bits(),
            gpus: w.cap().gpus > 0.0,
            queued: w.queue.len(),
            idle,
            stealable: w
                .queue
                .values()
                .filter(|k| {
                    w.slots
                        .get(k)
                        .is_some_and(|s| s.thief.is_none() && !s.cancel_sent && !s.started)
                })
                .count(),
            room: !w.is_idle() && w.incoming == 0 && w.queue.is_empty() && free > 1e-6,
        }
    }
}

/// The live workers and their indexes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Workers {
    map: BTreeMap<WorkerId, Worker>,
    /// Changed since the last [`Workers::refresh`].
    dirty: BTreeSet<WorkerId>,
    /// What each worker is indexed by now.
    keys: HashMap<WorkerId, Key>,
    /// Available workers, most free CPUs first, then lowest id.
    by_free: BTreeSet<(Reverse<u64>, WorkerId)>,
    /// The same, only workers with GPUs.
    gpu_by_free: BTreeSet<(Reverse<u64>, WorkerId)>,
    /// Available workers, shortest queue first, then lowest id.
    by_queue: BTreeSet<(usize, WorkerId)>,
    /// Every worker with a queue, longest first, then lowest id.
    queues: BTreeSet<(Reverse<usize>, WorkerId)>,
    /// Every worker with stealable attempts, most first, then lowest id, and their sum.
    stealable: BTreeSet<(Reverse<usize>, WorkerId)>,
    stealable_total: usize,
    /// Available idle workers.
    idle: BTreeSet<WorkerId>,
    /// Available workers with room ([`Key::room`]), most free CPUs first, then lowest id.
    roomy: BTreeSet<(Reverse<u64>, WorkerId)>,
    /// Every worker's capacity summed: CPUs, GPUs.
    total: (f64, f64),
}

impl Deref for Workers {
    type Target = BTreeMap<WorkerId, Worker>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Workers {
    /// Worker `id`, to change it (marked for [`Workers::refresh`]).
    pub(crate) fn get_mut(&mut self, id: &WorkerId) -> Option<&mut Worker> {
        let w = self.map.get_mut(id)?;
        self.dirty.insert(*id);
        Some(w)
    }

    /// Adds (or replaces) a worker.
    pub(crate) fn insert(&mut self, id: WorkerId, w: Worker) -> Option<Worker> {
        self.total.0 += w.cap().cpus;
        self.total.1 += w.cap().gpus;
        self.dirty.insert(id);
        let old = self.map.insert(id, w);
        if let Some(o) = &old {
            self.total.0 -= o.cap().cpus;
            self.total.1 -= o.cap().gpus;
        }
        old
    }

    /// Removes a worker and its index entries.
    pub(crate) fn remove(&mut self, id: &WorkerId) -> Option<Worker> {
        let w = self.map.remove(id)?;
        self.dirty.remove(id);
        if let Some(k) = self.keys.remove(id) {
            self.unindex(*id, k);
        }
        self.total.0 -= w.cap().cpus;
        self.total.1 -= w.cap().gpus;
        if self.map.is_empty() {
            self.total = (0.0, 0.0); // no rounding residue
        }
        Some(w)
    }

    /// Indexes again the workers changed since the last call.
    pub(crate) fn refresh(&mut self) {
        while let Some(id) = self.dirty.pop_first() {
            let Some(w) = self.map.get(&id) else {
                continue;
            };
            let key = Key::of(w);
            match self.keys.insert(id, key) {
                Some(old) if old == key => {}
                Some(old) => {
                    self.unindex(id, old);
                    self.index(id, key);
                }
                None => self.index(id, key),
            }
        }
    }

    fn index(&mut self, id: WorkerId, k: Key) {
        if k.queued > 0 {
            self.queues.insert((Reverse(k.queued), id));
        }
        if k.stealable > 0 {
            self.stealable.insert((Reverse(k.stealable), id));
            self.stealable_total += k.stealable;
        }
        if !k.available {
            return;
        }
        self.by_free.insert((Reverse(k.free), id));
        if k.gpus {
            self.gpu_by_free.insert((Reverse(k.free), id));
        }
        self.by_queue.insert((k.queued, id));
        if k.idle {
            self.idle.insert(id);
        }
        if k.room {
            self.roomy.insert((Reverse(k.free), id));
        }
    }

    fn unindex(&mut self, id: WorkerId, k: Key) {
        self.queues.remove(&(Reverse(k.queued), id));
        if self.stealable.remove(&(Reverse(k.stealable), id)) {
            self.stealable_total -= k.stealable;
        }
        self.by_free.remove(&(Reverse(k.free), id));
        self.gpu_by_free.remove(&(Reverse(k.free), id));
        self.by_queue.remove(&(k.queued, id));
        self.idle.remove(&id);
        self.roomy.remove(&(Reverse(k.free), id));
    }

    /// Every worker's capacity summed: (CPUs, GPUs).
    pub(crate) fn total(&self) -> (f64, f64) {
        self.total
    }

    fn fresh(&self) {
        debug_assert!(self.dirty.is_empty(), "read before refresh");
    }

    /// Available workers, most free CPUs first, then lowest id (with `gpus`, only those
    /// that have GPUs). Call [`Workers::refresh`] first.
    pub(crate) fn by_free(&self, gpus: bool) -> impl Iterator<Item = &Worker> + '_ {
        self.fresh();
        let set = if gpus {
            &self.gpu_by_free
        } else {
            &self.by_free
        };
        set.iter().map(|(_, id)| &self.map[id])
    }

    /// Available workers, shortest queue first, then lowest id. Call
    /// [`Workers::refresh`] first.
    pub(crate) fn by_queue(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.fresh();
        self.by_queue.iter().map(|(_, id)| &self.map[id])
    }

    /// Workers with a queue, longest first, then lowest id. Call [`Workers::refresh`]
    /// first.
    pub(crate) fn longest_queues(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.fresh();
        self.queues.iter().map(|(_, id)| &self.map[id])
    }

    /// Workers with stealable attempts (queued, not started, nothing sent about them),
    /// most first, then lowest id; and how many there are in all. Call
    /// [`Workers::refresh`] first.
    pub(crate) fn most_stealable(&self) -> (impl Iterator<Item = (usize, &Worker)> + '_, usize) {
        self.fresh();
        let it = self
            .stealable
            .iter()
            .map(|(Reverse(n), id)| (*n, &self.map[id]));
        (it, self.stealable_total)
    }

    /// Available workers with nothing assigned, running or incoming, by id. Call
    /// [`Workers::refresh`] first.
    pub(crate) fn idle(&self) -> Vec<WorkerId> {
        self.fresh();
        self.idle.iter().copied().collect()
    }

    /// Available workers busy in part, with CPUs free, nothing queued and nothing incoming:
    /// most free CPUs first, then lowest id. Call [`Workers::refresh`] first.
    /// At most `limit` of them: a pass needs no more than can take or fail.
    pub(crate) fn with_room(&self, limit: usize) -> Vec<WorkerId> {
        self.fresh();
        self.roomy.iter().take(limit).map(|(_, id)| *id).collect()
    }

    /// Whether every available worker's CPUs are taken (within `slack`) and its queue
    /// holds `depth` attempts or more. Call [`Workers::refresh`] first.
    pub(crate) fn all_full(&self, depth: usize, slack: f64) -> bool {
        self.fresh();
        let cpus_taken = self
            .by_free
            .first()
            .is_none_or(|(Reverse(f), _)| f64::from_bits(*f) < slack);
        let queues_full = self.by_queue.first().is_none_or(|(q, _)| *q >= depth);
        cpus_taken && queues_full
    }

    /// Checks every index against a walk over the workers (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut again = Workers::default();
        for (id, w) in &self.map {
            again.insert(*id, w.clone());
        }
        again.refresh();
        let same = self.by_free == again.by_free
            && self.gpu_by_free == again.gpu_by_free
            && self.by_queue == again.by_queue
            && self.queues == again.queues
            && self.stealable == again.stealable
            && self.stealable_total == again.stealable_total
            && self.idle == again.idle
            && self.roomy == again.roomy
            && (self.total.0 - again.total.0).abs() < 1e-6
            && (self.total.1 - again.total.1).abs() < 1e-6;
        if same {
            Ok(())
        } else {
            Err(format!(
                "stale index: by_free {:?} vs {:?}, by_queue {:?} vs {:?}, queues {:?} vs {:?}, \
                 idle {:?} vs {:?}, roomy {:?} vs {:?}",
                self.by_free,
                again.by_free,
                self.by_queue,
                again.by_queue,
                self.queues,
                again.queues,
                self.idle,
                again.idle,
                self.roomy,
                again.roomy
            ))
        }
    }
}
