//! Failures: a rank process killed mid-allreduce, a rank that leaves, a bad argument on one
//! rank. The survivors must fail with a clear error within seconds, never hang.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{options, run_group};
use flotilla_collective::{
    Algorithm, CommError, Communicator, Options, ReduceOp, RendezvousServer, Transport,
};

const CHILD_ENV: &str = "FLOTILLA_COLLECTIVE_TEST_CHILD";

/// Not a test on its own: the body of a rank process spawned by `killed_rank_*`.
#[test]
fn child_rank_main() {
    let Ok(transport) = std::env::var(CHILD_ENV) else {
        return;
    };
    let opts = Options {
        transport: if transport == "shm" {
            Transport::Shm
        } else {
            Transport::Tcp
        },
        timeout: Duration::from_secs(30),
        ..Options::default()
    };
    let mut comm = Communicator::from_env_with(opts).unwrap();
    let mut buf = vec![1.0f32; 1 << 18];
    let start = Instant::now();
    let mut first = true;
    while start.elapsed() < Duration::from_secs(30) {
        if let Err(e) = comm.allreduce(&mut buf, ReduceOp::Sum) {
            let kind = match e {
                CommError::PeerLost { .. } => "peerlost",
                CommError::Aborted { .. } => "aborted",
                CommError::Timeout { .. } => "timeout",
                _ => "other",
            };
            println!("FAILED {kind} {e}");
            // a later call fails at once too
            let again = comm.barrier().is_err();
            println!("AGAIN {again}");
            std::process::exit(3);
        }
        buf.iter_mut().for_each(|x| *x = 1.0);
        if first {
            println!("READY {}", comm.rank());
            first = false;
        }
    }
    std::process::exit(4);
}

fn killed_rank(transport: &str) {
    let n = 3;
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let rv = format!("{}/kill", server.local_addr());
    let exe = std::env::current_exe().unwrap();
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children = Vec::new();
    for r in 0..n {
        let mut child = Command::new(&exe)
            .args([
                "child_rank_main",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, transport)
            .env("FLOTILLA_RANK", r.to_string())
            .env("FLOTILLA_WORLD_SIZE", n.to_string())
            .env("FLOTILLA_RENDEZVOUS", &rv)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, line));
            }
        });
        children.push(child);
    }
    // The readers hold the only senders: the channel ends when every pipe has closed.
    drop(tx);
    let mut ready = 0;
    let mut lines = Vec::new();
    while ready < n {
        let (r, line) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("ranks did not start");
        ready += usize::from(line.contains("READY"));
        lines.push((r, line));
    }
    let victim = 1;
    children[victim].kill().unwrap();
    let killed_at = Instant::now();
    children[victim].wait().unwrap();
    for (r, child) in children.iter_mut().enumerate() {
        if r == victim {
            continue;
        }
        // The children's timeout is 30 s: a rank that ends before it learned of the kill.
        let deadline = killed_at + Duration::from_secs(25);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("rank {r} still running 25 s after rank {victim} was killed ({transport})");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(3), "rank {r} exit status ({transport})");
    }
    let elapsed = killed_at.elapsed();
    // Every rank has exited: the reader threads end at their pipes' close, and the channel
    // with them (waiting for a 500 ms gap instead lost the lines of a reader held up).
    lines.extend(rx.iter());
    for r in [0, 2] {
        let failed: Vec<_> = lines
            .iter()
            .filter(|(k, l)| *k == r && l.contains("FAILED"))
            .collect();
        assert_eq!(failed.len(), 1, "rank {r}: {lines:?}");
        let l = &failed[0].1;
        assert!(
            l.contains("FAILED peerlost") || l.contains("FAILED aborted"),
            "{l}"
        );
        assert!(
            lines
                .iter()
                .any(|(k, l)| *k == r && l.contains("AGAIN true")),
            "rank {r}: {lines:?}"
        );
    }
    assert!(elapsed < Duration::from_secs(25), "{elapsed:?}");
}

#[test]
fn killed_rank_process_fails_tcp_peers_quickly() {
    killed_rank("tcp");
}

#[test]
fn killed_rank_process_fails_shm_peers_quickly() {
    killed_rank("shm");
}

fn leaving_rank(transport: Transport) {
    let results = run_group(3, options(transport, Algorithm::Ring), |mut comm| {
        let mut buf = vec![1i32; 100_000];
        comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
        if comm.rank() == 2 {
            return None; // leaves: the communicator drops
        }
        let start = Instant::now();
        let err = comm.allreduce(&mut buf, ReduceOp::Sum).unwrap_err();
        Some((start.elapsed(), err.to_string()))
    });
    for (elapsed, msg) in results.into_iter().flatten() {
        assert!(elapsed < common::BEFORE_TIMEOUT, "{elapsed:?} {msg}");
        assert!(
            msg.contains("lost peer") || msg.contains("aborted"),
            "{msg}"
        );
    }
}

#[test]
fn a_rank_that_leaves_fails_its_peers_tcp() {
    leaving_rank(Transport::Tcp);
}

#[test]
fn a_rank_that_leaves_fails_its_peers_shm() {
    leaving_rank(Transport::Shm);
}

