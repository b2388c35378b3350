//! Rendezvous and setup errors: duplicate rank, size mismatch, timeout, bad addresses and
//! environment variables, and ranks that start before the rendezvous host.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use flotilla_collective::{CommError, Communicator, Options, ReduceOp, RendezvousServer};

fn opts(timeout_ms: u64) -> Options {
    Options {
        timeout: Duration::from_millis(timeout_ms),
        ..Options::default()
    }
}

fn rendezvous_msg(r: &Result<Communicator, CommError>) -> Option<String> {
    match r {
        Err(CommError::Rendezvous(m)) => Some(m.clone()),
        _ => None,
    }
}

/// Two joins that conflict: exactly one is rejected with `reject`, the other times out.
fn conflicting(a: (usize, usize), b: (usize, usize), reject: &str) {
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let rv = format!("{}/k", server.local_addr());
    let rv2 = rv.clone();
    let t = std::thread::spawn(move || Communicator::connect_with(&rv2, a.0, a.1, opts(1500)));
    let r2 = Communicator::connect_with(&rv, b.0, b.1, opts(1500));
    let r1 = t.join().unwrap();
    let msgs = [rendezvous_msg(&r1), rendezvous_msg(&r2)];
    let rejected = msgs.iter().flatten().filter(|m| m.contains(reject)).count();
    let timed_out = msgs
        .iter()
        .flatten()
        .filter(|m| m.contains("timed out"))
        .count();
    assert_eq!((rejected, timed_out), (1, 1), "{msgs:?}");
}

#[test]
fn duplicate_rank_is_rejected() {
    conflicting((0, 2), (0, 2), "duplicate rank 0");
}

#[test]
fn size_mismatch_is_rejected() {
    conflicting((0, 2), (1, 3), "size mismatch");
}

