//! Allreduce of device buffers: two ranks (threads), one holding its buffer on the CPU
//! "device", the other on an OpenCL device (PoCL in CI), meet at a rendezvous and end with the
//! same sums in their device memory: in one piece, and through the chunked pipeline with
//! staging memory reused (and, on the host device, pinned) across calls.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use flotilla::collective::{Communicator, ReduceOp, RendezvousServer};
use flotilla::device_collective::{allreduce_device, DeviceCollectiveError, DeviceStaging};
use flotilla::devices::cpu::HostDevice;
use flotilla::devices::{discover_report, Device, DiscoverOptions};

fn opencl() -> Option<Arc<dyn Device>> {
    let found = discover_report(&DiscoverOptions {
        opencl: true,
        cuda: false,
        mem_limit: None,
    });
    if let Some(d) = found.devices.into_iter().next() {
        return Some(d);
    }
    let required = std::env::var("FLOTILLA_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "FLOTILLA_REQUIRE_OPENCL=1 but no OpenCL device: {:?}",
        found.skipped
    );
    eprintln!(
        "no OpenCL device ({:?}): the second rank uses the CPU device too",
        found.skipped
    );
    None
}

#[test]
fn ranks_on_a_cpu_and_an_opencl_device_allreduce_their_device_buffers() {
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let addr = format!("{}/devices", server.local_addr());
    let cl = opencl();
    let n = 100_003usize; // not a multiple of anything convenient
    let handles: Vec<_> = (0..2usize)
        .map(|rank| {
            let addr = addr.clone();
            let dev: Arc<dyn Device> = match (rank, &cl) {
                (1, Some(d)) => d.clone(),
                _ => Arc::new(HostDevice::new(1 << 30)),
            };
            std::thread::spawn(move || {
                let mut comm = Communicator::connect(&addr, rank, 2).unwrap();
                let data: Vec<f64> = (0..n).map(|i| (i * (rank + 1)) as f64).collect();
                let buf = dev.alloc(n * 8 + 64).unwrap();
                dev.upload(&buf, bytemuck::cast_slice(&data)).unwrap();
                allreduce_device::<f64>(&mut comm, dev.as_ref(), &buf, n, ReduceOp::Sum).unwrap();
                // Twice more through the pipeline (13 chunks of 64 KiB, the last one short),
                // with the staging memory kept: the sums of sums.
                // Rank 0 runs its copies on their own threads, rank 1 on its own thread: the
                // chunks, hence the calls, are the same.
                let mut staging = DeviceStaging::with_chunk_bytes(64 << 10).with_overlap(rank == 0);
                for _ in 0..2 {
                    staging
                        .allreduce::<f64>(&mut comm, dev.as_ref(), &buf, n, ReduceOp::Sum)
                        .unwrap();
                    assert_eq!(staging.last_overlapped(), rank == 0);
                    assert_eq!(staging.last_chunk_bytes(), 64 << 10);
                }
                assert!(staging.capacity_bytes() >= n * 8);
                if dev.info().kind == flotilla::devices::DeviceKind::Cpu {
                    assert!(staging.is_pinned(), "the host device pins what it is given");
                }
                // Another element type and op through the same staging.
                let ints: Vec<i32> = (0..n as i32).map(|i| i * (rank as i32 * 2 - 1)).collect();
                let ibuf = dev.alloc(n * 4).unwrap();
                dev.upload(&ibuf, bytemuck::cast_slice(&ints)).unwrap();
                staging
                    .allreduce::<i32>(&mut comm, dev.as_ref(), &ibuf, n, ReduceOp::Max)
                    .unwrap();
                let mut imax = vec![0i32; n];
                dev.download(&ibuf, bytemuck::cast_slice_mut(&mut imax))
                    .unwrap();
                assert!(imax.iter().enumerate().all(|(i, &v)| v == i as i32));
                let mut back = vec![0f64; n];
                dev.download(&buf, bytemuck::cast_slice_mut(&mut back))
                    .unwrap();
                // Too many elements for the buffer: a clear error, nothing sent.
                let e =
                    allreduce_device::<f64>(&mut comm, dev.as_ref(), &buf, n + 100, ReduceOp::Sum)
                        .unwrap_err();
                assert!(matches!(e, DeviceCollectiveError::TooSmall { .. }), "{e}");
                (dev.info().kind, back)
            })
        })
        .collect();
    for h in handles {
        let (kind, back) = h.join().unwrap();
        for (i, v) in back.iter().enumerate() {
            // 3i after the first allreduce, doubled by each of the two after it.
            assert_eq!(*v, (12 * i) as f64, "element {i} on a {kind:?} device");
        }
    }
}

/// A rank whose own part fails (here: a buffer of another device) aborts the communicator,
/// so its peer fails at once instead of waiting for its timeout.
#[test]
fn a_rank_whose_device_copy_fails_fails_its_peer_at_once() {
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let addr = format!("{}/failing", server.local_addr());
    let n = 300_000usize;
    let handles: Vec<_> = (0..2usize)
        .map(|rank| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let dev = HostDevice::new(1 << 30);
                let other = HostDevice::new(1 << 30);
                let mut comm = Communicator::connect(&addr, rank, 2).unwrap();
                // Rank 1's buffer belongs to another device: its first download fails.
                let buf = if rank == 1 {
                    other.alloc(n * 4)
                } else {
                    dev.alloc(n * 4)
                }
                .unwrap();
                let start = std::time::Instant::now();
                let e = DeviceStaging::with_chunk_bytes(256 << 10)
                    .allreduce::<f32>(&mut comm, &dev, &buf, n, ReduceOp::Sum)
                    .unwrap_err();
                (start.elapsed(), e)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        matches!(results[1].1, DeviceCollectiveError::Device(_)),
        "{}",
        results[1].1
    );
    assert!(
        matches!(results[0].1, DeviceCollectiveError::Comm(_)),
        "{}",
        results[0].1
    );
    for (elapsed, e) in &results {
        assert!(
            *elapsed < std::time::Duration::from_secs(5),
            "{elapsed:?}: {e}"
        );
    }
}
