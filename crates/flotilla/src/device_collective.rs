//! Collectives on device memory: allreduce of a buffer that lives on a GPU or an OpenCL
//! device ([`flotilla_devices::Device`]), staged through host memory.
//!
//! On a GPU the buffer moves in chunks through a pipeline of three stages on three
//! threads: chunk k + 1 is copied off the device while chunk k is allreduced between the
//! ranks (TCP or shared memory, [`flotilla_collective`]) and chunk k − 1 is copied back, so
//! for large buffers the copies (done by the GPU's copy engines) hide behind the network.
//! Where the "copies" are the CPU's own memcpy (the host device, OpenCL on the CPU) the
//! stages compete for the same cores, and one piece is faster (measured: 64 MiB between
//! two ranks on 2 cores, 1.67 GB/s in one piece vs 1.40 GB/s in 4 MiB chunks), so that is
//! the default there; [`DeviceStaging::with_chunk_bytes`] forces either. The host side is a [`DeviceStaging`] buffer
//! kept between calls and page-locked through the device where its backend gains from it
//! (CUDA: `cuMemHostRegister`), so the copies run by DMA at the link's speed. Ranks may
//! hold their buffers on different kinds of devices (a CPU rank beside an OpenCL rank).
//!
//! Not done: NCCL between several GPUs of one host (GPU-to-GPU without the host). It needs
//! a machine with two or more GPUs to be tested at all; the one lent to this project has
//! one.

use std::sync::mpsc;

use flotilla_collective::{CommError, Communicator, Element, ReduceOp};
use flotilla_devices::{Device, DeviceBuffer, DevicesError, HostPin};

