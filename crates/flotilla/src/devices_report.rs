//! `flotilla devices`: what discovery finds on this machine, as a user checks it before a
//! run (like `nvidia-smi topo -m` or StarPU's `starpu_machine_display`).

use serde::Serialize;

use flotilla_devices::{discover_report, DiscoverOptions};

/// One device.
#[derive(Debug, Serialize)]
pub struct DeviceLine {
    /// `opencl` or `cuda`.
    pub kind: String,
    /// The driver's name for it.
    pub name: String,
    /// Usable memory in bytes.
    pub memory_bytes: u64,
    /// Compute units (OpenCL) or streaming multiprocessors (CUDA).
    pub compute_units: u32,
    /// The performance-model key.
    pub arch: String,
    /// PCI address, when known.
    pub pci_bus_id: Option<String>,
    /// NUMA node, when known.
    pub numa_node: Option<u32>,
    /// Cores of that node.
    pub local_cpus: Vec<usize>,
    /// The PCIe link's usable bandwidth in GB/s (before DMA efficiency), when known.
    pub host_link_gbs: Option<f64>,
    /// Indices (in this list) of the devices it copies to directly.
    pub peers: Vec<usize>,
}

/// Every device and every skip reason.
#[derive(Debug, Serialize)]
pub struct DevicesReport {
    /// The devices found, in discovery order (the runtime's order).
    pub devices: Vec<DeviceLine>,
    /// Backends, platforms or devices skipped, and why.
    pub skipped: Vec<String>,
}

/// Discovers the devices and describes them.
pub fn report() -> DevicesReport {
    let found = discover_report(&DiscoverOptions::default());
    let devices = found
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let info = d.info();
            let topo = info.topology.clone().unwrap_or_default();
            DeviceLine {
                kind: info.kind.to_string(),
                name: info.name.clone(),
                memory_bytes: info.global_mem,
                compute_units: info.compute_units,
                arch: info.arch.clone(),
                pci_bus_id: (!topo.pci_bus_id.is_empty()).then_some(topo.pci_bus_id),
                numa_node: topo.numa_node,
                local_cpus: topo.local_cpus,
                host_link_gbs: topo.link.map(|l| l.bandwidth() / 1e9),
                peers: found
                    .devices
                    .iter()
                    .enumerate()
                    .filter(|&(j, other)| j != i && d.can_copy_to_peer(other.as_ref()))
                    .map(|(j, _)| j)
                    .collect(),
            }
        })
        .collect();
    DevicesReport {
        devices,
        skipped: found.skipped,
    }
}

impl DevicesReport {
    /// The report as lines of text.
    pub fn human(&self) -> String {
        let mut out = String::new();
        if self.devices.is_empty() {
            out.push_str("no devices found (the CPU cores are always used)\n");
        }
        for (i, d) in self.devices.iter().enumerate() {
            out.push_str(&format!(
                "[{i}] {} {} ({}): {:.1} GiB, {} compute units\n",
                d.kind,
                d.name,
                d.arch,
                d.memory_bytes as f64 / (1u64 << 30) as f64,
                d.compute_units
            ));
            if let Some(pci) = &d.pci_bus_id {
                let numa = d.numa_node.map_or("unknown".to_string(), |n| n.to_string());
                let link = d
                    .host_link_gbs
                    .map_or("unknown".to_string(), |g| format!("{g:.1} GB/s"));
                out.push_str(&format!(
                    "    PCI {pci}, NUMA node {numa}, host link {link}\n"
                ));
            }
            if !d.peers.is_empty() {
                let peers: Vec<String> = d.peers.iter().map(|p| format!("[{p}]")).collect();
                out.push_str(&format!("    direct copies to {}\n", peers.join(" ")));
            }
        }
        for s in &self.skipped {
            out.push_str(&format!("skipped: {s}\n"));
        }
        out
    }
}
