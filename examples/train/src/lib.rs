//! Data-parallel training of a small neural network on the digits data set, the example of
//! issue 5: every rank of a gang computes the gradient of its slice of each global batch and
//! one allreduce of [`flotilla_collective`] sums them, so all ranks take the same SGD step.
//!
//! The model ([`Mlp`]: 64 -> 32 tanh -> 10 softmax) and the loop ([`train`]) are written
//! against the [`Reducer`] trait, implemented by a real
//! [`flotilla_collective::Communicator`] and by [`Local`] for a single process, so the math
//! is tested without a network. Checkpoints ([`CheckpointDir`]) let a restarted gang continue
//! bit for bit where it stopped.
//!
//! ```
//! use flotilla_train::{train, Dataset, Local, Outcome, TrainConfig};
//! # fn main() -> flotilla_train::Result<()> {
//! let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv");
//! let (train_set, test_set) = Dataset::load(&path)?.split(1500)?;
//! let config = TrainConfig { steps: 20, ..TrainConfig::default() };
//! let outcome = train(&config, &train_set, &test_set, &mut Local, |_| {})?;
//! assert!(matches!(outcome, Outcome::Finished(_)));
//! # Ok(())
//! # }
//! ```

pub mod checkpoint;
pub mod data;
pub mod error;
pub mod gradient;
pub mod model;
pub mod reducer;
pub mod rng;
pub mod trainer;

pub use checkpoint::{Checkpoint, CheckpointDir, Latest};
pub use data::Dataset;
pub use error::{Result, TrainError};
pub use gradient::{Gradient, OnDevice, OnHost};
pub use model::Mlp;
pub use reducer::{Local, Reducer};
pub use trainer::{train, train_with, Event, Outcome, Summary, TrainConfig};

/// Samples of the digits file used for training; the rest are the test set.
pub const TRAIN_SAMPLES: usize = 1500;