#[test]
fn missing_ranks_time_out() {
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let start = Instant::now();
    let r = Communicator::connect_with(&format!("{}/lonely", server.local_addr()), 0, 2, opts(300));
    let msg = rendezvous_msg(&r).unwrap();
    assert!(
        msg.contains("timed out") && msg.contains("2 ranks"),
        "{msg}"
    );
    // Its 300 ms timeout ended the wait (well before this bound, however loaded the machine).
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn unreachable_rendezvous_times_out() {
    // nothing listens on the port of a dropped listener
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = Communicator::connect_with(&format!("127.0.0.1:{port}/x"), 1, 2, opts(300));
    assert!(rendezvous_msg(&r).unwrap().contains("timed out"));
}

#[test]
fn bad_arguments_are_rejected() {
    assert!(matches!(
        Communicator::connect("127.0.0.1:1/k", 2, 2),
        Err(CommError::InvalidArgument(_))
    ));
    assert!(matches!(
        Communicator::connect_with("no-such-host-name.invalid:1/k", 0, 2, opts(300)),
        Err(CommError::Rendezvous(_))
    ));
    assert!(matches!(
        Communicator::connect_with("not an address", 0, 2, opts(300)),
        Err(CommError::Rendezvous(_))
    ));
}

#[test]
fn from_env_names_the_bad_variable() {
    std::env::set_var("FLOTILLA_RANK", "zero");
    std::env::set_var("FLOTILLA_WORLD_SIZE", "2");
    std::env::remove_var("FLOTILLA_RENDEZVOUS");
    let e = Communicator::from_env().unwrap_err().to_string();
    assert!(e.contains("FLOTILLA_RANK"), "{e}");
    std::env::set_var("FLOTILLA_RANK", "0");
    let e = Communicator::from_env().unwrap_err().to_string();
    assert!(e.contains("FLOTILLA_RENDEZVOUS"), "{e}");
}

#[test]
fn ranks_may_start_before_rank_zero_hosts_the_rendezvous() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let a2 = addr.clone();
    let early = std::thread::spawn(move || {
        let mut c = Communicator::connect_with(&a2, 1, 2, opts(10_000)).unwrap();
        let mut v = [2i64];
        c.allreduce(&mut v, ReduceOp::Sum).unwrap();
        v[0]
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut c = Communicator::connect_with(&addr, 0, 2, opts(10_000)).unwrap();
    let mut v = [5i64];
    c.allreduce(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!((v[0], early.join().unwrap()), (7, 7));
}

#[test]
fn a_key_can_be_reused_after_a_group_completes() {
    let server = RendezvousServer::bind("127.0.0.1:0").unwrap();
    let rv = format!("{}/again", server.local_addr());
    for round in 0..2i32 {
        let rv2 = rv.clone();
        let t = std::thread::spawn(move || {
            let mut c = Communicator::connect(&rv2, 1, 2).unwrap();
            let mut v = [round];
            c.allreduce(&mut v, ReduceOp::Max).unwrap();
        });
        let mut c = Communicator::connect(&rv, 0, 2).unwrap();
        let mut v = [-1];
        c.allreduce(&mut v, ReduceOp::Max).unwrap();
        assert_eq!(v[0], round);
        t.join().unwrap();
    }
}

#[test]
fn a_restricted_rendezvous_serves_only_announced_keys_of_the_announced_size() {
    // The coordinator's rendezvous once served any key, from anyone, forever.
    let server = RendezvousServer::bind_restricted("127.0.0.1:0").unwrap();
    let at = server.local_addr();
    let r = Communicator::connect_with(&format!("{at}/stranger"), 0, 1, opts(2000));
    let msg = rendezvous_msg(&r).unwrap();
    assert!(msg.contains("unknown or expired group key"), "{msg}");

    server.expect("gang-1", 2, Duration::from_secs(60));
    let r = Communicator::connect_with(&format!("{at}/gang-1"), 0, 3, opts(2000));
    let msg = rendezvous_msg(&r).unwrap();
    assert!(msg.contains("has 2 ranks, not 3"), "{msg}");

    let rv = format!("{at}/gang-1");
    let rv2 = rv.clone();
    let t = std::thread::spawn(move || Communicator::connect_with(&rv2, 1, 2, opts(5000)));
    let mut a = Communicator::connect_with(&rv, 0, 2, opts(5000)).unwrap();
    let mut b = t.join().unwrap().unwrap();
    let t = std::thread::spawn(move || {
        let mut x = [2.0f32];
        b.allreduce(&mut x, ReduceOp::Sum).unwrap();
        x[0]
    });
    let mut x = [1.0f32];
    a.allreduce(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!((x[0], t.join().unwrap()), (3.0, 3.0));

    // An expired key is refused like an unknown one.
    server.expect("gang-2", 1, Duration::ZERO);
    let r = Communicator::connect_with(&format!("{at}/gang-2"), 0, 1, opts(2000));
    assert!(rendezvous_msg(&r).unwrap().contains("unknown or expired"));
}

/// A self-signed certificate and key (PEM) in `dir`; the server's TLS configuration and its
/// fingerprint.
fn tls_server(
    dir: &std::path::Path,
) -> (
    std::sync::Arc<flotilla_collective::tls::ServerConfig>,
    String,
) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    flotilla_collective::tls::server_config_from_pem(&cert, &key).unwrap()
}

/// Over TLS (a coordinator with TLS): ranks that have the certificate's fingerprint meet
/// and reduce; a rank given another fingerprint, or none (plain TCP), is refused. Before,
/// the rendezvous was plain TCP whatever the coordinator used, so the gang's key travelled
/// in the clear.
#[test]
fn over_tls_only_ranks_that_trust_the_certificate_meet() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, print) = tls_server(dir.path());
    let server = RendezvousServer::bind_restricted_tls("127.0.0.1:0", cfg).unwrap();
    server.expect("gang-secret", 2, Duration::from_secs(60));
    let rv = format!("{}/gang-secret", server.local_addr());
    let tls = |fingerprint: &str| Options {
        timeout: Duration::from_secs(20),
        rendezvous_cert: Some(fingerprint.to_string()),
        ..Options::default()
    };
    let (rv2, o2) = (rv.clone(), tls(&print));
    let t = std::thread::spawn(move || {
        let mut c = Communicator::connect_with(&rv2, 1, 2, o2).unwrap();
        let mut v = vec![2.0f32; 8];
        c.allreduce(&mut v, ReduceOp::Sum).unwrap();
        v
    });
    let mut c = Communicator::connect_with(&rv, 0, 2, tls(&print)).unwrap();
    let mut v = vec![1.0f32; 8];
    c.allreduce(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, vec![3.0f32; 8]);
    assert_eq!(t.join().unwrap(), vec![3.0f32; 8]);
    // Another certificate's fingerprint: the handshake fails, naming the certificate.
    let other = tempfile::tempdir().unwrap();
    let (_, other_print) = tls_server(other.path());
    let msg =
        rendezvous_msg(&Communicator::connect_with(&rv, 0, 2, tls(&other_print))).expect("refused");
    assert!(
        msg.contains("not the one the coordinator announced"),
        "{msg}"
    );
    // Plain TCP to the TLS rendezvous: no table comes back.
    let r = Communicator::connect_with(&rv, 0, 2, opts(2000));
    assert!(r.is_err(), "a plain-TCP rank joined a TLS rendezvous");
}
