//! The CUDA backend (cudarc: driver, cuBLAS, cuSOLVER; all loaded at run time).
//!
//! Why one file past 1,200 lines: it is one type, [`CudaDevice`], and most of it is that
//! type's [`Device`] implementation, whose methods share its private context binding, stream
//! and handle types. Splitting the implementation across files would make those internals
//! visible to siblings without making any part testable alone (none of it runs without a
//! GPU; `devtest.rs` checks it whole on the device machine).
//!
//! cudarc panics when a library it needs cannot be loaded, so discovery first probes for the
//! driver (`libcuda`), cuBLAS and cuSOLVER, and reports `"no CUDA driver"` (or which library
//! is missing) instead of calling into cudarc.
//!
//! Each [`CudaDevice`] holds the GPU's primary context and three streams: `transfer` for
//! uploads (host → device), `d2h` for downloads and peer copies, and `compute`, to which its
//! cuBLAS and cuSOLVER handles are bound; so an upload by the runtime's prefetch thread, a
//! kernel on its compute thread and a download (a write-back, a result going home) proceed
//! at the same time on the GPU's separate copy engines. Every call synchronises its stream
//! before returning, so calls are blocking and cudarc's cross-stream event tracking is
//! switched off (it would only add events to wait on). Kernel calls are serialised by a lock
//! around the handles.
//!
//! Host memory registered with the runtime can be page-locked ([`Device::pin_host_memory`],
//! `cuMemHostRegister` with the portable flag, so every GPU's context sees it pinned): the
//! copies then run by DMA at the link's speed instead of through the driver's staging
//! buffers. Two GPUs with a peer-to-peer path (NVLink or PCIe P2P, as the driver reports)
//! copy between each other directly ([`Device::copy_to_peer`], `cuMemcpyPeerAsync` after
//! enabling peer access both ways). Each GPU's PCI address, NUMA node and host link are
//! read from sysfs ([`crate::topology`]).
//!
//! Kernels of one's own: [`CudaDevice::compile_kernel`] compiles CUDA C with NVRTC to a CUBIN
//! for the GPU's architecture, keeps it in the [kernel cache](crate::kernel_cache) (keyed by
//! source, options, GPU and driver), and [`CudaDevice::launch`] runs it on the compute
//! stream with device buffers and scalars as arguments. A codelet reaches them from its
//! `&dyn Device` through [`Device::as_any`].
//!
//! Device memory comes from a [`MemPool`] over `cuMemAlloc` (see [`crate::pool`]): dropping a
//! buffer returns its block to the pool, and the next request of the same size class reuses
//! it without a driver call. The device's accounting ([`Device::mem_used`], the limit behind
//! [`DevicesError::OutOfMemory`]) counts the bytes of live buffers only, so cached blocks
//! count as free; the pool's soft cap is the same limit, so a fresh allocation that would
//! take the pool's memory (in use + cached) past it trims the cache first, and a driver
//! out-of-memory trims it and retries once.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{sys as blas, CudaBlas};
use cudarc::cusolver::{sys as solver, DnHandle};
use cudarc::driver::{
    sys as drv, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DriverError,
};
use parking_lot::Mutex;

use crate::kernel_cache::{CacheKey, CacheOutcome, KernelCache, KernelCacheDir};
use crate::pool::{MemPool, PoolBlock, PoolStats, RawAlloc};
use crate::{
    args, no_alias, Device, DeviceBuffer, DeviceInfo, DeviceKind, DevicesError, Diag,
    DiscoverOptions, Discovery, ElemType, HostPin, MathMode, MemAccount, Reservation, Result, Side,
    Trans, Uplo,
};

/// Makes `ctx` current on this thread. cudarc reports, from `bind_to_thread`, an error an
/// earlier asynchronous operation left behind (a failed free in a `Drop`); that error is
/// consumed by the report, so a second attempt binds unless binding itself fails.
fn bind_ctx(ctx: &CudaContext) -> std::result::Result<(), DriverError> {
    ctx.bind_to_thread().or_else(|_| ctx.bind_to_thread())
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by name; no cudarc state is touched.
    unsafe { drv::is_culib_present() }
}

/// Adds every CUDA GPU to `found`, or the reason there are none.
pub(crate) fn discover_into(
    opts: &DiscoverOptions,
    kernel_cache: &KernelCacheDir,
    found: &mut Discovery,
) {
    if !driver_present() {
        found.skipped.push("no CUDA driver".to_string());
        return;
    }
    // SAFETY: as above, these only try to open the libraries.
    if !unsafe { blas::is_culib_present() } {
        found
            .skipped
            .push("cuda: no cuBLAS library (libcublas)".to_string());
        return;
    }
    // SAFETY: as above.
    if !unsafe { solver::is_culib_present() } {
        found
            .skipped
            .push("cuda: no cuSOLVER library (libcusolver)".to_string());
        return;
    }
    let count = match CudaContext::device_count() {
        Ok(n) => usize::try_from(n).unwrap_or(0),
        Err(e) => {
            found
                .skipped
                .push(format!("cuda: driver initialisation failed: {e}"));
            return;
        }
    };
    if count == 0 {
        found.skipped.push("cuda: no CUDA GPU".to_string());
    }
    for ordinal in 0..count {
        match CudaDevice::with_kernel_cache(ordinal, opts.mem_limit, kernel_cache) {
            Ok(dev) => found.devices.push(Arc::new(dev)),
            Err(e) => found
                .skipped
                .push(format!("cuda: GPU {ordinal} skipped: {e}")),
        }
    }
}

