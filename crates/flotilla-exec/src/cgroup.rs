//! A cgroup per process attempt: memory, CPU and process-count limits that cover every
//! descendant, OOM-kill detection, whole-tree usage and a clean kill of stragglers.
//!
//! Both hierarchies are supported, as machines have them: cgroup v2 (one tree at
//! [`CGROUP_ROOT`]) and cgroup v1 (one tree per controller, `CGROUP_ROOT/memory`,
//! `CGROUP_ROOT/pids`, `CGROUP_ROOT/cpu`, `CGROUP_ROOT/cpuacct`); [`hierarchy`] says which
//! one this machine offers and this process may write. A [`CgroupSpec`] with a relative
//! `parent` is placed in whichever it is (in v1, the same relative path under every
//! controller); an absolute `parent` names a v2 folder directly.
//!
//! The child joins its cgroup before `exec`: the parent opens each `cgroup.procs`
//! (close-on-exec) and the child writes `0` ("myself") to them in `pre_exec`, so there is no
//! window in which the command runs, or forks, outside the cgroup. The folders are removed
//! when the attempt ends.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// Where the root of the cgroup v2 hierarchy is normally mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;

/// The cgroup hierarchy of this machine, as this process can use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2 mounted at this folder, with the memory controller, writable.
    V2(PathBuf),
    /// cgroup v1: the writable controller trees found (`memory` and `pids` at least).
    V1(Vec<(Controller, PathBuf)>),
}

/// A cgroup v1 controller Flotilla uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// `memory.limit_in_bytes`, OOM kills, peak usage.
    Memory,
    /// `pids.max`: fork bombs stop there.
    Pids,
    /// `cpu.cfs_quota_us`.
    Cpu,
    /// `cpuacct.usage`: CPU time of the whole tree.
    Cpuacct,
}

impl Controller {
    const ALL: [Controller; 4] = [
        Controller::Memory,
        Controller::Pids,
        Controller::Cpu,
        Controller::Cpuacct,
    ];

    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
        }
    }
}

/// The hierarchy this process can put attempts in, if any (computed once).
pub fn hierarchy() -> Option<Hierarchy> {
    static FOUND: OnceLock<Option<Hierarchy>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let root = Path::new(CGROUP_ROOT);
            let v2 = is_cgroup2(root)
                && fs::read_to_string(root.join("cgroup.controllers"))
                    .map(|c| c.split_whitespace().any(|c| c == "memory"))
                    .unwrap_or(false)
                && writable(root);
            if v2 {
                return Some(Hierarchy::V2(root.to_path_buf()));
            }
            let found: Vec<(Controller, PathBuf)> = Controller::ALL
                .iter()
                .map(|&c| (c, root.join(c.name())))
                .filter(|(_, p)| fs_magic(p) == Some(CGROUP_SUPER_MAGIC) && writable(p))
                .collect();
            let has = |c| found.iter().any(|(x, _)| *x == c);
            (has(Controller::Memory) && has(Controller::Pids)).then_some(Hierarchy::V1(found))
        })
        .clone()
}

/// A cgroup v2 to run one process attempt in.
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupSpec {
    /// The folder under which the attempt's cgroup is made, e.g. `/sys/fs/cgroup/flotilla`;
    /// created if missing. Its `cgroup.subtree_control` gets `+memory` (and `+cpu` when
    /// `cpu_max` is set) so the limits apply; that needs `parent` to hold no processes itself.
    pub parent: PathBuf,
    /// The attempt's cgroup name (unique among running attempts), e.g. `job3-task17-a1`.
    pub name: String,
    /// `memory.max` in bytes (swap is turned off for the cgroup too, so the limit bites).
    pub mem_max: Option<u64>,
    /// `cpu.max` in cores, e.g. `1.5`.
    pub cpu_max: Option<f64>,
    /// `pids.max`: the most processes and threads at once (a fork bomb stops there).
    pub pids_max: Option<u64>,
}

impl CgroupSpec {
    /// A spec with no limits (usage and straggler cleanup only).
    pub fn new(parent: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        CgroupSpec {
            parent: parent.into(),
            name: name.into(),
            mem_max: None,
            cpu_max: None,
            pids_max: None,
        }
    }
}

/// Kills every process in the cgroups under `parent` (relative, as in [`CgroupSpec`]) and
/// removes them: what a worker that restarts does with its previous life's attempts.
pub fn cleanup_cgroups(parent: &Path) {
    for root in roots_of(parent) {
        let Ok(entries) = fs::read_dir(&root) else {
            continue;
        };
        for dir in entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
            for _ in 0..100 {
                let pids = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in pids
                    .lines()
                    .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                match fs::remove_dir(&dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    _ => break,
                }
            }
        }
    }
}

