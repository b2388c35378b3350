//! The Rust client API: submit jobs, follow them, fetch their logs. The `flotilla` CLI is
//! built on it.
//!
//! ```no_run
//! # async fn demo() -> flotilla_cluster::Result<()> {
//! use flotilla_cluster::{Client, Remote};
//! let mut client = Client::connect(&Remote::new("127.0.0.1:7070", "TOKEN")).await?;
//! let job = client.submit_file(std::path::Path::new("examples/mandelbrot/job.toml")).await?;
//! let done = client.wait(job.job, |ev| println!("{} {}", ev.name, ev.state)).await?;
//! println!("{}: {}", job.name, done.state);
//! # Ok(()) }
//! ```

use std::path::Path;

use flotilla_core::{JobId, JobSpec};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::access::{Quota, Tenant, TokenInfo};
use crate::auth::TokenAdd;
use crate::error::{ClusterError, Result};
use crate::proto::admin_client::AdminClient;
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::{self, JobEvent};
use crate::state::{ClusterStatus, JobStatus};
use crate::transport::Remote;

/// A connection to a coordinator.
#[derive(Clone)]
pub struct Client {
    inner: CoordinatorClient<InterceptedService<Channel, TokenAdd>>,
    admin: AdminClient<InterceptedService<Channel, TokenAdd>>,
    /// The coordinator's address, for error messages.
    addr: String,
    /// Whether the connection uses TLS.
    tls: bool,
    /// Where it connected, to connect again when the connection is lost (a coordinator
    /// restarted, a group's leader changed): [`Client::wait`] follows a job through both.
    remote: Remote,
    /// How long connecting again may take.
    patience: std::time::Duration,
    /// Whether the coordinator answered it with a job's events ([`Client::wait`]): from then
    /// on a broken transport is the connection lost, not a server that wants TLS.
    answered: bool,
}

/// How long [`Client::connect`]'s client waits for its coordinator to answer again when the
/// connection is lost while it follows a job (a restart replays the journal first).
pub const RECONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// A token just made: shown once, never stored in the clear by the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewToken {
    /// Its id (`flotilla admin token revoke ID`).
    pub id: String,
    /// The token.
    pub token: String,
}

impl From<proto::NewToken> for NewToken {
    fn from(r: proto::NewToken) -> Self {
        NewToken {
            id: r.id,
            token: r.token,
        }
    }
}

/// A job the coordinator accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// Its id.
    pub job: JobId,
    /// Its name.
    pub name: String,
    /// How many task instances it has.
    pub tasks: u32,
}

/// What the coordinator answers a gather: [`Client::outputs`].
#[derive(Debug, Clone)]
pub enum Outputs {
    /// Every output, each with a live worker holding it.
    Ready(Vec<GatheredOutput>),
    /// Some were lost with their workers; the tasks that made them run again. Says which.
    Rebuilding(String),
}

/// Fetches `outs` into `dir` (see [`Client::gather_with`]).
async fn fetch_all(outs: &[GatheredOutput], dir: &Path) -> Result<()> {
    for o in outs {
        let rel = crate::objects::safe_relative(&o.path)?;
        let dst = dir.join(rel);
        let parent = dst.parent().unwrap_or(dir).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| ClusterError::io(&parent, e))?;
        let name = dst
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{name}.gather{}", rand::random::<u32>()));
        crate::framed::fetch_framed_to(
            &o.from,
            (&o.ticket, &o.cert),
            (&o.hash, o.size),
            &tmp,
            &dst,
        )
        .await
        .map_err(|e| ClusterError::Rpc(format!("cannot gather {} from {}: {e}", o.path, o.from)))?;
    }
    Ok(())
}

/// An output of a job (transfer staging) and where it is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatheredOutput {
    /// Relative to the job folder.
    pub path: String,
    /// blake3, hex.
    pub hash: String,
    /// Bytes.
    pub size: u64,
    /// The data address of a worker holding it.
    pub from: String,
    /// What that worker wants to see before it sends the object.
    pub ticket: String,
    /// The fingerprint of that worker's TLS certificate (`""`: plain TCP).
    pub cert: String,
}

/// A provider as `flotilla provider list` shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProviderSummary {
    /// Its name.
    pub name: String,
    /// The id of its token (shown to the admin only: empty, and left out of the JSON, for
    /// a tenant).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// Whether its token was revoked.
    pub revoked: bool,
    /// Its live workers' names.
    pub workers: Vec<String>,
    /// CPUs its live workers offer.
    pub cpus: f64,
    /// GPUs its live workers offer.
    pub gpus: f64,
    /// Its workers' prices (credits per unit-hour), each once.
    pub prices: Vec<String>,
    /// When its workers run: availability windows, `--idle-only` (each once; empty: always).
    #[serde(default)]
    pub availability: Vec<String>,
    /// Its reputation: `(accepted + 1) / (accepted + rejected + 2)`.
    #[serde(default)]
    pub reputation: f64,
    /// Its results accepted by verification (a `verify = 1` job's results, taken as
    /// returned, count in neither this nor `rejected`).
    #[serde(default)]
    pub accepted: u64,
    /// Its results rejected (outvoted).
    #[serde(default)]
    pub rejected: u64,
    /// Whether it still gets work (a low reputation excludes it).
    #[serde(default)]
    pub eligible: bool,
    /// Credits it earned (its ledger account).
    #[serde(default)]
    pub earned: f64,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// `succeeded`, `failed` or `cancelled`.
    pub state: String,
}

impl Finished {
    /// Whether every task succeeded.
    pub fn succeeded(&self) -> bool {
        self.state == "succeeded"
    }
}

/// An outage a follower rides out ([`Client::follow_again`]): since when its coordinator has
/// been lost, and the pause before its next try.
#[derive(Debug, Default)]
pub struct Outage {
    since: Option<tokio::time::Instant>,
    pause: std::time::Duration,
    lost_before: bool,
}

