//! flotilla-devices: Flotilla's device backends behind one trait, and the kernel library.
//!
//! It owns everything that touches an accelerator: finding devices ([`discover`]), device
//! memory ([`DeviceBuffer`], freed on drop), blocking transfers on a transfer queue or stream,
//! and BLAS-like kernels (`gemm`, `syrk`, `trsm`, `potrf`, column-major) on a compute queue
//! or stream, so the runtime can overlap a copy with a kernel from two threads. It is separate
//! from the runtime so that the scheduler and data manager never see an OpenCL or CUDA type,
//! and so the backends can be tested on their own.
//!
//! Backends:
//! - [`cpu::kernels`]: single-threaded kernels on host slices (faer), used by the runtime's
//!   CPU workers (one task per core) and as the reference for the device backends;
//! - `opencl` (feature `opencl`, opencl3, loads `libOpenCL` at run time): every OpenCL device,
//!   kernels compiled from OpenCL C source at run time, the program binaries kept in the
//!   [`kernel_cache`];
//! - `cuda` (feature `cuda`, cudarc with dynamic loading): every CUDA GPU, cuBLAS and
//!   cuSOLVER, device memory recycled through a [`pool`]. The driver library is probed before
//!   any cudarc call, so a machine without CUDA reports `"no CUDA driver"` instead of
//!   panicking;
//! - [`cpu::HostDevice`]: the CPU kernels behind the [`Device`] trait on separate host
//!   memory (also through a [`pool`]), a memory node for tests that need no accelerator (not
//!   returned by [`discover`]).
//!
//! Shared by the backends:
//! - [`kernel_cache`]: a disk cache of compiled kernels, keyed by a hash of backend, device,
//!   driver version, options and source, in `$FLOTILLA_HOME/kernels` unless
//!   [`discover_report_with`] names another folder ([`KernelCacheDir`]);
//! - [`pool`]: a caching allocator (size classes, per-class free lists, trim and retry on out
//!   of memory) over a device's raw malloc and free.
//!
//! # Example
//!
//! ```
//! use flotilla_devices::{discover_report_with, DiscoverOptions, ElemType, KernelCacheDir, Trans};
//!
//! // `discover_report` does the same with the kernel cache in `$FLOTILLA_HOME/kernels`.
//! # let tmp = tempfile::tempdir().expect("temporary folder");
//! # let kernel_dir = tmp.path().to_path_buf();
//! let cache = KernelCacheDir::At(kernel_dir);
//! let found = discover_report_with(&DiscoverOptions::default(), &cache);
//! for reason in &found.skipped {
//!     println!("skipped: {reason}");
//! }
//! for dev in &found.devices {
//!     if !dev.supports(ElemType::F64) {
//!         continue;
//!     }
//!     // C := A * B for 2x2 f64 matrices, column-major.
//!     let to_bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
//!     let a = dev.alloc(32)?;
//!     let b = dev.alloc(32)?;
//!     let c = dev.alloc(32)?;
//!     dev.upload(&a, &to_bytes(&[1.0, 0.0, 0.0, 1.0]))?;
//!     dev.upload(&b, &to_bytes(&[1.0, 2.0, 3.0, 4.0]))?;
//!     dev.gemm(ElemType::F64, Trans::No, Trans::No, 2, 2, 2, 1.0, &a, 2, &b, 2, 0.0, &c, 2)?;
//!     let mut out = vec![0u8; 32];
//!     dev.download(&c, &mut out)?;
//!     assert_eq!(out, to_bytes(&[1.0, 2.0, 3.0, 4.0]));
//! }
//! # Ok::<(), flotilla_devices::DevicesError>(())
//! ```

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) mod args;
pub mod cpu;
#[cfg(test)]
mod devtest;
mod error;
pub mod kernel_cache;
pub mod pool;
#[cfg(test)]
mod testutil;
pub mod topology;

// The one place where backends are switched on or off. A disabled backend is replaced by a
// stub whose discovery only records why it is absent.
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
mod cuda {
    pub(crate) fn discover_into(
        _opts: &crate::DiscoverOptions,
        _kernel_cache: &crate::KernelCacheDir,
        found: &mut crate::Discovery,
    ) {
        found
            .skipped
            .push("cuda backend not compiled in (feature `cuda` is off)".to_string());
    }
}
#[cfg(feature = "opencl")]
pub mod opencl;
#[cfg(not(feature = "opencl"))]
mod opencl {
    pub(crate) fn discover_into(
        _opts: &crate::DiscoverOptions,
        _kernel_cache: &crate::KernelCacheDir,
        found: &mut crate::Discovery,
    ) {
        found
            .skipped
            .push("opencl backend not compiled in (feature `opencl` is off)".to_string());
    }
}

