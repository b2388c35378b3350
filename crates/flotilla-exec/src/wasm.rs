//! Running a WASI (preview 1) module with wasmtime: one shared [`Engine`] with fuel and epoch
//! interruption, a cache of pre-linked modules, and one ticker thread for timeouts and
//! cancellation.
//!
//! # Costs
//!
//! A module is compiled once per file version: the cache is keyed by path and checked against
//! the file's size, modification time and inode, so a rewritten module is recompiled. Each
//! attempt then builds a WASI context and a [`Store`] and instantiates the cached
//! [`InstancePre`] (tens of microseconds for a small module).
//!
//! # Interruption
//!
//! The ticker thread bumps the engine's epoch every [`EPOCH_TICK`] while any attempt runs (and
//! sleeps otherwise). Each store checks, at every tick, whether its attempt was cancelled or
//! ran past its deadline, so timeouts and cancellation take effect within about one tick. A
//! guest blocked inside a host call (e.g. `poll_oneoff` sleeping) is interrupted only once
//! that call returns.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use wasmtime::{
    Config, Engine, InstancePre, Linker, Module, ResourceLimiter, Store, Trap, UpdateDeadline,
};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::cancel::CancelHandle;
use crate::error::{Error, Result};
use crate::lazy_output::LazyFile;
use crate::outcome::{Outcome, Termination, Usage};
use crate::output::Output;
use crate::reaper::StopReason;
use crate::wasm_spec::{WasmSpec, EPOCH_TICK, MAX_TABLE_ELEMENTS};

/// How many compiled modules the cache keeps (it is emptied when full).
const CACHE_CAPACITY: usize = 256;

/// Per-store state.
struct State {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
    deadline: Option<Instant>,
    cancel: CancelHandle,
    stop: Option<StopReason>,
}

/// Enforces the memory limit and records the peak linear-memory size.
struct MemoryLimiter {
    limit: Option<usize>,
    peak: usize,
    /// A growth was refused because of `limit`.
    denied: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if self.limit.is_some_and(|limit| desired > limit) {
            self.denied = true;
            return Ok(false);
        }
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        self.peak = self.peak.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.denied = true;
            return Ok(false);
        }
        Ok(maximum.is_none_or(|max| desired <= max))
    }
}

/// The identity of one version of a module file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
    ino: u64,
    dev: u64,
}

impl FileStamp {
    fn of(meta: &fs::Metadata) -> Self {
        FileStamp {
            len: meta.len(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }
}

struct Cached {
    stamp: FileStamp,
    pre: InstancePre<State>,
}

struct Shared {
    engine: Engine,
    linker: Linker<State>,
    cache: Mutex<HashMap<PathBuf, Cached>>,
    /// Attempts running now; the ticker sleeps while this is zero.
    active: AtomicUsize,
    /// Guards the ticker's sleep; `true` asks it to exit.
    shutdown: Mutex<bool>,
    wake: Condvar,
}

/// Runs WASM attempts. Create one per executor and share it (`Send + Sync`) among the threads
/// that run attempts: it holds the engine, the compiled-module cache and the ticker thread,
/// which stops when the runner is dropped.
///
/// ```
/// use flotilla_exec::{CancelHandle, Termination, WasmRunner, WasmSpec};
///
/// let dir = tempfile::tempdir()?;
/// let module = dir.path().join("exit.wat");
/// std::fs::write(&module, r#"(module
///     (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
///     (memory (export "memory") 1)
///     (func (export "_start") (call $exit (i32.const 4))))"#)?;
/// let runner = WasmRunner::new()?;
/// let mut spec = WasmSpec::new(&module);
/// spec.fuel = Some(1_000_000);
/// spec.preopen = Some((dir.path().to_path_buf(), ".".into()));
/// let outcome = runner.run(&spec, &CancelHandle::new())?;
/// assert_eq!(outcome.termination, Termination::Exited(4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WasmRunner {
    shared: Arc<Shared>,
    ticker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for WasmRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmRunner")
            .field("cached_modules", &self.shared.cache.lock().len())
            .field("active", &self.shared.active.load(Ordering::Relaxed))
            .finish()
    }
}

