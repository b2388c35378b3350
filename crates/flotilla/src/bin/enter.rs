//! `flotilla-enter`: starts one task inside a worker's sandbox holder (see
//! `flotilla_exec::sandbox::Holder`). The holder is a bubblewrap sandbox the worker builds
//! once (user, mount, network, UTS namespaces; the system read-only; the attempts' folders);
//! each task enters it here instead of building a sandbox of its own, then gets what must be
//! its own: a mount namespace where only its folder is visible and writable and `/tmp` is
//! fresh, IPC and PID namespaces, no capabilities. One small static program, `posix_spawn`ed
//! by the worker (no fork of the worker), so a task costs about a third of a bubblewrap run.
//!
//! ```text
//! flotilla-enter --holder PID --holder-mnt INODE --own DIR --cwd DIR
//!                [--cgroup-procs FILE]... [--rlimit NAME=VALUE]... -- CMD [ARG]...
//! ```
//!
//! `--cgroup-procs`: files it writes `0` to first (joining the attempt's cgroup);
//! `--rlimit`: `as`, `cpu`, `nofile`, `nproc` or `fsize`. The task's environment is this
//! program's. Exit: the task's exit code, or its signal raised again; 126 with a message on
//! stderr when the sandbox could not be entered.
//!
//! Process tree: this program (in the worker's PID namespace, the worker's child: its wait
//! status and resource usage are the task's) → an init (PID 1 of the task's namespace, dies
//! with this program) → the task (PID 2). The task gets SIGTERM through its process group,
//! which all three share; this program and the init ignore it and follow the task.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};

/// `setrlimit`'s resource type: glibc's own enum, an int elsewhere (musl).
#[cfg(target_env = "gnu")]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
type Resource = libc::c_int;