/// The roots `parent` (relative) lies under: one for v2, one per controller for v1.
fn roots_of(parent: &Path) -> Vec<PathBuf> {
    match hierarchy() {
        Some(Hierarchy::V2(root)) => vec![root.join(parent)],
        Some(Hierarchy::V1(ctls)) => ctls.into_iter().map(|(_, r)| r.join(parent)).collect(),
        None => Vec::new(),
    }
}

/// Kills and removes the cgroup folders directly under `parent` (relative) whose names
/// `stale` accepts, with everything under them: what a worker does at start with the folders
/// of its earlier lives, leaving alone those of a live worker of the same name.
pub fn cleanup_stale_cgroups(parent: &Path, stale: impl Fn(&str) -> bool) {
    let mut names: Vec<String> = roots_of(parent)
        .iter()
        .filter_map(|root| fs::read_dir(root).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| stale(n))
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        remove_cgroup_tree(&parent.join(name));
    }
}

/// Removes the cgroup folders directly under `parent` (relative) whose names `stale`
/// accepts, with the cgroups under them, where no process is left in them: killing nothing
/// (what workers of other names left when they were killed; the kernel refuses to remove a
/// cgroup that holds a process, so one of a live worker, seen as gone from another PID
/// namespace, stays).
pub fn remove_empty_stale_cgroups(parent: &Path, stale: impl Fn(&str) -> bool) {
    fn rmdir_tree(dir: &Path) {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rmdir_tree(&e.path());
                }
            }
        }
        let _ = fs::remove_dir(dir);
    }
    for root in roots_of(parent) {
        let Ok(entries) = fs::read_dir(&root) else {
            continue;
        };
        for e in entries.flatten() {
            let stale_one = e.file_type().is_ok_and(|t| t.is_dir())
                && e.file_name().to_str().is_some_and(&stale);
            if stale_one {
                rmdir_tree(&e.path());
            }
        }
    }
}

/// Kills every process in the cgroups under `parent` (relative), removes them, then `parent`
/// itself where it is empty.
pub fn remove_cgroup_tree(parent: &Path) {
    cleanup_cgroups(parent);
    for root in roots_of(parent) {
        let _ = fs::remove_dir(root);
    }
}

/// Whether cgroup limits can be used: [`hierarchy`] found a v2 mount with the `memory`
/// controller or v1 `memory` and `pids` trees, writable by this process.
pub fn cgroup_available() -> bool {
    hierarchy().is_some()
}

/// Whether `path` is on a cgroup2 file system.
pub fn is_cgroup2(path: &Path) -> bool {
    fs_magic(path) == Some(CGROUP2_SUPER_MAGIC)
}

fn fs_magic(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: c_path is a valid NUL-terminated string and buf is large enough for statfs.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statfs succeeded, so it filled buf.
    let stat = unsafe { buf.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between libcs
    Some(stat.f_type as i64)
}

fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c_path is a valid NUL-terminated string.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

/// What a cgroup measured over the attempt.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CgroupStats {
    pub(crate) oom_kills: u64,
    /// Forks refused at `pids.max` (`pids.events`' `max`).
    pub(crate) pids_refused: u64,
    pub(crate) memory_peak: Option<u64>,
    pub(crate) cpu_usec: Option<u64>,
}

/// A live cgroup for one attempt (one folder in v2, one per controller in v1); removed on
/// drop, or (v1) kept empty for the next attempt under the same parent.
#[derive(Debug)]
pub(crate) struct Cgroup {
    /// The folders, by controller (`None`: the v2 folder).
    dirs: Vec<(Option<Controller>, PathBuf)>,
    procs: Vec<File>,
    /// v1: the parent it goes back to the pool under when it is emptied.
    pool: Option<PathBuf>,
    /// v1: the OOM kills counted before this attempt (a reused cgroup's counter goes on).
    oom_base: u64,
    /// v1: the forks refused at `pids.max` before this attempt (the same).
    pids_base: u64,
}

/// v1 cgroups emptied by attempts that ended, by parent, for the next attempts: making and
/// removing the four folders of a v1 cgroup costs an attempt about 1.5 ms (memory cgroups
/// are freed after an RCU grace period), resetting a used one a few writes. v2 cgroups are
/// not kept (their peak memory cannot be reset on every kernel).
type Pool = Vec<(PathBuf, Vec<Vec<(Option<Controller>, PathBuf)>>)>;
static POOL: Mutex<Pool> = parking_lot::const_mutex(Vec::new());

