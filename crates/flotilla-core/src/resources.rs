//! Resources: what a task needs and what a worker offers.
//!
//! [`Resources`] is a complete amount (CPU cores, GPUs, memory, GPU memory, named custom
//! resources). [`ResourceRequest`] is what a job file writes: only the keys given, so that
//! `[defaults]`, a task and a variant can be layered with [`ResourceRequest::overlay`] and
//! then [`resolve`](ResourceRequest::resolve)d.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::size::format_size_readable;

/// A complete amount of resources: what a task needs or what a worker offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU cores; may be fractional.
    pub cpus: f64,
    /// GPUs; may be fractional (`0.5` shares a GPU between two tasks).
    pub gpus: f64,
    /// Host memory in bytes.
    pub mem: u64,
    /// GPU memory in bytes.
    pub gpu_mem: u64,
    /// Named custom resources (`licenses = 1`, `fpga = 1`) and their amounts.
    pub custom: BTreeMap<String, f64>,
}

impl Default for Resources {
    /// One CPU and nothing else.
    fn default() -> Self {
        Resources {
            cpus: 1.0,
            gpus: 0.0,
            mem: 0,
            gpu_mem: 0,
            custom: BTreeMap::new(),
        }
    }
}

impl Resources {
    /// No resources at all (zero CPUs), the identity for adding up.
    pub fn zero() -> Self {
        Resources {
            cpus: 0.0,
            ..Resources::default()
        }
    }

    /// Whether this amount fits in `cap`: every kind at most what `cap` has. A custom
    /// resource `cap` does not list counts as zero there.
    pub fn fits_in(&self, cap: &Resources) -> bool {
        self.cpus <= cap.cpus
            && self.gpus <= cap.gpus
            && self.mem <= cap.mem
            && self.gpu_mem <= cap.gpu_mem
            && self
                .custom
                .iter()
                .all(|(k, &v)| v <= cap.custom.get(k).copied().unwrap_or(0.0))
    }

    /// The first amount that is negative, NaN or infinite, as (name, amount).
    pub fn first_bad_amount(&self) -> Option<(String, f64)> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(self.cpus) {
            return Some(("cpus".into(), self.cpus));
        }
        if !ok(self.gpus) {
            return Some(("gpus".into(), self.gpus));
        }
        self.custom
            .iter()
            .find(|(_, &v)| !ok(v))
            .map(|(k, &v)| (k.clone(), v))
    }
}

impl fmt::Display for Resources {
    /// `cpus=1 gpus=0.5 mem=256MiB gpu_mem=4GiB licenses=1`; zero amounts other than
    /// `cpus` are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpus={}", self.cpus)?;
        if self.gpus != 0.0 {
            write!(f, " gpus={}", self.gpus)?;
        }
        if self.mem != 0 {
            write!(f, " mem={}", format_size_readable(self.mem))?;
        }
        if self.gpu_mem != 0 {
            write!(f, " gpu_mem={}", format_size_readable(self.gpu_mem))?;
        }
        for (k, v) in &self.custom {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// The custom resource a task needs to use the network (`network = true` in its table); only
/// workers started with `--allow-network` offer it, and their sandboxes give network only to
/// tasks holding it.
pub const NETWORK: &str = "network";

/// Resources as a job file writes them: only the keys that were given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceRequest {
    /// CPU cores, if given.
    pub cpus: Option<f64>,
    /// GPUs, if given.
    pub gpus: Option<f64>,
    /// Host memory in bytes, if given.
    pub mem: Option<u64>,
    /// GPU memory in bytes, if given.
    pub gpu_mem: Option<u64>,
    /// Custom resources given.
    pub custom: BTreeMap<String, f64>,
}

impl ResourceRequest {
    /// Whether no key was given.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none()
            && self.gpus.is_none()
            && self.mem.is_none()
            && self.gpu_mem.is_none()
            && self.custom.is_empty()
    }

