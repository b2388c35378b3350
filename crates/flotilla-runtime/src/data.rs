//! The data manager: registered data, its replicas on memory nodes, and their coherence.
//!
//! # Memory nodes
//! Node 0 is host memory; each device (an OpenCL device, a CUDA GPU) is one more node.
//! Every piece of registered data has one replica slot per node.
//!
//! # The MSI state machine (per data, per node)
//! - `Modified`: the only valid copy.
//! - `Shared`: valid, and at least one other node holds a valid copy too.
//! - `Invalid`: absent or stale.
//!
//! Transitions, all made under the data's `coherence` lock:
//! - *read on node n* (`R`): if n is `Invalid`, copy from a valid node (the host if it is
//!   valid, else any device). Between two devices with a direct link
//!   ([`Device::can_copy_to_peer`], e.g. NVLink or PCIe peer-to-peer between GPUs) the copy
//!   is direct and the host stays `Invalid`; otherwise it goes through the host, which
//!   becomes `Shared` too. The source, if `Modified`, becomes `Shared`; n becomes `Shared`.
//! - *write on node n* (`W`): n gets a buffer and becomes `Modified`; every other node
//!   becomes `Invalid` (device buffers are freed).
//! - *read-write on node n* (`RW`): a read, then a write.
//! - *eviction from device node n* (only unpinned replicas, least recently used first):
//!   a `Modified` replica is first written back to the host (host becomes `Modified`);
//!   then n becomes `Invalid` and its buffer is freed. If only one valid copy is left, it
//!   becomes `Modified`.
//! - *unregister*: the data is brought home (a read on node 0), device buffers are freed.
//!
//! # Pinned host memory
//! Plain data of at least [`PIN_MIN_BYTES`] is page-locked when registered, through the
//! first device whose backend gains from it (CUDA: `cuMemHostRegister`), so its copies run
//! by DMA at the link's speed; the pin is dropped before the data is handed back or freed.
//! The vector's heap block never moves while registered: tasks get slices, never the `Vec`.
//!
//! # Why this is race free
//! The task graph orders every writer after every earlier reader and writer of the same
//! data (RAW, WAR, WAW), and a task is placed only when its predecessors are done. So when
//! a task's inputs are acquired, no task that could observe the change is running: readers
//! of one version run concurrently on any nodes (they only add `Shared` replicas), and a
//! writer runs alone. A replica is pinned from the moment its task's inputs are acquired
//! on a device until the task completes, and eviction skips pinned replicas, so a buffer
//! never disappears under a running task. Host memory is never evicted. Each device node's
//! fetches are made by that device's one prefetch thread; eviction only `try_lock`s its
//! victims, so no thread ever waits for a data lock while holding another: when the only
//! replica that could go is locked, `acquire` lets go of its own and waits for that one
//! before it starts again. Room on a device is reserved before the device is asked, so two
//! fetches never both take its last bytes. `shuttle_models` below checks all of this.

use std::any::Any;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::error::{Result, RuntimeError};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::task::TaskNode;
use flotilla_core::DataId;
use flotilla_devices::{Device, DeviceBuffer, DevicesError, HostPin};

/// The index of host memory among the memory nodes.
pub(crate) const HOST: usize = 0;

/// Registered data at least this large is page-locked when a device's backend gains from
/// it: pinning costs about as much as a copy, so small data is not worth it.
pub const PIN_MIN_BYTES: usize = 256 << 10;

/// How a task uses a piece of data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read only.
    R,
    /// Written entirely; the previous contents are not read.
    W,
    /// Read and written.
    RW,
}

impl Access {
    /// Whether the task reads the previous contents.
    pub fn reads(self) -> bool {
        matches!(self, Access::R | Access::RW)
    }
    /// Whether the task writes.
    pub fn writes(self) -> bool {
        matches!(self, Access::W | Access::RW)
    }
}

/// A replica's coherence state on one memory node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msi {
    /// Absent or stale.
    Invalid,
    /// Valid; another node holds a valid copy too.
    Shared,
    /// The only valid copy.
    Modified,
}

/// Host storage of a piece of data, type-erased.
pub(crate) trait HostData: Send + Sync {
    fn bytes(&self) -> Option<&[u8]>;
    fn bytes_mut(&mut self) -> Option<&mut [u8]>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn take_any(&mut self) -> Box<dyn Any + Send>;
}

struct PodVec<T: bytemuck::Pod + Send + Sync>(Vec<T>);

impl<T: bytemuck::Pod + Send + Sync> HostData for PodVec<T> {
    fn bytes(&self) -> Option<&[u8]> {
        Some(bytemuck::cast_slice(&self.0))
    }
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(bytemuck::cast_slice_mut(&mut self.0))
    }
    fn as_any(&self) -> &dyn Any {
        &self.0
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        &mut self.0
    }
    fn take_any(&mut self) -> Box<dyn Any + Send> {
        Box::new(std::mem::take(&mut self.0))
    }
}

struct Object<T: Send + Sync + 'static>(Option<T>);