pub use cpu::kernels::Scalar;
pub use error::{DevicesError, Result};
pub use kernel_cache::KernelCacheDir;

/// The kind of a device (and of a codelet implementation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// Host cores.
    Cpu,
    /// An OpenCL device.
    OpenCl,
    /// A CUDA GPU.
    Cuda,
}

impl DeviceKind {
    /// The lowercase name: `"cpu"`, `"opencl"` or `"cuda"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::OpenCl => "opencl",
            DeviceKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The element type of a kernel's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
}

impl ElemType {
    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            ElemType::F32 => 4,
            ElemType::F64 => 8,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
        })
    }
}

/// How an f32 matrix product reads its inputs; products are always accumulated in f32.
///
/// The mixed modes are what tensor cores compute: each input is rounded to a narrower
/// format (round to nearest, ties to even), the products of two rounded values are exact in
/// f32, and the sums are f32 sums. The CPU and OpenCL backends compute exactly that (they
/// round the inputs, then multiply in f32), so a mixed-precision run can be checked, and
/// its error measured, on any machine; CUDA uses cuBLAS's `CUBLAS_COMPUTE_32F_FAST_TF32` /
/// `CUBLAS_COMPUTE_32F_FAST_16BF` on the same f32 buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum MathMode {
    /// Full f32 inputs (24-bit significands).
    #[default]
    F32,
    /// Inputs rounded to TF32: f32's 8-bit exponent, 10 explicit significand bits.
    Tf32,
    /// Inputs rounded to bfloat16: f32's 8-bit exponent, 7 explicit significand bits.
    Bf16,
}

impl MathMode {
    /// Every mode, narrowest last.
    pub const ALL: [MathMode; 3] = [MathMode::F32, MathMode::Tf32, MathMode::Bf16];

    /// The lowercase name: `"f32"`, `"tf32"` or `"bf16"`.
    pub fn as_str(self) -> &'static str {
        match self {
            MathMode::F32 => "f32",
            MathMode::Tf32 => "tf32",
            MathMode::Bf16 => "bf16",
        }
    }

    /// Explicit significand bits of the input format.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            MathMode::F32 => 23,
            MathMode::Tf32 => 10,
            MathMode::Bf16 => 7,
        }
    }

    /// The unit roundoff of the input format, `2^-(mantissa_bits + 1)`.
    pub fn unit_roundoff(self) -> f64 {
        (-f64::from(self.mantissa_bits() + 1)).exp2()
    }

    /// `x` rounded to this mode's input format (to nearest, ties to even), as an f32.
    /// Infinities and NaNs are kept; a value that rounds past f32's largest becomes
    /// infinite, as the hardware conversion does.
    pub fn round(self, x: f32) -> f32 {
        let drop = 23 - self.mantissa_bits();
        if drop == 0 || !x.is_finite() {
            return x;
        }
        let u = x.to_bits();
        let lsb = (u >> drop) & 1;
        let half = 1u32 << (drop - 1);
        let rounded = u.wrapping_add(half - 1 + lsb) & !((1u32 << drop) - 1);
        f32::from_bits(rounded)
    }
}

impl fmt::Display for MathMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for MathMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        MathMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown math mode {s:?} (expected f32, tf32 or bf16)"))
    }
}

/// Whether an operand is used as stored or transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trans {
    /// `op(X) = X`.
    No,
    /// `op(X) = Xᵀ`.
    Yes,
}

/// Which triangle of a matrix is referenced or updated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Uplo {
    /// The lower triangle (with the diagonal).
    Lower,
    /// The upper triangle (with the diagonal).
    Upper,
}

impl Uplo {
    /// The other triangle.
    pub fn flip(self) -> Uplo {
        match self {
            Uplo::Lower => Uplo::Upper,
            Uplo::Upper => Uplo::Lower,
        }
    }
}

/// On which side the triangular matrix of `trsm` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Solve `op(A) X = alpha B`.
    Left,
    /// Solve `X op(A) = alpha B`.
    Right,
}

/// Whether a triangular matrix has an implicit unit diagonal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Diag {
    /// The diagonal is read from the matrix.
    NonUnit,
    /// The diagonal is taken as all ones and not read.
    Unit,
}

