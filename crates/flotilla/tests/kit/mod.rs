//! The process-level test kit: a real coordinator and real workers (the `flotilla` binary)
//! on 127.0.0.1 with ephemeral ports, each in its own temporary folder, killed on purpose
//! (SIGKILL) and restarted on the same state directory and port. Everything waits on events
//! (a line on a process's stderr, a status document reaching a state), with deadlines,
//! never on fixed sleeps. Dropping a [`Cluster`] kills every process it started.
//!
//! Also the hash DAG shared by the DAG and fault tests: a seeded random DAG whose tasks each
//! write `out/<id>` = sha256(id ++ parents' outputs) with coreutils, so the test can
//! recompute every file in Rust and prove both order and data.

#![allow(dead_code)] // each test file uses a part of the kit

pub(crate) mod cut;

/// A transfer job whose `a` reads the uploaded `in.txt` and whose `b` (3 CPUs: it waits
/// for a worker that big) reads it and `a`'s output: for uploads that must outlive a
/// coordinator (`b.txt` ends up "kept\nkept\n" when `in.txt` holds "kept\n"; `a` prints
/// `a-says-hello`).
pub(crate) const UPLOADS_JOB: &str = r#"name = "uploads"
staging = "transfer"

[[task]]
id = "a"
inputs = ["in.txt"]
cmd = ["sh", "-c", "cat in.txt > a.txt; echo a-says-hello"]
outputs = ["a.txt"]

[[task]]
id = "b"
after = ["a"]
resources = { cpus = 3 }
inputs = ["in.txt"]
cmd = ["sh", "-c", "cat in.txt a.txt > b.txt"]
outputs = ["b.txt"]
"#;
pub(crate) mod group;
pub(crate) mod relay;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flotilla::cluster::state::{ClusterStatus, JobState, JobStatus, TaskState};
use flotilla::cluster::{Client, Remote};
use flotilla::core::{JobId, WorkerId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_flotilla");

/// The heartbeat timeout the kit's servers run with: four missed heartbeats (one a second),
/// so that a loaded machine does not lose a live worker, yet a killed one is found lost in
/// seconds (the default is 5 s).
pub(crate) const HEARTBEAT_TIMEOUT_MS: u64 = 4000;

/// `flotilla run job.toml` on this machine (2 CPUs, no GPU) in a new temporary folder holding
/// `toml` as its job file, with `extra` arguments and environment; the folder (kept while
/// the returned guard lives) and the output.
pub(crate) fn run_local(
    toml: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (tempfile::TempDir, Output) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    std::fs::write(dir.path().join("job.toml"), toml).expect("write the job file");
    let out = Command::new(BIN)
        .args(["run", "job.toml", "--cpus", "2", "--gpus", "none"])
        .args(extra)
        .current_dir(dir.path())
        .env("FLOTILLA_HOME", dir.path().join(".home"))
        .envs(env.iter().copied())
        .output()
        .expect("the flotilla binary runs");
    (dir, out)
}

/// Polls `f` every 20 ms until it returns `Some`, or panics naming `what` after `timeout`.
pub(crate) fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= end {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process, killed (SIGKILL) and reaped when dropped.
pub(crate) struct Proc {
    child: Child,
    name: String,
}

impl Proc {
    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (reaped if so).
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Its exit status once it has exited (reaped then).
    pub(crate) fn status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `sig` (e.g. `libc::SIGSTOP`).
    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// SIGKILL, then reap.
    pub(crate) fn kill(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// Starts `cmd` with stderr piped; a thread forwards each stderr line to the test's output
/// (shown when a test fails) and to the returned channel, which closes at EOF.
pub(crate) fn spawn_logged(mut cmd: Command, name: &str) -> (Proc, mpsc::Receiver<String>) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let stderr = child.stderr.take().expect("stderr was piped");
    let (tx, rx) = mpsc::channel();
    let label = name.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("[{label}] {line}");
            let _ = tx.send(line);
        }
    });
    (
        Proc {
            child,
            name: name.to_string(),
        },
        rx,
    )
}

