//! Performance models learned from history, after StarPU's "history" and "regression"
//! models.
//!
//! Every measured execution is recorded under `(codelet, arch, footprint)`: the codelet's
//! name, the performance-model key of the unit that ran it ([`Unit::arch`](crate::Unit)) and
//! the task's size footprint. Each key keeps a running count, mean and variance (Welford's
//! algorithm), and is *calibrated* once it has `min_samples` samples (3 unless set with
//! [`PerfModel::with_min_samples`]).
//!
//! For footprints never calibrated, each `(codelet, arch)` also keeps a least-squares fit of
//! `ln t = ln a + b ln footprint` over the distinct non-zero footprints seen (one point per
//! footprint: its mean time), so a power law `t = a * footprint^b` can estimate a new size.
//! The fit needs at least two distinct footprints.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SchedError};

/// What the model knows about an execution time.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Prediction {
    /// Measured at least `min_samples` times: the mean, in seconds.
    Calibrated(f64),
    /// Not calibrated for this footprint; estimated from the power-law fit over other
    /// footprints, in seconds.
    Estimated(f64),
    /// Nothing to go on: the unit should run it once to learn.
    Unknown,
}

impl Prediction {
    /// The predicted seconds, if any.
    pub fn seconds(self) -> Option<f64> {
        match self {
            Prediction::Calibrated(s) | Prediction::Estimated(s) => Some(s),
            Prediction::Unknown => None,
        }
    }
}

/// Running statistics of one `(codelet, arch, footprint)` key.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
pub struct Stats {
    /// How many samples.
    pub count: u64,
    /// Their mean, in seconds.
    pub mean: f64,
    /// Sum of squared deviations from the mean (Welford's `M2`).
    pub m2: f64,
}

impl Stats {
    /// Adds one sample (Welford).
    pub fn push(&mut self, x: f64) {
        self.count += 1;
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Combines two sets of statistics as if all samples had been pushed into one
    /// (Chan, Golub and LeVeque's pairwise update).
    pub fn combine(&self, other: &Stats) -> Stats {
        if other.count == 0 {
            return *self;
        }
        if self.count == 0 {
            return *other;
        }
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        let delta = other.mean - self.mean;
        Stats {
            count: self.count + other.count,
            mean: self.mean + delta * nb / n,
            m2: self.m2 + other.m2 + delta * delta * na * nb / n,
        }
    }

    /// The sample variance (divides by `count - 1`); 0 with fewer than two samples.
    pub fn variance(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            self.m2 / (self.count - 1) as f64
        }
    }

    /// The sample standard deviation.
    pub fn std_dev(&self) -> f64 {
        self.variance().sqrt()
    }
}

/// A power law `t = a * footprint^b`, stored as `(ln a, b)`.
#[derive(Clone, Copy, PartialEq, Debug)]
struct Fit {
    ln_a: f64,
    b: f64,
}

impl Fit {
    fn eval(&self, footprint: u64) -> f64 {
        (self.ln_a + self.b * (footprint as f64).ln()).exp()
    }
}

#[derive(Clone, Debug, Default)]
struct ArchHistory {
    by_footprint: BTreeMap<u64, Stats>,
    fit: Option<Fit>,
}

impl ArchHistory {
    /// Least squares of `ln mean` on `ln footprint` over the distinct footprints > 0 whose
    /// mean is > 0.
    fn refit(&mut self) {
        let points: Vec<(f64, f64)> = self
            .by_footprint
            .iter()
            .filter(|(f, s)| **f > 0 && s.count > 0 && s.mean > 0.0)
            .map(|(f, s)| ((*f as f64).ln(), s.mean.ln()))
            .collect();
        self.fit = None;
        if points.len() < 2 {
            return;
        }
        let n = points.len() as f64;
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if sxx > 0.0 {
            let b = sxy / sxx;
            self.fit = Some(Fit {
                ln_a: my - b * mx,
                b,
            });
        }
    }
}