/// Raw device memory for the pool: zeroed `cuMemAlloc` on the transfer stream.
struct CudaRaw {
    name: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl RawAlloc for CudaRaw {
    type Block = CudaSlice<u8>;

    fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        let err = |e: DriverError| match e.0 {
            drv::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => DevicesError::OutOfMemory {
                device: self.name.clone(),
                requested: bytes as u64,
                available: 0,
            },
            _ => DevicesError::Backend {
                backend: "cuda",
                device: self.name.clone(),
                op: "alloc",
                message: e.to_string(),
            },
        };
        bind_ctx(&self.ctx).map_err(&err)?;
        let slice = self.stream.alloc_zeros::<u8>(bytes).map_err(&err)?;
        self.stream.synchronize().map_err(&err)?;
        Ok(slice)
    }

    fn free(&self, block: CudaSlice<u8>) {
        // Dropping a `CudaSlice` frees its memory (cuMemFree/cuMemFreeAsync on the slice's
        // stream) without making its context current, and a trim can run on a thread where
        // another GPU's context is: bind ours first. No call can still be using the block:
        // every call synchronises before returning, and a block is only cached after its
        // buffer was dropped.
        let _ = bind_ctx(&self.ctx);
        drop(block);
    }
}

/// The backend part of a [`DeviceBuffer`]: a pooled block (at least the buffer's length)
/// and the buffer's share of the memory limit.
struct CudaBuffer {
    block: PoolBlock<CudaRaw>,
    _reservation: Reservation,
}

/// The handles used by kernel calls, behind the compute lock.
struct Handles {
    blas: CudaBlas,
    solver: DnHandle,
}

/// One CUDA GPU.
pub struct CudaDevice {
    info: DeviceInfo,
    uid: u64,
    ctx: Arc<CudaContext>,
    transfer: Arc<CudaStream>,
    d2h: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    handles: Mutex<Handles>,
    mem: Arc<MemAccount>,
    pool: Arc<MemPool<CudaRaw>>,
    /// Whether a direct path to each peer GPU (by ordinal) exists and is enabled.
    peers: Mutex<HashMap<usize, bool>>,
    /// Where NVRTC's PTX is kept; `None` when no folder is configured.
    kernel_cache: Option<KernelCache>,
}

/// A CUDA C kernel compiled for one GPU ([`CudaDevice::compile_kernel`]).
pub struct CudaKernel {
    name: String,
    device_uid: u64,
    function: CudaFunction,
    /// The module the function lives in; kept loaded as long as the kernel.
    _module: Arc<CudaModule>,
    /// Where the PTX came from (`None` without a kernel cache).
    pub origin: Option<CacheOutcome>,
}