/// A coordinator and its workers, as processes, in one temporary folder:
/// `state/` (the coordinator's), `job/` (the job folder), `w<i>/` (each worker's).
pub(crate) struct Cluster {
    root: tempfile::TempDir,
    /// The coordinator's state directory.
    pub(crate) state: PathBuf,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Where it serves HTTP (`--http-listen` among the server's arguments).
    pub(crate) http: Option<SocketAddr>,
    /// Its access token.
    pub(crate) token: String,
    server: Option<Proc>,
    workers: Vec<Option<Proc>>,
    /// Each worker's stderr lines, by index as `workers`.
    worker_lines: Vec<mpsc::Receiver<String>>,
    rt: tokio::runtime::Runtime,
    client: std::cell::RefCell<Option<Client>>,
    opts: Opts,
}

/// Extra arguments for the processes of a [`Cluster`] (e.g. TLS).
#[derive(Clone, Debug, Default)]
pub(crate) struct Opts {
    /// Appended to `flotilla server`.
    pub(crate) server_args: Vec<String>,
    /// Appended to `flotilla worker` and to every CLI call made with [`Cluster::cli`].
    pub(crate) remote_args: Vec<String>,
    /// The CA the kit's own client verifies the coordinator with (TLS when set).
    pub(crate) tls_ca: Option<PathBuf>,
    /// The state folder is a tmpfs of this size (e.g. `"2m"`), mounted by the kit (root
    /// only) and unmounted when the cluster is dropped: a disk that fills up.
    pub(crate) state_tmpfs: Option<String>,
    /// Where the coordinator listens (default `127.0.0.1:0`).
    pub(crate) listen: Option<SocketAddr>,
    /// More environment variables for the coordinator (e.g. `SLURM_CONF`).
    pub(crate) server_env: Vec<(String, String)>,
}

impl Cluster {
    /// A coordinator and `workers` workers offering `cpus` CPUs each; returns once every
    /// worker has registered.
    pub(crate) fn start(workers: usize, cpus: u32) -> Cluster {
        Self::start_with(workers, cpus, Opts::default())
    }

