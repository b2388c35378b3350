//! The runtime handle and its builder.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_deque::{Injector, Worker};
use flotilla_devices::{Device, DeviceKind, DiscoverOptions};
use flotilla_sched::{BuiltinPolicy, PerfModel, Platform, PolicyKind, UnitKind};
use parking_lot::{Condvar, Mutex};

use crate::data::{Data, DataManager, TransferStats, HOST};
use crate::device;
use crate::error::{Result, RuntimeError};
use crate::job::Job;
use crate::place::{SchedState, UnitTable};
use crate::registry::Registry;
use crate::scope::{self, Schedule, Scope};
use crate::sleep::Sleep;
use crate::task::{Codelet, TaskBuilder};
use crate::trace::{Tracer, Track};

/// Which devices a runtime uses besides its CPU workers.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    /// CPU workers only.
    #[default]
    None,
    /// Every OpenCL device and CUDA GPU found.
    All,
    /// The devices of these kinds.
    Kinds(Vec<DeviceKind>),
}

impl DeviceSelection {
    /// Parses `cpu`, `all`, `none` or a comma list such as `cpu,opencl,cuda`
    /// (`cpu` adds nothing: CPU workers are always there unless `cpus(0)`).
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "" | "none" | "cpu" => return Ok(DeviceSelection::None),
            "all" => return Ok(DeviceSelection::All),
            _ => {}
        }
        let mut kinds = Vec::new();
        for part in s.split(',') {
            match part.trim() {
                "cpu" => {}
                "opencl" => kinds.push(DeviceKind::OpenCl),
                "cuda" => kinds.push(DeviceKind::Cuda),
                other => {
                    return Err(format!(
                        "unknown device kind {other:?} (expected cpu, opencl, cuda, all)"
                    ))
                }
            }
        }
        Ok(if kinds.is_empty() {
            DeviceSelection::None
        } else {
            DeviceSelection::Kinds(kinds)
        })
    }
}

/// Configures a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeBuilder {
    cpus: Option<usize>,
    policy: Option<PolicyKind>,
    /// `None`: `FLOTILLA_DEVICES`, else none.
    devices: Option<DeviceSelection>,
    trace: Option<PathBuf>,
    model_path: Option<Option<PathBuf>>,
    pin: bool,
    pin_host: Option<bool>,
    device_mem_limit: Option<u64>,
    seed: u64,
    /// Tests: CPU worker thread `n` fails to start; the registry is left in the slot, to see
    /// whether every started thread let go of it.
    #[cfg(test)]
    fail_spawn_at: Option<(usize, FailSlot)>,
}

#[cfg(test)]
type FailSlot = Arc<Mutex<Option<std::sync::Weak<Registry>>>>;

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            cpus: None,
            policy: None,
            devices: None,
            trace: None,
            model_path: None,
            pin: true,
            pin_host: None,
            device_mem_limit: None,
            seed: 0x5eed,
            #[cfg(test)]
            fail_spawn_at: None,
        }
    }
}

