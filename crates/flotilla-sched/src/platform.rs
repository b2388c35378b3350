//! The machine as the scheduler sees it: processing units, the memory nodes they work in,
//! and the links that move data between nodes.

use flotilla_core::{MemNodeId, UnitId};
use serde::{Deserialize, Serialize};

/// What kind of processing unit a [`Unit`] is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitKind {
    /// A CPU core (or a group of cores acting as one worker).
    Cpu,
    /// A CUDA device.
    Cuda,
    /// An OpenCL device.
    OpenCl,
    /// A slot on a remote worker.
    Remote,
}

/// One processing unit.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Unit {
    /// The unit's id: its position in [`Platform::units`].
    pub id: UnitId,
    /// What kind of unit it is.
    pub kind: UnitKind,
    /// The memory node it reads and writes.
    pub node: MemNodeId,
    /// The performance-model key of its architecture, e.g. `"cpu"`, `"opencl:pocl"`,
    /// `"cuda:NVIDIA H200"`. Units with the same `arch` share performance history.
    pub arch: String,
}

/// A link between two memory nodes.
#[derive(Clone, Copy, PartialEq, Debug, Serialize, Deserialize)]
pub struct Link {
    /// Bytes per second.
    pub bandwidth: f64,
    /// Seconds before the first byte arrives.
    pub latency: f64,
}

impl Link {
    /// The link used between two nodes when none was set: 10 GB/s and 10 µs latency,
    /// roughly a PCIe 3.0 x16 host-to-device copy.
    pub const DEFAULT: Link = Link {
        bandwidth: 10e9,
        latency: 10e-6,
    };

    /// Seconds to move `bytes` over this link: `latency + bytes / bandwidth`.
    pub fn time(&self, bytes: u64) -> f64 {
        self.latency + bytes as f64 / self.bandwidth
    }
}

/// Units, memory nodes and the links between nodes.
///
/// Ids are dense: the n-th node added is `MemNodeId::new(n)`, the n-th unit `UnitId::new(n)`,
/// so per-unit tables (`can_run`, `free_at`) are plain slices indexed by `UnitId::index()`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Platform {
    units: Vec<Unit>,
    nodes: Vec<String>,
    /// Row-major `nodes.len() x nodes.len()` matrix; `None` means "use `default_link`".
    links: Vec<Option<Link>>,
    default_link: Option<Link>,
}

impl Platform {
    /// An empty platform.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a memory node named `name` (e.g. `"host"`, `"cuda0"`) and returns its id.
    pub fn add_node(&mut self, name: &str) -> MemNodeId {
        let old = self.nodes.len();
        let new = old + 1;
        let mut links = vec![None; new * new];
        for a in 0..old {
            for b in 0..old {
                links[a * new + b] = self.links[a * old + b];
            }
        }
        self.links = links;
        self.nodes.push(name.to_owned());
        MemNodeId::new(u32::try_from(old).expect("fewer than 2^32 memory nodes"))
    }

    /// Adds a unit of `kind` working in memory node `node`, with performance-model key
    /// `arch`, and returns its id.
    ///
    /// # Panics
    /// If `node` was not returned by [`Platform::add_node`] on this platform.
    pub fn add_unit(&mut self, kind: UnitKind, node: MemNodeId, arch: &str) -> UnitId {
        assert!(
            node.index() < self.nodes.len(),
            "add_unit: memory node {node} does not exist"
        );
        let id = UnitId::new(u32::try_from(self.units.len()).expect("fewer than 2^32 units"));
        self.units.push(Unit {
            id,
            kind,
            node,
            arch: arch.to_owned(),
        });
        id
    }

    /// Sets the link between `a` and `b`, in both directions.
    ///
    /// # Panics
    /// If either node was not added to this platform.
    pub fn set_link(&mut self, a: MemNodeId, b: MemNodeId, link: Link) {
        let n = self.nodes.len();
        assert!(
            a.index() < n && b.index() < n,
            "set_link: memory node {a} or {b} does not exist"
        );
        self.links[a.index() * n + b.index()] = Some(link);
        self.links[b.index() * n + a.index()] = Some(link);
    }