impl Outage {
    /// The coordinator answered (a call succeeded, a stream opened): the outage is over,
    /// and a later loss starts a new one with its whole patience.
    pub fn answered(&mut self) {
        self.since = None;
    }
}

impl Client {
    /// Connects to the coordinator at `remote`.
    pub fn connect<'a>(remote: &'a Remote) -> crate::Boxed<'a, Result<Self>> {
        crate::boxed(async move {
            let channel = remote.channel().await?;
            let add = TokenAdd::new(&remote.token)?;
            let inner = CoordinatorClient::with_interceptor(channel.clone(), add.clone())
                .max_decoding_message_size(crate::proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(crate::proto::MAX_MESSAGE_BYTES);
            let admin = AdminClient::with_interceptor(channel, add);
            Ok(Self {
                inner,
                admin,
                addr: remote.addr.clone(),
                tls: remote.tls_ca.is_some(),
                remote: remote.clone(),
                patience: RECONNECT_PATIENCE,
                answered: false,
            })
        })
    }

    /// Connects like [`Client::connect`], trying again while the coordinator cannot be
    /// reached (refused: not started yet, or restarting and replaying its journal), with
    /// backoff from 50 ms to 1 s, for at most `patience`. Other errors (TLS ones among them:
    /// a certificate that does not verify will not verify later) return at once.
    pub fn connect_patiently<'a>(
        remote: &'a Remote,
        patience: std::time::Duration,
    ) -> crate::Boxed<'a, Result<Self>> {
        crate::boxed(async move {
            let end = tokio::time::Instant::now() + patience;
            let mut pause = std::time::Duration::from_millis(50);
            loop {
                match Self::connect(remote).await {
                    Err(ClusterError::Connect { .. })
                        if tokio::time::Instant::now() + pause < end =>
                    {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_secs(1));
                    }
                    Ok(mut c) => {
                        c.patience = c.patience.max(patience);
                        return Ok(c);
                    }
                    r => return r,
                }
            }
        })
    }

    /// An RPC's error; a plain-TCP client that got no HTTP/2 answer is told that the
    /// server probably speaks TLS.
    fn rpc_err(&self, s: tonic::Status) -> ClusterError {
        plain_to_tls_hint(&self.addr, self.tls, s)
    }

    /// The error of a stream this client opened and the coordinator answered (e.g.
    /// [`Client::logs`]'s): a transport failure there is the connection lost (the coordinator
    /// restarted, or gone), [`ClusterError::Unavailable`], never a server that speaks TLS.
    pub fn stream_error(&self, s: tonic::Status) -> ClusterError {
        lost_if_answered(self.rpc_err(s))
    }

    /// An error of a call to a coordinator that has answered this client before: a broken
    /// transport there is the connection lost ([`ClusterError::Unavailable`], which
    /// [`ClusterError::is_transient`] holds for), not a server that speaks TLS.
    pub fn lost_after_answer(e: ClusterError) -> ClusterError {
        lost_if_answered(e)
    }

    /// Connects again after `e`, a transient error of a follower (`wait`, `logs --follow`)
    /// whose connection was lost, unless the coordinator has been unreachable for longer
    /// than this client's patience: then `e` is returned. `progressed`: the follower got
    /// something since the last loss, which starts a new outage. The first try is at once,
    /// the next ones after a pause from 50 ms doubling to 1 s. (Counting three losses ended a
    /// follower whose coordinator's port, killed, still took connections for a moment.)
    pub fn follow_again<'a>(
        &'a self,
        outage: &'a mut Outage,
        progressed: bool,
        e: ClusterError,
    ) -> crate::Boxed<'a, Result<Client>> {
        crate::boxed(async move {
            let now = tokio::time::Instant::now();
            let since = match outage.since {
                Some(since) if !progressed => since,
                _ => {
                    // The first loss is tried again at once; a later one after 50 ms (a
                    // coordinator that answers and breaks again and again is not spun on).
                    outage.pause = if outage.lost_before {
                        std::time::Duration::from_millis(50)
                    } else {
                        std::time::Duration::ZERO
                    };
                    outage.lost_before = true;
                    *outage.since.insert(now)
                }
            };
            if now + outage.pause > since + self.patience {
                return Err(e);
            }
            tokio::time::sleep(outage.pause).await;
            outage.pause = (outage.pause * 2).clamp(
                std::time::Duration::from_millis(50),
                std::time::Duration::from_secs(1),
            );
            let mut c = self.reconnect().await?;
            c.answered = self.answered;
            Ok(c)
        })
    }

    /// A new connection to the coordinator this client reached (whichever of a group's
    /// nodes serves now), waiting for it as long as [`Client::wait`] would.
    pub fn reconnect(&self) -> crate::Boxed<'static, Result<Client>> {
        let (remote, patience) = (self.remote.clone(), self.patience);
        crate::boxed(async move {
            let mut c = Self::connect_patiently(&remote, patience).await?;
            c.patience = patience;
            Ok(c)
        })
    }

    /// Validates the job file here (so errors name the file and line at once), then submits
    /// it; its folder is the file's folder.
    pub fn submit_file<'a>(&'a mut self, path: &'a Path) -> crate::Boxed<'a, Result<Submitted>> {
        self.submit_file_with_id(path, None)
    }

    /// A new id for a submission ([`Client::submit_file_with_id`]): 128 random bits, in hex.
    pub fn new_request_id() -> String {
        format!("{:032x}", rand::random::<u128>())
    }

    /// [`Client::submit_file`] naming the submission `request_id`: sent again with the same
    /// id (its answer was lost to a leader change or a broken connection, an error for which
    /// [`ClusterError::is_transient`](crate::ClusterError::is_transient) holds), it is
    /// answered with the job it made instead of making a second one.
    pub fn submit_file_with_id<'a>(
        &'a mut self,
        path: &'a Path,
        request_id: Option<&'a str>,
    ) -> crate::Boxed<'a, Result<Submitted>> {
        crate::boxed(async move {
            let text = std::fs::read_to_string(path).map_err(|e| ClusterError::io(path, e))?;
            let abs = std::fs::canonicalize(path).map_err(|e| ClusterError::io(path, e))?;
            let dir = abs
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "/".to_string());
            let file_name = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "job.toml".into());
            let spec = flotilla_core::parse_job(&text, &file_name)?;
            spec.validate()?;
            // Only transfer staging needs the expanded tasks here (their inputs are uploaded);
            // the coordinator expands the job itself, within its limits.
            let files = if spec.staging == flotilla_core::Staging::Transfer {
                uploads(&spec.expand()?, Path::new(&dir))?
            } else {
                Vec::new()
            };
            self.submit_request(proto::SubmitRequest {
                file_name,
                toml: text,
                dir,
                tenant: String::new(),
                files,
                request_id: request_id.unwrap_or_default().to_string(),
            })
            .await
        })
    }

    /// Submits a job built in code; `dir` is its folder.
    pub fn submit_spec<'a>(
        &'a mut self,
        spec: &'a JobSpec,
        dir: &'a Path,
    ) -> crate::Boxed<'a, Result<Submitted>> {
        crate::boxed(async move {
            let text = spec.to_toml();
            self.submit_text(
                &format!("{}.toml", spec.name),
                &text,
                &dir.display().to_string(),
            )
            .await
        })
    }

    /// Submits a job file's text.
    pub fn submit_text<'a>(
        &'a mut self,
        file_name: &'a str,
        toml: &'a str,
        dir: &'a str,
    ) -> crate::Boxed<'a, Result<Submitted>> {
        crate::boxed(async move {
            self.submit_request(proto::SubmitRequest {
                file_name: file_name.to_string(),
                toml: toml.to_string(),
                dir: dir.to_string(),
                tenant: String::new(),
                files: Vec::new(),
                request_id: String::new(),
            })
            .await
        })
    }

    async fn submit_request(&mut self, req: proto::SubmitRequest) -> Result<Submitted> {
        let r = self
            .inner
            .submit(req)
            .await
            .map_err(|e| self.rpc_err(e))?
            .into_inner();
        Ok(Submitted {
            job: JobId::new(r.job),
            name: r.name,
            tasks: r.tasks,
        })
    }

    /// A job's status (what `flotilla status JOB --json` prints): its counts, failures and
    /// per-worker totals, and its tasks, or the first
    /// [`STATUS_TASKS`](crate::state::STATUS_TASKS) of a larger job.
    pub fn job_status<'a>(&'a mut self, job: JobId) -> crate::Boxed<'a, Result<JobStatus>> {
        self.job_status_range(job, 0, None)
    }

    /// [`Client::job_status`] listing at most `limit` tasks (the default when `None`) from
    /// id `from` on.
    pub fn job_status_range<'a>(
        &'a mut self,
        job: JobId,
        from: u64,
        limit: Option<u64>,
    ) -> crate::Boxed<'a, Result<JobStatus>> {
        self.job_status_in(job, from, limit, &[])
    }

    /// [`Client::job_status_range`] listing only the tasks in `states` (every task when
    /// empty; `flotilla status JOB --state failed`).
    pub fn job_status_in<'a>(
        &'a mut self,
        job: JobId,
        from: u64,
        limit: Option<u64>,
        states: &'a [crate::state::TaskState],
    ) -> crate::Boxed<'a, Result<JobStatus>> {
        crate::boxed(async move {
            let json = self
                .inner
                .status(proto::StatusRequest {
                    job: Some(job.0),
                    trace: false,
                    task_from: from,
                    task_limit: limit,
                    states: states.iter().map(|s| s.as_str().to_string()).collect(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner()
                .json;
            let s: JobStatus = serde_json::from_str(&json)
                .map_err(|e| ClusterError::Rpc(format!("bad status document of {job}: {e}")))?;
            if !states.is_empty() && s.tasks_in.is_empty() {
                return Err(ClusterError::Rpc(format!(
                    "the coordinator at {} runs an older flotilla, which lists a job's tasks \
                     without filtering them by state",
                    self.addr
                )));
            }
            Ok(s)
        })
    }

    /// Every job and live worker (what `flotilla status --json` prints).
    pub fn cluster_status<'a>(&'a mut self) -> crate::Boxed<'a, Result<ClusterStatus>> {
        crate::boxed(async move {
            let json = self.status_document(None).await?;
            serde_json::from_str(&json)
                .map_err(|e| ClusterError::Rpc(format!("bad cluster status document: {e}")))
        })
    }

    /// A job's attempts in time (`flotilla trace`; [`JobTrace::to_chrome`] renders it).
    pub fn job_trace<'a>(
        &'a mut self,
        job: JobId,
    ) -> crate::Boxed<'a, Result<crate::state::JobTrace>> {
        crate::boxed(async move {
            let json = self
                .inner
                .status(proto::StatusRequest {
                    job: Some(job.0),
                    trace: true,
                    task_from: 0,
                    task_limit: None,
                    states: Vec::new(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner()
                .json;
            serde_json::from_str(&json)
                .map_err(|e| ClusterError::Rpc(format!("bad trace document of {job}: {e}")))
        })
    }

    async fn status_document(&mut self, job: Option<JobId>) -> Result<String> {
        Ok(self
            .inner
            .status(proto::StatusRequest {
                job: job.map(|j| j.0),
                trace: false,
                task_from: 0,
                task_limit: None,
                states: Vec::new(),
            })
            .await
            .map_err(|e| self.rpc_err(e))?
            .into_inner()
            .json)
    }

    /// The stream of a job's events, starting with the current state of each task.
    pub fn watch<'a>(
        &'a mut self,
        job: JobId,
    ) -> crate::Boxed<'a, Result<tonic::Streaming<JobEvent>>> {
        crate::boxed(async move {
            Ok(self
                .inner
                .watch(proto::WatchRequest { job: job.0 })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner())
        })
    }

    /// Follows a job to its end, calling `on_event` for every event.
    pub fn wait<'a>(
        &'a mut self,
        job: JobId,
        on_event: impl FnMut(&JobEvent) + Send + 'a,
    ) -> crate::Boxed<'a, Result<Finished>> {
        self.wait_dyn(job, Box::new(on_event))
    }

    /// [`Client::wait`] past its one generic parameter: compiled here, once.
    fn wait_dyn<'a>(
        &'a mut self,
        job: JobId,
        mut on_event: Box<dyn FnMut(&JobEvent) + Send + 'a>,
    ) -> crate::Boxed<'a, Result<Finished>> {
        crate::boxed(async move {
            // The coordinator drops a watcher that falls too far behind: the stream then ends
            // early, and watching again starts from the job's state at that moment. A lost
            // connection (the coordinator restarted, stopping, or no longer the group's
            // leader) is made again, to whichever coordinator serves, and the job watched
            // there: the journal kept it.
            let mut rewatches = 0u32;
            let mut outage = Outage::default();
            loop {
                let mut got = false;
                let opened = self.watch(job).await;
                if opened.is_ok() {
                    outage.answered();
                }
                let ended = match opened {
                    Ok(mut s) => loop {
                        self.answered = true;
                        match s.message().await.map_err(|e| self.stream_error(e)) {
                            Ok(Some(ev)) => {
                                got = true;
                                on_event(&ev);
                                if ev.job_finished {
                                    return Ok(Finished {
                                        state: ev.job_state,
                                    });
                                }
                            }
                            Ok(None) => break Ok(()),
                            Err(e) => break Err(e),
                        }
                    },
                    Err(e) if self.answered => Err(lost_if_answered(e)),
                    Err(e) => Err(e),
                };
                match ended {
                    Ok(()) => {
                        rewatches = if got { 0 } else { rewatches + 1 };
                        if rewatches >= 3 {
                            return Err(ClusterError::Rpc(format!(
                                "the coordinator closed the event stream of {job} before it \
                                 finished"
                            )));
                        }
                    }
                    Err(e) if e.is_transient() => {
                        tracing::info!("following {job}: {e}; connecting again");
                        *self = self.follow_again(&mut outage, got, e).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
        })
    }

    /// Cancels a job: its running tasks are stopped, the others are not started.
    pub fn cancel<'a>(&'a mut self, job: JobId) -> crate::Boxed<'a, Result<()>> {
        crate::boxed(async move {
            self.inner
                .cancel(proto::CancelRequest { job: job.0 })
                .await
                .map_err(|e| self.rpc_err(e))?;
            Ok(())
        })
    }

    /// Runs again a job's tasks that failed or were cancelled, its done tasks kept: `flotilla
    /// retry`. A job that ended runs again. How many tasks were put back to run.
    pub fn retry<'a>(&'a mut self, job: JobId) -> crate::Boxed<'a, Result<u64>> {
        crate::boxed(async move {
            let r = self
                .inner
                .retry(proto::RetryRequest { job: job.0 })
                .await
                .map_err(|e| match e.code() {
                    tonic::Code::Unimplemented => ClusterError::Rpc(format!(
                        "the coordinator at {} runs an older flotilla, which cannot retry a \
                         job: upgrade it, or submit the job file again",
                        self.addr
                    )),
                    _ => self.rpc_err(e),
                })?
                .into_inner();
            Ok(r.tasks)
        })
    }

    /// Forgets a finished job on the coordinator (its tasks, logs and the list of its
    /// uploads): `flotilla rm`. A running job is refused (cancel it first).
    pub fn remove<'a>(&'a mut self, job: JobId) -> crate::Boxed<'a, Result<()>> {
        crate::boxed(async move {
            self.inner
                .remove(proto::RemoveRequest { job: job.0 })
                .await
                .map_err(|e| self.rpc_err(e))?;
            Ok(())
        })
    }

    /// A task's captured output (`task` is its name, e.g. `tile[3]`); with `follow`, the
    /// stream goes on until the task ends.
    pub fn logs<'a>(
        &'a mut self,
        job: JobId,
        task: &'a str,
        follow: bool,
        stderr: bool,
    ) -> crate::Boxed<'a, Result<tonic::Streaming<proto::LogChunk>>> {
        self.logs_of(job, task, (follow, stderr), None)
    }

    /// [`Client::logs`] of one attempt (1 for the first), followed until that attempt ends;
    /// `None`: the latest, followed on to the next ones.
    pub fn logs_of<'a>(
        &'a mut self,
        job: JobId,
        task: &'a str,
        (follow, stderr): (bool, bool),
        attempt: Option<u32>,
    ) -> crate::Boxed<'a, Result<tonic::Streaming<proto::LogChunk>>> {
        crate::boxed(async move {
            Ok(self
                .inner
                .logs(proto::LogsRequest {
                    job: job.0,
                    task: task.to_string(),
                    follow,
                    stderr,
                    attempt,
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner())
        })
    }

    /// Transfer staging: every output of the job's done tasks (path relative to the job
    /// folder, blake3 hash, size) with the data address of a live worker holding it; or,
    /// when some were lost with their workers, [`Outputs::Rebuilding`]: the coordinator runs
    /// the tasks that made them again (the job is running again).
    pub fn outputs<'a>(&'a mut self, job: JobId) -> crate::Boxed<'a, Result<Outputs>> {
        crate::boxed(async move {
            let r = self
                .inner
                .outputs(proto::OutputsRequest { job: job.0 })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            if !r.rebuilding.is_empty() {
                return Ok(Outputs::Rebuilding(r.rebuilding));
            }
            Ok(Outputs::Ready(
                r.outputs
                    .into_iter()
                    .filter_map(|i| {
                        let o = i.object?;
                        Some(GatheredOutput {
                            path: o.path,
                            hash: o.hash,
                            size: o.size,
                            from: i.from,
                            ticket: i.ticket,
                            cert: i.from_cert,
                        })
                    })
                    .collect(),
            ))
        })
    }

    /// [`Client::gather_with`] saying nothing of what it waits for.
    pub fn gather<'a>(
        &'a mut self,
        job: JobId,
        dir: &'a Path,
    ) -> crate::Boxed<'a, Result<Vec<GatheredOutput>>> {
        self.gather_with(job, dir, |_| {})
    }

    /// Transfer staging: fetches every output of `job` from the worker holding it into
    /// `dir/<path>`, each through a temporary file in the same folder, its blake3 hash checked
    /// before it is renamed into place. Returns what was written.
    ///
    /// Outputs lost with their workers are rebuilt: the coordinator runs the tasks that made
    /// them again, and this waits for the job to end again (`note` is told why) before it
    /// asks once more. A holder that dies during the gather is noticed by the coordinator
    /// within its heartbeat timeout; the gather asks again meanwhile, with backoff.
    pub fn gather_with<'a>(
        &'a mut self,
        job: JobId,
        dir: &'a Path,
        note: impl FnMut(&str) + Send + 'a,
    ) -> crate::Boxed<'a, Result<Vec<GatheredOutput>>> {
        self.gather_dyn(job, dir, Box::new(note))
    }

    /// [`Client::gather_with`] past its one generic parameter: compiled here, once.
    fn gather_dyn<'a>(
        &'a mut self,
        job: JobId,
        dir: &'a Path,
        mut note: Box<dyn FnMut(&str) + Send + 'a>,
    ) -> crate::Boxed<'a, Result<Vec<GatheredOutput>>> {
        crate::boxed(async move {
            // Each round either fetches everything, or waits for a rebuild or a lost holder to be
            // noticed: a bounded number, so that a job whose outputs are lost at every try ends.
            const ROUNDS: u32 = 12;
            let mut backoff = std::time::Duration::from_millis(250);
            let mut last_error = String::new();
            // A lost connection (the coordinator restarts, a leader changes) is made again
            // within the follower's patience, and counts no round.
            let mut outage = Outage::default();
            let mut rounds = 0;
            while rounds < ROUNDS {
                rounds += 1;
                let answered = self.answered;
                let asked =
                    self.outputs(job).await.map_err(
                        |e| {
                            if answered {
                                lost_if_answered(e)
                            } else {
                                e
                            }
                        },
                    );
                if asked.is_ok() {
                    outage.answered();
                }
                let outs = match asked {
                    Ok(Outputs::Ready(outs)) => outs,
                    Ok(Outputs::Rebuilding(why)) => {
                        note(&why);
                        let end = self.wait(job, |_| {}).await?;
                        if !end.succeeded() {
                            return Err(ClusterError::Rpc(format!(
                                "{job} {} while rebuilding its lost outputs ({why})",
                                end.state
                            )));
                        }
                        continue;
                    }
                    // Workers rejoining a restarted coordinator, or a holder not yet found lost.
                    Err(e) if holders_rejoining(&e) => {
                        last_error = e.to_string();
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(4));
                        continue;
                    }
                    Err(e) if e.is_transient() => {
                        rounds -= 1;
                        *self = self.follow_again(&mut outage, false, e).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                match fetch_all(&outs, dir).await {
                    Ok(()) => return Ok(outs),
                    Err(e) => {
                        // Its holder may have just died: the coordinator finds it lost within its
                        // heartbeat timeout and then names another holder or rebuilds.
                        note(&format!("{e}; asking the coordinator again"));
                        last_error = e.to_string();
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(4));
                    }
                }
            }
            Err(ClusterError::Rpc(format!(
                "cannot gather the outputs of {job} after {ROUNDS} tries: {last_error}"
            )))
        })
    }

    /// Admin: adds tenant `name` with `quota`; its token.
    pub fn tenant_add<'a>(
        &'a mut self,
        name: &'a str,
        quota: &'a Quota,
    ) -> crate::Boxed<'a, Result<NewToken>> {
        self.tenant_add_with_credits(name, quota, "")
    }

    /// Admin: adds tenant `name` with `quota` and hands it `credits` (a decimal amount; ""
    /// for none); its token.
    pub fn tenant_add_with_credits<'a>(
        &'a mut self,
        name: &'a str,
        quota: &'a Quota,
        credits: &'a str,
    ) -> crate::Boxed<'a, Result<NewToken>> {
        crate::boxed(async move {
            let r = self
                .admin
                .tenant_add(proto::TenantAddRequest {
                    name: name.to_string(),
                    cpus: quota.cpus,
                    gpus: quota.gpus,
                    running_jobs: quota.running_jobs,
                    tasks: quota.tasks,
                    credits: credits.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            Ok(r.into())
        })
    }

    /// Admin: every tenant.
    pub fn tenant_list<'a>(&'a mut self) -> crate::Boxed<'a, Result<Vec<Tenant>>> {
        crate::boxed(async move {
            let r = self
                .admin
                .tenant_list(proto::TenantListRequest {})
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json)
                .map_err(|e| ClusterError::Rpc(format!("tenant list: {e}")))
        })
    }

    /// Admin: changes tenant `name`'s quotas and hands it `grant` more credits (a decimal
    /// amount; "" for none); the tenant as it is now.
    pub fn tenant_set<'a>(
        &'a mut self,
        name: &'a str,
        change: &'a crate::access::QuotaChange,
        grant: &'a str,
    ) -> crate::Boxed<'a, Result<Tenant>> {
        crate::boxed(async move {
            let lift = [
                change.cpus == Some(None),
                change.gpus == Some(None),
                change.running_jobs == Some(None),
                change.tasks == Some(None),
            ];
            let r = self
                .admin
                .tenant_set(proto::TenantSetRequest {
                    name: name.to_string(),
                    cpus: change.cpus.flatten(),
                    gpus: change.gpus.flatten(),
                    running_jobs: change.running_jobs.flatten(),
                    tasks: change.tasks.flatten(),
                    lift: crate::access::QuotaChange::NAMES
                        .iter()
                        .zip(lift)
                        .filter(|(_, l)| *l)
                        .map(|(n, _)| (*n).to_string())
                        .collect(),
                    grant: grant.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json).map_err(|e| ClusterError::Rpc(format!("tenant set: {e}")))
        })
    }

    /// Admin: a new worker enrolment token.
    pub fn worker_token_add<'a>(&'a mut self, name: &'a str) -> crate::Boxed<'a, Result<NewToken>> {
        crate::boxed(async move {
            let r = self
                .admin
                .worker_token_add(proto::WorkerTokenAddRequest {
                    name: name.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            Ok(r.into())
        })
    }

    /// One more token for tenant or provider `name` (`role`: `"tenant"` or `"provider"`),
    /// which must exist (admin only).
    pub fn token_add<'a>(
        &'a mut self,
        role: &'a str,
        name: &'a str,
    ) -> crate::Boxed<'a, Result<NewToken>> {
        crate::boxed(async move {
            let r = self
                .admin
                .token_add(proto::TokenAddRequest {
                    role: role.to_string(),
                    name: name.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            Ok(r.into())
        })
    }

    /// Admin: a new provider of machines (the pool) and its token.
    pub fn provider_add<'a>(&'a mut self, name: &'a str) -> crate::Boxed<'a, Result<NewToken>> {
        crate::boxed(async move {
            let r = self
                .admin
                .provider_add(proto::ProviderAddRequest {
                    name: name.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            Ok(r.into())
        })
    }

    /// Admin: adds an allocation queue (`flotilla alloc add`); the queue made.
    pub fn alloc_add<'a>(
        &'a mut self,
        req: proto::AllocAddRequest,
    ) -> crate::Boxed<'a, Result<crate::alloc::Queue>> {
        crate::boxed(async move {
            let r = self
                .admin
                .alloc_add(req)
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            alloc_json(&r.json)
        })
    }

    /// Admin: every allocation queue.
    pub fn alloc_list<'a>(&'a mut self) -> crate::Boxed<'a, Result<Vec<crate::alloc::Queue>>> {
        crate::boxed(async move {
            let r = self
                .admin
                .alloc_list(proto::AllocListRequest {})
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            alloc_json(&r.json)
        })
    }

    /// Admin: acts on allocation queue `queue` (`info`, `pause` with `reason`, `resume`,
    /// `remove`); the queue as it is after.
    pub fn alloc_queue<'a>(
        &'a mut self,
        op: AllocOp,
        queue: u32,
        reason: &'a str,
    ) -> crate::Boxed<'a, Result<crate::alloc::Queue>> {
        crate::boxed(async move {
            let req = proto::AllocQueueRequest {
                queue,
                reason: reason.to_string(),
            };
            let r = match op {
                AllocOp::Info => self.admin.alloc_info(req).await,
                AllocOp::Pause => self.admin.alloc_pause(req).await,
                AllocOp::Resume => self.admin.alloc_resume(req).await,
                AllocOp::Remove => self.admin.alloc_remove(req).await,
            }
            .map_err(|e| self.rpc_err(e))?
            .into_inner();
            alloc_json(&r.json)
        })
    }

    /// Drains the live workers named `name` (or with id `name`); their ids.
    pub fn worker_drain<'a>(&'a mut self, name: &'a str) -> crate::Boxed<'a, Result<Vec<String>>> {
        crate::boxed(async move {
            let r = self
                .admin
                .worker_drain(proto::WorkerDrainRequest {
                    name: name.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json).map_err(|e| ClusterError::Rpc(format!("drain: {e}")))
        })
    }

    /// Adds node `node_id`, whose API address is `address`, to the group of coordinators
    /// (it runs `flotilla server ... --join`); returns once it votes, with the group's
    /// status.
    pub fn group_add<'a>(
        &'a mut self,
        node_id: u64,
        address: &'a str,
    ) -> crate::Boxed<'a, Result<crate::ha::GroupStatus>> {
        crate::boxed(async move {
            let r = self
                .admin
                .group_member_add(proto::GroupMemberRequest {
                    node_id,
                    address: address.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json).map_err(|e| ClusterError::Rpc(format!("group add: {e}")))
        })
    }

    /// Removes node `node_id` from the group of coordinators; the group's status after.
    pub fn group_remove<'a>(
        &'a mut self,
        node_id: u64,
    ) -> crate::Boxed<'a, Result<crate::ha::GroupStatus>> {
        crate::boxed(async move {
            let r = self
                .admin
                .group_member_remove(proto::GroupMemberRequest {
                    node_id,
                    address: String::new(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json)
                .map_err(|e| ClusterError::Rpc(format!("group remove: {e}")))
        })
    }

    /// Lets job `job` spend `amount` more credits (`"50"`, `"+12.5"`); its pool accounts
    /// after, as JSON.
    pub fn budget<'a>(
        &'a mut self,
        job: JobId,
        amount: &'a str,
    ) -> crate::Boxed<'a, Result<serde_json::Value>> {
        crate::boxed(async move {
            let r = self
                .inner
                .budget(proto::BudgetRequest {
                    job: job.0,
                    amount: amount.to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json).map_err(|e| ClusterError::Rpc(format!("budget: {e}")))
        })
    }

    /// The ledger as the caller may see it (`tenant`: the admin's filter), as JSON:
    /// `accounts` (name, kind, balance), and for the admin `platform`, `issued` and `total`.
    pub fn ledger<'a>(
        &'a mut self,
        tenant: Option<&'a str>,
    ) -> crate::Boxed<'a, Result<serde_json::Value>> {
        crate::boxed(async move {
            let r = self
                .inner
                .ledger(proto::LedgerRequest {
                    tenant: tenant.unwrap_or_default().to_string(),
                })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json).map_err(|e| ClusterError::Rpc(format!("ledger: {e}")))
        })
    }

    /// The providers with their live workers and prices (admin and tenants).
    pub fn provider_list<'a>(&'a mut self) -> crate::Boxed<'a, Result<Vec<ProviderSummary>>> {
        crate::boxed(async move {
            let r = self
                .inner
                .provider_list(proto::ProviderListRequest {})
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json)
                .map_err(|e| ClusterError::Rpc(format!("provider list: {e}")))
        })
    }

    /// Admin: every token (ids, roles, names; never a token).
    pub fn token_list<'a>(&'a mut self) -> crate::Boxed<'a, Result<Vec<TokenInfo>>> {
        crate::boxed(async move {
            let r = self
                .admin
                .token_list(proto::TokenListRequest {})
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json).map_err(|e| ClusterError::Rpc(format!("token list: {e}")))
        })
    }

    /// Admin: revokes token `id`.
    pub fn token_revoke<'a>(&'a mut self, id: &'a str) -> crate::Boxed<'a, Result<TokenInfo>> {
        crate::boxed(async move {
            let r = self
                .admin
                .token_revoke(proto::TokenRevokeRequest { id: id.to_string() })
                .await
                .map_err(|e| self.rpc_err(e))?
                .into_inner();
            serde_json::from_str(&r.json)
                .map_err(|e| ClusterError::Rpc(format!("token revoke: {e}")))
        })
    }

    /// Asks the coordinator to stop (used by `flotilla run` for its in-process server).
    pub fn shutdown<'a>(&'a mut self) -> crate::Boxed<'a, Result<()>> {
        crate::boxed(async move {
            self.inner
                .shutdown(proto::ShutdownRequest {})
                .await
                .map_err(|e| self.rpc_err(e))?;
            Ok(())
        })
    }
}

