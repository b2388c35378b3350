//! Collectives on device memory: allreduce of a buffer that lives on a GPU or an OpenCL
//! device ([`flotilla_devices::Device`]), staged through host memory.
//!
//! Each rank downloads its buffer, the ranks allreduce the host copies (TCP or shared memory,
//! [`flotilla_collective`]), and each rank uploads the result. Ranks may hold their buffers on
//! different kinds of devices (a CPU rank beside an OpenCL rank). Not done yet: staging
//! through page-locked (pinned) host buffers and NCCL between GPUs of one host; both need the
//! CUDA backend's pinned allocations, which are exercised only on a GPU machine.

use flotilla_collective::{CommError, Communicator, Element, ReduceOp};
use flotilla_devices::{Device, DeviceBuffer, DevicesError};

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

/// Allreduces the first `count` elements of type `T` of `buf` (on `device`) across the
/// communicator: every rank ends with the elementwise `op` over all ranks' buffers.
pub fn allreduce_device<T: Element>(
    comm: &mut Communicator,
    device: &dyn Device,
    buf: &DeviceBuffer,
    count: usize,
    op: ReduceOp,
) -> Result<(), DeviceCollectiveError> {
    let bytes = count
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| b <= buf.len_bytes())
        .ok_or(DeviceCollectiveError::TooSmall {
            count,
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
            capacity: buf.len_bytes(),
        })?;
    let mut host: Vec<T> = vec![T::zeroed(); count];
    device.download(buf, bytemuck::cast_slice_mut(&mut host))?;
    debug_assert_eq!(std::mem::size_of_val(host.as_slice()), bytes);
    comm.allreduce(&mut host, op)?;
    device.upload(buf, bytemuck::cast_slice(&host))?;
    Ok(())
}