    /// Sets the link used between nodes that have no link of their own
    /// (otherwise [`Link::DEFAULT`]).
    pub fn set_default_link(&mut self, link: Link) {
        self.default_link = Some(link);
    }

    /// The link used between nodes with no link of their own.
    pub fn default_link(&self) -> Link {
        self.default_link.unwrap_or(Link::DEFAULT)
    }

    /// The link between `a` and `b`: the one set by [`Platform::set_link`], else the
    /// default link ([`Platform::set_default_link`], else [`Link::DEFAULT`]).
    pub fn link(&self, a: MemNodeId, b: MemNodeId) -> Link {
        let n = self.nodes.len();
        let set = if a.index() < n && b.index() < n {
            self.links[a.index() * n + b.index()]
        } else {
            None
        };
        set.unwrap_or_else(|| self.default_link())
    }

    /// All units, in id order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// One unit.
    ///
    /// # Panics
    /// If `u` is not a unit of this platform.
    pub fn unit(&self, u: UnitId) -> &Unit {
        &self.units[u.index()]
    }

    /// How many memory nodes there are.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// A memory node's name, if it exists.
    pub fn node_name(&self, node: MemNodeId) -> Option<&str> {
        self.nodes.get(node.index()).map(String::as_str)
    }

    /// Seconds to move `bytes` from node `from` to node `to`: 0 on the same node, else
    /// `latency + bytes / bandwidth` of [`Platform::link`] (so [`Link::DEFAULT`], 10 GB/s
    /// and 10 µs, between nodes with no link set).
    pub fn transfer_time(&self, from: MemNodeId, to: MemNodeId, bytes: u64) -> f64 {
        if from == to {
            0.0
        } else {
            self.link(from, to).time(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_uses_set_link_symmetrically_and_default_otherwise() {
        let mut p = Platform::new();
        let host = p.add_node("host");
        let gpu0 = p.add_node("gpu0");
        let gpu1 = p.add_node("gpu1");
        p.set_link(
            host,
            gpu0,
            Link {
                bandwidth: 1e9,
                latency: 1e-3,
            },
        );
        assert_eq!(p.transfer_time(host, host, 1 << 30), 0.0);
        let t = p.transfer_time(gpu0, host, 2_000_000_000);
        assert!((t - 2.001).abs() < 1e-12, "{t}");
        assert_eq!(
            p.transfer_time(host, gpu0, 1000),
            p.transfer_time(gpu0, host, 1000)
        );
        let d = p.transfer_time(host, gpu1, 10_000_000_000);
        assert!((d - (1.0 + 10e-6)).abs() < 1e-12, "{d}");
        p.set_default_link(Link {
            bandwidth: 1.0,
            latency: 0.0,
        });
        assert_eq!(p.transfer_time(gpu1, gpu0, 5), 5.0);
    }

    #[test]
    fn links_survive_adding_nodes_and_ids_are_dense() {
        let mut p = Platform::new();
        let a = p.add_node("a");
        let b = p.add_node("b");
        let l = Link {
            bandwidth: 4.0,
            latency: 1.0,
        };
        p.set_link(a, b, l);
        let c = p.add_node("c");
        assert_eq!(c.index(), 2);
        assert_eq!(p.link(b, a), l);
        assert_eq!(p.node_count(), 3);
        assert_eq!(p.node_name(c), Some("c"));
        let u0 = p.add_unit(UnitKind::Cpu, a, "cpu");
        let u1 = p.add_unit(UnitKind::Cuda, c, "cuda:x");
        assert_eq!((u0.index(), u1.index()), (0, 1));
        assert_eq!(p.unit(u1).node, c);
        assert_eq!(p.units().len(), 2);
    }
}
