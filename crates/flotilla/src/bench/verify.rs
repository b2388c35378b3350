//! `flotilla bench verify`: the verification policy of `flotilla-pool` in a simulated pool
//! (the real policy code, virtual runs): with a share of providers always cheating, the
//! compute each mode costs and whether a wrong result was accepted; with one provider that
//! turns to cheating after its honest results, how many cheats it makes before it is caught.

use flotilla_pool::{simulate_verification, VerifyConfig, VerifyMode, VerifyReport, VerifySim};
use serde::Serialize;

/// One mode's figures, over several seeds.
#[derive(Debug, Serialize)]
pub struct VerifyPoint {
    /// `"verify"`.
    pub bench: &'static str,
    /// `1`, `2`, `3` or `adaptive`.
    pub mode: String,
    /// Providers in the pool.
    pub providers: usize,
    /// The share that always cheats.
    pub cheaters: f64,
    /// Tasks per run.
    pub tasks: u64,
    /// Runs per task (1.0: each task once), the mean over the seeds.
    pub cost: f64,
    /// Wrong results accepted, summed over the seeds.
    pub wrong_accepted: u64,
    /// Tasks that failed, summed over the seeds.
    pub failed: u64,
    /// Every run's report.
    pub runs: Vec<VerifyReport>,
}

/// The turncoat's figures.
#[derive(Debug, Serialize)]
pub struct TurncoatPoint {
    /// `"verify-turncoat"`.
    pub bench: &'static str,
    /// Its honest results before it cheats.
    pub after: u64,
    /// Trials (seeds).
    pub trials: u64,
    /// The share of trials where it was caught within 20 cheats.
    pub caught_within_20: f64,
    /// The most cheats before it was caught, over the trials.
    pub worst: u64,
    /// The mean.
    pub mean: f64,
    /// Wrong results left accepted at the end, over all trials (re-verification fixes them).
    pub wrong_at_end: u64,
}

fn parse_mode(m: &str) -> anyhow::Result<VerifyMode> {
    Ok(match m {
        "adaptive" => VerifyMode::Adaptive,
        k => VerifyMode::Quorum(
            k.parse()
                .map_err(|_| anyhow::anyhow!("--modes: {k:?} is neither a number nor adaptive"))?,
        ),
    })
}

/// Each mode in `modes` over `seeds`.
pub fn modes(
    modes: &[String],
    providers: usize,
    cheaters: f64,
    tasks: u64,
    seeds: &[u64],
) -> anyhow::Result<Vec<VerifyPoint>> {
    let mut out = Vec::new();
    for m in modes {
        let mode = parse_mode(m)?;
        let runs: Vec<VerifyReport> = seeds
            .iter()
            .map(|&seed| {
                simulate_verification(&VerifySim {
                    providers,
                    cheaters,
                    turncoat_after: None,
                    tasks,
                    mode,
                    config: VerifyConfig {
                        seed,
                        ..VerifyConfig::default()
                    },
                    seed,
                })
            })
            .collect();
        let cost = runs.iter().map(|r| r.cost).sum::<f64>() / runs.len().max(1) as f64;
        out.push(VerifyPoint {
            bench: "verify",
            mode: m.clone(),
            providers,
            cheaters,
            tasks,
            cost,
            wrong_accepted: runs.iter().map(|r| r.wrong_accepted).sum(),
            failed: runs.iter().map(|r| r.failed).sum(),
            runs,
        });
    }
    Ok(out)
}

/// A provider honest for `after` results, then cheating, among `providers` honest ones:
/// how soon it is caught, over `trials` seeds.
pub fn turncoat(providers: usize, after: u64, trials: u64) -> TurncoatPoint {
    let mut caught = Vec::new();
    let mut wrong_at_end = 0;
    for seed in 0..trials {
        let r = simulate_verification(&VerifySim {
            providers,
            cheaters: 0.0,
            turncoat_after: Some(after),
            // Enough tasks for the turncoat to reach `after` results and cheat a while.
            tasks: (after + 200) * (providers as u64 + 1),
            mode: VerifyMode::Adaptive,
            config: VerifyConfig {
                seed: seed * 7919 + 1,
                ..VerifyConfig::default()
            },
            seed: seed + 11,
        });
        caught.push(r.turncoat_caught_after.unwrap_or(u64::MAX));
        wrong_at_end += r.wrong_at_end;
    }
    let n = caught.len().max(1) as f64;
    TurncoatPoint {
        bench: "verify-turncoat",
        after,
        trials,
        caught_within_20: caught.iter().filter(|&&c| c <= 20).count() as f64 / n,
        worst: caught.iter().copied().max().unwrap_or(0),
        mean: caught.iter().map(|&c| c as f64).sum::<f64>() / n,
        wrong_at_end,
    }
}
