//! A sandbox for a process task, made by bubblewrap (`bwrap`, Debian package `bubblewrap`):
//! its own user, pid, ipc, uts and (unless the task may use the network) network namespaces,
//! a root holding only the host's system folders read-only, one writable folder (the
//! attempt's sandbox, or in shared staging the job folder), a private `/tmp`, and nothing of
//! the worker's state, work folder, other sandboxes or tokens.
//!
//! Inside, the task cannot see the worker's processes (so cannot signal it), and dies with
//! its sandbox: bubblewrap's `--die-with-parent`, and the pid namespace whose init it is
//! takes every descendant with it.
//!
//! A fresh network namespace per task is the expensive part of a sandbox (a kernel-wide
//! lock); a worker that may (root) makes one empty namespace at start ([`EmptyNetns`]) and
//! each sandbox joins it instead.
//!
//! Faster still, a [`Holder`]: one bubblewrap sandbox a worker builds at start (user, mount,
//! network, IPC and UTS namespaces; the system read-only; `/proc`, `/dev`; nothing of the
//! worker's) that each task *enters* through `flotilla-enter` (spawned, not forked from the
//! worker) instead of building a sandbox of its own: the task gets a mount namespace of its
//! own in which only its folder (taken from the worker's namespace with `open_tree` and
//! attached with `move_mount`) is writable and `/tmp` is fresh, its own PID and IPC
//! namespaces, and no capabilities. Used for tasks without network and devices.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How a process task is sandboxed.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    /// The `bwrap` program.
    pub bwrap: PathBuf,
    /// The one folder the task may write (bound at the same path).
    pub writable: PathBuf,
    /// Whether the task may use the network (the host's namespace).
    pub network: bool,
    /// An empty network namespace to join instead of making one (see [`EmptyNetns`]).
    pub netns: Option<RawFd>,
    /// Devices the task needs (its GPUs: `/dev/nvidia0`, `/dev/nvidiactl`, ...).
    pub devices: Vec<PathBuf>,
    /// A folder made by [`prepare_etc`] to show as `/etc` (one mount instead of one per
    /// file: each mount costs the sandbox time); `None`: the files are bound one by one.
    pub etc: Option<PathBuf>,
    /// Enter this holder instead of building a sandbox (ignored for a task with network or
    /// devices, which get one of their own).
    pub holder: Option<HolderRef>,
}

/// How to enter a [`Holder`]: the `flotilla-enter` program and the holder's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderRef {
    /// The `flotilla-enter` program.
    pub enter: PathBuf,
    /// A process inside the holder (its namespaces are joined through `/proc/PID/ns`).
    pub pid: u32,
    /// The inode of the holder's mount namespace: a process with that pid but another
    /// namespace (the holder died and its pid was reused) is never entered.
    pub mnt: u64,
}

/// The inode of `pid`'s mount namespace.
fn mnt_ino(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|m| m.ino())
}

impl SandboxSpec {
    /// The holder this task enters, if it may: no network, no devices, and the holder is
    /// still there.
    pub fn holder_for_task(&self) -> Option<&HolderRef> {
        self.holder
            .as_ref()
            .filter(|h| !self.network && self.devices.is_empty() && mnt_ino(h.pid) == Some(h.mnt))
    }

    /// The program and arguments that start `cmd` in `cwd` inside `holder`, joining the
    /// cgroup whose `cgroup.procs` files are `cgroup_procs` and with `limits` as rlimits
    /// (`flotilla-enter` applies them: no `pre_exec` hook, so the worker spawns, never forks).
    pub fn enter_line(
        &self,
        holder: &HolderRef,
        cmd: &[String],
        cwd: &Path,
        cgroup_procs: &[PathBuf],
        limits: &crate::Limits,
    ) -> (PathBuf, Vec<String>) {
        let mut a = vec![
            "--holder".to_string(),
            holder.pid.to_string(),
            "--holder-mnt".to_string(),
            holder.mnt.to_string(),
            "--own".to_string(),
            self.writable.display().to_string(),
            "--cwd".to_string(),
            cwd.display().to_string(),
        ];
        for p in cgroup_procs {
            a.push("--cgroup-procs".into());
            a.push(p.display().to_string());
        }
        for (name, v) in [
            ("as", limits.mem_bytes),
            ("cpu", limits.cpu_seconds),
            ("nofile", limits.open_files),
            ("nproc", limits.processes),
            ("fsize", limits.file_bytes),
        ] {
            if let Some(v) = v {
                a.push("--rlimit".into());
                a.push(format!("{name}={v}"));
            }
        }
        a.push("--".into());
        a.extend(cmd.iter().cloned());
        (holder.enter.clone(), a)
    }
}

