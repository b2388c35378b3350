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

use crate::auth::TokenAdd;
use crate::error::{ClusterError, Result};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::{self, JobEvent};
use crate::transport::Remote;

/// A connection to a coordinator.
#[derive(Clone)]
pub struct Client {
    inner: CoordinatorClient<InterceptedService<Channel, TokenAdd>>,
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

impl Client {
    /// Connects to the coordinator at `remote`.
    pub async fn connect(remote: &Remote) -> Result<Self> {
        let channel = remote.channel().await?;
        let inner = CoordinatorClient::with_interceptor(channel, TokenAdd::new(&remote.token)?)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        Ok(Self { inner })
    }

    /// Validates the job file here (so errors name the file and line at once), then submits
    /// it; its folder is the file's folder.
    pub async fn submit_file(&mut self, path: &Path) -> Result<Submitted> {
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
        flotilla_core::parse_job(&text, &file_name)?.expand()?;
        self.submit_text(&file_name, &text, &dir).await
    }

    /// Submits a job built in code; `dir` is its folder.
    pub async fn submit_spec(&mut self, spec: &JobSpec, dir: &Path) -> Result<Submitted> {
        let text = spec.to_toml();
        self.submit_text(
            &format!("{}.toml", spec.name),
            &text,
            &dir.display().to_string(),
        )
        .await
    }

    /// Submits a job file's text.
    pub async fn submit_text(
        &mut self,
        file_name: &str,
        toml: &str,
        dir: &str,
    ) -> Result<Submitted> {
        let r = self
            .inner
            .submit(proto::SubmitRequest {
                file_name: file_name.to_string(),
                toml: toml.to_string(),
                dir: dir.to_string(),
                tenant: String::new(),
            })
            .await?
            .into_inner();
        Ok(Submitted {
            job: JobId::new(r.job),
            name: r.name,
            tasks: r.tasks,
        })
    }

    /// A job's status, or (with `None`) every job and worker, as the JSON document
    /// `flotilla status --json` prints.
    pub async fn status(&mut self, job: Option<JobId>) -> Result<serde_json::Value> {
        let r = self
            .inner
            .status(proto::StatusRequest {
                job: job.map(|j| j.0),
            })
            .await?
            .into_inner();
        serde_json::from_str(&r.json)
            .map_err(|e| ClusterError::Rpc(format!("bad status document: {e}")))
    }

    /// The stream of a job's events, starting with the current state of each task.
    pub async fn watch(&mut self, job: JobId) -> Result<tonic::Streaming<JobEvent>> {
        Ok(self
            .inner
            .watch(proto::WatchRequest { job: job.0 })
            .await?
            .into_inner())
    }

    /// Follows a job to its end, calling `on_event` for every event.
    pub async fn wait(
        &mut self,
        job: JobId,
        mut on_event: impl FnMut(&JobEvent),
    ) -> Result<Finished> {
        let mut s = self.watch(job).await?;
        while let Some(ev) = s.message().await? {
            on_event(&ev);
            if ev.job_finished {
                return Ok(Finished {
                    state: ev.job_state,
                });
            }
        }
        Err(ClusterError::Rpc(format!(
            "the coordinator closed the event stream of {job} before it finished"
        )))
    }

    /// Cancels a job: its running tasks are stopped, the others are not started.
    pub async fn cancel(&mut self, job: JobId) -> Result<()> {
        self.inner
            .cancel(proto::CancelRequest { job: job.0 })
            .await?;
        Ok(())
    }

    /// A task's captured output (`task` is its name, e.g. `tile[3]`); with `follow`, the
    /// stream goes on until the task ends.
    pub async fn logs(
        &mut self,
        job: JobId,
        task: &str,
        follow: bool,
        stderr: bool,
    ) -> Result<tonic::Streaming<proto::LogChunk>> {
        Ok(self
            .inner
            .logs(proto::LogsRequest {
                job: job.0,
                task: task.to_string(),
                follow,
                stderr,
            })
            .await?
            .into_inner())
    }

    /// Asks the coordinator to stop (used by `flotilla run` for its in-process server).
    pub async fn shutdown(&mut self) -> Result<()> {
        self.inner.shutdown(proto::ShutdownRequest {}).await?;
        Ok(())
    }
}