/// The most emptied cgroups kept per parent.
const POOL_MAX: usize = 64;

/// The most memory (page cache) an emptied cgroup may still be charged with to be kept.
const POOL_MAX_CHARGED: u64 = 16 << 20;

/// Removes the emptied cgroups kept for reuse (a worker that stops calls it).
pub fn drain_cgroup_pool() {
    let pool = std::mem::take(&mut *POOL.lock());
    for (_, sets) in pool {
        for dirs in sets {
            for (_, d) in dirs {
                let _ = fs::remove_dir(d);
            }
        }
    }
}

fn pool_take(parent: &Path) -> Option<Vec<(Option<Controller>, PathBuf)>> {
    let mut pool = POOL.lock();
    pool.iter_mut()
        .find(|(p, _)| p == parent)
        .and_then(|(_, sets)| sets.pop())
}

fn pool_put(
    parent: &Path,
    dirs: Vec<(Option<Controller>, PathBuf)>,
) -> std::result::Result<(), Vec<(Option<Controller>, PathBuf)>> {
    let mut pool = POOL.lock();
    let i = match pool.iter().position(|(p, _)| p == parent) {
        Some(i) => i,
        None => {
            pool.push((parent.to_path_buf(), Vec::new()));
            pool.len() - 1
        }
    };
    let sets = &mut pool[i].1;
    if sets.len() >= POOL_MAX {
        return Err(dirs);
    }
    sets.push(dirs);
    Ok(())
}

fn setup_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Cgroup {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    // One write(2) per value, as cgroupfs expects.
    OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// Enables controllers in `parent`'s subtree once per parent and process.
fn enable_controllers(parent: &Path, cpu: bool) {
    static DONE: Mutex<Option<HashSet<(PathBuf, bool)>>> = parking_lot::const_mutex(None);
    let mut done = DONE.lock();
    let done = done.get_or_insert_with(HashSet::new);
    if done.insert((parent.to_path_buf(), cpu)) {
        let control = parent.join("cgroup.subtree_control");
        // Each may fail (already on, not offered, parent has processes): the limit writes
        // that follow report what actually matters.
        let _ = write_file(&control, "+memory");
        let _ = write_file(&control, "+pids");
        if cpu {
            let _ = write_file(&control, "+cpu");
        }
    }
}

fn make_dir(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.is_dir() {
            fs::create_dir_all(parent).map_err(setup_err("create the parent directory", parent))?;
        }
    }
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        // Left over by an attempt of a crashed executor: reuse it.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(setup_err("create the directory", path)(e)),
    }
}

const CPU_PERIOD_US: u64 = 100_000;

fn cpu_quota_us(cores: f64) -> u64 {
    ((cores * CPU_PERIOD_US as f64).round() as u64).max(1000)
}

impl Cgroup {
    /// Creates the attempt's folder(s) and applies the limits.
    pub(crate) fn create(spec: &CgroupSpec) -> Result<Cgroup> {
        let v2_dir = |parent: &Path| {
            enable_controllers(parent, spec.cpu_max.is_some());
            vec![(None, parent.join(&spec.name))]
        };
        let dirs = if spec.parent.is_absolute() {
            if !spec.parent.is_dir() {
                fs::create_dir_all(&spec.parent)
                    .map_err(setup_err("create the parent directory", &spec.parent))?;
            }
            v2_dir(&spec.parent)
        } else {
            match hierarchy() {
                Some(Hierarchy::V2(root)) => {
                    let parent = root.join(&spec.parent);
                    if !parent.is_dir() {
                        fs::create_dir_all(&parent)
                            .map_err(setup_err("create the parent directory", &parent))?;
                    }
                    v2_dir(&parent)
                }
                Some(Hierarchy::V1(ctls)) => {
                    if let Some(dirs) = pool_take(&spec.parent) {
                        return Cgroup::reuse(spec, dirs);
                    }
                    ctls.iter()
                        .map(|(c, root)| (Some(*c), root.join(&spec.parent).join(&spec.name)))
                        .collect()
                }
                None => {
                    return Err(Error::Cgroup {
                        what: "find a writable cgroup hierarchy",
                        path: PathBuf::from(CGROUP_ROOT),
                        source: io::Error::new(io::ErrorKind::NotFound, "no usable cgroup mount"),
                    })
                }
            }
        };
        // From here on, dropping `cgroup` removes the folders made on every error path.
        let v1 = dirs.iter().all(|(c, _)| c.is_some());
        let mut cgroup = Cgroup::adopt(dirs, true)?;
        cgroup.apply(spec)?;
        // Set up whole: it may go back to the pool when emptied.
        cgroup.pool = (v1 && !spec.parent.is_absolute()).then(|| spec.parent.clone());
        Ok(cgroup)
    }

