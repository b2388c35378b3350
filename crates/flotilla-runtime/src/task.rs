//! Codelets, task submission with access-mode dependency inference, and task completion.
//!
//! # Dependency inference (sequential consistency)
//! Tasks are submitted in program order. For each data a task accesses:
//! - a read depends on the data's last writer (RAW) and joins the data's readers;
//! - a write depends on every reader since the last write (WAR) or, if there is none, on
//!   the last writer (WAW), and becomes the last writer.
//!
//! Every task thus sees exactly the data its sequential execution would see, which is why
//! results are bit-identical to running the submissions one after another.
//!
//! A task starts with one extra pending count held by the submitter, so it cannot become
//! ready while its edges are still being added.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use flotilla_devices::{Device, DeviceBuffer, DeviceKind};
use parking_lot::{Condvar, Mutex};

use crate::data::{Access, Data, DataCell, HOST};
use crate::error::{Result, RuntimeError};
use crate::registry::Registry;

/// The error a task implementation returns.
#[derive(Debug)]
pub struct TaskError(pub String);

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TaskError {}

impl From<flotilla_devices::DevicesError> for TaskError {
    fn from(e: flotilla_devices::DevicesError) -> Self {
        TaskError(e.to_string())
    }
}

impl From<String> for TaskError {
    fn from(s: String) -> Self {
        TaskError(s)
    }
}

impl From<&str> for TaskError {
    fn from(s: &str) -> Self {
        TaskError(s.to_string())
    }
}

/// One implementation of a codelet.
pub type ImplFn = Arc<dyn Fn(&TaskContext<'_>) -> std::result::Result<(), TaskError> + Send + Sync>;

/// Computes a task's size footprint from the sizes in bytes of the data it accesses.
pub type FootprintFn = Arc<dyn Fn(&[usize]) -> u64 + Send + Sync>;

/// A kind of computation with one implementation per device kind (StarPU's codelet).
pub struct Codelet {
    pub(crate) name: String,
    pub(crate) cpu: Option<ImplFn>,
    pub(crate) opencl: Option<ImplFn>,
    pub(crate) cuda: Option<ImplFn>,
    pub(crate) calibrate: bool,
    pub(crate) footprint: Option<FootprintFn>,
}

impl fmt::Debug for Codelet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codelet")
            .field("name", &self.name)
            .field("cpu", &self.cpu.is_some())
            .field("opencl", &self.opencl.is_some())
            .field("cuda", &self.cuda.is_some())
            .finish()
    }
}

impl Codelet {
    /// A codelet named `name` (the performance model's key) with no implementation yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            cpu: None,
            opencl: None,
            cuda: None,
            calibrate: true,
            footprint: None,
        }
    }
    /// The CPU implementation.
    pub fn cpu(
        mut self,
        f: impl Fn(&TaskContext<'_>) -> std::result::Result<(), TaskError> + Send + Sync + 'static,
    ) -> Self {
        self.cpu = Some(Arc::new(f));
        self
    }
    /// The OpenCL implementation.
    pub fn opencl(
        mut self,
        f: impl Fn(&TaskContext<'_>) -> std::result::Result<(), TaskError> + Send + Sync + 'static,
    ) -> Self {
        self.opencl = Some(Arc::new(f));
        self
    }
    /// The CUDA implementation.
    pub fn cuda(
        mut self,
        f: impl Fn(&TaskContext<'_>) -> std::result::Result<(), TaskError> + Send + Sync + 'static,
    ) -> Self {
        self.cuda = Some(Arc::new(f));
        self
    }
    /// The size footprint for the performance model, from the sizes in bytes of the data
    /// the task accesses (default: their sum).
    pub fn footprint(mut self, f: impl Fn(&[usize]) -> u64 + Send + Sync + 'static) -> Self {
        self.footprint = Some(Arc::new(f));
        self
    }
    /// Whether executions update the performance model (default: yes).
    pub fn calibrate(mut self, on: bool) -> Self {
        self.calibrate = on;
        self
    }
    /// The codelet's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The implementation for a device kind.
    pub(crate) fn implementation(&self, kind: DeviceKind) -> Option<&ImplFn> {
        match kind {
            DeviceKind::Cpu => self.cpu.as_ref(),
            DeviceKind::OpenCl => self.opencl.as_ref(),
            DeviceKind::Cuda => self.cuda.as_ref(),
        }
    }
    pub(crate) fn kinds(&self) -> String {
        let mut v = Vec::new();
        if self.cpu.is_some() {
            v.push("cpu");
        }
        if self.opencl.is_some() {
            v.push("opencl");
        }
        if self.cuda.is_some() {
            v.push("cuda");
        }
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.join(",")
        }
    }
}

struct SuccState {
    done: bool,
    failed: bool,
    list: Vec<Arc<TaskNode>>,
    waiters: usize,
}

/// A submitted task.
pub(crate) struct TaskNode {
    pub(crate) seq: u64,
    pub(crate) codelet: Arc<Codelet>,
    pub(crate) accesses: Vec<(Arc<DataCell>, Access)>,
    pub(crate) priority: i32,
    pub(crate) footprint: u64,
    pending: AtomicUsize,
    succ: Mutex<SuccState>,
    done_cv: Condvar,
    /// The unit the policy chose (u32::MAX when not yet placed).
    pub(crate) unit: AtomicU32,
    /// The predicted execution time in seconds as f64 bits (0 when none).
    pub(crate) predicted: AtomicU64,
}

impl TaskNode {
    pub(crate) fn is_done(&self) -> bool {
        self.succ.lock().done
    }
    fn wait(&self) -> bool {
        let mut s = self.succ.lock();
        s.waiters += 1;
        while !s.done {
            self.done_cv.wait(&mut s);
        }
        s.waiters -= 1;
        !s.failed
    }
}

/// A handle to a submitted task.
#[derive(Clone)]
pub struct TaskHandle {
    node: Arc<TaskNode>,
}

impl TaskHandle {
    pub(crate) fn from_node(node: Arc<TaskNode>) -> Self {
        Self { node }
    }
    /// The task's number in submission order.
    pub fn seq(&self) -> u64 {
        self.node.seq
    }
    /// Blocks until the task finished; false if it failed or was not run.
    pub fn wait(&self) -> bool {
        self.node.wait()
    }
    /// Whether it has finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.node.is_done()
    }
}

