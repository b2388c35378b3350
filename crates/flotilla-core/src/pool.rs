//! A job's `[pool]` section: what it agrees to pay and how much it trusts the machines of
//! other owners (providers) that a shared pool lends.
//!
//! ```toml
//! [pool]
//! budget = 100.0                           # credits this job may spend at most
//! max_price = { cpu = 0.05, gpu = 1.0 }    # credits per unit-hour it accepts at most
//! deadline = "2h"                          # from submission
//! verify = 2                               # 1, 2, 3 … or "adaptive"
//! trust = "any"                            # or "trusted-only": the operator's own workers
//! objective = "cost"                       # or "time", "energy"
//! ```
//!
//! A job without a `[pool]` section runs on the operator's own workers only: it never
//! lands on a provider's machine, so it is never charged. Parsing and its errors are in
//! [`parse_job`](crate::parse_job); the pool's policy is the coordinator's.

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How the results of a job's tasks are verified.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verify {
    /// `verify = k`: `k` agreeing results from distinct providers (1: taken as it comes).
    Quorum(u32),
    /// `verify = "adaptive"`: replicated until a provider earns trust, then spot-checked.
    #[default]
    Adaptive,
}

/// Which workers a job accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Trust {
    /// Providers' machines too (their results verified as `verify` says).
    #[default]
    Any,
    /// The operator's own workers only.
    TrustedOnly,
}

/// What placement minimizes among the workers that still meet the deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Objective {
    /// Credits.
    #[default]
    Cost,
    /// The job's completion time (price ignored, within `max_price`).
    Time,
    /// Energy, from the workers' power figures (estimated where not measured).
    Energy,
}

/// The highest prices a job accepts, credits per unit-hour (`None`: any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MaxPrice {
    /// Per CPU-hour.
    pub cpu: Option<f64>,
    /// Per GPU-hour.
    pub gpu: Option<f64>,
    /// Per GB-hour of memory.
    pub mem_gb: Option<f64>,
}

/// A job's `[pool]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// The most credits the job may spend (`None`: its tenant's balance is the limit).
    pub budget: Option<f64>,
    /// The highest prices it accepts.
    pub max_price: MaxPrice,
    /// Its deadline, from submission.
    pub deadline: Option<Duration>,
    /// How its results are verified.
    pub verify: Verify,
    /// Which workers it accepts.
    pub trust: Trust,
    /// What placement minimizes.
    pub objective: Objective,
}

impl Default for PoolSpec {
    /// No budget, any price, no deadline, adaptive verification, any worker, cheapest.
    fn default() -> Self {
        PoolSpec {
            budget: None,
            max_price: MaxPrice::default(),
            deadline: None,
            verify: Verify::Adaptive,
            trust: Trust::Any,
            objective: Objective::Cost,
        }
    }
}

impl Verify {
    /// As the job file writes it.
    pub fn to_toml(self) -> String {
        match self {
            Verify::Quorum(k) => k.to_string(),
            Verify::Adaptive => "\"adaptive\"".into(),
        }
    }
}

impl Trust {
    /// As the job file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Any => "any",
            Trust::TrustedOnly => "trusted-only",
        }
    }
}

impl Objective {
    /// As the job file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Cost => "cost",
            Objective::Time => "time",
            Objective::Energy => "energy",
        }
    }
}

impl PoolSpec {
    /// The `[pool]` table, as [`JobSpec::to_toml`](crate::JobSpec::to_toml) writes it.
    pub fn to_toml(&self) -> String {
        let mut out = String::from("\n[pool]\n");
        if let Some(b) = self.budget {
            let _ = writeln!(out, "budget = {}", toml::Value::Float(b));
        }
        let m = &self.max_price;
        let prices: Vec<String> = [("cpu", m.cpu), ("gpu", m.gpu), ("mem_gb", m.mem_gb)]
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k} = {}", toml::Value::Float(v))))
            .collect();
        if !prices.is_empty() {
            let _ = writeln!(out, "max_price = {{ {} }}", prices.join(", "));
        }
        if let Some(d) = self.deadline {
            let _ = writeln!(
                out,
                "deadline = \"{}\"",
                crate::duration::format_duration(d)
            );
        }
        let _ = writeln!(out, "verify = {}", self.verify.to_toml());
        let _ = writeln!(out, "trust = \"{}\"", self.trust.as_str());
        let _ = writeln!(out, "objective = \"{}\"", self.objective.as_str());
        out
    }
}