    /// A cgroup of `dirs` (made first when `make`) with their `cgroup.procs` open; dropping
    /// it on an error path removes what was taken.
    fn adopt(dirs: Vec<(Option<Controller>, PathBuf)>, make: bool) -> Result<Cgroup> {
        let mut cgroup = Cgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            pool: None,
            oom_base: 0,
            pids_base: 0,
        };
        for (c, dir) in dirs {
            if make {
                make_dir(&dir)?;
            }
            cgroup.dirs.push((c, dir.clone()));
            let procs = OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map_err(setup_err("open cgroup.procs", &dir))?;
            cgroup.procs.push(procs);
        }
        Ok(cgroup)
    }

    /// A v1 cgroup from the pool, its counters reset and `spec`'s limits applied (the ones
    /// `spec` does not set back to none).
    fn reuse(spec: &CgroupSpec, dirs: Vec<(Option<Controller>, PathBuf)>) -> Result<Cgroup> {
        let mut cgroup = Cgroup::adopt(dirs, false)?;
        let at = |c: Controller, file: &str| cgroup.dir(Some(c)).map(|d| d.join(file));
        for (c, file, value) in [
            (Controller::Memory, "memory.max_usage_in_bytes", "0"),
            (Controller::Cpuacct, "cpuacct.usage", "0"),
            (Controller::Memory, "memory.limit_in_bytes", "-1"),
            (Controller::Memory, "memory.memsw.limit_in_bytes", "-1"),
            (Controller::Cpu, "cpu.cfs_quota_us", "-1"),
            (Controller::Pids, "pids.max", "max"),
        ] {
            if let Some(path) = at(c, file) {
                let _ = write_file(&path, value);
            }
        }
        // Counters that cannot be reset: what they held before this attempt.
        let counter = |c: Controller, file: &str, key: &str| {
            at(c, file)
                .and_then(|p| fs::read_to_string(p).ok())
                .and_then(|t| {
                    t.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == key).then(|| v.trim().parse().ok())?
                    })
                })
                .unwrap_or(0)
        };
        let bases = (
            counter(Controller::Memory, "memory.oom_control", "oom_kill"),
            counter(Controller::Pids, "pids.events", "max"),
        );
        (cgroup.oom_base, cgroup.pids_base) = bases;
        cgroup.apply(spec)?;
        // Only a cgroup that was set up whole goes back to the pool.
        cgroup.pool = Some(spec.parent.clone());
        Ok(cgroup)
    }

    /// Whether no process is left in it (every process is in all of its controllers' folders
    /// or none: the first one tells).
    fn is_empty(&self) -> bool {
        self.dirs.first().is_none_or(|(_, d)| {
            fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty())
        })
    }

    fn dir(&self, c: Option<Controller>) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(x, _)| *x == c)
            .map(|(_, p)| p.as_path())
    }

    fn is_v2(&self) -> bool {
        self.dir(None).is_some()
    }

    fn apply(&self, spec: &CgroupSpec) -> Result<()> {
        let write = |c: Option<Controller>, file: &'static str, value: String| -> Result<()> {
            let Some(dir) = self.dir(c) else {
                return Err(Error::Cgroup {
                    what: file,
                    path: PathBuf::from(CGROUP_ROOT),
                    source: io::Error::new(
                        io::ErrorKind::NotFound,
                        "the controller is not mounted or not writable",
                    ),
                });
            };
            write_file(&dir.join(file), &value).map_err(setup_err(file, dir))
        };
        let v2 = self.is_v2();
        if let Some(bytes) = spec.mem_max {
            if v2 {
                write(None, "memory.max", bytes.to_string())?;
                // Without these the limit could be dodged by swapping, or kill only one process.
                let _ = write(None, "memory.swap.max", "0".into());
                let _ = write(None, "memory.oom.group", "1".into());
            } else {
                write(
                    Some(Controller::Memory),
                    "memory.limit_in_bytes",
                    bytes.to_string(),
                )?;
                let _ = write(
                    Some(Controller::Memory),
                    "memory.memsw.limit_in_bytes",
                    bytes.to_string(),
                );
            }
        }
        if let Some(cores) = spec.cpu_max {
            let quota = cpu_quota_us(cores);
            if v2 {
                write(None, "cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
            } else if self.dir(Some(Controller::Cpu)).is_some() {
                write(
                    Some(Controller::Cpu),
                    "cpu.cfs_period_us",
                    CPU_PERIOD_US.to_string(),
                )?;
                write(Some(Controller::Cpu), "cpu.cfs_quota_us", quota.to_string())?;
            }
        }
        if let Some(n) = spec.pids_max {
            let c = if v2 { None } else { Some(Controller::Pids) };
            write(c, "pids.max", n.to_string())?;
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes `0` to, to join the cgroup (what
    /// `flotilla-enter` does for a task started in a sandbox holder).
    pub(crate) fn procs_paths(&self) -> Vec<std::path::PathBuf> {
        self.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// The descriptors the child writes `0` to (from `pre_exec`) to join the cgroup.
    pub(crate) fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Kills every process left in the cgroup.
    pub(crate) fn kill_all(&self) {
        if let Some(dir) = self.dir(None) {
            if write_file(&dir.join("cgroup.kill"), "1").is_ok() {
                return;
            }
        }
        // v1, and kernels before 5.14: signal the members one by one.
        let Some((_, dir)) = self.dirs.first() else {
            return;
        };
        if let Ok(pids) = fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in pids
                .lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }

    /// Reads the counters (call after the child was reaped).
    pub(crate) fn stats(&self) -> CgroupStats {
        let read = |c: Option<Controller>, file: &str| {
            self.dir(c)
                .and_then(|d| fs::read_to_string(d.join(file)).ok())
        };
        let field = |text: &str, name: &str| {
            text.lines().find_map(|line| {
                let (key, value) = line.split_once(' ')?;
                (key == name).then(|| value.trim().parse::<u64>().ok())?
            })
        };
        if self.is_v2() {
            return CgroupStats {
                oom_kills: read(None, "memory.events")
                    .and_then(|t| field(&t, "oom_kill"))
                    .unwrap_or(0),
                pids_refused: read(None, "pids.events")
                    .and_then(|t| field(&t, "max"))
                    .unwrap_or(0),
                memory_peak: read(None, "memory.peak").and_then(|t| t.trim().parse().ok()),
                cpu_usec: read(None, "cpu.stat").and_then(|t| field(&t, "usage_usec")),
            };
        }
        let mem = Some(Controller::Memory);
        CgroupStats {
            oom_kills: read(mem, "memory.oom_control")
                .and_then(|t| field(&t, "oom_kill"))
                .unwrap_or(0)
                .saturating_sub(self.oom_base),
            // A v1 cgroup kept for the next attempt counts on: this attempt's are those
            // after its base (a task after a fork bomb in the same cgroup was said to have
            // reached its process limit).
            pids_refused: read(Some(Controller::Pids), "pids.events")
                .and_then(|t| field(&t, "max"))
                .unwrap_or(0)
                .saturating_sub(self.pids_base),
            memory_peak: read(mem, "memory.max_usage_in_bytes").and_then(|t| t.trim().parse().ok()),
            cpu_usec: read(Some(Controller::Cpuacct), "cpuacct.usage")
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map(|ns| ns / 1000),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // v1: an emptied cgroup goes back to the pool (stragglers were killed; they leave
        // the cgroup a moment after: short waits, bounded).
        // One still charged with much page cache of its attempt's files is not kept: that
        // cache counted in the next attempt's peak memory (`true` read 178 MiB after a task
        // that wrote large files), and reclaiming it (`memory.force_empty`) costs more than a
        // new cgroup. Removed, its charges move to the parent.
        let charged = self
            .dir(Some(Controller::Memory))
            .and_then(|d| fs::read_to_string(d.join("memory.usage_in_bytes")).ok())
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if charged > POOL_MAX_CHARGED {
            self.pool = None;
        }
        if let Some(parent) = self.pool.take() {
            let mut wait = Duration::from_micros(20);
            for _ in 0..60 {
                if self.is_empty() {
                    self.procs.clear();
                    match pool_put(&parent, std::mem::take(&mut self.dirs)) {
                        Ok(()) => return,
                        Err(dirs) => {
                            self.dirs = dirs;
                            break;
                        }
                    }
                }
                self.kill_all();
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(2));
            }
        }
        // Killed stragglers leave the cgroup asynchronously: retry briefly (bounded, ~200 ms).
        for (_, dir) in &self.dirs {
            let mut wait = Duration::from_micros(20);
            for _ in 0..150 {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        self.kill_all();
                        // The exited task leaves its cgroup a moment after it is reaped:
                        // short waits first.
                        std::thread::sleep(wait);
                        wait = (wait * 2).min(Duration::from_millis(2));
                    }
                    Err(_) => break,
                }
            }
        }
    }
}