/// Where a task runs and what it can reach there.
pub struct TaskContext<'a> {
    node: &'a TaskNode,
    unit: u32,
    kind: DeviceKind,
    device: Option<&'a Arc<dyn Device>>,
    buffers: Vec<Option<Arc<DeviceBuffer>>>,
    borrows: Borrows,
}

/// Which data a task context has handed out, shared or mutably: a bit each per datum, the
/// first 64 data's in place (no allocation for most tasks), the others' in words added as
/// they are needed.
#[derive(Default)]
struct Borrows {
    /// (shared, mutable) of data 0..64.
    first: Cell<(u64, u64)>,
    /// (shared, mutable) of data 64.., 64 per word.
    more: std::cell::RefCell<Vec<(u64, u64)>>,
}

impl Borrows {
    fn get(&self, word: usize) -> (u64, u64) {
        match word {
            0 => self.first.get(),
            w => self.more.borrow().get(w - 1).copied().unwrap_or((0, 0)),
        }
    }

    fn set(&self, word: usize, v: (u64, u64)) {
        match word {
            0 => self.first.set(v),
            w => {
                let mut more = self.more.borrow_mut();
                if more.len() < w {
                    more.resize(w, (0, 0));
                }
                more[w - 1] = v;
            }
        }
    }
}

