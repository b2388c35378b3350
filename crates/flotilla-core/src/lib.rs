//! flotilla-core: Flotilla's vocabulary: ids, resources, job and task specs (parse,
//! validate, expand arrays) and errors.
//!
//! It is pure: no I/O beyond parsing a string (save [`host`], which reads the host name and
//! `FLOTILLA_HOME`), no async, so every other crate (the
//! scheduler, the runtime, the coordinator) can share it and test against it
//! deterministically.
//!
//! A job file (TOML, version 1) becomes a [`JobSpec`] with [`parse_job`], which checks it
//! whole (unknown keys, types, ranges, dependencies, cycles) and reports errors with file,
//! line and field. [`JobSpec::expand`] turns it into a [`TaskGraph`] of instances.
//!
//! ```
//! use flotilla_core::{parse_job, TaskKind};
//!
//! let text = r#"
//! [[task]]
//! id = "tile"
//! array = "0..4"
//! cmd = ["./mandel", "--tile", "{i}"]
//! resources = { cpus = 1, mem = "256MiB" }
//!
//! [[task]]
//! id = "stitch"
//! after = ["tile"]
//! cmd = ["./stitch"]
//! "#;
//! let job = parse_job(text, "examples/mandelbrot.toml")?;
//! assert_eq!(job.name, "mandelbrot");
//!
//! let graph = job.expand()?;
//! assert_eq!(graph.len(), 5);
//! let stitch = graph.by_name("stitch").unwrap();
//! assert_eq!(graph.preds(stitch).len(), 4);
//! let tile2 = graph.task(graph.by_name("tile[2]").unwrap());
//! assert!(matches!(&tile2.kind, TaskKind::Command { cmd, .. } if cmd[2] == "2"));
//! assert_eq!(tile2.resources.mem, 256 << 20);
//!
//! let err = parse_job("[[task]]\nid = \"a\"\ncmd = [\"x\"]\nafter = [\"b\"]\n", "job.toml")
//!     .unwrap_err();
//! assert_eq!(err.to_string(), r#"job.toml:4: task "a": field "after": no task named "b""#);
//! # Ok::<(), flotilla_core::CoreError>(())
//! ```

pub mod duration;
pub mod error;
pub mod graph;
pub mod host;
pub mod ids;
pub mod job;
pub mod ledger;
pub mod lint;
mod parse;
pub mod pool;
pub mod resources;
pub mod size;
pub mod source;
pub mod validate;

pub use error::{CoreError, JobError, Pos, Problem, Result};
pub use graph::{GangMember, TaskGraph, TaskInstance, TaskKind, VariantInstance, WasmInstance};
pub use ids::{DataId, JobId, MemNodeId, TaskId, UnitId, WorkerId};
pub use job::{
    Defaults, Dependency, Group, JobSpec, Staging, TaskBody, TaskSpec, VariantSpec, WasmSpec,
};
pub use ledger::Ledger;
pub use parse::parse_job;
pub use pool::{MaxPrice, Objective, PoolSpec, Trust, Verify};
pub use resources::{ResourceRequest, Resources, NETWORK};
pub use source::SourceMap;