/// Decrements the active count when an attempt ends, however it ends.
struct ActiveGuard<'a>(&'a AtomicUsize);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WasmRunner {
    /// Creates the engine (fuel and epoch interruption on), the WASI linker and the ticker.
    pub fn new() -> Result<Self> {
        let engine_err = |e: wasmtime::Error| Error::Engine {
            message: format!("{e:#}"),
        };
        let mut config = Config::new();
        config.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&config).map_err(engine_err)?;
        let mut linker = Linker::new(&engine);
        p1::add_to_linker_sync(&mut linker, |state: &mut State| &mut state.wasi)
            .map_err(engine_err)?;
        let shared = Arc::new(Shared {
            engine,
            linker,
            cache: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            shutdown: Mutex::new(false),
            wake: Condvar::new(),
        });
        let for_ticker = Arc::clone(&shared);
        let ticker = std::thread::Builder::new()
            .name("flotilla-exec-epoch".into())
            .spawn(move || tick(&for_ticker))
            .map_err(|source| Error::Thread {
                what: "wasm epoch ticker",
                source,
            })?;
        Ok(WasmRunner {
            shared,
            ticker: Some(ticker),
        })
    }

    /// How many compiled modules are cached.
    pub fn cached_modules(&self) -> usize {
        self.shared.cache.lock().len()
    }

    /// Runs one WASM attempt to its end. Blocks the calling thread.
    ///
    /// Returns `Err` only when the attempt could not start (module unreadable or invalid,
    /// unknown imports, no such entry export, preopen folder missing, output file not
    /// creatable); traps, `proc_exit`, fuel exhaustion, timeouts and cancellation are `Ok`.
    pub fn run(&self, spec: &WasmSpec, cancel: &CancelHandle) -> Result<Outcome> {
        let pre = self.instance_pre(&spec.module)?;
        if cancel.is_cancelled() {
            return Ok(spec.outcome(Termination::Cancelled, Usage::default()));
        }
        let setup_err = |message: String| Error::WasmSetup {
            path: spec.module.clone(),
            message,
        };
        let mut builder = WasiCtxBuilder::new();
        builder.allow_blocking_current_thread(true);
        // Files are created at the first byte written: most modules print nothing.
        let lazy_out = match &spec.stdout {
            Output::File(p) => Some(LazyFile::new(p.clone())),
            _ => None,
        };
        let lazy_err = match (&spec.stderr, &spec.stdout, &lazy_out) {
            (Output::File(e), Output::File(o), Some(shared)) if e == o => Some(shared.clone()),
            (Output::File(e), _, _) => Some(LazyFile::new(e.clone())),
            _ => None,
        };
        match (&spec.stdout, lazy_out) {
            (_, Some(f)) => {
                builder.stdout(f);
            }
            (Output::Inherit, None) => {
                builder.inherit_stdout();
            }
            _ => {}
        }
        match (&spec.stderr, lazy_err) {
            (_, Some(f)) => {
                builder.stderr(f);
            }
            (Output::Inherit, None) => {
                builder.inherit_stderr();
            }
            _ => {}
        }
        let argv0 = spec
            .module
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        builder.arg(argv0).args(&spec.args).envs(&spec.env);
        if let Some((host, guest)) = &spec.preopen {
            builder
                .preopened_dir(host, guest, FsPerms::ReadWrite)
                .map_err(|e| setup_err(format!("cannot preopen {}: {e:#}", host.display())))?;
        }

        let start = Instant::now();
        let state = State {
            wasi: builder.build_p1(),
            limiter: MemoryLimiter {
                limit: spec
                    .memory_bytes
                    .map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
                peak: 0,
                denied: false,
            },
            deadline: spec.timeout.map(|t| start + t),
            cancel: cancel.clone(),
            stop: None,
        };
        let mut store = Store::new(&self.shared.engine, state);
        store.limiter(|state| &mut state.limiter);
        store
            .set_fuel(spec.fuel.unwrap_or(u64::MAX))
            .map_err(|e| setup_err(format!("{e:#}")))?;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if state.cancel.is_cancelled() {
                state.stop = Some(StopReason::Cancelled);
                return Err(wasmtime::Error::msg("attempt cancelled"));
            }
            if state.deadline.is_some_and(|d| Instant::now() >= d) {
                state.stop = Some(StopReason::TimedOut);
                return Err(wasmtime::Error::msg("attempt timed out"));
            }
            Ok(UpdateDeadline::Continue(1))
        });

        if self.shared.active.fetch_add(1, Ordering::SeqCst) == 0 {
            let _sleeping = self.shared.shutdown.lock();
            self.shared.wake.notify_one();
        }
        let _active = ActiveGuard(&self.shared.active);

        let termination = 'run: {
            let instance = match pre.instantiate(&mut store) {
                Ok(instance) => instance,
                Err(e) => break 'run classify(&e, &store),
            };
            if spec.entry != "_start" && !spec.entry.is_empty() {
                if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "_initialize") {
                    if let Err(e) = init.call(&mut store, ()) {
                        break 'run classify(&e, &store);
                    }
                }
            }
            let entry = if spec.entry.is_empty() {
                "_start"
            } else {
                spec.entry.as_str()
            };
            let func = instance
                .get_typed_func::<(), ()>(&mut store, entry)
                .map_err(|e| setup_err(format!("no usable export `{entry}`: {e:#}")))?;
            match func.call(&mut store, ()) {
                Ok(()) => Termination::Exited(0),
                Err(e) => classify(&e, &store),
            }
        };
        let wall = start.elapsed().as_secs_f64();
        let given = spec.fuel.unwrap_or(u64::MAX);
        let usage = Usage {
            cpu_seconds: wall,
            peak_rss_bytes: store.data().limiter.peak as u64,
            wall_seconds: wall,
            fuel: store.get_fuel().ok().map(|left| given.saturating_sub(left)),
        };
        Ok(spec.outcome(termination, usage))
    }

    /// The pre-linked module for `path`, compiled on first use or when the file changed.
    fn instance_pre(&self, path: &Path) -> Result<InstancePre<State>> {
        let read_err = |source| Error::ModuleRead {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |e: wasmtime::Error| Error::ModuleInvalid {
            path: path.to_path_buf(),
            message: format!("{e:#}"),
        };
        let stamp = FileStamp::of(&fs::metadata(path).map_err(read_err)?);
        if let Some(cached) = self.shared.cache.lock().get(path) {
            if cached.stamp == stamp {
                return Ok(cached.pre.clone());
            }
        }
        // Compile outside the lock: other threads keep running cached modules meanwhile.
        // From the file, so that text-format errors point at `path:line:column`.
        let module = Module::from_file(&self.shared.engine, path).map_err(invalid)?;
        let pre = self
            .shared
            .linker
            .instantiate_pre(&module)
            .map_err(invalid)?;
        let mut cache = self.shared.cache.lock();
        if cache.len() >= CACHE_CAPACITY && !cache.contains_key(path) {
            cache.clear();
        }
        cache.insert(
            path.to_path_buf(),
            Cached {
                stamp,
                pre: pre.clone(),
            },
        );
        Ok(pre)
    }
}