/// What a device is, for logs and for the performance model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The backend.
    pub kind: DeviceKind,
    /// The device's name as the driver reports it.
    pub name: String,
    /// The vendor as the driver reports it.
    pub vendor: String,
    /// Usable device memory in bytes (the driver's figure, or the limit set in
    /// [`DiscoverOptions::mem_limit`] if lower); allocations beyond it fail with
    /// [`DevicesError::OutOfMemory`].
    pub global_mem: u64,
    /// Compute units (OpenCL) or streaming multiprocessors (CUDA).
    pub compute_units: u32,
    /// The performance-model key: `"opencl:<device name>"` or `"cuda:<device name>"`.
    pub arch: String,
    /// Where the device sits (PCI address, NUMA node, host link), when known: CUDA GPUs
    /// on Linux; `None` for OpenCL devices and the host device.
    pub topology: Option<topology::Topology>,
}

/// Memory owned by one device; freed when dropped.
///
/// The contents are bytes; kernels interpret them as column-major `f32` or `f64` matrices.
/// A buffer may only be passed to the device that allocated it.
pub struct DeviceBuffer {
    len: usize,
    device_uid: u64,
    inner: Box<dyn Any + Send + Sync>,
}

impl DeviceBuffer {
    /// Wraps a backend allocation. `inner` frees the memory (and its accounting) on drop.
    pub(crate) fn new(len: usize, device_uid: u64, inner: impl Any + Send + Sync) -> Self {
        DeviceBuffer {
            len,
            device_uid,
            inner: Box::new(inner),
        }
    }

    /// Size in bytes, as requested from [`Device::alloc`].
    pub fn len_bytes(&self) -> usize {
        self.len
    }

    /// The backend allocation, if this buffer belongs to the device `device_uid` and has
    /// the backend type `T`.
    pub(crate) fn inner_for<T: Any>(&self, op: &'static str, device_uid: u64) -> Result<&T> {
        if self.device_uid != device_uid {
            return Err(DevicesError::bad_args(
                op,
                "buffer was allocated by another device",
            ));
        }
        self.inner
            .downcast_ref::<T>()
            .ok_or_else(|| DevicesError::bad_args(op, "buffer has another backend's type"))
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("len", &self.len)
            .field("device_uid", &self.device_uid)
            .finish_non_exhaustive()
    }
}

/// Host memory page-locked ("pinned") by a device's driver, so copies to and from it run
/// at the link's full speed by DMA instead of through the driver's own staging buffers.
/// The memory is unpinned when this is dropped.
pub struct HostPin {
    len: usize,
    _inner: Box<dyn Any + Send + Sync>,
}

impl HostPin {
    /// Wraps a backend registration; dropping `inner` unregisters the memory.
    pub(crate) fn new(len: usize, inner: impl Any + Send + Sync) -> Self {
        HostPin {
            len,
            _inner: Box::new(inner),
        }
    }

    /// Bytes pinned.
    pub fn len_bytes(&self) -> usize {
        self.len
    }
}

impl fmt::Debug for HostPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostPin")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// One accelerator: memory, transfers, and BLAS-like kernels.
///
/// Matrices are column-major with a leading dimension (`ld ≥ rows`), in buffers of this
/// device. Every call is blocking: when it returns, the work is complete. Transfers use a
/// queue/stream separate from the kernels', so one thread may copy while another computes.
/// Kernel calls are serialised on the compute queue.
pub trait Device: Send + Sync {
    /// What this device is.
    fn info(&self) -> &DeviceInfo;

    /// Allocates `bytes` bytes of device memory (contents unspecified).
    /// Fails with [`DevicesError::OutOfMemory`] when the device's memory is full.
    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer>;