impl RuntimeBuilder {
    /// The number of CPU workers (default: one per core, less one per device).
    pub fn cpus(mut self, n: usize) -> Self {
        self.cpus = Some(n);
        self
    }
    /// The placement policy (default: `FLOTILLA_SCHED`, else `dmda` with devices and `ws`
    /// without).
    pub fn policy(mut self, p: PolicyKind) -> Self {
        self.policy = Some(p);
        self
    }
    /// Which devices to use (default: `FLOTILLA_DEVICES`, else none). Given here, it wins
    /// over `FLOTILLA_DEVICES`, `DeviceSelection::None` included.
    pub fn devices(mut self, d: DeviceSelection) -> Self {
        self.devices = Some(d);
        self
    }
    /// Writes a Chrome/Perfetto trace here at shutdown (default: `FLOTILLA_TRACE`; empty
    /// or unset, no trace).
    pub fn trace(mut self, path: impl Into<PathBuf>) -> Self {
        self.trace = Some(path.into());
        self
    }
    /// Where the performance models persist; `None` keeps them in memory only. Default:
    /// `$FLOTILLA_HOME/perfmodels/<host>.json`, `FLOTILLA_HOME` defaulting to `~/.flotilla`.
    pub fn model_path(mut self, p: Option<PathBuf>) -> Self {
        self.model_path = Some(p);
        self
    }
    /// Whether CPU workers are pinned to cores (default: yes, where the OS allows).
    pub fn pin(mut self, on: bool) -> Self {
        self.pin = on;
        self
    }
    /// Whether registered data of at least [`crate::PIN_MIN_BYTES`] is page-locked for
    /// faster copies where a device's backend gains from it (CUDA). Default: yes, unless
    /// `FLOTILLA_PIN_HOST=0`.
    pub fn pin_host_memory(mut self, on: bool) -> Self {
        self.pin_host = Some(on);
        self
    }
    /// Caps the memory the runtime uses on each device (to test eviction, or to share).
    pub fn device_mem_limit(mut self, bytes: u64) -> Self {
        self.device_mem_limit = Some(bytes);
        self
    }
    /// The seed of randomized policies.
    pub fn seed(mut self, s: u64) -> Self {
        self.seed = s;
        self
    }