impl<T: Send + Sync + 'static> HostData for Object<T> {
    fn bytes(&self) -> Option<&[u8]> {
        None
    }
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
    fn as_any(&self) -> &dyn Any {
        match &self.0 {
            Some(v) => v,
            None => &(),
        }
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        match &mut self.0 {
            Some(v) => v,
            None => unreachable!("an object is taken only by unregister, after its last use"),
        }
    }
    fn take_any(&mut self) -> Box<dyn Any + Send> {
        match self.0.take() {
            Some(v) => Box::new(v),
            None => Box::new(()),
        }
    }
}

/// Replicas and their states, guarded by the data's coherence lock.
pub(crate) struct Coherence {
    pub(crate) states: Vec<Msi>,
    pub(crate) buffers: Vec<Option<Arc<DeviceBuffer>>>,
    pub(crate) pins: Vec<u32>,
    pub(crate) last_use: Vec<u64>,
}

/// The task-graph bookkeeping of a piece of data: who wrote it last, who read it since.
#[derive(Default)]
///
/// The links are weak: a finished task is dropped once nothing else needs it, and a data
/// whose last writer failed is marked `poisoned` so later readers fail too.
pub(crate) struct DepState {
    pub(crate) last_writer: Option<Weak<TaskNode>>,
    pub(crate) readers: Vec<Weak<TaskNode>>,
}

/// One registered piece of data.
pub(crate) struct DataCell {
    pub(crate) id: DataId,
    pub(crate) bytes: usize,
    /// What it holds, as messages name it (`Vec<f64>`, `HashMap<String, u32>`).
    pub(crate) type_name: String,
    pub(crate) deps: Mutex<DepState>,
    /// Set when the last writer failed: the contents are not what the program expects.
    pub(crate) poisoned: AtomicBool,
    pub(crate) coherence: Mutex<Coherence>,
    /// Bit n set when node n holds a valid replica (a lock-free copy for the scheduler).
    pub(crate) valid_mask: AtomicU64,
    /// The page-lock on the host storage, if any. Declared before `host` so that it is
    /// dropped first when the cell goes away.
    host_pin: Mutex<Option<PinnedHost>>,
    host: UnsafeCell<Box<dyn HostData>>,
}

// SAFETY: the host storage is read concurrently only by tasks reading the same version, and
// written only by one writer task or by the data manager under the coherence lock while no
// task uses the host replica; the task graph guarantees both (see the module docs).
unsafe impl Sync for DataCell {}

impl DataCell {
    /// The host storage for reading. Callers hold a read access granted by the task graph.
    pub(crate) fn host(&self) -> &dyn HostData {
        // SAFETY: see the `Sync` impl: no writer exists while readers run.
        unsafe { &**self.host.get() }
    }
    /// The host storage for writing.
    ///
    /// # Safety
    /// The caller must be the only user of the host replica: a task holding a write access,
    /// or the data manager under the coherence lock while the host replica is not in use.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn host_mut(&self) -> &mut dyn HostData {
        // SAFETY: exclusivity is the caller's obligation (see above).
        unsafe { &mut **self.host.get() }
    }
    fn set_mask(&self, c: &Coherence) {
        let mut m = 0u64;
        for (i, s) in c.states.iter().enumerate() {
            if *s != Msi::Invalid && i < 64 {
                m |= 1 << i;
            }
        }
        self.valid_mask.store(m, Ordering::Release);
    }
}