/// A performance model: execution-time history per `(codelet, arch, footprint)` plus a
/// power-law regression per `(codelet, arch)`. See the [module docs](self).
///
/// ```
/// use flotilla_sched::{PerfModel, Prediction};
/// let mut m = PerfModel::with_min_samples(2);
/// m.record("gemm", "cpu", 1000, 0.5);
/// assert_eq!(m.predict("gemm", "cpu", 1000), Prediction::Unknown);
/// m.record("gemm", "cpu", 1000, 0.7);
/// assert_eq!(m.predict("gemm", "cpu", 1000), Prediction::Calibrated(0.6));
/// ```
#[derive(Clone, Debug)]
pub struct PerfModel {
    min_samples: u32,
    /// codelet -> arch -> history.
    history: BTreeMap<String, BTreeMap<String, ArchHistory>>,
}

impl Default for PerfModel {
    fn default() -> Self {
        Self::new()
    }
}

/// How hardware classes compare ([`PerfModel::arch_ratios`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArchRatios(BTreeMap<(String, String), f64>);

impl ArchRatios {
    /// `time(to) / time(from)`, learned; `None` where no codelet ran on both.
    pub fn get(&self, from: &str, to: &str) -> Option<f64> {
        self.0.get(&(from.to_string(), to.to_string())).copied()
    }
}

/// The serialized form: a version, the threshold and one flat entry per key.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    version: u32,
    min_samples: u32,
    entries: Vec<ModelEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    codelet: String,
    arch: String,
    footprint: u64,
    count: u64,
    mean: f64,
    m2: f64,
}

const MODEL_FILE_VERSION: u32 = 1;

impl PerfModel {
    /// The number of samples after which a key is calibrated, unless set otherwise.
    pub const DEFAULT_MIN_SAMPLES: u32 = 3;

    /// An empty model calibrating after [`PerfModel::DEFAULT_MIN_SAMPLES`] samples.
    pub fn new() -> Self {
        Self::with_min_samples(Self::DEFAULT_MIN_SAMPLES)
    }

    /// An empty model calibrating after `n` samples (at least 1).
    pub fn with_min_samples(n: u32) -> Self {
        PerfModel {
            min_samples: n.max(1),
            history: BTreeMap::new(),
        }
    }

    /// The calibration threshold.
    pub fn min_samples(&self) -> u32 {
        self.min_samples
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }

    /// Records one execution of `codelet` on a unit of `arch` with size `footprint` that took
    /// `seconds`. Samples that are negative or not finite (a broken clock) are ignored.
    pub fn record(&mut self, codelet: &str, arch: &str, footprint: u64, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let arch_history = self
            .history
            .entry(codelet.to_owned())
            .or_default()
            .entry(arch.to_owned())
            .or_default();
        arch_history
            .by_footprint
            .entry(footprint)
            .or_default()
            .push(seconds);
        arch_history.refit();
    }

    /// The statistics of one key, if it has samples.
    pub fn stats(&self, codelet: &str, arch: &str, footprint: u64) -> Option<Stats> {
        self.arch_history(codelet, arch)?
            .by_footprint
            .get(&footprint)
            .copied()
    }

    fn arch_history(&self, codelet: &str, arch: &str) -> Option<&ArchHistory> {
        self.history.get(codelet)?.get(arch)
    }

    /// Predicts the execution time of `codelet` on `arch` for `footprint`: the mean if the
    /// key is calibrated, else the power-law estimate if `(codelet, arch)` has one, else
    /// [`Prediction::Unknown`].
    pub fn predict(&self, codelet: &str, arch: &str, footprint: u64) -> Prediction {
        let Some(h) = self.arch_history(codelet, arch) else {
            return Prediction::Unknown;
        };
        if let Some(s) = h.by_footprint.get(&footprint) {
            if s.count >= u64::from(self.min_samples) {
                return Prediction::Calibrated(s.mean);
            }
        }
        match h.fit {
            Some(fit) if footprint > 0 => {
                let t = fit.eval(footprint);
                if t.is_finite() {
                    Prediction::Estimated(t)
                } else {
                    Prediction::Unknown
                }
            }
            _ => Prediction::Unknown,
        }
    }