    /// Copies `src` into the start of `dst` (`src.len() ≤ dst.len_bytes()`), blocking.
    fn upload(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<()> {
        self.upload_at(dst, 0, src)
    }

    /// Copies the start of `src` into `dst` (`dst.len() ≤ src.len_bytes()`), blocking.
    fn download(&self, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        self.download_at(src, 0, dst)
    }

    /// Copies `src` into `dst` from byte `offset` on (`offset + src.len() ≤
    /// dst.len_bytes()`), blocking.
    fn upload_at(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()>;

    /// Copies bytes `offset..offset + dst.len()` of `src` into `dst`, blocking.
    fn download_at(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// `C := alpha op(A) op(B) + beta C` with `op(A)` m×k, `op(B)` k×n, C m×n.
    /// When `beta` is 0, C is not read.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        e: ElemType,
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
        self.gemm_mode(
            e,
            MathMode::F32,
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            a,
            lda,
            b,
            ldb,
            beta,
            c,
            ldc,
        )
    }

    /// [`Device::gemm`] on f32 matrices with the inputs read in `mode` ([`MathMode`]):
    /// `op(A)` and `op(B)` rounded to TF32 or bf16, products accumulated in f32. With
    /// [`MathMode::F32`] it is `gemm(ElemType::F32, ...)`.
    #[allow(clippy::too_many_arguments)]
    fn gemm_mixed(
        &self,
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
        self.gemm_mode(
            ElemType::F32,
            mode,
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            a,
            lda,
            b,
            ldb,
            beta,
            c,
            ldc,
        )
    }

    /// The product behind [`Device::gemm`] and [`Device::gemm_mixed`], the one a backend
    /// implements: element type `e`, and for f32 the mode its inputs are read in (f64 takes
    /// only [`MathMode::F32`]; anything else is `BadArgs`).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;

    /// `C := alpha A Aᵀ + beta C` (`t = No`, A n×k) or `C := alpha Aᵀ A + beta C`
    /// (`t = Yes`, A k×n); only the `uplo` triangle of the n×n matrix C is updated.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;

    /// Solves `op(A) X = alpha B` (left) or `X op(A) = alpha B` (right) for X, overwriting
    /// the m×n matrix B; A is triangular (`uplo`, `diag`), m×m on the left, n×n on the right.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;

    /// Cholesky factorisation in place: `A = L Lᵀ` (lower) or `A = Uᵀ U` (upper), reading
    /// and writing only the `uplo` triangle of the n×n matrix A.
    /// Fails with [`DevicesError::NotPositiveDefinite`] on a non-positive pivot.
    fn potrf(&self, e: ElemType, uplo: Uplo, n: usize, a: &DeviceBuffer, lda: usize) -> Result<()>;

    /// Waits until all work submitted to this device has completed.
    fn synchronize(&self) -> Result<()>;

    /// This device as `Any`, so a backend can recognise a device of its own kind (for
    /// [`Device::copy_to_peer`]).
    fn as_any(&self) -> &dyn Any;

    /// Whether [`Device::copy_to_peer`] copies from this device's memory into `dst`'s
    /// directly (a peer-to-peer link), without going through host memory. False unless
    /// the backend knows a direct path.
    fn can_copy_to_peer(&self, dst: &dyn Device) -> bool {
        let _ = dst;
        false
    }

    /// Copies the first `bytes` bytes of `src` (a buffer of this device) into `dst_buf`, a
    /// buffer of `dst`, over a direct link; blocking. Fails with `Unsupported` when
    /// [`Device::can_copy_to_peer`] is false.
    fn copy_to_peer(
        &self,
        src: &DeviceBuffer,
        dst: &dyn Device,
        dst_buf: &DeviceBuffer,
        bytes: usize,
    ) -> Result<()> {
        let _ = (src, dst_buf, bytes);
        Err(DevicesError::Unsupported {
            device: self.info().name.clone(),
            what: format!("peer-to-peer copy to {}", dst.info().name),
        })
    }

    /// Page-locks the host memory `[ptr, ptr + len)` for this device's transfers (CUDA:
    /// `cuMemHostRegister`, portable to every context), or `None` where the backend gains
    /// nothing from it (CPU, OpenCL). The memory stays pinned until the pin is dropped.
    ///
    /// # Safety
    /// The memory must stay allocated, and must not move, until the returned pin is
    /// dropped.
    unsafe fn pin_host_memory(&self, ptr: *const u8, len: usize) -> Result<Option<HostPin>> {
        let _ = (ptr, len);
        Ok(None)
    }

    /// Whether kernels of element type `e` can run here.
    fn supports(&self, e: ElemType) -> bool;

    /// Bytes currently allocated through [`Device::alloc`] and not yet freed.
    fn mem_used(&self) -> u64;
}

/// What [`discover`] looks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// Look for OpenCL devices (all platforms, all device types).
    pub opencl: bool,
    /// Look for CUDA GPUs.
    pub cuda: bool,
    /// Cap each device's usable memory at this many bytes (to exercise eviction on a small
    /// budget); `None` uses what the driver reports.
    pub mem_limit: Option<u64>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            opencl: true,
            cuda: true,
            mem_limit: None,
        }
    }
}

