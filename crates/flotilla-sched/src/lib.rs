//! flotilla-sched: where tasks run. Placement policies (eager, work stealing, random,
//! StarPU's dmda, HEFT), the cluster's placement of one task over live workers
//! ([`cluster::place`]: fit in each worker's ledger, variant by predicted finish, locality,
//! queueing; [`cluster::place_gang`] and [`cluster::chain`] for gangs and chained dispatch),
//! performance models learned from execution history, a static DAG format with the
//! HEFT planner, a discrete-event simulator that drives the same policies in virtual time,
//! and a tiled-Cholesky DAG generator.
//!
//! It is pure and deterministic: no filesystem, no network, no async, no clock (time is
//! passed in) and seeded randomness. The in-process runtime places with the policies, the
//! cluster coordinator with [`cluster`] (the coordinator keeps only the job state: the ready
//! queues, attempts, and applying each decision), and both learn from [`PerfModel`].
//!
//! Placing one task with dmda on a machine with a CPU and a GPU:
//!
//! ```
//! use flotilla_sched::{Decision, Dmda, InputView, Link, Load, PerfModel, Platform, Policy,
//!     TaskView, UnitKind};
//!
//! let mut platform = Platform::new();
//! let host = platform.add_node("host");
//! let gpu_mem = platform.add_node("cuda0");
//! let cpu = platform.add_unit(UnitKind::Cpu, host, "cpu");
//! let gpu = platform.add_unit(UnitKind::Cuda, gpu_mem, "cuda:NVIDIA H200");
//! platform.set_link(host, gpu_mem, Link { bandwidth: 25e9, latency: 10e-6 });
//!
//! let mut model = PerfModel::new();
//! for _ in 0..3 {
//!     model.record("gemm", "cpu", 1 << 20, 0.050);
//!     model.record("gemm", "cuda:NVIDIA H200", 1 << 20, 0.002);
//! }
//!
//! // One 8 MB input, valid in host memory only.
//! let inputs = [InputView { bytes: 8 << 20, valid_on: 1 << host.index() }];
//! let task = TaskView {
//!     codelet: "gemm",
//!     footprint: 1 << 20,
//!     priority: 0,
//!     can_run: &[true, true],
//!     inputs: &inputs,
//!     submitter: None,
//! };
//! let load = Load { now: 0.0, free_at: &[0.0, 0.0] };
//! // The GPU finishes at 0.34 ms of transfer + 2 ms, the CPU at 50 ms.
//! let decision = Dmda::new().place(&task, &platform, &load, &model);
//! assert_eq!(decision, Decision::Unit { unit: gpu, predicted: Some(0.002) });
//! # let _ = cpu;
//! ```

pub mod alloc;
pub mod cholesky;
pub mod cluster;
pub mod dag;
pub mod error;
pub mod heft;
pub mod model;
pub mod platform;
pub mod policy;
pub mod schedule;
pub mod sim;

pub use cholesky::{cholesky_dag, CholeskyPlatform, KernelCosts};
pub use dag::{parse_dag, Dag, DagEdge, DagSpec, DagTask, EdgeSpec, TaskSpec};
pub use error::{Result, SchedError, ScheduleViolation};
pub use heft::{heft, upward_ranks, HeftPlan};
pub use model::{ArchRatios, PerfModel, Prediction, Stats};
pub use platform::{Link, Platform, Unit, UnitKind};
pub use policy::{BuiltinPolicy, Decision, Dmda, InputView, Load, Policy, PolicyKind, TaskView};
pub use schedule::{Placement, Schedule};
pub use sim::{simulate, simulate_with};
