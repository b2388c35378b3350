//! Deterministic mode: every element is reduced in rank order, so results are bitwise equal to
//! a sequential left-to-right reference for every algorithm and transport.
#![allow(clippy::unwrap_used)]

mod common;

use common::{options, reference, rough_input, run_group};
use flotilla_collective::{Algorithm, ReduceOp, Transport};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs allreduce, reduce_scatter and reduce on `n` ranks and returns rank 0's results
/// (only allreduce unless `full`).
fn results(
    n: usize,
    transport: Transport,
    algorithm: Algorithm,
    deterministic: bool,
    lens: &[usize],
    full: bool,
) -> Vec<Vec<u32>> {
    let mut opts = options(transport, algorithm);
    opts.deterministic = deterministic;
    let lens = lens.to_vec();
    let mut per_rank = run_group(n, opts, move |mut comm| {
        let r = comm.rank();
        let mut out = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let mut buf = rough_input(i as u64, r, len);
            comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            out.push(bits(&buf));
            if !full {
                continue;
            }

            let send = rough_input(i as u64 + 50, r, len * n);
            let mut recv = vec![0f32; len];
            comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
                .unwrap();
            let mut all = vec![0f32; len * n];
            comm.allgather(&recv, &mut all).unwrap();
            out.push(bits(&all));

            let mut buf = rough_input(i as u64 + 100, r, len);
            comm.reduce(&mut buf, ReduceOp::Sum, n - 1).unwrap();
            let mut flag = buf.clone();
            comm.broadcast(&mut flag, n - 1).unwrap();
            out.push(bits(&flag));
        }
        out
    });
    let first = per_rank.remove(0);
    for other in &per_rank {
        assert_eq!(
            &first, other,
            "ranks disagree ({transport:?}, {algorithm:?}, det {deterministic})"
        );
    }
    first
}

fn expected(n: usize, lens: &[usize], full: bool) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let ins: Vec<Vec<f32>> = (0..n).map(|r| rough_input(i as u64, r, len)).collect();
        out.push(bits(&reference(&ins, ReduceOp::Sum)));
        if !full {
            continue;
        }
        let ins: Vec<Vec<f32>> = (0..n)
            .map(|r| rough_input(i as u64 + 50, r, len * n))
            .collect();
        out.push(bits(&reference(&ins, ReduceOp::Sum)));
        let ins: Vec<Vec<f32>> = (0..n)
            .map(|r| rough_input(i as u64 + 100, r, len))
            .collect();
        out.push(bits(&reference(&ins, ReduceOp::Sum)));
    }
    out
}

#[test]
fn inputs_are_order_sensitive() {
    // Guards the tests below: with these inputs a different reduction order changes bits.
    let ins: Vec<Vec<f32>> = (0..4).map(|r| rough_input(1, r, 1000)).collect();
    let mut rev = ins.clone();
    rev.reverse();
    assert_ne!(
        bits(&reference(&ins, ReduceOp::Sum)),
        bits(&reference(&rev, ReduceOp::Sum))
    );
}

#[test]
fn deterministic_results_are_bitwise_equal_everywhere() {
    for n in [3, 4, 5] {
        let lens = [0, 1, 7, 1000, 20_003];
        let want = expected(n, &lens, true);
        for (t, a, det) in [
            (Transport::Tcp, Algorithm::Ring, true),
            (Transport::Tcp, Algorithm::RecursiveDoubling, true),
            (Transport::Shm, Algorithm::Auto, true),
            (Transport::Shm, Algorithm::Ring, false),
        ] {
            let got = results(n, t, a, det, &lens, true);
            assert_eq!(got, want, "n {n} {t:?} {a:?} det {det}");
        }
    }
}

#[test]
fn deterministic_tcp_handles_several_pieces() {
    // 5 ranks: a block of 80_000 elements is more than one 1 MiB / 4 piece per peer; the
    // shared memory path (several chunks) must agree bitwise.
    let lens = [400_003];
    let want = expected(5, &lens, false);
    assert_eq!(
        results(5, Transport::Tcp, Algorithm::Ring, true, &lens, false),
        want
    );
    assert_eq!(
        results(5, Transport::Shm, Algorithm::Auto, false, &lens, false),
        want
    );
}