#[test]
fn a_bad_argument_on_one_rank_fails_the_others_instead_of_hanging() {
    for transport in [Transport::Tcp, Transport::Shm] {
        let results = run_group(2, options(transport, Algorithm::Auto), |mut comm| {
            let send = vec![1.0f64; 10];
            let mut recv = vec![0.0f64; if comm.rank() == 0 { 19 } else { 20 }];
            let start = Instant::now();
            let r = comm.allgather(&send, &mut recv);
            (start.elapsed(), r.map_err(|e| e.to_string()))
        });
        assert!(
            matches!(&results[0].1, Err(m) if m.contains("invalid argument")),
            "{results:?}"
        );
        assert!(results[1].1.is_err(), "{results:?}");
        assert!(
            results.iter().all(|(t, _)| *t < common::BEFORE_TIMEOUT),
            "{results:?}"
        );
    }
}

/// Ranks that disagree on a collective over shared memory fail, each naming what the
/// other called (they returned `Ok` with wrong values): other lengths, another element
/// type, another collective.
#[test]
fn ranks_that_disagree_on_the_call_fail_over_shared_memory() {
    let results = run_group(2, options(Transport::Shm, Algorithm::Auto), |mut comm| {
        let mut buf = vec![1.0f32; if comm.rank() == 0 { 100 } else { 110 }];
        let r = comm.allreduce(&mut buf, ReduceOp::Sum);
        r.map_err(|e| e.to_string())
    });
    assert!(
        matches!(&results[0], Err(m) if m.contains("rank 1 called allreduce of 110 f32, this rank allreduce of 100 f32")),
        "{results:?}"
    );
    assert!(
        matches!(&results[1], Err(m) if m.contains("rank 0 called allreduce of 100 f32")),
        "{results:?}"
    );
    let results = run_group(2, options(Transport::Shm, Algorithm::Auto), |mut comm| {
        if comm.rank() == 0 {
            let mut buf = vec![1.0f32; 8];
            comm.allreduce(&mut buf, ReduceOp::Sum)
                .map_err(|e| e.to_string())
        } else {
            let mut buf = vec![1i32; 8];
            comm.broadcast(&mut buf, 0).map_err(|e| e.to_string())
        }
    });
    assert!(
        matches!(&results[0], Err(m) if m.contains("rank 1 called broadcast of 8 i32 to/from rank 0")),
        "{results:?}"
    );
    // Agreeing calls of every kind go on passing.
    let results = run_group(2, options(Transport::Shm, Algorithm::Auto), |mut comm| {
        let mut buf = vec![1.0f64; 1 << 17];
        comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
        comm.barrier().unwrap();
        comm.broadcast(&mut buf, 1).unwrap();
        let mut all = vec![0.0f64; 2 << 17];
        comm.allgather(&buf, &mut all).unwrap();
        all[0]
    });
    assert_eq!(results, vec![2.0, 2.0]);
}

#[test]
fn timeout_is_the_backstop() {
    let mut opts = options(Transport::Tcp, Algorithm::Ring);
    opts.timeout = Duration::from_millis(300);
    // Rank 1 stays alive but silent until rank 0 gave up (an event, not a sleep: on a
    // loaded machine rank 0 may take longer than any fixed pause to time out).
    let gave_up = std::sync::Arc::new(std::sync::Barrier::new(2));
    let results = run_group(2, opts, move |mut comm| {
        if comm.rank() == 1 {
            gave_up.wait();
            return None;
        }
        let mut buf = [1.0f32; 4];
        let start = Instant::now();
        let e = comm.allreduce(&mut buf, ReduceOp::Sum).unwrap_err();
        let elapsed = start.elapsed();
        gave_up.wait();
        Some((elapsed, e))
    });
    let (elapsed, e) = results.into_iter().flatten().next().unwrap();
    assert!(matches!(e, CommError::Timeout { peer: Some(1), .. }), "{e}");
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < common::BEFORE_TIMEOUT,
        "{elapsed:?}"
    );
}

#[test]
fn an_aborting_rank_fails_its_peers_at_once() {
    for transport in [Transport::Tcp, Transport::Shm] {
        let results = run_group(3, options(transport, Algorithm::Auto), |mut comm| {
            let mut buf = vec![1.0f32; 1000];
            comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            let start = Instant::now();
            if comm.rank() == 1 {
                // This rank cannot take part in the next collective.
                comm.abort();
                comm.abort(); // twice is harmless
                let e = comm.allreduce(&mut buf, ReduceOp::Sum).unwrap_err();
                return (start.elapsed(), e.to_string());
            }
            let e = comm.allreduce(&mut buf, ReduceOp::Sum).unwrap_err();
            (start.elapsed(), e.to_string())
        });
        for (rank, (elapsed, msg)) in results.iter().enumerate() {
            assert!(
                *elapsed < common::BEFORE_TIMEOUT,
                "{transport:?} rank {rank}: {elapsed:?} {msg}"
            );
            assert!(
                msg.contains("aborted") || msg.contains("lost peer"),
                "{transport:?} rank {rank}: {msg}"
            );
        }
    }
}