    /// `self` with every key `top` gives replaced by `top`'s value.
    pub fn overlay(&self, top: &ResourceRequest) -> ResourceRequest {
        let mut custom = self.custom.clone();
        custom.extend(top.custom.iter().map(|(k, v)| (k.clone(), *v)));
        ResourceRequest {
            cpus: top.cpus.or(self.cpus),
            gpus: top.gpus.or(self.gpus),
            mem: top.mem.or(self.mem),
            gpu_mem: top.gpu_mem.or(self.gpu_mem),
            custom,
        }
    }

    /// The complete amount: keys not given take [`Resources::default`]'s values.
    pub fn resolve(&self) -> Resources {
        let d = Resources::default();
        Resources {
            cpus: self.cpus.unwrap_or(d.cpus),
            gpus: self.gpus.unwrap_or(d.gpus),
            mem: self.mem.unwrap_or(d.mem),
            gpu_mem: self.gpu_mem.unwrap_or(d.gpu_mem),
            custom: self.custom.clone(),
        }
    }

    /// The first amount that is negative, NaN or infinite, as (name, amount).
    pub fn first_bad_amount(&self) -> Option<(String, f64)> {
        let mut probe = self.resolve();
        probe.cpus = self.cpus.unwrap_or(0.0);
        probe.first_bad_amount()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpus: f64, gpus: f64, mem: u64) -> Resources {
        Resources {
            cpus,
            gpus,
            mem,
            ..Resources::default()
        }
    }

    #[test]
    fn fits_in_compares_every_kind() {
        let cap = res(8.0, 1.0, 16 << 30);
        assert!(res(8.0, 1.0, 16 << 30).fits_in(&cap));
        assert!(res(0.5, 0.5, 0).fits_in(&cap));
        assert!(!res(8.5, 0.0, 0).fits_in(&cap));
        assert!(!res(1.0, 2.0, 0).fits_in(&cap));
        assert!(!res(1.0, 0.0, 17 << 30).fits_in(&cap));
        let mut gm = res(1.0, 0.0, 0);
        gm.gpu_mem = 1;
        assert!(!gm.fits_in(&cap));
    }

    #[test]
    fn custom_resources_missing_from_capacity_count_as_zero() {
        let mut need = res(1.0, 0.0, 0);
        need.custom.insert("license".into(), 1.0);
        let mut cap = res(4.0, 0.0, 0);
        assert!(!need.fits_in(&cap));
        cap.custom.insert("license".into(), 2.0);
        assert!(need.fits_in(&cap));
        need.custom.insert("fpga".into(), 0.0);
        assert!(need.fits_in(&cap), "a zero amount always fits");
    }

    #[test]
    fn overlay_prefers_the_top_and_resolve_fills_defaults() {
        let base = ResourceRequest {
            cpus: Some(2.0),
            mem: Some(100),
            custom: [("a".to_string(), 1.0)].into(),
            ..Default::default()
        };
        let top = ResourceRequest {
            mem: Some(200),
            gpus: Some(0.5),
            custom: [("b".to_string(), 3.0)].into(),
            ..Default::default()
        };
        let r = base.overlay(&top).resolve();
        assert_eq!(r.cpus, 2.0);
        assert_eq!(r.gpus, 0.5);
        assert_eq!(r.mem, 200);
        assert_eq!(r.custom.len(), 2);
        assert_eq!(ResourceRequest::default().resolve(), Resources::default());
        assert!(ResourceRequest::default().is_empty());
        assert!(!top.is_empty());
    }

    #[test]
    fn bad_amounts_are_found() {
        assert_eq!(
            res(-1.0, 0.0, 0).first_bad_amount(),
            Some(("cpus".into(), -1.0))
        );
        assert!(res(1.0, f64::NAN, 0).first_bad_amount().is_some());
        let mut r = res(1.0, 0.0, 0);
        r.custom.insert("x".into(), f64::INFINITY);
        assert_eq!(r.first_bad_amount().map(|b| b.0), Some("x".into()));
        assert_eq!(res(0.0, 0.0, 0).first_bad_amount(), None);
    }

    #[test]
    fn display_skips_zero_amounts() {
        let mut r = res(1.0, 0.5, 256 << 20);
        r.custom.insert("license".into(), 1.0);
        assert_eq!(r.to_string(), "cpus=1 gpus=0.5 mem=256MiB license=1");
        assert_eq!(Resources::default().to_string(), "cpus=1");
    }
}