/// The most a job's uploaded files may weigh in all: they travel in the submit message.
pub const MAX_UPLOAD_BYTES: u64 = 256 << 20;

/// Whether a declared input path is a glob pattern (`*`, `?`, `[...]`).
pub(crate) fn is_glob(p: &str) -> bool {
    p.contains(['*', '?', '['])
}

/// Transfer staging: the declared inputs that no task declares as an output and that are
/// plain files of the job folder `dir`, read for upload with the job (each once). A glob
/// pattern (`data/*.csv`) uploads every plain file of the job folder it matches.
pub(crate) fn uploads(
    graph: &flotilla_core::TaskGraph,
    dir: &Path,
) -> Result<Vec<proto::UploadedFile>> {
    let produced: std::collections::HashSet<&str> = graph
        .tasks()
        .iter()
        .flat_map(|t| t.outputs.iter().map(String::as_str))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut patterns = std::collections::BTreeSet::new();
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut add = |rel: String, full: &Path, files: &mut Vec<proto::UploadedFile>| -> Result<()> {
        if produced.contains(rel.as_str()) || !seen.insert(rel.clone()) || !full.is_file() {
            return Ok(());
        }
        let data = std::fs::read(full).map_err(|e| ClusterError::io(full, e))?;
        total += data.len() as u64;
        if total > MAX_UPLOAD_BYTES {
            return Err(ClusterError::Config(format!(
                "the input files of the job folder weigh more than {} MiB in all (at {rel}): \
                 they travel with the submission; use staging = \"shared\" for large inputs",
                MAX_UPLOAD_BYTES >> 20
            )));
        }
        files.push(proto::UploadedFile { path: rel, data });
        Ok(())
    };
    for t in graph.tasks() {
        for p in &t.inputs {
            if is_glob(p) {
                if !patterns.insert(p.clone()) {
                    continue;
                }
                crate::objects::safe_relative(p)?;
                let full = dir.join(p);
                let text = full.to_string_lossy().into_owned();
                let matches = glob::glob(&text)
                    .map_err(|e| ClusterError::Config(format!("input pattern {p:?}: {e}")))?;
                for m in matches.flatten() {
                    let Ok(rel) = m.strip_prefix(dir) else {
                        continue;
                    };
                    let rel = rel.to_string_lossy().into_owned();
                    add(rel, &m, &mut files)?;
                }
                continue;
            }
            let rel = crate::objects::safe_relative(p)?;
            let full = dir.join(rel);
            add(p.clone(), &full, &mut files)?;
        }
    }
    Ok(files)
}

