//! The CPU backend: kernels on host memory.
//!
//! The runtime's CPU workers call [`kernels`] directly on the host copies of their data, one
//! task per core, so every kernel here is single-threaded.
//!
//! [`HostDevice`] puts the same kernels behind the [`Device`] trait, on its own memory: a
//! second memory node that needs no accelerator, so the runtime's data manager (transfers,
//! coherence, eviction under [`HostDevice::new`]'s memory limit) can be exercised anywhere.
//! Its memory goes through a [`MemPool`], as the CUDA backend's does, so the pool's use by a
//! device (accounting against the limit, reuse, trimming) is tested without a GPU.

pub mod kernels;

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::pool::{MemPool, PoolBlock, PoolStats, RawAlloc};
use crate::{
    no_alias, Device, DeviceBuffer, DeviceInfo, DeviceKind, DevicesError, Diag, ElemType, HostPin,
    MathMode, MemAccount, Reservation, Result, Side, Trans, Uplo,
};

/// Host memory in 8-byte words, so the bytes can be viewed as `f32` or `f64` without
/// misalignment.
struct HostRaw;

impl RawAlloc for HostRaw {
    type Block = RwLock<Vec<u64>>;

    fn alloc(&self, bytes: usize) -> Result<Self::Block> {
        Ok(RwLock::new(vec![0u64; bytes.div_ceil(8)]))
    }

    fn free(&self, block: Self::Block) {
        drop(block);
    }
}

/// The backend part of a [`DeviceBuffer`] of a [`HostDevice`]: a pooled block of words (at
/// least the buffer's length) and the buffer's share of the memory limit.
struct HostBuffer {
    block: PoolBlock<HostRaw>,
    _reservation: Reservation,
}

impl HostBuffer {
    fn words(&self) -> &RwLock<Vec<u64>> {
        self.block.get()
    }
}

/// A device whose memory is ordinary host memory and whose kernels are [`kernels`].
///
/// Kernel calls are serialised (like a device's in-order compute queue), which also rules out
/// lock-order cycles between the buffers they lock.
pub struct HostDevice {
    info: DeviceInfo,
    uid: u64,
    mem: Arc<MemAccount>,
    pool: Arc<MemPool<HostRaw>>,
    compute: Mutex<()>,
    /// Host ranges "pinned" through [`Device::pin_host_memory`] (nothing is page-locked:
    /// the ranges are recorded so tests can see what a CUDA device would have pinned).
    pinned: Arc<Mutex<Vec<(usize, usize)>>>,
}

/// A [`HostDevice`] pin: removes its range from the device's list when dropped.
struct HostDevicePin {
    range: (usize, usize),
    pinned: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl Drop for HostDevicePin {
    fn drop(&mut self) {
        let mut p = self.pinned.lock();
        if let Some(i) = p.iter().position(|r| *r == self.range) {
            p.swap_remove(i);
        }
    }
}

impl HostDevice {
    /// A host device that allocates at most `mem_limit` bytes.
    pub fn new(mem_limit: u64) -> Self {
        let name = "host".to_string();
        HostDevice {
            info: DeviceInfo {
                kind: DeviceKind::Cpu,
                name: name.clone(),
                vendor: String::new(),
                global_mem: mem_limit,
                compute_units: 1,
                arch: "cpu:host".to_string(),
                topology: None,
            },
            uid: crate::next_device_uid(),
            mem: MemAccount::new(name.clone(), mem_limit),
            pool: MemPool::with_soft_cap(name, HostRaw, mem_limit),
            compute: Mutex::new(()),
            pinned: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The host ranges `(address, bytes)` pinned through this device and not yet unpinned.
    pub fn pinned_ranges(&self) -> Vec<(usize, usize)> {
        self.pinned.lock().clone()
    }

    /// The counters of the memory pool behind [`Device::alloc`].
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Frees the memory the pool keeps for reuse; returns the bytes freed.
    pub fn trim_pool(&self) -> u64 {
        self.pool.trim()
    }

    fn buf<'a>(&self, op: &'static str, b: &'a DeviceBuffer) -> Result<&'a HostBuffer> {
        b.inner_for::<HostBuffer>(op, self.uid)
    }
}

fn bytes(words: &[u64], len: usize) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirements and `len ≤ 8 * words.len()`.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), len.min(words.len() * 8)) }
}