impl<'a> TaskContext<'a> {
    /// The unit the task runs on.
    pub fn unit(&self) -> flotilla_core::UnitId {
        flotilla_core::UnitId::new(self.unit)
    }
    /// The kind of device it runs on.
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }
    /// How many data the task accesses.
    pub fn len(&self) -> usize {
        self.node.accesses.len()
    }
    /// Whether the task accesses no data.
    pub fn is_empty(&self) -> bool {
        self.node.accesses.is_empty()
    }
    fn cell(&self, i: usize) -> &DataCell {
        match self.node.accesses.get(i) {
            Some((c, _)) => c,
            None => panic!(
                "codelet {}: data index {i} out of range (the task accesses {})",
                self.node.codelet.name,
                self.node.accesses.len()
            ),
        }
    }
    fn mark(&self, i: usize, write: bool) {
        self.cell(i); // out of range: its own panic, before any bit is kept
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        let (shared, mutable) = self.borrows.get(word);
        if mutable & bit != 0 || (write && shared & bit != 0) {
            panic!(
                "codelet {}: data {i} borrowed mutably more than once, or both shared and mutably",
                self.node.codelet.name
            );
        }
        self.borrows.set(
            word,
            if write {
                (shared, mutable | bit)
            } else {
                (shared | bit, mutable)
            },
        );
    }
    /// The host contents of data `i` (a CPU task), as a slice of `T`.
    pub fn data<T: bytemuck::Pod + Send + Sync>(&self, i: usize) -> &[T] {
        self.mark(i, false);
        let cell = self.cell(i);
        match cell.host().as_any().downcast_ref::<Vec<T>>() {
            Some(v) => v,
            None => panic!(
                "codelet {}: data {i} holds {}, not {}",
                self.node.codelet.name,
                cell.type_name,
                crate::data::short_type_name::<Vec<T>>()
            ),
        }
    }
    /// The host contents of data `i` for writing (its access mode must be `W` or `RW`).
    #[allow(clippy::mut_from_ref)]
    pub fn data_mut<T: bytemuck::Pod + Send + Sync>(&self, i: usize) -> &mut [T] {
        self.check_writes(i);
        self.mark(i, true);
        let cell = self.cell(i);
        // SAFETY: this task holds the only write access to the data (task graph), and the
        // borrow marks above stop this context from handing out a second reference.
        let host = unsafe { cell.host_mut() };
        match host.as_any_mut().downcast_mut::<Vec<T>>() {
            Some(v) => v,
            None => panic!(
                "codelet {}: data {i} holds {}, not {}",
                self.node.codelet.name,
                cell.type_name,
                crate::data::short_type_name::<Vec<T>>()
            ),
        }
    }
    /// A registered object (host only).
    pub fn object<T: Any + Send + Sync>(&self, i: usize) -> &T {
        self.mark(i, false);
        let cell = self.cell(i);
        match cell.host().as_any().downcast_ref::<T>() {
            Some(v) => v,
            None => panic!(
                "codelet {}: data {i} holds {}, not {}",
                self.node.codelet.name,
                cell.type_name,
                crate::data::short_type_name::<T>()
            ),
        }
    }
    /// A registered object for writing (its access mode must be `W` or `RW`). Not for
    /// plain data registered with `Runtime::register` (use [`TaskContext::data_mut`]): its
    /// vector must keep its size and place while registered (device replicas and pinned
    /// host memory depend on both).
    #[allow(clippy::mut_from_ref)]
    pub fn object_mut<T: Any + Send + Sync>(&self, i: usize) -> &mut T {
        self.check_writes(i);
        let cell = self.cell(i);
        if cell.host().bytes().is_some() {
            panic!(
                "codelet {}: data {i} is plain data ({}); write it with data_mut, not object_mut",
                self.node.codelet.name, cell.type_name
            );
        }
        self.mark(i, true);
        // SAFETY: as in `data_mut`.
        let host = unsafe { cell.host_mut() };
        match host.as_any_mut().downcast_mut::<T>() {
            Some(v) => v,
            None => panic!(
                "codelet {}: data {i} holds {}, not {}",
                self.node.codelet.name,
                cell.type_name,
                crate::data::short_type_name::<T>()
            ),
        }
    }
    fn check_writes(&self, i: usize) {
        let _ = self.cell(i);
        if !self.node.accesses[i].1.writes() {
            panic!(
                "codelet {}: data {i} was submitted with access R but written",
                self.node.codelet.name
            );
        }
    }
    /// The device the task runs on (device tasks only).
    pub fn device(&self) -> &Arc<dyn Device> {
        match self.device {
            Some(d) => d,
            None => panic!(
                "codelet {}: device() called in a CPU task",
                self.node.codelet.name
            ),
        }
    }
    /// The device buffer holding data `i` (device tasks only).
    pub fn buffer(&self, i: usize) -> &DeviceBuffer {
        let _ = self.cell(i);
        match &self.buffers[i] {
            Some(b) => b,
            None => panic!(
                "codelet {}: buffer({i}) called in a CPU task",
                self.node.codelet.name
            ),
        }
    }
}

/// Builds one task submission: `rt.task(&codelet).read(&a).rw(&b).submit()`.
pub struct TaskBuilder<'rt> {
    pub(crate) registry: &'rt Arc<Registry>,
    pub(crate) seq: &'rt AtomicU64,
    pub(crate) codelet: Arc<Codelet>,
    pub(crate) accesses: Vec<(Arc<DataCell>, Access)>,
    pub(crate) priority: i32,
}

