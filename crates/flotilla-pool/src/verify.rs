//! Verification of results from providers that are not trusted, and their reputation.
//!
//! `verify = k` is BOINC's quorum: a task runs on `k` distinct providers and its result is
//! accepted when `k` output hashes agree; when they disagree, more replicas run (on other
//! providers) until `k` agree or [`VerifyConfig::max_replicas`] have run.
//!
//! `verify = "adaptive"`: a task first runs once. A provider's result is replicated (one
//! more run elsewhere, accepted when the two agree) until the provider has a streak of
//! [`VerifyConfig::streak_to_trust`] agreements; from then on its results are accepted alone
//! except for spot checks, drawn at [`VerifyConfig::spot_rate`] per result. The moment a
//! provider disagrees with an accepted result it loses its streak (every result replicated
//! again) and every result it had accepted alone since its last check is returned for
//! re-verification. With spot rate `p` a provider that turns to cheating is caught within
//! `n` cheats with probability `1 − (1 − p)^n`: 0.21 catches it within 20 with ≥ 0.99.
//!
//! Reputation: accepted and rejected results per provider; its score is
//! `(accepted + 1) / (accepted + rejected + 2)`; below [`VerifyConfig::exclude_below`] (after
//! at least two results) it gets no more work.
//!
//! The spot-check draws are a hash of the task, the provider and a seed: the same inputs give
//! the same decisions, so the policy is replayable and simulated exactly.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// How a job's results are verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VerifyMode {
    /// `k` agreeing results from distinct providers (1: the result is taken as it comes).
    Quorum(u32),
    /// Replicated until a provider earns trust, then spot-checked.
    Adaptive,
}

/// The policy's knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerifyConfig {
    /// Agreements in a row before a provider's results are accepted alone.
    pub streak_to_trust: u32,
    /// The share of a trusted provider's results that are still replicated.
    pub spot_rate: f64,
    /// The most runs of one task before it fails for want of a quorum.
    pub max_replicas: u32,
    /// Providers whose score falls below this (after two results) get no work.
    pub exclude_below: f64,
    /// Seeds the spot-check draws.
    pub seed: u64,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            streak_to_trust: 5,
            spot_rate: 0.21,
            max_replicas: 8,
            exclude_below: 0.5,
            seed: 0x5eed,
        }
    }
}

/// A provider's record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reputation {
    /// Results accepted.
    pub accepted: u64,
    /// Results rejected (outvoted).
    pub rejected: u64,
    /// Agreements since its last rejection.
    pub streak: u32,
    /// Tasks whose result was accepted from it alone since its last check.
    pub unchecked: Vec<u64>,
}

impl Reputation {
    /// `(accepted + 1) / (accepted + rejected + 2)`.
    pub fn score(&self) -> f64 {
        (self.accepted as f64 + 1.0) / ((self.accepted + self.rejected) as f64 + 2.0)
    }
}

/// What a reported result leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The task's result is decided.
    Accepted {
        /// The accepted output hash.
        hash: String,
        /// Providers whose result agreed (paid).
        agreed: Vec<String>,
        /// Providers whose result disagreed (not paid; their reputation falls).
        rejected: Vec<String>,
        /// Tasks to verify again: those a rejected provider had been trusted with alone.
        reverify: Vec<u64>,
        /// Accepted from one trusted provider alone (adaptive), unchecked.
        alone: bool,
    },
    /// Run `more` replicas on providers other than those that ran it.
    NeedMore {
        /// How many.
        more: u32,
    },
    /// No quorum after the most replicas allowed.
    Failed {
        /// Why, for the task's message.
        why: String,
    },
    /// The report was for a task already decided (a late replica): nothing to do.
    Late,
}

/// The parts of an accepted verdict that [`Verifier::record`] applies.
#[derive(Clone, Copy, Debug)]
pub struct Accepted<'a> {
    /// Providers whose result agreed.
    pub agreed: &'a [String],
    /// Providers whose result disagreed.
    pub rejected: &'a [String],
    /// Accepted alone, unchecked.
    pub alone: bool,
}

