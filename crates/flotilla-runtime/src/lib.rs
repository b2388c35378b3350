//! flotilla-runtime: Flotilla's in-process engine, StarPU's sequential task flow in Rust.
//!
//! Register data, submit tasks that name the data they read and write, and the runtime
//! derives the task graph (RAW, WAR, WAW), moves data between memory nodes (host, each
//! OpenCL device, each CUDA GPU) with MSI coherence, overlaps transfers with compute, and
//! runs each task where the placement policy (from `flotilla-sched`) expects it to finish
//! first. CPU workers steal work from each other; a plain closure API (`spawn`, `scope`,
//! `parallel_for`) shares the same workers.
//!
//! It is separate from `flotilla-sched` (pure policies) and `flotilla-devices` (backends)
//! so each can be tested alone, and from the cluster so one process needs no network.
//!
//! ```
//! use std::sync::Arc;
//! use flotilla_runtime::{Codelet, Runtime};
//!
//! let rt = Runtime::builder().cpus(2).model_path(None).build()?;
//! let x = rt.register(vec![1.0f64; 1000]);
//! let scale = Arc::new(Codelet::new("scale").cpu(|ctx| {
//!     ctx.data_mut::<f64>(0).iter_mut().for_each(|v| *v *= 2.0);
//!     Ok(())
//! }));
//! for _ in 0..3 {
//!     rt.task(&scale).rw(&x).submit()?;
//! }
//! assert_eq!(rt.unregister(x)?, vec![8.0; 1000]);
//! # Ok::<(), flotilla_runtime::RuntimeError>(())
//! ```
#![deny(missing_docs)]

mod data;
mod device;
mod error;
mod job;
pub mod linalg;
mod place;
mod registry;
mod runtime;
mod scope;
mod sleep;
mod sync;
mod task;
mod topo;
mod trace;
mod worker;

pub use data::{Access, Data, Msi, TransferStats, PIN_MIN_BYTES};
pub use error::{Result, RuntimeError};
pub use flotilla_devices::{DeviceKind, MathMode};
pub use flotilla_sched::PolicyKind;
pub use runtime::{DeviceSelection, Runtime, RuntimeBuilder, UnitInfo};
pub use scope::{Schedule, Scope};
pub use task::{Codelet, FootprintFn, ImplFn, TaskBuilder, TaskContext, TaskError, TaskHandle};
