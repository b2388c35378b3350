//! Every collective x element type (f32, f64, i32, i64, bf16) x reduce op against a sequential reference, for 1 to 5
//! ranks, both transports and both TCP algorithms, with lengths that do not divide evenly.
#![allow(clippy::unwrap_used)]

mod common;

use common::{input, options, reference, run_group, TestElem};
use flotilla_collective::{Algorithm, Communicator, ReduceOp, Transport};

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

/// Lengths: empty, shorter than the group, not divisible by it, and (last) several shared
/// memory chunks long.
fn lengths(n: usize, big: bool) -> Vec<usize> {
    let mut v = vec![0, 1, 2, 3, n + 2, 13, 1000];
    if big {
        // i64: more than one 1 MiB shared memory chunk for 2 and 3 ranks
        v.push(140_001);
    }
    v
}

fn check_all_for<T: TestElem>(comm: &mut Communicator, seed: u64, big: bool) {
    let (n, r) = (comm.size(), comm.rank());
    for (li, len) in lengths(n, big).into_iter().enumerate() {
        for (oi, op) in OPS.into_iter().enumerate() {
            let s = seed * 100 + li as u64 * 10 + oi as u64;
            let inputs: Vec<Vec<T>> = (0..n).map(|k| input(s, k, len)).collect();
            let want = reference(&inputs, op);

            let mut buf = inputs[r].clone();
            comm.allreduce(&mut buf, op).unwrap();
            assert_eq!(buf, want, "allreduce len {len} op {op:?} rank {r}/{n}");

            let root = (len + oi) % n;
            let mut buf = inputs[r].clone();
            comm.reduce(&mut buf, op, root).unwrap();
            if r == root {
                assert_eq!(buf, want, "reduce len {len} op {op:?} rank {r}/{n}");
            } else {
                assert_eq!(buf, inputs[r], "reduce must not touch non-root buffers");
            }

            // reduce_scatter: every rank contributes n blocks of `len` elements
            let rs_inputs: Vec<Vec<T>> = (0..n).map(|k| input(s + 5, k, len * n)).collect();
            let rs_want = reference(&rs_inputs, op);
            let mut recv = vec![T::from_i32(9); len];
            comm.reduce_scatter(&rs_inputs[r], &mut recv, op).unwrap();
            assert_eq!(
                recv,
                rs_want[r * len..(r + 1) * len],
                "reduce_scatter len {len} op {op:?} rank {r}/{n}"
            );
        }
        let s = seed * 100 + li as u64 * 10 + 9;
        let inputs: Vec<Vec<T>> = (0..n).map(|k| input(s, k, len)).collect();
        let mut recv = vec![T::from_i32(9); len * n];
        comm.allgather(&inputs[r], &mut recv).unwrap();
        assert_eq!(recv, inputs.concat(), "allgather len {len} rank {r}/{n}");

        let root = li % n;
        let mut buf = inputs[r].clone();
        comm.broadcast(&mut buf, root).unwrap();
        assert_eq!(
            buf, inputs[root],
            "broadcast len {len} root {root} rank {r}/{n}"
        );

        if n > 1 {
            // a ring of point-to-point messages: evens send first, odds receive first
            let to = (r + 1) % n;
            let from = (r + n - 1) % n;
            let mut got = vec![T::from_i32(9); len];
            if r % 2 == 0 {
                comm.send(&inputs[r], to).unwrap();
                comm.recv(&mut got, from).unwrap();
            } else {
                comm.recv(&mut got, from).unwrap();
                comm.send(&inputs[r], to).unwrap();
            }
            assert_eq!(got, inputs[from], "send/recv len {len} rank {r}/{n}");
        }
        comm.barrier().unwrap();
    }
}

fn check_all(transport: Transport, algorithm: Algorithm, n: usize) {
    let results = run_group(n, options(transport, algorithm), move |mut comm| {
        check_all_for::<f32>(&mut comm, 1, false);
        check_all_for::<f64>(&mut comm, 2, false);
        check_all_for::<i32>(&mut comm, 3, false);
        check_all_for::<i64>(&mut comm, 4, n <= 3);
        // bf16: sums and products of 5 values in -4..=4 stay exact (3^5 = 243 has 8 bits).
        check_all_for::<flotilla_collective::bf16>(&mut comm, 5, false);
        comm.transport()
    });
    let want = if n == 1 && transport == Transport::Tcp {
        Transport::Tcp
    } else {
        transport
    };
    assert!(
        results.iter().all(|t| *t == want),
        "transport in use: {results:?}"
    );
}

#[test]
fn tcp_ring_all_ops_1_to_5_ranks() {
    for n in 1..=5 {
        check_all(Transport::Tcp, Algorithm::Ring, n);
    }
}

#[test]
fn tcp_recursive_doubling_all_ops_1_to_5_ranks() {
    for n in 1..=5 {
        check_all(Transport::Tcp, Algorithm::RecursiveDoubling, n);
    }
}

#[test]
fn shm_all_ops_1_to_5_ranks() {
    for n in 1..=5 {
        check_all(Transport::Shm, Algorithm::Auto, n);
    }
}

#[test]
fn auto_transport_picks_shm_on_one_host() {
    let t = run_group(2, options(Transport::Auto, Algorithm::Auto), |comm| {
        comm.transport()
    });
    assert_eq!(t, vec![Transport::Shm, Transport::Shm]);
}
