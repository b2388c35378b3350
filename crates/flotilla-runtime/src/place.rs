//! Placement: the glue between ready tasks and flotilla-sched's policies.
//!
//! Units are numbered CPU workers first (`0..n_cpu`, all on memory node 0), then one unit
//! per device (memory node `1 + device index`). A ready task is shown to the policy as a
//! `TaskView` (which units can run it, its footprint, where its inputs are valid), and the
//! decision is carried out here:
//! - `Local` → the current CPU worker's deque (work stealing), else the central queue;
//! - `Central` → the central queue for CPU-capable tasks; a device-only task goes to the
//!   capable device with the shortest queue;
//! - `Unit(u)` → CPU worker u's mailbox, or device u's queue; the prediction is added to
//!   the unit's expected backlog (`free_at`), which `dmda` uses for the next decision.
//!
//! Every executed codelet task adds a sample to the performance model under
//! (codelet, unit arch, footprint).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use flotilla_core::{MemNodeId, UnitId};
use flotilla_devices::DeviceKind;
use flotilla_sched::{
    BuiltinPolicy, Decision, InputView, Link, Load, PerfModel, Platform, Policy, PolicyKind,
    TaskView,
};

use crate::job::Job;
use crate::registry::Registry;
use crate::task::{Codelet, TaskNode};

/// The scheduler's mutable state, behind one lock.
pub(crate) struct SchedState {
    pub(crate) policy: BuiltinPolicy,
    pub(crate) platform: Platform,
    pub(crate) model: PerfModel,
    /// Predicted seconds of work queued or running on each unit.
    pub(crate) backlog: Vec<f64>,
    pub(crate) epoch: Instant,
    /// The version of the link observations last folded into `platform`.
    pub(crate) links_seen: u64,
}

/// The device kind of each unit and its arch string, fixed at build time.
pub(crate) struct UnitTable {
    pub(crate) kinds: Vec<DeviceKind>,
    pub(crate) archs: Vec<String>,
}

/// Whether some unit of this runtime has an implementation for the codelet.
pub(crate) fn can_run_anywhere(reg: &Registry, c: &Codelet) -> bool {
    (reg.n_cpu > 0 && c.cpu.is_some())
        || reg
            .devices
            .iter()
            .any(|d| c.implementation(d.kind).is_some())
}

fn unit_kind(reg: &Registry, u: usize) -> DeviceKind {
    if u < reg.n_cpu {
        DeviceKind::Cpu
    } else {
        reg.devices[u - reg.n_cpu].kind
    }
}

