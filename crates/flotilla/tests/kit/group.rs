//! A group of three coordinators (`flotilla server --node-id N --peers A,B,C`) and its
//! workers, as processes in one temporary folder: `n<id>/` (each node's state), `job/`,
//! `w<i>/` (each worker's). Every node holds the same admin token.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use flotilla::cluster::state::{ClusterStatus, JobStatus};
use flotilla::cluster::{Client, Remote};
use flotilla::core::JobId;

use super::{job_id_of, spawn_logged, wait_until, Proc, BIN, HEARTBEAT_TIMEOUT_MS};

/// The admin token every node of a test group holds.
pub(crate) const TOKEN: &str = "group-test-token-0123456789abcdef";

/// Three coordinators and some workers.
pub(crate) struct Group {
    root: tempfile::TempDir,
    /// Each node's API address, in node-id order.
    pub(crate) peers: Vec<String>,
    nodes: Vec<Option<Proc>>,
    workers: Vec<Option<Proc>>,
    /// Extra environment of every node (test hooks).
    node_env: Vec<(String, String)>,
    /// The certificate and key every node serves with (one self-signed certificate for
    /// 127.0.0.1), when the group speaks TLS.
    pub(crate) tls: Option<(PathBuf, PathBuf)>,
    /// A runtime for the kit's clients.
    pub(crate) rt: tokio::runtime::Runtime,
}

/// A port `p` with `p + 1` free too (the API and the group port), below the kernel's
/// ephemeral range where it has room there: a port from that range, free when picked, could
/// be taken by any outgoing connection (the kit polls the nodes all along) before a node
/// killed and restarted binds it again, which then failed to start.
pub(crate) fn free_pair(taken: &HashSet<u16>) -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let usable = |p: u16| {
        p < u16::MAX
            && !taken.contains(&p)
            && !taken.contains(&(p + 1))
            && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
    };
    if low > 12_000 {
        // From a start that differs between test processes and calls (the pid and the
        // clock), every port pair of [10000, low - 2).
        let span = u32::from(low - 2 - 10_000);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = (std::process::id().wrapping_mul(7919) ^ nanos) % span;
        for k in 0..span {
            let p = 10_000 + ((start + k) % span) as u16;
            if usable(p) {
                return p;
            }
        }
    }
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let p = l.local_addr().expect("its address").port();
        drop(l);
        if usable(p) {
            return p;
        }
    }
}

impl Group {
    /// Three nodes and `workers` workers with 2 CPUs each; returns once a leader answers
    /// with every worker registered.
    pub(crate) fn start(workers: usize) -> Group {
        Group::start_with(workers, &[])
    }

    /// [`Group::start`] with `env` set on every node (started now or later).
    pub(crate) fn start_with(workers: usize, env: &[(&str, &str)]) -> Group {
        Group::start_inner(workers, env, false, &[1, 2, 3])
    }

    /// [`Group::start`] with only the founders `up` started (the others' state folders are
    /// made; [`Group::restart_node`] starts them for the first time).
    pub(crate) fn start_some(workers: usize, up: &[usize]) -> Group {
        Group::start_inner(workers, &[], false, up)
    }

    /// [`Group::start`] speaking TLS everywhere: every node serves one self-signed
    /// certificate (for 127.0.0.1) on its API and group ports; workers, clients and the
    /// other nodes verify it.
    pub(crate) fn start_tls(workers: usize) -> Group {
        Group::start_inner(workers, &[], true, &[1, 2, 3])
    }

