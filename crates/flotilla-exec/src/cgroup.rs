//! A cgroup v2 per process attempt: memory and CPU limits that cover every descendant,
//! OOM-kill detection, whole-tree usage and a clean kill of stragglers.
//!
//! The child joins its cgroup before `exec`: the parent opens `cgroup.procs` (close-on-exec)
//! and the child writes `0` ("myself") to it in `pre_exec`, so there is no window in which the
//! command runs, or forks, outside the cgroup. The directory is removed when the attempt ends.
//!
//! Cgroups are usually unavailable inside containers (cgroup v1, or a read-only or
//! controller-less v2 mount); [`cgroup_available`] says whether the usual place works, and
//! callers run without a [`CgroupSpec`] when it does not.

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
}

impl CgroupSpec {
    /// A spec with no limits (usage and straggler cleanup only).
    pub fn new(parent: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        CgroupSpec {
            parent: parent.into(),
            name: name.into(),
            mem_max: None,
            cpu_max: None,
        }
    }
}

/// Whether cgroup v2 limits can be used: [`CGROUP_ROOT`] is a cgroup2 mount offering the
/// `memory` controller, and this process may write there. Computed once.
pub fn cgroup_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let root = Path::new(CGROUP_ROOT);
        is_cgroup2(root)
            && fs::read_to_string(root.join("cgroup.controllers"))
                .map(|c| c.split_whitespace().any(|c| c == "memory"))
                .unwrap_or(false)
            && writable(root)
    })
}

/// Whether `path` is on a cgroup2 file system.
pub fn is_cgroup2(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: c_path is a valid NUL-terminated string and buf is large enough for statfs.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: statfs succeeded, so it filled buf.
    let stat = unsafe { buf.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between libcs
    let magic = stat.f_type as i64;
    magic == CGROUP2_SUPER_MAGIC
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
    pub(crate) memory_peak: Option<u64>,
    pub(crate) cpu_usec: Option<u64>,
}

/// A live cgroup for one attempt; removed on drop.
#[derive(Debug)]
pub(crate) struct Cgroup {
    path: PathBuf,
    procs: File,
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
        if cpu {
            let _ = write_file(&control, "+cpu");
        }
    }
}

impl Cgroup {
    /// Creates `parent/name` and applies the limits.
    pub(crate) fn create(spec: &CgroupSpec) -> Result<Cgroup> {
        if !spec.parent.is_dir() {
            fs::create_dir_all(&spec.parent)
                .map_err(setup_err("create the parent directory", &spec.parent))?;
        }
        enable_controllers(&spec.parent, spec.cpu_max.is_some());
        let path = spec.parent.join(&spec.name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            // Left over by an attempt of a crashed executor: reuse it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(setup_err("create the directory", &path)(e)),
        }
        // From here on, dropping `cgroup` removes the directory on every error path.
        let procs = OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))
            .map_err(setup_err("open cgroup.procs", &path));
        let procs = match procs {
            Ok(p) => p,
            Err(e) => {
                let _ = fs::remove_dir(&path);
                return Err(e);
            }
        };
        let cgroup = Cgroup { path, procs };
        if let Some(bytes) = spec.mem_max {
            write_file(&cgroup.path.join("memory.max"), &bytes.to_string())
                .map_err(setup_err("write memory.max", &cgroup.path))?;
            // Without these the limit could be dodged by swapping, or kill only one process.
            let _ = write_file(&cgroup.path.join("memory.swap.max"), "0");
            let _ = write_file(&cgroup.path.join("memory.oom.group"), "1");
        }
        if let Some(cores) = spec.cpu_max {
            const PERIOD: u64 = 100_000;
            let quota = ((cores * PERIOD as f64).round() as u64).max(1000);
            write_file(&cgroup.path.join("cpu.max"), &format!("{quota} {PERIOD}"))
                .map_err(setup_err("write cpu.max", &cgroup.path))?;
        }
        Ok(cgroup)
    }

    /// The descriptor the child writes `0` to (from `pre_exec`) to join the cgroup.
    pub(crate) fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Kills every process left in the cgroup.
    pub(crate) fn kill_all(&self) {
        if write_file(&self.path.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        // Kernels before 5.14 have no cgroup.kill: signal the members one by one.
        if let Ok(pids) = fs::read_to_string(self.path.join("cgroup.procs")) {
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
        let read = |file: &str| fs::read_to_string(self.path.join(file)).ok();
        let field = |text: &str, name: &str| {
            text.lines().find_map(|line| {
                let (key, value) = line.split_once(' ')?;
                (key == name).then(|| value.trim().parse::<u64>().ok())?
            })
        };
        CgroupStats {
            oom_kills: read("memory.events")
                .and_then(|t| field(&t, "oom_kill"))
                .unwrap_or(0),
            memory_peak: read("memory.peak").and_then(|t| t.trim().parse().ok()),
            cpu_usec: read("cpu.stat").and_then(|t| field(&t, "usage_usec")),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Killed stragglers leave the cgroup asynchronously: retry briefly (bounded, ~200 ms).
        for _ in 0..100 {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    self.kill_all();
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => return,
            }
        }
    }
}
