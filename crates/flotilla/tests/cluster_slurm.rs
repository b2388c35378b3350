//! `flotilla alloc` against a real Slurm: a one-node cluster of the test's own
//! (`deploy/slurm/local-cluster.sh`: munged, slurmctld and slurmd as root, on ports of the
//! test's own), a coordinator with no workers of its own, and allocations that bring them.
//!
//! Needs root and Debian's `slurm-wlm` and `munge` (and `slurm-wlm-torque`, Slurm's PBS
//! commands, for the PBS test). Without them each test says why and passes, unless
//! `FLOTILLA_REQUIRE_SLURM=1` (set by `.ci/run`, which installs them): then it fails.

mod kit;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use flotilla::cluster::alloc::{AllocState, Queue};
use kit::{assert_succeeded, wait_until, Cluster, Opts};

/// A one-node Slurm, stopped when dropped.
struct Slurm {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/slurm/local-cluster.sh")
}

impl Slurm {
    /// Starts one on `port` and `port + 1`, or says why it cannot (`None`).
    fn start(port: u16) -> Option<Slurm> {
        Self::start_needing(port, &[])
    }

    /// [`Slurm::start`], needing commands `more` too.
    fn start_needing(port: u16, more: &[&str]) -> Option<Slurm> {
        let required = std::env::var("FLOTILLA_REQUIRE_SLURM").is_ok_and(|v| v == "1");
        let missing = ["slurmctld", "slurmd", "munged", "sbatch"]
            .iter()
            .chain(more)
            .find(|b| {
                !Command::new("sh")
                    .args(["-c", &format!("command -v {b} >/dev/null")])
                    .status()
                    .is_ok_and(|s| s.success())
            });
        let why = if !nix_is_root() {
            Some("not root (slurmd and munged run as root here)".to_string())
        } else {
            missing.map(|b| {
                format!("{b} is not installed (apt-get install slurm-wlm slurm-wlm-torque munge)")
            })
        };
        if let Some(why) = why {
            assert!(!required, "FLOTILLA_REQUIRE_SLURM=1 but {why}");
            eprintln!("skipped: {why}");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("flotilla-slurm")
            .tempdir()
            .expect("a temporary folder");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .env("SLURM_TEST_PORT", port.to_string())
            .output()
            .expect("the script runs");
        assert!(
            out.status.success(),
            "Slurm did not start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = dir.path().join("slurm.conf");
        Some(Slurm { dir, conf })
    }

    /// A coordinator that reaches this Slurm, with no workers, and a quick allocator.
    fn cluster(&self) -> Cluster {
        Cluster::start_with(
            0,
            1,
            Opts {
                server_args: vec!["--alloc-interval".into(), "300ms".into()],
                server_env: vec![("SLURM_CONF".into(), self.conf.display().to_string())],
                ..Opts::default()
            },
        )
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Whatever the test left in Slurm's queue goes first (its workers get SIGTERM and
        // drain), then the daemons (and any job step left).
        let _ = Command::new("scancel")
            .args(["--full", "--quiet", "--user", "root"])
            .env("SLURM_CONF", &self.conf)
            .status();
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < end {
            let empty = Command::new("squeue")
                .args(["-h", "-o", "%i"])
                .env("SLURM_CONF", &self.conf)
                .output()
                .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii().is_empty());
            if empty {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `flotilla alloc info ID --json`.
fn info(c: &Cluster, id: u32) -> Queue {
    let out = c.cli(&["alloc", "info", &id.to_string(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("a queue as JSON")
}

fn add(c: &Cluster, args: &[&str]) -> Queue {
    add_to(c, "slurm", args)
}

/// `flotilla alloc add MANAGER --json ARGS`.
fn add_to(c: &Cluster, manager: &str, args: &[&str]) -> Queue {
    let mut all = vec!["alloc", "add", manager, "--json"];
    all.extend_from_slice(args);
    let out = c.cli(&all);
    assert!(out.status.success(), "alloc add: {out:?}");
    serde_json::from_slice(&out.stdout).expect("a queue as JSON")
}

/// Asserts every task of `s` ran on a worker named `prefix...`.
fn all_ran_on(s: &flotilla::cluster::state::JobStatus, prefix: &str) {
    for t in &s.tasks {
        let w = t
            .worker
            .and_then(|w| s.workers.get(&w).cloned())
            .unwrap_or_default();
        assert!(w.starts_with(prefix), "{} ran on {w:?}", t.name);
    }
}

/// One allocation at a time, of 10 minutes, whose worker leaves after 2 s idle.
const ONE_AT_A_TIME: [&str; 10] = [
    "--time-limit",
    "10m",
    "--max-allocs",
    "1",
    "--backlog",
    "1",
    "--idle-timeout",
    "2s",
    "--worker-arg=--isolation",
    "--worker-arg=none",
];

/// One allocation at a time, of 1 minute, whose worker (one CPU) leaves at 45 s, starting
/// its grace (2 s) + 15 s before: 28 s for tasks.
const ONE_MINUTE: [&str; 16] = [
    "--partition",
    "debug",
    "--time-limit",
    "1m",
    "--max-allocs",
    "1",
    "--backlog",
    "1",
    "--idle-timeout",
    "30s",
    "--worker-arg=--isolation",
    "--worker-arg=none",
    "--worker-arg=--cpus",
    "--worker-arg=1",
    "--worker-arg=--grace",
    "--worker-arg=2s",
];

const LONG: Duration = Duration::from_secs(240);

#[test]
fn a_job_runs_on_workers_that_arrive_only_through_slurm_allocations() {
    let Some(slurm) = Slurm::start(16917) else {
        return;
    };
    let c = slurm.cluster();
    let q = add(
        &c,
        &[&["--partition", "debug"][..], &ONE_AT_A_TIME].concat(),
    );
    assert_eq!(q.id, 1);
    // Nothing waits: nothing is asked.
    assert!(info(&c, 1).allocations.is_empty());
    let text = "name = \"via-slurm\"\n[[task]]\nid = \"t\"\narray = \"0..6\"\n\
                cmd = [\"sh\", \"-c\", \"echo {i} > out-{i}.txt\"]\n\
                outputs = [\"out-{i}.txt\"]\n";
    let job = c.submit_toml("via-slurm.toml", text);
    let s = c.wait_job(job, LONG);
    assert_succeeded(&s);
    // Every task ran on a worker of the queue's allocations.
    let q = info(&c, 1);
    let alloc = q.allocations.first().expect("an allocation").clone();
    all_ran_on(&s, &format!("flotilla-q1-{}-", alloc.id));
    for i in 0..6 {
        let f = c.job_dir().join(format!("out-{i}.txt"));
        assert_eq!(
            std::fs::read_to_string(&f).expect("an output").trim(),
            i.to_string()
        );
    }
    // Idle for 2 s, its worker leaves; the allocation ends (not failed), and no other is
    // asked for.
    let q = wait_until("the allocation to end", LONG, || {
        let q = info(&c, 1);
        q.live().is_empty().then_some(q)
    });
    assert_eq!(q.allocations.len(), 1, "{q:?}");
    assert_eq!(q.allocations[0].state, AllocState::Ended, "{q:?}");
    assert!(q.paused.is_none() && q.failures == 0, "{q:?}");
    // The list shows it; removed, it is gone and its workers' token revoked.
    let list = c.cli(&["alloc", "list"]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains("debug"),
        "{list:?}"
    );
    let out = c.cli(&["alloc", "remove", "1"]);
    assert!(out.status.success(), "{out:?}");
    let out = c.cli(&["alloc", "info", "1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no allocation queue 1"),
        "{out:?}"
    );
}

/// PBS through Slurm's PBS commands (`qsub`, `qstat`, `qdel` of Debian's
/// `slurm-wlm-torque`): a queue with a wrong queue name pauses with PBS's reason, while a
/// right one brings the workers that run the whole job and gives them back when idle.
#[test]
fn a_job_runs_on_workers_that_arrive_through_pbs_allocations() {
    let Some(slurm) = Slurm::start_needing(16947, &["qsub", "qstat", "qdel"]) else {
        return;
    };
    let c = slurm.cluster();
    let common = [&ONE_AT_A_TIME[..], &["--max-failures", "1"]].concat();
    let good = add_to(&c, "pbs", &[&["--queue", "debug"][..], &common].concat());
    let bad = add_to(
        &c,
        "pbs",
        &[&["--queue", "no-such-queue"][..], &common].concat(),
    );
    assert_eq!((good.spec.manager.as_str(), bad.id), ("pbs", 2));
    let text = "name = \"via-pbs\"\n[[task]]\nid = \"t\"\narray = \"0..4\"\n\
                cmd = [\"sh\", \"-c\", \"echo {i} > out-{i}.txt\"]\n\
                outputs = [\"out-{i}.txt\"]\n";
    let job = c.submit_toml("via-pbs.toml", text);
    let s = c.wait_job(job, LONG);
    assert_succeeded(&s);
    let q = info(&c, good.id);
    let alloc = q.allocations.first().expect("an allocation").clone();
    all_ran_on(&s, &format!("flotilla-q{}-{}-", good.id, alloc.id));
    // The script's log is named after the job (it wrote it, not PBS's `-o`).
    let log = Path::new(&q.spec.work_dir).join(format!("flotilla-q{}-{}.log", good.id, alloc.id));
    assert!(log.exists(), "{} missing", log.display());
    // The wrong queue: paused, with what qsub said.
    let why = wait_until("the wrong queue to pause", LONG, || info(&c, bad.id).paused);
    assert!(
        why.contains("no-such-queue") || why.contains("invalid partition"),
        "{why}"
    );
    // Idle, its worker leaves and the allocation ends as asked.
    let q = wait_until("the allocation to end", LONG, || {
        let q = info(&c, good.id);
        q.live().is_empty().then_some(q)
    });
    assert_eq!(q.allocations.len(), 1, "{q:?}");
    assert_eq!(q.allocations[0].state, AllocState::Ended, "{q:?}");
    assert!(q.paused.is_none(), "{q:?}");
}

#[test]
fn allocations_that_fail_pause_the_queue_with_the_reason_and_nothing_is_lost() {
    let Some(slurm) = Slurm::start(16927) else {
        return;
    };
    let c = slurm.cluster();
    // A partition Slurm does not have is refused at once, naming those it has.
    let out = c.cli(&[
        "alloc",
        "add",
        "slurm",
        "--partition",
        "no-such-partition",
        "--time-limit",
        "5m",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no such partition (it has: debug)"),
        "{err}"
    );
    // A request sbatch refuses (a node feature no node has): failures, then a pause.
    add(
        &c,
        &[
            "--partition",
            "debug",
            "--time-limit",
            "5m",
            "--max-failures",
            "2",
            "--",
            "--constraint=nosuch",
        ],
    );
    let job = c.submit_toml(
        "waits.toml",
        "name = \"waits\"\n[[task]]\nid = \"t\"\ncmd = [\"true\"]\n",
    );
    let q = wait_until("the queue to pause", LONG, || {
        let q = info(&c, 1);
        q.paused.is_some().then_some(q)
    });
    let why = q.paused.clone().unwrap_or_default();
    assert!(why.contains("2 failures in a row"), "{why}");
    assert!(
        why.to_lowercase().contains("feature"),
        "Slurm's reason: {why}"
    );
    assert!(q.allocations.is_empty(), "{q:?}");
    // The list shows why.
    let list = c.cli(&["alloc", "list"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        text.contains("paused") && text.contains("feature"),
        "{text}"
    );
    // The job still waits, whole, and says where its workers would come from (it said
    // only that no worker was connected).
    let s = wait_until("the job to name the paused queue", LONG, || {
        c.status(job).filter(|s| {
            s.waiting
                .as_deref()
                .is_some_and(|w| w.contains("allocation queue 1 is paused"))
        })
    });
    assert_eq!(s.counts.ready, 1, "{s:?}");
    // Resumed, it tries again (and pauses again: the partition is still wrong); paused by
    // hand, it says so.
    let out = c.cli(&["alloc", "resume", "1"]);
    assert!(out.status.success(), "{out:?}");
    let out = c.cli(&["alloc", "pause", "1", "--reason", "maintenance"]);
    assert!(out.status.success(), "{out:?}");
    let q = info(&c, 1);
    assert!(q.paused.is_some(), "{q:?}");
    // Named as Slurm's job names show it (`flotilla-q1`), or by a name it does not have.
    let out = c.cli(&["alloc", "info", "q1", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let out = c.cli(&["alloc", "info", "nosuch"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no allocation queue \"nosuch\""),
        "{err}"
    );
    // Resumed twice: the second has nothing to resume, and says so.
    assert!(c.cli(&["alloc", "resume", "1"]).status.success());
    let out = c.cli(&["alloc", "resume", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert!(err.contains("is not paused"), "{err}");
    }
}

#[test]
fn workers_leave_before_their_allocation_ends_and_no_task_is_lost() {
    let Some(slurm) = Slurm::start(16937) else {
        return;
    };
    let c = slurm.cluster();
    // 1-minute allocations: each worker leaves at 45 s, starting its grace + 15 s before.
    // One CPU each, tasks of 8 s: an allocation runs three or four, then the rest wait for
    // the next.
    add(&c, &ONE_MINUTE);
    let text = "name = \"long\"\n[[task]]\nid = \"t\"\narray = \"0..6\"\n\
                cmd = [\"sh\", \"-c\", \"sleep 8; echo done > out-{i}.txt\"]\n\
                outputs = [\"out-{i}.txt\"]\n";
    let job = c.submit_toml("long.toml", text);
    let s = c.wait_job(job, Duration::from_secs(600));
    assert_succeeded(&s);
    for i in 0..6 {
        assert!(c.job_dir().join(format!("out-{i}.txt")).exists(), "out-{i}");
    }
    let q = info(&c, 1);
    assert!(q.allocations.len() >= 2, "more than one allocation: {q:?}");
    // The first ended because its worker left, before Slurm's limit cut it.
    let first = &q.allocations[0];
    assert_eq!(first.state, AllocState::Ended, "{q:?}");
    // No task failed; the allocations' end cost no retry. A task queued on the first
    // worker before its runtime was learned, or cut as that worker left, ran once more on
    // the next (at most once more).
    assert_eq!(s.counts.failed, 0);
    assert!(
        s.tasks.iter().all(|t| t.failures == 0 && t.attempts <= 2),
        "{:?}",
        s.tasks
    );
}

/// A task longer than a worker of the queue ever has, with no checkpoint: its attempt is
/// preempted as the first allocation's worker leaves, and from what it ran the coordinator
/// learns it needs more than any allocation of the queue offers. The queue then asks for no
/// allocation for it (rather than one after another, each cutting it again or sitting
/// idle), says so in `alloc info`, and the task says why it waits.
#[test]
fn a_task_longer_than_every_allocation_is_not_given_allocation_after_allocation() {
    let Some(slurm) = Slurm::start(16957) else {
        return;
    };
    let c = slurm.cluster();
    // 1-minute allocations: 28 s for tasks. Reactive: the round that first sees the
    // allocation ended may have read the work before the cut (the task running, its
    // runtime unknown), which the predictive rule would count as work to come.
    let q = add(&c, &[&ONE_MINUTE[..], &["--rule", "reactive"]].concat());
    let text = "name = \"endless\"\n[[task]]\nid = \"sim\"\ncmd = [\"sleep\", \"600\"]\n";
    let job = c.submit_toml("endless.toml", text);
    let q = wait_until("the queue to find the task too long", LONG, || {
        let q = info(&c, q.id);
        let ended = q
            .allocations
            .first()
            .is_some_and(|a| a.state == AllocState::Ended);
        (ended && q.too_long.is_some()).then_some(q)
    });
    // Seen ended in the round that would have asked for the next: none was.
    assert_eq!(q.allocations.len(), 1, "{q:?}");
    let note = q.too_long.clone().unwrap_or_default();
    assert!(
        note.starts_with("1 task(s) need more than the 28s"),
        "{note}"
    );
    assert!(note.contains("/sim"), "{note}");
    let s = c.status(job).expect("the job");
    let t = &s.tasks[0];
    let message = t.message.clone().unwrap_or_default();
    assert!(
        t.failures == 0 && message.contains("with no checkpoint"),
        "{:?} {message}",
        t.state
    );
    let out = c.cli(&["alloc", "info", &q.id.to_string()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("too long     1 task(s)"),
        "{out:?}"
    );
    let out = c.cli(&["cancel", &job.to_string()]);
    assert!(out.status.success(), "{out:?}");
}