    /// [`Cluster::start`] with extra process arguments.
    pub(crate) fn start_with(workers: usize, cpus: u32, opts: Opts) -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("flotilla-cluster-test")
            .tempdir()
            .expect("a temporary folder");
        let state = root.path().join("state");
        std::fs::create_dir_all(root.path().join("job")).expect("job folder");
        if let Some(size) = &opts.state_tmpfs {
            std::fs::create_dir_all(&state).expect("state folder");
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&state)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cannot mount a tmpfs on {}", state.display());
        }
        let (server, addr, http) = start_server(
            &state,
            opts.listen
                .unwrap_or_else(|| "127.0.0.1:0".parse().expect("an address")),
            &opts.server_args,
            &opts.server_env,
        );
        let token = std::fs::read_to_string(state.join("token"))
            .expect("the server wrote its token")
            .trim()
            .to_string();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let mut c = Cluster {
            root,
            state,
            addr,
            http,
            token,
            server: Some(server),
            workers: Vec::new(),
            worker_lines: Vec::new(),
            rt,
            client: std::cell::RefCell::new(None),
            opts,
        };
        for _ in 0..workers {
            c.add_worker(cpus);
        }
        c.wait_workers(workers);
        c
    }

    /// The job folder (`staging = "shared"`: every worker sees it).
    pub(crate) fn job_dir(&self) -> PathBuf {
        self.root.path().join("job")
    }

    /// Starts one more worker named `w<i>`; returns `i`. Does not wait for it to register.
    pub(crate) fn add_worker(&mut self, cpus: u32) -> usize {
        self.add_worker_with(cpus, &[])
    }

    /// [`Cluster::add_worker`] with extra `flotilla worker` arguments (e.g. `--mem 1GiB`).
    pub(crate) fn add_worker_with(&mut self, cpus: u32, extra: &[&str]) -> usize {
        let token = self.token.clone();
        self.add_worker_as(cpus, extra, &token)
    }

    /// [`Cluster::add_worker_with`] enrolling with `token` (e.g. a worker enrolment token).
    pub(crate) fn add_worker_as(&mut self, cpus: u32, extra: &[&str], token: &str) -> usize {
        self.add_worker_full(cpus, extra, token, &[])
    }

    /// [`Cluster::add_worker_with`] with more environment variables (e.g. `FLOTILLA_FAULT`).
    #[allow(dead_code)]
    pub(crate) fn add_worker_env(
        &mut self,
        cpus: u32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let token = self.token.clone();
        self.add_worker_full(cpus, extra, &token, env)
    }

    /// Starts one more worker that reaches the coordinator at `server` (a relay's address),
    /// with more environment variables; returns `i`. Does not wait for it to register.
    pub(crate) fn add_worker_at(&mut self, cpus: u32, server: &str, env: &[(&str, &str)]) -> usize {
        let token = self.token.clone();
        self.add_worker_through(cpus, &[], &token, env, server, &[])
    }

    /// Starts one more worker through `wrap` (e.g. `ip netns exec NS`: the wrapper execs the
    /// worker, so its pid is the worker's), with more environment variables; returns `i`.
    pub(crate) fn add_worker_wrapped(
        &mut self,
        cpus: u32,
        wrap: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let (token, server) = (self.token.clone(), self.addr.to_string());
        self.add_worker_through(cpus, &[], &token, env, &server, wrap)
    }

    fn add_worker_full(
        &mut self,
        cpus: u32,
        extra: &[&str],
        token: &str,
        env: &[(&str, &str)],
    ) -> usize {
        let server = self.addr.to_string();
        self.add_worker_through(cpus, extra, token, env, &server, &[])
    }

    fn add_worker_through(
        &mut self,
        cpus: u32,
        extra: &[&str],
        token: &str,
        env: &[(&str, &str)],
        server: &str,
        wrap: &[&str],
    ) -> usize {
        let i = self.workers.len();
        let work = self.root.path().join(format!("w{i}"));
        let mut cmd = match wrap {
            [program, args @ ..] => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            [] => Command::new(BIN),
        };
        cmd.args(["worker", "--server", server])
            .args(["--cpus", &cpus.to_string(), "--gpus", "none"])
            .args(["--name", &format!("w{i}")])
            .arg("--work-dir")
            .arg(&work)
            .args(&self.opts.remote_args)
            .args(extra)
            // Tests of other things look at their tasks' processes from outside (pids,
            // signals) and run programs from the build folder: no sandbox unless a test asks
            // (cluster_isolation.rs).
            .args(if extra.contains(&"--isolation") {
                &[][..]
            } else {
                &["--isolation", "none"][..]
            })
            .env("FLOTILLA_TOKEN", token)
            .envs(env.iter().copied())
            .env_remove("FLOTILLA_SERVER");
        let (p, lines) = spawn_logged(cmd, &format!("w{i}"));
        self.workers.push(Some(p));
        self.worker_lines.push(lines);
        i
    }

    /// Waits for a line of worker `i`'s stderr that contains `text` (the lines before it
    /// are passed over) and returns it; panics if the worker's stderr closes first or after
    /// `limit`, a bound for a hung test only.
    pub(crate) fn wait_worker_line(&self, i: usize, text: &str, limit: Duration) -> String {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.worker_lines[i].recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line with {text:?} from worker {i}: {e}"),
            }
        }
    }

    /// Waits until `n` workers are registered with the coordinator.
    pub(crate) fn wait_workers(&self, n: usize) {
        wait_until(
            &format!("{n} workers to register"),
            Duration::from_secs(20),
            || (self.live_workers().len() >= n).then_some(()),
        );
    }

    /// Waits until exactly `n` workers are registered (e.g. after a kill).
    pub(crate) fn wait_until_workers(&self, n: usize) {
        wait_until(
            &format!("exactly {n} workers"),
            Duration::from_secs(20),
            || (self.live_workers().len() == n).then_some(()),
        );
    }

    /// The registered workers: id → name.
    pub(crate) fn live_workers(&self) -> HashMap<WorkerId, String> {
        let Some(doc) = self.overview() else {
            return HashMap::new();
        };
        doc.workers.into_iter().map(|w| (w.id, w.name)).collect()
    }

    /// The process id of worker `i`, while it runs.
    pub(crate) fn worker_pid(&self, i: usize) -> Option<u32> {
        self.workers.get(i).and_then(Option::as_ref).map(Proc::pid)
    }

    /// Worker `i`'s exit status once it has exited by itself.
    pub(crate) fn worker_status(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.workers
            .get_mut(i)
            .and_then(Option::as_mut)
            .and_then(Proc::status)
    }

    /// Sends `sig` to worker `i`.
    pub(crate) fn signal_worker(&self, i: usize, sig: i32) {
        if let Some(p) = self.workers.get(i).and_then(Option::as_ref) {
            p.signal(sig);
        }
    }

    /// The coordinator's process id, while it runs.
    pub(crate) fn server_pid(&self) -> Option<u32> {
        self.server.as_ref().map(Proc::pid)
    }

    /// The temporary folder holding the state, the job folder and the workers' folders.
    pub(crate) fn root(&self) -> PathBuf {
        self.root.path().to_path_buf()
    }

    /// SIGKILLs worker `i`.
    pub(crate) fn kill_worker(&mut self, i: usize) {
        if let Some(p) = self.workers.get_mut(i).and_then(Option::take) {
            p.kill();
        }
    }

    /// SIGKILLs the coordinator.
    pub(crate) fn kill_server(&mut self) {
        if let Some(p) = self.server.take() {
            p.kill();
        }
        *self.client.borrow_mut() = None;
    }

    /// Stops the coordinator as systemd or the kubelet does: SIGTERM, then waits for it to
    /// exit by itself.
    pub(crate) fn stop_server(&mut self) {
        if let Some(mut p) = self.server.take() {
            p.signal(libc::SIGTERM);
            let status = wait_until(
                "the coordinator to exit after SIGTERM",
                Duration::from_secs(60),
                || p.status(),
            );
            assert!(
                status.success(),
                "the coordinator exited with {status} after SIGTERM"
            );
        }
        *self.client.borrow_mut() = None;
    }

    /// Starts the coordinator again on the same state directory and the same port.
    pub(crate) fn restart_server(&mut self) {
        self.restart_server_with(&[]);
    }

    /// [`Cluster::restart_server`] with more `flotilla server` arguments.
    pub(crate) fn restart_server_with(&mut self, extra: &[&str]) {
        assert!(self.server.is_none(), "the coordinator is still running");
        let mut args = self.opts.server_args.clone();
        args.extend(extra.iter().map(|a| a.to_string()));
        let (p, addr, http) = start_server(&self.state, self.addr, &args, &self.opts.server_env);
        self.http = http;
        assert_eq!(
            addr, self.addr,
            "the coordinator came back on another address"
        );
        self.server = Some(p);
    }

    /// Runs `flotilla server` on this cluster's state directory and port in the foreground
    /// with `extra` arguments, for a start that should fail: its output once it exits.
    pub(crate) fn server_output(&self, extra: &[&str]) -> Output {
        assert!(self.server.is_none(), "the coordinator is still running");
        Command::new(BIN)
            .args(["server", "--listen", &self.addr.to_string()])
            .arg("--state")
            .arg(&self.state)
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("the flotilla binary runs")
    }

    /// Runs the CLI against this cluster (FLOTILLA_SERVER and FLOTILLA_TOKEN set), in the
    /// job folder.
    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        self.cli_with_token(args, &self.token)
    }

    /// Runs the CLI presenting `token`.
    pub(crate) fn cli_with_token(&self, args: &[&str], token: &str) -> Output {
        self.cli_raw(args, &self.opts.remote_args, token)
    }

    /// Runs the CLI with `args`, then `extra` (instead of the cluster's remote arguments),
    /// presenting `token`.
    pub(crate) fn cli_raw(&self, args: &[&str], extra: &[String], token: &str) -> Output {
        let mut cmd = self.cli_command(args, token);
        cmd.args(extra).output().expect("the flotilla binary runs")
    }

    /// Starts the CLI with `args` (the admin's token), its stdout and stderr piped: for a
    /// command that follows something (`wait`, `logs --follow`) while the test acts.
    pub(crate) fn cli_piped(&self, args: &[&str]) -> std::process::Child {
        self.cli_command(args, &self.token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the flotilla binary runs")
    }

    /// The CLI with `args` against this cluster (FLOTILLA_SERVER set, `token` presented), in
    /// the job folder, stdin closed: for a test that sets more (its stdout) before running it.
    pub(crate) fn cli_command(&self, args: &[&str], token: &str) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .current_dir(self.job_dir())
            .env("FLOTILLA_SERVER", self.addr.to_string())
            .env("FLOTILLA_TOKEN", token)
            .stdin(Stdio::null());
        cmd
    }

    /// `flotilla submit FILE`: the job id from the last line of its output.
    pub(crate) fn submit(&self, file: &Path) -> JobId {
        let out = self.cli(&["submit", &file.display().to_string()]);
        assert!(
            out.status.success(),
            "flotilla submit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        job_id_of(&out)
    }

    /// Submits `file` through the client API naming the submission `id`; `None` while the
    /// coordinator is unreachable or refuses it.
    pub(crate) fn submit_with_id(&self, file: &Path, id: &str) -> Option<JobId> {
        let file = file.to_path_buf();
        let id = id.to_string();
        self.with_client(move |c| {
            Box::pin(async move { c.submit_file_with_id(&file, Some(&id)).await.map(|s| s.job) })
        })
    }

    /// Writes `toml` as `name` in the job folder and submits it.
    pub(crate) fn submit_toml(&self, name: &str, toml: &str) -> JobId {
        let path = self.job_dir().join(name);
        std::fs::write(&path, toml).expect("write the job file");
        self.submit(&path)
    }

    /// Submits a job `name` of one task `t` that runs `before`, waits until the returned
    /// file exists (the test creates it: the task runs as long as the test wants), then runs
    /// `after` (shell commands; empty for none).
    pub(crate) fn submit_gated(&self, name: &str, before: &str, after: &str) -> (JobId, PathBuf) {
        let go = self.job_dir().join(format!("{name}.go"));
        let script = format!(
            "{before}{}while [ ! -e {} ]; do sleep 0.05; done{}{after}",
            if before.is_empty() { "" } else { "; " },
            go.display(),
            if after.is_empty() { "" } else { "; " },
        );
        let toml = format!(
            "name = \"{name}\"\n[[task]]\nid = \"t\"\ncmd = [\"sh\", \"-c\", {}]\n",
            toml_string(&script)
        );
        (self.submit_toml(&format!("{name}.toml"), &toml), go)
    }

    fn with_client<T>(
        &self,
        f: impl FnOnce(
            &mut Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = flotilla::cluster::Result<T>> + '_>,
        >,
    ) -> Option<T> {
        let mut slot = self.client.borrow_mut();
        if slot.is_none() {
            let mut remote = Remote::new(self.addr.to_string(), self.token.clone());
            remote.tls_ca = self.opts.tls_ca.clone();
            *slot = self.rt.block_on(Client::connect(&remote)).ok();
        }
        let client = slot.as_mut()?;
        match self.rt.block_on(f(client)) {
            Ok(v) => Some(v),
            Err(_) => {
                *slot = None;
                None
            }
        }
    }

    /// A job's status document; `None` while the coordinator is unreachable.
    pub(crate) fn status(&self, job: JobId) -> Option<JobStatus> {
        self.with_client(|c| Box::pin(c.job_status(job)))
    }

    /// Every job and worker; `None` while the coordinator is unreachable.
    pub(crate) fn overview(&self) -> Option<ClusterStatus> {
        self.with_client(|c| Box::pin(c.cluster_status()))
    }

    /// Polls the job's status until `pred` holds.
    pub(crate) fn wait_status(
        &self,
        job: JobId,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&JobStatus) -> bool,
    ) -> JobStatus {
        wait_until(what, timeout, || self.status(job).filter(|s| pred(s)))
    }

    /// Waits until the job has a final state; returns its status.
    pub(crate) fn wait_job(&self, job: JobId, timeout: Duration) -> JobStatus {
        self.wait_status(job, &format!("{job} to finish"), timeout, |s| {
            s.finished_state().is_some()
        })
    }
}