/// The outcome of discovery: the devices found and why others were not.
#[derive(Default)]
pub struct Discovery {
    /// Usable devices, OpenCL first, then CUDA.
    pub devices: Vec<Arc<dyn Device>>,
    /// One line per backend, platform or device that was skipped, e.g. `"no CUDA driver"`,
    /// `"no OpenCL platform"`.
    pub skipped: Vec<String>,
}

impl fmt::Debug for Discovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let infos: Vec<&DeviceInfo> = self.devices.iter().map(|d| d.info()).collect();
        f.debug_struct("Discovery")
            .field("devices", &infos)
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Finds every OpenCL device and every CUDA GPU. Never panics: a backend that is missing
/// or fails is skipped, with the reason in [`Discovery::skipped`]. OpenCL kernels are cached
/// in `$FLOTILLA_HOME/kernels` ([`KernelCacheDir::Default`]).
pub fn discover_report(opts: &DiscoverOptions) -> Discovery {
    discover_report_with(opts, &KernelCacheDir::Default)
}

/// [`discover_report`] with the compiled kernels cached in `kernel_cache`.
pub fn discover_report_with(opts: &DiscoverOptions, kernel_cache: &KernelCacheDir) -> Discovery {
    let mut found = Discovery::default();
    if opts.opencl {
        guarded("opencl", &mut found, |found| {
            opencl::discover_into(opts, kernel_cache, found)
        });
    }
    if opts.cuda {
        guarded("cuda", &mut found, |found| {
            cuda::discover_into(opts, kernel_cache, found)
        });
    }
    found
}

/// [`discover_report`] without the skip reasons.
pub fn discover(opts: &DiscoverOptions) -> Vec<Arc<dyn Device>> {
    discover_report(opts).devices
}

/// Runs one backend's discovery, turning a panic inside a driver binding into a skip reason.
fn guarded(backend: &str, found: &mut Discovery, f: impl FnOnce(&mut Discovery)) {
    let mut local = Discovery::default();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut local)));
    match outcome {
        Ok(()) => {
            found.devices.append(&mut local.devices);
            found.skipped.append(&mut local.skipped);
        }
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            found
                .skipped
                .push(format!("{backend} discovery panicked: {msg}"));
        }
    }
}

/// Fails with `BadArgs` unless bytes `offset..offset + len` lie inside a buffer of
/// `capacity` bytes.
pub(crate) fn copy_range(
    op: &'static str,
    offset: usize,
    len: usize,
    capacity: usize,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(DevicesError::bad_args(
            op,
            format!("bytes {offset}..{offset}+{len} of a buffer of {capacity}"),
        )),
    }
}

/// Fails with `BadArgs` if the output buffer `out` is also one of the `inputs`.
pub(crate) fn no_alias(
    op: &'static str,
    out: &DeviceBuffer,
    inputs: &[&DeviceBuffer],
) -> Result<()> {
    if inputs.iter().any(|i| std::ptr::eq(*i, out)) {
        return Err(DevicesError::bad_args(
            op,
            "the output buffer is also an input",
        ));
    }
    Ok(())
}

/// A process-wide unique id for each device instance, so a buffer of one device is never
/// used by another.
pub(crate) fn next_device_uid() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Byte accounting of one device's allocations against its capacity.
#[derive(Debug)]
pub(crate) struct MemAccount {
    device: String,
    limit: u64,
    used: AtomicU64,
}

