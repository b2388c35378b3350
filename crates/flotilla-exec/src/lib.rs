//! Flotilla's executor for one task attempt on the local machine.
//!
//! A worker agent hands each attempt to this crate from a thread of its own and gets back an
//! [`Outcome`]: how the attempt ended ([`Termination`]) and what it used ([`Usage`]). Two kinds
//! of attempt exist:
//!
//! - a **process** ([`run_process`]): its own process group, environment and working folder,
//!   stdout/stderr to files, rlimits, a cgroup v2 where one is available
//!   ([`cgroup_available`]), a timeout enforced with SIGTERM then SIGKILL on the whole group;
//! - a **WASM module** ([`WasmRunner`], feature `wasm`, on by default): WASI preview 1 under
//!   wasmtime with the job folder preopened, fuel and memory limits, and a timeout.
//!
//! It is separate from the worker so that the parts that touch the operating system (fork,
//! signals, cgroups, a JIT) sit behind a small blocking API with no async runtime, and can be
//! tested on their own. Any attempt can be stopped from another thread with a
//! [`CancelHandle`].
//!
//! ```
//! use flotilla_exec::{run_process, CancelHandle, ProcessSpec, Termination};
//! use std::time::Duration;
//!
//! let mut spec = ProcessSpec::new(["sh", "-c", "exit 3"], std::env::temp_dir());
//! spec.env.push(("FLOTILLA_TASK".into(), "tile[3]".into()));
//! spec.timeout = Some(Duration::from_secs(10));
//! let outcome = run_process(&spec, &CancelHandle::new())?;
//! assert_eq!(outcome.termination, Termination::Exited(3));
//! assert_eq!(outcome.describe(), "exited with code 3");
//! # Ok::<(), flotilla_exec::Error>(())
//! ```

mod cancel;
mod cgroup;
mod error;
mod guard;
#[cfg(feature = "wasm")]
mod lazy_output;
mod outcome;
mod output;
mod process;
mod reaper;
pub mod sandbox;
#[cfg(feature = "wasm")]
mod wasm;
#[cfg(not(feature = "wasm"))]
mod wasm_off;
mod wasm_spec;

pub use cancel::CancelHandle;
pub use cgroup::{
    cgroup_available, cleanup_cgroups, cleanup_stale_cgroups, drain_cgroup_pool, hierarchy,
    is_cgroup2, remove_cgroup_tree, remove_empty_stale_cgroups, CgroupSpec, Controller, Hierarchy,
    CGROUP_ROOT,
};
pub use error::{Error, Result};
pub use guard::{guard_main, Guard, GUARD_VAR};
pub use outcome::{Outcome, Termination, Usage};
pub use output::Output;
pub use process::{
    host_vars, note_inherited_ignores, run_process, run_process_guarded, GangEnv, Limits,
    ProcessSpec, TaskEnv, DEFAULT_KILL_GRACE, HOST_VARS,
};
pub use sandbox::{EmptyNetns, Holder, HolderRef, SandboxSpec};
#[cfg(feature = "wasm")]
pub use wasm::WasmRunner;
#[cfg(not(feature = "wasm"))]
pub use wasm_off::WasmRunner;
pub use wasm_spec::{WasmSpec, EPOCH_TICK, MAX_TABLE_ELEMENTS};