impl Drop for Cluster {
    /// Kills the workers, then the coordinator, before the folder is removed.
    fn drop(&mut self) {
        for w in self.workers.drain(..).flatten() {
            w.kill();
        }
        if let Some(p) = self.server.take() {
            p.kill();
        }
        if self.opts.state_tmpfs.is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.state).status();
        }
    }
}

/// Starts `flotilla server` on `listen` and waits for its "listening on ADDR" line. When
/// the port is not yet free again (a restart), retries until a deadline.
fn start_server(
    state: &Path,
    listen: SocketAddr,
    extra: &[String],
    env: &[(String, String)],
) -> (Proc, SocketAddr, Option<SocketAddr>) {
    let wants_http = extra.iter().any(|a| a == "--http-listen");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut cmd = Command::new(BIN);
        cmd.args(["server", "--listen", &listen.to_string()])
            .arg("--state")
            .arg(state)
            .args(["--heartbeat-timeout-ms", &HEARTBEAT_TIMEOUT_MS.to_string()])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)));
        let (p, lines) = spawn_logged(cmd, "server");
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        let addr = rest
                            .split_whitespace()
                            .next()
                            .and_then(|a| a.parse().ok())
                            .unwrap_or_else(|| panic!("no address in {line:?}"));
                        if !wants_http {
                            return (p, addr, None);
                        }
                        // `metrics at http://ADDR/metrics` follows.
                        let http = loop {
                            let left = end.saturating_duration_since(Instant::now());
                            let line = lines
                                .recv_timeout(left)
                                .unwrap_or_else(|e| panic!("no HTTP address: {e}"));
                            if let Some(rest) = line.split("metrics at http://").nth(1) {
                                break rest
                                    .split('/')
                                    .next()
                                    .and_then(|a| a.parse().ok())
                                    .unwrap_or_else(|| panic!("no address in {line:?}"));
                            }
                        };
                        return (p, addr, Some(http));
                    }
                    seen.push(line);
                }
                // The process ended (stderr closed) without listening.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the coordinator did not start listening: {seen:?}")
                }
            }
        }
        drop(p);
        assert!(
            Instant::now() < end,
            "the coordinator could not start on {listen}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The job id on the last line of `flotilla submit`'s standard output.
pub(crate) fn job_id_of(out: &Output) -> JobId {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("").trim();
    JobId::new(
        last.parse()
            .unwrap_or_else(|_| panic!("no job id on the last line of {stdout:?}")),
    )
}

/// The status of task `name`.
pub(crate) fn task<'a>(s: &'a JobStatus, name: &str) -> &'a flotilla::cluster::state::TaskStatus {
    s.tasks
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no task {name} in {}", s.name))
}

