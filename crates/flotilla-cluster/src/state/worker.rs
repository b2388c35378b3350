//! A live worker as the coordinator sees it: capacity, reserved and queued slots, GPUs.
//!
//! | slot | counts against capacity | GPUs | becomes |
//! | --- | --- | --- | --- |
//! | queued | no | never | reserved, when resources free up (first fit, in assignment order) or when the worker reports it started and it fits |
//! | reserved | yes | chosen indices | released when the worker reports the attempt ended or returned, or is lost |
//!
//! GPU accounting is per index: a task with `gpus < 1` takes that share of one index (packed
//! onto the fullest index where it fits); a task with `gpus >= 1` takes `ceil(gpus)` whole
//! free indices and is charged that many. `gpu_mem` is needed on every index taken, and must
//! fit in the index's memory minus what other tasks there reserved.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::{Resources, WorkerId};

use super::{GpuInfo, Millis, TaskRef, WorkerSpec};

/// Slack for floating-point sums of fractional resources.
pub(crate) const EPS: f64 = 1e-9;

/// One GPU and what is reserved on it.
#[derive(Clone, Debug)]
pub(crate) struct GpuSlot {
    pub(crate) info: GpuInfo,
    /// Share reserved, 0..=1.
    pub(crate) share: f64,
    /// Memory reserved, bytes.
    pub(crate) mem_used: u64,
}

/// One attempt on a worker.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    /// What it is charged (GPUs rounded up when whole GPUs are taken).
    pub(crate) res: Resources,
    /// GPU indices (positions in [`Worker::gpus`]) and the share taken on each.
    pub(crate) gpus: Vec<(usize, f64)>,
    /// Counts against capacity.
    pub(crate) reserved: bool,
    /// The worker said it started.
    pub(crate) started: bool,
    /// Assignment order, for promotion.
    pub(crate) seq: u64,
    /// A `Retract` was sent on behalf of this idle worker.
    pub(crate) thief: Option<WorkerId>,
    /// A `Cancel` was sent.
    pub(crate) cancel_sent: bool,
    /// Chained: waits for this attempt of a predecessor to succeed here; not in the queue
    /// (never promoted, never stolen) until then.
    pub(crate) after: Option<(TaskRef, u32)>,
}

/// A live worker.
#[derive(Clone, Debug)]
pub(crate) struct Worker {
    pub(crate) id: WorkerId,
    pub(crate) spec: WorkerSpec,
    /// Capacity, `gpus` and `gpu_mem` from the GPU list.
    pub(crate) cap: Resources,
    /// Sum of reserved slots.
    pub(crate) used: Resources,
    pub(crate) gpus: Vec<GpuSlot>,
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
}

/// How many whole GPUs a request takes, or `None` for a share of one.
fn whole_gpus(gpus: f64) -> Option<usize> {
    (gpus >= 1.0).then(|| gpus.ceil() as usize)
}

impl Worker {
    /// A worker with nothing on it. Refuses negative, NaN or infinite amounts.
    pub(crate) fn new(
        id: WorkerId,
        spec: WorkerSpec,
        now: Millis,
    ) -> std::result::Result<Worker, String> {
        if let Some((name, v)) = spec.resources.first_bad_amount() {
            return Err(format!(
                "resource {name} = {v} is not a non-negative number"
            ));
        }
        let mut cap = spec.resources.clone();
        let gpus: Vec<GpuInfo> = if spec.gpus.is_empty() {
            // No GPU list: synthesize whole GPUs sharing the declared GPU memory evenly.
            let n = spec.resources.gpus.floor() as u32;
            (0..n)
                .map(|index| GpuInfo {
                    index,
                    model: String::new(),
                    mem_bytes: spec.resources.gpu_mem / u64::from(n.max(1)),
                })
                .collect()
        } else {
            spec.gpus.clone()
        };
        let mut seen = BTreeSet::new();
        for g in &gpus {
            if !seen.insert(g.index) {
                return Err(format!("GPU index {} is listed twice", g.index));
            }
        }
        if !gpus.is_empty() || spec.resources.gpus > 0.0 {
            cap.gpus = gpus.len() as f64;
            cap.gpu_mem = gpus.iter().map(|g| g.mem_bytes).sum();
        }
        Ok(Worker {
            id,
            spec,
            cap,
            used: Resources::zero(),
            gpus: gpus
                .into_iter()
                .map(|info| GpuSlot {
                    info,
                    share: 0.0,
                    mem_used: 0,
                })
                .collect(),
            slots: BTreeMap::new(),
            queue: BTreeMap::new(),
            next_seq: 0,
            holds: BTreeSet::new(),
            joined: now,
            busy_cpu_s: 0.0,
            incoming: 0,
        })
    }