/// A gather's answer that the holders of its outputs have not all come back to a restarted
/// coordinator yet: asked again after a while. (It is `UNAVAILABLE`; matched once as another
/// kind, it ended the gather at once.)
fn holders_rejoining(e: &ClusterError) -> bool {
    matches!(e, ClusterError::Unavailable(m) | ClusterError::Rpc(m) if m.contains("rejoined"))
}

/// Turns a transport-level HTTP/2 failure of a plain-TCP client into a TLS error that says
/// the server may want TLS; other errors are converted as usual.
pub(crate) fn plain_to_tls_hint(addr: &str, tls: bool, s: tonic::Status) -> ClusterError {
    let chain = crate::transport::error_chain(&s);
    // Errors the transport made up (not sent by the server) carry their cause as a source.
    let transport = matches!(
        s.code(),
        tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Unavailable
            | tonic::Code::Cancelled
    ) && (std::error::Error::source(&s).is_some()
        || chain.contains("h2 protocol error")
        || chain.contains("operation was canceled"));
    if !tls && transport {
        // The deepest cause says what the connection saw ("frame with invalid size": TLS
        // bytes read as HTTP/2); the status's own text is a dump of the transport's types.
        let mut root: &(dyn std::error::Error + 'static) = &s;
        while let Some(next) = root.source() {
            root = next;
        }
        // Refused: nothing listens there now (a coordinator that restarts, a port-forward
        // gone), which TLS has nothing to do with.
        if root
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return ClusterError::Connect {
                addr: addr.to_string(),
                message: root.to_string(),
            };
        }
        let seen = if std::ptr::addr_eq(root, &s as &dyn std::error::Error) {
            s.message().to_string()
        } else {
            root.to_string()
        };
        ClusterError::Tls {
            addr: addr.to_string(),
            message: format!(
                "no HTTP/2 answer over plain TCP ({seen}): the server may speak TLS; \
                 pass --tls-ca with the CA certificate that signed its certificate"
            ),
        }
    } else if transport {
        let mut root: &(dyn std::error::Error + 'static) = &s;
        while let Some(next) = root.source() {
            root = next;
        }
        lost_connection(addr, root).unwrap_or_else(|| s.into())
    } else {
        s.into()
    }
}

/// An error on a connection the coordinator had answered: the "may speak TLS" reading of a
/// broken transport (which a first call needs) is the connection lost there.
fn lost_if_answered(e: ClusterError) -> ClusterError {
    match e {
        ClusterError::Tls { addr, message } if message.contains("the server may speak TLS") => {
            ClusterError::Unavailable(format!(
                "the connection to the coordinator at {addr} was lost"
            ))
        }
        e => e,
    }
}

/// A connection that broke under a call (its peer gone: reset, broken pipe, closed), as
/// [`ClusterError::Unavailable`], which callers may try again.
fn lost_connection(addr: &str, root: &(dyn std::error::Error + 'static)) -> Option<ClusterError> {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let io = root.downcast_ref::<std::io::Error>().is_some_and(|e| {
        matches!(
            e.kind(),
            BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof
        )
    });
    let text = root.to_string().to_ascii_lowercase();
    let said = ["broken pipe", "connection reset", "connection aborted"]
        .iter()
        .any(|w| text.contains(w));
    (io || said).then(|| {
        ClusterError::Unavailable(format!(
            "the connection to the coordinator at {addr} was lost ({root})"
        ))
    })
}