impl Drop for WasmRunner {
    fn drop(&mut self) {
        *self.shared.shutdown.lock() = true;
        self.shared.wake.notify_all();
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
    }
}

/// The ticker thread: advance the epoch every tick while attempts run, sleep otherwise.
fn tick(shared: &Shared) {
    let mut shutdown = shared.shutdown.lock();
    loop {
        if *shutdown {
            return;
        }
        if shared.active.load(Ordering::SeqCst) == 0 {
            shared.wake.wait(&mut shutdown);
            continue;
        }
        shared.wake.wait_for(&mut shutdown, EPOCH_TICK);
        shared.engine.increment_epoch();
    }
}

/// Maps a wasmtime error from instantiating or running the guest to a termination.
fn classify(error: &wasmtime::Error, store: &Store<State>) -> Termination {
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        return Termination::Exited(exit.0);
    }
    let state = store.data();
    match state.stop {
        Some(StopReason::TimedOut) => return Termination::TimedOut,
        Some(StopReason::Cancelled) => return Termination::Cancelled,
        None => {}
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Termination::FuelExhausted,
        _ if state.limiter.denied => Termination::MemoryExceeded,
        Some(trap) => Termination::Trap(trap.to_string()),
        None => Termination::Trap(format!("{error:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use std::time::Duration;

    const WASI: &str = "wasi_snapshot_preview1";

    /// One runner for all tests, as in the worker: shared by the test threads.
    fn runner() -> &'static WasmRunner {
        static RUNNER: OnceLock<WasmRunner> = OnceLock::new();
        RUNNER.get_or_init(|| WasmRunner::new().expect("engine"))
    }

    fn module(dir: &Path, name: &str, wat: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, wat).expect("write module");
        path
    }

    fn run(spec: &WasmSpec) -> Outcome {
        runner()
            .run(spec, &CancelHandle::new())
            .expect("module starts")
    }

    fn hello_wat() -> String {
        format!(
            r#"(module
              (import "{WASI}" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
              (memory (export "memory") 1)
              (data (i32.const 16) "hello\n")
              (func (export "_start")
                (i32.store (i32.const 0) (i32.const 16))
                (i32.store (i32.const 4) (i32.const 6))
                (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
                (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))))"#
        )
    }

    fn exit_wat(code: i32) -> String {
        format!(
            r#"(module
              (import "{WASI}" "proc_exit" (func $exit (param i32)))
              (memory (export "memory") 1)
              (func (export "_start") (call $exit (i32.const {code}))))"#
        )
    }

    const LOOP_WAT: &str = r#"(module
        (memory (export "memory") 1)
        (func (export "_start") (loop $l (br $l))))"#;

    const NOOP_WAT: &str = r#"(module (memory (export "memory") 1) (func (export "_start")))"#;

    #[test]
    fn runner_is_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<WasmRunner>();
        assert_send_sync::<CancelHandle>();
    }

    #[test]
    fn a_silent_module_leaves_no_output_files_and_a_shared_file_gets_both_streams() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = WasmSpec::new(module(dir.path(), "noop.wat", NOOP_WAT));
        spec.stdout = Output::File(dir.path().join("logs/out"));
        spec.stderr = Output::File(dir.path().join("logs/err"));
        let outcome = run(&spec);
        assert!(outcome.success(), "{outcome:?}");
        assert!(!dir.path().join("logs/out").exists());
        assert!(!dir.path().join("logs/err").exists());
        let mut spec = WasmSpec::new(module(dir.path(), "hello.wat", &hello_wat()));
        spec.stdout = Output::File(dir.path().join("both"));
        spec.stderr = Output::File(dir.path().join("both"));
        assert!(run(&spec).success());
        let both = fs::read_to_string(dir.path().join("both")).expect("output file");
        assert_eq!(both, "hello\nhello\n");
    }

    #[test]
    fn hello_goes_to_the_stdout_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = WasmSpec::new(module(dir.path(), "hello.wat", &hello_wat()));
        spec.stdout = Output::File(dir.path().join("out/stdout.txt"));
        spec.stderr = Output::File(dir.path().join("stderr.txt"));
        let outcome = run(&spec);
        assert!(outcome.success(), "{outcome:?}");
        let read = |p: &str| fs::read_to_string(dir.path().join(p)).expect("output file");
        assert_eq!(read("out/stdout.txt"), "hello\n");
        assert_eq!(read("stderr.txt"), "hello\n");
        assert_eq!(outcome.usage.peak_rss_bytes, 64 * 1024);
        assert!(outcome.usage.wall_seconds > 0.0);
    }

    #[test]
    fn proc_exit_is_the_exit_code() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = WasmSpec::new(module(dir.path(), "exit.wat", &exit_wat(3)));
        let outcome = run(&spec);
        assert_eq!(outcome.termination, Termination::Exited(3));
        assert_eq!(outcome.describe(), "exited with code 3");
    }

    #[test]
    fn infinite_loop_runs_out_of_fuel() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = WasmSpec::new(module(dir.path(), "loop.wat", LOOP_WAT));
        spec.fuel = Some(1_000_000);
        let outcome = run(&spec);
        assert_eq!(outcome.termination, Termination::FuelExhausted);
        assert_eq!(outcome.describe(), "ran out of fuel (limit 1000000)");
    }

    #[test]
    fn infinite_loop_times_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut spec = WasmSpec::new(module(dir.path(), "loop.wat", LOOP_WAT));
        spec.timeout = Some(Duration::from_millis(200));
        let outcome = run(&spec);
        assert_eq!(outcome.termination, Termination::TimedOut);
        assert!(outcome.usage.wall_seconds >= 0.2, "{outcome:?}");
        assert!(outcome.usage.wall_seconds < 5.0, "{outcome:?}");
        assert_eq!(outcome.describe(), "killed after timeout of 200ms");
    }

    #[test]
    fn cancel_interrupts_a_module_whenever_it_comes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = WasmSpec::new(module(dir.path(), "loop.wat", LOOP_WAT));
        let cancel = CancelHandle::new();
        let worker = {
            let cancel = cancel.clone();
            std::thread::spawn(move || runner().run(&spec, &cancel))
        };
        // Whether this lands before or during the run, the attempt ends as cancelled.
        cancel.cancel();
        let outcome = worker.join().expect("thread").expect("starts");
        assert_eq!(outcome.termination, Termination::Cancelled);
    }

    #[test]
    fn memory_grow_beyond_the_limit_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Growing by one page works (2 pages = the limit), by ten more is refused: exit 7.
        let wat = format!(
            r#"(module
              (import "{WASI}" "proc_exit" (func $exit (param i32)))
              (memory (export "memory") 1)
              (func (export "_start")
                (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1))
                  (then (call $exit (i32.const 6))))
                (if (i32.eq (memory.grow (i32.const 10)) (i32.const -1))
                  (then (call $exit (i32.const 7))))
                (call $exit (i32.const 0))))"#
        );
        let mut spec = WasmSpec::new(module(dir.path(), "grow.wat", &wat));
        spec.memory_bytes = Some(2 * 65536);
        let outcome = run(&spec);
        assert_eq!(outcome.termination, Termination::Exited(7));
        assert_eq!(outcome.usage.peak_rss_bytes, 2 * 65536);
        // Without the limit both grows succeed.
        spec.memory_bytes = None;
        assert_eq!(run(&spec).termination, Termination::Exited(0));
    }

    #[test]
    fn a_table_without_a_maximum_cannot_grow_without_bound() {
        // A table with no maximum could once grow until the worker died.
        let dir = tempfile::tempdir().expect("tempdir");
        let wat = r#"(module
          (table $t 1 funcref)
          (memory (export "memory") 1)
          (func (export "_start")
            (if (i32.eq (table.grow $t (ref.null func) (i32.const 1000)) (i32.const -1))
              (then unreachable))
            (if (i32.eq (table.grow $t (ref.null func) (i32.const 100000000)) (i32.const -1))
              (then unreachable))))"#;
        let outcome = run(&WasmSpec::new(module(dir.path(), "table.wat", wat)));
        assert_eq!(
            outcome.termination,
            Termination::MemoryExceeded,
            "{outcome:?}"
        );
    }

    #[test]
    fn memory_limit_then_trap_is_memory_exceeded() {
        let dir = tempfile::tempdir().expect("tempdir");
        // What a guest allocator does when memory.grow fails: abort (unreachable).
        let wat = r#"(module
            (memory (export "memory") 1)
            (func (export "_start")
              (if (i32.eq (memory.grow (i32.const 100)) (i32.const -1)) (then unreachable))))"#;
        let mut spec = WasmSpec::new(module(dir.path(), "oom.wat", wat));
        spec.memory_bytes = Some(1 << 20);
        let outcome = run(&spec);
        assert_eq!(outcome.termination, Termination::MemoryExceeded);
        assert_eq!(outcome.describe(), "exceeded its memory limit of 1MiB");
        // An initial memory above the limit fails at instantiation, the same way.
        let big = module(
            dir.path(),
            "big.wat",
            r#"(module (memory 100) (func (export "_start")))"#,
        );
        spec.module = big;
        assert_eq!(run(&spec).termination, Termination::MemoryExceeded);
    }

    #[test]
    fn trap_message_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wat = r#"(module (func (export "_start") unreachable))"#;
        let outcome = run(&WasmSpec::new(module(dir.path(), "trap.wat", wat)));
        match &outcome.termination {
            Termination::Trap(message) => assert!(message.contains("unreachable"), "{message}"),
            other => panic!("expected a trap, got {other:?}"),
        }
    }

    #[test]
    fn preopened_folder_is_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let job = dir.path().join("job");
        fs::create_dir(&job).expect("mkdir");
        fs::write(job.join("input.txt"), "from the job folder").expect("write input");
        // path_open(3, "input.txt") → fd_read into 256.. → fd_write it to stdout.
        let wat = format!(
            r#"(module
              (import "{WASI}" "path_open" (func $open
                (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
              (import "{WASI}" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
              (import "{WASI}" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
              (import "{WASI}" "proc_exit" (func $exit (param i32)))
              (memory (export "memory") 1)
              (data (i32.const 64) "input.txt")
              (func (export "_start") (local $err i32)
                (local.set $err (call $open (i32.const 3) (i32.const 0) (i32.const 64)
                  (i32.const 9) (i32.const 0) (i64.const 0x1fffffff) (i64.const 0x1fffffff)
                  (i32.const 0) (i32.const 32)))
                (if (local.get $err) (then (call $exit (i32.add (i32.const 100) (local.get $err)))))
                (i32.store (i32.const 0) (i32.const 256))
                (i32.store (i32.const 4) (i32.const 512))
                (local.set $err (call $read (i32.load (i32.const 32)) (i32.const 0) (i32.const 1)
                  (i32.const 40)))
                (if (local.get $err) (then (call $exit (i32.add (i32.const 150) (local.get $err)))))
                (i32.store (i32.const 4) (i32.load (i32.const 40)))
                (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 44)))))"#
        );
        let mut spec = WasmSpec::new(module(dir.path(), "cat.wat", &wat));
        spec.preopen = Some((job.clone(), ".".to_owned()));
        spec.stdout = Output::File(dir.path().join("out"));
        let outcome = run(&spec);
        assert!(outcome.success(), "{outcome:?}");
        assert_eq!(
            fs::read_to_string(dir.path().join("out")).expect("out"),
            "from the job folder"
        );
        // Without the preopen there is no fd 3: path_open fails with EBADF (8).
        spec.preopen = None;
        assert_eq!(run(&spec).termination, Termination::Exited(108));
    }

    #[test]
    fn args_and_env_reach_the_guest() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Exits with argc * 10 + number of environment variables.
        let wat = format!(
            r#"(module
              (import "{WASI}" "args_sizes_get" (func $args (param i32 i32) (result i32)))
              (import "{WASI}" "environ_sizes_get" (func $envs (param i32 i32) (result i32)))
              (import "{WASI}" "proc_exit" (func $exit (param i32)))
              (memory (export "memory") 1)
              (func (export "_start")
                (drop (call $args (i32.const 0) (i32.const 4)))
                (drop (call $envs (i32.const 8) (i32.const 12)))
                (call $exit (i32.add (i32.mul (i32.load (i32.const 0)) (i32.const 10))
                  (i32.load (i32.const 8))))))"#
        );
        let mut spec = WasmSpec::new(module(dir.path(), "argc.wat", &wat));
        spec.args = vec!["a".into(), "b".into()];
        spec.env = vec![("FLOTILLA_TASK".into(), "t".into())];
        assert_eq!(run(&spec).termination, Termination::Exited(31));
    }

    #[test]
    fn entry_and_reactor_initialize() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wat = format!(
            r#"(module
              (import "{WASI}" "proc_exit" (func $exit (param i32)))
              (memory (export "memory") 1)
              (global $g (mut i32) (i32.const 0))
              (func (export "_initialize") (global.set $g (i32.const 40)))
              (func (export "score") (call $exit (i32.add (global.get $g) (i32.const 2)))))"#
        );
        let mut spec = WasmSpec::new(module(dir.path(), "reactor.wat", &wat));
        spec.entry = "score".into();
        assert_eq!(run(&spec).termination, Termination::Exited(42));
        spec.entry = "missing".into();
        let err = runner()
            .run(&spec, &CancelHandle::new())
            .expect_err("no such export");
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn bad_modules_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cancel = CancelHandle::new();
        let err = runner()
            .run(&WasmSpec::new(dir.path().join("absent.wasm")), &cancel)
            .expect_err("missing");
        assert!(matches!(err, Error::ModuleRead { .. }), "{err:?}");
        assert!(err.to_string().contains("absent.wasm"));

        let bad = module(
            dir.path(),
            "bad.wat",
            "(module (func (export \"_start\") nonsense))",
        );
        let err = runner()
            .run(&WasmSpec::new(bad), &cancel)
            .expect_err("invalid");
        assert!(matches!(err, Error::ModuleInvalid { .. }), "{err:?}");
        assert!(err.to_string().contains("bad.wat"));

        let unknown = module(
            dir.path(),
            "import.wat",
            r#"(module (import "env" "host_thing" (func)) (func (export "_start")))"#,
        );
        let err = runner()
            .run(&WasmSpec::new(unknown), &cancel)
            .expect_err("unknown import");
        assert!(err.to_string().contains("host_thing"), "{err}");
    }

    #[test]
    fn cached_module_runs_many_times_and_is_recompiled_when_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = module(dir.path(), "noop.wat", NOOP_WAT);
        let spec = WasmSpec::new(&path);
        for _ in 0..1000 {
            assert_eq!(run(&spec).termination, Termination::Exited(0));
        }
        fs::write(&path, exit_wat(9)).expect("rewrite module");
        assert_eq!(run(&spec).termination, Termination::Exited(9));
    }

    #[test]
    #[ignore = "throughput measurement; run with --ignored --nocapture"]
    fn throughput_wasm_noop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = module(dir.path(), "noop.wat", NOOP_WAT);
        let n = 20_000;
        let threads = 2;
        let _ = run(&WasmSpec::new(&path)); // compile once
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                let spec = WasmSpec::new(&path);
                s.spawn(move || {
                    for _ in 0..n / threads {
                        assert!(run(&spec).success());
                    }
                });
            }
        });
        let rate = n as f64 / start.elapsed().as_secs_f64();
        println!("wasm no-op: {rate:.0} attempts/s on {threads} threads");
    }
}
