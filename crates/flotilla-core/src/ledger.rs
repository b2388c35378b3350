//! The resource ledger of one worker: what it offers, what is reserved on it, and on which
//! GPU. The coordinator keeps one per live worker to place tasks; the worker agent keeps one
//! of its own to start only what fits. Both are this type, so "a worker never runs more than
//! it has" rests on one implementation.
//!
//! # GPUs
//! Accounting is per GPU (by position in [`Ledger::gpus`]). A request with `gpus < 1` takes
//! that share of one GPU (the coordinator packs it onto the fullest GPU where it fits); a
//! request with `gpus >= 1` takes `ceil(gpus)` whole free GPUs and is charged that many.
//! `gpu_mem` is needed on every GPU taken, and must fit in that GPU's memory minus what
//! other reservations there hold. Every request's `gpu_mem` also counts against the worker's
//! GPU memory in all (so one with no GPUs but some `gpu_mem`, which may use no GPU, still
//! never leaves the total over-committed).
//!
//! ```
//! use flotilla_core::ledger::{Ledger, LedgerGpu};
//! use flotilla_core::Resources;
//!
//! let mut cap = Resources::zero();
//! cap.cpus = 4.0;
//! let gpus = vec![LedgerGpu { index: 0, mem_bytes: 16 << 30 }];
//! let mut ledger = Ledger::new(cap, &gpus).unwrap();
//!
//! let mut need = Resources::default(); // one CPU
//! need.gpus = 0.5;
//! let on = ledger.fit_free(&need).expect("fits on an empty worker");
//! assert_eq!(on, vec![(0, 0.5)]);
//! let charged = Ledger::charge(&need);
//! ledger.reserve(&charged, &on);
//! ledger.reserve(&charged, &ledger.fit_free(&need).unwrap());
//! assert!(ledger.fit_free(&need).is_none(), "the GPU is fully shared");
//! ledger.release(&charged, &on);
//! assert!(ledger.fit_free(&need).is_some());
//! ```

use std::collections::BTreeSet;

use crate::resources::Resources;

/// Slack for floating-point sums of fractional resources.
pub const EPS: f64 = 1e-9;

/// The most GPUs one worker may offer (a ledger keeps one entry per GPU, so an absurd count
/// in a registration must not become an absurd allocation).
pub const MAX_GPUS: usize = 1024;

/// The most CPUs one worker may offer.
pub const MAX_CPUS: f64 = 1_048_576.0;

/// The most custom resources one worker may offer.
pub const MAX_CUSTOM: usize = 256;

/// A GPU as a worker offers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerGpu {
    /// Its device index (what `CUDA_VISIBLE_DEVICES` names).
    pub index: u32,
    /// Its memory in bytes.
    pub mem_bytes: u64,
}

/// One GPU and what is reserved on it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuUse {
    /// The GPU.
    pub gpu: LedgerGpu,
    /// Share reserved, 0..=1.
    pub share: f64,
    /// Memory reserved, bytes.
    pub mem_used: u64,
}

impl GpuUse {
    fn mem_free(&self) -> u64 {
        self.gpu.mem_bytes.saturating_sub(self.mem_used)
    }
}

/// Why a ledger cannot be made from an offer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LedgerError {
    /// An amount is negative, NaN or infinite.
    #[error("resource {name} = {amount} is not a non-negative number")]
    BadAmount {
        /// The resource.
        name: String,
        /// Its amount.
        amount: f64,
    },
    /// A GPU index appears twice.
    #[error("GPU index {0} is listed twice")]
    DuplicateGpu(u32),
    /// More of something than any one machine has.
    #[error("{what} = {amount} is more than one worker may offer (at most {max})")]
    TooMany {
        /// What.
        what: &'static str,
        /// How many were offered.
        amount: f64,
        /// The most allowed.
        max: f64,
    },
}

/// GPU positions (in [`Ledger::gpus`]) and the share taken on each.
pub type GpuShares = Vec<(usize, f64)>;

/// A worker's capacity and what is reserved on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Ledger {
    /// Capacity; `gpus` and `gpu_mem` from the GPU list.
    cap: Resources,
    /// Sum of the reservations.
    used: Resources,
    gpus: Vec<GpuUse>,
    /// How many reservations are held (at zero, rounding residue is cleared).
    held: usize,
}

/// How many whole GPUs a request takes, or `None` for a share of one.
fn whole_gpus(gpus: f64) -> Option<usize> {
    (gpus >= 1.0).then(|| gpus.ceil() as usize)
}

