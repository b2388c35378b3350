//! An attempt's energy.
//!
//! - **CPU**: measured where the host exposes its CPU package energy (RAPL through powercap,
//!   `/sys/class/powercap/intel-rapl:N/energy_uj`): the attempt's share of the packages'
//!   energy by its CPU time over the machine's busy CPU time (from `/proc/stat`).
//! - **GPUs**: measured where NVIDIA's management library is installed (`libnvidia-ml.so.1`,
//!   loaded at run time as the CUDA libraries are): each GPU the attempt held, its total
//!   energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules, Volta and later)
//!   read at the start and the end, times the share of the GPU the attempt held. Each GPU is
//!   found in NVML by its PCI address (NVML numbers GPUs in its own order, CUDA in another);
//!   a GPU whose address the worker does not know is estimated.
//! - Otherwise estimated, and marked so: the attempt's CPU time at the worker's watts per CPU,
//!   300 W per GPU held.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Watts per busy GPU in the estimate (where NVML cannot be read).
pub(crate) const GPU_WATTS: f64 = 300.0;

/// A reading at an attempt's start.
pub(crate) struct Meter {
    start: Option<(f64, f64)>,
    /// The GPUs it holds (PCI addresses) and their energy counters (millijoules), when
    /// every one could be read.
    gpus: Option<(Vec<String>, Vec<u64>)>,
}

impl Meter {
    /// Reads the packages' energy, the machine's busy CPU time and the energy counters of
    /// the GPUs at the PCI addresses `gpus` now (nothing where they cannot be read).
    pub(crate) fn start(gpus: &[String]) -> Meter {
        let gpus = if gpus.is_empty() {
            None
        } else {
            Nvml::get()
                .and_then(|n| n.energy_mj(gpus))
                .map(|e| (gpus.to_vec(), e))
        };
        Meter {
            start: reading(),
            gpus,
        }
    }

    /// The attempt's energy, joules, and whether any of it is an estimate: `cpu_seconds` of
    /// CPU, `gpus` held for `wall_seconds`, at `cpu_watts` per CPU for the estimate.
    pub(crate) fn finish(
        &self,
        cpu_seconds: f64,
        gpus: f64,
        wall_seconds: f64,
        cpu_watts: f64,
    ) -> (f64, bool) {
        let measured_gpu = self.gpus.as_ref().and_then(|(idx, before)| {
            let after = Nvml::get()?.energy_mj(idx)?;
            gpu_joules(before, &after, gpus)
        });
        let (gpu, gpu_estimated) = match measured_gpu {
            Some(j) => (j, false),
            None => (gpus * wall_seconds * GPU_WATTS, gpus > 0.0),
        };
        if let (Some((e0, busy0)), Some((e1, busy1))) = (self.start, reading()) {
            let busy = busy1 - busy0;
            if e1 >= e0 && busy > 0.0 {
                let share = (cpu_seconds / busy).clamp(0.0, 1.0);
                return ((e1 - e0) * share + gpu, gpu_estimated);
            }
        }
        (cpu_seconds * cpu_watts + gpu, true)
    }
}

/// The joules an attempt holding `gpus` GPUs used, from their energy counters (millijoules)
/// before and after: all of each GPU's energy for whole GPUs, the attempt's share of its
/// one GPU for a fraction. `None` when a counter went back (the driver was reloaded).
fn gpu_joules(before: &[u64], after: &[u64], gpus: f64) -> Option<f64> {
    if before.len() != after.len() {
        return None;
    }
    let mut mj = 0u64;
    for (b, a) in before.iter().zip(after) {
        mj += a.checked_sub(*b)?;
    }
    let share = if gpus < 1.0 { gpus.max(0.0) } else { 1.0 };
    Some(mj as f64 / 1000.0 * share)
}

/// NVIDIA's management library, loaded at run time.
struct Nvml {
    lib: libloading::Library,
}

type NvmlDevice = *mut std::ffi::c_void;

