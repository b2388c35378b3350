//! The OpenCL backend (opencl3, `libOpenCL` loaded at run time).
//!
//! One [`OpenClDevice`] per OpenCL device of every platform, each with its own context and
//! two in-order command queues: `transfer` for uploads and downloads, `compute` for kernels.
//! Transfers are blocking writes and reads on the transfer queue; kernels are enqueued on the
//! compute queue and waited for, so every call is complete when it returns and a copy on one
//! thread overlaps a kernel on another.
//!
//! Kernels (`kernels.cl`) are built on first use, once per element type (`-DUSE_FP64` for
//! f64, only when the device has `cl_khr_fp64`), and kept in the device. The program binary
//! is kept on disk in a [`KernelCache`] (see [`crate::kernel_cache`]), keyed by the device's
//! name, vendor, version and driver version, the platform's version, the options and the
//! source: a later process builds from that binary (`clCreateProgramWithBinary`) instead of
//! compiling the source. A binary the driver rejects is replaced by a fresh build from source;
//! a cache that cannot be written only costs the compilation.
//! Kernel arguments are set and launched under one lock, since an OpenCL kernel object is
//! not safe to configure from two threads.
//!
//! Memory is accounted per device against `global_mem` (or [`crate::DiscoverOptions::mem_limit`]):
//! OpenCL implementations allocate lazily, so the accounting is what makes a full device
//! answer [`DevicesError::OutOfMemory`] at `alloc` rather than fail later in a kernel.

use std::ptr;
use std::sync::Arc;

use opencl3::command_queue::{enqueue_read_buffer, enqueue_write_buffer, CommandQueue};
use opencl3::context::Context;
use opencl3::device::{Device as ClDevice, CL_DEVICE_TYPE_ALL};
use opencl3::error_codes::{ClError, DLOPEN_RUNTIME_LOAD_FAILED};
use opencl3::event::Event;
use opencl3::kernel::Kernel;
use opencl3::memory::{Buffer, ClMem, CL_MEM_READ_WRITE};
use opencl3::platform::Platform;
use opencl3::program::Program;
use opencl3::types::{cl_int, cl_mem, CL_BLOCKING};
use parking_lot::Mutex;

use crate::kernel_cache::{CacheKey, CacheOutcome, KernelCache, KernelCacheDir};
use crate::{
    args, no_alias, Device, DeviceBuffer, DeviceInfo, DeviceKind, DevicesError, Diag,
    DiscoverOptions, Discovery, ElemType, MathMode, MemAccount, Reservation, Result, Side, Trans,
    Uplo,
};

const SOURCE: &str = include_str!("kernels.cl");
/// Tile edge of the gemm kernel (`TS` in `kernels.cl`).
const TS: usize = 16;
/// Largest work-group used by potrf.
const POTRF_LOCAL: usize = 256;

// OpenCL error codes that mean "no memory" (cl.h).
const CL_MEM_OBJECT_ALLOCATION_FAILURE: cl_int = -4;
const CL_OUT_OF_RESOURCES: cl_int = -5;
const CL_OUT_OF_HOST_MEMORY: cl_int = -6;
const CL_INVALID_BUFFER_SIZE: cl_int = -61;

/// Serialises discovery process-wide: PoCL 2.x crashes when two threads initialise it at
/// once (one queries a device while the other is still probing the topology).
static DISCOVERY: Mutex<()> = Mutex::new(());

/// Serialises PoCL's kernel commands process-wide, each from its enqueue until it is done,
/// and its program builds. PoCL before 6.0 (Debian 12 ships 3.1) finds the cached kernel
/// binary a finished command releases by the kernel and its local size only, so with
/// several commands of one kernel in flight (from two devices, or a build beside a run)
/// it can release another command's entry and abort the process on
/// `found->ref_count > 0` (seen in CI; fixed upstream by pocl/pocl commit c9ac4c0).
/// One command at a time keeps every release on the entry its command took. PoCL's CPU
/// device runs one kernel on all cores, so little is lost.
static POCL_COMMANDS: Mutex<()> = Mutex::new(());

