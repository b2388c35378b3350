//! A worker in a network namespace of its own, joined to the host by a veth pair the test
//! makes: pulling the link (`ip link set … down`, packets dropped, TCP retransmitting) gets the
//! worker declared lost after the heartbeat timeout and its work placed on the other worker;
//! putting it back (`up`) lets the worker rejoin, and the results it finished while cut off,
//! delivered late, count for nothing. Needs root and iproute2: CI runs as root and sets
//! `FLOTILLA_REQUIRE_ROOT`; elsewhere it is skipped, saying why.

#![allow(clippy::unwrap_used)]

mod kit;

use std::process::Command;
use std::time::{Duration, Instant};

use flotilla::cluster::state::TaskState;
use kit::{cut, now_ns, Cluster, HashDag, Opts};

const TASKS: usize = 60;

/// Runs `ip ARGS`, panicking with its error when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A namespace with one end of a veth pair, the other end on the host; removed when dropped
/// (removing the namespace removes the pair).
struct Netns {
    name: String,
    host_if: String,
    host_ip: String,
    ns_ip: String,
}

impl Netns {
    fn make() -> Netns {
        let id = std::process::id();
        let n = Netns {
            name: format!("flt{id}"),
            host_if: format!("fh{}", id % 100_000),
            host_ip: format!("10.231.{}.1", id % 250),
            ns_ip: format!("10.231.{}.2", id % 250),
        };
        let ns_if = format!("fn{}", id % 100_000);
        ip(&["netns", "add", &n.name]);
        ip(&[
            "link", "add", &n.host_if, "type", "veth", "peer", "name", &ns_if,
        ]);
        ip(&["link", "set", &ns_if, "netns", &n.name]);
        ip(&[
            "addr",
            "add",
            &format!("{}/24", n.host_ip),
            "dev",
            &n.host_if,
        ]);
        ip(&["link", "set", &n.host_if, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &n.name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{}/24", n.ns_ip), "dev", &ns_if]);
        inside(&["link", "set", &ns_if, "up"]);
        inside(&["link", "set", "lo", "up"]);
        n
    }

    fn link(&self, up: bool) {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
    }
}

/// Whether this test can make namespaces (root, iproute2); CI must.
fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let has_ip = Command::new("ip").arg("-V").output().is_ok();
    if !(root && has_ip) {
        assert!(
            std::env::var_os("FLOTILLA_REQUIRE_ROOT").is_none(),
            "FLOTILLA_REQUIRE_ROOT is set but this test cannot make network namespaces (root: \
             {root}, iproute2: {has_ip})"
        );
        eprintln!(
            "network namespaces need root and iproute2 (root: {root}, ip: {has_ip}); skipped"
        );
    }
    root && has_ip
}

#[test]
fn a_worker_whose_link_is_pulled_is_found_lost_and_its_late_results_discarded() {
    if !can_run() {
        return;
    }
    let ns = Netns::make();
    // The coordinator listens on the host's end of the pair (the kit's own clients and the
    // first worker reach it there too).
    let mut c = Cluster::start_with(
        1,
        2,
        Opts {
            listen: Some(format!("{}:0", ns.host_ip).parse().unwrap()),
            ..Opts::default()
        },
    );
    let far_tmp = c.root().join("far-tmp");
    std::fs::create_dir_all(&far_tmp).unwrap();
    c.add_worker_wrapped(
        2,
        &["ip", "netns", "exec", &ns.name],
        &[("TMPDIR", far_tmp.to_str().unwrap())],
    );
    c.wait_workers(2);
    let far = cut::worker_id(&c, "w1");
    let dag = HashDag::random(TASKS, 0x9a_7173);
    let dir = c.job_dir();
    let job = c.submit(&dag.write_stamped(&dir, "netns", Some("0.2")));
    c.wait_status(
        job,
        "the far worker running a task",
        Duration::from_secs(120),
        |s| {
            s.tasks
                .iter()
                .any(|t| t.worker == Some(far) && t.state == TaskState::Running)
        },
    );
    ns.link(false);
    let cut_ns = now_ns();
    cut::wait_lost(&c, far, Instant::now(), "a worker whose link was pulled");
    let settled = cut::settle(&c, job, &dag, &dir, far, "far-tmp", cut_ns);
    ns.link(true);
    cut::rejoined_and_unchanged(&c, job, "w1", &settled);
}