    fn start_inner(workers: usize, env: &[(&str, &str)], tls: bool, up: &[usize]) -> Group {
        let root = tempfile::Builder::new()
            .prefix("flotilla-group-test")
            .tempdir()
            .expect("a temporary folder");
        let tls = tls.then(|| {
            let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])
                .expect("a certificate");
            let (cert, key) = (root.path().join("cert.pem"), root.path().join("key.pem"));
            std::fs::write(&cert, ck.cert.pem()).expect("cert.pem");
            std::fs::write(&key, ck.signing_key.serialize_pem()).expect("key.pem");
            (cert, key)
        });
        let mut taken = HashSet::new();
        let peers: Vec<String> = (0..3)
            .map(|_| {
                let p = free_pair(&taken);
                taken.extend([p, p + 1]);
                format!("127.0.0.1:{p}")
            })
            .collect();
        std::fs::create_dir_all(root.path().join("job")).expect("job folder");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let mut g = Group {
            root,
            peers,
            nodes: Vec::new(),
            workers: Vec::new(),
            node_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            tls,
            rt,
        };
        for id in 1..=3 {
            g.new_state(id);
            let p = up.contains(&id).then(|| g.spawn_node(id, false).0);
            g.nodes.push(p);
        }
        for _ in 0..workers {
            g.add_worker();
        }
        g.wait_workers(workers);
        g
    }

    /// Node `id`'s state folder.
    pub(crate) fn state(&self, id: usize) -> PathBuf {
        self.root.path().join(format!("n{id}"))
    }

    /// Empties node `id`'s state folder (a lost disk), leaving only the group's token.
    pub(crate) fn wipe_state(&self, id: usize) {
        std::fs::remove_dir_all(self.state(id)).expect("remove the state folder");
        self.new_state(id);
    }

    /// Makes node `id`'s state folder, holding only the group's token.
    fn new_state(&self, id: usize) {
        let state = self.state(id);
        std::fs::create_dir_all(&state).expect("state folder");
        let token = state.join("token");
        std::fs::write(&token, TOKEN).expect("token");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }

    /// The addresses as clients take them (`a,b,c`).
    pub(crate) fn list(&self) -> String {
        self.peers.join(",")
    }

    /// Starts node `id` (with `--join` when it was added to the running group or `join`);
    /// its stderr lines come on the receiver too.
    fn spawn_node(&self, id: usize, join: bool) -> (Proc, std::sync::mpsc::Receiver<String>) {
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
        .args(["--heartbeat-timeout-ms", &HEARTBEAT_TIMEOUT_MS.to_string()]);
        if let Some((cert, key)) = &self.tls {
            cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        if id > 3 || join {
            // Added to the running group (`Group::add_node`), not one of its founders.
            cmd.arg("--join");
        }
        for (k, v) in &self.node_env {
            cmd.env(k, v);
        }
        spawn_logged(cmd, &format!("n{id}"))
    }

    /// Starts one more node with `--join` (its address appended to the list, an empty state
    /// folder with the token); returns its id. It waits for `flotilla admin group add`.
    pub(crate) fn add_node(&mut self) -> usize {
        let taken: HashSet<u16> = self
            .peers
            .iter()
            .filter_map(|p| p.rsplit_once(':')?.1.parse::<u16>().ok())
            .flat_map(|p| [p, p + 1])
            .collect();
        let p = free_pair(&taken);
        self.peers.push(format!("127.0.0.1:{p}"));
        let id = self.peers.len();
        self.new_state(id);
        let (node, _) = self.spawn_node(id, false);
        self.nodes.push(Some(node));
        id
    }

    /// The nodes started and not killed by the test that have exited on their own.
    pub(crate) fn exited_nodes(&mut self) -> Vec<usize> {
        let mut gone = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if n.as_mut().is_some_and(Proc::exited) {
                gone.push(i + 1);
            }
        }
        gone
    }

    /// Starts one more worker `w<i>` (2 CPUs); returns `i`.
    pub(crate) fn add_worker(&mut self) -> usize {
        self.add_worker_with(2)
    }

    /// Starts one more worker `w<i>` with `cpus` CPUs; returns `i`.
    pub(crate) fn add_worker_with(&mut self, cpus: u32) -> usize {
        let i = self.workers.len();
        let tmp = self.root.path().join(format!("tmp-w{i}"));
        std::fs::create_dir_all(&tmp).expect("the worker's TMPDIR");
        let mut cmd = Command::new(BIN);
        cmd.args(["worker", "--server", &self.list()])
            .args([
                "--cpus",
                &cpus.to_string(),
                "--gpus",
                "none",
                "--isolation",
                "none",
            ])
            .args(["--name", &format!("w{i}")])
            .arg("--work-dir")
            .arg(self.root.path().join(format!("w{i}")))
            .env("FLOTILLA_TOKEN", TOKEN)
            // Tasks get the worker's TMPDIR (one of the few host variables they see): a
            // test's task can say which worker ran it (`${TMPDIR##*/}` is `tmp-w<i>`).
            .env("TMPDIR", &tmp)
            .env_remove("FLOTILLA_SERVER");
        if let Some((cert, _)) = &self.tls {
            cmd.arg("--tls-ca").arg(cert);
        }
        self.workers
            .push(Some(spawn_logged(cmd, &format!("w{i}")).0));
        i
    }

    /// Worker `i`'s process, while it runs.
    pub(crate) fn worker(&self, i: usize) -> Option<&Proc> {
        self.workers.get(i).and_then(|w| w.as_ref())
    }

    /// SIGKILLs worker `i`.
    pub(crate) fn kill_worker(&mut self, i: usize) {
        if let Some(p) = self.workers.get_mut(i).and_then(|w| w.take()) {
            p.kill();
        }
    }

    /// Node `id`'s process, while it runs.
    pub(crate) fn node(&self, id: usize) -> Option<&Proc> {
        self.nodes.get(id - 1).and_then(|n| n.as_ref())
    }

    /// SIGKILLs node `id`.
    pub(crate) fn kill_node(&mut self, id: usize) {
        if let Some(p) = self.nodes.get_mut(id - 1).and_then(|n| n.take()) {
            p.kill();
        }
    }

    /// Starts node `id` again (it rejoins as a follower).
    pub(crate) fn restart_node(&mut self, id: usize) {
        self.restart_node_logged(id, false);
    }

    /// [`Group::restart_node`] (with `--join` when `join`); returns the node's stderr lines
    /// (the channel closes when it exits).
    pub(crate) fn restart_node_logged(
        &mut self,
        id: usize,
        join: bool,
    ) -> std::sync::mpsc::Receiver<String> {
        let (p, lines) = self.spawn_node(id, join);
        self.nodes[id - 1] = Some(p);
        lines
    }

    /// Restarts every node whose process has ended (a leader that lost its leadership stops
    /// by design); returns their ids.
    pub(crate) fn restart_exited(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for id in 1..=self.nodes.len() {
            let gone = match self.nodes[id - 1].as_mut() {
                Some(p) => p.exited(),
                None => false,
            };
            if gone {
                self.restart_node(id);
                out.push(id);
            }
        }
        out
    }

    /// The job folder.
    pub(crate) fn job_dir(&self) -> PathBuf {
        self.root.path().join("job")
    }

    /// A client of whichever node leads; `None` while none answers.
    pub(crate) fn client(&self) -> Option<Client> {
        self.client_as(TOKEN)
    }

    /// [`Group::client`] presenting `token`.
    pub(crate) fn client_as(&self, token: &str) -> Option<Client> {
        let mut remote = Remote::new(self.list(), token);
        remote.tls_ca = self.tls.as_ref().map(|(cert, _)| cert.clone());
        self.rt.block_on(Client::connect(&remote)).ok()
    }

    /// The cluster as the leader sees it; `None` while none answers.
    pub(crate) fn overview(&self) -> Option<ClusterStatus> {
        let mut c = self.client()?;
        self.rt.block_on(c.cluster_status()).ok()
    }

    /// The cluster's overview, asked until a leader answers (a group's first leader may
    /// hand over at once, an election of its own under load).
    pub(crate) fn overview_of_a_leader(&self) -> ClusterStatus {
        wait_until("a leader to answer", Duration::from_secs(60), || {
            self.overview()
        })
    }

    /// A job's status, asked until a leader answers (right after a failover, a second
    /// election under load leaves the group without one for a moment).
    pub(crate) fn status_of_a_leader(&self, job: JobId) -> JobStatus {
        wait_until(
            &format!("a leader to answer for {job}"),
            Duration::from_secs(60),
            || self.status(job),
        )
    }

    /// A job's status; `None` while no leader answers.
    pub(crate) fn status(&self, job: JobId) -> Option<JobStatus> {
        let mut c = self.client()?;
        self.rt.block_on(c.job_status(job)).ok()
    }

    /// Waits until `n` workers are registered with a leader.
    pub(crate) fn wait_workers(&self, n: usize) {
        wait_until(
            &format!("a leader with {n} workers"),
            Duration::from_secs(60),
            || self.overview().filter(|s| s.workers.len() >= n),
        );
    }

    /// The leader's node id, once one answers.
    pub(crate) fn leader(&self) -> usize {
        wait_until("a leader", Duration::from_secs(60), || {
            let addr = self.overview()?.leader?;
            self.peers.iter().position(|p| *p == addr).map(|i| i + 1)
        })
    }

    /// Runs the CLI against the group (with `--tls-ca` last when it speaks TLS).
    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        self.cli_command(args)
            .output()
            .expect("the flotilla binary runs")
    }

    /// The command [`Group::cli`] runs, to start in the background.
    pub(crate) fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        if let Some((cert, _)) = &self.tls {
            cmd.arg("--tls-ca").arg(cert);
        }
        cmd.current_dir(self.job_dir())
            .env("FLOTILLA_SERVER", self.list())
            .env("FLOTILLA_TOKEN", TOKEN)
            .stdin(Stdio::null());
        cmd
    }

    /// `flotilla submit FILE`: the job id.
    pub(crate) fn submit(&self, file: &Path) -> JobId {
        let out = self.cli(&["submit", &file.display().to_string()]);
        assert!(
            out.status.success(),
            "submit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        job_id_of(&out)
    }

    /// Waits until the job has a final state.
    pub(crate) fn wait_job(&self, job: JobId, timeout: Duration) -> JobStatus {
        wait_until(&format!("{job} to finish"), timeout, || {
            self.status(job).filter(|s| s.finished_state().is_some())
        })
    }

    /// SIGKILLs the leader `id`; returns how long until another node answered as leader.
    pub(crate) fn kill_leader(&mut self, id: usize) -> Duration {
        self.kill_node(id);
        let t = Instant::now();
        let new = wait_until("a new leader", Duration::from_secs(60), || {
            let addr = self.overview()?.leader?;
            (addr != self.peers[id - 1]).then_some(addr)
        });
        let took = t.elapsed();
        eprintln!("failover: node {id} killed, {new} leads after {took:?}");
        took
    }
}

impl Drop for Group {
    /// Kills the workers, then the nodes, before the folder is removed.
    fn drop(&mut self) {
        for w in self.workers.iter_mut() {
            if let Some(p) = w.take() {
                p.kill();
            }
        }
        for n in self.nodes.iter_mut() {
            if let Some(p) = n.take() {
                p.kill();
            }
        }
    }
}
