//! Device workers: two threads per device, so transfers overlap with compute.
//!
//! - The *prefetch* thread takes tasks placed on the device in order, makes each task's
//!   data valid on the device's memory node (uploading, allocating, evicting as needed)
//!   and pins it, then hands the task to the compute thread.
//! - The *compute* thread runs the task's implementation for the device's kind, unpins its
//!   data and completes it.
//!
//! The hand-off channel is bounded (`PREFETCH_DEPTH`), so at most that many tasks have
//! their data pinned ahead of execution: copies for the next tasks overlap the current
//! kernel without pinning the whole queue in device memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use flotilla_devices::{Device, DeviceBuffer, DeviceKind};
use parking_lot::{Condvar, Mutex};

use crate::error::{Result, RuntimeError};

use crate::registry::Registry;
use crate::task::{fail, run_on_device, TaskNode};

/// How many tasks may have their data fetched ahead of the running one.
const PREFETCH_DEPTH: usize = 2;

/// The queue of one device, as placement sees it.
pub(crate) struct DeviceQueue {
    pub(crate) kind: DeviceKind,
    tx: Mutex<Option<Sender<Arc<TaskNode>>>>,
    queued: Arc<AtomicUsize>,
}

impl DeviceQueue {
    /// Tasks placed here and not yet finished.
    pub(crate) fn len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
    /// Places a task on this device.
    pub(crate) fn push(&self, node: Arc<TaskNode>) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        match &*self.tx.lock() {
            // The receiver lives until `close`, which shutdown calls after every task ended.
            Some(tx) => {
                let _ = tx.send(node);
            }
            None => unreachable!("tasks are placed only before shutdown"),
        }
    }
    /// Closes the queue: the device's threads finish what is queued and stop.
    pub(crate) fn close(&self) {
        self.tx.lock().take();
    }
}

/// What the device threads are started with.
pub(crate) struct DeviceThreads {
    pub(crate) rx: Receiver<Arc<TaskNode>>,
    pub(crate) queued: Arc<AtomicUsize>,
}

/// Makes a device's queue and the receiving end its threads will use.
pub(crate) fn queue(kind: DeviceKind) -> (DeviceQueue, DeviceThreads) {
    let (tx, rx) = unbounded();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        DeviceQueue {
            kind,
            tx: Mutex::new(Some(tx)),
            queued: queued.clone(),
        },
        DeviceThreads { rx, queued },
    )
}

/// Tasks handed to the compute thread and not finished yet.
#[derive(Default)]
struct Pipeline {
    inflight: Mutex<usize>,
    cv: Condvar,
}

impl Pipeline {
    fn enter(&self) {
        *self.inflight.lock() += 1;
    }
    fn leave(&self) {
        let mut n = self.inflight.lock();
        *n -= 1;
        if *n == 0 {
            self.cv.notify_all();
        }
    }
    fn wait_empty(&self) {
        let mut n = self.inflight.lock();
        while *n > 0 {
            self.cv.wait(&mut n);
        }
    }
}

/// Acquires every datum of `node` on `mem_node`; on failure, unpins what it had pinned.
fn acquire_all(
    reg: &Registry,
    node: &TaskNode,
    mem_node: usize,
) -> Result<Vec<Option<Arc<DeviceBuffer>>>> {
    let mut buffers = Vec::with_capacity(node.accesses.len());
    for (cell, mode) in &node.accesses {
        match reg.data.acquire(cell, mem_node, *mode) {
            Ok(b) => buffers.push(b),
            Err(e) => {
                for (cell, _) in node.accesses.iter().take(buffers.len()) {
                    reg.data.release(cell, mem_node);
                }
                return Err(e);
            }
        }
    }
    Ok(buffers)
}

type Prefetched = (Arc<TaskNode>, Vec<Option<Arc<DeviceBuffer>>>);

/// Starts the prefetch and compute threads of device `dev_index` (unit `unit`, memory
/// node `mem_node`), pinned to `core` when given (a core no CPU worker uses, so the threads
/// that drive a device never wait behind CPU tasks). They stop when the queue's sender is
/// dropped.
pub(crate) fn start(
    reg: Arc<Registry>,
    device: Arc<dyn Device>,
    dev_index: usize,
    unit: usize,
    mem_node: usize,
    threads: DeviceThreads,
    core: Option<core_affinity::CoreId>,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let (htx, hrx) = bounded::<Prefetched>(PREFETCH_DEPTH);
    let pipeline = Arc::new(Pipeline::default());
    let pipeline2 = pipeline.clone();
    let name = device.info().name.clone();
    let r1 = reg.clone();
    let queued = threads.queued.clone();
    let queued2 = threads.queued.clone();
    let prefetch = std::thread::Builder::new()
        .name(format!("flotilla-dev{dev_index}-prefetch"))
        .spawn(move || {
            if let Some(c) = core {
                let _ = core_affinity::set_for_current(c);
            }
            for node in threads.rx.iter() {
                let mut acquired = acquire_all(&r1, &node, mem_node);
                if matches!(acquired, Err(RuntimeError::DeviceFull { .. })) {
                    // The memory is pinned by tasks ahead of this one: wait until they are
                    // done and try once more; only then is the task itself too big.
                    pipeline.wait_empty();
                    acquired = acquire_all(&r1, &node, mem_node);
                }
                let buffers = match acquired {
                    Ok(b) => b,
                    Err(e) => {
                        queued.fetch_sub(1, Ordering::Relaxed);
                        fail(&r1, &node, &name, e.to_string());
                        continue;
                    }
                };
                pipeline.enter();
                if htx.send((node, buffers)).is_err() {
                    return;
                }
            }
        })?;
    let compute = std::thread::Builder::new()
        .name(format!("flotilla-dev{dev_index}-compute"))
        .spawn(move || {
            if let Some(c) = core {
                let _ = core_affinity::set_for_current(c);
            }
            for (node, buffers) in hrx.iter() {
                run_on_device(&reg, unit, mem_node, &device, node, buffers);
                queued2.fetch_sub(1, Ordering::Relaxed);
                pipeline2.leave();
            }
        })?;
    Ok(vec![prefetch, compute])
}
