//! The machine's layout as the runtime uses it: which cores drive which device, and the
//! first guesses of the links between memory nodes. Pure functions, unit-tested; `build`
//! feeds them what discovery found ([`flotilla_devices::topology`]).

use flotilla_sched::Link;

/// The share of a PCIe link's raw bandwidth that DMA copies reach.
const DMA_EFFICIENCY: f64 = 0.85;

/// The host link used when a device's PCIe link is unknown: a first guess, replaced by
/// measured transfers as they happen.
pub(crate) const GUESSED_HOST_LINK: Link = Link {
    bandwidth: 8e9,
    latency: 20e-6,
};

/// The host link of a device whose PCIe link is `pcie_bandwidth` bytes/s, if known.
pub(crate) fn host_link(pcie_bandwidth: Option<f64>) -> Link {
    match pcie_bandwidth {
        Some(bw) if bw > 0.0 => Link {
            bandwidth: bw * DMA_EFFICIENCY,
            latency: 10e-6,
        },
        _ => GUESSED_HOST_LINK,
    }
}

/// The link between two devices with host links `a` and `b`: over a direct path, the
/// slower end's speed in one hop; otherwise two copies through host memory, one after
/// the other.
pub(crate) fn device_link(a: Link, b: Link, direct: bool) -> Link {
    if direct {
        Link {
            bandwidth: a.bandwidth.min(b.bandwidth),
            latency: a.latency.max(b.latency),
        }
    } else {
        Link {
            bandwidth: 1.0 / (1.0 / a.bandwidth + 1.0 / b.bandwidth),
            latency: a.latency + b.latency,
        }
    }
}

/// Which core each CPU worker and each device's threads are pinned to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CoreAssignment {
    /// One core per CPU worker (cycling when there are more workers than cores).
    pub(crate) workers: Vec<Option<usize>>,
    /// One core per device, or `None` when no core is left over for it.
    pub(crate) devices: Vec<Option<usize>>,
}

/// Pins `n_workers` CPU workers and the driving threads of devices with the given local
/// cores (`device_local[i]`: the cores of device i's NUMA node, empty when unknown) onto
/// `cores`. Devices get the cores the workers leave (`cores − workers` of them, by default
/// one per device; more devices than that share them in turn), each preferring a core on
/// its own NUMA node, so the threads that feed a GPU never wait behind CPU tasks and touch
/// memory near it; workers take the rest in order.
pub(crate) fn assign_cores(
    cores: &[usize],
    n_workers: usize,
    device_local: &[Vec<usize>],
) -> CoreAssignment {
    if cores.is_empty() {
        return CoreAssignment {
            workers: vec![None; n_workers],
            devices: vec![None; device_local.len()],
        };
    }
    let spare = cores.len().saturating_sub(n_workers);
    let mut taken = vec![false; cores.len()];
    let mut devices = Vec::with_capacity(device_local.len());
    let mut reserved = 0;
    for local in device_local {
        if reserved == spare {
            // More devices than spare cores: they share the spare ones, in turn.
            let shared = (spare > 0).then(|| devices[devices.len() % spare]);
            devices.push(shared.flatten());
            continue;
        }
        // Prefer the last free core of the device's node (workers fill from the front);
        // else the last free core.
        let pick = (0..cores.len())
            .rev()
            .find(|&i| !taken[i] && local.contains(&cores[i]))
            .or_else(|| (0..cores.len()).rev().find(|&i| !taken[i]));
        match pick {
            Some(i) => {
                taken[i] = true;
                reserved += 1;
                devices.push(Some(cores[i]));
            }
            None => devices.push(None),
        }
    }
    let free: Vec<usize> = (0..cores.len())
        .filter(|&i| !taken[i])
        .map(|i| cores[i])
        .collect();
    let pool = if free.is_empty() {
        cores.to_vec()
    } else {
        free
    };
    let workers = (0..n_workers).map(|w| Some(pool[w % pool.len()])).collect();
    CoreAssignment { workers, devices }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_get_spare_cores_on_their_own_numa_node() {
        // 8 cores, two NUMA nodes (0-3, 4-7), 6 workers, two GPUs: GPU 0 on node 0, GPU 1
        // on node 1.
        let cores: Vec<usize> = (0..8).collect();
        let a = assign_cores(&cores, 6, &[vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(a.devices, vec![Some(3), Some(7)]);
        assert_eq!(
            a.workers,
            vec![Some(0), Some(1), Some(2), Some(4), Some(5), Some(6)]
        );
        // Unknown locality: the last cores, as before.
        let a = assign_cores(&cores, 6, &[vec![], vec![]]);
        assert_eq!(a.devices, vec![Some(7), Some(6)]);
        assert_eq!(a.workers, (0..6).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn no_spare_core_leaves_devices_unpinned_and_workers_cycle() {
        let cores = [0, 1];
        let a = assign_cores(&cores, 2, &[vec![1]]);
        assert_eq!(a.devices, vec![None]);
        assert_eq!(a.workers, vec![Some(0), Some(1)]);
        let a = assign_cores(&cores, 3, &[]);
        assert_eq!(a.workers, vec![Some(0), Some(1), Some(0)]);
        // One spare core for two devices: they share it.
        let a = assign_cores(&[0, 1, 2], 2, &[vec![], vec![]]);
        assert_eq!(a.devices, vec![Some(2), Some(2)]);
        // Two spare cores for three devices: in turn.
        let a = assign_cores(&[0, 1, 2, 3], 2, &[vec![], vec![], vec![]]);
        assert_eq!(a.devices, vec![Some(3), Some(2), Some(3)]);
        // Pinning off (no cores): nothing pinned.
        let a = assign_cores(&[], 2, &[vec![]]);
        assert_eq!(a.workers, vec![None, None]);
        assert_eq!(a.devices, vec![None]);
    }

    #[test]
    fn links_from_the_pcie_link_and_peer_paths() {
        let gen4 = host_link(Some(31.5e9));
        assert!((gen4.bandwidth - 26.775e9).abs() < 1e3);
        assert_eq!(host_link(None), GUESSED_HOST_LINK);
        let gen5 = host_link(Some(63e9));
        let direct = device_link(gen4, gen5, true);
        assert_eq!(direct.bandwidth, gen4.bandwidth);
        let staged = device_link(gen4, gen5, false);
        // Through the host: slower than either hop, and both latencies.
        assert!(staged.bandwidth < gen4.bandwidth);
        assert!((staged.latency - 20e-6).abs() < 1e-12);
        let bytes = 1 << 30;
        assert!(
            (staged.time(bytes) - (gen4.time(bytes) + gen5.time(bytes))).abs() < 1e-9,
            "two copies in a row"
        );
    }
}