/// Adds every device of every OpenCL platform to `found`, their kernels cached in
/// `kernel_cache`.
pub(crate) fn discover_into(
    opts: &DiscoverOptions,
    kernel_cache: &KernelCacheDir,
    found: &mut Discovery,
) {
    let _one_at_a_time = DISCOVERY.lock();
    let platforms = match opencl3::platform::get_platforms() {
        Ok(p) => p,
        Err(ClError(DLOPEN_RUNTIME_LOAD_FAILED)) => {
            found
                .skipped
                .push("no OpenCL platform (libOpenCL could not be loaded)".to_string());
            return;
        }
        Err(e) => {
            found
                .skipped
                .push(format!("no OpenCL platform (clGetPlatformIDs failed: {e})"));
            return;
        }
    };
    if platforms.is_empty() {
        found.skipped.push("no OpenCL platform".to_string());
        return;
    }
    for platform in platforms {
        let pname = platform.name().unwrap_or_else(|_| "?".to_string());
        let ids = match platform.get_devices(CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(e) => {
                found
                    .skipped
                    .push(format!("opencl platform {pname}: no devices ({e})"));
                continue;
            }
        };
        for id in ids {
            match OpenClDevice::with_kernel_cache(ClDevice::new(id), opts.mem_limit, kernel_cache) {
                Ok(dev) => found.devices.push(Arc::new(dev)),
                Err(e) => found
                    .skipped
                    .push(format!("opencl platform {pname}: device skipped: {e}")),
            }
        }
    }
}

/// The compiled kernels of one element type.
struct Kernels {
    _program: Program,
    gemm: Kernel,
    trsm: Kernel,
    potrf: Kernel,
    potrf_local: usize,
    /// Where the program came from; `None` without a kernel cache.
    origin: Option<CacheOutcome>,
}

/// State touched by kernel launches, behind the compute lock.
#[derive(Default)]
struct ComputeState {
    f32: Option<Kernels>,
    f64: Option<Kernels>,
    /// One `int` for potrf's result.
    info: Option<Buffer<cl_int>>,
}

/// The backend part of a [`DeviceBuffer`]: the OpenCL buffer and its memory accounting.
struct ClBuffer {
    buffer: Buffer<u8>,
    _reservation: Reservation,
}

/// One OpenCL device with its context and queues.
pub struct OpenClDevice {
    info: DeviceInfo,
    uid: u64,
    device: ClDevice,
    context: Context,
    transfer: CommandQueue,
    compute: CommandQueue,
    state: Mutex<ComputeState>,
    fp64: bool,
    max_alloc: u64,
    mem: Arc<MemAccount>,
    kernel_cache: Option<KernelCache>,
    /// What identifies the driver's binaries besides options and source: device name,
    /// vendor, device version, driver version, platform version.
    binary_id: String,
    /// A PoCL device: its commands and builds take [`POCL_COMMANDS`].
    pocl: bool,
}

fn queue(context: &Context) -> std::result::Result<CommandQueue, ClError> {
    CommandQueue::create_default_with_properties(context, 0, 0)
        .or_else(|_| CommandQueue::create_default(context, 0))
}

/// A kernel argument's int value, or `BadArgs` when it does not fit OpenCL's `int`.
fn int(op: &'static str, what: &str, v: usize) -> Result<cl_int> {
    cl_int::try_from(v).map_err(|_| {
        DevicesError::bad_args(op, format!("{what} = {v} exceeds the OpenCL int range"))
    })
}

impl OpenClDevice {
    /// Opens `device`: a context, two queues and the memory accounting. Kernels are built on
    /// first use, through the kernel cache in `$FLOTILLA_HOME/kernels`.
    pub fn new(device: ClDevice, mem_limit: Option<u64>) -> Result<Self> {
        Self::with_kernel_cache(device, mem_limit, &KernelCacheDir::Default)
    }