impl Ledger {
    /// A ledger with nothing reserved. `gpus` lists the GPUs offered; when it is empty and
    /// `cap.gpus` is at least one, `floor(cap.gpus)` GPUs are made up, indexed from 0, sharing
    /// `cap.gpu_mem` evenly. Refuses negative, NaN or infinite amounts and repeated indices.
    pub fn new(cap: Resources, gpus: &[LedgerGpu]) -> Result<Ledger, LedgerError> {
        if let Some((name, amount)) = cap.first_bad_amount() {
            return Err(LedgerError::BadAmount { name, amount });
        }
        let too_many = |what, amount: f64, max: f64| {
            (amount > max).then_some(LedgerError::TooMany { what, amount, max })
        };
        if let Some(e) = too_many("gpus", cap.gpus, MAX_GPUS as f64)
            .or_else(|| too_many("gpus listed", gpus.len() as f64, MAX_GPUS as f64))
            .or_else(|| too_many("cpus", cap.cpus, MAX_CPUS))
            .or_else(|| {
                too_many(
                    "custom resources",
                    cap.custom.len() as f64,
                    MAX_CUSTOM as f64,
                )
            })
        {
            return Err(e);
        }
        let mut cap = cap;
        let gpus: Vec<LedgerGpu> = if gpus.is_empty() {
            let n = cap.gpus.floor() as u32;
            (0..n)
                .map(|index| LedgerGpu {
                    index,
                    mem_bytes: cap.gpu_mem / u64::from(n.max(1)),
                })
                .collect()
        } else {
            gpus.to_vec()
        };
        let mut seen = BTreeSet::new();
        for g in &gpus {
            if !seen.insert(g.index) {
                return Err(LedgerError::DuplicateGpu(g.index));
            }
        }
        if !gpus.is_empty() || cap.gpus > 0.0 {
            cap.gpus = gpus.len() as f64;
            cap.gpu_mem = gpus.iter().map(|g| g.mem_bytes).sum();
        }
        Ok(Ledger {
            cap,
            used: Resources::zero(),
            gpus: gpus
                .into_iter()
                .map(|gpu| GpuUse {
                    gpu,
                    share: 0.0,
                    mem_used: 0,
                })
                .collect(),
            held: 0,
        })
    }

    /// The capacity.
    pub fn cap(&self) -> &Resources {
        &self.cap
    }

    /// What is reserved, summed.
    pub fn used(&self) -> &Resources {
        &self.used
    }

    /// The GPUs and what is reserved on each.
    pub fn gpus(&self) -> &[GpuUse] {
        &self.gpus
    }

    /// How many reservations are held.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Free CPUs.
    pub fn free_cpus(&self) -> f64 {
        self.cap.cpus - self.used.cpus
    }

    /// The GPUs a request for `gpus` is charged: whole GPUs rounded up, a share as it is
    /// (what [`Ledger::charge`] gives, without building the whole amount).
    pub fn charged_gpus(gpus: f64) -> f64 {
        whole_gpus(gpus).map_or(gpus, |n| n as f64)
    }

    /// What a request is charged: whole GPUs rounded up, `gpu_mem` once per GPU taken.
    pub fn charge(need: &Resources) -> Resources {
        let mut r = need.clone();
        if let Some(n) = whole_gpus(need.gpus) {
            r.gpus = n as f64;
            r.gpu_mem = need.gpu_mem.saturating_mul(n as u64);
        }
        r
    }

    /// Whether the totals (cpus, mem, custom, GPU memory in all) of `need`'s charge fit
    /// beside `used`.
    fn scalars_fit(&self, need: &Resources, used: &Resources) -> bool {
        let c = Self::charge(need);
        used.cpus + c.cpus <= self.cap.cpus + EPS
            && used.mem.saturating_add(c.mem) <= self.cap.mem
            && used.gpu_mem.saturating_add(c.gpu_mem) <= self.cap.gpu_mem
            && c.custom.iter().all(|(k, &v)| {
                let u = used.custom.get(k).copied().unwrap_or(0.0);
                u + v <= self.cap.custom.get(k).copied().unwrap_or(0.0) + EPS
            })
    }

    /// Whether the request could ever run here (with nothing reserved).
    pub fn fits_total(&self, need: &Resources) -> bool {
        if need.first_bad_amount().is_some() || !self.scalars_fit(need, &Resources::zero()) {
            return false;
        }
        if need.gpus <= 0.0 {
            return true;
        }
        let big_enough = self
            .gpus
            .iter()
            .filter(|g| g.gpu.mem_bytes >= need.gpu_mem)
            .count();
        big_enough >= whole_gpus(need.gpus).unwrap_or(1)
    }