/// Asserts the job succeeded, listing the tasks that did not.
pub(crate) fn assert_succeeded(s: &JobStatus) {
    if s.state != JobState::Succeeded {
        let bad: Vec<String> = s
            .tasks
            .iter()
            .filter(|t| t.state != TaskState::Done)
            .take(10)
            .map(|t| format!("{} {:?}: {:?}", t.name, t.state, t.message))
            .collect();
        panic!("job {} ended {:?}: {bad:?}", s.name, s.state);
    }
}

/// A seeded random DAG: task `i` has 0–3 distinct parents among the tasks before it,
/// in ascending order.
pub(crate) struct HashDag {
    /// Each task's parents.
    pub(crate) parents: Vec<Vec<usize>>,
}

impl HashDag {
    /// `n` tasks from `seed`.
    pub(crate) fn random(n: usize, seed: u64) -> HashDag {
        let mut rng = SmallRng::seed_from_u64(seed);
        let parents = (0..n)
            .map(|i| {
                let k = rng.gen_range(0..=3usize).min(i);
                let mut ps = rand::seq::index::sample(&mut rng, i.max(1), k).into_vec();
                ps.sort_unstable();
                ps
            })
            .collect();
        HashDag { parents }
    }

    /// Task `i`'s id.
    pub(crate) fn id(i: usize) -> String {
        format!("t{i:03}")
    }