impl Nvml {
    /// The library, initialized once per process; `None` where it is not installed or does
    /// not start (no NVIDIA driver).
    fn get() -> Option<&'static Nvml> {
        static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
        NVML.get_or_init(|| {
            // SAFETY: loading NVIDIA's library runs its initializers, which have no
            // preconditions; nvmlInit_v2 takes no arguments and may be called from any thread.
            unsafe {
                let lib = libloading::Library::new("libnvidia-ml.so.1").ok()?;
                let started = {
                    let init: libloading::Symbol<'_, unsafe extern "C" fn() -> i32> =
                        lib.get(b"nvmlInit_v2\0").ok()?;
                    init() == 0
                };
                started.then_some(Nvml { lib })
            }
        })
        .as_ref()
    }

    /// The total energy counter of each GPU (millijoules since the driver loaded), by PCI
    /// address; `None` when one cannot be read (an older GPU, an unknown address).
    fn energy_mj(&self, pci: &[String]) -> Option<Vec<u64>> {
        // SAFETY: the symbols have the signatures of NVML's C API (nvml.h); the address is a
        // NUL-terminated string that outlives the call; the device handle is written by
        // nvmlDeviceGetHandleByPciBusId_v2 before it is used, and the library is initialized
        // (`get`) and never unloaded while the process runs.
        unsafe {
            let by_pci: libloading::Symbol<
                '_,
                unsafe extern "C" fn(*const std::ffi::c_char, *mut NvmlDevice) -> i32,
            > = self.lib.get(b"nvmlDeviceGetHandleByPciBusId_v2\0").ok()?;
            let energy: libloading::Symbol<'_, unsafe extern "C" fn(NvmlDevice, *mut u64) -> i32> =
                self.lib
                    .get(b"nvmlDeviceGetTotalEnergyConsumption\0")
                    .ok()?;
            let mut out = Vec::with_capacity(pci.len());
            for id in pci {
                let id = std::ffi::CString::new(id.as_str()).ok()?;
                let mut dev: NvmlDevice = std::ptr::null_mut();
                if by_pci(id.as_ptr(), &mut dev) != 0 || dev.is_null() {
                    return None;
                }
                let mut mj = 0u64;
                if energy(dev, &mut mj) != 0 {
                    return None;
                }
                out.push(mj);
            }
            Some(out)
        }
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
        let m = Meter {
            start: None,
            gpus: None,
        };
        let (j, estimated) = m.finish(2.0, 1.0, 3.0, 10.0);
        assert!(estimated);
        assert!((j - (20.0 + 900.0)).abs() < 1e-9, "{j}");
        // On this machine, whatever it has, a reading is sane.
        let (j, _) = Meter::start(&[]).finish(0.01, 0.0, 0.01, 12.0);
        assert!(j.is_finite() && j >= 0.0);
        assert!(busy_seconds().is_some_and(|b| b > 0.0));
    }

    #[test]
    fn gpu_energy_is_each_counter_s_difference_times_the_share_held() {
        // Two whole GPUs: 1.5 kJ and 0.5 kJ.
        let j = gpu_joules(&[1_000, 5_000], &[1_501_000, 505_000], 2.0).expect("counters");
        assert!((j - 2_000.0).abs() < 1e-9, "{j}");
        // Half of one GPU: half its energy.
        let j = gpu_joules(&[0], &[10_000], 0.5).expect("counters");
        assert!((j - 5.0).abs() < 1e-9, "{j}");
        // A counter that went back (the driver was reloaded) is no measure.
        assert_eq!(gpu_joules(&[10], &[5], 1.0), None);
        assert_eq!(gpu_joules(&[10], &[], 1.0), None);
    }

    #[test]
    fn without_nvml_a_gpu_attempt_is_estimated_and_marked_so() {
        if Nvml::get().is_some() {
            eprintln!("skipped: NVML is installed here (the GPU machine measures instead)");
            return;
        }
        let m = Meter::start(&["0000:01:00.0".to_string()]);
        assert!(m.gpus.is_none());
        let (_, estimated) = m.finish(0.0, 1.0, 1.0, 12.0);
        assert!(estimated);
    }
}
