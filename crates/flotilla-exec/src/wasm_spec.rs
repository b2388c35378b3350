//! What a WASM attempt is ([`WasmSpec`]) and the engine's constants: always built, so that
//! a build without the `wasm` feature still speaks of WASM tasks (and refuses to run them).

use std::path::PathBuf;
use std::time::Duration;

use crate::outcome::{Outcome, Termination, Usage};
use crate::output::Output;

/// How often the engine's epoch advances while WASM attempts run: the granularity of
/// timeouts and cancellation.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// One WASM attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WasmSpec {
    /// The module file: binary `.wasm` or text `.wat`.
    pub module: PathBuf,
    /// The exported function to call, `() -> ()`; `_start` for a WASI command. For any other
    /// entry, an exported `_initialize` (a WASI reactor) is called first.
    pub entry: String,
    /// Arguments after `argv[0]` (which is the module's file name).
    pub args: Vec<String>,
    /// Environment variables the guest sees (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// A host folder and the guest path it appears at (e.g. the job folder as `.` or `/job`),
    /// read-write. Nothing else of the host file system is visible.
    pub preopen: Option<(PathBuf, String)>,
    /// Fuel (roughly, wasm instructions); running out is [`Termination::FuelExhausted`].
    pub fuel: Option<u64>,
    /// Linear-memory limit in bytes: `memory.grow` beyond it returns -1 to the guest.
    pub memory_bytes: Option<u64>,
    /// Stop the attempt after this long ([`Termination::TimedOut`]).
    pub timeout: Option<Duration>,
    /// Where the guest's stdout goes.
    pub stdout: Output,
    /// Where the guest's stderr goes.
    pub stderr: Output,
}

impl WasmSpec {
    /// A spec calling `_start` of `module` with no arguments, environment, preopens or limits,
    /// and both outputs discarded.
    pub fn new(module: impl Into<PathBuf>) -> Self {
        WasmSpec {
            module: module.into(),
            entry: "_start".to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            preopen: None,
            fuel: None,
            memory_bytes: None,
            timeout: None,
            stdout: Output::Null,
            stderr: Output::Null,
        }
    }

    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub(crate) fn outcome(&self, termination: Termination, usage: Usage) -> Outcome {
        Outcome {
            termination,
            usage,
            timeout: self.timeout,
            memory_limit: self.memory_bytes,
            fuel: self.fuel,
            processes_reached: None,
        }
    }
}

/// The most table elements a module may have (each a pointer or two on the host): a table
/// with no maximum may otherwise grow until the worker runs out of memory.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;