    /// Free CPUs.
    pub(crate) fn free_cpus(&self) -> f64 {
        self.cap.cpus - self.used.cpus
    }

    /// Whether the worker has no attempt at all.
    pub(crate) fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    /// What a request is charged: whole GPUs rounded up, `gpu_mem` once per index taken.
    pub(crate) fn charge(need: &Resources) -> Resources {
        let mut r = need.clone();
        if let Some(n) = whole_gpus(need.gpus) {
            r.gpus = n as f64;
            r.gpu_mem = need.gpu_mem.saturating_mul(n as u64);
        }
        r
    }

    /// Whether the request could ever run here (on an empty worker).
    pub(crate) fn fits_total(&self, need: &Resources) -> bool {
        if need.first_bad_amount().is_some() {
            return false;
        }
        let c = Self::charge(need);
        let scalar = c.cpus <= self.cap.cpus + EPS
            && c.mem <= self.cap.mem
            && c.custom
                .iter()
                .all(|(k, &v)| v <= self.cap.custom.get(k).copied().unwrap_or(0.0) + EPS);
        if !scalar {
            return false;
        }
        if need.gpus <= 0.0 {
            return need.gpu_mem == 0 || need.gpu_mem <= self.cap.gpu_mem;
        }
        let big_enough = self
            .gpus
            .iter()
            .filter(|g| g.info.mem_bytes >= need.gpu_mem)
            .count();
        match whole_gpus(need.gpus) {
            Some(n) => big_enough >= n,
            None => big_enough >= 1,
        }
    }