/// A worker's sandbox holder: a bubblewrap sandbox with nothing running in it but a
/// `sleep`, whose namespaces tasks enter (see the module's documentation). Killed when
/// dropped, and with its worker (`--die-with-parent`).
#[derive(Debug)]
pub struct Holder {
    bwrap: std::process::Child,
    inner: u32,
    mnt: u64,
}

impl Holder {
    /// Starts one with `bwrap`, `/etc` shown from `etc` (see [`prepare_etc`]); waits until
    /// it is set up.
    pub fn start(bwrap: &Path, etc: Option<&Path>) -> io::Result<Holder> {
        let spec = SandboxSpec {
            bwrap: bwrap.to_path_buf(),
            writable: PathBuf::new(),
            network: false,
            netns: None,
            devices: Vec::new(),
            etc: etc.map(Path::to_path_buf),
            holder: None,
        };
        let mut args = spec.system_args();
        args.splice(
            0..0,
            [
                "--unshare-user",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-net",
                "--hostname",
                "flotilla-task",
                "--die-with-parent",
            ]
            .map(String::from),
        );
        args.extend(["--".to_string(), "sleep".into(), "infinity".into()]);
        let mut bwrap = Command::new(bwrap)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let outer = bwrap.id();
        // bwrap's child is the process in the namespaces; set up once it runs `sleep`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(inner) =
                std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
                    .ok()
                    .and_then(|s| {
                        s.split_whitespace()
                            .next()
                            .and_then(|p| p.parse::<u32>().ok())
                    })
            {
                let comm =
                    std::fs::read_to_string(format!("/proc/{inner}/comm")).unwrap_or_default();
                if comm.trim() == "sleep" {
                    if let Some(mnt) = mnt_ino(inner) {
                        return Ok(Holder { bwrap, inner, mnt });
                    }
                }
            }
            if let Some(status) = bwrap.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = bwrap.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return Err(io::Error::other(format!(
                    "the sandbox holder ended at once ({status}): {}",
                    err.trim()
                )));
            }
            if std::time::Instant::now() > deadline {
                let _ = bwrap.kill();
                let _ = bwrap.wait();
                return Err(io::Error::other("the sandbox holder did not start in 20 s"));
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// How tasks enter it, with the `flotilla-enter` program `enter`.
    pub fn reference(&self, enter: &Path) -> HolderRef {
        HolderRef {
            enter: enter.to_path_buf(),
            pid: self.inner,
            mnt: self.mnt,
        }
    }

    /// Its bubblewrap process (its process group's id), for a task guard.
    pub fn pid(&self) -> u32 {
        self.bwrap.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: killpg of the holder's own process group.
        unsafe { libc::killpg(self.bwrap.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.bwrap.wait();
    }
}

/// The host folders a sandbox sees, read-only (those that exist; a link such as `/bin ->
/// usr/bin` is recreated as a link).
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys",
];

/// The folders of a `PATH` value (`:`-separated) that a sandbox does not see: those outside
/// the system folders, such as a pyenv, conda or venv's `bin` or `~/.cargo/bin` (`/usr/local/
/// bin` is seen). A program found there outside a sandbox (`python3`) is another one, or
/// none, in it.
pub fn hidden_path_entries(path: &str) -> Vec<String> {
    let mut hidden: Vec<String> = Vec::new();
    for e in path.split(':').filter(|e| e.starts_with('/')) {
        let seen = SYSTEM
            .iter()
            .any(|s| Path::new(e).starts_with(Path::new(s)));
        if !seen && !hidden.iter().any(|h| h == e) {
            hidden.push(e.to_string());
        }
    }
    hidden
}

/// What of `/etc` a sandbox sees, read-only: what programs need to link, resolve names,
/// find certificates and OpenCL drivers; not the rest (`shadow`, keys, the machine's
/// configuration).
const ETC: &[&str] = &[
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/localtime",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/OpenCL",
    "/etc/mime.types",
];

/// The folder, in a job folder, that holds Flotilla's own state when a coordinator or
/// `flotilla run` keeps it there: a task never sees inside it.
pub const STATE_DIR: &str = ".flotilla";

/// Folders under [`ETC`] a task never sees: private keys. Hidden under an empty tmpfs when
/// `/etc` is bound file by file, left out of [`prepare_etc`]'s copy (as is anything others
/// may not read). Found packaging the systemd units: a root worker's sandboxed task read
/// `/etc/ssl/private/ssl-cert-snakeoil.key`.
const HIDDEN: &[&str] = &["/etc/ssl/private"];

impl SandboxSpec {
    /// The bubblewrap arguments that put `cmd`, run in `cwd`, in this sandbox.
    pub fn command_line(&self, cmd: &[String], cwd: &Path) -> Vec<String> {
        let mut a: Vec<String> = Vec::with_capacity(64 + cmd.len());
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        push(&[
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "flotilla-task",
            "--die-with-parent",
            "--new-session",
        ]);
        if !self.network && self.netns.is_none() {
            push(&["--unshare-net"]);
        }
        a.extend(self.system_args());
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        for d in &self.devices {
            let d = d.display().to_string();
            push(&["--dev-bind-try", &d, &d]);
        }
        let w = self.writable.display().to_string();
        push(&["--bind", &w, &w]);
        // Flotilla's own state in the job folder (`flotilla run`'s, or a server's default
        // `.flotilla`: tokens, the journal, the worker's folder) is hidden under an empty,
        // read-only tmpfs (a task read the admin token and could write the journal).
        let state = self.writable.join(STATE_DIR);
        if state.is_dir() {
            let state = state.display().to_string();
            push(&["--perms", "0555", "--tmpfs", &state, "--remount-ro", &state]);
        }
        let cwd = cwd.display().to_string();
        push(&["--chdir", &cwd, "--"]);
        a.extend(cmd.iter().cloned());
        a
    }

    /// The system as every sandbox sees it: its folders read-only, `/etc`, `/proc`, `/dev`,
    /// a private `/tmp`.
    fn system_args(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::with_capacity(48);
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        for dir in SYSTEM {
            let p = Path::new(dir);
            match std::fs::read_link(p) {
                Ok(target) => {
                    let target = target.display().to_string();
                    push(&["--symlink", &target, dir]);
                }
                Err(_) if p.is_dir() => push(&["--ro-bind", dir, dir]),
                Err(_) => {}
            }
        }
        match &self.etc {
            Some(etc) => {
                let etc = etc.display().to_string();
                push(&["--ro-bind", &etc, "/etc"]);
            }
            None => {
                for f in ETC {
                    push(&["--ro-bind-try", f, f]);
                }
                for h in HIDDEN {
                    if Path::new(h).is_dir() {
                        push(&["--tmpfs", h]);
                    }
                }
            }
        }
        push(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        a
    }
}

/// Fills `dir` with a copy of what a sandbox sees of `/etc` (the entries of the list above
/// that exist; links are kept as links), for [`SandboxSpec::etc`]. Made once by a worker at
/// start, so a change to the host's `/etc` reaches sandboxes at the worker's next start.
pub fn prepare_etc(dir: &Path) -> io::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    for f in ETC {
        let src = Path::new(f);
        let Some(name) = src.file_name() else {
            continue;
        };
        if std::fs::symlink_metadata(src).is_ok() {
            copy_tree(src, &dir.join(name))?;
        }
    }
    Ok(())
}

fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let md = std::fs::symlink_metadata(src)?;
    // Private keys, and whatever others may not read, stay out of the tasks' `/etc`.
    let others_read = md.permissions().mode() & 0o004 != 0;
    if HIDDEN.iter().any(|h| Path::new(h) == src) || (!md.file_type().is_symlink() && !others_read)
    {
        return Ok(());
    }
    if md.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(src)?, dst)
    } else if md.is_dir() {
        std::fs::create_dir_all(dst)?;
        for e in std::fs::read_dir(src)? {
            let e = e?;
            copy_tree(&e.path(), &dst.join(e.file_name()))?;
        }
        Ok(())
    } else if md.is_file() {
        std::fs::copy(src, dst).map(|_| ())
    } else {
        Ok(())
    }
}