fn bytes_mut(words: &mut [u64], len: usize) -> &mut [u8] {
    let len = len.min(words.len() * 8);
    // SAFETY: as in `bytes`, and the borrow of `words` is exclusive.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

/// `&mut [T]` view of a buffer's words as elements of `T` (`f32` or `f64`).
fn elems_mut<T: kernels::Scalar>(words: &mut [u64], len: usize) -> &mut [T] {
    assert!(std::mem::size_of::<T>() == T::ELEM.size_of() && std::mem::align_of::<T>() <= 8);
    let n = len.min(words.len() * 8) / std::mem::size_of::<T>();
    // SAFETY: T is f32 or f64 (size checked above against its ElemType): valid for any bits,
    // alignment at most 8, `n` elements fit in the words, and the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), n) }
}

/// `&[T]` view of a buffer's words as elements of `T` (`f32` or `f64`).
fn elems<T: kernels::Scalar>(words: &[u64], len: usize) -> &[T] {
    assert!(std::mem::size_of::<T>() == T::ELEM.size_of() && std::mem::align_of::<T>() <= 8);
    let n = len.min(words.len() * 8) / std::mem::size_of::<T>();
    // SAFETY: as in `elems_mut`, for a shared borrow.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<T>(), n) }
}

impl Device for HostDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        // The limit applies to the bytes requested; the pool's soft cap keeps the memory it
        // caches within the limit too.
        let reservation = self.mem.reserve(bytes as u64)?;
        let block = self.pool.alloc(bytes).map_err(|e| match e {
            DevicesError::OutOfMemory { .. } => self.mem.oom(bytes as u64),
            other => other,
        })?;
        Ok(DeviceBuffer::new(
            bytes,
            self.uid,
            HostBuffer {
                block,
                _reservation: reservation,
            },
        ))
    }

    fn upload_at(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        let buf = self.buf("upload", dst)?;
        crate::copy_range("upload", offset, src.len(), dst.len_bytes())?;
        let mut words = buf.words().write();
        bytes_mut(&mut words, offset + src.len())[offset..].copy_from_slice(src);
        Ok(())
    }

    fn download_at(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let buf = self.buf("download", src)?;
        crate::copy_range("download", offset, dst.len(), src.len_bytes())?;
        let words = buf.words().read_recursive();
        dst.copy_from_slice(&bytes(&words, offset + dst.len())[offset..]);
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
        crate::args::gemm_mode(e, mode)?;
        let (ab, bb, cb) = (
            self.buf("gemm", a)?,
            self.buf("gemm", b)?,
            self.buf("gemm", c)?,
        );
        no_alias("gemm", c, &[a, b])?;
        let _serial = self.compute.lock();
        // a and b may be the same buffer: two read locks are fine.
        let (aw, bw, mut cw) = (
            ab.words().read_recursive(),
            bb.words().read_recursive(),
            cb.words().write(),
        );
        let (la, lb, lc) = (a.len_bytes(), b.len_bytes(), c.len_bytes());
        match e {
            ElemType::F32 => kernels::gemm_mixed(
                mode,
                ta,
                tb,
                m,
                n,
                k,
                alpha as f32,
                elems(&aw, la),
                lda,
                elems(&bw, lb),
                ldb,
                beta as f32,
                elems_mut(&mut cw, lc),
                ldc,
            ),
            ElemType::F64 => kernels::gemm::<f64>(
                ta,
                tb,
                m,
                n,
                k,
                alpha,
                elems(&aw, la),
                lda,
                elems(&bw, lb),
                ldb,
                beta,
                elems_mut(&mut cw, lc),
                ldc,
            ),
        }
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
        no_alias("syrk", c, &[a])?;
        let _serial = self.compute.lock();
        let (aw, mut cw) = (ab.words().read_recursive(), cb.words().write());
        let (la, lc) = (a.len_bytes(), c.len_bytes());
        match e {
            ElemType::F32 => kernels::syrk::<f32>(
                uplo,
                t,
                n,
                k,
                alpha as f32,
                elems(&aw, la),
                lda,
                beta as f32,
                elems_mut(&mut cw, lc),
                ldc,
            ),
            ElemType::F64 => kernels::syrk::<f64>(
                uplo,
                t,
                n,
                k,
                alpha,
                elems(&aw, la),
                lda,
                beta,
                elems_mut(&mut cw, lc),
                ldc,
            ),
        }
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
        let (ab, bb) = (self.buf("trsm", a)?, self.buf("trsm", b)?);
        no_alias("trsm", b, &[a])?;
        let _serial = self.compute.lock();
        let (aw, mut bw) = (ab.words().read_recursive(), bb.words().write());
        let (la, lb) = (a.len_bytes(), b.len_bytes());
        match e {
            ElemType::F32 => kernels::trsm::<f32>(
                side,
                uplo,
                t,
                diag,
                m,
                n,
                alpha as f32,
                elems(&aw, la),
                lda,
                elems_mut(&mut bw, lb),
                ldb,
            ),
            ElemType::F64 => kernels::trsm::<f64>(
                side,
                uplo,
                t,
                diag,
                m,
                n,
                alpha,
                elems(&aw, la),
                lda,
                elems_mut(&mut bw, lb),
                ldb,
            ),
        }
    }

    fn potrf(&self, e: ElemType, uplo: Uplo, n: usize, a: &DeviceBuffer, lda: usize) -> Result<()> {
        let ab = self.buf("potrf", a)?;
        let _serial = self.compute.lock();
        let mut aw = ab.words().write();
        let la = a.len_bytes();
        match e {
            ElemType::F32 => kernels::potrf::<f32>(uplo, n, elems_mut(&mut aw, la), lda),
            ElemType::F64 => kernels::potrf::<f64>(uplo, n, elems_mut(&mut aw, la), lda),
        }
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// Two host devices share the host's memory bus: a direct copy is a memcpy.
    fn can_copy_to_peer(&self, dst: &dyn Device) -> bool {
        dst.as_any().downcast_ref::<HostDevice>().is_some()
    }

    fn copy_to_peer(
        &self,
        src: &DeviceBuffer,
        dst: &dyn Device,
        dst_buf: &DeviceBuffer,
        bytes: usize,
    ) -> Result<()> {
        let Some(peer) = dst.as_any().downcast_ref::<HostDevice>() else {
            return Err(DevicesError::Unsupported {
                device: self.info.name.clone(),
                what: format!("peer-to-peer copy to {}", dst.info().name),
            });
        };
        let from = self.buf("copy_to_peer", src)?;
        let to = peer.buf("copy_to_peer", dst_buf)?;
        if bytes > src.len_bytes() || bytes > dst_buf.len_bytes() {
            return Err(DevicesError::bad_args(
                "copy_to_peer",
                format!(
                    "{bytes} bytes from a buffer of {} into one of {}",
                    src.len_bytes(),
                    dst_buf.len_bytes()
                ),
            ));
        }
        if std::ptr::eq(from, to) {
            return Ok(());
        }
        // Through a temporary, holding one buffer's lock at a time: two copies in opposite
        // directions at once must not wait on each other's locks.
        let staged = self::bytes(&from.words().read_recursive(), bytes).to_vec();
        bytes_mut(&mut to.words().write(), bytes).copy_from_slice(&staged);
        Ok(())
    }

    unsafe fn pin_host_memory(&self, ptr: *const u8, len: usize) -> Result<Option<HostPin>> {
        let range = (ptr as usize, len);
        let mut p = self.pinned.lock();
        if p.iter().any(|&(a, l)| a < range.0 + len && range.0 < a + l) {
            return Err(DevicesError::bad_args(
                "pin_host_memory",
                "the range overlaps memory already pinned",
            ));
        }
        p.push(range);
        Ok(Some(HostPin::new(
            len,
            HostDevicePin {
                range,
                pinned: Arc::clone(&self.pinned),
            },
        )))
    }

    fn supports(&self, _e: ElemType) -> bool {
        true
    }

    fn mem_used(&self) -> u64 {
        self.mem.used()
    }
}