    /// The job file: each task (after an optional `sleep`) writes `out/<id>` =
    /// `sha256sum` of its id followed by its parents' outputs in order (atomically, by a
    /// rename), then appends its id to `runs/<id>`.
    pub(crate) fn job_toml(&self, name: &str, sleep: Option<&str>) -> String {
        let mut t = format!(
            "name = \"{name}\"\nstaging = \"shared\"\n\n[defaults]\nretries = 2\ntimeout = \"2m\"\n"
        );
        for (i, ps) in self.parents.iter().enumerate() {
            let id = Self::id(i);
            let pre = sleep.map(|s| format!("sleep {s}; ")).unwrap_or_default();
            let source = if ps.is_empty() {
                format!("printf %s {id}")
            } else {
                let files: Vec<String> =
                    ps.iter().map(|&p| format!("out/{}", Self::id(p))).collect();
                format!("{{ printf %s {id}; cat {}; }}", files.join(" "))
            };
            let script = format!(
                "{pre}{source} | sha256sum > out/.{id}.$$ && mv out/.{id}.$$ out/{id} && echo {id} >> runs/{id}"
            );
            t.push_str(&format!(
                "\n[[task]]\nid = \"{id}\"\ncmd = [\"sh\", \"-c\", \"{script}\"]\noutputs = [\"out/{id}\"]\n"
            ));
            if !ps.is_empty() {
                let after: Vec<String> =
                    ps.iter().map(|&p| format!("\"{}\"", Self::id(p))).collect();
                t.push_str(&format!("after = [{}]\n", after.join(", ")));
            }
        }
        t
    }

