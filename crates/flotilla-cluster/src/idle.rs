//! Whether a provider's machine is free for work: its owner's activity (`flotilla worker
//! --idle-only`) and the local clock for its availability windows.
//!
//! The owner counts as active while any of these holds, and as idle once none has for
//! [`IdleConfig::after`](crate::worker::IdleConfig::after):
//! - the machine's load from other processes (the 1-minute load average of
//!   `/proc/loadavg` less the CPUs this worker's running tasks hold) is above the threshold;
//! - input devices made interrupts since the last look (keyboard and mouse lines of
//!   `/proc/interrupts`: `i8042`, or names with `keyboard`, `mouse`, `kbd`); where no such
//!   line exists, input activity cannot be read and only the load counts;
//! - the owner's activity file exists (`--owner-active-file`: a screen locker's or session
//!   manager's hook makes it when the owner is at the machine and removes it when they
//!   leave).

use std::time::Instant;

use crate::worker::IdleConfig;

/// Watches the owner's activity.
#[derive(Debug)]
pub(crate) struct IdleProbe {
    config: IdleConfig,
    /// Input interrupts at the last look.
    input: Option<u64>,
    /// When the owner was last seen active.
    last_active: Option<Instant>,
}

impl IdleProbe {
    pub(crate) fn new(config: IdleConfig) -> IdleProbe {
        IdleProbe {
            config,
            input: input_interrupts(),
            last_active: None,
        }
    }

    /// `Err(why)` while the owner is active or has not been idle for long enough; `own_cpus`
    /// are what this worker's running tasks hold (their load is not the owner's).
    pub(crate) fn check(&mut self, own_cpus: f64) -> Result<(), String> {
        let now = Instant::now();
        let mut why = None;
        if let Some(f) = &self.config.active_file {
            if f.exists() {
                why = Some(format!("its owner is active ({} exists)", f.display()));
            }
        }
        if why.is_none() {
            if let Some(load) = load_average() {
                let others = load - own_cpus;
                if others > self.config.load {
                    why = Some(format!(
                        "its owner's processes load it ({others:.2} > {:.2})",
                        self.config.load
                    ));
                }
            }
        }
        let input = input_interrupts();
        if why.is_none() && input.is_some() && input != self.input {
            why = Some("its owner is using its keyboard or mouse".to_string());
        }
        self.input = input;
        if let Some(why) = why {
            self.last_active = Some(now);
            return Err(why);
        }
        match self.last_active {
            Some(t) if now.duration_since(t) < self.config.after => Err(format!(
                "its owner was active {:.0} s ago (idle after {:?})",
                now.duration_since(t).as_secs_f64(),
                self.config.after
            )),
            _ => Ok(()),
        }
    }
}

/// The 1-minute load average.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The interrupts of keyboard and mouse lines of `/proc/interrupts`, summed over CPUs;
/// `None` where there is none.
fn input_interrupts() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/interrupts").ok()?;
    let mut total = None;
    for line in text.lines() {
        let lower = line.to_ascii_lowercase();
        if !["i8042", "keyboard", "mouse", "kbd"]
            .iter()
            .any(|k| lower.contains(k))
        {
            continue;
        }
        let counts: u64 = line
            .split_whitespace()
            .skip(1)
            .map_while(|w| w.parse::<u64>().ok())
            .sum();
        *total.get_or_insert(0) += counts;
    }
    total
}

/// The local day of the week (0 Monday … 6 Sunday) and minute of the day.
pub(crate) fn local_time() -> (u8, u16) {
    // SAFETY: time(NULL) has no preconditions; localtime_r writes only into `tm`, which is
    // a plain C struct for which all-zero bytes are valid.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return (0, 0);
        }
        (
            ((tm.tm_wday + 6) % 7) as u8,
            (tm.tm_hour * 60 + tm.tm_min) as u16,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_owner_file_makes_the_owner_active_and_idleness_needs_its_delay() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("active");
        let mut p = IdleProbe::new(IdleConfig {
            load: f64::INFINITY,
            after: Duration::from_secs(3600),
            active_file: Some(file.clone()),
        });
        // Input interrupts may tick on this machine; only compare what the file does.
        std::fs::write(&file, "").unwrap();
        let e = p.check(0.0).unwrap_err();
        assert!(e.contains("exists"), "{e}");
        std::fs::remove_file(&file).unwrap();
        let e = p.check(0.0).unwrap_err();
        assert!(e.contains("ago") || e.contains("keyboard"), "{e}");
        let (day, minute) = local_time();
        assert!(day < 7 && minute < 1440);
    }
}