    /// How hardware classes compare, learned across every codelet measured on both: for each
    /// pair `(from, to)`, the geometric mean over the shared (codelet, footprint) keys of
    /// `mean(to) / mean(from)`. Lets a codelet measured on one class be estimated on another
    /// ([`PerfModel::estimate`]). Linear in the keys times the classes.
    pub fn arch_ratios(&self) -> ArchRatios {
        // Classes by index, so the pairs are counted without comparing names.
        let mut names: Vec<&str> = self
            .history
            .values()
            .flat_map(|archs| archs.keys().map(String::as_str))
            .collect();
        names.sort_unstable();
        names.dedup();
        let k = names.len();
        let mut sums = vec![(0.0f64, 0u64); k * k];
        let mut local: Vec<(usize, &ArchHistory)> = Vec::new();
        for archs in self.history.values() {
            if archs.len() < 2 {
                continue;
            }
            local.clear();
            for (a, h) in archs {
                if let Ok(i) = names.binary_search(&a.as_str()) {
                    local.push((i, h));
                }
            }
            for &(i, ha) in &local {
                for &(j, hb) in &local {
                    if i == j {
                        continue;
                    }
                    for (fp, sa) in &ha.by_footprint {
                        let Some(sb) = hb.by_footprint.get(fp) else {
                            continue;
                        };
                        if sa.count > 0 && sb.count > 0 && sa.mean > 0.0 && sb.mean > 0.0 {
                            let e = &mut sums[i * k + j];
                            e.0 += (sb.mean / sa.mean).ln();
                            e.1 += 1;
                        }
                    }
                }
            }
        }
        let mut out = BTreeMap::new();
        for i in 0..k {
            for j in 0..k {
                let (sum, n) = sums[i * k + j];
                if n > 0 {
                    out.insert(
                        (names[i].to_string(), names[j].to_string()),
                        (sum / n as f64).exp(),
                    );
                }
            }
        }
        ArchRatios(out)
    }

    /// The best guess of `codelet`'s time on `arch`: its [`PerfModel::predict`]ion; else the
    /// mean of the samples it has there, however few; else, from the class it was measured
    /// on that compares to `arch` through the most keys, that mean × their ratio.
    pub fn estimate(
        &self,
        codelet: &str,
        arch: &str,
        footprint: u64,
        ratios: &ArchRatios,
    ) -> Option<f64> {
        if let Some(t) = self.predict(codelet, arch, footprint).seconds() {
            return Some(t);
        }
        let archs = self.history.get(codelet)?;
        let mean = |h: &ArchHistory| {
            h.by_footprint
                .get(&footprint)
                .filter(|s| s.count > 0)
                .map(|s| s.mean)
        };
        if let Some(t) = archs.get(arch).and_then(mean) {
            return Some(t);
        }
        archs
            .iter()
            .filter_map(|(a, h)| Some(mean(h)? * ratios.0.get(&(a.clone(), arch.to_string()))?))
            .min_by(f64::total_cmp)
    }

    /// Adds `other`'s history to this one, as if its samples had been recorded here. The
    /// calibration threshold stays this model's.
    pub fn merge(&mut self, other: &PerfModel) {
        for (codelet, archs) in &other.history {
            let mine = self.history.entry(codelet.clone()).or_default();
            for (arch, theirs) in archs {
                let h = mine.entry(arch.clone()).or_default();
                for (footprint, s) in &theirs.by_footprint {
                    let slot = h.by_footprint.entry(*footprint).or_default();
                    *slot = slot.combine(s);
                }
                h.refit();
            }
        }
    }