    /// [`OpenClDevice::new`] with the compiled kernels cached in `kernel_cache`.
    pub fn with_kernel_cache(
        device: ClDevice,
        mem_limit: Option<u64>,
        kernel_cache: &KernelCacheDir,
    ) -> Result<Self> {
        let name = device.name().unwrap_or_else(|_| "unknown".to_string());
        let err = |op: &'static str, e: ClError| DevicesError::Backend {
            backend: "opencl",
            device: name.clone(),
            op,
            message: e.to_string(),
        };
        let vendor = device.vendor().unwrap_or_default();
        let global_mem = device
            .global_mem_size()
            .map_err(|e| err("device query", e))?;
        let max_alloc = device
            .max_mem_alloc_size()
            .map_err(|e| err("device query", e))?;
        let compute_units = device.max_compute_units().unwrap_or(1);
        let fp64 = device
            .extensions()
            .map(|x| x.split_whitespace().any(|e| e == "cl_khr_fp64"))
            .unwrap_or(false);
        let context = Context::from_device(&device).map_err(|e| err("create context", e))?;
        let transfer = queue(&context).map_err(|e| err("create transfer queue", e))?;
        let compute = queue(&context).map_err(|e| err("create compute queue", e))?;
        let limit = mem_limit.map_or(global_mem, |l| l.min(global_mem));
        let platform_version = device
            .platform()
            .and_then(|p| Platform::new(p).version())
            .unwrap_or_default();
        let binary_id = [
            name.as_str(),
            vendor.as_str(),
            &device.version().unwrap_or_default(),
            &device.driver_version().unwrap_or_default(),
            &platform_version,
        ]
        .join("\n");
        let pocl = platform_version.to_ascii_lowercase().contains("pocl");
        let info = DeviceInfo {
            kind: DeviceKind::OpenCl,
            name: name.clone(),
            vendor,
            global_mem: limit,
            compute_units,
            arch: format!("opencl:{name}"),
            topology: None,
        };
        Ok(OpenClDevice {
            mem: MemAccount::new(name, limit),
            info,
            uid: crate::next_device_uid(),
            device,
            context,
            transfer,
            compute,
            state: Mutex::new(ComputeState::default()),
            fp64,
            max_alloc,
            kernel_cache: kernel_cache.open(),
            binary_id,
            pocl,
        })
    }

    /// The cache of this device's compiled kernels, if it has one.
    pub fn kernel_cache(&self) -> Option<&KernelCache> {
        self.kernel_cache.as_ref()
    }

    /// Where the kernels of element type `e` came from: `None` before their first use or
    /// without a kernel cache.
    pub fn kernel_origin(&self, e: ElemType) -> Option<CacheOutcome> {
        let state = self.state.lock();
        let kernels = match e {
            ElemType::F32 => &state.f32,
            ElemType::F64 => &state.f64,
        };
        kernels.as_ref().and_then(|k| k.origin)
    }

    fn backend_err(&self, op: &'static str, e: impl std::fmt::Display) -> DevicesError {
        DevicesError::Backend {
            backend: "opencl",
            device: self.info.name.clone(),
            op,
            message: e.to_string(),
        }
    }

    fn buf<'a>(&self, op: &'static str, b: &'a DeviceBuffer) -> Result<&'a ClBuffer> {
        b.inner_for::<ClBuffer>(op, self.uid)
    }

    /// The buffer's length in elements of `e`.
    fn elems(b: &DeviceBuffer, e: ElemType) -> usize {
        b.len_bytes() / e.size_of()
    }

    /// Fails unless `e` is supported here.
    fn check_elem(&self, e: ElemType) -> Result<()> {
        if self.supports(e) {
            Ok(())
        } else {
            Err(DevicesError::Unsupported {
                device: self.info.name.clone(),
                what: format!("{e} (no cl_khr_fp64)"),
            })
        }
    }

    /// Compiles (once) and returns the kernels for `e`.
    fn kernels<'s>(&self, state: &'s mut ComputeState, e: ElemType) -> Result<&'s Kernels> {
        let slot = match e {
            ElemType::F32 => &mut state.f32,
            ElemType::F64 => &mut state.f64,
        };
        if slot.is_none() {
            *slot = Some(self.build(e)?);
        }
        slot.as_ref()
            .ok_or_else(|| self.backend_err("build program", "kernels missing after build"))
    }

    /// The kernel cache's key of the program built with `options`.
    fn cache_key(&self, options: &str) -> CacheKey {
        CacheKey::new(&[
            b"opencl",
            self.binary_id.as_bytes(),
            options.as_bytes(),
            SOURCE.as_bytes(),
        ])
    }

    /// The program built with `options`: from the cached binary when the cache has one the
    /// driver accepts, otherwise from source, storing its binary in the cache.
    fn program(&self, options: &str) -> Result<(Program, Option<CacheOutcome>)> {
        let from_source = || {
            Program::create_and_build_from_source(&self.context, SOURCE, options)
                .map_err(|log| self.backend_err("build program", log))
        };
        let Some(cache) = &self.kernel_cache else {
            return Ok((from_source()?, None));
        };
        let key = self.cache_key(options);
        if let Some(binary) = cache.load(&key) {
            // A binary that fails to load (a driver update that kept its version string, a
            // binary of another device) falls through to a build from source, whose binary
            // then replaces it.
            if let Ok(program) =
                Program::create_and_build_from_binary(&self.context, &[&binary], options)
            {
                return Ok((program, Some(CacheOutcome::Hit)));
            }
        }
        let program = from_source()?;
        let stored = program
            .get_binaries()
            .ok()
            .and_then(|bins| bins.into_iter().next())
            .filter(|bin| !bin.is_empty())
            .is_some_and(|bin| cache.store(&key, &bin).is_ok());
        let outcome = if stored {
            CacheOutcome::Stored
        } else {
            CacheOutcome::NotStored
        };
        Ok((program, Some(outcome)))
    }

    /// Held while a PoCL command or build is under way (see [`POCL_COMMANDS`]).
    fn pocl_guard(&self) -> Option<parking_lot::MutexGuard<'static, ()>> {
        self.pocl.then(|| POCL_COMMANDS.lock())
    }

    fn build(&self, e: ElemType) -> Result<Kernels> {
        let _pocl = self.pocl_guard();
        let options = match e {
            ElemType::F32 => "",
            ElemType::F64 => "-DUSE_FP64",
        };
        let (program, origin) = self.program(options)?;
        let kernel = |name: &str| {
            Kernel::create(&program, name).map_err(|e| self.backend_err("create kernel", e))
        };
        let gemm = kernel("gemm")?;
        let trsm = kernel("trsm")?;
        let potrf = kernel("potrf")?;
        let wg = potrf
            .get_work_group_size(self.device.id())
            .map_err(|e| self.backend_err("kernel query", e))?;
        let potrf_local = wg.clamp(1, POTRF_LOCAL);
        Ok(Kernels {
            _program: program,
            gemm,
            trsm,
            potrf,
            potrf_local,
            origin,
        })
    }

    /// Launches `kernel` and waits for it.
    fn launch(&self, kernel: &Kernel, global: &[usize], local: &[usize]) -> Result<()> {
        let dims = global.len() as u32;
        let _pocl = self.pocl_guard();
        // SAFETY: `global` and `local` have `dims` entries; every argument of `kernel` was set
        // by the caller under the compute lock, to buffers checked to hold the matrices the
        // kernel indexes.
        let event = unsafe {
            self.compute.enqueue_nd_range_kernel(
                kernel.get(),
                dims,
                ptr::null(),
                global.as_ptr(),
                local.as_ptr(),
                &[],
            )
        }
        .map_err(|e| self.backend_err("enqueue kernel", e))?;
        event
            .wait()
            .map_err(|e| self.backend_err("wait for kernel", e))
    }

    /// The shared gemm/syrk launch: `tri` 0 = full C, 1 = lower, 2 = upper.
    #[allow(clippy::too_many_arguments)]
    fn gemm_kernel(
        &self,
        op: &'static str,
        e: ElemType,
        ta: Trans,
        tb: Trans,
        (m, n, k): (usize, usize, usize),
        alpha: f64,
        (a, lda): (&ClBuffer, usize),
        (b, ldb): (&ClBuffer, usize),
        beta: f64,
        (c, ldc): (&ClBuffer, usize),
        tri: cl_int,
        mode: MathMode,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let dims = [
            int(op, "m", m)?,
            int(op, "n", n)?,
            int(op, "k", k)?,
            int(op, "lda", lda)?,
            int(op, "ldb", ldb)?,
            int(op, "ldc", ldc)?,
        ];
        let global = [m.div_ceil(TS) * TS, n.div_ceil(TS) * TS];
        let mut state = self.state.lock();
        let kern = &self.kernels(&mut state, e)?.gemm;
        let (am, bm, cm) = (a.buffer.get(), b.buffer.get(), c.buffer.get());
        let ta = cl_int::from(ta == Trans::Yes);
        let tb = cl_int::from(tb == Trans::Yes);
        let keep = mode.mantissa_bits() as cl_int;
        // SAFETY: argument indices and types match `gemm` in kernels.cl (int, real, global
        // pointers as cl_mem); `set_real` picks float or double to match the program.
        unsafe {
            let set = |i: u32, v: &cl_int| kern.set_arg(i, v);
            let setm = |i: u32, v: &cl_mem| kern.set_arg(i, v);
            set(0, &ta)
                .and(set(1, &tb))
                .and(set(2, &dims[0]))
                .and(set(3, &dims[1]))
                .and(set(4, &dims[2]))
                .and(set_real(kern, 5, e, alpha))
                .and(setm(6, &am))
                .and(set(7, &dims[3]))
                .and(setm(8, &bm))
                .and(set(9, &dims[4]))
                .and(set_real(kern, 10, e, beta))
                .and(setm(11, &cm))
                .and(set(12, &dims[5]))
                .and(set(13, &tri))
                .and(set(14, &keep))
        }
        .map_err(|e| self.backend_err(op, e))?;
        self.launch(kern, &global, &[TS, TS])
    }
}

