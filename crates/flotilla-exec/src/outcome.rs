//! What an attempt did: how it ended ([`Termination`]) and what it used ([`Usage`]).

use std::fmt::Write as _;
use std::time::Duration;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Termination {
    /// The process exited (or the WASM module returned / called `proc_exit`) with this code.
    Exited(i32),
    /// The process was killed by this signal (not by us: a crash, `kill -9` from outside, or a
    /// kernel limit such as `SIGXCPU` for the CPU-time rlimit).
    Signaled(i32),
    /// The attempt ran past its timeout and was stopped.
    TimedOut,
    /// The attempt was stopped through its [`CancelHandle`](crate::CancelHandle).
    Cancelled,
    /// The attempt hit its memory limit, as far as the executor can tell: a cgroup `oom_kill`
    /// for processes, a refused `memory.grow` followed by a trap for WASM.
    MemoryExceeded,
    /// The WASM module used up its fuel.
    FuelExhausted,
    /// The WASM module trapped (or a WASI call failed fatally); the message says why.
    Trap(String),
}

/// Resources one attempt used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User plus system CPU time, in seconds (for WASM: the wall time, one thread).
    pub cpu_seconds: f64,
    /// Peak resident memory in bytes (for WASM: the peak linear-memory size).
    pub peak_rss_bytes: u64,
    /// Wall-clock time from start to end, in seconds.
    pub wall_seconds: f64,
    /// WASM: the fuel it consumed (instructions, roughly); `None` for a process.
    pub fuel: Option<u64>,
}

/// The result of an attempt that started.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// How it ended.
    pub termination: Termination,
    /// What it used.
    pub usage: Usage,
    /// The timeout it ran under, if any (for [`Outcome::describe`]).
    pub timeout: Option<Duration>,
    /// The memory limit it ran under in bytes, if any (for [`Outcome::describe`]).
    pub memory_limit: Option<u64>,
    /// The fuel it was given, if any (for [`Outcome::describe`]).
    pub fuel: Option<u64>,
    /// Its limit of processes, when it reached it (a fork was refused): said by
    /// [`Outcome::describe`], since the task's own message reads only "cannot fork".
    pub processes_reached: Option<u64>,
}

impl Outcome {
    /// An outcome with no limits recorded.
    pub fn new(termination: Termination, usage: Usage) -> Self {
        Outcome {
            termination,
            usage,
            timeout: None,
            memory_limit: None,
            fuel: None,
            processes_reached: None,
        }
    }

    /// Whether the attempt succeeded: it exited with code 0.
    pub fn success(&self) -> bool {
        self.termination == Termination::Exited(0)
    }

    /// A short human sentence fragment: "exited with code 3", "killed after timeout of 2s",
    /// "exceeded its memory limit of 64MiB", "killed by signal 11 (SIGSEGV)".
    pub fn describe(&self) -> String {
        let what = self.describe_end();
        match self.processes_reached {
            Some(n) if !self.success() => format!(
                "{what} (it reached its limit of {n} processes: a fork was refused; the \
                 worker's --task-pids)"
            ),
            _ => what,
        }
    }

    fn describe_end(&self) -> String {
        match &self.termination {
            Termination::Exited(code) => format!("exited with code {code}"),
            Termination::Signaled(sig) => match signal_name(*sig) {
                Some(name) => format!("killed by signal {sig} ({name})"),
                None => format!("killed by signal {sig}"),
            },
            Termination::TimedOut => match self.timeout {
                Some(t) => format!("killed after timeout of {}", format_duration(t)),
                None => "killed after its timeout".to_owned(),
            },
            Termination::Cancelled => "cancelled".to_owned(),
            Termination::MemoryExceeded => match self.memory_limit {
                Some(bytes) => format!(
                    "exceeded its memory limit of {}",
                    flotilla_core::size::format_size_readable(bytes)
                ),
                None => "exceeded its memory limit".to_owned(),
            },
            Termination::FuelExhausted => match self.fuel {
                Some(fuel) => format!("ran out of fuel (limit {fuel})"),
                None => "ran out of fuel".to_owned(),
            },
            Termination::Trap(message) => format!("trapped: {message}"),
        }
    }
}

/// The conventional name of a Linux signal number.
pub(crate) fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU: cpu time limit",
        libc::SIGXFSZ => "SIGXFSZ: file size limit",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// "2s", "300ms", "1m30s", "2h", "1h5m".
pub(crate) fn format_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 && !d.is_zero() {
        return format!("{}µs", d.as_micros());
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    if !total_ms.is_multiple_of(1000) && total_ms < 60_000 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if m > 0 {
        let _ = write!(out, "{m}m");
    }
    if s > 0 || out.is_empty() {
        let _ = write!(out, "{s}s");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(t: Termination) -> Outcome {
        Outcome::new(t, Usage::default())
    }

    #[test]
    fn describe_names_the_limit_that_was_hit() {
        let mut o = outcome(Termination::TimedOut);
        o.timeout = Some(Duration::from_secs(2));
        assert_eq!(o.describe(), "killed after timeout of 2s");
        // Below a millisecond, in microseconds ("0ms" read as no timeout at all).
        assert_eq!(format_duration(Duration::from_micros(100)), "100µs");
        let mut o = outcome(Termination::MemoryExceeded);
        o.memory_limit = Some(64 << 20);
        assert_eq!(o.describe(), "exceeded its memory limit of 64MiB");
        let mut o = outcome(Termination::FuelExhausted);
        o.fuel = Some(1000);
        assert_eq!(o.describe(), "ran out of fuel (limit 1000)");
        assert_eq!(
            outcome(Termination::Exited(3)).describe(),
            "exited with code 3"
        );
        assert_eq!(
            outcome(Termination::Signaled(9)).describe(),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            outcome(Termination::TimedOut).describe(),
            "killed after its timeout"
        );
        assert!(outcome(Termination::Exited(0)).success());
        assert!(!outcome(Termination::Exited(1)).success());
        assert!(!outcome(Termination::Cancelled).success());
    }

    #[test]
    fn durations_and_sizes_read_naturally() {
        assert_eq!(format_duration(Duration::from_millis(300)), "300ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
        assert_eq!(format_duration(Duration::from_secs(3900)), "1h5m");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
    }
}
