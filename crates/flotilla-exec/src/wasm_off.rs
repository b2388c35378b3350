//! The WASM runner of a build without the `wasm` feature (no wasmtime): it cannot be made,
//! so a worker of such a build says at start that it runs no WASM tasks, and fails each one
//! with the reason (not retried: another worker of the same build would fail the same way).

use crate::cancel::CancelHandle;
use crate::error::{Error, Result};
use crate::outcome::Outcome;
use crate::wasm_spec::WasmSpec;

/// Why this build runs no WASM tasks.
const WHY: &str = "this flotilla was built without WASM tasks (cargo feature `wasm`, on by \
                   default; it was built with --no-default-features): rebuild it with the \
                   default features to run them";

/// Stands where the wasmtime runner is in a build with the `wasm` feature; never made.
#[derive(Debug)]
pub struct WasmRunner {
    _never: (),
}

impl WasmRunner {
    /// Always fails: this build has no WASM engine.
    pub fn new() -> Result<Self> {
        Err(Error::Engine {
            message: WHY.to_string(),
        })
    }

    /// Compiled modules in the cache: none.
    pub fn cached_modules(&self) -> usize {
        0
    }

    /// Always fails: this build has no WASM engine.
    pub fn run(&self, _spec: &WasmSpec, _cancel: &CancelHandle) -> Result<Outcome> {
        Err(Error::Engine {
            message: WHY.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_wasm_says_why_it_runs_no_wasm_task() {
        let e = WasmRunner::new().expect_err("no engine");
        assert!(e.to_string().contains("without WASM tasks"), "{e}");
    }
}
