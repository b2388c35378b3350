//! Flotilla: one parallel, heterogeneous computer from one machine, a rack or a shared
//! pool of machines.
//!
//! This crate is the facade: it re-exports the layers (the job model, the scheduler, the
//! in-process runtime and the device backends) and holds the benchmarks behind
//! `flotilla bench`. The `flotilla` binary is a thin command line over it.
//!
//! ```
//! use std::sync::Arc;
//! use flotilla::runtime::{Codelet, Runtime};
//!
//! let rt = Runtime::builder().cpus(2).model_path(None).build()?;
//! let v = rt.register((0..1000u32).collect::<Vec<_>>());
//! let sum = rt.register(vec![0u64]);
//! let add = Arc::new(Codelet::new("sum").cpu(|ctx| {
//!     let s: u64 = ctx.data::<u32>(0).iter().map(|&x| x as u64).sum();
//!     ctx.data_mut::<u64>(1)[0] = s;
//!     Ok(())
//! }));
//! rt.task(&add).read(&v).write(&sum).submit()?;
//! assert_eq!(rt.unregister(sum)?, vec![499_500]);
//! # Ok::<(), flotilla::runtime::RuntimeError>(())
//! ```
#![deny(missing_docs)]

pub mod bench;
pub mod device_collective;
pub mod devices_report;

/// The cluster: coordinator, workers, protocol, client API.
pub use flotilla_cluster as cluster;
/// Collectives (allreduce, allgather, broadcast, ...) over TCP and shared memory.
pub use flotilla_collective as collective;
/// The job model: ids, resources, job files (parse, validate, expand).
pub use flotilla_core as core;
/// Device backends (cpu, opencl, cuda) and the kernel library.
pub use flotilla_devices as devices;
/// Running a task: processes (sandboxes, cgroups, limits) and WASM modules.
pub use flotilla_exec as exec;
/// Compute sharing, pure parts: credits, prices, the ledger, verification.
pub use flotilla_pool as pool;
/// The in-process runtime.
pub use flotilla_runtime as runtime;
/// Placement policies, performance models and the simulator.
pub use flotilla_sched as sched;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// docs/library.md's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryDoctests;

/// How a worker started by this process starts its task guard (`flotilla_exec::Guard`): this
/// binary's hidden `worker-guard` subcommand, when this process is the `flotilla` binary
/// (not, say, a test harness linking the library).
pub fn guard_command() -> Option<Vec<String>> {
    let exe = std::env::current_exe().ok()?;
    (exe.file_name()? == "flotilla").then(|| vec![exe.display().to_string(), "worker-guard".into()])
}

/// The `flotilla-enter` program installed beside this binary (`FLOTILLA_ENTER` overrides),
/// with which a worker's sandboxed tasks enter its sandbox holder.
pub fn enter_program() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("FLOTILLA_ENTER") {
        return Some(p.into());
    }
    let p = std::env::current_exe()
        .ok()?
        .with_file_name("flotilla-enter");
    p.is_file().then_some(p)
}