/// One task being verified.
#[derive(Clone, Debug, Default)]
struct Pending {
    quorum: u32,
    /// Adaptive: the first result may be accepted alone.
    adaptive: bool,
    results: Vec<(String, String)>,
    decided: bool,
}

/// The verification state of a pool: pending tasks and every provider's reputation.
#[derive(Clone, Debug)]
pub struct Verifier {
    config: VerifyConfig,
    providers: BTreeMap<String, Reputation>,
    tasks: HashMap<u64, Pending>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Verifier {
    /// A verifier with `config`.
    pub fn new(config: VerifyConfig) -> Verifier {
        Verifier {
            config,
            providers: BTreeMap::new(),
            tasks: HashMap::new(),
        }
    }

    /// The knobs.
    pub fn config(&self) -> &VerifyConfig {
        &self.config
    }

    /// A provider's record (default when it has none yet).
    pub fn reputation(&self, provider: &str) -> Reputation {
        self.providers.get(provider).cloned().unwrap_or_default()
    }

    /// Every provider with a record.
    pub fn reputations(&self) -> impl Iterator<Item = (&String, &Reputation)> {
        self.providers.iter()
    }

    /// Whether `provider` may get work.
    pub fn eligible(&self, provider: &str) -> bool {
        self.providers
            .get(provider)
            .is_none_or(|r| r.accepted + r.rejected < 2 || r.score() >= self.config.exclude_below)
    }

    /// How many runs task `task` starts with under `mode`.
    pub fn start(&mut self, task: u64, mode: VerifyMode) -> u32 {
        let (quorum, adaptive) = match mode {
            VerifyMode::Quorum(k) => (k.max(1), false),
            VerifyMode::Adaptive => (1, true),
        };
        self.tasks.insert(
            task,
            Pending {
                quorum,
                adaptive,
                results: Vec::new(),
                decided: false,
            },
        );
        quorum
    }

    /// Task `task` is verified again from scratch (its provider was caught cheating after
    /// it had been trusted with it alone): two agreeing results from providers other than
    /// the caught one (the caller places them so). Returns the runs to start.
    pub fn reverify(&mut self, task: u64) -> u32 {
        self.start(task, VerifyMode::Quorum(2))
    }

    /// Whether a draw for `task` run by `provider` says "spot-check".
    fn spot(&self, task: u64, provider: &str) -> bool {
        let x = splitmix(self.config.seed ^ splitmix(task) ^ name_hash(provider));
        ((x >> 11) as f64 / (1u64 << 53) as f64) < self.config.spot_rate
    }

    /// `provider` reports `hash` as task `task`'s output.
    pub fn report(&mut self, task: u64, provider: &str, hash: &str) -> Verdict {
        let Some(p) = self.tasks.get_mut(&task) else {
            return Verdict::Late;
        };
        if p.decided {
            return Verdict::Late;
        }
        if p.results.iter().any(|(who, _)| who == provider) {
            // One vote per provider: a duplicate report changes nothing.
            return Verdict::NeedMore { more: 0 };
        }
        p.results.push((provider.to_string(), hash.to_string()));
        let (adaptive, quorum) = (p.adaptive, p.quorum);
        let results = p.results.clone();
        let mut verdict = self.judge(task, adaptive, quorum, &results);
        if let Verdict::Accepted {
            agreed,
            rejected,
            reverify,
            alone,
            ..
        } = &mut verdict
        {
            *reverify = self.record(
                task,
                &Accepted {
                    agreed,
                    rejected,
                    alone: *alone,
                },
            );
        }
        match &verdict {
            Verdict::Accepted { .. } | Verdict::Failed { .. } => {
                if let Some(p) = self.tasks.get_mut(&task) {
                    p.decided = true;
                }
            }
            Verdict::NeedMore { .. } | Verdict::Late => {}
        }
        verdict
    }

    /// What task `task`'s `results` so far (provider, output hash; one per provider, in the
    /// order they came) decide under `verify = quorum` or, with `adaptive`, adaptive
    /// replication: nothing changes. [`Verifier::record`] then applies an accepted
    /// verdict's effects on reputations. The coordinator keeps the results of its tasks
    /// itself and journals the verdicts, so a replay applies the same ones.
    pub fn judge(
        &self,
        task: u64,
        adaptive: bool,
        quorum: u32,
        results: &[(String, String)],
    ) -> Verdict {
        let Some((first, first_hash)) = results.first() else {
            return Verdict::NeedMore {
                more: if adaptive { 1 } else { quorum.max(1) },
            };
        };
        if adaptive && results.len() == 1 {
            // Alone if its provider is trusted and not drawn for a check; otherwise a second,
            // agreeing result is needed.
            let trusted = self
                .providers
                .get(first)
                .is_some_and(|r| r.streak >= self.config.streak_to_trust);
            if trusted && !self.spot(task, first) {
                return Verdict::Accepted {
                    hash: first_hash.clone(),
                    agreed: vec![first.clone()],
                    rejected: Vec::new(),
                    reverify: Vec::new(),
                    alone: true,
                };
            }
            return Verdict::NeedMore { more: 1 };
        }
        let quorum = if adaptive { 2 } else { quorum.max(1) };
        let mut votes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (who, h) in results {
            votes.entry(h.as_str()).or_default().push(who.as_str());
        }
        let best = votes
            .iter()
            .max_by_key(|(_, v)| v.len())
            .map(|(h, v)| (h.to_string(), v.len()));
        let Some((hash, n)) = best else {
            return Verdict::NeedMore { more: quorum };
        };
        if (n as u32) < quorum {
            if results.len() as u32 >= self.config.max_replicas {
                return Verdict::Failed {
                    why: format!(
                        "no {quorum} agreeing results after {} runs ({} different outputs)",
                        results.len(),
                        votes.len()
                    ),
                };
            }
            return Verdict::NeedMore {
                more: quorum - n as u32,
            };
        }
        let mut agreed = Vec::new();
        let mut rejected = Vec::new();
        for (who, h) in results {
            if *h == hash {
                agreed.push(who.clone());
            } else {
                rejected.push(who.clone());
            }
        }
        Verdict::Accepted {
            hash,
            agreed,
            rejected,
            reverify: Vec::new(),
            alone: false,
        }
    }

    /// Applies an accepted verdict on task `task` to the providers' reputations and returns
    /// the tasks to verify again (those a rejected provider had been trusted with alone).
    /// Agreeing providers gain an acceptance (and, when checked, a step of their streak,
    /// which also clears what they did alone: it stands); rejected ones lose their streak.
    pub fn record(&mut self, task: u64, verdict: &Accepted<'_>) -> Vec<u64> {
        for who in verdict.agreed {
            let r = self.providers.entry(who.clone()).or_default();
            r.accepted += 1;
            if verdict.alone {
                r.unchecked.push(task);
            } else {
                r.streak = r.streak.saturating_add(1);
                r.unchecked.clear();
            }
        }
        let mut reverify = Vec::new();
        for who in verdict.rejected {
            let r = self.providers.entry(who.clone()).or_default();
            r.rejected += 1;
            r.streak = 0;
            reverify.append(&mut r.unchecked);
        }
        reverify
    }

    /// Replaces every provider's record (a journal checkpoint read back).
    pub fn restore(&mut self, providers: impl IntoIterator<Item = (String, Reputation)>) {
        self.providers = providers.into_iter().collect();
    }

    /// Forgets a decided task (its reputation effects stay).
    pub fn forget(&mut self, task: u64) {
        self.tasks.remove(&task);
    }
}
