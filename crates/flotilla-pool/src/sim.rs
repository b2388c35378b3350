//! The verification policy in a simulated pool: providers that are honest, always cheat, or
//! turn to cheating after a number of honest results, running tasks one after the other
//! through the real [`Verifier`]. Deterministic for a seed.
//!
//! A cheater's output is wrong in its own way (a flipped byte somewhere: two cheaters do not
//! agree with each other), as with `FLOTILLA_FAULT=corrupt-outputs`.

use std::collections::{HashSet, VecDeque};

use serde::Serialize;

use crate::verify::{Verdict, Verifier, VerifyConfig, VerifyMode};

/// A simulated pool.
#[derive(Clone, Debug)]
pub struct VerifySim {
    /// Providers.
    pub providers: usize,
    /// The share of them that always cheat.
    pub cheaters: f64,
    /// One more provider that is honest for this many results, then always cheats.
    pub turncoat_after: Option<u64>,
    /// Tasks to run.
    pub tasks: u64,
    /// How results are verified.
    pub mode: VerifyMode,
    /// The policy's knobs (its seed included).
    pub config: VerifyConfig,
    /// Seeds who cheats and who runs what.
    pub seed: u64,
}

/// What a simulated run gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Tasks.
    pub tasks: u64,
    /// Runs of tasks in all (replicas included).
    pub runs: u64,
    /// `runs / tasks`: the compute verification cost, 1.0 being each task once.
    pub cost: f64,
    /// Wrong results accepted at any moment (a trusted turncoat's, before it was caught).
    pub wrong_accepted: u64,
    /// Wrong results still accepted at the end (after re-verification).
    pub wrong_at_end: u64,
    /// Tasks re-verified after their provider was caught.
    pub reverified: u64,
    /// Tasks that failed for want of a quorum or of providers.
    pub failed: u64,
    /// The turncoat's cheats before it was first outvoted (`None`: never caught, or none).
    pub turncoat_caught_after: Option<u64>,
    /// Providers excluded by reputation at the end.
    pub excluded: u64,
}

