//! An attempt's energy: measured where the host exposes its CPU package energy (RAPL
//! through powercap, `/sys/class/powercap/intel-rapl:N/energy_uj`), the attempt's share of
//! the packages' energy by its CPU time over the machine's busy CPU time (from
//! `/proc/stat`); estimated otherwise from its CPU time at the worker's watts per CPU (and
//! 300 W per GPU it held), and marked so.

use std::path::PathBuf;

/// Watts per busy GPU in the estimate (NVML is not read).
pub(crate) const GPU_WATTS: f64 = 300.0;

/// A reading at an attempt's start.
pub(crate) struct Meter {
    start: Option<(f64, f64)>,
}

impl Meter {
    /// Reads the packages' energy and the machine's busy CPU time now (nothing where there
    /// is no RAPL).
    pub(crate) fn start() -> Meter {
        Meter { start: reading() }
    }

    /// The attempt's energy, joules, and whether it is an estimate: `cpu_seconds` of CPU,
    /// `gpus` held for `wall_seconds`, at `cpu_watts` per CPU for the estimate.
    pub(crate) fn finish(
        &self,
        cpu_seconds: f64,
        gpus: f64,
        wall_seconds: f64,
        cpu_watts: f64,
    ) -> (f64, bool) {
        let gpu = gpus * wall_seconds * GPU_WATTS;
        if let (Some((e0, busy0)), Some((e1, busy1))) = (self.start, reading()) {
            let busy = busy1 - busy0;
            if e1 >= e0 && busy > 0.0 {
                let share = (cpu_seconds / busy).clamp(0.0, 1.0);
                // GPUs are never measured here: their part stays estimated.
                return ((e1 - e0) * share + gpu, gpus > 0.0);
            }
        }
        (cpu_seconds * cpu_watts + gpu, true)
    }
}

/// The RAPL package domains.
fn domains() -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir("/sys/class/powercap") else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("intel-rapl:") && n.matches(':').count() == 1)
        })
        .map(|p| p.join("energy_uj"))
        .collect()
}

/// (joules of every package, busy CPU seconds of the machine), or `None` without RAPL.
fn reading() -> Option<(f64, f64)> {
    let files = domains();
    if files.is_empty() {
        return None;
    }
    let mut joules = 0.0;
    for f in files {
        let uj: f64 = std::fs::read_to_string(f).ok()?.trim().parse().ok()?;
        joules += uj / 1e6;
    }
    Some((joules, busy_seconds()?))
}

/// The machine's busy CPU time (user, nice, system, irq, softirq, steal), seconds.
fn busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<f64> = cpu
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| v.get(i))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| busy / hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_rapl_energy_is_estimated_from_cpu_time_and_gpus() {
        let m = Meter { start: None };
        let (j, estimated) = m.finish(2.0, 1.0, 3.0, 10.0);
        assert!(estimated);
        assert!((j - (20.0 + 900.0)).abs() < 1e-9, "{j}");
        // On this machine, whatever it has, a reading is sane.
        let (j, _) = Meter::start().finish(0.01, 0.0, 0.01, 12.0);
        assert!(j.is_finite() && j >= 0.0);
        assert!(busy_seconds().is_some_and(|b| b > 0.0));
    }
}