    /// Whether the request fits in what is free now; the GPU indices (positions in
    /// [`Worker::gpus`]) and shares it would take.
    pub(crate) fn fit_free(&self, need: &Resources) -> Option<Vec<(usize, f64)>> {
        if need.first_bad_amount().is_some() {
            return None;
        }
        let c = Self::charge(need);
        let scalar = self.used.cpus + c.cpus <= self.cap.cpus + EPS
            && self.used.mem.saturating_add(c.mem) <= self.cap.mem
            && c.custom.iter().all(|(k, &v)| {
                let used = self.used.custom.get(k).copied().unwrap_or(0.0);
                used + v <= self.cap.custom.get(k).copied().unwrap_or(0.0) + EPS
            });
        if !scalar {
            return None;
        }
        if need.gpus <= 0.0 {
            let fits = need.gpu_mem == 0
                || self.used.gpu_mem.saturating_add(need.gpu_mem) <= self.cap.gpu_mem;
            return fits.then(Vec::new);
        }
        let mem_free = |g: &GpuSlot| g.info.mem_bytes.saturating_sub(g.mem_used);
        match whole_gpus(need.gpus) {
            Some(n) => {
                let picked: Vec<(usize, f64)> = self
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| g.share <= EPS && mem_free(g) >= need.gpu_mem)
                    .take(n)
                    .map(|(i, _)| (i, 1.0))
                    .collect();
                (picked.len() == n).then_some(picked)
            }
            None => {
                // Pack: the fullest index where the share and the memory fit.
                let mut best: Option<usize> = None;
                for (i, g) in self.gpus.iter().enumerate() {
                    if g.share + need.gpus <= 1.0 + EPS
                        && mem_free(g) >= need.gpu_mem
                        && best.is_none_or(|b| g.share > self.gpus[b].share + EPS)
                    {
                        best = Some(i);
                    }
                }
                best.map(|i| vec![(i, need.gpus)])
            }
        }
    }

    /// Whether the request may be queued here beyond the free resources.
    pub(crate) fn can_queue(&self, need: &Resources, depth: usize) -> bool {
        need.gpus <= 0.0 && need.gpu_mem == 0 && self.queue.len() < depth && self.fits_total(need)
    }

    /// The device indices of GPU positions.
    pub(crate) fn gpu_indices(&self, gpus: &[(usize, f64)]) -> Vec<u32> {
        gpus.iter().map(|(i, _)| self.gpus[*i].info.index).collect()
    }

    /// GPU positions for device indices, with the request's share; `None` if one is unknown.
    pub(crate) fn gpu_positions(
        &self,
        indices: &[u32],
        need: &Resources,
    ) -> Option<Vec<(usize, f64)>> {
        let share = if need.gpus >= 1.0 { 1.0 } else { need.gpus };
        indices
            .iter()
            .map(|ix| {
                self.gpus
                    .iter()
                    .position(|g| g.info.index == *ix)
                    .map(|p| (p, share))
            })
            .collect()
    }

    /// Whether these exact GPU positions (and the scalar resources) are free for `need`.
    pub(crate) fn fits_free_on(&self, need: &Resources, gpus: &[(usize, f64)]) -> bool {
        let mut probe = need.clone();
        probe.gpus = 0.0;
        probe.gpu_mem = 0;
        if self.fit_free(&probe).is_none() {
            return false;
        }
        let expected = match whole_gpus(need.gpus) {
            Some(n) => n,
            None if need.gpus > 0.0 => 1,
            None => 0,
        };
        gpus.len() == expected
            && gpus.iter().all(|(i, share)| {
                let g = &self.gpus[*i];
                g.share + share <= 1.0 + EPS
                    && g.info.mem_bytes.saturating_sub(g.mem_used) >= need.gpu_mem
            })
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
            seq,
            thief: None,
            cancel_sent: false,
            after: None,
        };
        if reserved {
            self.reserve(&mut slot);
        } else {
            self.queue.insert(seq, key);
        }
        self.slots.insert(key, slot);
    }

    fn reserve(&mut self, slot: &mut Slot) {
        let r = &slot.res;
        self.used.cpus += r.cpus;
        self.used.gpus += r.gpus;
        self.used.mem = self.used.mem.saturating_add(r.mem);
        self.used.gpu_mem = self.used.gpu_mem.saturating_add(r.gpu_mem);
        for (k, v) in &r.custom {
            *self.used.custom.entry(k.clone()).or_insert(0.0) += v;
        }
        let per_gpu_mem = if slot.gpus.is_empty() {
            0
        } else {
            r.gpu_mem / slot.gpus.len() as u64
        };
        for (i, share) in &slot.gpus {
            let g = &mut self.gpus[*i];
            g.share += share;
            g.mem_used = g.mem_used.saturating_add(per_gpu_mem);
        }
        slot.reserved = true;
    }

    fn unreserve(&mut self, slot: &Slot) {
        let r = &slot.res;
        self.used.cpus -= r.cpus;
        self.used.gpus -= r.gpus;
        self.used.mem = self.used.mem.saturating_sub(r.mem);
        self.used.gpu_mem = self.used.gpu_mem.saturating_sub(r.gpu_mem);
        for (k, v) in &r.custom {
            if let Some(u) = self.used.custom.get_mut(k) {
                *u -= v;
            }
        }
        let per_gpu_mem = if slot.gpus.is_empty() {
            0
        } else {
            r.gpu_mem / slot.gpus.len() as u64
        };
        for (i, share) in &slot.gpus {
            let g = &mut self.gpus[*i];
            g.share = (g.share - share).max(0.0);
            g.mem_used = g.mem_used.saturating_sub(per_gpu_mem);
        }
        if !self.slots.values().any(|s| s.reserved) {
            // Nothing reserved: clear rounding residue.
            self.used = Resources::zero();
            for g in &mut self.gpus {
                g.share = 0.0;
                g.mem_used = 0;
            }
        }
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
        let slot = self.slots.remove(&key)?;
        if slot.reserved {
            self.unreserve(&slot);
            self.promote_queued();
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
            seq,
            thief: None,
            cancel_sent: false,
            after: Some(after),
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
    /// assigned) and are promoted where they fit.
    pub(crate) fn release_chained(&mut self, pred: (TaskRef, u32)) {
        let keys = self.chained_on(pred);
        for k in keys {
            if let Some(s) = self.slots.get_mut(&k) {
                s.after = None;
                let seq = s.seq;
                self.queue.insert(seq, k);
            }
        }
        self.promote_queued();
    }

    /// Removes a trial reservation (placing a gang), without promoting queued attempts: the
    /// state is as before the trial.
    pub(crate) fn remove_trial(&mut self, key: (TaskRef, u32)) {
        if let Some(slot) = self.slots.remove(&key) {
            if slot.reserved {
                self.unreserve(&slot);
            } else {
                self.queue.remove(&slot.seq);
            }
        }
    }

    fn promote_queued(&mut self) {
        let keys: Vec<(TaskRef, u32)> = self.queue.values().copied().collect();
        for key in keys {
            self.promote_one(key);
        }
    }

    /// CPU utilization since it joined: busy CPU seconds over `cpus × uptime`.
    pub(crate) fn utilization(&self, now: Millis) -> f64 {
        let uptime = now.saturating_sub(self.joined) as f64 / 1000.0;
        if uptime <= 0.0 || self.cap.cpus <= 0.0 {
            0.0
        } else {
            (self.busy_cpu_s / (self.cap.cpus * uptime)).clamp(0.0, 1.0)
        }
    }
}