    /// Serializes the model as JSON (stable: keys in sorted order).
    pub fn to_json(&self) -> String {
        self.to_json_of(|_| true)
    }

    /// [`PerfModel::to_json`] of the codelets `keep` accepts only (what one tenant may see).
    pub fn to_json_of(&self, keep: impl Fn(&str) -> bool) -> String {
        let mut entries = Vec::new();
        for (codelet, archs) in self.history.iter().filter(|(c, _)| keep(c)) {
            for (arch, h) in archs {
                for (footprint, s) in &h.by_footprint {
                    entries.push(ModelEntry {
                        codelet: codelet.clone(),
                        arch: arch.clone(),
                        footprint: *footprint,
                        count: s.count,
                        mean: s.mean,
                        m2: s.m2,
                    });
                }
            }
        }
        let file = ModelFile {
            version: MODEL_FILE_VERSION,
            min_samples: self.min_samples,
            entries,
        };
        serde_json::to_string_pretty(&file)
            .expect("a model of strings and finite numbers serializes")
    }

    /// Reads a model written by [`PerfModel::to_json`].
    pub fn from_json(s: &str) -> Result<PerfModel> {
        let file: ModelFile = serde_json::from_str(s).map_err(SchedError::ModelJson)?;
        if file.version != MODEL_FILE_VERSION {
            return Err(SchedError::ModelVersion(file.version));
        }
        let mut model = PerfModel::with_min_samples(file.min_samples);
        for e in file.entries {
            let bad = |reason| SchedError::ModelEntry {
                codelet: e.codelet.clone(),
                arch: e.arch.clone(),
                footprint: e.footprint,
                reason,
            };
            if e.count == 0 {
                return Err(bad("count is 0"));
            }
            if !e.mean.is_finite() || e.mean < 0.0 {
                return Err(bad("mean is negative or not finite"));
            }
            if !e.m2.is_finite() || e.m2 < 0.0 {
                return Err(bad("m2 is negative or not finite"));
            }
            let h = model
                .history
                .entry(e.codelet.clone())
                .or_default()
                .entry(e.arch.clone())
                .or_default();
            let slot = h.by_footprint.entry(e.footprint).or_default();
            *slot = slot.combine(&Stats {
                count: e.count,
                mean: e.mean,
                m2: e.m2,
            });
        }
        for archs in model.history.values_mut() {
            for h in archs.values_mut() {
                h.refit();
            }
        }
        Ok(model)
    }
}

#[cfg(test)]
mod ratio_tests {
    use super::*;