impl MemAccount {
    pub(crate) fn new(device: String, limit: u64) -> Arc<Self> {
        Arc::new(MemAccount {
            device,
            limit,
            used: AtomicU64::new(0),
        })
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Reserves `bytes`, or fails with `OutOfMemory` when they would exceed the limit.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            let next = cur.checked_add(bytes).filter(|&n| n <= self.limit);
            let Some(next) = next else {
                return Err(self.oom(bytes));
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Reservation {
                        account: Arc::clone(self),
                        bytes,
                    })
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// The `OutOfMemory` error for a request of `bytes`.
    pub(crate) fn oom(&self, bytes: u64) -> DevicesError {
        DevicesError::OutOfMemory {
            device: self.device.clone(),
            requested: bytes,
            available: self.limit.saturating_sub(self.used()),
        }
    }
}

/// Bytes held in a [`MemAccount`]; given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    account: Arc<MemAccount>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.account.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_and_devices_cross_threads() {
        fn send_sync<T: Send + Sync + ?Sized>() {}
        send_sync::<DeviceBuffer>();
        send_sync::<dyn Device>();
        send_sync::<Discovery>();
    }

    #[test]
    fn kinds_display_lowercase() {
        assert_eq!(DeviceKind::Cpu.to_string(), "cpu");
        assert_eq!(DeviceKind::OpenCl.to_string(), "opencl");
        assert_eq!(DeviceKind::Cuda.to_string(), "cuda");
        assert_eq!(ElemType::F32.size_of(), 4);
        assert_eq!(ElemType::F64.size_of(), 8);
    }

    #[test]
    fn math_mode_rounds_to_nearest_even_and_parses() {
        // bf16 keeps 7 explicit bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 → 1 (even).
        assert_eq!(MathMode::Bf16.round(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 → 1 + 2^-6 (even).
        assert_eq!(
            MathMode::Bf16.round(1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2f32.powi(-6)
        );
        assert_eq!(
            MathMode::Bf16.round(1.0 + 2f32.powi(-7)),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(MathMode::Tf32.round(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(
            MathMode::Tf32.round(1.0 + 2f32.powi(-10)),
            1.0 + 2f32.powi(-10)
        );
        assert_eq!(MathMode::Tf32.round(-3.0), -3.0);
        assert_eq!(MathMode::F32.round(0.1), 0.1);
        assert!(MathMode::Bf16.round(f32::NAN).is_nan());
        assert_eq!(MathMode::Bf16.round(f32::MAX), f32::INFINITY);
        assert_eq!(MathMode::Bf16.round(f32::NEG_INFINITY), f32::NEG_INFINITY);
        // The rounding error is within the unit roundoff for random values.
        let mut x = 0.7311f32;
        for _ in 0..1000 {
            x = (x * 3.7 + 0.13).fract() * 100.0 - 50.0;
            for m in MathMode::ALL {
                let r = m.round(x);
                let rel = ((r - x) / x).abs() as f64;
                assert!(rel <= m.unit_roundoff() * 1.0000001, "{m} {x} → {r}: {rel}");
            }
        }
        for m in MathMode::ALL {
            assert_eq!(m.to_string().parse::<MathMode>(), Ok(m));
        }
        assert!("fp8".parse::<MathMode>().is_err());
    }

    /// The nearest value with `mantissa_bits` explicit bits (ties to even), computed in
    /// f64 arithmetic, independently of the bit trick in `MathMode::round`.
    fn reference_round(x: f32, mantissa_bits: u32) -> f32 {
        if x == 0.0 || !x.is_finite() {
            return x;
        }
        let v = f64::from(x).abs();
        let e = v.log2().floor().max(-126.0);
        let ulp = (e - f64::from(mantissa_bits)).exp2();
        let q = v / ulp;
        let mut r = q.round();
        if (q - q.floor() - 0.5).abs() < 1e-12 && r % 2.0 != 0.0 {
            r -= 1.0; // a tie goes to the even neighbour
        }
        let out = (r * ulp).copysign(f64::from(x));
        if out.abs() > f64::from(f32::MAX) {
            f32::INFINITY.copysign(x)
        } else {
            out as f32
        }
    }

    proptest::proptest! {
        #[test]
        fn math_mode_round_matches_a_reference(bits in proptest::prelude::any::<u32>()) {
            let x = f32::from_bits(bits);
            for m in MathMode::ALL {
                let got = m.round(x);
                let want = reference_round(x, m.mantissa_bits());
                proptest::prop_assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{m} {x:e} ({bits:#010x}): {got:e} vs {want:e}"
                );
            }
        }
    }

    #[test]
    fn mem_account_refuses_past_limit_and_frees_on_drop() {
        let acc = MemAccount::new("dev".into(), 100);
        let r1 = acc.reserve(60).expect("fits");
        let err = acc.reserve(50).expect_err("over the limit");
        assert_eq!(
            err,
            DevicesError::OutOfMemory {
                device: "dev".into(),
                requested: 50,
                available: 40
            }
        );
        drop(r1);
        assert_eq!(acc.used(), 0);
        let _r2 = acc.reserve(100).expect("fits after free");
        assert!(acc.reserve(u64::MAX).is_err());
    }

    #[test]
    fn discovery_without_backends_is_empty() {
        let found = discover_report(&DiscoverOptions {
            opencl: false,
            cuda: false,
            mem_limit: None,
        });
        assert!(found.devices.is_empty());
        assert!(found.skipped.is_empty());
    }
}