/// Where `bwrap` is, if it is on `PATH` (or in `/usr/bin`).
pub fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// Runs `/bin/true` (or the first system `true`) in a sandbox: whether this machine lets
/// `bwrap` make one (user namespaces may be off, or `bwrap` too old). The error says why not.
pub fn probe(bwrap: &Path) -> Result<(), String> {
    let dir = std::env::temp_dir();
    let spec = SandboxSpec {
        bwrap: bwrap.to_path_buf(),
        writable: dir.clone(),
        network: false,
        netns: None,
        devices: Vec::new(),
        etc: None,
        holder: None,
    };
    // By its path: the worker's PATH is no business of the probe (a PATH without `true`
    // read as a machine that cannot sandbox).
    let truth = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("true");
    let out = Command::new(bwrap)
        .args(spec.command_line(&[truth.into()], &dir))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{}: {e}", bwrap.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} cannot make a sandbox here: {}",
            bwrap.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// An empty network namespace (only a loopback, down) held open for sandboxes to join.
#[derive(Debug)]
pub struct EmptyNetns(OwnedFd);

impl EmptyNetns {
    /// Makes one (needs `CAP_SYS_ADMIN`: a worker running as root). A thread of its own
    /// enters the new namespace, so the worker's other threads stay where they are.
    pub fn new() -> io::Result<EmptyNetns> {
        std::thread::Builder::new()
            .name("flotilla-netns".into())
            .spawn(|| {
                // SAFETY: unshare affects only this thread's network namespace.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                let f = std::fs::File::open("/proc/thread-self/ns/net")?;
                Ok(OwnedFd::from(f))
            })?
            .join()
            .map_err(|_| io::Error::other("the netns thread panicked"))?
            .map(EmptyNetns)
    }

    /// The descriptor a child joins with `setns` (see [`SandboxSpec::netns`]).
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// A copy that can be moved elsewhere.
    pub fn try_clone(&self) -> io::Result<EmptyNetns> {
        self.0.try_clone().map(EmptyNetns)
    }
}

/// Joins the network namespace `fd` (between fork and exec: async-signal-safe).
pub(crate) fn join_netns(fd: RawFd) -> io::Result<()> {
    // SAFETY: setns takes a descriptor and a namespace type; async-signal-safe.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_entries_outside_the_system_folders_are_hidden() {
        assert_eq!(
            super::hidden_path_entries(
                "/root/.pyenv/shims:/usr/local/bin:/usr/bin:/bin:/opt/conda/bin:/home/u/.cargo/bin:rel:/usrx:/root/.pyenv/shims"
            ),
            ["/root/.pyenv/shims", "/home/u/.cargo/bin", "/usrx"]
        );
        assert!(super::hidden_path_entries("/usr/bin:/bin").is_empty());
    }

    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn what_others_may_not_read_stays_out_of_the_tasks_etc() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("sub")).expect("folders");
        std::fs::write(src.join("public.conf"), "x").expect("a file");
        std::fs::write(src.join("sub").join("secret.key"), "k").expect("a file");
        std::fs::set_permissions(
            src.join("sub").join("secret.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        std::fs::create_dir_all(src.join("closed")).expect("a folder");
        std::fs::write(src.join("closed").join("inside"), "i").expect("a file");
        std::fs::set_permissions(src.join("closed"), std::fs::Permissions::from_mode(0o710))
            .expect("chmod");
        let dst = dir.path().join("dst");
        copy_tree(&src, &dst).expect("copied");
        assert!(dst.join("public.conf").is_file());
        assert!(dst.join("sub").is_dir());
        assert!(!dst.join("sub").join("secret.key").exists());
        assert!(!dst.join("closed").exists());
    }

    #[test]
    fn private_keys_are_hidden_when_etc_is_bound_file_by_file() {
        let spec = SandboxSpec {
            bwrap: "bwrap".into(),
            writable: "/tmp".into(),
            network: false,
            netns: None,
            devices: Vec::new(),
            etc: None,
            holder: None,
        };
        let args = spec.command_line(&["true".into()], Path::new("/tmp"));
        let bound = args
            .windows(2)
            .position(|w| w == ["--ro-bind-try", "/etc/ssl"]);
        let hidden = args
            .windows(2)
            .position(|w| w == ["--tmpfs", "/etc/ssl/private"]);
        if Path::new("/etc/ssl/private").is_dir() {
            assert!(
                matches!((bound, hidden), (Some(b), Some(h)) if h > b),
                "hidden after /etc/ssl is bound: {args:?}"
            );
        } else {
            assert_eq!(hidden, None);
        }
    }
}
