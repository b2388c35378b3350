//! `flotilla bench copy`: host ↔ device bandwidth through Flotilla's own device layer, from
//! pageable and from page-locked (pinned) host memory in the same run, and device → device
//! over a direct link where two devices have one. What a user's registered data meets when
//! it moves to a GPU, and the figure behind the runtime's default of pinning it.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use flotilla_devices::{cpu::HostDevice, discover_report, Device, DeviceKind, DiscoverOptions};

/// One measured path.
#[derive(Clone, Debug, Serialize)]
pub struct CopyPoint {
    /// `h2d`, `d2h` or `peer`.
    pub direction: String,
    /// `pageable` or `pinned` host memory (`device` for peer copies).
    pub memory: String,
    /// The device (for peer copies: `source -> destination`).
    pub device: String,
    /// Bytes per copy.
    pub bytes: usize,
    /// Median seconds per copy.
    pub seconds: f64,
    /// `bytes / seconds` in GB/s (1e9 B).
    pub gbs: f64,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum CopyBenchError {
    /// No device of the kind asked for.
    #[error("no {kind} device: {reasons}")]
    NoDevice {
        /// The kind asked for.
        kind: String,
        /// Why discovery found none.
        reasons: String,
    },
    /// A bad `--device`.
    #[error("--device {0:?}: expected cpu-device, opencl or cuda")]
    BadDevice(String),
    /// A copy failed.
    #[error(transparent)]
    Device(#[from] flotilla_devices::DevicesError),
}

/// The devices of `kind` (`cpu-device`: two host devices, so the peer path is measured).
fn devices(kind: &str) -> Result<Vec<Arc<dyn Device>>, CopyBenchError> {
    let k = match kind {
        "cpu-device" => {
            return Ok(vec![
                Arc::new(HostDevice::new(u64::MAX)),
                Arc::new(HostDevice::new(u64::MAX)),
            ])
        }
        "opencl" => DeviceKind::OpenCl,
        "cuda" => DeviceKind::Cuda,
        other => return Err(CopyBenchError::BadDevice(other.into())),
    };
    let found = discover_report(&DiscoverOptions {
        opencl: k == DeviceKind::OpenCl,
        cuda: k == DeviceKind::Cuda,
        mem_limit: None,
    });
    if found.devices.is_empty() {
        return Err(CopyBenchError::NoDevice {
            kind: kind.into(),
            reasons: found.skipped.join("; "),
        });
    }
    Ok(found.devices)
}

fn median_seconds(
    reps: usize,
    mut f: impl FnMut() -> Result<(), CopyBenchError>,
) -> Result<f64, CopyBenchError> {
    f()?; // warm-up
    let mut t = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Measures `bytes`-sized copies `reps` times on the first device of `kind` (and between
/// the first two, where they have a direct link).
pub fn run(kind: &str, bytes: usize, reps: usize) -> Result<Vec<CopyPoint>, CopyBenchError> {
    let devs = devices(kind)?;
    let dev = devs[0].as_ref();
    let name = dev.info().name.clone();
    let buf = dev.alloc(bytes)?;
    let mut host: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let mut out = Vec::new();
    let point = |direction: &str, memory: &str, device: &str, seconds: f64| CopyPoint {
        direction: direction.into(),
        memory: memory.into(),
        device: device.into(),
        bytes,
        seconds,
        gbs: bytes as f64 / seconds / 1e9,
    };
    for pinned in [false, true] {
        // SAFETY: `host` is neither moved nor freed while the pin lives (dropped below).
        let pin = if pinned {
            unsafe { dev.pin_host_memory(host.as_ptr(), host.len()) }?
        } else {
            None
        };
        let memory = match (pinned, &pin) {
            (false, _) => "pageable",
            (true, Some(_)) => "pinned",
            // The backend does not pin (OpenCL): the same path again.
            (true, None) => "pageable (backend does not pin)",
        };
        let up = median_seconds(reps, || Ok(dev.upload(&buf, &host)?))?;
        out.push(point("h2d", memory, &name, up));
        let down = median_seconds(reps, || Ok(dev.download(&buf, &mut host)?))?;
        out.push(point("d2h", memory, &name, down));
        drop(pin);
    }
    if let Some(other) = devs.get(1) {
        if dev.can_copy_to_peer(other.as_ref()) {
            let dst = other.alloc(bytes)?;
            let s = median_seconds(reps, || {
                Ok(dev.copy_to_peer(&buf, other.as_ref(), &dst, bytes)?)
            })?;
            let pair = format!("{name} -> {}", other.info().name);
            out.push(point("peer", "device", &pair, s));
        }
    }
    // The data survived the round trips.
    let mut check = vec![0u8; bytes.min(4096)];
    dev.download(&buf, &mut check)?;
    if check.iter().enumerate().any(|(i, &b)| b != (i % 251) as u8) {
        return Err(CopyBenchError::Device(
            flotilla_devices::DevicesError::Backend {
                backend: "bench",
                device: name,
                op: "copy check",
                message: "the bytes read back differ from those written".into(),
            },
        ));
    }
    Ok(out)
}