/// A typed handle to registered data of type `T` (`Vec<E>` for plain data registered with
/// `Runtime::register`). Cloning it clones the handle, not the data.
pub struct Data<T> {
    pub(crate) cell: Arc<DataCell>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Data<T> {
    fn clone(&self) -> Self {
        Self {
            cell: self.cell.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> Data<T> {
    /// The data's id.
    pub fn id(&self) -> DataId {
        self.cell.id
    }
    /// Its size in bytes (0 for host-only objects).
    pub fn bytes(&self) -> usize {
        self.cell.bytes
    }
    /// The coherence state of its replica on each memory node (node 0 is the host).
    pub fn states(&self) -> Vec<Msi> {
        self.cell.coherence.lock().states.clone()
    }
    /// Whether its host storage is page-locked for faster device copies (see
    /// [`PIN_MIN_BYTES`]).
    pub fn host_pinned(&self) -> bool {
        self.cell.host_pin.lock().is_some()
    }
}

impl<T> std::fmt::Debug for Data<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Data({}, {} bytes)", self.cell.id, self.cell.bytes)
    }
}

/// A page-lock on a datum's host storage, counted in the data manager's pinned bytes for
/// as long as it lives (however it ends: unregistered or dropped).
struct PinnedHost {
    _pin: HostPin,
    len: u64,
    counter: Arc<AtomicU64>,
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// One device memory node as the data manager sees it.
pub(crate) struct NodeMem {
    pub(crate) device: Arc<dyn Device>,
    pub(crate) capacity: u64,
    pub(crate) used: Mutex<u64>,
    pub(crate) resident: Mutex<Vec<Weak<DataCell>>>,
}

/// Counters of what the data manager did, for tests, traces and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Host → device copies.
    pub uploads: u64,
    /// Device → host copies.
    pub downloads: u64,
    /// Bytes copied either way.
    pub bytes: u64,
    /// Replicas evicted from device memory.
    pub evictions: u64,
    /// Evictions that first wrote a modified replica back to the host.
    pub writebacks: u64,
    /// Direct device → device copies (no host replica made).
    pub peer_copies: u64,
    /// Host bytes currently page-locked for faster copies.
    pub pinned_bytes: u64,
}

/// One completed copy, reported to the tracer and the transfer model.
pub(crate) struct TransferEvent {
    pub(crate) node: usize,
    /// The other end: the host for uploads and downloads, the source device of a peer copy.
    pub(crate) from: usize,
    pub(crate) upload: bool,
    /// A direct copy from another device into `node` (not over the host link).
    pub(crate) peer: bool,
    pub(crate) bytes: usize,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

/// Why acquiring data stopped short: an error, or a replica that would make room on a
/// device is locked by another thread (wait for it with no lock held, then start again).
enum Stall {
    Failed(RuntimeError),
    Busy(Arc<DataCell>),
}

impl From<RuntimeError> for Stall {
    fn from(e: RuntimeError) -> Self {
        Stall::Failed(e)
    }
}

/// What one eviction did.
enum Evicted {
    /// A replica went (or the one chosen became busy): look again.
    One,
    /// None could go, and this one was locked by another thread.
    Busy(Arc<DataCell>),
    /// None could go: every other replica is pinned.
    None,
}

/// Owns the memory nodes and the registry of data.
pub(crate) struct DataManager {
    pub(crate) nodes: Vec<Option<NodeMem>>,
    next_id: AtomicU32,
    clock: AtomicU64,
    stats: Mutex<TransferStats>,
    pub(crate) on_transfer: Option<Box<dyn Fn(TransferEvent) + Send + Sync>>,
    /// Whether registered data is page-locked (see the module docs).
    pub(crate) pin_host: bool,
    /// Host bytes page-locked now.
    pinned: Arc<AtomicU64>,
}

impl DataManager {
    /// A data manager with host memory and one node per device, each device's memory
    /// capped at `limit` bytes when given (never more than the device has).
    pub(crate) fn new(devices: &[Arc<dyn Device>], limit: Option<u64>) -> Self {
        let mut nodes = vec![None];
        for d in devices {
            let own = d.info().global_mem;
            let capacity = match limit {
                Some(l) => l.min(own),
                None => own,
            };
            nodes.push(Some(NodeMem {
                device: d.clone(),
                capacity,
                used: Mutex::new(0),
                resident: Mutex::new(Vec::new()),
            }));
        }
        Self {
            nodes,
            next_id: AtomicU32::new(0),
            clock: AtomicU64::new(0),
            stats: Mutex::new(TransferStats::default()),
            on_transfer: None,
            pin_host: true,
            pinned: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn stats(&self) -> TransferStats {
        let mut s = self.stats.lock().clone();
        s.pinned_bytes = self.pinned.load(Ordering::Relaxed);
        s
    }

    fn new_cell(&self, host: Box<dyn HostData>, bytes: usize, type_name: String) -> Arc<DataCell> {
        let n = self.nodes.len();
        let mut states = vec![Msi::Invalid; n];
        states[HOST] = Msi::Modified;
        Arc::new(DataCell {
            id: DataId::new(self.next_id.fetch_add(1, Ordering::Relaxed)),
            bytes,
            type_name,
            deps: Mutex::new(DepState::default()),
            poisoned: AtomicBool::new(false),
            coherence: Mutex::new(Coherence {
                states,
                buffers: vec![None; n],
                pins: vec![0; n],
                last_use: vec![0; n],
            }),
            valid_mask: AtomicU64::new(1),
            host_pin: Mutex::new(None),
            host: UnsafeCell::new(host),
        })
    }

    /// Registers a vector of plain data (it may move to devices).
    pub(crate) fn register<T: bytemuck::Pod + Send + Sync>(&self, v: Vec<T>) -> Data<Vec<T>> {
        let bytes = std::mem::size_of_val(v.as_slice());
        let ptr = v.as_ptr().cast::<u8>();
        let cell = self.new_cell(Box::new(PodVec(v)), bytes, short_type_name::<Vec<T>>());
        if self.pin_host && bytes >= PIN_MIN_BYTES {
            // SAFETY: the vector's heap block stays in place while registered (tasks see
            // slices, never the Vec), and the pin is dropped before the block can be freed
            // or handed back: by `unpin_host` before `unregister` takes the vector, or
            // first among the cell's fields when the cell is dropped.
            *cell.host_pin.lock() = unsafe { self.pin(ptr, bytes) };
        }
        Data {
            cell,
            _t: PhantomData,
        }
    }

    /// Pins `[ptr, ptr + len)` through the first device that does it; a failure only
    /// leaves the memory pageable (slower copies).
    ///
    /// # Safety
    /// As [`Device::pin_host_memory`].
    unsafe fn pin(&self, ptr: *const u8, len: usize) -> Option<PinnedHost> {
        for mem in self.nodes.iter().flatten() {
            // SAFETY: forwarded to the caller.
            match unsafe { mem.device.pin_host_memory(ptr, len) } {
                Ok(Some(pin)) => {
                    let len = pin.len_bytes() as u64;
                    self.pinned.fetch_add(len, Ordering::Relaxed);
                    return Some(PinnedHost {
                        _pin: pin,
                        len,
                        counter: Arc::clone(&self.pinned),
                    });
                }
                Ok(None) => {}
                // The memory stays pageable: copies are slower, nothing else changes.
                Err(_) => return None,
            }
        }
        None
    }

    /// Drops the page-lock of `cell`'s host storage (before the storage is handed back).
    pub(crate) fn unpin_host(&self, cell: &DataCell) {
        drop(cell.host_pin.lock().take());
    }

    /// Registers any value; it stays in host memory.
    pub(crate) fn register_object<T: Send + Sync + 'static>(&self, v: T) -> Data<T> {
        Data {
            cell: self.new_cell(Box::new(Object(Some(v))), 0, short_type_name::<T>()),
            _t: PhantomData,
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn device_err(&self, node: usize, e: DevicesError) -> RuntimeError {
        let device = match &self.nodes[node] {
            Some(n) => n.device.info().name.clone(),
            None => "host".to_string(),
        };
        RuntimeError::Device { device, source: e }
    }

    /// Makes the data valid on `node` for `mode` and, on a device node, pins the replica
    /// and returns its buffer. Called by the thread that runs or prefetches the task.
    ///
    /// When making room on a device needs a replica whose lock another thread holds (it is
    /// being fetched, copied from or evicted elsewhere), this lets go of the data's own lock,
    /// waits for that one, and starts again: holding one data lock while waiting for another
    /// could deadlock, and giving up (as it did) would fail a task for a device that is not
    /// full, which the shuttle model below found.
    pub(crate) fn acquire(
        &self,
        cell: &Arc<DataCell>,
        node: usize,
        mode: Access,
    ) -> Result<Option<Arc<DeviceBuffer>>> {
        loop {
            let mut c = cell.coherence.lock();
            match self.acquire_locked(cell, &mut c, node, mode) {
                Ok(buf) => return Ok(buf),
                Err(Stall::Failed(e)) => return Err(e),
                Err(Stall::Busy(victim)) => {
                    // Every lock this thread held is released before it waits.
                    drop(c);
                    drop(victim.coherence.lock());
                }
            }
        }
    }

    /// [`DataManager::acquire`] under the data's lock. Every state it leaves when it stalls
    /// is a coherent one (a fetch through the host leaves the host `Shared`).
    fn acquire_locked(
        &self,
        cell: &Arc<DataCell>,
        c: &mut Coherence,
        node: usize,
        mode: Access,
    ) -> std::result::Result<Option<Arc<DeviceBuffer>>, Stall> {
        if node != HOST && cell.host().bytes().is_none() {
            return Err(Stall::Failed(RuntimeError::Config(format!(
                "data {} ({}) is a host-only object and cannot move to a device",
                cell.id, cell.type_name
            ))));
        }
        if mode.reads() && c.states[node] == Msi::Invalid {
            self.fetch(cell, c, node)?;
        }
        if mode.writes() {
            if node != HOST && c.buffers[node].is_none() {
                let buf = self.alloc_on(cell, node)?;
                c.buffers[node] = Some(Arc::new(buf));
            }
            for other in 0..c.states.len() {
                if other != node && c.states[other] != Msi::Invalid {
                    c.states[other] = Msi::Invalid;
                    if other != HOST {
                        self.free_replica(cell, c, other);
                    }
                }
            }
            c.states[node] = Msi::Modified;
        }
        c.last_use[node] = self.tick();
        let buf = if node == HOST {
            None
        } else {
            c.pins[node] += 1;
            c.buffers[node].clone()
        };
        cell.set_mask(c);
        Ok(buf)
    }

    /// Unpins a device replica after its task completed.
    pub(crate) fn release(&self, cell: &DataCell, node: usize) {
        if node != HOST {
            let mut c = cell.coherence.lock();
            c.pins[node] = c.pins[node].saturating_sub(1);
        }
    }

    /// Copies a valid replica to `node` (which is invalid).
    fn fetch(
        &self,
        cell: &Arc<DataCell>,
        c: &mut Coherence,
        node: usize,
    ) -> std::result::Result<(), Stall> {
        let valid = |i: &usize| c.states[*i] != Msi::Invalid;
        let src = if c.states[HOST] != Msi::Invalid {
            HOST
        } else {
            // A device with a direct link to `node` first, else any valid one.
            let direct = (1..c.states.len())
                .filter(valid)
                .find(|&i| node != HOST && self.direct(i, node));
            match direct.or_else(|| (0..c.states.len()).find(valid)) {
                Some(i) => i,
                None => {
                    return Err(Stall::Failed(RuntimeError::Config(format!(
                        "data {} has no valid replica (a writer failed before producing it)",
                        cell.id
                    ))))
                }
            }
        };
        if src != HOST && node != HOST && self.direct(src, node) {
            if c.buffers[node].is_none() {
                let buf = self.alloc_on(cell, node)?;
                c.buffers[node] = Some(Arc::new(buf));
            }
            self.copy_peer(cell, c, src, node)?;
        } else if src != HOST {
            // Device → host first (also the way between two devices without a link).
            self.download(cell, c, src)?;
            c.states[HOST] = Msi::Shared;
            c.states[src] = Msi::Shared;
            if node == HOST {
                return Ok(());
            }
        }
        if node != HOST && c.states[HOST] != Msi::Invalid {
            if c.buffers[node].is_none() {
                let buf = self.alloc_on(cell, node)?;
                c.buffers[node] = Some(Arc::new(buf));
            }
            self.upload(cell, c, node)?;
        }
        c.states[node] = Msi::Shared;
        for s in c.states.iter_mut() {
            if *s == Msi::Modified {
                *s = Msi::Shared;
            }
        }
        Ok(())
    }

    /// Whether device nodes `a` and `b` have a direct link for copies from `a` to `b`.
    pub(crate) fn direct(&self, a: usize, b: usize) -> bool {
        match (&self.nodes[a], &self.nodes[b]) {
            (Some(x), Some(y)) => x.device.can_copy_to_peer(y.device.as_ref()),
            _ => false,
        }
    }

    /// Copies `cell`'s replica on device node `src` straight into its buffer on `dst`.
    fn copy_peer(&self, cell: &DataCell, c: &Coherence, src: usize, dst: usize) -> Result<()> {
        let (Some(from), Some(to), Some(sb), Some(db)) = (
            &self.nodes[src],
            &self.nodes[dst],
            &c.buffers[src],
            &c.buffers[dst],
        ) else {
            return Err(RuntimeError::Config(format!(
                "no buffers for data {} on nodes {src} and {dst}",
                cell.id
            )));
        };
        let start = Instant::now();
        from.device
            .copy_to_peer(sb, to.device.as_ref(), db, cell.bytes)
            .map_err(|e| self.device_err(src, e))?;
        {
            let mut s = self.stats.lock();
            s.peer_copies += 1;
            s.bytes += cell.bytes as u64;
        }
        if let Some(f) = &self.on_transfer {
            f(TransferEvent {
                node: dst,
                from: src,
                upload: true,
                peer: true,
                bytes: cell.bytes,
                start,
                end: Instant::now(),
            });
        }
        Ok(())
    }

    fn upload(&self, cell: &DataCell, c: &Coherence, node: usize) -> Result<()> {
        let (Some(mem), Some(buf)) = (&self.nodes[node], &c.buffers[node]) else {
            return Err(RuntimeError::Config(format!(
                "no buffer for data {} on node {node}",
                cell.id
            )));
        };
        let Some(src) = cell.host().bytes() else {
            return Err(RuntimeError::Config(format!(
                "data {} has no bytes to upload",
                cell.id
            )));
        };
        let start = Instant::now();
        mem.device
            .upload(buf, src)
            .map_err(|e| self.device_err(node, e))?;
        self.count(node, true, cell.bytes, start);
        Ok(())
    }

    fn download(&self, cell: &DataCell, c: &Coherence, node: usize) -> Result<()> {
        let (Some(mem), Some(buf)) = (&self.nodes[node], &c.buffers[node]) else {
            return Err(RuntimeError::Config(format!(
                "no buffer for data {} on node {node}",
                cell.id
            )));
        };
        // SAFETY: the host replica is invalid (or being written back by eviction while the
        // host is not in use), so no task reads it; we hold the coherence lock.
        let host = unsafe { cell.host_mut() };
        let Some(dst) = host.bytes_mut() else {
            return Err(RuntimeError::Config(format!(
                "data {} has no bytes to download",
                cell.id
            )));
        };
        let start = Instant::now();
        mem.device
            .download(buf, dst)
            .map_err(|e| self.device_err(node, e))?;
        self.count(node, false, cell.bytes, start);
        Ok(())
    }

    fn count(&self, node: usize, upload: bool, bytes: usize, start: Instant) {
        {
            let mut s = self.stats.lock();
            if upload {
                s.uploads += 1;
            } else {
                s.downloads += 1;
            }
            s.bytes += bytes as u64;
        }
        if let Some(f) = &self.on_transfer {
            f(TransferEvent {
                node,
                from: HOST,
                upload,
                peer: false,
                bytes,
                start,
                end: Instant::now(),
            });
        }
    }

    /// Allocates room for `cell` on device `node`, evicting least recently used unpinned
    /// replicas when the node is full. The room is reserved in `used` before the device is
    /// asked, so two threads never both take the last of it.
    fn alloc_on(
        &self,
        cell: &Arc<DataCell>,
        node: usize,
    ) -> std::result::Result<DeviceBuffer, Stall> {
        let Some(mem) = &self.nodes[node] else {
            return Err(Stall::Failed(RuntimeError::Config(format!(
                "node {node} is not a device"
            ))));
        };
        let need = cell.bytes as u64;
        if need > mem.capacity {
            return Err(Stall::Failed(RuntimeError::Config(format!(
                "data {} ({} bytes) is larger than device {}'s memory ({} bytes)",
                cell.id,
                need,
                mem.device.info().name,
                mem.capacity
            ))));
        }
        loop {
            let (reserved, seen) = {
                let mut used = mem.used.lock();
                let seen = *used;
                let fits = seen + need <= mem.capacity;
                if fits {
                    *used += need;
                }
                (fits, seen)
            };
            if reserved {
                match mem.device.alloc(cell.bytes.max(1)) {
                    Ok(buf) => {
                        mem.resident.lock().push(Arc::downgrade(cell));
                        return Ok(buf);
                    }
                    Err(e) => {
                        let mut used = mem.used.lock();
                        *used = used.saturating_sub(need);
                        if !matches!(e, DevicesError::OutOfMemory { .. }) {
                            return Err(Stall::Failed(self.device_err(node, e)));
                        }
                    }
                }
            }
            match self.evict_one(node, cell.id)? {
                Evicted::One => {}
                Evicted::Busy(victim) => return Err(Stall::Busy(victim)),
                Evicted::None => {
                    // Room freed (or taken) by another thread since it looked: look again.
                    let used = *mem.used.lock();
                    if used != seen {
                        continue;
                    }
                    return Err(Stall::Failed(RuntimeError::DeviceFull {
                        device: mem.device.info().name.clone(),
                        data: cell.id.to_string(),
                        bytes: need,
                        used,
                        capacity: mem.capacity,
                    }));
                }
            }
        }
    }

    /// Evicts the least recently used unpinned replica on `node` (never `except`'s). When
    /// none can go, says whether some replica was locked by another thread (it may be
    /// evictable once let go) or every one is pinned.
    fn evict_one(&self, node: usize, except: DataId) -> Result<Evicted> {
        let Some(mem) = &self.nodes[node] else {
            return Ok(Evicted::None);
        };
        let candidates: Vec<Arc<DataCell>> = {
            let mut r = mem.resident.lock();
            r.retain(|w| w.strong_count() > 0);
            r.iter().filter_map(Weak::upgrade).collect()
        };
        let mut best: Option<(u64, &Arc<DataCell>)> = None;
        let mut busy: Option<&Arc<DataCell>> = None;
        for cand in &candidates {
            if cand.id == except {
                continue;
            }
            let Some(c) = cand.coherence.try_lock() else {
                busy = busy.or(Some(cand));
                continue;
            };
            if c.buffers[node].is_some() && c.pins[node] == 0 {
                let t = c.last_use[node];
                if best.is_none_or(|(bt, _)| t < bt) {
                    best = Some((t, cand));
                }
            }
        }
        let Some((_, victim)) = best else {
            return Ok(match busy {
                Some(b) => Evicted::Busy(b.clone()),
                None => Evicted::None,
            });
        };
        let Some(mut c) = victim.coherence.try_lock() else {
            return Ok(Evicted::One); // it became busy; the caller looks again
        };
        if c.pins[node] != 0 || c.buffers[node].is_none() {
            return Ok(Evicted::One);
        }
        if c.states[node] == Msi::Modified {
            self.download(victim, &c, node)?;
            c.states[HOST] = Msi::Modified;
            self.stats.lock().writebacks += 1;
        }
        c.states[node] = Msi::Invalid;
        self.free_replica(victim, &mut c, node);
        let valid: Vec<usize> = (0..c.states.len())
            .filter(|&i| c.states[i] != Msi::Invalid)
            .collect();
        if valid.len() == 1 {
            c.states[valid[0]] = Msi::Modified;
        }
        victim.set_mask(&c);
        self.stats.lock().evictions += 1;
        Ok(Evicted::One)
    }

    fn free_replica(&self, cell: &DataCell, c: &mut Coherence, node: usize) {
        if c.buffers[node].take().is_some() {
            if let Some(mem) = &self.nodes[node] {
                let mut used = mem.used.lock();
                *used = used.saturating_sub(cell.bytes as u64);
                let id = cell.id;
                mem.resident
                    .lock()
                    .retain(|w| w.upgrade().is_some_and(|d| d.id != id));
            }
        }
    }

    /// Brings the data home and frees its device replicas.
    pub(crate) fn bring_home(&self, cell: &Arc<DataCell>) -> Result<()> {
        if cell.host().bytes().is_some() {
            self.acquire(cell, HOST, Access::R)?;
        }
        let mut c = cell.coherence.lock();
        for node in 1..c.states.len() {
            c.states[node] = Msi::Invalid;
            self.free_replica(cell, &mut c, node);
        }
        c.states[HOST] = Msi::Modified;
        cell.set_mask(&c);
        Ok(())
    }
}

/// `T`'s name without module paths: `Vec<f64>`, not `alloc::vec::Vec<f64>`.
pub(crate) fn short_type_name<T: ?Sized>() -> String {
    let full = std::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    let mut word = String::new();
    for c in full.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(&word));
            word.clear();
            out.push(c);
        }
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_devices::cpu::HostDevice;

    #[test]
    fn type_names_in_messages_have_no_module_paths() {
        assert_eq!(short_type_name::<Vec<f64>>(), "Vec<f64>");
        assert_eq!(
            short_type_name::<std::collections::HashMap<String, Vec<u8>>>(),
            "HashMap<String, Vec<u8>>"
        );
        assert_eq!(short_type_name::<(u32, [f32; 4])>(), "(u32, [f32; 4])");
    }

    fn host_devices(n: usize) -> (Vec<Arc<HostDevice>>, DataManager) {
        let devs: Vec<Arc<HostDevice>> =
            (0..n).map(|_| Arc::new(HostDevice::new(1 << 30))).collect();
        let dyns: Vec<Arc<dyn Device>> =
            devs.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
        (devs, DataManager::new(&dyns, None))
    }

    fn read_back(dev: &HostDevice, buf: &DeviceBuffer) -> Vec<u8> {
        let mut out = vec![0u8; buf.len_bytes()];
        dev.download(buf, &mut out).expect("download");
        out
    }

    /// A replica written on one device is copied straight to another device that has a
    /// direct link: no host copy is made (the host stays invalid), one peer copy is
    /// counted, and bringing the data home afterwards downloads the right bytes.
    #[test]
    fn device_to_device_reads_use_the_direct_link() {
        let (devs, dm) = host_devices(2);
        assert!(dm.direct(1, 2) && dm.direct(2, 1));
        let data = dm.register(vec![0u8; 4096]);
        let cell = &data.cell;
        // A "kernel" on node 1 writes the data.
        let buf1 = dm
            .acquire(cell, 1, Access::W)
            .expect("acquire")
            .expect("buffer");
        let written: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        devs[0].upload(&buf1, &written).expect("kernel output");
        dm.release(cell, 1);
        assert_eq!(
            data.states(),
            vec![Msi::Invalid, Msi::Modified, Msi::Invalid]
        );
        // A reader on node 2.
        let buf2 = dm
            .acquire(cell, 2, Access::R)
            .expect("acquire")
            .expect("buffer");
        assert_eq!(read_back(&devs[1], &buf2), written);
        dm.release(cell, 2);
        assert_eq!(data.states(), vec![Msi::Invalid, Msi::Shared, Msi::Shared]);
        let s = dm.stats();
        assert_eq!((s.peer_copies, s.uploads, s.downloads), (1, 0, 0));
        assert_eq!(s.bytes, 4096);
        // Home: one download, and the host copy is the written one.
        dm.bring_home(cell).expect("home");
        assert_eq!(cell.host().bytes().expect("bytes"), &written[..]);
        assert_eq!(dm.stats().downloads, 1);
        assert_eq!(
            data.states(),
            vec![Msi::Modified, Msi::Invalid, Msi::Invalid]
        );
    }

    /// Data of at least PIN_MIN_BYTES is pinned at registration, exactly its heap block;
    /// smaller data is not; the pin is dropped before the data is handed back, and when a
    /// registered value is dropped without being handed back.
    #[test]
    fn large_registered_data_is_pinned_until_handed_back_or_dropped() {
        let (devs, dm) = host_devices(1);
        let big = vec![1.0f32; PIN_MIN_BYTES / 4];
        let (addr, len) = (big.as_ptr() as usize, PIN_MIN_BYTES);
        let big = dm.register(big);
        let small = dm.register(vec![1.0f32; 16]);
        assert!(big.host_pinned() && !small.host_pinned());
        assert_eq!(devs[0].pinned_ranges(), vec![(addr, len)]);
        assert_eq!(dm.stats().pinned_bytes, len as u64);
        dm.unpin_host(&big.cell);
        assert!(devs[0].pinned_ranges().is_empty());
        assert_eq!(dm.stats().pinned_bytes, 0);
        // Dropping registered data without unregistering it drops its pin too.
        let again = dm.register(vec![0u8; PIN_MIN_BYTES]);
        assert_eq!(devs[0].pinned_ranges().len(), 1);
        assert_eq!(dm.stats().pinned_bytes, PIN_MIN_BYTES as u64);
        drop(again);
        assert!(devs[0].pinned_ranges().is_empty());
        assert_eq!(dm.stats().pinned_bytes, 0);
        // Switched off: nothing is pinned.
        let (devs, mut dm) = host_devices(1);
        dm.pin_host = false;
        let d = dm.register(vec![0u8; PIN_MIN_BYTES]);
        assert!(!d.host_pinned() && devs[0].pinned_ranges().is_empty());
    }
}

/// Shuttle models of the replica states under concurrency (`cargo test -p
/// flotilla-runtime --features shuttle --lib shuttle`): the data manager's own locks and
/// atomics are shuttle's (`sync.rs`), its devices in-memory ones. Tasks run as the task
/// graph allows them (readers of one version together, a writer alone on its data) on two
/// devices whose memory holds two data each, so reads on one device evict replicas others
/// are fetching, copying from or writing back. Checked after every step, under the data's
/// lock: some replica is valid; a `Modified` one is the only valid one; every valid device
/// replica has its buffer; the lock-free valid mask agrees; no device holds more than its
/// capacity; a task's replica stays while the task runs; every read sees the last write.
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_models {
    use super::*;
    use flotilla_devices::cpu::HostDevice;

    const LEN: usize = 64;

    fn manager() -> Arc<DataManager> {
        let devs: Vec<Arc<dyn Device>> = (0..2)
            .map(|_| Arc::new(HostDevice::new(1 << 20)) as Arc<dyn Device>)
            .collect();
        // Room for two data per device.
        let mut dm = DataManager::new(&devs, Some(2 * LEN as u64));
        dm.pin_host = false;
        Arc::new(dm)
    }

    /// The invariants of `cell`'s replicas and of every device's accounting.
    fn check(dm: &DataManager, cell: &DataCell) {
        {
            let c = cell.coherence.lock();
            let valid: Vec<usize> = (0..c.states.len())
                .filter(|&i| c.states[i] != Msi::Invalid)
                .collect();
            assert!(!valid.is_empty(), "{}: no valid replica", cell.id);
            if c.states.contains(&Msi::Modified) {
                assert_eq!(valid.len(), 1, "{}: Modified beside {valid:?}", cell.id);
            }
            for &n in &valid {
                assert!(
                    n == HOST || c.buffers[n].is_some(),
                    "{}: node {n} valid without a buffer",
                    cell.id
                );
            }
            let mask = valid.iter().fold(0u64, |m, &n| m | 1 << n);
            assert_eq!(
                cell.valid_mask.load(Ordering::Acquire),
                mask,
                "{}: mask",
                cell.id
            );
        }
        for mem in dm.nodes.iter().flatten() {
            let used = *mem.used.lock();
            assert!(
                used <= mem.capacity,
                "{used} bytes used of {}",
                mem.capacity
            );
        }
    }

    /// A task using `cell` on `node` as `mode`: it reads (and expects `expect`) and/or
    /// writes `write` into every byte, as a kernel would.
    fn task(
        dm: &DataManager,
        cell: &Arc<DataCell>,
        node: usize,
        mode: Access,
        expect: u8,
        write: u8,
    ) {
        let buf = dm.acquire(cell, node, mode).expect("acquired");
        check(dm, cell);
        let device = dm.nodes[node].as_ref().map(|m| m.device.clone());
        if mode.reads() {
            let seen = match (&device, &buf) {
                (Some(d), Some(b)) => {
                    let mut out = vec![0u8; LEN];
                    d.download(b, &mut out).expect("read on the device");
                    out
                }
                _ => cell.host().bytes().expect("bytes").to_vec(),
            };
            assert!(
                seen.iter().all(|&b| b == expect),
                "{} on node {node}: {seen:?}, not {expect}",
                cell.id
            );
        }
        if mode.writes() {
            match (&device, &buf) {
                (Some(d), Some(b)) => d.upload(b, &[write; LEN]).expect("written on the device"),
                // SAFETY: this task holds the only access to the data (the task graph's
                // guarantee, kept by the model: a writer runs alone on its data).
                _ => unsafe { cell.host_mut() }
                    .bytes_mut()
                    .expect("bytes")
                    .fill(write),
            }
        }
        // The replica it used is still there, the same buffer, while it runs.
        if let Some(b) = &buf {
            let c = cell.coherence.lock();
            assert!(
                c.buffers[node]
                    .as_ref()
                    .is_some_and(|now| Arc::ptr_eq(now, b)),
                "{}: node {node}'s replica went away under its task",
                cell.id
            );
        }
        dm.release(cell, node);
        check(dm, cell);
    }

    fn scenario() {
        let dm = manager();
        let [x, y, z] = [1u8, 2, 3].map(|v| dm.register(vec![v; LEN]).cell);
        // X written on device 1, Y on device 2; Z stays on the host.
        task(&dm, &x, 1, Access::W, 0, 1);
        task(&dm, &y, 2, Access::W, 0, 2);
        // Readers together: X on device 2 (a copy from 1) and on the host (a download), Y
        // on device 1, Z on both devices (each full: evictions, write-backs).
        let spawn = |f: Box<dyn FnOnce(&DataManager) + Send>| {
            let dm = dm.clone();
            shuttle::thread::spawn(move || f(&dm))
        };
        let (x1, y1, z1, x2) = (x.clone(), y.clone(), z.clone(), x.clone());
        let readers = vec![
            spawn(Box::new(move |dm| task(dm, &x1, 2, Access::R, 1, 0))),
            spawn(Box::new(move |dm| task(dm, &y1, 1, Access::R, 2, 0))),
            spawn(Box::new(move |dm| {
                task(dm, &z1, 1, Access::R, 3, 0);
                task(dm, &z1, 2, Access::R, 3, 0);
            })),
            spawn(Box::new(move |dm| task(dm, &x2, HOST, Access::R, 1, 0))),
        ];
        for r in readers {
            r.join().expect("a reader ends");
        }
        // Writers, each alone on its data, while Z is read again.
        let (x1, y1, z1) = (x.clone(), y.clone(), z.clone());
        let writers = vec![
            spawn(Box::new(move |dm| task(dm, &x1, 2, Access::RW, 1, 11))),
            spawn(Box::new(move |dm| task(dm, &y1, 1, Access::RW, 2, 12))),
            spawn(Box::new(move |dm| task(dm, &z1, 2, Access::R, 3, 0))),
        ];
        for w in writers {
            w.join().expect("a writer ends");
        }
        for (cell, v) in [(&x, 11u8), (&y, 12), (&z, 3)] {
            dm.bring_home(cell).expect("home");
            check(&dm, cell);
            assert!(
                cell.host().bytes().expect("bytes").iter().all(|&b| b == v),
                "{}",
                cell.id
            );
        }
        for mem in dm.nodes.iter().flatten() {
            assert_eq!(*mem.used.lock(), 0, "every device buffer freed and counted");
        }
    }

    #[test]
    fn shuttle_replicas_stay_coherent_under_concurrent_reads_writes_and_evictions() {
        shuttle::check_random(scenario, 3_000);
        shuttle::check_pct(scenario, 3_000, 3);
    }
}
