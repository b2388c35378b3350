//! Prices and metering: a provider's price per unit-hour of each resource, an attempt's
//! metered usage, and what that usage costs.

use serde::{Deserialize, Serialize};

use crate::credits::Credits;
use crate::error::PoolError;

/// A provider's prices, credits per unit-hour: per CPU, per GPU and per GB of memory held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Price {
    /// Per CPU-hour.
    pub cpu: Credits,
    /// Per GPU-hour.
    pub gpu: Credits,
    /// Per GB-hour of memory.
    pub mem_gb: Credits,
}

impl Price {
    /// Parses `cpu=0.02,gpu=0.5,mem_gb=0.001` (any subset; what is not named is free).
    pub fn parse(s: &str) -> Result<Price, PoolError> {
        let mut p = Price::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| PoolError::BadPrice {
                value: s.to_string(),
                why: format!("{part:?} is not NAME=CREDITS"),
            })?;
            let amount = Credits::parse(v, &format!("price of {}", k.trim()))?;
            if amount.is_negative() {
                return Err(PoolError::BadPrice {
                    value: s.to_string(),
                    why: format!("the price of {} is negative", k.trim()),
                });
            }
            match k.trim() {
                "cpu" => p.cpu = amount,
                "gpu" => p.gpu = amount,
                "mem_gb" => p.mem_gb = amount,
                other => {
                    return Err(PoolError::BadPrice {
                        value: s.to_string(),
                        why: format!("unknown resource {other:?} (cpu, gpu, mem_gb)"),
                    })
                }
            }
        }
        Ok(p)
    }

    /// Whether no resource of it costs more than in `max` (a job's `max_price`).
    pub fn within(&self, max: &Price) -> bool {
        self.cpu <= max.cpu && self.gpu <= max.gpu && self.mem_gb <= max.mem_gb
    }

    /// What `usage` costs at this price: each resource's unit-seconds (counted in whole
    /// milliseconds) × its price per hour, rounded to the micro-credit; deterministic, so
    /// every replay of the same usage charges the same.
    pub fn cost(&self, usage: &Metered) -> Credits {
        let part = |price: Credits, unit_seconds: f64| -> i128 {
            let ms = if unit_seconds.is_finite() && unit_seconds > 0.0 {
                (unit_seconds * 1000.0).round() as i128
            } else {
                0
            };
            // price is micro-credits per unit-hour: × ms / 3,600,000, rounded half up.
            (i128::from(price.as_micro()) * ms + 1_800_000) / 3_600_000
        };
        let total = part(self.cpu, usage.cpu_seconds)
            + part(self.gpu, usage.gpu_seconds)
            + part(self.mem_gb, usage.mem_gb_seconds);
        Credits::micro(total.min(i128::from(i64::MAX)) as i64)
    }
}

impl std::fmt::Display for Price {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu={},gpu={},mem_gb={}",
            self.cpu, self.gpu, self.mem_gb
        )
    }
}

/// What an attempt used, as the worker measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metered {
    /// CPU-seconds (the CPUs held × wall time, or the measured CPU time: the caller says).
    pub cpu_seconds: f64,
    /// GPU-seconds held.
    pub gpu_seconds: f64,
    /// GB-seconds of memory held.
    pub mem_gb_seconds: f64,
    /// WASM fuel consumed, when metered.
    pub fuel: u64,
    /// Energy in joules, when the host exposes it (or estimated: see `energy_estimated`).
    pub energy_joules: Option<f64>,
    /// Whether `energy_joules` is an estimate from utilization rather than a measurement.
    pub energy_estimated: bool,
}

impl Metered {
    /// Usage of `cpus` CPUs, `gpus` GPUs and `mem_bytes` of memory held for `wall_seconds`.
    pub fn held(cpus: f64, gpus: f64, mem_bytes: u64, wall_seconds: f64) -> Metered {
        Metered {
            cpu_seconds: cpus * wall_seconds,
            gpu_seconds: gpus * wall_seconds,
            mem_gb_seconds: mem_bytes as f64 / 1e9 * wall_seconds,
            ..Metered::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prices_and_names_what_is_wrong() {
        let p = Price::parse("cpu=0.02,gpu=0.5,mem_gb=0.001").unwrap();
        assert_eq!(p.cpu, Credits::micro(20_000));
        assert_eq!(p.gpu, Credits::micro(500_000));
        assert_eq!(p.mem_gb, Credits::micro(1_000));
        assert_eq!(Price::parse(&p.to_string()).unwrap(), p);
        assert_eq!(Price::parse("gpu=2").unwrap().cpu, Credits::ZERO);
        for (bad, says) in [
            ("cpu", "NAME=CREDITS"),
            ("tpu=1", "unknown resource"),
            ("cpu=-1", "negative"),
            ("cpu=x", "price of cpu"),
        ] {
            let e = Price::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn cost_is_price_per_hour_times_unit_seconds() {
        let p = Price::parse("cpu=0.02,gpu=0.5,mem_gb=0.001").unwrap();
        // 2 CPUs, 1 GPU, 4 GB for half an hour.
        let u = Metered::held(2.0, 1.0, 4_000_000_000, 1800.0);
        // 2 × 0.02 × 0.5 + 1 × 0.5 × 0.5 + 4 × 0.001 × 0.5 = 0.02 + 0.25 + 0.002
        assert_eq!(p.cost(&u), Credits::micro(272_000));
        assert_eq!(p.cost(&Metered::default()), Credits::ZERO);
        let nan = Metered {
            cpu_seconds: f64::NAN,
            ..Metered::default()
        };
        assert_eq!(p.cost(&nan), Credits::ZERO);
        assert!(p.within(&Price::parse("cpu=0.05,gpu=1,mem_gb=1").unwrap()));
        assert!(!p.within(&Price::parse("cpu=0.01,gpu=1,mem_gb=1").unwrap()));
    }
}