struct Args {
    holder: u32,
    holder_mnt: u64,
    own: String,
    cwd: String,
    cgroups: Vec<String>,
    rlimits: Vec<(Resource, u64)>,
    cmd: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        holder: 0,
        holder_mnt: 0,
        own: String::new(),
        cwd: String::new(),
        cgroups: Vec::new(),
        rlimits: Vec::new(),
        cmd: Vec::new(),
    };
    while let Some(flag) = it.next() {
        if flag == "--" {
            a.cmd = it.by_ref().collect();
            break;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--holder" => a.holder = value.parse().map_err(|_| format!("--holder {value}"))?,
            "--holder-mnt" => {
                a.holder_mnt = value.parse().map_err(|_| format!("--holder-mnt {value}"))?
            }
            "--own" => a.own = value,
            "--cwd" => a.cwd = value,
            "--cgroup-procs" => a.cgroups.push(value),
            "--rlimit" => {
                let (name, v) = value
                    .split_once('=')
                    .ok_or_else(|| format!("--rlimit {value}"))?;
                let v: u64 = v.parse().map_err(|_| format!("--rlimit {value}"))?;
                let r = match name {
                    "as" => libc::RLIMIT_AS,
                    "cpu" => libc::RLIMIT_CPU,
                    "nofile" => libc::RLIMIT_NOFILE,
                    "nproc" => libc::RLIMIT_NPROC,
                    "fsize" => libc::RLIMIT_FSIZE,
                    _ => return Err(format!("--rlimit {value}: unknown limit")),
                };
                a.rlimits.push((r, v));
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.holder == 0 || a.holder_mnt == 0 || a.own.is_empty() || a.cwd.is_empty() {
        return Err("--holder, --holder-mnt, --own and --cwd are required".into());
    }
    if a.cmd.is_empty() {
        return Err("no command after --".into());
    }
    Ok(a)
}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"))
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn mount(
    src: Option<&str>,
    dst: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let (s, d, t, o) = (
        src.map(cstr).transpose()?,
        cstr(dst)?,
        fstype.map(cstr).transpose()?,
        data.map(cstr).transpose()?,
    );
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, or null.
    let rc = unsafe { libc::mount(p(&s), d.as_ptr(), p(&t), flags, p(&o).cast()) };
    if rc != 0 {
        return Err(os_err(&format!("mount {} on {dst}", src.unwrap_or("-"))));
    }
    Ok(())
}

/// `open_tree(2)`'s flags (not in libc yet).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
/// `move_mount(2)`'s flag: the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// A detached copy of the mount tree at `path` (to attach in another mount namespace).
fn open_tree(path: &str) -> Result<std::os::fd::OwnedFd, String> {
    let p = cstr(path)?;
    // SAFETY: a NUL-terminated path and flags; returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            p.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(os_err(&format!("open_tree {path}")));
    }
    // SAFETY: fd is a new descriptor we own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Attaches the tree `fd` at `dst`.
fn move_mount(fd: &std::os::fd::OwnedFd, dst: &str) -> Result<(), String> {
    let d = cstr(dst)?;
    let empty = cstr("")?;
    // SAFETY: a valid descriptor, NUL-terminated paths and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            d.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(os_err(&format!("attaching the task's folder at {dst}")));
    }
    Ok(())
}

fn join(holder: u32, ns: &str, kind: libc::c_int) -> Result<(), String> {
    let path = format!("/proc/{holder}/ns/{ns}");
    let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: a valid namespace descriptor and its type.
    if unsafe { libc::setns(f.as_raw_fd(), kind) } != 0 {
        return Err(os_err(&format!("joining the holder's {ns} namespace")));
    }
    Ok(())
}

/// Sets up everything and forks the init; returns in the parent with the init's pid and the
/// pipe the task's status comes through.
fn enter(a: &Args) -> Result<(libc::pid_t, std::fs::File), String> {
    for f in &a.cgroups {
        std::fs::write(f, b"0").map_err(|e| format!("joining the cgroup ({f}): {e}"))?;
    }
    for &(r, v) in &a.rlimits {
        let rl = libc::rlimit {
            rlim_cur: v as libc::rlim_t,
            rlim_max: v as libc::rlim_t,
        };
        // SAFETY: a valid rlimit.
        if unsafe { libc::setrlimit(r, &rl) } != 0 {
            return Err(os_err("setrlimit"));
        }
    }
    // The task's folder as a detached copy of its mount, made in the worker's namespace.
    let tree = open_tree(&a.own)?;
    // The holder is the one the worker made (not a process that took its pid since).
    let mnt = std::fs::metadata(format!("/proc/{}/ns/mnt", a.holder))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .map_err(|e| format!("the sandbox holder (pid {}): {e}", a.holder))?;
    if mnt != a.holder_mnt {
        return Err(format!(
            "pid {} is no longer the sandbox holder (its mount namespace changed)",
            a.holder
        ));
    }
    // The user namespace first: its capabilities let us join the others.
    join(a.holder, "user", libc::CLONE_NEWUSER)?;
    join(a.holder, "mnt", libc::CLONE_NEWNS)?;
    join(a.holder, "net", libc::CLONE_NEWNET)?;
    join(a.holder, "uts", libc::CLONE_NEWUTS)?;
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWPID) } != 0 {
        return Err(os_err("unshare"));
    }
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    // A fresh /tmp, then the task's folder (taken from the worker's mount namespace above)
    // at its own path; nothing else of the worker's is in the holder.
    mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )?;
    std::fs::create_dir_all(&a.own).map_err(|e| format!("{}: {e}", a.own))?;
    move_mount(&tree, &a.own)?;
    // Flotilla's own state in the job folder (`flotilla run`'s, or a server's default
    // `.flotilla`: tokens, the journal) is none of the task's business: hidden under an
    // empty, read-only tmpfs (a task read the admin token and could write the journal).
    let state = format!("{}/.flotilla", a.own.trim_end_matches('/'));
    if std::path::Path::new(&state).is_dir() {
        mount(
            Some("tmpfs"),
            &state,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
            Some("size=4k,mode=0555"),
        )?;
    }
    // The task is stopped through its process group; we follow it.
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: SIG_IGN for a catchable signal.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_err("pipe"));
    }
    // SAFETY: single-threaded program; the child only makes async-signal-safe calls or
    // execs, as far as it goes before exec (allocation included, safe here: one thread).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork"));
    }
    if pid == 0 {
        // SAFETY: fds[0] is ours; closing the read end in the init.
        unsafe { libc::close(fds[0]) };
        init(a, fds[1]);
    }
    // SAFETY: fds[1] is ours.
    unsafe { libc::close(fds[1]) };
    // SAFETY: fds[0] is an open descriptor we own.
    Ok((pid, unsafe { std::fs::File::from_raw_fd(fds[0]) }))
}