    /// Whether the request could ever run here on exactly these GPUs (with nothing
    /// reserved): as many as it takes, each with memory enough.
    pub fn fits_total_on(&self, need: &Resources, gpus: &[(usize, f64)]) -> bool {
        if need.gpus <= 0.0 {
            return gpus.is_empty() && self.fits_total(need);
        }
        need.first_bad_amount().is_none()
            && self.scalars_fit(need, &Resources::zero())
            && gpus.len() == Self::gpus_taken(need)
            && gpus.iter().all(|(i, _)| {
                self.gpus
                    .get(*i)
                    .is_some_and(|g| g.gpu.mem_bytes >= need.gpu_mem)
            })
    }

    /// Whether the request fits in what is free now, and the GPUs it would take: the first
    /// free whole GPUs, or for a share the fullest GPU where it fits.
    pub fn fit_free(&self, need: &Resources) -> Option<GpuShares> {
        if need.first_bad_amount().is_some() || !self.scalars_fit(need, &self.used) {
            return None;
        }
        if need.gpus <= 0.0 {
            return Some(Vec::new());
        }
        match whole_gpus(need.gpus) {
            Some(n) => {
                let picked: GpuShares = self
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| g.share <= EPS && g.mem_free() >= need.gpu_mem)
                    .take(n)
                    .map(|(i, _)| (i, 1.0))
                    .collect();
                (picked.len() == n).then_some(picked)
            }
            None => {
                let mut best: Option<usize> = None;
                for (i, g) in self.gpus.iter().enumerate() {
                    if g.share + need.gpus <= 1.0 + EPS
                        && g.mem_free() >= need.gpu_mem
                        && best.is_none_or(|b| g.share > self.gpus[b].share + EPS)
                    {
                        best = Some(i);
                    }
                }
                best.map(|i| vec![(i, need.gpus)])
            }
        }
    }

    /// GPU positions for device indices, each with the request's share; `None` if an index
    /// is not one of this worker's or is named twice.
    pub fn positions(&self, indices: &[u32], need: &Resources) -> Option<GpuShares> {
        if indices.is_empty() {
            return Some(Vec::new());
        }
        let share = if need.gpus >= 1.0 { 1.0 } else { need.gpus };
        let mut seen = BTreeSet::new();
        indices
            .iter()
            .map(|ix| {
                if !seen.insert(*ix) {
                    return None;
                }
                self.gpus
                    .iter()
                    .position(|g| g.gpu.index == *ix)
                    .map(|p| (p, share))
            })
            .collect()
    }

    /// How many GPUs a request takes: `ceil(gpus)` whole ones, one for a share, or none.
    pub fn gpus_taken(need: &Resources) -> usize {
        match whole_gpus(need.gpus) {
            Some(n) => n,
            None if need.gpus > 0.0 => 1,
            None => 0,
        }
    }

    /// Whether `need` fits in what is free now on exactly these GPUs (as the coordinator
    /// chose them): as many GPUs as the request takes, each with its share and `gpu_mem` free.
    pub fn fits_free_on(&self, need: &Resources, gpus: &[(usize, f64)]) -> bool {
        if need.gpus <= 0.0 {
            return gpus.is_empty() && self.fit_free(need).is_some();
        }
        if need.first_bad_amount().is_some() || !self.scalars_fit(need, &self.used) {
            return false;
        }
        gpus.len() == Self::gpus_taken(need)
            && gpus.iter().all(|(i, share)| {
                self.gpus
                    .get(*i)
                    .is_some_and(|g| g.share + share <= 1.0 + EPS && g.mem_free() >= need.gpu_mem)
            })
    }

    /// The device indices of GPU positions.
    pub fn indices(&self, gpus: &[(usize, f64)]) -> Vec<u32> {
        gpus.iter()
            .filter_map(|(i, _)| self.gpus.get(*i).map(|g| g.gpu.index))
            .collect()
    }

    /// Reserves `charged` (see [`Ledger::charge`]) on these GPUs. The caller checked that it
    /// fits ([`Ledger::fit_free`] or [`Ledger::fits_free_on`]).
    pub fn reserve(&mut self, charged: &Resources, gpus: &[(usize, f64)]) {
        self.used.cpus += charged.cpus;
        self.used.gpus += charged.gpus;
        self.used.mem = self.used.mem.saturating_add(charged.mem);
        self.used.gpu_mem = self.used.gpu_mem.saturating_add(charged.gpu_mem);
        for (k, v) in &charged.custom {
            *self.used.custom.entry(k.clone()).or_insert(0.0) += v;
        }
        let per_gpu_mem = per_gpu_mem(charged, gpus);
        for (i, share) in gpus {
            if let Some(g) = self.gpus.get_mut(*i) {
                g.share += share;
                g.mem_used = g.mem_used.saturating_add(per_gpu_mem);
            }
        }
        self.held += 1;
    }

    /// Releases what [`Ledger::reserve`] took with the same arguments. When nothing is held
    /// any more, rounding residue is cleared.
    pub fn release(&mut self, charged: &Resources, gpus: &[(usize, f64)]) {
        self.held = self.held.saturating_sub(1);
        if self.held == 0 {
            self.used = Resources::zero();
            for g in &mut self.gpus {
                g.share = 0.0;
                g.mem_used = 0;
            }
            return;
        }
        self.used.cpus -= charged.cpus;
        self.used.gpus -= charged.gpus;
        self.used.mem = self.used.mem.saturating_sub(charged.mem);
        self.used.gpu_mem = self.used.gpu_mem.saturating_sub(charged.gpu_mem);
        for (k, v) in &charged.custom {
            if let Some(u) = self.used.custom.get_mut(k) {
                *u -= v;
            }
        }
        let per_gpu_mem = per_gpu_mem(charged, gpus);
        for (i, share) in gpus {
            if let Some(g) = self.gpus.get_mut(*i) {
                g.share = (g.share - share).max(0.0);
                g.mem_used = g.mem_used.saturating_sub(per_gpu_mem);
            }
        }
    }
}