    /// Discovers the devices, loads the models and starts the workers.
    pub fn build(self) -> Result<Runtime> {
        let devices = self.select_devices()?;
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let n_cpu = self
            .cpus
            .unwrap_or_else(|| cores.saturating_sub(devices.len()).max(1));
        if n_cpu == 0 && devices.is_empty() {
            return Err(RuntimeError::Config(
                "cpus(0) and no devices: nothing could run a task (cpus(0) is for a runtime of \
                 devices only: give it devices(DeviceSelection::All) or FLOTILLA_DEVICES)"
                    .into(),
            ));
        }
        let policy_kind = self.resolve_policy(devices.is_empty())?;
        let layout = Layout::new(n_cpu, &devices);

        let model_path = match &self.model_path {
            Some(p) => p.clone(),
            None => default_model_path(),
        };
        let model = match &model_path {
            Some(p) => load_model(p)?,
            None => PerfModel::new(),
        };
        let trace_path = self.trace.clone().or_else(|| {
            std::env::var_os("FLOTILLA_TRACE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let tracer = trace_path.map(|p| Arc::new(Tracer::new(&p, layout.names.clone())));
        let links = Arc::new(LinkObservations::new(devices.len() + 1));
        let pin_host = match self.pin_host {
            Some(on) => on,
            None => pin_host_from_env()?,
        };
        let data = self.data_manager(&devices, &links, tracer.clone(), pin_host);

        let (sleep, parkers) = Sleep::new(n_cpu);
        let locals: Vec<Worker<Job>> = (0..n_cpu).map(|_| Worker::new_lifo()).collect();
        let stealers = locals.iter().map(|w| w.stealer()).collect();
        let mut dev_queues = Vec::new();
        let mut dev_threads = Vec::new();
        for d in &devices {
            let (q, t) = device::queue(d.info().kind);
            dev_queues.push(q);
            dev_threads.push(t);
        }
        let n_units = n_cpu + devices.len();
        let registry = Arc::new(Registry {
            injector: Injector::new(),
            stealers,
            mailboxes: (0..n_cpu).map(|_| Injector::new()).collect(),
            sleep,
            terminate: AtomicBool::new(false),
            n_cpu,
            devices: dev_queues,
            policy_kind,
            units: UnitTable {
                kinds: layout.kinds,
                archs: layout.archs,
            },
            sched: Mutex::new(SchedState {
                policy: BuiltinPolicy::from_kind(policy_kind, self.seed),
                platform: layout.platform,
                model,
                backlog: vec![0.0; n_units],
                epoch: Instant::now(),
                links_seen: 0,
            }),
            links,
            data,
            tracer,
            outstanding: AtomicUsize::new(0),
            idle_lock: Mutex::new(()),
            idle_cv: Condvar::new(),
            failures: Mutex::new(Vec::new()),
            failure_count: AtomicUsize::new(0),
            executed: (0..n_units).map(|_| AtomicU64::new(0)).collect(),
        });

        let mut started = Started {
            registry: registry.clone(),
            threads: Vec::new(),
        };
        self.start_threads(&mut started, locals, parkers, &devices, dev_threads)?;
        Ok(Runtime {
            registry,
            threads: started.disarm(),
            seq: AtomicU64::new(0),
            model_path,
            devices,
            policy_kind,
        })
    }

    /// The devices asked for (`devices`, else `FLOTILLA_DEVICES`); a kind asked for by name
    /// and not found is an error naming why it was skipped.
    fn select_devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        let devices_sel = device_choice(
            self.devices.as_ref(),
            std::env::var("FLOTILLA_DEVICES").ok().as_deref(),
        )?;
        Ok(match &devices_sel {
            DeviceSelection::None => Vec::new(),
            sel => {
                let found = flotilla_devices::discover_report(&DiscoverOptions::default());
                let wanted: Vec<Arc<dyn Device>> = found
                    .devices
                    .into_iter()
                    .filter(|d| match sel {
                        DeviceSelection::All => true,
                        DeviceSelection::Kinds(k) => k.contains(&d.info().kind),
                        DeviceSelection::None => false,
                    })
                    .collect();
                if let DeviceSelection::Kinds(kinds) = sel {
                    for k in kinds {
                        if !wanted.iter().any(|d| d.info().kind == *k) {
                            return Err(RuntimeError::Config(format!(
                                "no {k} device found ({})",
                                if found.skipped.is_empty() {
                                    "none reported".to_string()
                                } else {
                                    found.skipped.join("; ")
                                }
                            )));
                        }
                    }
                }
                wanted
            }
        })
    }

    /// The placement policy: given, else `FLOTILLA_SCHED`, else `ws` on CPUs alone and
    /// `dmda` with devices.
    fn resolve_policy(&self, cpus_only: bool) -> Result<PolicyKind> {
        let env = std::env::var("FLOTILLA_SCHED")
            .ok()
            .filter(|s| !s.trim().is_empty());
        Ok(match (self.policy, env) {
            (Some(p), _) => p,
            (None, Some(s)) => s
                .trim()
                .to_ascii_lowercase()
                .parse::<PolicyKind>()
                .map_err(|e| RuntimeError::Config(format!("FLOTILLA_SCHED={s}: {e}")))?,
            (None, None) if cpus_only => PolicyKind::Ws,
            (None, None) => PolicyKind::Dmda,
        })
    }

    /// The data manager over these devices, reporting each transfer to the link
    /// observations (and the trace).
    fn data_manager(
        &self,
        devices: &[Arc<dyn Device>],
        links: &Arc<LinkObservations>,
        tracer: Option<Arc<Tracer>>,
        pin_host: bool,
    ) -> DataManager {
        let mut data = DataManager::new(devices, self.device_mem_limit);
        data.pin_host = pin_host;
        {
            let links = links.clone();
            data.on_transfer = Some(Box::new(move |ev| {
                links.observe(
                    ev.from,
                    ev.node,
                    ev.bytes,
                    (ev.end - ev.start).as_secs_f64(),
                );
                if let Some(t) = &tracer {
                    let name = match (ev.peer, ev.upload) {
                        (true, _) => "peer copy",
                        (false, true) => "upload",
                        (false, false) => "download",
                    };
                    t.span(Track::Transfers(ev.node), name, ev.start, ev.end);
                }
            }));
        }
        data
    }

    /// Starts the CPU workers and the device threads into `started`. Whatever fails to
    /// start, `started` (dropped by the caller's `?`) stops and joins what did.
    fn start_threads(
        &self,
        started: &mut Started,
        locals: Vec<Worker<Job>>,
        parkers: Vec<crate::sync::Parker>,
        devices: &[Arc<dyn Device>],
        dev_threads: Vec<device::DeviceThreads>,
    ) -> Result<()> {
        let n_cpu = locals.len();
        let registry = started.registry.clone();
        let core_ids = if self.pin {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        // Device threads go to the cores left after the CPU workers' (by default one per
        // device: `cpus` defaults to cores minus devices), on the device's NUMA node where
        // known, never onto a CPU worker's core.
        let local: Vec<Vec<usize>> = devices
            .iter()
            .map(|d| {
                d.info()
                    .topology
                    .as_ref()
                    .map(|t| t.local_cpus.clone())
                    .unwrap_or_default()
            })
            .collect();
        let ids: Vec<usize> = core_ids.iter().map(|c| c.id).collect();
        let assignment = crate::topo::assign_cores(&ids, n_cpu, &local);
        let core_of = |id: Option<usize>| id.map(|id| core_affinity::CoreId { id });
        for (i, (local, parker)) in locals.into_iter().zip(parkers).enumerate() {
            #[cfg(test)]
            if let Some((n, slot)) = &self.fail_spawn_at {
                if *n == i {
                    *slot.lock() = Some(Arc::downgrade(&registry));
                    return Err(RuntimeError::Io {
                        path: "spawning a worker thread".into(),
                        source: std::io::Error::other("failure injected by a test"),
                    });
                }
            }
            let reg = registry.clone();
            let core = core_of(assignment.workers[i]);
            let h = std::thread::Builder::new()
                .name(format!("flotilla-cpu{i}"))
                .spawn(move || crate::worker::run(reg, i, local, parker, core))
                .map_err(|source| RuntimeError::Io {
                    path: "spawning a worker thread".into(),
                    source,
                })?;
            started.threads.push(h);
        }
        for (i, (d, t)) in devices.iter().zip(dev_threads).enumerate() {
            let core = core_of(assignment.devices[i]);
            let hs = device::start(registry.clone(), d.clone(), i, n_cpu + i, 1 + i, t, core)
                .map_err(|source| RuntimeError::Io {
                    path: "spawning a device thread".into(),
                    source,
                })?;
            started.threads.extend(hs);
        }
        Ok(())
    }
}

/// Threads started while building a runtime. Dropped before [`Started::disarm`] (a later
/// thread failed to start), it stops and joins them, so none is left parked forever (as
/// rayon-core's `Terminator` does).
struct Started {
    registry: Arc<Registry>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Started {
    /// Everything started: the runtime owns the threads now.
    fn disarm(mut self) -> Vec<std::thread::JoinHandle<()>> {
        std::mem::take(&mut self.threads)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.registry.terminate.store(true, Ordering::Release);
        self.registry.sleep.wake_all();
        for q in &self.registry.devices {
            q.close();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The machine as placement sees it: CPU workers on memory node 0, one node per device, the
/// links between them; and each unit's kind, arch and name.
struct Layout {
    platform: Platform,
    kinds: Vec<DeviceKind>,
    archs: Vec<String>,
    names: Vec<String>,
}

impl Layout {
    fn new(n_cpu: usize, devices: &[Arc<dyn Device>]) -> Layout {
        // Platform: CPU workers on node 0, one node per device.
        let mut platform = Platform::new();
        let host = platform.add_node("host");
        let mut kinds = Vec::new();
        let mut archs = Vec::new();
        let mut names = Vec::new();
        for i in 0..n_cpu {
            platform.add_unit(UnitKind::Cpu, host, "cpu");
            kinds.push(DeviceKind::Cpu);
            archs.push("cpu".to_string());
            names.push(format!("cpu{i}"));
        }
        let mut dev_nodes = Vec::new();
        let mut host_links = Vec::new();
        for d in devices {
            let info = d.info();
            let node = platform.add_node(&info.name);
            let kind = match info.kind {
                DeviceKind::Cuda => UnitKind::Cuda,
                DeviceKind::OpenCl => UnitKind::OpenCl,
                DeviceKind::Cpu => UnitKind::Cpu,
            };
            platform.add_unit(kind, node, &info.arch);
            // From the device's PCIe link when known, else a guess; either is replaced by
            // measured transfers as they happen.
            let pcie = info
                .topology
                .as_ref()
                .and_then(|t| t.link)
                .map(|l| l.bandwidth());
            let link = crate::topo::host_link(pcie);
            platform.set_link(host, node, link);
            dev_nodes.push(node);
            host_links.push(link);
            kinds.push(info.kind);
            archs.push(info.arch.clone());
            names.push(format!("{} ({})", info.name, info.kind));
        }
        // Between devices: direct where a peer path exists, else two copies via the host.
        for (i, a) in devices.iter().enumerate() {
            for (j, b) in devices.iter().enumerate().skip(i + 1) {
                let direct = a.can_copy_to_peer(b.as_ref()) && b.can_copy_to_peer(a.as_ref());
                let link = crate::topo::device_link(host_links[i], host_links[j], direct);
                platform.set_link(dev_nodes[i], dev_nodes[j], link);
            }
        }
        Layout {
            platform,
            kinds,
            archs,
            names,
        }
    }
}

/// Measured transfer rates per pair of memory nodes (host ↔ device, and device ↔ device
/// over a direct link), folded into the platform model.
pub(crate) struct LinkObservations {
    nodes: usize,
    /// `nodes × nodes`, only `[min(a, b) * nodes + max(a, b)]` used: (bytes, seconds).
    pairs: Vec<Mutex<(u64, f64)>>,
    version: AtomicU64,
}

impl LinkObservations {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            nodes,
            pairs: (0..nodes * nodes).map(|_| Mutex::new((0, 0.0))).collect(),
            version: AtomicU64::new(0),
        }
    }
    fn slot(&self, a: usize, b: usize) -> Option<&Mutex<(u64, f64)>> {
        let (lo, hi) = (a.min(b), a.max(b));
        (hi < self.nodes && lo != hi).then(|| &self.pairs[lo * self.nodes + hi])
    }
    /// One copy of `bytes` between nodes `a` and `b` that took `secs`.
    pub(crate) fn observe(&self, a: usize, b: usize, bytes: usize, secs: f64) {
        if let Some(m) = self.slot(a, b) {
            let mut g = m.lock();
            g.0 += bytes as u64;
            g.1 += secs;
            self.version.fetch_add(1, Ordering::Relaxed);
        }
    }
    /// Bytes per second seen between `a` and `b`, once enough bytes moved to say.
    pub(crate) fn bandwidth(&self, a: usize, b: usize) -> Option<f64> {
        let g = self.slot(a, b)?.lock();
        (g.0 >= 1 << 20 && g.1 > 0.0).then(|| g.0 as f64 / g.1)
    }
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod start_tests {
    use super::*;

    #[test]
    fn a_thread_that_fails_to_start_stops_and_joins_those_started_before_it() {
        let slot: FailSlot = Arc::new(Mutex::new(None));
        let mut b = RuntimeBuilder::default()
            .cpus(4)
            .pin(false)
            .model_path(None);
        b.fail_spawn_at = Some((2, slot.clone()));
        let Err(e) = b.build() else {
            panic!("the injected failure was not reported")
        };
        assert!(e.to_string().contains("failure injected"), "{e}");
        // `registry` and the caller's clones are gone with `build`; only the two started
        // workers could still hold it, parked forever, had they not been stopped and joined.
        let weak = slot.lock().clone().expect("the hook ran");
        assert!(
            weak.upgrade().is_none(),
            "started worker threads outlived the failed build"
        );
    }
}

#[cfg(test)]
mod link_tests {
    use super::LinkObservations;

    #[test]
    fn pairs_are_measured_both_ways_once_a_mebibyte_moved() {
        let l = LinkObservations::new(3);
        l.observe(0, 1, 1 << 19, 0.5);
        assert_eq!(l.bandwidth(1, 0), None, "half a MiB is not enough to say");
        l.observe(1, 0, 1 << 19, 0.5);
        assert_eq!(l.bandwidth(0, 1), Some((1 << 20) as f64));
        l.observe(2, 1, 4 << 20, 1.0);
        assert_eq!(l.bandwidth(1, 2), Some((4 << 20) as f64));
        assert_eq!(l.bandwidth(0, 2), None);
        // A node with itself, or out of range: ignored.
        l.observe(1, 1, 1 << 30, 1.0);
        l.observe(0, 7, 1 << 30, 1.0);
        assert_eq!(l.bandwidth(1, 1), None);
        assert_eq!(l.version(), 3);
    }
}

fn default_model_path() -> Option<PathBuf> {
    let host = flotilla_core::host::hostname();
    Some(
        flotilla_core::host::flotilla_home()?
            .join("perfmodels")
            .join(format!("{host}.json")),
    )
}

/// The devices asked for: the builder's choice, else `FLOTILLA_DEVICES` (`env`), else none.
fn device_choice(given: Option<&DeviceSelection>, env: Option<&str>) -> Result<DeviceSelection> {
    match (given, env) {
        (Some(d), _) => Ok(d.clone()),
        (None, Some(s)) => DeviceSelection::parse(s)
            .map_err(|e| RuntimeError::Config(format!("FLOTILLA_DEVICES={s}: {e}"))),
        (None, None) => Ok(DeviceSelection::None),
    }
}

/// `FLOTILLA_PIN_HOST`: unset or empty, 1, true, yes or on pin; 0, false, no or off do not.
fn pin_host_from_env() -> Result<bool> {
    parse_pin_host(std::env::var("FLOTILLA_PIN_HOST").ok().as_deref())
}

fn parse_pin_host(v: Option<&str>) -> Result<bool> {
    let Some(v) = v else {
        return Ok(true);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(RuntimeError::Config(format!(
            "FLOTILLA_PIN_HOST={v}: expected 1 or 0 (true/false, yes/no, on/off)"
        ))),
    }
}

/// [`RuntimeError::Poisoned`] when `data`'s last writer failed (its tasks have finished).
fn check_not_poisoned<T>(data: &Data<T>) -> Result<()> {
    if data.cell.poisoned.load(Ordering::Acquire) {
        return Err(RuntimeError::Poisoned {
            data: data.id().to_string(),
        });
    }
    Ok(())
}

fn load_model(path: &Path) -> Result<PerfModel> {
    match std::fs::read_to_string(path) {
        Ok(s) => PerfModel::from_json(&s).map_err(|e| {
            RuntimeError::Config(format!(
                "{}: corrupt performance model: {e} (it holds the task times measured so far: \
                 move it aside or delete it, and the runtime learns them again)",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(PerfModel::new()),
        Err(source) => Err(RuntimeError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn save_model(path: &Path, model: &PerfModel) -> Result<()> {
    let io = |source| RuntimeError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, model.to_json()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// A description of one processing unit of a runtime.
#[derive(Clone, Debug)]
pub struct UnitInfo {
    /// The unit's id (CPU workers first, then devices).
    pub id: flotilla_core::UnitId,
    /// Its kind.
    pub kind: DeviceKind,
    /// Its performance-model key.
    pub arch: String,
    /// Its memory node (0 is the host).
    pub mem_node: usize,
}

/// Flotilla's in-process runtime: CPU workers with work stealing, device workers, the data
/// manager and the scheduler. Dropping it waits for submitted tasks, stops the workers,
/// saves the performance models and writes the trace.
pub struct Runtime {
    registry: Arc<Registry>,
    threads: Vec<JoinHandle<()>>,
    seq: AtomicU64,
    model_path: Option<PathBuf>,
    devices: Vec<Arc<dyn Device>>,
    policy_kind: PolicyKind,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("cpus", &self.registry.n_cpu)
            .field("devices", &self.devices.len())
            .field("policy", &self.policy_kind)
            .finish()
    }
}

impl Runtime {
    /// A builder with defaults.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The number of CPU workers.
    pub fn cpu_workers(&self) -> usize {
        self.registry.n_cpu
    }

    /// The devices in use.
    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// The placement policy.
    pub fn policy(&self) -> PolicyKind {
        self.policy_kind
    }

    /// Every processing unit.
    pub fn units(&self) -> Vec<UnitInfo> {
        let t = &self.registry.units;
        (0..t.kinds.len())
            .map(|u| UnitInfo {
                id: flotilla_core::UnitId::new(u as u32),
                kind: t.kinds[u],
                arch: t.archs[u].clone(),
                mem_node: if u < self.registry.n_cpu {
                    HOST
                } else {
                    1 + u - self.registry.n_cpu
                },
            })
            .collect()
    }

    /// Runs `f` on a CPU worker, detached. A panic in it is caught and dropped.
    ///
    /// # Panics
    /// On a runtime with no CPU workers (`cpus(0)`): closures run on CPU workers only.
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) {
        self.closures_can_run("spawn");
        let job = Box::new(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        });
        self.registry.push_closure(Job::Closure(job));
    }

    /// Runs `f` in a scope whose spawned closures may borrow from the caller; returns when
    /// all of them have finished.
    ///
    /// # Panics
    /// On a runtime with no CPU workers (`cpus(0)`), as [`Runtime::spawn`].
    pub fn scope<'scope, R: Send>(&self, f: impl FnOnce(&Scope<'scope>) -> R + Send) -> R {
        self.closures_can_run("scope");
        scope::scope(&self.registry, f)
    }

    /// Calls `f(i)` for each `i` in `range` on the CPU workers.
    ///
    /// # Panics
    /// On a runtime with no CPU workers (`cpus(0)`), as [`Runtime::spawn`].
    pub fn parallel_for(
        &self,
        range: Range<usize>,
        schedule: Schedule,
        f: impl Fn(usize) + Sync + Send,
    ) {
        self.closures_can_run("parallel_for");
        scope::parallel_for(&self.registry, range, schedule, f)
    }

    /// Registers a vector of plain data; tasks access it through the returned handle and
    /// it may move to devices.
    pub fn register<T: bytemuck::Pod + Send + Sync>(&self, v: Vec<T>) -> Data<Vec<T>> {
        self.registry.data.register(v)
    }

    /// Registers any value; it stays in host memory (CPU tasks only).
    pub fn register_object<T: Send + Sync + 'static>(&self, v: T) -> Data<T> {
        self.registry.data.register_object(v)
    }

    /// Starts a task submission for `codelet`.
    pub fn task(&self, codelet: &Arc<Codelet>) -> TaskBuilder<'_> {
        TaskBuilder {
            registry: &self.registry,
            seq: &self.seq,
            codelet: codelet.clone(),
            accesses: Vec::new(),
            priority: 0,
        }
    }

    /// Waits for every submitted task; reports failures since the last call.
    pub fn wait_all(&self) -> Result<()> {
        let reg = &self.registry;
        {
            let mut g = reg.idle_lock.lock();
            while reg.outstanding.load(Ordering::Acquire) != 0 {
                reg.idle_cv.wait(&mut g);
            }
        }
        let count = reg.failure_count.swap(0, Ordering::AcqRel);
        let mut failures = std::mem::take(&mut *reg.failures.lock());
        match count {
            0 => Ok(()),
            1 if failures.len() == 1 => Err(failures.remove(0)),
            _ => Err(RuntimeError::Many {
                count,
                first: Box::new(if failures.is_empty() {
                    RuntimeError::Config("failures were not recorded".into())
                } else {
                    failures.remove(0)
                }),
            }),
        }
    }

    /// Closures need a CPU worker: without one they would wait for good.
    fn closures_can_run(&self, what: &str) {
        assert!(
            self.registry.n_cpu > 0,
            "Runtime::{what}: this runtime has no CPU workers (built with cpus(0)), and \
             closures run on CPU workers only; submit codelet tasks, or give it CPU workers"
        );
    }

    fn wait_for_data<T>(&self, data: &Data<T>) {
        let tasks: Vec<_> = {
            let d = data.cell.deps.lock();
            d.last_writer
                .iter()
                .chain(d.readers.iter())
                .filter_map(std::sync::Weak::upgrade)
                .collect()
        };
        for t in tasks {
            crate::task::TaskHandle::from_node(t).wait();
        }
    }

    /// Waits for the tasks using `data`, brings it home and returns a copy.
    pub fn read<T: bytemuck::Pod + Send + Sync>(&self, data: &Data<Vec<T>>) -> Result<Vec<T>> {
        self.wait_for_data(data);
        check_not_poisoned(data)?;
        self.registry
            .data
            .acquire(&data.cell, HOST, crate::data::Access::R)?;
        match data.cell.host().as_any().downcast_ref::<Vec<T>>() {
            Some(v) => Ok(v.clone()),
            None => Err(RuntimeError::Config(format!(
                "data {} is not a Vec",
                data.id()
            ))),
        }
    }

    /// Waits for the tasks using `data`, brings it home, frees its device replicas and
    /// returns it.
    pub fn unregister<T: Send + 'static>(&self, data: Data<T>) -> Result<T> {
        self.wait_for_data(&data);
        check_not_poisoned(&data)?;
        self.registry.data.bring_home(&data.cell)?;
        self.registry.data.unpin_host(&data.cell);
        // SAFETY: every task using the data has finished and the handle is consumed, so
        // nothing else reads or writes its host storage any more.
        let host = unsafe { data.cell.host_mut() };
        match host.take_any().downcast::<T>() {
            Ok(v) => Ok(*v),
            Err(_) => Err(RuntimeError::Config(format!(
                "data {} holds {}, not {}",
                data.id(),
                data.cell.type_name,
                crate::data::short_type_name::<T>()
            ))),
        }
    }

    /// How many codelet tasks each unit has executed (indexed like [`Runtime::units`]).
    pub fn executed_per_unit(&self) -> Vec<u64> {
        self.registry
            .executed
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// What the data manager has moved so far.
    pub fn transfer_stats(&self) -> TransferStats {
        self.registry.data.stats()
    }

    /// A copy of the current performance model.
    pub fn perf_model(&self) -> PerfModel {
        self.registry.sched.lock().model.clone()
    }

    /// Saves the performance model now (it is also saved at shutdown).
    pub fn save_model(&self) -> Result<()> {
        match &self.model_path {
            Some(p) => save_model(p, &self.registry.sched.lock().model),
            None => Ok(()),
        }
    }

    /// Waits for every task, stops the workers, saves the model, writes the trace.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        if self.threads.is_empty() {
            return Ok(());
        }
        let waited = self.wait_all();
        let reg = &self.registry;
        reg.terminate.store(true, Ordering::Release);
        reg.sleep.wake_all();
        // Closing the device queues ends the device threads.
        for q in &reg.devices {
            q.close();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let saved = self.save_model();
        let traced = match &reg.tracer {
            Some(t) => t.write(),
            None => Ok(()),
        };
        waited.and(saved).and(traced)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn the_builders_device_choice_wins_over_the_environment() {
        assert_eq!(
            device_choice(Some(&DeviceSelection::None), Some("all")).unwrap(),
            DeviceSelection::None
        );
        assert_eq!(
            device_choice(None, Some(" ALL ")).unwrap(),
            DeviceSelection::All
        );
        assert_eq!(device_choice(None, None).unwrap(), DeviceSelection::None);
        let e = device_choice(None, Some("gpu")).unwrap_err().to_string();
        assert!(
            e.contains("FLOTILLA_DEVICES=gpu: unknown device kind"),
            "{e}"
        );
    }

    #[test]
    fn pin_host_reads_the_usual_spellings_and_refuses_others() {
        for (v, on) in [
            (None, true),
            (Some(""), true),
            (Some("1"), true),
            (Some("Yes"), true),
            (Some("0"), false),
            (Some("false"), false),
            (Some(" off "), false),
        ] {
            assert_eq!(parse_pin_host(v).unwrap(), on, "{v:?}");
        }
        let e = parse_pin_host(Some("banana")).unwrap_err().to_string();
        assert!(e.contains("FLOTILLA_PIN_HOST=banana"), "{e}");
    }
}