/// Places a ready task.
pub(crate) fn place(reg: &Arc<Registry>, node: Arc<TaskNode>) {
    let cpu_ok = reg.n_cpu > 0 && node.codelet.cpu.is_some();
    let dev_ok = reg
        .devices
        .iter()
        .any(|d| node.codelet.implementation(d.kind).is_some());
    // Fast path: without devices, eager and ws need no shared state.
    if !dev_ok {
        match reg.policy_kind {
            PolicyKind::Ws => {
                reg.push_local_or_central(Job::Task(node));
                return;
            }
            PolicyKind::Eager => {
                reg.push_central(Job::Task(node));
                return;
            }
            _ => {}
        }
    }
    let n_units = reg.n_cpu + reg.devices.len();
    let can_run: Vec<bool> = (0..n_units)
        .map(|u| node.codelet.implementation(unit_kind(reg, u)).is_some())
        .collect();
    let inputs: Vec<InputView> = node
        .accesses
        .iter()
        .filter(|(_, m)| m.reads())
        .map(|(c, _)| InputView {
            bytes: c.bytes as u64,
            valid_on: c.valid_mask.load(Ordering::Acquire),
        })
        .collect();
    let submitter = crate::registry::WorkerThread::with_current(|w| match w {
        Some(w) if Arc::ptr_eq(&w.registry, reg) => Some(UnitId::new(w.index as u32)),
        _ => None,
    });
    let decision = {
        let mut s = reg.sched.lock();
        let v = reg.links.version();
        if v != s.links_seen {
            s.links_seen = v;
            let n = reg.data.node_count();
            for a in 0..n {
                for b in a + 1..n {
                    if let Some(bw) = reg.links.bandwidth(a, b) {
                        s.platform.set_link(
                            MemNodeId::new(a as u32),
                            MemNodeId::new(b as u32),
                            Link {
                                bandwidth: bw,
                                latency: 20e-6,
                            },
                        );
                    }
                }
            }
        }
        let now = s.epoch.elapsed().as_secs_f64();
        let free_at: Vec<f64> = s.backlog.iter().map(|b| now + b.max(0.0)).collect();
        let view = TaskView {
            codelet: &node.codelet.name,
            footprint: node.footprint,
            priority: node.priority,
            can_run: &can_run,
            inputs: &inputs,
            submitter,
        };
        let load = Load {
            now,
            free_at: &free_at,
        };
        let s = &mut *s;
        let d = s.policy.place(&view, &s.platform, &load, &s.model);
        if let Decision::Unit { unit, predicted } = &d {
            let u = unit.index();
            if u < n_units && can_run[u] {
                let p = predicted.unwrap_or(0.0);
                s.backlog[u] += p;
                node.predicted.store(p.to_bits(), Ordering::Relaxed);
            }
        }
        d
    };
    match decision {
        Decision::Unit { unit, .. } if unit.index() < n_units && can_run[unit.index()] => {
            let u = unit.index();
            node.unit.store(u as u32, Ordering::Relaxed);
            if u < reg.n_cpu {
                reg.push_mailbox(u, Job::Task(node));
            } else {
                reg.devices[u - reg.n_cpu].push(node);
            }
        }
        Decision::Local if cpu_ok => reg.push_local_or_central(Job::Task(node)),
        _ if cpu_ok && !dev_ok => reg.push_central(Job::Task(node)),
        _ => {
            // Central with devices in play, or a decision we cannot honour: the capable
            // queue with the least work per unit.
            let cpu_len = if cpu_ok {
                Some(reg.injector.len() as f64 / reg.n_cpu.max(1) as f64)
            } else {
                None
            };
            let best_dev = reg
                .devices
                .iter()
                .enumerate()
                .filter(|(_, d)| node.codelet.implementation(d.kind).is_some())
                .min_by_key(|(_, d)| d.len());
            match (cpu_len, best_dev) {
                (Some(cl), Some((i, d))) if (d.len() as f64) < cl => {
                    node.unit.store((reg.n_cpu + i) as u32, Ordering::Relaxed);
                    d.push(node)
                }
                (Some(_), _) => reg.push_central(Job::Task(node)),
                (None, Some((i, d))) => {
                    node.unit.store((reg.n_cpu + i) as u32, Ordering::Relaxed);
                    d.push(node)
                }
                (None, None) => unreachable!("submit checks that some unit can run the codelet"),
            }
        }
    }
}

/// After a task ran on `unit` for `seconds`: update the backlog and the model.
pub(crate) fn account(reg: &Registry, node: &TaskNode, unit: usize, seconds: f64, ok: bool) {
    let predicted = f64::from_bits(node.predicted.load(Ordering::Relaxed));
    if !node.codelet.calibrate && predicted == 0.0 {
        return;
    }
    let mut s = reg.sched.lock();
    if predicted > 0.0 {
        let placed = node.unit.load(Ordering::Relaxed) as usize;
        if let Some(b) = s.backlog.get_mut(placed) {
            *b = (*b - predicted).max(0.0);
        }
    }
    if ok && node.codelet.calibrate {
        let arch = &reg.units.archs[unit];
        s.model
            .record(&node.codelet.name, arch, node.footprint, seconds);
    }
}