/// Sets a `real` kernel argument as `float` or `double`.
///
/// # Safety
/// Argument `i` of `kernel` must be of type `real` in a program built for `e`.
unsafe fn set_real(
    kernel: &Kernel,
    i: u32,
    e: ElemType,
    v: f64,
) -> std::result::Result<(), ClError> {
    // SAFETY: forwarded to the caller.
    unsafe {
        match e {
            ElemType::F32 => kernel.set_arg(i, &(v as f32)),
            ElemType::F64 => kernel.set_arg(i, &v),
        }
    }
}

impl Device for OpenClDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let requested = bytes as u64;
        if requested > self.max_alloc {
            return Err(self.mem.oom(requested));
        }
        let reservation = self.mem.reserve(requested)?;
        // SAFETY: no host pointer is passed, the flags only ask for read-write device memory.
        // A zero-byte buffer is invalid in OpenCL, so at least one byte is allocated.
        let buffer = unsafe {
            Buffer::<u8>::create(
                &self.context,
                CL_MEM_READ_WRITE,
                bytes.max(1),
                ptr::null_mut(),
            )
        }
        .map_err(|e| match e.0 {
            CL_MEM_OBJECT_ALLOCATION_FAILURE
            | CL_OUT_OF_RESOURCES
            | CL_OUT_OF_HOST_MEMORY
            | CL_INVALID_BUFFER_SIZE => self.mem.oom(requested),
            _ => self.backend_err("alloc", e),
        })?;
        Ok(DeviceBuffer::new(
            bytes,
            self.uid,
            ClBuffer {
                buffer,
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
        // SAFETY: blocking write of `src.len()` bytes from a live slice into a buffer at
        // least that large; the event is released by `Event`'s drop.
        let ev = unsafe {
            enqueue_write_buffer(
                self.transfer.get(),
                buf.buffer.get(),
                CL_BLOCKING,
                offset,
                src.len(),
                src.as_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|e| self.backend_err("upload", ClError(e)))?;
        drop(Event::new(ev));
        Ok(())
    }

    fn download_at(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let buf = self.buf("download", src)?;
        crate::copy_range("download", offset, dst.len(), src.len_bytes())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: blocking read of `dst.len()` bytes into a live mutable slice from a buffer
        // at least that large; the event is released by `Event`'s drop.
        let ev = unsafe {
            enqueue_read_buffer(
                self.transfer.get(),
                buf.buffer.get(),
                CL_BLOCKING,
                offset,
                dst.len(),
                dst.as_mut_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|e| self.backend_err("download", ClError(e)))?;
        drop(Event::new(ev));
        Ok(())
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
        args::gemm_mode(e, mode)?;
        let (ab, bb, cb) = (
            self.buf("gemm", a)?,
            self.buf("gemm", b)?,
            self.buf("gemm", c)?,
        );
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
        no_alias("gemm", c, &[a, b])?;
        self.check_elem(e)?;
        self.gemm_kernel(
            "gemm",
            e,
            ta,
            tb,
            (m, n, k),
            alpha,
            (ab, lda),
            (bb, ldb),
            beta,
            (cb, ldc),
            0,
            mode,
        )
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
        let (ab, cb) = (self.buf("syrk", a)?, self.buf("syrk", c)?);
        args::syrk(t, n, k, (lda, Self::elems(a, e)), (ldc, Self::elems(c, e)))?;
        no_alias("syrk", c, &[a])?;
        self.check_elem(e)?;
        // C := alpha op(A) op(A)ᵀ + beta C on one triangle: gemm of A with itself.
        let (ta, tb) = match t {
            Trans::No => (Trans::No, Trans::Yes),
            Trans::Yes => (Trans::Yes, Trans::No),
        };
        let tri = match uplo {
            Uplo::Lower => 1,
            Uplo::Upper => 2,
        };
        self.gemm_kernel(
            "syrk",
            e,
            ta,
            tb,
            (n, n, k),
            alpha,
            (ab, lda),
            (ab, lda),
            beta,
            (cb, ldc),
            tri,
            MathMode::F32,
        )
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
        self.check_elem(e)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        // Left: op(A) x = alpha b for each column of B. Right: X op(A) = alpha B is
        // op(A)ᵀ xᵀ = alpha bᵀ for each row of B. The kernel solves T x = alpha b.
        let (size, nvec, inc, vinc, transposed) = match side {
            Side::Left => (m, n, 1, ldb, t == Trans::Yes),
            Side::Right => (n, m, ldb, 1, t == Trans::No),
        };
        let lower = if transposed {
            uplo == Uplo::Upper
        } else {
            uplo == Uplo::Lower
        };
        let ints = [
            int(OP, "system size", size)?,
            int(OP, "right-hand sides", nvec)?,
            int(OP, "lda", lda)?,
            cl_int::from(transposed),
            cl_int::from(lower),
            cl_int::from(diag == Diag::Unit),
            int(OP, "ldb", inc)?,
            int(OP, "ldb", vinc)?,
        ];
        let (am, bm) = (ab.buffer.get(), bb.buffer.get());
        let mut state = self.state.lock();
        let kern = &self.kernels(&mut state, e)?.trsm;
        // SAFETY: argument indices and types match `trsm` in kernels.cl.
        unsafe {
            let set = |i: u32, v: &cl_int| kern.set_arg(i, v);
            let setm = |i: u32, v: &cl_mem| kern.set_arg(i, v);
            set(0, &ints[0])
                .and(set(1, &ints[1]))
                .and(set_real(kern, 2, e, alpha))
                .and(setm(3, &am))
                .and(set(4, &ints[2]))
                .and(set(5, &ints[3]))
                .and(set(6, &ints[4]))
                .and(set(7, &ints[5]))
                .and(setm(8, &bm))
                .and(set(9, &ints[6]))
                .and(set(10, &ints[7]))
        }
        .map_err(|e| self.backend_err(OP, e))?;
        let local = 64;
        self.launch(kern, &[nvec.div_ceil(local) * local], &[local])
    }

    fn potrf(&self, e: ElemType, uplo: Uplo, n: usize, a: &DeviceBuffer, lda: usize) -> Result<()> {
        const OP: &str = "potrf";
        let ab = self.buf(OP, a)?;
        args::potrf(n, lda, Self::elems(a, e))?;
        self.check_elem(e)?;
        if n == 0 {
            return Ok(());
        }
        let (nn, ld) = (int(OP, "n", n)?, int(OP, "lda", lda)?);
        let upper = cl_int::from(uplo == Uplo::Upper);
        let am = ab.buffer.get();
        let mut state = self.state.lock();
        if state.info.is_none() {
            // SAFETY: a one-int device buffer, no host pointer.
            let info = unsafe {
                Buffer::<cl_int>::create(&self.context, CL_MEM_READ_WRITE, 1, ptr::null_mut())
            }
            .map_err(|e| self.backend_err(OP, e))?;
            state.info = Some(info);
        }
        let info_mem = match &state.info {
            Some(b) => b.get(),
            None => return Err(self.backend_err(OP, "info buffer missing")),
        };
        let kernels = self.kernels(&mut state, e)?;
        let (kern, local) = (&kernels.potrf, kernels.potrf_local);
        // SAFETY: argument indices and types match `potrf` in kernels.cl.
        unsafe {
            kern.set_arg(0, &nn)
                .and(kern.set_arg(1, &am))
                .and(kern.set_arg(2, &ld))
                .and(kern.set_arg(3, &upper))
                .and(kern.set_arg(4, &info_mem))
        }
        .map_err(|e| self.backend_err(OP, e))?;
        self.launch(kern, &[local], &[local])?;
        let mut info: [cl_int; 1] = [0];
        // SAFETY: blocking read of one int into a live array, on the compute queue after the
        // kernel that wrote it.
        let ev = unsafe {
            enqueue_read_buffer(
                self.compute.get(),
                info_mem,
                CL_BLOCKING,
                0,
                std::mem::size_of::<cl_int>(),
                info.as_mut_ptr().cast(),
                0,
                ptr::null(),
            )
        }
        .map_err(|e| self.backend_err(OP, ClError(e)))?;
        drop(Event::new(ev));
        match usize::try_from(info[0]) {
            Ok(0) => Ok(()),
            Ok(col) => Err(DevicesError::NotPositiveDefinite { column: col - 1 }),
            Err(_) => Err(self.backend_err(OP, format!("kernel returned info {}", info[0]))),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.transfer
            .finish()
            .and(self.compute.finish())
            .map_err(|e| self.backend_err("synchronize", e))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn supports(&self, e: ElemType) -> bool {
        match e {
            ElemType::F32 => true,
            ElemType::F64 => self.fp64,
        }
    }

    fn mem_used(&self) -> u64 {
        self.mem.used()
    }
}

impl std::fmt::Debug for OpenClDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClDevice")
            .field("info", &self.info)
            .field("fp64", &self.fp64)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devtest;

    /// The OpenCL devices, or `None` (after printing why) when there are none. With
    /// `FLOTILLA_REQUIRE_OPENCL=1` (set in CI) a missing platform fails the test instead.
    /// The tests below build from source (no kernel cache); the cache has its own tests.
    fn devices(mem_limit: Option<u64>) -> Option<Vec<Arc<dyn Device>>> {
        let opts = DiscoverOptions {
            opencl: true,
            cuda: false,
            mem_limit,
        };
        let found = crate::discover_report_with(&opts, &KernelCacheDir::Off);
        if found.devices.is_empty() {
            let required = std::env::var("FLOTILLA_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "FLOTILLA_REQUIRE_OPENCL=1 but no OpenCL device: {:?}",
                found.skipped
            );
            eprintln!("skipping OpenCL test: {:?}", found.skipped);
            return None;
        }
        assert!(found
            .devices
            .iter()
            .all(|d| d.info().kind == DeviceKind::OpenCl));
        Some(found.devices)
    }

    /// Opens every OpenCL device afresh with its kernels cached in `cache`, or `None` when
    /// there is no OpenCL device (failing under `FLOTILLA_REQUIRE_OPENCL=1`, like `devices`).
    fn open_with_cache(cache: &std::path::Path) -> Option<Vec<OpenClDevice>> {
        let n = devices(None)?.len();
        let _one_at_a_time = DISCOVERY.lock();
        let mut out = Vec::new();
        for platform in opencl3::platform::get_platforms().expect("platforms") {
            for id in platform.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default() {
                let dir = KernelCacheDir::At(cache.to_path_buf());
                out.push(
                    OpenClDevice::with_kernel_cache(ClDevice::new(id), None, &dir).expect("open"),
                );
            }
        }
        assert_eq!(out.len(), n);
        Some(out)
    }

    fn origins(dev: &OpenClDevice) -> Vec<Option<CacheOutcome>> {
        let mut v = vec![dev.kernel_origin(ElemType::F32)];
        if dev.supports(ElemType::F64) {
            v.push(dev.kernel_origin(ElemType::F64));
        }
        v
    }

    fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.map(|e| e.expect("entry").path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn opencl_second_device_builds_from_the_kernel_cache() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("kernels");
        let Some(cold) = open_with_cache(&dir) else {
            return;
        };
        for dev in &cold {
            assert_eq!(
                dev.kernel_cache().map(KernelCache::dir),
                Some(dir.as_path())
            );
            assert_eq!(dev.kernel_origin(ElemType::F32), None, "built on first use");
            devtest::blas_matches_cpu(dev);
            assert!(
                origins(dev)
                    .iter()
                    .all(|o| *o == Some(CacheOutcome::Stored)),
                "{:?}",
                origins(dev)
            );
        }
        let stored = entries(&dir);
        let kinds: usize = cold.iter().map(|d| origins(d).len()).sum();
        assert_eq!(stored.len(), kinds, "{stored:?}");
        drop(cold);
        let Some(warm) = open_with_cache(&dir) else {
            return;
        };
        for dev in &warm {
            devtest::blas_matches_cpu(dev);
            devtest::tiled_cholesky_on_device(dev);
            assert!(
                origins(dev).iter().all(|o| *o == Some(CacheOutcome::Hit)),
                "{:?}",
                origins(dev)
            );
        }
        assert_eq!(entries(&dir), stored, "a hit writes nothing");
    }

    #[test]
    fn opencl_discovery_uses_the_kernel_cache_it_is_given() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let opts = DiscoverOptions {
            opencl: true,
            cuda: false,
            mem_limit: None,
        };
        let cache = KernelCacheDir::At(tmp.path().to_path_buf());
        let found = crate::discover_report_with(&opts, &cache);
        if devices(None).is_none() {
            return;
        }
        for dev in &found.devices {
            devtest::blas_matches_cpu(dev.as_ref());
        }
        assert!(!entries(tmp.path()).is_empty(), "no kernel stored");
    }

    #[test]
    fn opencl_rejected_cached_binary_is_rebuilt_from_source() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("kernels");
        let Some(devs) = open_with_cache(&dir) else {
            return;
        };
        let cache = KernelCache::new(&dir);
        for dev in &devs {
            // A well-formed entry whose payload is no program binary.
            let key = dev.cache_key("");
            let garbage = b"not a program binary".repeat(64);
            cache.store(&key, &garbage).expect("store");
            devtest::blas_matches_cpu(dev);
            assert_eq!(dev.kernel_origin(ElemType::F32), Some(CacheOutcome::Stored));
            let replaced = cache.load(&key).expect("entry");
            assert_ne!(replaced, garbage);
        }
        drop(devs);
        let Some(devs) = open_with_cache(&dir) else {
            return;
        };
        for dev in &devs {
            devtest::blas_matches_cpu(dev);
            assert_eq!(dev.kernel_origin(ElemType::F32), Some(CacheOutcome::Hit));
        }
    }

    #[test]
    fn opencl_unwritable_kernel_cache_still_builds() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"x").expect("file");
        let Some(devs) = open_with_cache(&file.join("kernels")) else {
            return;
        };
        for dev in &devs {
            devtest::blas_matches_cpu(dev);
            assert!(
                origins(dev)
                    .iter()
                    .all(|o| *o == Some(CacheOutcome::NotStored)),
                "{:?}",
                origins(dev)
            );
        }
    }

    /// Device creation plus the first f32 (and f64) gemm, with a cold and a warm kernel
    /// cache; run with `cargo test --release -p flotilla-devices -- --ignored --nocapture
    /// opencl_kernel_cache_timing` (and `POCL_KERNEL_CACHE=0` to switch PoCL's own cache off).
    #[test]
    #[ignore = "timing, not a check"]
    fn opencl_kernel_cache_timing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("kernels");
        for round in ["cold", "warm", "warm"] {
            let t = std::time::Instant::now();
            let Some(devs) = open_with_cache(&dir) else {
                return;
            };
            for dev in &devs {
                for e in [ElemType::F32, ElemType::F64] {
                    if dev.supports(e) {
                        let n = 4 * e.size_of();
                        let (a, b, c) = (dev.alloc(n), dev.alloc(n), dev.alloc(n));
                        let (a, b, c) = (a.expect("alloc"), b.expect("alloc"), c.expect("alloc"));
                        dev.gemm(
                            e,
                            Trans::No,
                            Trans::No,
                            2,
                            2,
                            2,
                            1.0,
                            &a,
                            2,
                            &b,
                            2,
                            0.0,
                            &c,
                            2,
                        )
                        .expect("gemm");
                    }
                }
                println!(
                    "{round}: {} opened and first gemms in {:.3} s ({:?})",
                    dev.info().name,
                    t.elapsed().as_secs_f64(),
                    origins(dev)
                );
            }
        }
    }

    #[test]
    fn opencl_kernels_match_cpu_kernels() {
        let Some(devs) = devices(None) else { return };
        for dev in devs {
            devtest::blas_matches_cpu(dev.as_ref());
        }
    }

    #[test]
    fn opencl_tiled_cholesky_residual_is_tiny() {
        let Some(devs) = devices(None) else { return };
        for dev in devs {
            devtest::tiled_cholesky_on_device(dev.as_ref());
        }
    }

    /// Kernel times on 512 tiles; run with
    /// `cargo test --release -p flotilla-devices -- --ignored --nocapture opencl_kernel_throughput`.
    #[test]
    #[ignore = "timing, not a check"]
    fn opencl_kernel_throughput() {
        let Some(devs) = devices(None) else { return };
        let nb = 512;
        let e = ElemType::F64;
        for dev in devs.iter().filter(|d| d.supports(e)) {
            let bytes = nb * nb * 8;
            let (a, b, c) = (dev.alloc(bytes), dev.alloc(bytes), dev.alloc(bytes));
            let (a, b, c) = (a.expect("alloc"), b.expect("alloc"), c.expect("alloc"));
            let mut r = crate::testutil::rng(17);
            let spd = crate::testutil::spd(&mut r, nb);
            let spd_bytes = crate::testutil::to_bytes(&spd);
            dev.upload(&a, &spd_bytes).expect("upload");
            dev.upload(&b, &spd_bytes).expect("upload");
            let time = |name: &str, flops: f64, f: &dyn Fn()| {
                f();
                let t = std::time::Instant::now();
                f();
                let s = t.elapsed().as_secs_f64();
                println!("{name}: {:.1} GFLOP/s ({:.1} ms)", flops / s / 1e9, s * 1e3);
            };
            let n3 = (nb * nb * nb) as f64;
            let (no, yes) = (Trans::No, Trans::Yes);
            time("opencl dgemm NT 512", 2.0 * n3, &|| {
                dev.gemm(e, no, yes, nb, nb, nb, 1.0, &a, nb, &b, nb, 0.0, &c, nb)
                    .expect("gemm");
            });
            time("opencl dsyrk LN 512", n3, &|| {
                dev.syrk(e, Uplo::Lower, no, nb, nb, 1.0, &a, nb, 0.0, &c, nb)
                    .expect("syrk");
            });
            time("opencl dtrsm RLTN 512", n3, &|| {
                dev.trsm(
                    e,
                    Side::Right,
                    Uplo::Lower,
                    yes,
                    Diag::NonUnit,
                    nb,
                    nb,
                    1.0,
                    &a,
                    nb,
                    &c,
                    nb,
                )
                .expect("trsm");
            });
            time("opencl dpotrf L 512", n3 / 3.0, &|| {
                dev.upload(&c, &spd_bytes).expect("upload");
                dev.potrf(e, Uplo::Lower, nb, &c, nb).expect("potrf");
            });
        }
    }

    #[test]
    fn opencl_alloc_reports_out_of_memory() {
        let Some(devs) = devices(Some(1000)) else {
            return;
        };
        for dev in devs {
            devtest::out_of_memory_at_limit_1000(dev.as_ref());
        }
        let Some(devs) = devices(None) else { return };
        for dev in devs {
            let too_big = usize::try_from(dev.info().global_mem + 1).unwrap_or(usize::MAX);
            let err = dev.alloc(too_big).expect_err("larger than the device");
            assert!(matches!(err, DevicesError::OutOfMemory { .. }), "{err:?}");
        }
    }

    #[test]
    fn opencl_bad_arguments_are_errors() {
        let Some(devs) = devices(None) else { return };
        let Some(others) = devices(None) else { return };
        for (dev, other) in devs.iter().zip(&others) {
            devtest::bad_arguments_are_errors(dev.as_ref(), other.as_ref());
        }
    }

    #[test]
    fn opencl_transfer_overlaps_compute_from_two_threads() {
        let Some(devs) = devices(None) else { return };
        for dev in &devs {
            devtest::transfer_overlaps_compute(dev);
        }
    }
}
