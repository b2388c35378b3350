//! The data-parallel SGD loop.
//!
//! Step `s` (1-based) takes global batch `s - 1` of the seeded sample order; rank `r` of `n`
//! takes the contiguous slice `r * b/n .. (r + 1) * b/n` of it, sums the per-sample
//! gradients and losses of its slice into one buffer `[grad.., loss]`, and one allreduce
//! adds the ranks' buffers. Every rank then applies the same update `params -= lr * sum / b`,
//! so parameters stay identical everywhere without ever being sent.
//!
//! A run is a pure function of the seed and the step: the initial parameters come from the
//! seed, and the sample order of any step can be computed from it directly. A checkpoint of
//! step `c` therefore lets a restarted gang replay steps `c + 1 ..` exactly.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::checkpoint::{Checkpoint, CheckpointDir};
use crate::data::Dataset;
use crate::error::{Result, TrainError};
use crate::gradient::{Gradient, OnHost};
use crate::model::{Mlp, PARAMS};
use crate::reducer::Reducer;
use crate::rng::Sampler;

/// How to train.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Total number of SGD steps of the run (including those of earlier attempts).
    pub steps: u64,
    /// Global batch size, split evenly across the ranks.
    pub batch: usize,
    /// Learning rate.
    pub lr: f32,
    /// Seed of the initial parameters and of the sample order.
    pub seed: u64,
    /// The checkpoint folder, or `None` to neither load nor write checkpoints.
    pub checkpoint_dir: Option<PathBuf>,
    /// Rank 0 writes a checkpoint after every `checkpoint_every` steps and after the last
    /// one (0: only after the last one).
    pub checkpoint_every: u64,
    /// For recovery tests: stop with [`Outcome::FailedOnPurpose`] right after step `s` (and
    /// its checkpoint) unless the run started from a checkpoint at or after `s`.
    pub fail_at_step: Option<u64>,
    /// Sleep after every step (lets a test kill a rank mid-run).
    pub step_delay: Duration,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 200,
            batch: 64,
            lr: 0.5,
            seed: 1,
            checkpoint_dir: None,
            checkpoint_every: 0,
            fail_at_step: None,
            step_delay: Duration::ZERO,
        }
    }
}

/// Progress reported while training.
#[derive(Debug)]
pub enum Event<'a> {
    /// The run continues from a checkpoint.
    Resumed {
        /// The checkpoint's step.
        step: u64,
        /// Its file.
        path: &'a Path,
    },
    /// A damaged checkpoint file was passed over.
    SkippedCheckpoint(&'a TrainError),
    /// Step `step` is done; `loss` is the mean loss of its global batch before the update.
    Step {
        /// The step, 1-based.
        step: u64,
        /// Mean cross-entropy over the global batch.
        loss: f32,
    },
    /// Rank 0 wrote a checkpoint.
    Checkpointed {
        /// The step it holds.
        step: u64,
        /// Its file.
        path: &'a Path,
    },
}

/// The state at the end of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Steps done.
    pub step: u64,
    /// Mean cross-entropy over the whole training set.
    pub train_loss: f32,
    /// Fraction of the test set classified correctly.
    pub test_accuracy: f64,
    /// The final parameters.
    pub model: Mlp,
}

impl Summary {
    /// CRC-32 of the final parameters' bytes: equal runs have equal checksums.
    pub fn params_crc32(&self) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        for p in self.model.params() {
            hasher.update(&p.to_le_bytes());
        }
        hasher.finalize()
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// All steps done.
    Finished(Summary),
    /// Stopped on purpose by [`TrainConfig::fail_at_step`].
    FailedOnPurpose {
        /// The last step done (and checkpointed).
        step: u64,
    },
}