    /// Writes the job file and the `out/` and `runs/` folders into `dir`; returns the file.
    pub(crate) fn write(&self, dir: &Path, name: &str, sleep: Option<&str>) -> PathBuf {
        std::fs::create_dir_all(dir.join("out")).expect("out/");
        std::fs::create_dir_all(dir.join("runs")).expect("runs/");
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, self.job_toml(name, sleep)).expect("write the job file");
        path
    }

    /// What each `out/<id>` must hold: `sha256sum`'s line for id ++ parents' outputs.
    pub(crate) fn expected(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::with_capacity(self.parents.len());
        for (i, ps) in self.parents.iter().enumerate() {
            let mut h = Sha256::new();
            h.update(Self::id(i).as_bytes());
            for &p in ps {
                h.update(out[p].as_bytes());
            }
            out.push(format!("{:x}  -\n", h.finalize()));
        }
        out
    }

    /// Asserts every `out/<id>` in `dir` holds the expected hash.
    pub(crate) fn check_outputs(&self, dir: &Path) {
        let want = self.expected();
        let mut wrong = Vec::new();
        for (i, w) in want.iter().enumerate() {
            let id = Self::id(i);
            match std::fs::read_to_string(dir.join("out").join(&id)) {
                Ok(got) if &got == w => {}
                Ok(got) => wrong.push(format!("{id}: {got:?} != {w:?}")),
                Err(e) => wrong.push(format!("{id}: {e}")),
            }
        }
        assert!(
            wrong.is_empty(),
            "{} of {} outputs are wrong: {:?}",
            wrong.len(),
            want.len(),
            &wrong[..wrong.len().min(10)]
        );
    }

    /// [`HashDag::write`], each task also saying in `runs/<id>` which worker ran it (the
    /// last part of its worker's TMPDIR, one of the few host variables a task sees) and when
    /// (`date +%s%N`); see [`HashDag::runs_of`].
    pub(crate) fn write_stamped(&self, dir: &Path, name: &str, sleep: Option<&str>) -> PathBuf {
        let file = self.write(dir, name, sleep);
        let toml = std::fs::read_to_string(&file).expect("the job file");
        let mut stamped = toml.clone();
        for i in 0..self.parents.len() {
            let id = Self::id(i);
            stamped = stamped.replace(
                &format!("echo {id} >> runs/{id}"),
                &format!("echo {id} ${{TMPDIR##*/}} $(date +%s%N) >> runs/{id}"),
            );
        }
        assert_ne!(stamped, toml, "no run line to stamp");
        std::fs::write(&file, stamped).expect("write the job file");
        file
    }

    /// Task `i`'s completions in a job written by [`HashDag::write_stamped`]: who (the name of
    /// its worker's TMPDIR; empty where the worker has none) and when (ns since the epoch).
    pub(crate) fn runs_of(&self, dir: &Path, i: usize) -> Vec<(String, u128)> {
        let id = Self::id(i);
        let text = std::fs::read_to_string(dir.join("runs").join(&id)).unwrap_or_default();
        text.lines()
            .map(|l| {
                // `id who when`; `who` is empty for a worker without a TMPDIR.
                let f: Vec<&str> = l.split_whitespace().collect();
                let (who, when) = match f[..] {
                    [_, who, when] => (who, when),
                    [_, when] => ("", when),
                    _ => panic!("{id}: a run line without its time: {l:?}"),
                };
                let when = when.parse().unwrap_or_else(|_| panic!("{id}: {l:?}"));
                (who.to_string(), when)
            })
            .collect()
    }

    /// How many times each task completed (lines of `runs/<id>`).
    pub(crate) fn completed_runs(&self, dir: &Path) -> Vec<usize> {
        (0..self.parents.len())
            .map(|i| {
                std::fs::read_to_string(dir.join("runs").join(Self::id(i)))
                    .map(|s| s.lines().count())
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// Now, in nanoseconds since the epoch (as `date +%s%N` prints it).
pub(crate) fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The last line of a successful command's stdout (where `flotilla admin ... add` prints a
/// token).
#[allow(dead_code)]
pub(crate) fn last_line(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// `s` as a TOML basic string.
pub(crate) fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