/// PID 1 of the task's namespace: mounts its /proc, starts the task, reports its status.
fn init(a: &Args, status_fd: libc::c_int) -> ! {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if let Err(e) = mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    ) {
        die(&e);
    }
    // SAFETY: as above.
    let task = unsafe { libc::fork() };
    if task < 0 {
        die(&os_err("fork"));
    }
    if task == 0 {
        // SAFETY: closing our copy of the status pipe.
        unsafe { libc::close(status_fd) };
        exec_task(a);
    }
    loop {
        let mut status = 0;
        // SAFETY: status is writable.
        let p = unsafe { libc::waitpid(-1, &mut status, 0) };
        if p == task {
            // SAFETY: status_fd is the pipe's write end, ours alone in this process.
            let mut f = unsafe { std::fs::File::from_raw_fd(status_fd) };
            let _ = f.write_all(&status.to_le_bytes());
            // Everything else in the namespace dies with us.
            // SAFETY: _exit ends the process.
            unsafe { libc::_exit(0) };
        }
        if p < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // SAFETY: as above.
            unsafe { libc::_exit(126) };
        }
    }
}

fn die(msg: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "flotilla-enter: {msg}");
    // SAFETY: _exit ends the process.
    unsafe { libc::_exit(126) }
}

/// The task: default signals, no capabilities, its folder, then exec.
fn exec_task(a: &Args) -> ! {
    // Every disposition and the mask as a fresh process has them: this program's (SIGPIPE
    // ignored by Rust's runtime, the stop signals above) and its worker's (SIGQUIT, ignored
    // by a shell for a worker started in the background) were inherited, and a task's
    // `yes | head -1` said "Broken pipe" on a worker only.
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: restoring the default disposition of a catchable signal.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    // SAFETY: an empty set, initialized by sigemptyset, as the new mask.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    if let Err(e) = drop_capabilities() {
        die(&e);
    }
    if let Err(e) = std::env::set_current_dir(&a.cwd) {
        die(&format!("{}: {e}", a.cwd));
    }
    let argv: Vec<CString> = match a.cmd.iter().map(|s| cstr(s)).collect() {
        Ok(v) => v,
        Err(e) => die(&e),
    };
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: argv is a null-terminated array of NUL-terminated strings.
    unsafe { libc::execvp(ptrs[0], ptrs.as_ptr()) };
    let e = std::io::Error::last_os_error();
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    let _ = writeln!(std::io::stderr(), "flotilla-enter: {}: {e}", a.cmd[0]);
    // SAFETY: _exit ends the process.
    unsafe { libc::_exit(code) }
}

fn drop_capabilities() -> Result<(), String> {
    // SAFETY: prctl with integer arguments; dropping caps past the last one fails with
    // EINVAL, which ends the loop.
    unsafe {
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                break;
            }
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let d = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a version-3 header and two data structs, as capset(2) wants.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } != 0 {
        return Err(os_err("capset"));
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os_err("no_new_privs"));
    }
    Ok(())
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => die(&e),
    };
    let (init, mut status_pipe) = match enter(&a) {
        Ok(x) => x,
        Err(e) => die(&e),
    };
    let mut buf = [0u8; 4];
    let got = status_pipe.read_exact(&mut buf).is_ok();
    let mut st = 0;
    // SAFETY: st is writable.
    unsafe { libc::waitpid(init, &mut st, 0) };
    if !got {
        die("the task's namespace ended without its status");
    }
    let status = i32::from_le_bytes(buf);
    if libc::WIFEXITED(status) {
        std::process::exit(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: default disposition, then the same signal on ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
        }
    }
    std::process::exit(126);
}
