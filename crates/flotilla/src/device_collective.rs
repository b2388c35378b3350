//! Collectives on device memory: allreduce of a buffer that lives on a GPU or an OpenCL
//! device ([`flotilla_devices::Device`]), staged through host memory.
//!
//! The buffer moves in chunks of [`DEFAULT_CHUNK_BYTES`], one allreduce per chunk, on
//! every rank whatever its device, so ranks on different kinds of devices make the same
//! sequence of calls. On a GPU the chunks go through a pipeline of three stages on three
//! threads: chunk k + 1 is copied off the device while chunk k is allreduced between the
//! ranks (TCP or shared memory, [`flotilla_collective`]) and chunk k − 1 is copied back, so
//! for large buffers the copies (done by the GPU's copy engines) hide behind the network.
//! Where the "copies" are the CPU's own memcpy (the host device, OpenCL on the CPU) the
//! stages would compete for the same cores (measured: 64 MiB between two ranks of host
//! devices on 2 cores, 1.69 GB/s with the threads, 3.04 GB/s without, 2.49 GB/s in one
//! piece), so there the chunks go one after the other on the calling thread;
//! [`DeviceStaging::with_overlap`] forces either.
//!
//! A rank whose own part fails (a copy to or from its device, a buffer too small) aborts
//! its communicator ([`Communicator::abort`]), so its peers' calls fail at once instead of
//! waiting for their timeout, and returns the error.
//!
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
    /// Bytes per chunk (and per allreduce call); the same on every rank.
    chunk_bytes: usize,
    /// Run the copies on their own threads; `None`: on CUDA devices only.
    overlap: Option<bool>,
    last_chunk: usize,
    last_overlap: bool,
    /// Whether pinning the current `words` was attempted.
    pin_tried: bool,
}

impl Default for DeviceStaging {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceStaging {
    /// Empty staging with [`DEFAULT_CHUNK_BYTES`] chunks, overlapped on CUDA devices (see
    /// the module docs); memory is taken at first use.
    pub fn new() -> Self {
        DeviceStaging {
            pin: None,
            words: Vec::new(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            overlap: None,
            last_chunk: 0,
            last_overlap: false,
            pin_tried: false,
        }
    }

    /// Empty staging moving `chunk_bytes` per allreduce call (at least 8; `usize::MAX`:
    /// everything in one call). Every rank of a communicator must use the same value.
    pub fn with_chunk_bytes(chunk_bytes: usize) -> Self {
        DeviceStaging {
            chunk_bytes: chunk_bytes.max(8),
            ..Self::new()
        }
    }

    /// Runs the copies on their own threads (`true`) or on the calling thread (`false`),
    /// whatever the device. Ranks may differ in this.
    pub fn with_overlap(mut self, overlap: bool) -> Self {
        self.overlap = Some(overlap);
        self
    }

    /// Whether the last call ran its copies on their own threads.
    pub fn last_overlapped(&self) -> bool {
        self.last_overlap
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
    /// Every rank must pass the same `count` and use the same chunk size. On an error of
    /// this rank's own (its device, its buffer) the communicator is aborted first.
    pub fn allreduce<T: Element>(
        &mut self,
        comm: &mut Communicator,
        device: &dyn Device,
        buf: &DeviceBuffer,
        count: usize,
        op: ReduceOp,
    ) -> Result<(), DeviceCollectiveError> {
        let r = self.allreduce_inner::<T>(comm, device, buf, count, op);
        if let Err(e) = &r {
            if !matches!(e, DeviceCollectiveError::Comm(_)) {
                comm.abort();
            }
        }
        r
    }

    fn allreduce_inner<T: Element>(
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
        let chunk = (self.chunk_bytes / size).max(1);
        let overlap = self
            .overlap
            .unwrap_or(device.info().kind == flotilla_devices::DeviceKind::Cuda);
        let host: &mut [T] = &mut bytemuck::cast_slice_mut::<u64, T>(&mut self.words)[..count];
        self.last_chunk = if count <= chunk { 0 } else { chunk * size };
        self.last_overlap = overlap && count > chunk;
        if self.last_overlap {
            return pipeline(comm, device, buf, host, chunk, op);
        }
        for (k, part) in host.chunks_mut(chunk).enumerate() {
            let offset = k * chunk * size;
            device.download_at(buf, offset, bytemuck::cast_slice_mut(part))?;
            comm.allreduce(part, op)?;
            device.upload_at(buf, offset, bytemuck::cast_slice(part))?;
        }
        Ok(())
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
