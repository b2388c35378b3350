//! The guard: a small process that kills a worker's tasks when the worker dies, whatever kills
//! it (SIGKILL, a crash, the OOM killer).
//!
//! The worker starts it once (`flotilla worker-guard`, which runs [`guard_main`]) with a pipe
//! on its stdin, and tells it the process group of every task it spawns (`+PGID`) and reaps
//! (`-PGID`). When the worker dies the kernel closes the pipe's write end; the guard reads
//! end-of-file, sends SIGKILL to every process group still registered, and exits. It ignores
//! SIGINT, SIGTERM and SIGHUP, so a Ctrl-C in the worker's terminal cannot take it first.
//!
//! Why not `PR_SET_PDEATHSIG` in every task: it needs a `pre_exec` hook, which turns std's
//! `posix_spawn` into `fork` of the whole worker, measured at a third of the task rate for
//! `/bin/true`; one line on a pipe costs microseconds.
//!
//! A task registered a moment after it started (the worker was killed between the spawn and
//! the `+PGID` line) is found all the same: every task's environment holds the guard's mark
//! ([`GUARD_VAR`] = a random nonce, [`Guard::mark`]), and at end-of-file the guard also kills
//! every process whose environment holds it. Limit: a task that both leaves its process
//! group (`setsid`) and clears its environment escapes; a sandbox's pid namespace holds those.

use std::collections::HashSet;
use std::io::{self, BufRead, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, Stdio};

use parking_lot::Mutex;

/// The variable that marks a worker's tasks for its guard.
pub const GUARD_VAR: &str = "FLOTILLA_GUARD";

/// The worker's side: registers and unregisters process groups.
#[derive(Debug)]
pub struct Guard {
    stdin: Mutex<Option<ChildStdin>>,
    child: Mutex<Child>,
    mark: String,
}

impl Guard {
    /// Starts the guard process: `command` must run [`guard_main`] (the CLI's hidden
    /// `worker-guard` subcommand).
    pub fn start(mut command: Command) -> io::Result<Guard> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the guard has no stdin"))?;
        let mark = format!("{:016x}{:016x}", rand_u64(), rand_u64());
        writeln!(stdin, "={mark}")?;
        Ok(Guard {
            stdin: Mutex::new(Some(stdin)),
            child: Mutex::new(child),
            mark,
        })
    }

    /// The variable to put in every task's environment (`FLOTILLA_GUARD=<nonce>`).
    pub fn mark(&self) -> (String, String) {
        (GUARD_VAR.to_string(), self.mark.clone())
    }

    fn send(&self, sign: char, pgid: i32) {
        // A guard that died cannot be helped here; the task still runs.
        if let Some(stdin) = self.stdin.lock().as_mut() {
            let _ = writeln!(stdin, "{sign}{pgid}");
        }
    }

    /// A task's process group to kill if the worker dies.
    pub fn watch(&self, pgid: i32) {
        self.send('+', pgid);
    }

    /// The task ended (its group is killed and reaped): forget it.
    pub fn unwatch(&self, pgid: i32) {
        self.send('-', pgid);
    }
}

impl Drop for Guard {
    /// The worker is done: closing the pipe lets the guard kill what is still registered and
    /// exit; it is reaped here, so it leaves no zombie behind.
    fn drop(&mut self) {
        drop(self.stdin.lock().take());
        let _ = self.child.lock().wait();
    }
}

/// The guard process: reads `+PGID` / `-PGID` lines until end-of-file, then kills every
/// group still registered. Returns how many it killed.
pub fn guard_main(input: impl BufRead) -> usize {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: SIG_IGN is a valid disposition for these signals.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    guard_loop(input)
}

/// [`guard_main`] without ignoring the stop signals (the tests run it in their own process,
/// whose later children must not inherit ignored signals).
fn guard_loop(input: impl BufRead) -> usize {
    let mut groups: HashSet<i32> = HashSet::new();
    let mut mark: Option<String> = None;
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (sign, n) = line.split_at(line.len().min(1));
        if sign == "=" && n.len() >= 16 {
            mark = Some(n.trim().to_string());
            continue;
        }
        match (sign, n.trim().parse::<i32>()) {
            ("+", Ok(g)) if g > 1 => {
                groups.insert(g);
            }
            ("-", Ok(g)) => {
                groups.remove(&g);
            }
            _ => {}
        }
    }
    for &g in &groups {
        // SAFETY: killpg has no memory-safety preconditions; g > 1 so it is never "all".
        unsafe {
            libc::killpg(g, libc::SIGKILL);
        }
    }
    let mut killed = groups.len();
    if let Some(mark) = mark {
        // Tasks not (yet) registered: found by the mark in their environment.
        let needle = format!("{GUARD_VAR}={mark}\0");
        for pid in marked(needle.as_bytes()) {
            if !groups.contains(&pid) {
                killed += 1;
            }
            // SAFETY: kill and killpg have no memory-safety preconditions; pid > 1.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    killed
}

/// Processes whose environment holds `needle` (`NAME=value\0`), other than this one.
fn marked(needle: &[u8]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid > 1 && pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom(&mut b);
    u64::from_ne_bytes(b)
}

fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n as usize == buf.len() {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_task_not_yet_registered_is_killed_too() {
        // A worker killed between a task's spawn and its `+PGID` line left the task running.
        let mut marked = std::process::Command::new("sleep")
            .arg("600")
            .env(GUARD_VAR, "0123456789abcdef0123")
            .process_group(0)
            .spawn()
            .expect("sleep runs");
        let mut other = std::process::Command::new("sleep")
            .arg("600")
            .env(GUARD_VAR, "another-workers-mark-000")
            .spawn()
            .expect("sleep runs");
        assert_eq!(guard_loop("=0123456789abcdef0123\n".as_bytes()), 1);
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(marked.wait().expect("reaped").signal(), Some(libc::SIGKILL));
        assert!(
            other.try_wait().expect("other").is_none(),
            "another worker's task"
        );
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn at_end_of_input_the_registered_groups_are_killed_and_the_others_spared() {
        let spawn = || {
            std::process::Command::new("sleep")
                .arg("600")
                .process_group(0)
                .spawn()
                .expect("sleep runs")
        };
        let (mut a, mut b) = (spawn(), spawn());
        let input = format!("+{}\n+{}\n-{}\nnonsense\n+1\n", a.id(), b.id(), b.id());
        assert_eq!(guard_loop(input.as_bytes()), 1);
        let status = a.wait().expect("reaped");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(
            b.try_wait().expect("b").is_none(),
            "an unregistered group was killed"
        );
        b.kill().expect("kill b");
        b.wait().expect("reap b");
    }
}
