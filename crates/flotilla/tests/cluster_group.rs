//! Gangs (`group = { size = N }`) end to end through the `flotilla` binary, a real
//! coordinator and real workers: members start together, each knows its rank, the world
//! size and a rendezvous address where a real communicator is built; a member that fails
//! restarts the whole gang, counted as one retry.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use flotilla::cluster::state::{JobState, TaskState};
use kit::{assert_succeeded, task, Cluster};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_failed_member_restarts_the_whole_gang_once_with_a_new_rendezvous() {
    let c = Cluster::start(2, 1);
    // Rank 1 fails in its first attempt once rank 0 has started (not after a head start,
    // which a loaded machine can outlast); rank 0 waits for a file that never comes, so only
    // the gang's restart (a Cancel) ends its first attempt.
    let job = c.submit_toml(
        "gang.toml",
        r#"
name = "gang"
[defaults]
retries = 1
[[task]]
id = "member"
group = { size = 2 }
resources = { cpus = 1 }
cmd = ["sh", "-c", """
mkdir -p seen
echo "$FLOTILLA_RANK $FLOTILLA_WORLD_SIZE $FLOTILLA_RENDEZVOUS" > seen/r$FLOTILLA_RANK-a$FLOTILLA_ATTEMPT
if [ "$FLOTILLA_ATTEMPT" = 1 ]; then
  if [ "$FLOTILLA_RANK" = 1 ]; then while [ ! -e seen/r0-a1 ]; do sleep 0.05; done; exit 3; fi
  while [ ! -e never ]; do sleep 0.05; done
fi
"""]
"#,
    );
    let s = c.wait_job(job, WAIT);
    assert_succeeded(&s);
    assert_eq!(s.state, JobState::Succeeded);
    assert_eq!(s.retries, 1, "one restart of the gang, counted once");
    for r in 0..2 {
        let t = task(&s, &format!("member[{r}]"));
        assert_eq!(t.state, TaskState::Done);
        assert_eq!(t.attempts, 2, "member[{r}] ran twice (with its gang)");
    }
    let seen = |r: u32, a: u32| -> Vec<String> {
        let p = c.job_dir().join(format!("seen/r{r}-a{a}"));
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (a0, a1, b0, b1) = (seen(0, 1), seen(1, 1), seen(0, 2), seen(1, 2));
    assert_eq!((a0[0].as_str(), a0[1].as_str()), ("0", "2"));
    assert_eq!((a1[0].as_str(), a1[1].as_str()), ("1", "2"));
    assert_eq!(a0[2], a1[2], "one rendezvous per gang incarnation");
    assert_eq!(b0[2], b1[2]);
    assert_ne!(a0[2], b0[2], "a restarted gang meets under a new key");
    assert!(
        a0[2].starts_with("127.0.0.1:") && a0[2].contains('/'),
        "rendezvous {:?} is HOST:PORT/KEY",
        a0[2]
    );
}

#[test]
fn gang_members_build_a_real_communicator_from_what_the_worker_tells_them() {
    let c = Cluster::start(2, 1);
    // Each rank runs an allreduce benchmark over the communicator it builds from
    // FLOTILLA_RANK / FLOTILLA_WORLD_SIZE / FLOTILLA_RENDEZVOUS: it only finishes if both ranks
    // met at the coordinator's rendezvous and every allreduce summed correctly.
    let job = c.submit_toml(
        "allreduce.toml",
        &format!(
            r#"
name = "allreduce"
[[task]]
id = "rank"
group = {{ size = 2 }}
resources = {{ cpus = 1 }}
cmd = ["sh", "-c", "exec '{}' bench allreduce-rank --bytes 4KiB,1MiB --rounds 2 --transport tcp > out-$FLOTILLA_RANK.json"]
"#,
            kit::BIN
        ),
    );
    let s = c.wait_job(job, WAIT);
    assert_succeeded(&s);
    let out = std::fs::read_to_string(c.job_dir().join("out-0.json")).unwrap();
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["bytes"], 4096);
    assert_eq!(lines[1]["bytes"], 1 << 20);
    for l in &lines {
        assert_eq!(l["ranks"], 2);
        assert_eq!(l["transport"], "tcp");
        assert!(l["busbw_gbs"].as_f64().unwrap() > 0.0);
    }
    let rank1 = std::fs::read_to_string(c.job_dir().join("out-1.json")).unwrap();
    assert!(rank1.is_empty(), "only rank 0 prints");
}

/// The trainer of `examples/train`, built by `cargo test --workspace` beside this binary (or
/// built here when this test runs alone).
fn trainer() -> std::path::PathBuf {
    let bin = std::path::Path::new(kit::BIN).with_file_name("flotilla-train");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = std::process::Command::new(cargo)
            .args(["build", "-p", "flotilla-train"])
            .status()
            .unwrap();
        assert!(st.success(), "cannot build flotilla-train");
    }
    assert!(bin.exists(), "{} is missing", bin.display());
    bin
}

