//! Shared helpers for the integration tests: run a group of ranks as threads, make seeded
//! inputs, and compute sequential references.
#![allow(dead_code, clippy::unwrap_used)]

use std::fmt::Debug;
use std::time::Duration;

use flotilla_collective::{Communicator, Element, Options, ReduceOp, RendezvousServer};
use rand::{Rng, SeedableRng};

/// Runs `f(comm)` on `n` threads that form one group on a fresh rendezvous server.
pub(crate) fn run_group<R: Send + 'static>(
    n: usize,
    options: Options,
    f: impl Fn(Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let rv = format!("{}/group", server.local_addr());
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let rv = rv.clone();
            let options = options.clone();
            let f = f.clone();
            std::thread::spawn(move || {
                let comm = Communicator::connect_with(&rv, r, n, options)
                    .unwrap_or_else(|e| panic!("rank {r} failed to connect: {e}"));
                f(comm)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// What "at once" means for a failure: well before the 20 s timeout of [`options`] would
/// have ended the collective (the error's kind says which ended it; this bound holds on a
/// loaded machine).
#[allow(dead_code)]
pub(crate) const BEFORE_TIMEOUT: Duration = Duration::from_secs(15);

pub(crate) fn options(
    transport: flotilla_collective::Transport,
    algorithm: flotilla_collective::Algorithm,
) -> Options {
    Options {
        transport,
        algorithm,
        timeout: Duration::from_secs(20),
        deterministic: false,
        rendezvous_cert: None,
    }
}

/// Element types with a scalar reference implementation of every op.
pub(crate) trait TestElem: Element + PartialEq + Debug {
    fn apply(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! test_elem {
    ($t:ty, $add:expr, $mul:expr) => {
        impl TestElem for $t {
            fn apply(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => $add(a, b),
                    ReduceOp::Prod => $mul(a, b),
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
        }
    };
}

test_elem!(f32, |a: f32, b: f32| a + b, |a: f32, b: f32| a * b);
test_elem!(f64, |a: f64, b: f64| a + b, |a: f64, b: f64| a * b);
test_elem!(i32, i32::wrapping_add, i32::wrapping_mul);
test_elem!(i64, i64::wrapping_add, i64::wrapping_mul);
test_elem!(
    flotilla_collective::bf16,
    |a: flotilla_collective::bf16, b: flotilla_collective::bf16| {
        flotilla_collective::bf16::from_f32(a.to_f32() + b.to_f32())
    },
    |a: flotilla_collective::bf16, b: flotilla_collective::bf16| {
        flotilla_collective::bf16::from_f32(a.to_f32() * b.to_f32())
    }
);

/// Small integers in -4..=4 (exact in every type, sums and products of 5 stay exact).
pub(crate) fn input<T: TestElem>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed * 1000 + rank as u64);
    (0..len)
        .map(|_| T::from_i32(rng.gen_range(-4..=4)))
        .collect()
}

/// Random non-integer floats (sums depend on the reduction order).
pub(crate) fn rough_input(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed * 7919 + rank as u64);
    (0..len)
        .map(|_| rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-3..4)))
        .collect()
}

/// Element-wise reduction of `inputs` in rank order.
pub(crate) fn reference<T: TestElem>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(x) {
            *a = T::apply(*a, *b, op);
        }
    }
    acc
}