/// What [`Client::alloc_queue`] does to a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocOp {
    /// Reads it.
    Info,
    /// Submits nothing more (what runs goes on).
    Pause,
    /// Submits again.
    Resume,
    /// Cancels its allocations and forgets it.
    Remove,
}

fn alloc_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| ClusterError::Rpc(format!("alloc: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coordinator's answer to a gather while the workers holding the outputs have not
    /// come back after its restart, as the client receives it, is asked again.
    #[test]
    fn a_gather_waits_for_the_holders_to_rejoin_a_restarted_coordinator() {
        let answer = tonic::Status::unavailable(
            "the coordinator restarted and the workers holding outputs of job-1 have not all \
             rejoined yet; try again in a few seconds",
        );
        assert!(holders_rejoining(&plain_to_tls_hint("h:1", false, answer)));
        let other = tonic::Status::unavailable("the coordinator is stopping");
        assert!(!holders_rejoining(&plain_to_tls_hint("h:1", false, other)));
    }

    /// A connection that broke under a call is lost (transient), not a TLS mismatch.
    #[test]
    fn a_broken_connection_is_lost_not_tls() {
        let broken = || {
            let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
            tonic::Status::from_error(Box::new(io))
        };
        // A first call of a plain client: the server may want TLS (it closes on the preface).
        let first = plain_to_tls_hint("h:1", false, broken());
        assert!(matches!(first, ClusterError::Tls { .. }), "{first:?}");
        // On a connection that had answered, the same failure is the connection lost.
        for e in [
            lost_if_answered(plain_to_tls_hint("h:1", false, broken())),
            plain_to_tls_hint("h:1", true, broken()),
        ] {
            assert!(matches!(e, ClusterError::Unavailable(_)), "{e:?}");
            assert!(e.is_transient());
            assert!(e.to_string().contains("was lost"), "{e}");
        }
    }

    #[test]
    fn plain_client_transport_failure_says_the_server_may_speak_tls() {
        let s = tonic::Status::cancelled("operation was canceled");
        let e = plain_to_tls_hint("127.0.0.1:7070", false, s).to_string();
        assert!(e.contains("127.0.0.1:7070") && e.contains("TLS"), "{e}");
        let s = tonic::Status::unknown("h2 protocol error: http2 error");
        let e = plain_to_tls_hint("h:1", false, s).to_string();
        assert!(e.contains("--tls-ca"), "{e}");
    }

    /// Found through a stale `kubectl port-forward`: a connection refused under an RPC was
    /// said to be a server that may speak TLS.
    #[test]
    fn a_refused_connection_is_no_tls_hint_but_no_coordinator_answering() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let s = tonic::Status::from_error(Box::new(refused));
        let e = plain_to_tls_hint("h:1", false, s);
        assert!(matches!(e, ClusterError::Connect { .. }), "{e:?}");
        assert!(!e.to_string().contains("TLS"), "{e}");
    }

    #[test]
    fn server_errors_and_tls_clients_get_no_tls_hint() {
        let s = tonic::Status::unauthenticated("invalid token");
        let e = plain_to_tls_hint("h:1", false, s).to_string();
        assert!(e.contains("invalid token") && !e.contains("TLS"), "{e}");
        let s = tonic::Status::unknown("h2 protocol error: http2 error");
        let e = plain_to_tls_hint("h:1", true, s).to_string();
        assert!(!e.contains("--tls-ca"), "{e}");
    }
}