impl std::fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostDevice")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devtest;

    #[test]
    fn host_device_kernels_match_cpu_kernels() {
        devtest::blas_matches_cpu(&HostDevice::new(1 << 30));
        let (a, b) = (HostDevice::new(1 << 30), HostDevice::new(1 << 30));
        devtest::pinned_copies_round_trip(&a);
        assert!(a.pinned_ranges().is_empty(), "pins dropped");
        devtest::peer_copies_between(&a, &b);
    }

    #[test]
    fn host_device_tiled_cholesky_residual_is_tiny() {
        devtest::tiled_cholesky_on_device(&HostDevice::new(1 << 30));
    }

    #[test]
    fn host_device_reuses_pooled_memory_within_its_limit() {
        let dev = HostDevice::new(4096);
        let a = dev.alloc(1000).expect("alloc");
        dev.upload(&a, &[7u8; 1000]).expect("upload");
        drop(a);
        assert_eq!(dev.mem_used(), 0);
        assert_eq!(dev.pool_stats().bytes_cached, 1024);
        // The same size class: the cached block is handed out again, and the device's
        // accounting counts the bytes requested.
        let b = dev.alloc(900).expect("alloc");
        assert_eq!(dev.mem_used(), 900);
        let s = dev.pool_stats();
        assert_eq!((s.hits, s.misses, s.bytes_in_use), (1, 1, 1024));
        dev.upload(&b, &[1u8; 900]).expect("upload");
        let mut out = vec![0u8; 900];
        dev.download(&b, &mut out).expect("download");
        assert_eq!(out, vec![1u8; 900]);
        drop(b);
        // Cached memory counts as free: a request that fits the limit only without the cache
        // succeeds, the pool trimming its cache first (its soft cap is the limit).
        let c = dev.alloc(4000).expect("fits the limit");
        assert_eq!(dev.mem_used(), 4000);
        let s = dev.pool_stats();
        assert_eq!((s.bytes_cached, s.bytes_in_use), (0, 4096));
        assert!(dev.alloc(97).is_err(), "the limit still holds");
        drop(c);
        assert_eq!(dev.trim_pool(), 4096);
        assert_eq!(
            dev.pool_stats(),
            PoolStats {
                hits: 1,
                misses: 2,
                ..PoolStats::default()
            }
        );
    }

    #[test]
    fn host_device_alloc_reports_out_of_memory() {
        devtest::out_of_memory_at_limit_1000(&HostDevice::new(1000));
    }

    #[test]
    fn host_device_bad_arguments_are_errors() {
        devtest::bad_arguments_are_errors(&HostDevice::new(1 << 20), &HostDevice::new(1 << 20));
    }

    #[test]
    fn host_device_transfer_overlaps_compute_from_two_threads() {
        let dev: Arc<dyn Device> = Arc::new(HostDevice::new(1 << 30));
        devtest::transfer_overlaps_compute(&dev);
    }
}
