//! A group of three coordinators (`flotilla server --node-id N --peers A,B,C`), as real
//! processes: the leader is SIGKILLed mid-job and the job finishes on the new leader with
//! the right hashes, no task that had finished runs again, and a token made on the old
//! leader works on the new one. The killed node restarts as a follower and catches up, and
//! the group survives a second failover onto it.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use flotilla::cluster::state::{ClusterStatus, JobStatus, TaskState};
use flotilla::cluster::{Client, Remote};
use flotilla::core::JobId;
use kit::{assert_succeeded, job_id_of, last_line, spawn_logged, wait_until, HashDag, Proc, BIN};

const TOKEN: &str = "group-test-token-0123456789abcdef";

/// Three coordinators and two workers in one temporary folder.
struct Group {
    root: tempfile::TempDir,
    peers: Vec<String>,
    nodes: Vec<Option<Proc>>,
    _workers: Vec<Proc>,
    rt: tokio::runtime::Runtime,
}

/// A port `p` with `p + 1` free too (the API and the group port), from the ephemeral range.
fn free_pair(taken: &HashSet<u16>) -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p == u16::MAX || taken.contains(&p) || taken.contains(&(p + 1)) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

impl Group {
    fn start(workers: usize) -> Group {
        let root = tempfile::Builder::new()
            .prefix("flotilla-group-test")
            .tempdir()
            .unwrap();
        let mut taken = HashSet::new();
        let peers: Vec<String> = (0..3)
            .map(|_| {
                let p = free_pair(&taken);
                taken.extend([p, p + 1]);
                format!("127.0.0.1:{p}")
            })
            .collect();
        std::fs::create_dir_all(root.path().join("job")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut g = Group {
            root,
            peers,
            nodes: Vec::new(),
            _workers: Vec::new(),
            rt,
        };
        for id in 1..=3 {
            let state = g.state(id);
            std::fs::create_dir_all(&state).unwrap();
            let token = state.join("token");
            std::fs::write(&token, TOKEN).unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
            let p = g.spawn_node(id);
            g.nodes.push(Some(p));
        }
        for i in 0..workers {
            let mut cmd = Command::new(BIN);
            cmd.args(["worker", "--server", &g.list()])
                .args(["--cpus", "2", "--gpus", "none", "--isolation", "none"])
                .args(["--name", &format!("w{i}")])
                .arg("--work-dir")
                .arg(g.root.path().join(format!("w{i}")))
                .env("FLOTILLA_TOKEN", TOKEN)
                .env_remove("FLOTILLA_SERVER");
            g._workers.push(spawn_logged(cmd, &format!("w{i}")).0);
        }
        wait_until(
            &format!("a leader with {workers} workers"),
            Duration::from_secs(60),
            || g.overview().filter(|s| s.workers.len() >= workers),
        );
        g
    }

    fn state(&self, id: usize) -> PathBuf {
        self.root.path().join(format!("n{id}"))
    }

    fn list(&self) -> String {
        self.peers.join(",")
    }

    fn spawn_node(&self, id: usize) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "server",
            "--node-id",
            &id.to_string(),
            "--peers",
            &self.list(),
        ])
        .arg("--state")
        .arg(self.state(id))
        .args([
            "--heartbeat-timeout-ms",
            &kit::HEARTBEAT_TIMEOUT_MS.to_string(),
        ]);
        spawn_logged(cmd, &format!("n{id}")).0
    }

    fn job_dir(&self) -> PathBuf {
        self.root.path().join("job")
    }

    fn client(&self) -> Option<Client> {
        self.client_as(TOKEN)
    }

    fn client_as(&self, token: &str) -> Option<Client> {
        let remote = Remote::new(self.list(), token);
        self.rt.block_on(Client::connect(&remote)).ok()
    }

    /// The cluster as the leader sees it; `None` while none answers.
    fn overview(&self) -> Option<ClusterStatus> {
        let mut c = self.client()?;
        self.rt.block_on(c.cluster_status()).ok()
    }

    fn status(&self, job: JobId) -> Option<JobStatus> {
        let mut c = self.client()?;
        self.rt.block_on(c.job_status(job)).ok()
    }

    /// The leader's node id (1-based).
    fn leader(&self) -> usize {
        wait_until("a leader", Duration::from_secs(60), || {
            let s = self.overview()?;
            let addr = s.leader?;
            self.peers.iter().position(|p| *p == addr).map(|i| i + 1)
        })
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .current_dir(self.job_dir())
            .env("FLOTILLA_SERVER", self.list())
            .env("FLOTILLA_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn submit(&self, file: &Path) -> JobId {
        let out = self.cli(&["submit", &file.display().to_string()]);
        assert!(
            out.status.success(),
            "submit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        job_id_of(&out)
    }

    fn wait_job(&self, job: JobId) -> JobStatus {
        wait_until(
            &format!("{job} to finish"),
            Duration::from_secs(180),
            || self.status(job).filter(|s| s.finished_state().is_some()),
        )
    }

    /// SIGKILLs node `id`; returns how long until another node answered as leader.
    fn kill_leader(&mut self, id: usize) -> Duration {
        self.nodes[id - 1].take().expect("the node runs").kill();
        let t = Instant::now();
        let new = wait_until("a new leader", Duration::from_secs(60), || {
            let s = self.overview()?;
            let addr = s.leader?;
            (addr != self.peers[id - 1]).then_some(addr)
        });
        let took = t.elapsed();
        eprintln!("failover: node {id} killed, {new} leads after {took:?}");
        took
    }
}

#[test]
fn the_leader_killed_mid_job_the_job_finishes_on_the_new_one_without_reruns() {
    let dag = HashDag::random(120, 0x4a_0001);
    let mut g = Group::start(2);
    let dir = g.job_dir();
    let status = g.overview().unwrap();
    let group = status.group.expect("a group status");
    assert_eq!(group.members.len(), 3, "{group:?}");
    assert_eq!(group.members.iter().filter(|m| m.leader).count(), 1);

    // A tenant token made on the first leader must work on the next.
    let out = g.cli(&["admin", "tenant", "add", "lab"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lab = last_line(&out);

    let job = g.submit(&dag.write(&dir, "failover", Some("0.1")));
    let first = g.leader();
    let before = wait_until(
        "a quarter of the tasks done",
        Duration::from_secs(120),
        || {
            let s = g.status(job)?;
            let done: HashSet<String> = s
                .tasks
                .iter()
                .filter(|t| t.state == TaskState::Done)
                .map(|t| t.name.clone())
                .collect();
            (done.len() >= 30).then_some(done)
        },
    );
    let took = g.kill_leader(first);
    let s = g.wait_job(job);
    assert_succeeded(&s);
    dag.check_outputs(&dir);
    let runs = dag.completed_runs(&dir);
    for (i, n) in runs.iter().enumerate() {
        let id = HashDag::id(i);
        if before.contains(&id) {
            assert_eq!(
                *n, 1,
                "{id} had finished before the failover but ran {n} times"
            );
        } else {
            assert!(*n >= 1, "{id} never ran");
        }
    }
    assert!(
        g.client_as(&lab)
            .and_then(|mut c| g.rt.block_on(c.cluster_status()).ok())
            .is_some(),
        "the tenant token made on the old leader is refused by the new one"
    );
    eprintln!("failover took {took:?}");

    // The killed node comes back as a follower and catches up; then its turn to lead.
    let p = g.spawn_node(first);
    g.nodes[first - 1] = Some(p);
    let second = g.leader();
    assert_ne!(second, first);
    let caught_up = |g: &Group| {
        let s = g.overview()?;
        let grp = s.group?;
        let me = grp.members.iter().find(|m| m.id == first as u64)?;
        (me.matched.is_some() && me.matched == grp.applied).then_some(())
    };
    wait_until(
        "the restarted node to catch up",
        Duration::from_secs(60),
        || caught_up(&g),
    );
    let dag2 = HashDag::random(40, 0x4a_0002);
    let dir2 = dir.join("second");
    let job2 = g.submit(&dag2.write(&dir2, "second", Some("0.1")));
    wait_until(
        "some of the second job done",
        Duration::from_secs(120),
        || {
            let s = g.status(job2)?;
            (s.tasks
                .iter()
                .filter(|t| t.state == TaskState::Done)
                .count()
                >= 5)
                .then_some(())
        },
    );
    g.kill_leader(second);
    let s2 = g.wait_job(job2);
    assert_succeeded(&s2);
    dag2.check_outputs(&dir2);
    // The first job is still known, and still succeeded, on the third leader.
    let s1 = g.status(job).expect("the first job's status");
    assert_succeeded(&s1);
}