/// What can go wrong in a device collective.
#[derive(Debug, thiserror::Error)]
pub enum DeviceCollectiveError {
    /// The buffer is smaller than `count` elements.
    #[error(
        "allreduce of {count} elements ({bytes} bytes) on a device buffer of {capacity} bytes"
    )]
    TooSmall {
        /// Elements asked for.
        count: usize,
        /// Their size in bytes.
        bytes: usize,
        /// The buffer's size in bytes.
        capacity: usize,
    },
    /// Copying to or from the device failed.
    #[error("staging through the host: {0}")]
    Device(#[from] DevicesError),
    /// The collective failed (a peer lost, a timeout).
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// The default pipeline chunk: large enough that each stage runs at full speed, small
/// enough that the first and last copies (which nothing hides) are short.
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

/// Host memory for staging device collectives, reused between calls (and pinned once).
pub struct DeviceStaging {
    /// The page-lock on `words`; declared first so it is dropped before them.
    pin: Option<HostPin>,
    /// 8-byte words, so every element type can be viewed in place.
    words: Vec<u64>,
    /// The pipeline's chunk; `None`: [`DEFAULT_CHUNK_BYTES`] on CUDA, one piece elsewhere.
    chunk_bytes: Option<usize>,
    last_chunk: usize,
    /// Whether pinning the current `words` was attempted.
    pin_tried: bool,
}

impl Default for DeviceStaging {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceStaging {
    /// Empty staging, pipelined in [`DEFAULT_CHUNK_BYTES`] chunks on CUDA devices and in
    /// one piece elsewhere (see the module docs); memory is taken at first use.
    pub fn new() -> Self {
        DeviceStaging {
            pin: None,
            words: Vec::new(),
            chunk_bytes: None,
            last_chunk: 0,
            pin_tried: false,
        }
    }

    /// Empty staging whose pipeline moves `chunk_bytes` per step (at least 8) on every
    /// device; `usize::MAX` moves everything in one piece.
    pub fn with_chunk_bytes(chunk_bytes: usize) -> Self {
        DeviceStaging {
            chunk_bytes: Some(chunk_bytes.max(8)),
            ..Self::new()
        }
    }

    /// Whether the staging memory is page-locked.
    pub fn is_pinned(&self) -> bool {
        self.pin.is_some()
    }

    /// The chunk the last call was pipelined in, 0 when it moved in one piece.
    pub fn last_chunk_bytes(&self) -> usize {
        self.last_chunk
    }

    /// Bytes of staging memory held.
    pub fn capacity_bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Makes room for `bytes`, pinning new memory through `device` (a backend that does
    /// not pin leaves it pageable; so does a failed pin).
    fn reserve(&mut self, bytes: usize, device: &dyn Device) {
        let words = bytes.div_ceil(8);
        if self.words.len() >= words && (self.pin_tried || self.words.is_empty()) {
            return;
        }
        // Unpin before the memory can move or be freed.
        self.pin = None;
        if self.words.len() < words {
            self.words = vec![0u64; words];
        }
        // One attempt per allocation: a backend that does not pin, or a failed pin, is
        // not asked again until the memory is replaced.
        self.pin_tried = true;
        // SAFETY: `words` is neither resized nor freed while the pin lives: `reserve` drops
        // the pin before replacing them, and the pin is dropped before them with `self`.
        self.pin =
            unsafe { device.pin_host_memory(self.words.as_ptr().cast(), self.words.len() * 8) }
                .ok()
                .flatten();
    }

    /// Allreduces the first `count` elements of type `T` of `buf` (on `device`) across the
    /// communicator: every rank ends with the elementwise `op` over all ranks' buffers.
    /// Every rank must pass the same `count` (chunking is by count, so the ranks' chunks
    /// match whatever their devices).
    pub fn allreduce<T: Element>(
        &mut self,
        comm: &mut Communicator,
        device: &dyn Device,
        buf: &DeviceBuffer,
        count: usize,
        op: ReduceOp,
    ) -> Result<(), DeviceCollectiveError> {
        let size = std::mem::size_of::<T>();
        let bytes = count
            .checked_mul(size)
            .filter(|&b| b <= buf.len_bytes())
            .ok_or(DeviceCollectiveError::TooSmall {
                count,
                bytes: count.saturating_mul(size),
                capacity: buf.len_bytes(),
            })?;
        self.reserve(bytes, device);
        let chunk_bytes = self.chunk_bytes.unwrap_or(match device.info().kind {
            flotilla_devices::DeviceKind::Cuda => DEFAULT_CHUNK_BYTES,
            _ => usize::MAX,
        });
        let chunk = (chunk_bytes / size).max(1);
        let host: &mut [T] = &mut bytemuck::cast_slice_mut::<u64, T>(&mut self.words)[..count];
        if count <= chunk {
            self.last_chunk = 0;
            device.download(buf, bytemuck::cast_slice_mut(host))?;
            comm.allreduce(host, op)?;
            device.upload(buf, bytemuck::cast_slice(host))?;
            return Ok(());
        }
        self.last_chunk = chunk * size;
        pipeline(comm, device, buf, host, chunk, op)
    }
}

/// The three-stage pipeline over `host` in chunks of `chunk` elements.
fn pipeline<T: Element>(
    comm: &mut Communicator,
    device: &dyn Device,
    buf: &DeviceBuffer,
    host: &mut [T],
    chunk: usize,
    op: ReduceOp,
) -> Result<(), DeviceCollectiveError> {
    let size = std::mem::size_of::<T>();
    std::thread::scope(|s| {
        let (down_tx, down_rx) = mpsc::channel::<(usize, &mut [T])>();
        let (up_tx, up_rx) = mpsc::channel::<(usize, &mut [T])>();
        let chunks: Vec<&mut [T]> = host.chunks_mut(chunk).collect();
        let downloader = s.spawn(move || -> Result<(), DevicesError> {
            for (k, part) in chunks.into_iter().enumerate() {
                device.download_at(buf, k * chunk * size, bytemuck::cast_slice_mut(part))?;
                if down_tx.send((k, part)).is_err() {
                    break; // the collective failed; its error is reported
                }
            }
            Ok(())
        });
        let uploader = s.spawn(move || -> Result<(), DevicesError> {
            for (k, part) in up_rx {
                device.upload_at(buf, k * chunk * size, bytemuck::cast_slice(part))?;
            }
            Ok(())
        });
        let mut reduced: Result<(), DeviceCollectiveError> = Ok(());
        for (k, part) in down_rx {
            if let Err(e) = comm.allreduce(part, op) {
                reduced = Err(e.into());
                break;
            }
            if up_tx.send((k, part)).is_err() {
                break; // the uploader failed; its error is reported below
            }
        }
        drop(up_tx);
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<(), DevicesError>>| {
            h.join().unwrap_or_else(|_| {
                Err(DevicesError::Backend {
                    backend: "staging",
                    device: device.info().name.clone(),
                    op: "copy thread",
                    message: "panicked".into(),
                })
            })
        };
        let (down, up) = (joined(downloader), joined(uploader));
        down?;
        reduced?;
        up?;
        Ok(())
    })
}

/// [`DeviceStaging::allreduce`] with staging memory for this one call. Reuse a
/// [`DeviceStaging`] across calls to keep its memory allocated and pinned.
pub fn allreduce_device<T: Element>(
    comm: &mut Communicator,
    device: &dyn Device,
    buf: &DeviceBuffer,
    count: usize,
    op: ReduceOp,
) -> Result<(), DeviceCollectiveError> {
    DeviceStaging::new().allreduce::<T>(comm, device, buf, count, op)
}