fn final_line(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .find(|l| l.starts_with("final "))
        .unwrap_or_else(|| panic!("no final line in {}:\n{text}", path.display()))
        .to_string()
}

#[test]
fn a_training_gang_survives_a_killed_rank_and_ends_exactly_like_an_uninterrupted_run() {
    let c = Cluster::start(2, 1);
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/train/data/digits.csv");
    let job = |name: &str, delay: u32| {
        format!(
            r#"
name = "{name}"
[defaults]
retries = 1
[[task]]
id = "train"
group = {{ size = 2 }}
resources = {{ cpus = 1 }}
cmd = ["sh", "-c", "echo $$ > {name}-pid-$FLOTILLA_RANK-$FLOTILLA_ATTEMPT; exec '{bin}' --data '{data}' --steps 150 --batch 64 --lr 0.5 --seed 3 --checkpoint-dir {name}-ckpt --checkpoint-every 20 --step-delay-ms {delay} --log {name}-{{rank}}-$FLOTILLA_ATTEMPT.log"]
"#,
            bin = trainer().display(),
            data = data.display(),
        )
    };
    // The reference: the same training, nobody killed.
    let reference = c.submit_toml("ref.toml", &job("ref", 0));
    assert_succeeded(&c.wait_job(reference, WAIT));
    let expected = final_line(&c.job_dir().join("ref-0-1.log"));

    let killed = c.submit_toml("kill.toml", &job("kill", 50));
    let log1 = c.job_dir().join("kill-1-1.log");
    kit::wait_until("rank 1 past step 50", WAIT, || {
        let text = std::fs::read_to_string(&log1).ok()?;
        text.lines()
            .filter_map(|l| l.strip_prefix("step "))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u32>().ok())
            .any(|s| s >= 50)
            .then_some(())
    });
    let pid = std::fs::read_to_string(c.job_dir().join("kill-pid-1-1")).unwrap();
    let st = std::process::Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -KILL {pid}");
    let s = c.wait_job(killed, WAIT);
    assert_succeeded(&s);
    assert_eq!(s.retries, 1, "one gang restart");
    for r in 0..2 {
        assert_eq!(task(&s, &format!("train[{r}]")).attempts, 2);
    }
    let resumed = std::fs::read_to_string(c.job_dir().join("kill-0-2.log")).unwrap();
    let first: u32 = resumed
        .lines()
        .find_map(|l| l.strip_prefix("step "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(
        first > 20,
        "the restarted gang resumed from a checkpoint, not from step 1 (first step {first})"
    );
    for r in 0..2 {
        assert_eq!(
            final_line(&c.job_dir().join(format!("kill-{r}-2.log"))),
            expected,
            "rank {r} ends bit for bit like the uninterrupted run"
        );
    }
}

/// A gang is launched as torchrun would launch it: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` let PyTorch's
/// `init_process_group(init_method="env://")` meet with no launcher. Rank 0 listens where
/// they say, as PyTorch's store does, and rank 1 reaches it there (an ML engineer's
/// walkthrough found no way to get rank 0's address).
#[test]
fn gang_members_meet_at_master_addr_and_port_as_pytorch_s_env_init_does() {
    let c = Cluster::start(2, 1);
    std::fs::write(
        c.job_dir().join("store.py"),
        r#"
import os, socket, time
r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
local = os.environ["LOCAL_RANK"] + "/" + os.environ["LOCAL_WORLD_SIZE"]
if r == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen()
    c, _ = s.accept()
    peer = c.recv(64).decode()
    c.sendall(b"0")
else:
    until = time.time() + 60
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > until:
                raise
            time.sleep(0.05)
    c.sendall(str(r).encode())
    peer = c.recv(64).decode()
open("out%d.txt" % r, "w").write("%d %d %s %s:%d %s\n" % (r, n, local, addr, port, peer))
"#,
    )
    .unwrap();
    let job = c.submit_toml(
        "ddp.toml",
        "name = \"ddp\"\n[[task]]\nid = \"train\"\ngroup = { size = 2 }\n\
         resources = { cpus = 1 }\ntimeout = \"2m\"\ncmd = [\"python3\", \"store.py\"]\n",
    );
    assert_succeeded(&c.wait_job(job, WAIT));
    let out = |r: u32| -> Vec<String> {
        let p = c.job_dir().join(format!("out{r}.txt"));
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (r0, r1) = (out(0), out(1));
    assert_eq!(&r0[..2], ["0", "2"]);
    assert_eq!(&r1[..2], ["1", "2"]);
    // The test's workers share this host: local ranks 0 and 1 of 2, rank 0 on loopback.
    let mut locals = [r0[2].clone(), r1[2].clone()];
    locals.sort();
    assert_eq!(locals, ["0/2", "1/2"]);
    assert_eq!(r0[3], r1[3], "one master for the gang");
    assert!(r0[3].starts_with("127.0.0.1:"), "{}", r0[3]);
    assert_eq!((r0[4].as_str(), r1[4].as_str()), ("1", "0"), "they met");
}
