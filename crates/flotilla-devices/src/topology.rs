//! Where a device sits in the machine: its PCI address, the NUMA node and cores near it,
//! and the PCIe link to the host, read from Linux's sysfs (`/sys/bus/pci/devices/<id>/`).
//!
//! The CUDA backend fills [`DeviceInfo::topology`](crate::DeviceInfo::topology) from the
//! driver's PCI bus id; the runtime turns it into the scheduler's platform model (the first
//! guess of each host link's bandwidth, before transfers are measured) and pins each
//! device's driving threads to a core on the device's NUMA node. Peer-to-peer reachability
//! between GPUs comes from the driver ([`Device::can_copy_to_peer`](crate::Device)).
//! Reading sysfs needs no vendor library (NVML is not required), and the parsing is pure,
//! so it is tested on fixtures.

use std::path::Path;

/// A PCIe link: generation speed and lane count, as sysfs reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieLink {
    /// Transfer rate per lane in MT/s (2500, 5000, 8000, 16000, 32000, 64000).
    pub mega_transfers: u32,
    /// Lanes (1 to 32).
    pub width: u32,
}

impl PcieLink {
    /// Usable bytes per second in one direction: the rate per lane times the lanes, less
    /// the line encoding (8b/10b up to PCIe 2, 128b/130b for PCIe 3 to 5, FLIT mode's
    /// 242/256 for PCIe 6). DMA reaches 80–90 % of this in practice.
    pub fn bandwidth(&self) -> f64 {
        let mt = f64::from(self.mega_transfers);
        let efficiency = if self.mega_transfers <= 5000 {
            8.0 / 10.0
        } else if self.mega_transfers <= 32000 {
            128.0 / 130.0
        } else {
            242.0 / 256.0
        };
        mt * 1e6 * efficiency / 8.0 * f64::from(self.width)
    }
}

/// A device's place in the machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// The PCI address, lowercase `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// The NUMA node the device is attached to, when the platform says.
    pub numa_node: Option<u32>,
    /// The cores of that NUMA node (empty when unknown).
    pub local_cpus: Vec<usize>,
    /// The link to the host, when sysfs reports it.
    pub link: Option<PcieLink>,
}

impl Topology {
    /// Reads the device at `pci_bus_id` under `sysfs` (normally `/sys`); fields that the
    /// platform does not report are left empty. `None` when the device is not there.
    pub fn read(sysfs: &Path, pci_bus_id: &str) -> Option<Topology> {
        let id = pci_bus_id.to_ascii_lowercase();
        let dir = sysfs.join("bus/pci/devices").join(&id);
        if !dir.is_dir() {
            return None;
        }
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let link = match (read("current_link_speed"), read("current_link_width")) {
            (Some(speed), Some(width)) => {
                match (parse_link_speed(&speed), width.trim().parse::<u32>().ok()) {
                    (Some(mega_transfers), Some(width)) if width > 0 => Some(PcieLink {
                        mega_transfers,
                        width,
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        Some(Topology {
            pci_bus_id: id,
            numa_node: read("numa_node").and_then(|s| parse_numa_node(&s)),
            local_cpus: read("local_cpulist")
                .and_then(|s| parse_cpu_list(&s))
                .unwrap_or_default(),
            link,
        })
    }
}

/// `"16.0 GT/s PCIe"` (or `"8 GT/s"`, `"2.5 GT/s"`) → 16000 MT/s.
pub fn parse_link_speed(s: &str) -> Option<u32> {
    let gt: f64 = s.split_whitespace().next()?.parse().ok()?;
    if !(gt > 0.0 && gt < 1000.0) {
        return None;
    }
    Some((gt * 1000.0).round() as u32)
}

/// sysfs's `numa_node`: `-1` (none) → `None`.
pub fn parse_numa_node(s: &str) -> Option<u32> {
    s.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// A Linux CPU list, `"0-3,8,10-11"` → `[0, 1, 2, 3, 8, 10, 11]`; `None` if malformed.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let s = s.trim();
    let mut out = Vec::new();
    if s.is_empty() {
        return Some(out);
    }
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn link_bandwidths_follow_the_pcie_generations() {
        let gbs = |mt, width| {
            PcieLink {
                mega_transfers: mt,
                width,
            }
            .bandwidth()
                / 1e9
        };
        assert!((gbs(2500, 16) - 4.0).abs() < 1e-9);
        assert!((gbs(8000, 16) - 15.754).abs() < 1e-3);
        assert!((gbs(16000, 16) - 31.508).abs() < 1e-3);
        assert!((gbs(32000, 16) - 63.015).abs() < 1e-3);
        assert!((gbs(16000, 8) - 15.754).abs() < 1e-3);
        assert!(gbs(64000, 16) > gbs(32000, 16));
    }

    #[test]
    fn sysfs_fields_parse() {
        assert_eq!(parse_link_speed("16.0 GT/s PCIe\n"), Some(16000));
        assert_eq!(parse_link_speed("2.5 GT/s"), Some(2500));
        assert_eq!(parse_link_speed("Unknown"), None);
        assert_eq!(parse_link_speed(""), None);
        assert_eq!(parse_numa_node("-1\n"), None);
        assert_eq!(parse_numa_node("1\n"), Some(1));
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn a_device_is_read_from_a_sysfs_tree() {
        let root = tempfile::tempdir().expect("temporary folder");
        let dir = root.path().join("bus/pci/devices/0000:1b:00.0");
        std::fs::create_dir_all(&dir).expect("fixture");
        for (name, text) in [
            ("numa_node", "1\n"),
            ("local_cpulist", "16-19\n"),
            ("current_link_speed", "32.0 GT/s PCIe\n"),
            ("current_link_width", "16\n"),
        ] {
            std::fs::write(dir.join(name), text).expect("fixture");
        }
        let t = Topology::read(root.path(), "0000:1B:00.0").expect("present");
        assert_eq!(
            t,
            Topology {
                pci_bus_id: "0000:1b:00.0".into(),
                numa_node: Some(1),
                local_cpus: vec![16, 17, 18, 19],
                link: Some(PcieLink {
                    mega_transfers: 32000,
                    width: 16
                }),
            }
        );
        // A virtual machine's device without link files: the rest is still read.
        std::fs::remove_file(dir.join("current_link_width")).expect("fixture");
        let t = Topology::read(root.path(), "0000:1b:00.0").expect("present");
        assert_eq!((t.link, t.numa_node), (None, Some(1)));
        assert_eq!(Topology::read(root.path(), "0000:00:00.0"), None);
    }

    proptest! {
        #[test]
        fn cpu_lists_round_trip(cpus in proptest::collection::btree_set(0usize..512, 0..40)) {
            let v: Vec<usize> = cpus.into_iter().collect();
            let text = v.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_cpu_list(&text), Some(v));
        }

        #[test]
        fn parsers_never_panic(s in ".{0,40}") {
            let _ = parse_cpu_list(&s);
            let _ = parse_link_speed(&s);
            let _ = parse_numa_node(&s);
        }
    }
}