/// A deterministic generator for simulations (splitmix64): the same seed, the same draws.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// Runs the simulation.
pub fn simulate_verification(sim: &VerifySim) -> VerifyReport {
    let mut rng = Rng(sim.seed);
    let mut names: Vec<String> = (0..sim.providers).map(|i| format!("p{i}")).collect();
    let turncoat = sim.turncoat_after.map(|_| {
        names.push("turncoat".to_string());
        names.len() - 1
    });
    // Who always cheats: a seeded choice among the regular providers.
    let mut order: Vec<usize> = (0..sim.providers).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i + 1);
        order.swap(i, j);
    }
    let n_cheat = (sim.providers as f64 * sim.cheaters).round() as usize;
    let cheater: HashSet<usize> = order.into_iter().take(n_cheat).collect();
    let mut v = Verifier::new(sim.config);
    let mut report = VerifyReport {
        tasks: sim.tasks,
        ..VerifyReport::default()
    };
    let mut turncoat_results = 0u64;
    let mut turncoat_cheats = 0u64;
    // The tasks whose accepted result is wrong now.
    let mut wrong_now: HashSet<u64> = HashSet::new();
    let mut queue: VecDeque<(u64, u32, bool)> = VecDeque::new();
    for t in 0..sim.tasks {
        queue.push_back((t, 0, false));
    }
    while let Some((task, _, again)) = queue.pop_front() {
        let mut need = if again {
            report.reverified += 1;
            v.reverify(task)
        } else {
            v.start(task, sim.mode)
        };
        let mut ran: HashSet<usize> = HashSet::new();
        if again {
            // The caught provider does not verify its own work.
            if let Some(tc) = turncoat {
                ran.insert(tc);
            }
        }
        let truth = format!("ok-{task}");
        while need > 0 {
            let candidates: Vec<usize> = (0..names.len())
                .filter(|i| !ran.contains(i) && v.eligible(&names[*i]))
                .collect();
            if candidates.is_empty() {
                report.failed += 1;
                break;
            }
            let who = candidates[rng.below(candidates.len())];
            ran.insert(who);
            need -= 1;
            report.runs += 1;
            let cheats = if Some(who) == turncoat {
                turncoat_results += 1;
                let c = sim
                    .turncoat_after
                    .is_some_and(|after| turncoat_results > after);
                if c {
                    turncoat_cheats += 1;
                }
                c
            } else {
                cheater.contains(&who)
            };
            let hash = if cheats {
                format!("bad-{task}-{who}")
            } else {
                truth.clone()
            };
            match v.report(task, &names[who], &hash) {
                Verdict::NeedMore { more } => need += more,
                Verdict::Accepted {
                    hash,
                    rejected,
                    reverify,
                    ..
                } => {
                    if hash != truth {
                        report.wrong_accepted += 1;
                        wrong_now.insert(task);
                    } else {
                        wrong_now.remove(&task);
                    }
                    if let Some(tc) = turncoat {
                        if rejected.iter().any(|r| *r == names[tc])
                            && report.turncoat_caught_after.is_none()
                            && turncoat_cheats > 0
                        {
                            report.turncoat_caught_after = Some(turncoat_cheats);
                        }
                    }
                    for t in reverify {
                        queue.push_back((t, 0, true));
                    }
                    v.forget(task);
                    break;
                }
                Verdict::Failed { .. } => {
                    report.failed += 1;
                    v.forget(task);
                    break;
                }
                Verdict::Late => break,
            }
        }
    }
    report.wrong_at_end = wrong_now.len() as u64;
    report.cost = report.runs as f64 / sim.tasks.max(1) as f64;
    report.excluded = names.iter().filter(|n| !v.eligible(n)).count() as u64;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(cheaters: f64, mode: VerifyMode, seed: u64) -> VerifySim {
        VerifySim {
            providers: 100,
            cheaters,
            turncoat_after: None,
            tasks: 10_000,
            mode,
            config: VerifyConfig {
                seed,
                ..VerifyConfig::default()
            },
            seed,
        }
    }

    #[test]
    fn with_a_tenth_of_providers_cheating_no_wrong_result_is_accepted() {
        for seed in [1, 2, 3] {
            let r = simulate_verification(&pool(0.10, VerifyMode::Adaptive, seed));
            assert_eq!(r.wrong_accepted, 0, "{r:?}");
            assert_eq!(r.failed, 0, "{r:?}");
            assert!(
                r.cost <= 1.25,
                "adaptive verification costs {:.3}× ({r:?})",
                r.cost
            );
            assert!(r.excluded >= 10, "the cheaters are excluded: {r:?}");
            let q = simulate_verification(&pool(0.10, VerifyMode::Quorum(2), seed));
            assert_eq!(q.wrong_accepted, 0, "{q:?}");
            assert!(q.cost >= 2.0, "{q:?}");
        }
    }

    #[test]
    fn verify_one_takes_whatever_comes() {
        let r = simulate_verification(&pool(0.10, VerifyMode::Quorum(1), 7));
        assert_eq!(r.cost, 1.0);
        assert!(r.wrong_accepted > 500, "{r:?}");
    }

    #[test]
    fn a_provider_that_turns_to_cheating_is_caught_and_its_work_reverified() {
        let trials = 300;
        let mut within_20 = 0;
        for seed in 0..trials {
            let sim = VerifySim {
                // Few providers, so that the turncoat reaches its 500 honest results soon.
                providers: 4,
                cheaters: 0.0,
                turncoat_after: Some(500),
                tasks: 3_000,
                mode: VerifyMode::Adaptive,
                config: VerifyConfig {
                    seed: seed * 7919 + 1,
                    ..VerifyConfig::default()
                },
                seed: seed + 11,
            };
            let r = simulate_verification(&sim);
            let caught = r.turncoat_caught_after.expect("caught");
            if caught <= 20 {
                within_20 += 1;
            }
            assert_eq!(r.wrong_at_end, 0, "its results were re-verified: {r:?}");
        }
        let p = within_20 as f64 / trials as f64;
        // The policy's spot rate (0.21) gives 1 − 0.79^20 = 0.991; 300 runs vary around it.
        assert!(p >= 0.97, "caught within 20 cheats in {p:.3} of runs");
    }
}