/// The GPU memory a reservation holds on each of its GPUs.
fn per_gpu_mem(charged: &Resources, gpus: &[(usize, f64)]) -> u64 {
    if gpus.is_empty() {
        0
    } else {
        charged.gpu_mem / gpus.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpus: f64, gpus: f64, gpu_mem: u64) -> Resources {
        Resources {
            cpus,
            gpus,
            gpu_mem,
            ..Resources::zero()
        }
    }

    fn two_gpus() -> Ledger {
        let gpus = [
            LedgerGpu {
                index: 3,
                mem_bytes: 100,
            },
            LedgerGpu {
                index: 7,
                mem_bytes: 50,
            },
        ];
        Ledger::new(res(4.0, 0.0, 0), &gpus).expect("valid")
    }

    #[test]
    fn capacity_takes_gpus_from_the_list() {
        let l = two_gpus();
        assert_eq!(l.cap().gpus, 2.0);
        assert_eq!(l.cap().gpu_mem, 150);
    }

    #[test]
    fn gpus_are_made_up_when_only_counted() {
        let l = Ledger::new(res(1.0, 2.0, 64), &[]).expect("valid");
        assert_eq!(l.gpus().len(), 2);
        assert_eq!(l.gpus()[1].gpu.index, 1);
        assert_eq!(l.gpus()[1].gpu.mem_bytes, 32);
    }

    #[test]
    fn absurd_offers_are_refused_before_anything_is_allocated() {
        // `gpus = 1e10` once made up ten billion GPU entries (about 170 GB).
        let e = Ledger::new(res(1.0, 1e10, 0), &[]).unwrap_err();
        assert!(
            matches!(e, LedgerError::TooMany { what: "gpus", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("at most 1024"), "{e}");
        assert!(matches!(
            Ledger::new(res(1e9, 0.0, 0), &[]),
            Err(LedgerError::TooMany { what: "cpus", .. })
        ));
        let many: Vec<LedgerGpu> = (0..=MAX_GPUS as u32)
            .map(|index| LedgerGpu {
                index,
                mem_bytes: 1,
            })
            .collect();
        assert!(matches!(
            Ledger::new(res(1.0, 0.0, 0), &many),
            Err(LedgerError::TooMany {
                what: "gpus listed",
                ..
            })
        ));
        let mut custom = res(1.0, 0.0, 0);
        for i in 0..=MAX_CUSTOM {
            custom.custom.insert(format!("r{i}"), 1.0);
        }
        assert!(matches!(
            Ledger::new(custom, &[]),
            Err(LedgerError::TooMany {
                what: "custom resources",
                ..
            })
        ));
        assert!(Ledger::new(res(MAX_CPUS, MAX_GPUS as f64, 0), &[]).is_ok());
    }

    #[test]
    fn bad_offers_are_refused() {
        assert!(matches!(
            Ledger::new(res(-1.0, 0.0, 0), &[]),
            Err(LedgerError::BadAmount { .. })
        ));
        let twice = [
            LedgerGpu {
                index: 1,
                mem_bytes: 1,
            },
            LedgerGpu {
                index: 1,
                mem_bytes: 1,
            },
        ];
        assert_eq!(
            Ledger::new(res(1.0, 0.0, 0), &twice),
            Err(LedgerError::DuplicateGpu(1))
        );
    }

    #[test]
    fn shares_pack_onto_the_fullest_gpu() {
        let mut l = two_gpus();
        let half = res(0.0, 0.5, 10);
        let first = l.fit_free(&half).expect("fits");
        l.reserve(&Ledger::charge(&half), &first);
        let second = l.fit_free(&half).expect("fits");
        assert_eq!(first, second, "packed onto the same GPU");
        l.reserve(&Ledger::charge(&half), &second);
        assert_eq!(l.fit_free(&half).map(|g| g[0].0), Some(1 - first[0].0));
    }

    #[test]
    fn whole_gpus_need_their_memory_on_each() {
        let l = two_gpus();
        assert!(l.fits_total(&res(0.0, 2.0, 50)));
        assert!(!l.fits_total(&res(0.0, 2.0, 60)), "GPU 7 has only 50");
        assert!(l.fits_total(&res(0.0, 1.0, 60)));
        assert_eq!(l.fit_free(&res(0.0, 1.0, 60)), Some(vec![(0, 1.0)]));
        assert_eq!(Ledger::charge(&res(0.0, 1.5, 10)).gpus, 2.0);
        assert_eq!(Ledger::charge(&res(0.0, 1.5, 10)).gpu_mem, 20);
    }

    #[test]
    fn exact_gpus_are_checked_as_chosen() {
        let mut l = two_gpus();
        let need = res(1.0, 1.0, 60);
        let on7 = l.positions(&[7], &need).expect("known index");
        assert!(!l.fits_free_on(&need, &on7), "GPU 7 is too small");
        let on3 = l.positions(&[3], &need).expect("known index");
        assert!(l.fits_free_on(&need, &on3));
        assert!(!l.fits_free_on(&need, &[]), "a GPU task needs its GPU");
        assert!(l.positions(&[9], &need).is_none());
        assert!(!l.fits_total_on(&need, &on7));
        assert!(l.fits_total_on(&need, &on3));
        assert!(!l.fits_total_on(&need, &[]));
        assert!(l.positions(&[3, 3], &res(0.0, 2.0, 0)).is_none());
        l.reserve(&Ledger::charge(&need), &on3);
        assert!(!l.fits_free_on(&need, &on3), "taken");
        assert_eq!(l.indices(&on3), vec![3]);
    }

    #[test]
    fn gpu_memory_without_gpus_counts_against_the_total() {
        let mut l = two_gpus();
        let need = res(0.0, 0.0, 100);
        assert!(l.fits_free_on(&need, &[]));
        l.reserve(&Ledger::charge(&need), &[]);
        assert!(!l.fits_free_on(&need, &[]));
        let gpu = res(0.0, 1.0, 60);
        assert!(l.fit_free(&gpu).is_none(), "100 + 60 > 150 in all");
        assert!(l.fit_free(&res(0.0, 1.0, 50)).is_some());
    }

    #[test]
    fn releasing_everything_clears_residue() {
        let mut l = Ledger::new(res(1.0, 0.0, 0), &[]).expect("valid");
        let third = res(1.0 / 3.0, 0.0, 0);
        for _ in 0..3 {
            let g = l.fit_free(&third).expect("fits");
            l.reserve(&third, &g);
        }
        assert!(l.fit_free(&third).is_none());
        for _ in 0..3 {
            l.release(&third, &[]);
        }
        assert_eq!(l.used(), &Resources::zero());
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn memory_and_custom_resources_are_bounded() {
        let mut cap = res(8.0, 0.0, 0);
        cap.mem = 100;
        cap.custom.insert("lic".into(), 1.0);
        let mut l = Ledger::new(cap, &[]).expect("valid");
        let mut need = res(1.0, 0.0, 0);
        need.mem = 60;
        need.custom.insert("lic".into(), 1.0);
        let g = l.fit_free(&need).expect("fits");
        l.reserve(&need, &g);
        assert!(l.fit_free(&need).is_none());
        need.custom.clear();
        assert!(l.fit_free(&need).is_none(), "memory is short too");
        need.mem = 40;
        assert!(l.fit_free(&need).is_some());
        let mut other = res(1.0, 0.0, 0);
        other.custom.insert("fpga".into(), 1.0);
        assert!(
            !l.fits_total(&other),
            "an unknown custom resource counts as zero"
        );
    }
}