/// Runs (or resumes) data-parallel training on `train`, evaluating on `test` at the end;
/// gradients are computed on the host ([`OnHost`]).
pub fn train<R: Reducer>(
    config: &TrainConfig,
    train: &Dataset,
    test: &Dataset,
    reducer: &mut R,
    on_event: impl FnMut(Event<'_>),
) -> Result<Outcome> {
    train_with(config, train, test, reducer, &mut OnHost, on_event)
}

/// [`train`] with this rank's gradients computed by `gradient` (on a device:
/// [`OnDevice`](crate::OnDevice)).
pub fn train_with<R: Reducer, G: Gradient>(
    config: &TrainConfig,
    train: &Dataset,
    test: &Dataset,
    reducer: &mut R,
    gradient: &mut G,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Outcome> {
    let (rank, size) = (reducer.rank(), reducer.size());
    let batch = config.batch;
    if size == 0 || batch == 0 || !batch.is_multiple_of(size) {
        return Err(TrainError::Config(format!(
            "global batch {batch} is not a positive multiple of the world size {size}"
        )));
    }
    if batch > train.len() {
        return Err(TrainError::Config(format!(
            "global batch {batch} is larger than the {} training samples",
            train.len()
        )));
    }
    if !(config.lr.is_finite() && config.lr > 0.0) {
        return Err(TrainError::Config(format!(
            "learning rate {} is not a positive number",
            config.lr
        )));
    }
    let fingerprint = train.fingerprint();
    let checkpoints = config
        .checkpoint_dir
        .as_ref()
        .map(|dir| CheckpointDir::new(dir, 3));

    let mut model = Mlp::init(config.seed);
    let mut sampler = Sampler::new(config.seed, train.len(), batch);
    let mut start = 0u64;
    if let Some(latest) = checkpoints
        .as_ref()
        .map(CheckpointDir::latest)
        .transpose()?
        .flatten()
    {
        for skipped in &latest.skipped {
            on_event(Event::SkippedCheckpoint(skipped));
        }
        let c = &latest.checkpoint;
        let mismatch = |what: &str, theirs: String, ours: String| TrainError::Checkpoint {
            path: latest.path.clone(),
            message: format!("written by a run with {what} {theirs}, this run has {ours}"),
        };
        if c.seed != config.seed {
            return Err(mismatch(
                "seed",
                c.seed.to_string(),
                config.seed.to_string(),
            ));
        }
        if c.batch != batch as u64 {
            return Err(mismatch("batch", c.batch.to_string(), batch.to_string()));
        }
        if c.lr.to_bits() != config.lr.to_bits() {
            return Err(mismatch(
                "learning rate",
                c.lr.to_string(),
                config.lr.to_string(),
            ));
        }
        if c.data_fingerprint != fingerprint {
            return Err(mismatch(
                "training data crc32",
                format!("{:08x}", c.data_fingerprint),
                format!("{fingerprint:08x}"),
            ));
        }
        if c.sampler != Sampler::state_at(config.seed, train.len(), batch, c.step) {
            return Err(TrainError::Checkpoint {
                path: latest.path.clone(),
                message: format!("sampler state does not belong to step {}", c.step),
            });
        }
        model = Mlp::from_params(c.params.clone()).ok_or_else(|| TrainError::Checkpoint {
            path: latest.path.clone(),
            message: format!("{} parameters, the model has {PARAMS}", c.params.len()),
        })?;
        sampler = Sampler::restore(c.sampler.clone(), train.len(), batch);
        start = c.step;
        on_event(Event::Resumed {
            step: start,
            path: &latest.path,
        });
    }
    // Decided before this rank's first collective: rank 0 cannot write the checkpoint of the
    // failure step before every rank has joined that step's allreduce, so all ranks decide
    // alike.
    let fail_at = config
        .fail_at_step
        .filter(|s| *s > start && *s <= config.steps);

    let mut params_crc = crc32fast::Hasher::new();
    for p in model.params() {
        params_crc.update(&p.to_le_bytes());
    }
    let shared = [
        start as i64,
        i64::from(params_crc.finalize()),
        i64::from(fingerprint),
        config.seed as i64,
        batch as i64,
        config.steps as i64,
        i64::from(config.lr.to_bits()),
        fail_at.map_or(-1, |s| s as i64),
    ];
    let agreed = reducer.agree(&shared).map_err(|source| TrainError::Comm {
        step: start,
        source,
    })?;
    if !agreed {
        return Err(TrainError::Disagreement(
            "the resume step, parameters, data or settings (check --checkpoint-dir, --data and the flags of every rank)",
        ));
    }

    let per_rank = batch / size;
    let mut buf = vec![0.0f32; PARAMS + 1];
    for step in start + 1..=config.steps {
        let global = sampler.next_batch();
        let mine = &global[rank * per_rank..(rank + 1) * per_rank];
        buf.fill(0.0);
        let loss_sum = gradient
            .accumulate(&model, train, mine, &mut buf[..PARAMS])
            .map_err(|source| TrainError::Device { step, source })?;
        buf[PARAMS] = loss_sum;
        reducer
            .allreduce_sum(&mut buf)
            .map_err(|source| TrainError::Comm { step, source })?;
        model.apply(&buf[..PARAMS], batch, config.lr);
        on_event(Event::Step {
            step,
            loss: buf[PARAMS] / batch as f32,
        });
        let failing = fail_at == Some(step);
        let periodic = config.checkpoint_every > 0 && step % config.checkpoint_every == 0;
        if rank == 0 && (periodic || failing || step == config.steps) {
            if let Some(dir) = &checkpoints {
                let checkpoint = Checkpoint {
                    step,
                    seed: config.seed,
                    batch: batch as u64,
                    lr: config.lr,
                    data_fingerprint: fingerprint,
                    sampler: sampler.state().clone(),
                    params: model.params().to_vec(),
                };
                let path = dir.save(&checkpoint)?;
                on_event(Event::Checkpointed { step, path: &path });
            }
        }
        if failing {
            return Ok(Outcome::FailedOnPurpose { step });
        }
        if !config.step_delay.is_zero() {
            std::thread::sleep(config.step_delay);
        }
    }
    Ok(Outcome::Finished(Summary {
        step: config.steps.max(start),
        train_loss: model.mean_loss(train),
        test_accuracy: model.accuracy(test),
        model,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reducer::Local;
    use flotilla_collective::CommError;
    use std::sync::{Arc, Barrier, Mutex};

    /// In-process ranks on threads; sums in rank order like `deterministic: true`.
    struct ThreadReducer {
        rank: usize,
        size: usize,
        shared: Arc<Shared>,
    }

    /// What the threads of a gang share: a barrier and one slot per rank.
    struct Shared {
        barrier: Barrier,
        floats: Mutex<Vec<Vec<f32>>>,
        ints: Mutex<Vec<Vec<i64>>>,
    }

    fn gang(size: usize) -> Vec<ThreadReducer> {
        let shared = Arc::new(Shared {
            barrier: Barrier::new(size),
            floats: Mutex::new(vec![Vec::new(); size]),
            ints: Mutex::new(vec![Vec::new(); size]),
        });
        (0..size)
            .map(|rank| ThreadReducer {
                rank,
                size,
                shared: shared.clone(),
            })
            .collect()
    }

    impl Reducer for ThreadReducer {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn allreduce_sum(&mut self, buf: &mut [f32]) -> std::result::Result<(), CommError> {
            let (barrier, slots) = (&self.shared.barrier, &self.shared.floats);
            slots.lock().unwrap()[self.rank] = buf.to_vec();
            barrier.wait();
            buf.fill(0.0);
            for slot in slots.lock().unwrap().iter() {
                for (b, x) in buf.iter_mut().zip(slot) {
                    *b += x;
                }
            }
            barrier.wait();
            Ok(())
        }
        fn agree(&mut self, values: &[i64]) -> std::result::Result<bool, CommError> {
            let (barrier, slots) = (&self.shared.barrier, &self.shared.ints);
            slots.lock().unwrap()[self.rank] = values.to_vec();
            barrier.wait();
            let same = slots.lock().unwrap().iter().all(|v| v == values);
            barrier.wait();
            Ok(same)
        }
    }

    fn digits() -> (Dataset, Dataset) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv");
        Dataset::load(&path).unwrap().split(1500).unwrap()
    }

    /// Runs `config` on `size` threads; returns rank 0's losses and outcome.
    fn run_gang(config: &TrainConfig, size: usize) -> (Vec<f32>, Outcome) {
        let (train_set, test_set) = digits();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = gang(size)
                .into_iter()
                .map(|mut reducer| {
                    let (train_set, test_set) = (&train_set, &test_set);
                    s.spawn(move || {
                        let mut losses = Vec::new();
                        let outcome = train(config, train_set, test_set, &mut reducer, |e| {
                            if let Event::Step { loss, .. } = e {
                                losses.push(loss);
                            }
                        })
                        .unwrap();
                        (losses, outcome)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for other in &results[1..] {
            assert_eq!(other, &results[0], "ranks ended differently");
        }
        results.into_iter().next().unwrap()
    }

    fn finished(outcome: Outcome) -> Summary {
        match outcome {
            Outcome::Finished(summary) => summary,
            other => panic!("expected a finished run, got {other:?}"),
        }
    }

    #[test]
    fn training_reduces_the_loss_and_classifies_the_test_set() {
        let config = TrainConfig {
            steps: 150,
            ..TrainConfig::default()
        };
        let (losses, outcome) = run_gang(&config, 1);
        let summary = finished(outcome);
        let first = losses[0];
        let last: f32 = losses[losses.len() - 10..].iter().sum::<f32>() / 10.0;
        assert!(first > 2.0, "initial loss {first} should be near ln 10");
        assert!(last < 0.35 * first, "loss went from {first} to {last}");
        assert!(summary.test_accuracy > 0.85, "{}", summary.test_accuracy);
    }

    #[test]
    fn gangs_of_any_size_follow_the_same_trajectory() {
        let config = TrainConfig {
            steps: 60,
            ..TrainConfig::default()
        };
        let (reference, _) = run_gang(&config, 1);
        for size in [2, 4, 8] {
            let (losses, _) = run_gang(&config, size);
            for (step, (a, b)) in losses.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs(),
                    "{size} ranks, step {step}: {a} vs {b}"
                );
            }
            let (again, _) = run_gang(&config, size);
            assert_eq!(again, losses, "{size} ranks: not reproducible");
        }
    }

    #[test]
    fn an_indivisible_batch_is_rejected_before_training() {
        let config = TrainConfig {
            batch: 64,
            ..TrainConfig::default()
        };
        let (train_set, test_set) = digits();
        let mut reducers = gang(3);
        let err = train(&config, &train_set, &test_set, &mut reducers[0], |_| {}).unwrap_err();
        assert!(
            err.to_string()
                .contains("not a positive multiple of the world size 3"),
            "{err}"
        );
    }

    #[test]
    fn resuming_from_a_checkpoint_replays_the_same_steps() {
        let dir = tempfile::tempdir().unwrap();
        let base = TrainConfig {
            steps: 50,
            checkpoint_every: 20,
            ..TrainConfig::default()
        };
        let (reference, outcome) = run_gang(&base, 1);
        let reference_summary = finished(outcome);

        let config = TrainConfig {
            checkpoint_dir: Some(dir.path().to_path_buf()),
            fail_at_step: Some(30),
            ..base.clone()
        };
        let (first, outcome) = run_gang(&config, 2);
        assert_eq!(outcome, Outcome::FailedOnPurpose { step: 30 });
        assert_eq!(first.len(), 30);
        // The second attempt finds the checkpoint of step 30, so it does not fail again.
        let (second, outcome) = run_gang(&config, 2);
        assert_eq!(second.len(), 20);
        let summary = finished(outcome);
        let mut all = first;
        all.extend(second);
        for (a, b) in all.iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-5 * b.abs());
        }
        // Same world size, resumed or not: bitwise equal.
        let fresh = TrainConfig {
            checkpoint_dir: None,
            ..base.clone()
        };
        let (uninterrupted, outcome) = run_gang(&fresh, 2);
        assert_eq!(all, uninterrupted);
        assert_eq!(finished(outcome).params_crc32(), summary.params_crc32());
        assert!((summary.train_loss - reference_summary.train_loss).abs() < 1e-4);
        // A finished run's final checkpoint makes a rerun a no-op with the same result.
        let (none, outcome) = run_gang(&config, 1);
        assert!(none.is_empty());
        assert_eq!(finished(outcome).params_crc32(), summary.params_crc32());
    }

    #[test]
    fn a_checkpoint_of_another_run_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = TrainConfig {
            steps: 3,
            checkpoint_dir: Some(dir.path().to_path_buf()),
            ..TrainConfig::default()
        };
        let (train_set, test_set) = digits();
        train(&config, &train_set, &test_set, &mut Local, |_| {}).unwrap();
        let other = TrainConfig { seed: 2, ..config };
        let err = train(&other, &train_set, &test_set, &mut Local, |_| {}).unwrap_err();
        assert!(err.to_string().contains("seed 1, this run has 2"), "{err}");
    }

    #[test]
    fn ranks_with_different_checkpoints_refuse_to_train() {
        let dir = tempfile::tempdir().unwrap();
        let (train_set, test_set) = digits();
        let with_ckpt = TrainConfig {
            steps: 4,
            checkpoint_dir: Some(dir.path().to_path_buf()),
            ..TrainConfig::default()
        };
        train(&with_ckpt, &train_set, &test_set, &mut Local, |_| {}).unwrap();
        let without = TrainConfig {
            steps: 4,
            ..TrainConfig::default()
        };
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = gang(2)
                .into_iter()
                .map(|mut reducer| {
                    let config = if reducer.rank == 0 {
                        &with_ckpt
                    } else {
                        &without
                    };
                    let (train_set, test_set) = (&train_set, &test_set);
                    s.spawn(move || {
                        train(config, train_set, test_set, &mut reducer, |_| {})
                            .unwrap_err()
                            .to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            errors.iter().all(|e| e.contains("ranks disagree")),
            "{errors:?}"
        );
    }
}