impl TaskBuilder<'_> {
    /// Adds an access to `data` in `mode`.
    pub fn access<T>(mut self, data: &Data<T>, mode: Access) -> Self {
        self.accesses.push((data.cell.clone(), mode));
        self
    }
    /// Reads `data`.
    pub fn read<T>(self, data: &Data<T>) -> Self {
        self.access(data, Access::R)
    }
    /// Overwrites `data`.
    pub fn write<T>(self, data: &Data<T>) -> Self {
        self.access(data, Access::W)
    }
    /// Reads and writes `data`.
    pub fn rw<T>(self, data: &Data<T>) -> Self {
        self.access(data, Access::RW)
    }
    /// The task's priority: higher runs first where the policy orders by priority.
    pub fn priority(mut self, p: i32) -> Self {
        self.priority = p;
        self
    }
    /// Submits the task; it runs when the tasks it depends on have finished.
    pub fn submit(self) -> Result<TaskHandle> {
        let reg = self.registry;
        let c = &self.codelet;
        if !crate::place::can_run_anywhere(reg, c) {
            return Err(RuntimeError::NoImplementation {
                codelet: c.name.clone(),
                has: c.kinds(),
            });
        }
        for (i, (a, ma)) in self.accesses.iter().enumerate() {
            for (b, mb) in &self.accesses[i + 1..] {
                if Arc::ptr_eq(a, b) && (ma.writes() || mb.writes()) {
                    return Err(RuntimeError::BadSubmission {
                        codelet: c.name.clone(),
                        reason: format!("data {} is accessed twice and written", a.id),
                    });
                }
            }
        }
        let footprint = match &c.footprint {
            Some(f) => {
                let sizes: Vec<usize> = self.accesses.iter().map(|(d, _)| d.bytes).collect();
                f(&sizes)
            }
            None => self.accesses.iter().map(|(d, _)| d.bytes as u64).sum(),
        };
        let node = Arc::new(TaskNode {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            codelet: self.codelet,
            accesses: self.accesses,
            priority: self.priority,
            footprint,
            pending: AtomicUsize::new(1),
            succ: Mutex::new(SuccState {
                done: false,
                failed: false,
                list: Vec::new(),
                waiters: 0,
            }),
            done_cv: Condvar::new(),
            unit: AtomicU32::new(u32::MAX),
            predicted: AtomicU64::new(0),
        });
        reg.outstanding.fetch_add(1, Ordering::AcqRel);
        for (cell, mode) in &node.accesses {
            let mut d = cell.deps.lock();
            let writer = d.last_writer.as_ref().and_then(Weak::upgrade);
            if mode.writes() {
                let mut any_reader = false;
                for r in d.readers.drain(..) {
                    if let Some(r) = r.upgrade() {
                        add_edge(&r, &node);
                        any_reader = true;
                    }
                }
                if !any_reader {
                    if let Some(w) = &writer {
                        add_edge(w, &node);
                    }
                }
                d.last_writer = Some(Arc::downgrade(&node));
            } else {
                if let Some(w) = &writer {
                    add_edge(w, &node);
                }
                if d.readers.len() >= 64 {
                    d.readers
                        .retain(|r| r.upgrade().is_some_and(|r| !r.is_done()));
                }
                d.readers.push(Arc::downgrade(&node));
            }
        }
        let handle = TaskHandle { node: node.clone() };
        if node.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            make_ready(reg, node);
        }
        Ok(handle)
    }
}

fn add_edge(pred: &Arc<TaskNode>, node: &Arc<TaskNode>) {
    if Arc::ptr_eq(pred, node) {
        return;
    }
    let mut s = pred.succ.lock();
    if s.done {
        return;
    }
    node.pending.fetch_add(1, Ordering::AcqRel);
    s.list.push(node.clone());
}

/// A task whose predecessors are all done: place it, or fail it if a datum it reads was
/// last written by a task that failed.
///
/// Failure follows the data, not the edges: when a task is ready, every task that wrote
/// what it reads before it has finished and none after it can have started (a later writer
/// waits for this reader), so each datum's `poisoned` flag is its last writer's outcome. A
/// task that only overwrites a datum, or only had to wait for a failed reader, runs; one
/// that writes a datum whole (`W`) and succeeds makes it valid again.
pub(crate) fn make_ready(reg: &Arc<Registry>, node: Arc<TaskNode>) {
    let mut work = vec![node];
    while let Some(n) = work.pop() {
        let stale = n
            .accesses
            .iter()
            .any(|(cell, mode)| mode.reads() && cell.poisoned.load(Ordering::Acquire));
        if stale {
            reg.record_failure(RuntimeError::DependencyFailed {
                task: n.seq,
                codelet: n.codelet.name.clone(),
            });
            finish(reg, &n, false, &mut work);
        } else {
            crate::place::place(reg, n);
        }
    }
}

/// Marks `node` done and collects the successors it made ready into `ready`.
fn finish(reg: &Registry, node: &Arc<TaskNode>, ok: bool, ready: &mut Vec<Arc<TaskNode>>) {
    for (cell, mode) in &node.accesses {
        if mode.writes() {
            cell.poisoned.store(!ok, Ordering::Release);
        }
    }
    let list = {
        let mut s = node.succ.lock();
        s.done = true;
        s.failed = !ok;
        if s.waiters > 0 {
            node.done_cv.notify_all();
        }
        std::mem::take(&mut s.list)
    };
    for s in list {
        if s.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            ready.push(s);
        }
    }
    reg.task_finished();
}