    #[test]
    fn a_codelet_seen_on_one_class_is_estimated_on_another_by_how_the_classes_compare() {
        let mut m = PerfModel::new();
        // Two codelets ran on both: "fast" takes a quarter of "slow"'s time.
        for (c, t) in [("a", 8.0), ("b", 4.0)] {
            m.record(c, "slow", 0, t);
            m.record(c, "fast", 0, t / 4.0);
        }
        // "c" ran once, on "slow" only.
        m.record("c", "slow", 0, 20.0);
        let r = m.arch_ratios();
        assert!((r.get("slow", "fast").unwrap() - 0.25).abs() < 1e-9);
        assert!((r.get("fast", "slow").unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(m.predict("c", "fast", 0), Prediction::Unknown);
        assert!((m.estimate("c", "fast", 0, &r).unwrap() - 5.0).abs() < 1e-9);
        assert!((m.estimate("c", "slow", 0, &r).unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(m.estimate("d", "slow", 0, &r), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-300)
    }

    #[test]
    fn welford_matches_two_pass_mean_and_variance() {
        let xs = [1.5, 2.25, 0.75, 4.0, 3.125, 2.0, 10.0];
        let mut s = Stats::default();
        for x in xs {
            s.push(x);
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        assert_eq!(s.count, 7);
        assert!(close(s.mean, mean, 1e-12), "{} vs {mean}", s.mean);
        assert!(close(s.variance(), var, 1e-12), "{} vs {var}", s.variance());

        let mut m = PerfModel::new();
        for x in xs {
            m.record("k", "cpu", 8, x);
        }
        let st = m.stats("k", "cpu", 8).unwrap();
        assert!(close(st.variance(), var, 1e-12));
        assert!(close(st.std_dev(), var.sqrt(), 1e-12));
    }

    #[test]
    fn a_key_is_calibrated_after_min_samples() {
        let mut m = PerfModel::new();
        assert_eq!(m.min_samples(), 3);
        assert_eq!(m.predict("k", "cpu", 1), Prediction::Unknown);
        m.record("k", "cpu", 1, 1.0);
        m.record("k", "cpu", 1, 2.0);
        assert_eq!(m.predict("k", "cpu", 1), Prediction::Unknown);
        m.record("k", "cpu", 1, 3.0);
        assert_eq!(m.predict("k", "cpu", 1), Prediction::Calibrated(2.0));
        // Other archs and codelets know nothing.
        assert_eq!(m.predict("k", "gpu", 1), Prediction::Unknown);
        assert_eq!(m.predict("j", "cpu", 1), Prediction::Unknown);

        let mut m5 = PerfModel::with_min_samples(5);
        for _ in 0..4 {
            m5.record("k", "cpu", 1, 1.0);
        }
        assert_eq!(m5.predict("k", "cpu", 1), Prediction::Unknown);
        m5.record("k", "cpu", 1, 1.0);
        assert_eq!(m5.predict("k", "cpu", 1), Prediction::Calibrated(1.0));
        assert_eq!(PerfModel::with_min_samples(0).min_samples(), 1);
    }

    #[test]
    fn bad_samples_are_ignored() {
        let mut m = PerfModel::with_min_samples(1);
        m.record("k", "cpu", 1, f64::NAN);
        m.record("k", "cpu", 1, -1.0);
        m.record("k", "cpu", 1, f64::INFINITY);
        assert!(m.is_empty());
        assert_eq!(m.predict("k", "cpu", 1), Prediction::Unknown);
    }

    #[test]
    fn regression_estimates_an_unseen_size_within_one_percent() {
        // t = a * size^b with a little deterministic noise (±0.5%).
        let (a, b) = (3e-9, 1.5);
        let mut m = PerfModel::new();
        let sizes = [1_000u64, 4_000, 16_000, 64_000, 256_000];
        for (i, &n) in sizes.iter().enumerate() {
            for j in 0..3 {
                let noise = 1.0 + 0.005 * (((i * 3 + j) % 3) as f64 - 1.0);
                m.record("axpy", "cpu", n, a * (n as f64).powf(b) * noise);
            }
        }
        // Seen sizes are calibrated.
        assert!(matches!(
            m.predict("axpy", "cpu", 4_000),
            Prediction::Calibrated(_)
        ));
        for unseen in [2_000u64, 100_000, 1_000_000] {
            let truth = a * (unseen as f64).powf(b);
            match m.predict("axpy", "cpu", unseen) {
                Prediction::Estimated(t) => {
                    assert!(close(t, truth, 0.01), "{unseen}: {t} vs {truth}")
                }
                other => panic!("expected an estimate for {unseen}, got {other:?}"),
            }
        }
        // One footprint is not enough for a fit.
        let mut one = PerfModel::new();
        one.record("axpy", "cpu", 10, 1.0);
        assert_eq!(one.predict("axpy", "cpu", 20), Prediction::Unknown);
        // Footprint 0 cannot be placed on a log scale.
        assert_eq!(m.predict("axpy", "cpu", 0), Prediction::Unknown);
    }

    #[test]
    fn regression_is_exact_on_a_pure_power_law() {
        let mut m = PerfModel::with_min_samples(1);
        m.record("k", "gpu", 10, 2.0 * 10f64.powf(0.5));
        m.record("k", "gpu", 1000, 2.0 * 1000f64.powf(0.5));
        let Prediction::Estimated(t) = m.predict("k", "gpu", 100) else {
            panic!("no estimate");
        };
        assert!(close(t, 20.0, 1e-9), "{t}");
    }

    #[test]
    fn json_round_trip_keeps_every_statistic_and_the_threshold() {
        let mut m = PerfModel::with_min_samples(2);
        m.record("gemm", "cpu", 100, 1.0);
        m.record("gemm", "cpu", 100, 1.5);
        m.record("gemm", "cpu", 200, 8.0);
        m.record("gemm", "cuda:NVIDIA H200", 100, 0.01);
        m.record("potrf", "cpu", 7, 0.3);
        let text = m.to_json();
        let back = PerfModel::from_json(&text).unwrap();
        assert_eq!(back.min_samples(), 2);
        assert_eq!(back.to_json(), text);
        for (c, a, f) in [
            ("gemm", "cpu", 100),
            ("gemm", "cpu", 200),
            ("gemm", "cpu", 150),
            ("gemm", "cuda:NVIDIA H200", 100),
            ("potrf", "cpu", 7),
        ] {
            assert_eq!(back.predict(c, a, f), m.predict(c, a, f), "{c} {a} {f}");
            assert_eq!(back.stats(c, a, f), m.stats(c, a, f));
        }
    }

    #[test]
    fn from_json_rejects_garbage_and_impossible_entries() {
        assert!(matches!(
            PerfModel::from_json("{"),
            Err(SchedError::ModelJson(_))
        ));
        let bad = r#"{"version":1,"min_samples":3,"entries":[{"codelet":"k","arch":"cpu","footprint":1,"count":0,"mean":1.0,"m2":0.0}]}"#;
        let err = PerfModel::from_json(bad).unwrap_err();
        assert!(err.to_string().contains("count is 0"), "{err}");
        let neg = r#"{"version":1,"min_samples":3,"entries":[{"codelet":"k","arch":"cpu","footprint":1,"count":2,"mean":-1.0,"m2":0.0}]}"#;
        assert!(PerfModel::from_json(neg).is_err());
        let future = r#"{"version":99,"min_samples":3,"entries":[]}"#;
        assert!(matches!(
            PerfModel::from_json(future),
            Err(SchedError::ModelVersion(99))
        ));
    }

    #[test]
    fn merge_equals_recording_everything_in_one_model() {
        let samples_a = [
            ("k", "cpu", 1u64, 1.0),
            ("k", "cpu", 1, 3.0),
            ("k", "gpu", 1, 0.1),
        ];
        let samples_b = [
            ("k", "cpu", 1u64, 2.0),
            ("k", "cpu", 2, 6.0),
            ("j", "cpu", 1, 9.0),
        ];
        let mut a = PerfModel::new();
        let mut b = PerfModel::new();
        let mut all = PerfModel::new();
        for (c, ar, f, t) in samples_a {
            a.record(c, ar, f, t);
            all.record(c, ar, f, t);
        }
        for (c, ar, f, t) in samples_b {
            b.record(c, ar, f, t);
            all.record(c, ar, f, t);
        }
        a.merge(&b);
        for (c, ar, f) in [
            ("k", "cpu", 1),
            ("k", "cpu", 2),
            ("k", "gpu", 1),
            ("j", "cpu", 1),
        ] {
            let (x, y) = (a.stats(c, ar, f).unwrap(), all.stats(c, ar, f).unwrap());
            assert_eq!(x.count, y.count);
            assert!(close(x.mean, y.mean, 1e-12));
            assert!((x.m2 - y.m2).abs() < 1e-9);
        }
        assert_eq!(a.predict("k", "cpu", 1), Prediction::Calibrated(2.0));
        // The fit over footprints 1 and 2 now exists for (k, cpu).
        assert!(matches!(a.predict("k", "cpu", 4), Prediction::Estimated(_)));
    }
}