impl std::fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaKernel")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// One argument of [`CudaDevice::launch`], in the kernel's parameter order.
#[derive(Debug, Clone, Copy)]
pub enum KernelArg<'a> {
    /// A buffer of this device, passed as its device address (a pointer parameter).
    Buffer(&'a DeviceBuffer),
    /// `int`.
    I32(i32),
    /// `long long` / `size_t`-sized integer.
    I64(i64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

/// Host memory registered with `cuMemHostRegister`; unregistered on drop.
struct CudaPin {
    ctx: Arc<CudaContext>,
    /// The registered address (a pointer kept as an integer: the pin owns no memory).
    addr: usize,
}

impl Drop for CudaPin {
    fn drop(&mut self) {
        // A failure here leaves the pages locked until the process ends; nothing else
        // depends on it, so it is ignored.
        if bind_ctx(&self.ctx).is_ok() {
            // SAFETY: `addr` was registered by `pin_host_memory` and not unregistered since.
            let _ = unsafe { drv::cuMemHostUnregister(self.addr as *mut std::ffi::c_void) };
        }
    }
}

/// Compiles CUDA C with NVRTC and returns the CUBIN (machine code for the architecture
/// in `options`), or NVRTC's error and log.
fn compile_cubin(source: &str, options: &[String]) -> std::result::Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
    let src = std::ffi::CString::new(source).map_err(|e| e.to_string())?;
    let prog = rtc::create_program(&src, None).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` is a live program until destroyed below; the buffers passed have the
    // sizes NVRTC asked for.
    let out = unsafe {
        match rtc::compile_program(prog, options) {
            Err(e) => {
                let log = rtc::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("{e:?}: {log}"))
            }
            Ok(()) => {
                let mut size = 0usize;
                rtc_sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| format!("{e:?}"))
                    .and_then(|()| {
                        let mut cubin = vec![0u8; size];
                        rtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                            .result()
                            .map(|()| cubin)
                            .map_err(|e| format!("{e:?}"))
                    })
            }
        }
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { rtc::destroy_program(prog) };
    out
}

/// The PCI address of GPU `dev` as the driver writes it (`0000:1B:00.0`).
fn pci_bus_id(dev: drv::CUdevice) -> Option<String> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer holds 32 chars and its length is passed; the driver NUL-terminates.
    let r = unsafe { drv::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
    if r != drv::cudaError_enum::CUDA_SUCCESS {
        return None;
    }
    // SAFETY: NUL-terminated by the driver within the buffer (zeroed beforehand).
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    id.to_str().ok().map(str::to_string)
}

/// A size as cuBLAS's `int`, or `BadArgs`.
fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        DevicesError::bad_args(op, format!("{what} = {v} exceeds the cuBLAS int range"))
    })
}

fn op_of(t: Trans) -> blas::cublasOperation_t {
    match t {
        Trans::No => blas::cublasOperation_t::CUBLAS_OP_N,
        Trans::Yes => blas::cublasOperation_t::CUBLAS_OP_T,
    }
}

fn fill_of(u: Uplo) -> blas::cublasFillMode_t {
    match u {
        Uplo::Lower => blas::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
        Uplo::Upper => blas::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
    }
}

fn solver_fill_of(u: Uplo) -> solver::cublasFillMode_t {
    match u {
        Uplo::Lower => solver::cublasFillMode_t::CUBLAS_FILL_MODE_LOWER,
        Uplo::Upper => solver::cublasFillMode_t::CUBLAS_FILL_MODE_UPPER,
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`, its compiled kernels cached in `$FLOTILLA_HOME/kernels`. Call
    /// only when [`driver_present`] is true.
    pub fn new(ordinal: usize, mem_limit: Option<u64>) -> Result<Self> {
        Self::with_kernel_cache(ordinal, mem_limit, &KernelCacheDir::Default)
    }

    /// [`CudaDevice::new`] with the compiled kernels cached in `kernel_cache`.
    pub fn with_kernel_cache(
        ordinal: usize,
        mem_limit: Option<u64>,
        kernel_cache: &KernelCacheDir,
    ) -> Result<Self> {
        let err = |op: &'static str, e: &dyn std::fmt::Display| DevicesError::Backend {
            backend: "cuda",
            device: format!("GPU {ordinal}"),
            op,
            message: e.to_string(),
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| err("create context", &e))?;
        // SAFETY: every call of this backend synchronises its stream before returning, and a
        // buffer is only freed when no call borrows it, so no cross-stream use is ever
        // pending: the tracking events are not needed.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(|e| err("device query", &e))?;
        let total = ctx.total_mem().map_err(|e| err("device query", &e))? as u64;
        let sms = ctx
            .attribute(drv::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| err("device query", &e))?;
        let transfer = ctx.new_stream().map_err(|e| err("create stream", &e))?;
        let d2h = ctx.new_stream().map_err(|e| err("create stream", &e))?;
        let compute = ctx.new_stream().map_err(|e| err("create stream", &e))?;
        let blas = CudaBlas::new(Arc::clone(&compute)).map_err(|e| err("create cublas", &e))?;
        let solver = DnHandle::new(Arc::clone(&compute)).map_err(|e| err("create cusolver", &e))?;
        let limit = mem_limit.map_or(total, |l| l.min(total));
        let info = DeviceInfo {
            kind: DeviceKind::Cuda,
            name: name.clone(),
            vendor: "NVIDIA".to_string(),
            global_mem: limit,
            compute_units: u32::try_from(sms).unwrap_or(0),
            arch: format!("cuda:{name}"),
            topology: pci_bus_id(ctx.cu_device()).map(|id| {
                // Without sysfs (some containers) the address alone is still known.
                crate::topology::Topology::read(std::path::Path::new("/sys"), &id).unwrap_or(
                    crate::topology::Topology {
                        pci_bus_id: id.to_ascii_lowercase(),
                        ..Default::default()
                    },
                )
            }),
        };
        let raw = CudaRaw {
            name: name.clone(),
            ctx: Arc::clone(&ctx),
            stream: Arc::clone(&transfer),
        };
        Ok(CudaDevice {
            pool: MemPool::with_soft_cap(name.clone(), raw, limit),
            mem: MemAccount::new(name, limit),
            info,
            uid: crate::next_device_uid(),
            ctx,
            transfer,
            d2h,
            compute,
            handles: Mutex::new(Handles { blas, solver }),
            peers: Mutex::new(HashMap::new()),
            kernel_cache: kernel_cache.open(),
        })
    }

    /// The counters of the memory pool behind [`Device::alloc`].
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Frees the device memory the pool keeps for reuse; returns the bytes freed.
    pub fn trim_pool(&self) -> u64 {
        self.pool.trim()
    }

    /// Compiles the CUDA C `source` with NVRTC for this GPU (`--gpu-architecture=sm_XY` is
    /// added to `options` unless they name an architecture) and returns its
    /// `extern "C" __global__` function `name`. The CUBIN is kept in the kernel cache, so
    /// the next process (or device) with the same source, options, GPU and driver loads it
    /// without compiling.
    ///
    /// # Errors
    /// `Unsupported` without the NVRTC library; `BadArgs` for a source or name with a NUL
    /// byte; `Backend` with NVRTC's log when the source does not compile, or when the
    /// function is missing.
    pub fn compile_kernel(&self, source: &str, name: &str, options: &[&str]) -> Result<CudaKernel> {
        const OP: &str = "compile kernel";
        // SAFETY: only tries to open the library by name.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(DevicesError::Unsupported {
                device: self.info.name.clone(),
                what: "compiling kernels (no NVRTC library, libnvrtc)".into(),
            });
        }
        if source.contains('\0') || name.contains('\0') || options.iter().any(|o| o.contains('\0'))
        {
            return Err(DevicesError::bad_args(
                OP,
                "a NUL byte in the source, name or options",
            ));
        }
        let (major, minor) = self
            .ctx
            .compute_capability()
            .map_err(|e| self.driver_err(OP, e))?;
        let mut driver = 0;
        // SAFETY: writes one int.
        let _ = unsafe { drv::cuDriverGetVersion(&mut driver) };
        let mut all: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        let names_arch = |o: &String| o.starts_with("--gpu-architecture") || o.starts_with("-arch");
        if !all.iter().any(names_arch) {
            all.push(format!("--gpu-architecture=sm_{major}{minor}"));
        }
        let joined = all.join("\u{1f}");
        let driver = driver.to_le_bytes();
        let key_parts = [
            b"cuda-cubin".as_slice(),
            self.info.name.as_bytes(),
            &driver,
            joined.as_bytes(),
            source.as_bytes(),
        ];
        // Compiled to a CUBIN for the GPU's own architecture (no PTX JIT at load time, so a
        // toolkit newer than the driver still works).
        let compile = || -> Result<Vec<u8>> {
            compile_cubin(source, &all).map_err(|e| self.backend_err(OP, e))
        };
        let load = |ptx: cudarc::nvrtc::Ptx| -> Result<(Arc<CudaModule>, CudaFunction)> {
            let module = self
                .ctx
                .load_module(ptx)
                .map_err(|e| self.driver_err("load module", e))?;
            let function = module
                .load_function(name)
                .map_err(|e| self.backend_err(OP, format!("no function {name:?}: {e}")))?;
            Ok((module, function))
        };
        let image = |cubin: Vec<u8>| cudarc::nvrtc::Ptx::from_binary(cubin);
        let (module, function, origin) = match &self.kernel_cache {
            None => {
                let (m, f) = load(image(compile()?))?;
                (m, f, None)
            }
            Some(cache) => {
                let key = CacheKey::new(&key_parts);
                let cached = cache.load(&key).and_then(|cubin| load(image(cubin)).ok());
                match cached {
                    Some((m, f)) => (m, f, Some(CacheOutcome::Hit)),
                    None => {
                        let cubin = compile()?;
                        let (m, f) = load(image(cubin.clone()))?;
                        let outcome = match cache.store(&key, &cubin) {
                            Ok(()) => CacheOutcome::Stored,
                            Err(_) => CacheOutcome::NotStored,
                        };
                        (m, f, Some(outcome))
                    }
                }
            }
        };
        Ok(CudaKernel {
            name: name.to_string(),
            device_uid: self.uid,
            function,
            _module: module,
            origin,
        })
    }

    /// Runs `kernel` on the compute stream with `grid` × `block` threads, `shared_bytes` of
    /// dynamic shared memory and `args` in the kernel's parameter order, and waits for it.
    /// Serialised with this device's other kernels.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number and types, and the kernel must
    /// stay within the buffers it is given: the driver checks neither.
    pub unsafe fn launch(
        &self,
        kernel: &CudaKernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        const OP: &str = "launch";
        if kernel.device_uid != self.uid {
            return Err(DevicesError::bad_args(
                OP,
                format!("kernel {} was compiled for another device", kernel.name),
            ));
        }
        // One 8-byte slot per argument, each holding the value the kernel reads.
        let mut slots: Vec<u64> = Vec::with_capacity(args.len());
        for a in args {
            slots.push(match *a {
                KernelArg::Buffer(b) => self.ptr(self.buf(OP, b)?, &self.compute),
                KernelArg::I32(v) => u64::from(v as u32),
                KernelArg::I64(v) => v as u64,
                KernelArg::F32(v) => u64::from(v.to_bits()),
                KernelArg::F64(v) => v.to_bits(),
            });
        }
        // Little-endian: a 4-byte parameter reads the low half of its slot.
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| (s as *mut u64).cast::<std::ffi::c_void>())
            .collect();
        let _h = self.handles.lock();
        self.bind(OP)?;
        if shared_bytes > 48 << 10 {
            // Above 48 KiB of dynamic shared memory a kernel must opt in.
            // SAFETY: an attribute of a loaded function.
            let r = unsafe {
                drv::cuFuncSetAttribute(
                    kernel.function.cu_function(),
                    drv::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    i32::try_from(shared_bytes).unwrap_or(i32::MAX),
                )
            };
            r.result().map_err(|e| self.driver_err(OP, e))?;
        }
        // SAFETY: the caller vouches for the arguments; `slots` outlives the launch call,
        // which copies the parameters.
        unsafe {
            cudarc::driver::result::launch_kernel(
                kernel.function.cu_function(),
                grid,
                block,
                shared_bytes,
                self.compute.cu_stream(),
                &mut params,
            )
        }
        .and_then(|()| self.compute.synchronize())
        .map_err(|e| self.driver_err(OP, e))
    }

    /// Whether this GPU can reach `peer` directly; the first time, enables peer access in
    /// both contexts (the answer is cached).
    fn peer_path(&self, peer: &CudaDevice) -> bool {
        let ordinal = peer.ctx.ordinal();
        if ordinal == self.ctx.ordinal() {
            return true;
        }
        let mut peers = self.peers.lock();
        if let Some(&ok) = peers.get(&ordinal) {
            return ok;
        }
        let enable = |from: &CudaDevice, to: &CudaDevice| -> bool {
            let mut can = 0;
            // SAFETY: plain queries and a context setting on two open contexts.
            unsafe {
                if drv::cuDeviceCanAccessPeer(&mut can, from.ctx.cu_device(), to.ctx.cu_device())
                    != drv::cudaError_enum::CUDA_SUCCESS
                    || can == 0
                    || bind_ctx(&from.ctx).is_err()
                {
                    return false;
                }
                let enabled = matches!(
                    drv::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0),
                    drv::cudaError_enum::CUDA_SUCCESS
                        | drv::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
                );
                // cudarc allocates from each device's default memory pool
                // (cuMemAllocAsync) where the device has one, and peer access to pool
                // memory is granted per pool: let `from` read and write `to`'s pool.
                let mut pool: drv::CUmemoryPool = std::ptr::null_mut();
                if enabled
                    && drv::cuDeviceGetDefaultMemPool(&mut pool, to.ctx.cu_device())
                        == drv::cudaError_enum::CUDA_SUCCESS
                {
                    let desc = drv::CUmemAccessDesc {
                        location: drv::CUmemLocation {
                            type_: drv::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                            id: from.ctx.cu_device(),
                        },
                        flags: drv::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                    };
                    let _ = drv::cuMemPoolSetAccess(pool, &desc, 1);
                }
                enabled
            }
        };
        let ok = enable(self, peer) && enable(peer, self);
        peers.insert(ordinal, ok);
        ok
    }

    fn backend_err(&self, op: &'static str, e: impl std::fmt::Display) -> DevicesError {
        DevicesError::Backend {
            backend: "cuda",
            device: self.info.name.clone(),
            op,
            message: e.to_string(),
        }
    }

    fn driver_err(&self, op: &'static str, e: DriverError) -> DevicesError {
        self.backend_err(op, e)
    }

    fn buf<'a>(&self, op: &'static str, b: &'a DeviceBuffer) -> Result<&'a CudaBuffer> {
        b.inner_for::<CudaBuffer>(op, self.uid)
    }

    fn elems(b: &DeviceBuffer, e: ElemType) -> usize {
        b.len_bytes() / e.size_of()
    }

    /// The device address of a buffer (event tracking is off, so no event is recorded).
    fn ptr(&self, b: &CudaBuffer, stream: &CudaStream) -> drv::CUdeviceptr {
        let (p, _sync) = b.block.get().device_ptr(stream);
        p
    }

    /// Binds the context to this thread, for the raw calls that follow.
    fn bind(&self, op: &'static str) -> Result<()> {
        bind_ctx(&self.ctx).map_err(|e| self.driver_err(op, e))
    }

    fn finish(&self, op: &'static str, status: blas::cublasStatus_t) -> Result<()> {
        status
            .result()
            .map_err(|e| self.backend_err(op, format!("{e:?}")))?;
        self.compute
            .synchronize()
            .map_err(|e| self.driver_err(op, e))
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        // The limit applies to the bytes of live buffers; the pool trims its cache when a
        // fresh block would take it past the limit, or when the driver is out of memory.
        let reservation = self.mem.reserve(bytes as u64)?;
        let block = self.pool.alloc(bytes).map_err(|e| match e {
            DevicesError::OutOfMemory { .. } => self.mem.oom(bytes as u64),
            other => other,
        })?;
        Ok(DeviceBuffer::new(
            bytes,
            self.uid,
            CudaBuffer {
                block,
                _reservation: reservation,
            },
        ))
    }

    fn upload_at(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        let buf = self.buf("upload", dst)?;
        crate::copy_range("upload", offset, src.len(), dst.len_bytes())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind("upload")?;
        let p = self.ptr(buf, &self.transfer) + offset as drv::CUdeviceptr;
        // SAFETY: the destination holds `offset + src.len()` bytes; the stream is synchronised
        // before `src` can go away.
        unsafe { cudarc::driver::result::memcpy_htod_async(p, src, self.transfer.cu_stream()) }
            .and_then(|()| self.transfer.synchronize())
            .map_err(|e| self.driver_err("upload", e))
    }

    fn download_at(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let buf = self.buf("download", src)?;
        crate::copy_range("download", offset, dst.len(), src.len_bytes())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind("download")?;
        let p = self.ptr(buf, &self.d2h) + offset as drv::CUdeviceptr;
        // SAFETY: the source holds `offset + dst.len()` bytes; the stream is synchronised
        // before `dst` can go away.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, p, self.d2h.cu_stream()) }
            .and_then(|()| self.d2h.synchronize())
            .map_err(|e| self.driver_err("download", e))
    }

    fn gemm_mode(
        &self,
        e: ElemType,
        mode: MathMode,
        ta: Trans,
        tb: Trans,
        m: usize,
        n: usize,
        k: usize,
        alpha: f64,
        a: &DeviceBuffer,
        lda: usize,
        b: &DeviceBuffer,
        ldb: usize,
        beta: f64,
        c: &DeviceBuffer,
        ldc: usize,
    ) -> Result<()> {
        const OP: &str = "gemm";
        args::gemm_mode(e, mode)?;
        let (ab, bb, cb) = (self.buf(OP, a)?, self.buf(OP, b)?, self.buf(OP, c)?);
        args::gemm(
            ta,
            tb,
            m,
            n,
            k,
            (lda, Self::elems(a, e)),
            (ldb, Self::elems(b, e)),
            (ldc, Self::elems(c, e)),
        )?;
        no_alias(OP, c, &[a, b])?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (mi, ni, ki) = (int(OP, "m", m)?, int(OP, "n", n)?, int(OP, "k", k)?);
        let (la, lb, lc) = (
            int(OP, "lda", lda)?,
            int(OP, "ldb", ldb)?,
            int(OP, "ldc", ldc)?,
        );
        let h = self.handles.lock();
        self.bind(OP)?;
        let (pa, pb, pc) = (
            self.ptr(ab, &self.compute),
            self.ptr(bb, &self.compute),
            self.ptr(cb, &self.compute),
        );
        let (oa, ob) = (op_of(ta), op_of(tb));
        // SAFETY: the operands were checked to fit their buffers with these shapes and leading
        // dimensions; alpha and beta are host scalars (cuBLAS's default pointer mode), f32
        // for the f32 products as CUBLAS_COMPUTE_32F* requires.
        let status = unsafe {
            match (e, mode) {
                (ElemType::F64, _) => blas::cublasDgemm_v2(
                    *h.blas.handle(),
                    oa,
                    ob,
                    mi,
                    ni,
                    ki,
                    &alpha,
                    pa as *const f64,
                    la,
                    pb as *const f64,
                    lb,
                    &beta,
                    pc as *mut f64,
                    lc,
                ),
                (ElemType::F32, MathMode::F32) => blas::cublasSgemm_v2(
                    *h.blas.handle(),
                    oa,
                    ob,
                    mi,
                    ni,
                    ki,
                    &(alpha as f32),
                    pa as *const f32,
                    la,
                    pb as *const f32,
                    lb,
                    &(beta as f32),
                    pc as *mut f32,
                    lc,
                ),
                // f32 storage and accumulation; the compute type says how tensor cores read
                // the inputs.
                (ElemType::F32, MathMode::Tf32 | MathMode::Bf16) => {
                    let compute = if mode == MathMode::Tf32 {
                        blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
                    } else {
                        blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF
                    };
                    let r32 = blas::cudaDataType::CUDA_R_32F;
                    let (alpha, beta) = (alpha as f32, beta as f32);
                    blas::cublasGemmEx(
                        *h.blas.handle(),
                        oa,
                        ob,
                        mi,
                        ni,
                        ki,
                        (&alpha as *const f32).cast(),
                        pa as *const std::ffi::c_void,
                        r32,
                        la,
                        pb as *const std::ffi::c_void,
                        r32,
                        lb,
                        (&beta as *const f32).cast(),
                        pc as *mut std::ffi::c_void,
                        r32,
                        lc,
                        compute,
                        blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
            }
        };
        self.finish(OP, status)
    }

    fn syrk(
        &self,
        e: ElemType,
        uplo: Uplo,
        t: Trans,
        n: usize,
        k: usize,
        alpha: f64,
        a: &DeviceBuffer,
        lda: usize,
        beta: f64,
        c: &DeviceBuffer,
        ldc: usize,
    ) -> Result<()> {
        const OP: &str = "syrk";
        let (ab, cb) = (self.buf(OP, a)?, self.buf(OP, c)?);
        args::syrk(t, n, k, (lda, Self::elems(a, e)), (ldc, Self::elems(c, e)))?;
        no_alias(OP, c, &[a])?;
        if n == 0 {
            return Ok(());
        }
        let (ni, ki) = (int(OP, "n", n)?, int(OP, "k", k)?);
        let (la, lc) = (int(OP, "lda", lda)?, int(OP, "ldc", ldc)?);
        let h = self.handles.lock();
        self.bind(OP)?;
        let (pa, pc) = (self.ptr(ab, &self.compute), self.ptr(cb, &self.compute));
        // SAFETY: as in gemm.
        let status = unsafe {
            match e {
                ElemType::F64 => blas::cublasDsyrk_v2(
                    *h.blas.handle(),
                    fill_of(uplo),
                    op_of(t),
                    ni,
                    ki,
                    &alpha,
                    pa as *const f64,
                    la,
                    &beta,
                    pc as *mut f64,
                    lc,
                ),
                ElemType::F32 => blas::cublasSsyrk_v2(
                    *h.blas.handle(),
                    fill_of(uplo),
                    op_of(t),
                    ni,
                    ki,
                    &(alpha as f32),
                    pa as *const f32,
                    la,
                    &(beta as f32),
                    pc as *mut f32,
                    lc,
                ),
            }
        };
        self.finish(OP, status)
    }

    fn trsm(
        &self,
        e: ElemType,
        side: Side,
        uplo: Uplo,
        t: Trans,
        diag: Diag,
        m: usize,
        n: usize,
        alpha: f64,
        a: &DeviceBuffer,
        lda: usize,
        b: &DeviceBuffer,
        ldb: usize,
    ) -> Result<()> {
        const OP: &str = "trsm";
        let (ab, bb) = (self.buf(OP, a)?, self.buf(OP, b)?);
        args::trsm(
            side,
            m,
            n,
            (lda, Self::elems(a, e)),
            (ldb, Self::elems(b, e)),
        )?;
        no_alias(OP, b, &[a])?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (mi, ni) = (int(OP, "m", m)?, int(OP, "n", n)?);
        let (la, lb) = (int(OP, "lda", lda)?, int(OP, "ldb", ldb)?);
        let s = match side {
            Side::Left => blas::cublasSideMode_t::CUBLAS_SIDE_LEFT,
            Side::Right => blas::cublasSideMode_t::CUBLAS_SIDE_RIGHT,
        };
        let d = match diag {
            Diag::NonUnit => blas::cublasDiagType_t::CUBLAS_DIAG_NON_UNIT,
            Diag::Unit => blas::cublasDiagType_t::CUBLAS_DIAG_UNIT,
        };
        let h = self.handles.lock();
        self.bind(OP)?;
        let (pa, pb) = (self.ptr(ab, &self.compute), self.ptr(bb, &self.compute));
        // SAFETY: as in gemm.
        let status = unsafe {
            match e {
                ElemType::F64 => blas::cublasDtrsm_v2(
                    *h.blas.handle(),
                    s,
                    fill_of(uplo),
                    op_of(t),
                    d,
                    mi,
                    ni,
                    &alpha,
                    pa as *const f64,
                    la,
                    pb as *mut f64,
                    lb,
                ),
                ElemType::F32 => blas::cublasStrsm_v2(
                    *h.blas.handle(),
                    s,
                    fill_of(uplo),
                    op_of(t),
                    d,
                    mi,
                    ni,
                    &(alpha as f32),
                    pa as *const f32,
                    la,
                    pb as *mut f32,
                    lb,
                ),
            }
        };
        self.finish(OP, status)
    }

    fn potrf(&self, e: ElemType, uplo: Uplo, n: usize, a: &DeviceBuffer, lda: usize) -> Result<()> {
        const OP: &str = "potrf";
        let ab = self.buf(OP, a)?;
        args::potrf(n, lda, Self::elems(a, e))?;
        if n == 0 {
            return Ok(());
        }
        let (ni, la) = (int(OP, "n", n)?, int(OP, "lda", lda)?);
        let fill = solver_fill_of(uplo);
        let h = self.handles.lock();
        self.bind(OP)?;
        let pa = self.ptr(ab, &self.compute);
        let cu = h.solver.cu();
        let serr = |e: solver::cusolverStatus_t| self.backend_err(OP, format!("{e:?}"));
        let mut lwork: i32 = 0;
        // SAFETY: A was checked to hold an n×n matrix with leading dimension lda.
        unsafe {
            match e {
                ElemType::F64 => solver::cusolverDnDpotrf_bufferSize(
                    cu,
                    fill,
                    ni,
                    pa as *mut f64,
                    la,
                    &mut lwork,
                ),
                ElemType::F32 => solver::cusolverDnSpotrf_bufferSize(
                    cu,
                    fill,
                    ni,
                    pa as *mut f32,
                    la,
                    &mut lwork,
                ),
            }
        }
        .result()
        .map_err(|e| serr(e.0))?;
        let lwork_elems = usize::try_from(lwork).unwrap_or(0).max(1);
        let work = self
            .compute
            .alloc_zeros::<u8>(lwork_elems * e.size_of())
            .map_err(|e| self.driver_err(OP, e))?;
        let info = self
            .compute
            .alloc_zeros::<i32>(1)
            .map_err(|e| self.driver_err(OP, e))?;
        let (pw, _w) = work.device_ptr(&self.compute);
        let (pi, _i) = info.device_ptr(&self.compute);
        let lwork = int(OP, "workspace", lwork_elems)?;
        // SAFETY: the workspace holds `lwork` elements as cuSOLVER asked; info holds one int.
        unsafe {
            match e {
                ElemType::F64 => solver::cusolverDnDpotrf(
                    cu,
                    fill,
                    ni,
                    pa as *mut f64,
                    la,
                    pw as *mut f64,
                    lwork,
                    pi as *mut i32,
                ),
                ElemType::F32 => solver::cusolverDnSpotrf(
                    cu,
                    fill,
                    ni,
                    pa as *mut f32,
                    la,
                    pw as *mut f32,
                    lwork,
                    pi as *mut i32,
                ),
            }
        }
        .result()
        .map_err(|e| serr(e.0))?;
        let mut host_info = [0i32; 1];
        // SAFETY: one int from the info buffer, on the stream that wrote it, synchronised below.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut host_info, pi, self.compute.cu_stream())
        }
        .and_then(|()| self.compute.synchronize())
        .map_err(|e| self.driver_err(OP, e))?;
        drop(h);
        match usize::try_from(host_info[0]) {
            Ok(0) => Ok(()),
            Ok(col) => Err(DevicesError::NotPositiveDefinite { column: col - 1 }),
            Err(_) => Err(DevicesError::bad_args(
                OP,
                format!("cuSOLVER rejected argument {}", -host_info[0]),
            )),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.transfer
            .synchronize()
            .and_then(|()| self.d2h.synchronize())
            .and_then(|()| self.compute.synchronize())
            .map_err(|e| self.driver_err("synchronize", e))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn can_copy_to_peer(&self, dst: &dyn Device) -> bool {
        dst.as_any()
            .downcast_ref::<CudaDevice>()
            .is_some_and(|peer| self.peer_path(peer))
    }

    fn copy_to_peer(
        &self,
        src: &DeviceBuffer,
        dst: &dyn Device,
        dst_buf: &DeviceBuffer,
        bytes: usize,
    ) -> Result<()> {
        const OP: &str = "copy_to_peer";
        let peer = match dst.as_any().downcast_ref::<CudaDevice>() {
            Some(peer) if self.peer_path(peer) => peer,
            _ => {
                return Err(DevicesError::Unsupported {
                    device: self.info.name.clone(),
                    what: format!("peer-to-peer copy to {}", dst.info().name),
                })
            }
        };
        let (from, to) = (self.buf(OP, src)?, peer.buf(OP, dst_buf)?);
        if bytes > src.len_bytes() || bytes > dst_buf.len_bytes() {
            return Err(DevicesError::bad_args(
                OP,
                format!(
                    "{bytes} bytes from a buffer of {} into one of {}",
                    src.len_bytes(),
                    dst_buf.len_bytes()
                ),
            ));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.bind(OP)?;
        let (ps, pd) = (self.ptr(from, &self.d2h), peer.ptr(to, &self.d2h));
        // SAFETY: both buffers hold at least `bytes` bytes and live until the stream is
        // synchronised below; no call of either device uses them meanwhile (the runtime
        // copies only unpinned-by-tasks replicas under the data's coherence lock).
        unsafe {
            cudarc::driver::result::memcpy_peer_async(
                peer.ctx.cu_ctx(),
                pd,
                self.ctx.cu_ctx(),
                ps,
                bytes,
                self.d2h.cu_stream(),
            )
        }
        .and_then(|()| self.d2h.synchronize())
        .map_err(|e| self.driver_err(OP, e))
    }

    unsafe fn pin_host_memory(&self, ptr: *const u8, len: usize) -> Result<Option<HostPin>> {
        if len == 0 {
            return Ok(None);
        }
        self.bind("pin host memory")?;
        // SAFETY: the caller keeps the range allocated and in place until the pin drops.
        let r = unsafe {
            drv::cuMemHostRegister_v2(
                ptr as *mut std::ffi::c_void,
                len,
                drv::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        match r {
            drv::cudaError_enum::CUDA_SUCCESS => Ok(Some(HostPin::new(
                len,
                CudaPin {
                    ctx: Arc::clone(&self.ctx),
                    addr: ptr as usize,
                },
            ))),
            // The driver pins whole pages, so a range that shares its first or last page
            // with memory already pinned (a neighbouring allocation) is refused: pin the
            // pages that lie wholly inside it instead. Copies of the range are then only
            // partly from pinned memory; the pin's length says how much.
            drv::cudaError_enum::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => {
                const PAGE: usize = 4096;
                let start = (ptr as usize).div_ceil(PAGE) * PAGE;
                let end = (ptr as usize + len) / PAGE * PAGE;
                if end <= start {
                    return Ok(None);
                }
                // SAFETY: a sub-range of the caller's range, under the same promise.
                let inner = unsafe {
                    drv::cuMemHostRegister_v2(
                        start as *mut std::ffi::c_void,
                        end - start,
                        drv::CU_MEMHOSTREGISTER_PORTABLE,
                    )
                };
                Ok((inner == drv::cudaError_enum::CUDA_SUCCESS).then(|| {
                    HostPin::new(
                        end - start,
                        CudaPin {
                            ctx: Arc::clone(&self.ctx),
                            addr: start,
                        },
                    )
                }))
            }
            other => Err(self.backend_err("pin host memory", format!("{other:?}"))),
        }
    }

    fn supports(&self, _e: ElemType) -> bool {
        true
    }

    fn mem_used(&self) -> u64 {
        self.mem.used()
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saxpy kernel from CUDA C: compiled by NVRTC and stored in a fresh cache, loaded from
    /// it by a second device instance, and computing the right result.
    fn nvrtc_kernels_compile_once_and_run() {
        const SRC: &str = r#"extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = a * x[i] + y[i];
        }"#;
        let dir = tempfile::tempdir().expect("temporary folder");
        let cache = KernelCacheDir::At(dir.path().to_path_buf());
        let n = 1000usize;
        for round in 0..2 {
            let dev = CudaDevice::with_kernel_cache(0, None, &cache).expect("open GPU 0");
            let k = dev.compile_kernel(SRC, "saxpy", &[]).expect("compile");
            let want = if round == 0 {
                CacheOutcome::Stored
            } else {
                CacheOutcome::Hit
            };
            assert_eq!(k.origin, Some(want), "round {round}");
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let y: Vec<f32> = vec![1.0; n];
            let (bx, by) = (crate::devtest::put(&dev, &x), crate::devtest::put(&dev, &y));
            // SAFETY: the arguments match saxpy's parameters; n threads cover n elements.
            unsafe {
                dev.launch(
                    &k,
                    (n.div_ceil(256) as u32, 1, 1),
                    (256, 1, 1),
                    0,
                    &[
                        KernelArg::F32(2.0),
                        KernelArg::Buffer(&bx),
                        KernelArg::Buffer(&by),
                        KernelArg::I32(n as i32),
                    ],
                )
            }
            .expect("launch");
            let out: Vec<f32> = crate::devtest::get(&dev, &by);
            assert!(out
                .iter()
                .enumerate()
                .all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
            let err = dev
                .compile_kernel("this is not CUDA", "f", &[])
                .unwrap_err();
            assert!(matches!(err, DevicesError::Backend { .. }), "{err}");
        }
    }

    /// Without a driver, discovery reports "no CUDA driver" and no device, and does not panic;
    /// with one, every device found is a CUDA device.
    #[test]
    fn discovery_without_driver_skips_cuda() {
        let found = crate::discover_report(&DiscoverOptions {
            opencl: false,
            cuda: true,
            mem_limit: None,
        });
        if driver_present() {
            eprintln!("CUDA driver present: {found:?}");
            assert!(found
                .devices
                .iter()
                .all(|d| d.info().kind == DeviceKind::Cuda));
            // With a GPU, the same checks as every other backend.
            for dev in &found.devices {
                crate::devtest::blas_matches_cpu(dev.as_ref());
                crate::devtest::transfer_overlaps_compute(dev);
                crate::devtest::tiled_cholesky_on_device(dev.as_ref());
            }
            // The pool behind alloc: the limit counts live bytes, freed blocks are reused.
            let dev = CudaDevice::new(0, Some(1000)).expect("open GPU 0");
            crate::devtest::out_of_memory_at_limit_1000(&dev);
            // The check above leaves a freed 1 KiB-class block cached: trim it, so the 700
            // bytes below come from the driver and only the 1000 (same class) is a hit.
            assert!(dev.trim_pool() > 0);
            let hits = dev.pool_stats().hits;
            drop(dev.alloc(700).expect("alloc"));
            let _again = dev.alloc(1000).expect("alloc");
            assert_eq!(dev.pool_stats().hits, hits + 1);
            drop(dev);
            let dev = &found.devices[0];
            eprintln!("GPU 0 topology: {:?}", dev.info().topology);
            crate::devtest::pinned_copies_round_trip(dev.as_ref());
            crate::devtest::mixed_precision_on_tensor_cores(dev.as_ref());
            nvrtc_kernels_compile_once_and_run();
            if found.devices.len() > 1 {
                crate::devtest::peer_copies_between(
                    found.devices[0].as_ref(),
                    found.devices[1].as_ref(),
                );
            }
        } else {
            eprintln!("skipping the GPU checks: no CUDA driver on this machine");
            assert!(found.devices.is_empty());
            assert_eq!(found.skipped, vec!["no CUDA driver".to_string()]);
        }
    }
}