/// Completes a task that ran (or failed) and readies its successors.
pub(crate) fn complete(reg: &Arc<Registry>, node: &Arc<TaskNode>, ok: bool) {
    let mut ready = Vec::new();
    finish(reg, node, ok, &mut ready);
    if ready.is_empty() {
        return;
    }
    crate::registry::WorkerThread::with_current(|w| {
        let me = w.filter(|w| Arc::ptr_eq(&w.registry, reg));
        if let Some(w) = me {
            w.completing.set(true);
        }
        for r in ready {
            make_ready(reg, r);
        }
        if let Some(w) = me {
            w.completing.set(false);
        }
    });
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked".to_string()
    }
}

/// Calls an implementation, turning errors and panics into a message.
fn call(f: &ImplFn, ctx: &TaskContext<'_>) -> std::result::Result<(), String> {
    match panic::catch_unwind(AssertUnwindSafe(|| f(ctx))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.0),
        Err(p) => Err(format!("panicked: {}", panic_message(&*p))),
    }
}

/// Runs a task on CPU worker `index` (memory node 0).
pub(crate) fn run_on_cpu(reg: &Arc<Registry>, index: usize, node: Arc<TaskNode>) {
    let unit_name = format!("cpu{index}");
    let Some(f) = node.codelet.cpu.clone() else {
        fail(
            reg,
            &node,
            &unit_name,
            "placed on a CPU but has no CPU implementation".into(),
        );
        return;
    };
    for (cell, mode) in &node.accesses {
        if let Err(e) = reg.data.acquire(cell, HOST, *mode) {
            fail(reg, &node, &unit_name, e.to_string());
            return;
        }
    }
    let ctx = TaskContext {
        node: &node,
        unit: index as u32,
        kind: DeviceKind::Cpu,
        device: None,
        buffers: Vec::new(),
        borrows: Borrows::default(),
    };
    let start = Instant::now();
    let r = call(&f, &ctx);
    let end = Instant::now();
    drop(ctx);
    after_run(reg, &node, index, start, end, r, &unit_name);
}

/// Runs a task on device unit `unit` whose data were acquired (and pinned) on `mem_node`.
pub(crate) fn run_on_device(
    reg: &Arc<Registry>,
    unit: usize,
    mem_node: usize,
    device: &Arc<dyn Device>,
    node: Arc<TaskNode>,
    buffers: Vec<Option<Arc<DeviceBuffer>>>,
) {
    let kind = device.info().kind;
    let unit_name = device.info().name.clone();
    let r: std::result::Result<(), String> = match node.codelet.implementation(kind).cloned() {
        None => Err(format!("placed on {kind} but has no {kind} implementation")),
        Some(f) => {
            let ctx = TaskContext {
                node: &node,
                unit: unit as u32,
                kind,
                device: Some(device),
                buffers,
                borrows: Borrows::default(),
            };
            let start = Instant::now();
            let r = call(&f, &ctx);
            let end = Instant::now();
            drop(ctx);
            for (cell, _) in &node.accesses {
                reg.data.release(cell, mem_node);
            }
            after_run(reg, &node, unit, start, end, r, &unit_name);
            return;
        }
    };
    for (cell, _) in &node.accesses {
        reg.data.release(cell, mem_node);
    }
    if let Err(m) = r {
        fail(reg, &node, &unit_name, m);
    }
}

fn after_run(
    reg: &Arc<Registry>,
    node: &Arc<TaskNode>,
    unit: usize,
    start: Instant,
    end: Instant,
    r: std::result::Result<(), String>,
    unit_name: &str,
) {
    if let Some(t) = &reg.tracer {
        t.span(
            crate::trace::Track::Unit(unit),
            &node.codelet.name,
            start,
            end,
        );
    }
    if let Some(c) = reg.executed.get(unit) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    crate::place::account(reg, node, unit, (end - start).as_secs_f64(), r.is_ok());
    match r {
        Ok(()) => complete(reg, node, true),
        Err(m) => fail(reg, node, unit_name, m),
    }
}

/// Fails a task with a message and propagates the failure to its successors.
pub(crate) fn fail(reg: &Arc<Registry>, node: &Arc<TaskNode>, unit: &str, message: String) {
    reg.record_failure(RuntimeError::TaskFailed {
        task: node.seq,
        codelet: node.codelet.name.clone(),
        unit: unit.to_string(),
        message,
    });
    complete(reg, node, false);
}
