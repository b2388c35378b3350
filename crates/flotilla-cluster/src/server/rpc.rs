//! The tonic handlers: validate a request, do its file work off the async threads, ask the
//! core, answer.

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::{JobId, WorkerId};
use futures::Stream;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

use crate::access::{Access, Principal, Scope};
use crate::auth::principal;
use crate::error::ClusterError;
use crate::proto::admin_server::Admin as AdminRpc;
use crate::proto::coordinator_server::Coordinator as CoordinatorRpc;
use crate::proto::workers_server::Workers;
use crate::proto::{self};

use super::core::{Reply, Req};
use super::queue::CoreQueue;

/// The gRPC handlers.
#[derive(Clone)]
pub(super) struct Api {
    pub(super) core: CoreQueue,
    pub(super) sessions: Arc<Mutex<HashMap<WorkerId, mpsc::Receiver<proto::CoordinatorMessage>>>>,
    /// Files uploaded with transfer jobs, served to workers by `Objects.Fetch`.
    pub(super) store: Arc<crate::objects::ObjectStore>,
    /// The most task instances one submitted job may expand to.
    pub(super) max_job_tasks: u64,
    /// Tokens, tenants, credentials.
    pub(super) access: Arc<Access>,
    /// Stops the server (`Shutdown` works even when the core's queue is full).
    pub(super) stop: tokio::sync::watch::Sender<bool>,
    /// Open streams per token.
    pub(super) streams: Arc<StreamCounts>,
    /// The allocation queues (`flotilla alloc`).
    pub(super) alloc: Arc<crate::alloc::Allocator>,
    /// In a group: this node (the leader), which copies uploads to the others.
    pub(super) group: Option<Arc<crate::ha::Node>>,
}

/// Open streams (`Watch`, `Logs`, sessions) per token: one holder cannot take the
/// coordinator's memory and tasks with streams.
pub(super) struct StreamCounts {
    open: Mutex<HashMap<String, usize>>,
    max: usize,
}

/// One open stream, counted until dropped.
pub(super) struct StreamSlot {
    counts: Arc<StreamCounts>,
    key: String,
}

impl StreamCounts {
    pub(super) fn new(max: usize) -> Arc<StreamCounts> {
        Arc::new(StreamCounts {
            open: Mutex::new(HashMap::new()),
            max: max.max(1),
        })
    }

    /// A slot for one more stream of `who`, or `RESOURCE_EXHAUSTED`.
    fn acquire(self: &Arc<Self>, who: &Principal) -> std::result::Result<StreamSlot, Status> {
        let key = match who {
            Principal::Worker { worker, .. } => format!("{worker}"),
            other => other.token_id().to_string(),
        };
        let mut open = self.open.lock();
        let n = open.entry(key.clone()).or_default();
        if *n >= self.max {
            return Err(Status::resource_exhausted(format!(
                "{} streams are open with this token already (the most at once): close one",
                self.max
            )));
        }
        *n += 1;
        Ok(StreamSlot {
            counts: self.clone(),
            key,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock();
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Queues `req` for the core, or refuses it when the queue is full: a client is told to
/// retry, nothing already accepted is lost.
pub(super) fn offer(core: &CoreQueue, req: Req) -> std::result::Result<(), Status> {
    core.try_send(req).map_err(|e| match e {
        crossbeam_channel::TrySendError::Full(_) => Status::resource_exhausted(
            "the coordinator is busy (its request queue is full): retry shortly",
        ),
        crossbeam_channel::TrySendError::Disconnected(_) => {
            Status::unavailable("the coordinator is stopping")
        }
    })
}

/// Queues `req` for the core, waiting while the queue is full (a worker's session: its
/// stream is not read meanwhile, which pushes back on the worker). `false` once the core is
/// gone.
async fn offer_patiently(core: &CoreQueue, mut req: Req) -> bool {
    let mut wait = Duration::from_micros(100);
    loop {
        match core.try_send(req) {
            Ok(()) => return true,
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => return false,
            Err(crossbeam_channel::TrySendError::Full(r)) => {
                req = r;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(20));
            }
        }
    }
}

/// The refusal of a request its sender's role does not allow.
fn deny(p: &Principal, what: &str) -> Status {
    Status::permission_denied(format!("a {} token may not {what}", p.role()))
}

/// The jobs the sender of `req` may see; refused for workers.
fn job_scope<T>(req: &Request<T>, what: &str) -> std::result::Result<Scope, Status> {
    let p = principal(req)?;
    p.scope().ok_or_else(|| deny(&p, what))
}

/// Only the admin.
fn admin_only<T>(req: &Request<T>, what: &str) -> std::result::Result<(), Status> {
    let p = principal(req)?;
    if p.is_admin() {
        Ok(())
    } else {
        Err(deny(&p, what))
    }
}

/// `inner`, ended with `UNAUTHENTICATED` as soon as `who`'s token is revoked, and with
/// `UNAVAILABLE` when the server stops (a stream left open would hold its graceful stop);
/// `slot` is held until it ends.
pub(super) fn revocable<T: Send + 'static>(
    inner: BoxStream<T>,
    access: Arc<Access>,
    who: Principal,
    (slot, mut stop): (StreamSlot, tokio::sync::watch::Receiver<bool>),
) -> BoxStream<T> {
    use futures::StreamExt as _;
    let mut revoked = access.revocations();
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let _slot = slot;
        let mut inner = inner;
        loop {
            tokio::select! {
                item = inner.next() => match item {
                    Some(i) => {
                        if tx.send(i).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
                changed = revoked.changed() => {
                    if changed.is_err() || !access.still_valid(&who) {
                        let _ = tx
                            .send(Err(Status::unauthenticated("the access token was revoked")))
                            .await;
                        return;
                    }
                }
                () = tx.closed() => return,
                stopped = stop.changed() => {
                    if stopped.is_err() || *stop.borrow() {
                        let _ = tx
                            .send(Err(Status::unavailable("the coordinator is stopping")))
                            .await;
                        return;
                    }
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

impl Api {
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Req) -> std::result::Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        offer(&self.core, make(tx))?;
        rx.await
            .map_err(|_| Status::unavailable("the coordinator is stopping"))?
    }
}

/// Transfer staging: every declared input (not a pattern) must be uploaded from the job
/// folder or be an output of one of the task's ancestors; otherwise the task would fail
/// with "No such file or directory" after waiting its turn. A pattern input that matches an
/// output of a task that does not run before it is refused too: that output is never staged
/// for it (a count over `shards/*.csv` without `after = ["split"]` ran on an empty folder).
/// The error names the task and the path (and the producer, when it is not an ancestor);
/// the checks are [`crate::plan::input_problems`], which a dry run applies too.
pub(crate) fn check_transfer_inputs(
    graph: &flotilla_core::TaskGraph,
    uploaded: &std::collections::HashSet<&str>,
    file: &str,
) -> std::result::Result<(), String> {
    // A pattern matching nothing is no reason to refuse (a dry run warns of it).
    match crate::plan::input_problems(graph, uploaded, &|_| true)
        .into_iter()
        .find(|p| p.refused_in(flotilla_core::Staging::Transfer))
    {
        Some(p) => Err(format!("{file}: {p}")),
        None => Ok(()),
    }
}

/// How many uploaded files a submission to a group copies to the other nodes at once.
const REPLICATED_AT_ONCE: usize = 4;

type BoxStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl CoordinatorRpc for Api {
    async fn submit(
        &self,
        req: Request<proto::SubmitRequest>,
    ) -> std::result::Result<Response<proto::SubmitReply>, Status> {
        let who = principal(&req)?;
        // The job is filed under the sender's tenant, whatever the request says.
        let tenant = who
            .submits_as()
            .ok_or_else(|| deny(&who, "submit jobs"))?
            .to_string();
        let quota_tasks = self.access.quota(&tenant).and_then(|q| q.tasks);
        let r = req.into_inner();
        crate::plan::check_job_dir(&r.dir).map_err(Status::invalid_argument)?;
        if r.request_id.chars().count() > 128 {
            return Err(Status::invalid_argument(
                "request_id: at most 128 characters",
            ));
        }
        let request_id = (!r.request_id.is_empty()).then(|| r.request_id.clone());
        // `${i}` and `{{i}}` read otherwise by older versions (replaced, or refused outside
        // arrays): a group takes such a job only while every member reads them as written.
        let escapes = r.toml.contains("${i}") || r.toml.contains("{{i}}");
        if let Some(why) = self
            .group
            .as_ref()
            .filter(|_| escapes)
            .and_then(|g| g.placeholder_refusal())
        {
            return Err(Status::failed_precondition(format!(
                "{}: {why}",
                r.file_name
            )));
        }
        // Parsing a large job and hashing uploads into the store are CPU and disk work:
        // off the async threads.
        let store = self.store.clone();
        let max_tasks = self.max_job_tasks;
        let submitted = tokio::task::spawn_blocking(move || {
            let spec = flotilla_core::parse_job(&r.toml, &r.file_name)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let tasks: u64 = spec.tasks.iter().map(|t| t.instance_count()).sum();
            if tasks > max_tasks {
                return Err(Status::invalid_argument(format!(
                    "{}: the job expands to {tasks} tasks, more than this coordinator takes \
                     in one job ({max_tasks}, `flotilla server --max-job-tasks`)",
                    r.file_name
                )));
            }
            if let Some(q) = quota_tasks.filter(|&q| tasks > q) {
                return Err(Status::resource_exhausted(format!(
                    "{}: the job expands to {tasks} tasks, more than tenant {tenant:?} may \
                     submit in one job (its tasks quota: {q})",
                    r.file_name
                )));
            }
            // Expanding is CPU work too: here, not on the core thread.
            let graph = spec
                .expand()
                .map_err(|e| Status::invalid_argument(format!("{}: {e}", r.file_name)))?;
            if spec.staging == flotilla_core::Staging::Transfer {
                let uploaded = r.files.iter().map(|f| f.path.as_str()).collect();
                check_transfer_inputs(&graph, &uploaded, &r.file_name)
                    .map_err(Status::invalid_argument)?;
            }
            let mut files = Vec::with_capacity(r.files.len());
            let mut uploads = Vec::with_capacity(r.files.len());
            for f in r.files {
                crate::objects::safe_relative(&f.path)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                let (hash, size) = store.put_bytes(&f.data).map_err(|e| match e {
                    ClusterError::StoreFull { .. } | ClusterError::ObjectTooLarge { .. } => {
                        Status::resource_exhausted(format!("uploading {}: {e}", f.path))
                    }
                    e => Status::internal(format!("storing {}: {e}", f.path)),
                })?;
                uploads.push((hash.clone(), f.data));
                files.push(proto::Object {
                    path: f.path,
                    hash,
                    size,
                });
            }
            let toml = spec.to_toml();
            Ok::<_, Status>((spec, Box::new(graph), toml, files, uploads, r.dir, tenant))
        })
        .await
        .map_err(|e| Status::internal(format!("the submission's file work failed: {e}")))??;
        let (spec, graph, toml, files, uploads, dir, tenant) = submitted;
        // In a group, the files reach a majority before the job exists: whichever node leads
        // next can hand them to the job's tasks.
        if let Some(node) = &self.group {
            use futures::{StreamExt as _, TryStreamExt as _};
            // A few files at a time: each waits for a majority of the group.
            let node = node.clone();
            futures::stream::iter(uploads.into_iter().map(move |(hash, data)| {
                let node = node.clone();
                async move {
                    node.replicate_object(&hash, &data).await.map_err(|e| {
                        Status::unavailable(format!(
                            "the group could not keep a copy of an uploaded file ({hash}): {e}; \
                         nothing was submitted"
                        ))
                    })
                }
            }))
            .buffer_unordered(REPLICATED_AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
        }
        let reply = self
            .ask(|reply| Req::Submit {
                spec,
                graph,
                toml,
                dir,
                tenant,
                files,
                request_id,
                reply,
            })
            .await?;
        Ok(Response::new(reply))
    }

    async fn status(
        &self,
        req: Request<proto::StatusRequest>,
    ) -> std::result::Result<Response<proto::StatusReply>, Status> {
        let scope = job_scope(&req, "see jobs")?;
        let r = req.into_inner();
        let (job, trace) = (r.job.map(JobId::new), r.trace);
        let limit = r
            .task_limit
            .filter(|_| !trace)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let from = usize::try_from(r.task_from).unwrap_or(usize::MAX);
        let states = r
            .states
            .iter()
            .map(|s| {
                s.parse::<crate::state::TaskState>()
                    .map_err(Status::invalid_argument)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let json = self
            .ask(|reply| Req::Status {
                job,
                scope,
                trace,
                limit,
                from,
                states,
                reply,
            })
            .await?;
        Ok(Response::new(proto::StatusReply { json }))
    }

    type WatchStream = BoxStream<proto::JobEvent>;
    async fn watch(
        &self,
        req: Request<proto::WatchRequest>,
    ) -> std::result::Result<Response<Self::WatchStream>, Status> {
        let scope = job_scope(&req, "watch jobs")?;
        let who = principal(&req)?;
        let slot = self.streams.acquire(&who)?;
        let job = JobId::new(req.into_inner().job);
        let (tx, rx) = mpsc::channel(super::core::WATCH_BUFFER);
        offer(&self.core, Req::Watch { job, scope, tx })?;
        Ok(Response::new(revocable(
            Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)),
            self.access.clone(),
            who,
            (slot, self.stop.subscribe()),
        )))
    }

    async fn cancel(
        &self,
        req: Request<proto::CancelRequest>,
    ) -> std::result::Result<Response<proto::CancelReply>, Status> {
        let scope = job_scope(&req, "cancel jobs")?;
        let job = JobId::new(req.into_inner().job);
        self.ask(|reply| Req::Cancel { job, scope, reply }).await?;
        Ok(Response::new(proto::CancelReply {}))
    }

    async fn remove(
        &self,
        req: Request<proto::RemoveRequest>,
    ) -> std::result::Result<Response<proto::RemoveReply>, Status> {
        let scope = job_scope(&req, "remove jobs")?;
        let job = JobId::new(req.into_inner().job);
        self.ask(|reply| Req::Remove { job, scope, reply }).await?;
        Ok(Response::new(proto::RemoveReply {}))
    }

    type LogsStream = BoxStream<proto::LogChunk>;
    async fn logs(
        &self,
        req: Request<proto::LogsRequest>,
    ) -> std::result::Result<Response<Self::LogsStream>, Status> {
        let scope = job_scope(&req, "read logs")?;
        let who = principal(&req)?;
        let slot = self.streams.acquire(&who)?;
        let r = req.into_inner();
        let job = JobId::new(r.job);
        let info = self
            .ask(|reply| Req::LogInfo {
                job,
                task: r.task.clone(),
                attempt: r.attempt,
                scope: scope.clone(),
                reply,
            })
            .await?;
        let (tx, rx) = mpsc::channel(8);
        let core = self.core.clone();
        let task = r.task.clone();
        tokio::spawn(async move {
            let mut path = if r.stderr {
                info.err.clone()
            } else {
                info.out.clone()
            };
            let mut off = 0u64;
            let mut attempt = info.attempt;
            let mut finished = info.finished;
            let mut ran = info.ran;
            let mut sent = false;
            loop {
                let chunk = {
                    let p = path.clone();
                    let o = off;
                    tokio::task::spawn_blocking(move || read_chunk(&p, o))
                        .await
                        .unwrap_or_default()
                };
                if !chunk.is_empty() {
                    off += chunk.len() as u64;
                    sent = true;
                    if tx
                        .send(Ok(proto::LogChunk {
                            data: chunk,
                            stderr: r.stderr,
                            attempt,
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                if finished || !r.follow {
                    // Nothing to show: said with the attempt read, 0 for a task that never
                    // ran (`logs` said "wrote nothing" of a task still waiting, or cancelled).
                    if !sent {
                        let _ = tx
                            .send(Ok(proto::LogChunk {
                                data: Vec::new(),
                                stderr: r.stderr,
                                attempt: if ran { attempt } else { 0 },
                            }))
                            .await;
                    }
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (rtx, rrx) = oneshot::channel();
                let asked = Req::LogInfo {
                    job,
                    task: task.clone(),
                    attempt: r.attempt,
                    scope: scope.clone(),
                    reply: rtx,
                };
                if !offer_patiently(&core, asked).await {
                    return;
                }
                match rrx.await {
                    Ok(Ok(i)) => {
                        let now = if r.stderr { i.err } else { i.out };
                        if now != path {
                            // Another attempt (the first one, when the stream opened on a
                            // task still queued, or a retry): its log is another file,
                            // followed from its start.
                            path = now;
                            attempt = i.attempt;
                            off = 0;
                            finished = false;
                        } else {
                            finished = i.finished;
                        }
                        ran = i.ran;
                    }
                    _ => return,
                }
            }
        });
        Ok(Response::new(revocable(
            Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)),
            self.access.clone(),
            who,
            (slot, self.stop.subscribe()),
        )))
    }

    async fn outputs(
        &self,
        req: Request<proto::OutputsRequest>,
    ) -> std::result::Result<Response<proto::OutputsReply>, Status> {
        let scope = job_scope(&req, "fetch outputs")?;
        let job = JobId::new(req.into_inner().job);
        let reply = self.ask(|reply| Req::Outputs { job, scope, reply }).await?;
        Ok(Response::new(reply))
    }

    async fn ledger(
        &self,
        req: Request<proto::LedgerRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        let scope = job_scope(&req, "read the ledger")?;
        let t = req.into_inner().tenant;
        let tenant = (!t.is_empty()).then_some(t);
        let json = self
            .ask(|reply| Req::Ledger {
                scope,
                tenant,
                reply,
            })
            .await?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn budget(
        &self,
        req: Request<proto::BudgetRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        let scope = job_scope(&req, "raise budgets")?;
        let r = req.into_inner();
        let job = JobId::new(r.job);
        let text = r.amount.trim();
        let amount =
            flotilla_pool::Credits::parse(text.strip_prefix('+').unwrap_or(text), "amount")
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if amount == flotilla_pool::Credits::ZERO {
            return Err(Status::invalid_argument(format!(
                "amount {text}: a raise of 0 changes nothing (e.g. +50 for 50 credits more)"
            )));
        }
        let json = self
            .ask(|reply| Req::Budget {
                job,
                scope,
                amount,
                reply,
            })
            .await?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn retry(
        &self,
        req: Request<proto::RetryRequest>,
    ) -> std::result::Result<Response<proto::RetryReply>, Status> {
        let scope = job_scope(&req, "retry jobs")?;
        let job = JobId::new(req.into_inner().job);
        // The group's log holds the retry: every member must read it (a rolling upgrade).
        if let Some(why) = self.group.as_ref().and_then(|g| g.retry_refusal()) {
            return Err(Status::failed_precondition(why));
        }
        let tasks = self.ask(|reply| Req::Retry { job, scope, reply }).await?;
        Ok(Response::new(proto::RetryReply { tasks }))
    }

    async fn provider_list(
        &self,
        req: Request<proto::ProviderListRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        // The admin and tenants (who choose where their work goes) see the providers.
        let scope = job_scope(&req, "list providers")?;
        let providers = self.access.providers();
        let json = self
            .ask(|reply| Req::Providers {
                scope,
                providers,
                reply,
            })
            .await?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn shutdown(
        &self,
        req: Request<proto::ShutdownRequest>,
    ) -> std::result::Result<Response<proto::ShutdownReply>, Status> {
        admin_only(&req, "shut the coordinator down")?;
        let _ = self.stop.send(true);
        Ok(Response::new(proto::ShutdownReply {}))
    }
}

impl Api {
    /// A change of the group's members: the admin's, on a node of a group.
    #[allow(clippy::result_large_err)] // tonic's Status, as the handlers return it
    fn group_request(
        &self,
        req: Request<proto::GroupMemberRequest>,
    ) -> std::result::Result<(Arc<crate::ha::Node>, proto::GroupMemberRequest), Status> {
        admin_only(&req, "change the group's members")?;
        let node = self.group.clone().ok_or_else(|| {
            Status::failed_precondition(
                "this coordinator is not in a group (flotilla server --node-id N --peers ...)",
            )
        })?;
        Ok((node, req.into_inner()))
    }
}

/// The group's status as `flotilla admin group` prints it.
fn group_reply(
    status: &crate::ha::GroupStatus,
) -> std::result::Result<Response<proto::JsonReply>, Status> {
    let json = serde_json::to_string(status).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(proto::JsonReply { json }))
}

#[tonic::async_trait]
impl AdminRpc for Api {
    async fn tenant_add(
        &self,
        req: Request<proto::TenantAddRequest>,
    ) -> std::result::Result<Response<proto::NewToken>, Status> {
        admin_only(&req, "add tenants")?;
        let r = req.into_inner();
        let credits = credits_arg(&r.credits, "--credits")?;
        let quota = crate::access::Quota {
            cpus: r.cpus,
            gpus: r.gpus,
            running_jobs: r.running_jobs,
            tasks: r.tasks,
        };
        let (info, token) = self
            .change_access(move |a| a.add_tenant(&r.name, quota))
            .await?;
        self.send_quotas();
        self.grant(&info.name, credits).await?;
        tracing::info!(tenant = %info.name, id = %info.id, %credits, "tenant added");
        Ok(Response::new(proto::NewToken { id: info.id, token }))
    }

    async fn tenant_list(
        &self,
        req: Request<proto::TenantListRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "list tenants")?;
        let json = serde_json::to_string(&self.access.tenants())
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn tenant_set(
        &self,
        req: Request<proto::TenantSetRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "change tenants")?;
        let r = req.into_inner();
        let mut change = crate::access::QuotaChange {
            cpus: r.cpus.map(Some),
            gpus: r.gpus.map(Some),
            running_jobs: r.running_jobs.map(Some),
            tasks: r.tasks.map(Some),
        };
        for name in &r.lift {
            let given = match name.as_str() {
                "cpus" => change.cpus.replace(None).is_some(),
                "gpus" => change.gpus.replace(None).is_some(),
                "running_jobs" => change.running_jobs.replace(None).is_some(),
                "tasks" => change.tasks.replace(None).is_some(),
                other => {
                    return Err(Status::invalid_argument(format!(
                        "no quota {other:?} to lift: {}",
                        crate::access::QuotaChange::NAMES.join(", ")
                    )))
                }
            };
            if given {
                return Err(Status::invalid_argument(format!(
                    "quota {name}: both set and lifted"
                )));
            }
        }
        let grant = credits_arg(&r.grant, "--grant")?;
        if change.is_empty() && grant == flotilla_pool::Credits::ZERO {
            return Err(Status::invalid_argument(
                "nothing to change: give a quota (e.g. --cpus 8, --cpus none) or --grant",
            ));
        }
        let name = r.name.clone();
        let tenant = if change.is_empty() {
            // Only a grant: the tenant must exist all the same.
            self.access
                .tenants()
                .into_iter()
                .find(|t| t.name == name)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "no tenant {name:?} (`flotilla admin tenant list` lists them)"
                    ))
                })?
        } else {
            let t = self
                .change_access(move |a| a.set_quota(&name, &change))
                .await?;
            self.send_quotas();
            t
        };
        self.grant(&tenant.name, grant).await?;
        tracing::info!(tenant = %tenant.name, quota = ?tenant.quota, %grant, "tenant changed");
        let json = serde_json::to_string(&tenant).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn worker_drain(
        &self,
        req: Request<proto::WorkerDrainRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "drain workers")?;
        let name = req.into_inner().name;
        let json = self.ask(|reply| Req::Drain { name, reply }).await?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn group_member_add(
        &self,
        req: Request<proto::GroupMemberRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        let (node, r) = self.group_request(req)?;
        let added = node.add_member(r.node_id, r.address.trim()).await;
        group_reply(&added.map_err(Status::failed_precondition)?)
    }

    async fn group_member_remove(
        &self,
        req: Request<proto::GroupMemberRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        let (node, r) = self.group_request(req)?;
        let removed = node.remove_member(r.node_id).await;
        group_reply(&removed.map_err(Status::failed_precondition)?)
    }

    async fn alloc_add(
        &self,
        req: Request<proto::AllocAddRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "add allocation queues")?;
        let r = req.into_inner();
        let or = |v: u32, d: u32| if v == 0 { d } else { v };
        let spec = crate::alloc::QueueSpec {
            manager: r.manager,
            name: r.name,
            partition: r.partition,
            time_limit_s: r.time_limit_s,
            workers_per_alloc: or(r.workers_per_alloc, 1),
            max_allocs: or(r.max_allocs, 1),
            backlog: or(r.backlog, 1),
            idle_timeout_s: if r.idle_timeout_s == 0 {
                300
            } else {
                r.idle_timeout_s
            },
            cpus_per_worker: (r.cpus_per_worker != 0.0).then_some(r.cpus_per_worker),
            gpus_per_worker: r.gpus_per_worker,
            rule: r.rule,
            max_failures: or(r.max_failures, 3),
            worker_program: r.worker_program,
            server_address: r.server_address,
            work_dir: r.work_dir,
            token_file: String::new(),
            sbatch_args: r.sbatch_args,
            worker_args: r.worker_args,
        };
        self.with_alloc(move |a| a.add(spec)).await
    }

    async fn alloc_list(
        &self,
        req: Request<proto::AllocListRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "list allocation queues")?;
        self.with_alloc(|a| Ok(a.list())).await
    }

    async fn alloc_info(
        &self,
        req: Request<proto::AllocQueueRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "read allocation queues")?;
        let q = req.into_inner().queue;
        self.with_alloc(move |a| a.info(q)).await
    }

    async fn alloc_pause(
        &self,
        req: Request<proto::AllocQueueRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "pause allocation queues")?;
        let r = req.into_inner();
        self.with_alloc(move |a| a.pause(r.queue, &r.reason)).await
    }

    async fn alloc_resume(
        &self,
        req: Request<proto::AllocQueueRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "resume allocation queues")?;
        let q = req.into_inner().queue;
        self.with_alloc(move |a| a.resume(q)).await
    }

    async fn alloc_remove(
        &self,
        req: Request<proto::AllocQueueRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "remove allocation queues")?;
        let q = req.into_inner().queue;
        self.with_alloc(move |a| a.remove(q)).await
    }

    async fn provider_add(
        &self,
        req: Request<proto::ProviderAddRequest>,
    ) -> std::result::Result<Response<proto::NewToken>, Status> {
        admin_only(&req, "add providers")?;
        let name = req.into_inner().name;
        let (info, token) = self.change_access(move |a| a.add_provider(&name)).await?;
        tracing::info!(provider = %info.name, id = %info.id, "provider added");
        Ok(Response::new(proto::NewToken { id: info.id, token }))
    }

    async fn token_add(
        &self,
        req: Request<proto::TokenAddRequest>,
    ) -> std::result::Result<Response<proto::NewToken>, Status> {
        admin_only(&req, "add tokens")?;
        let r = req.into_inner();
        let role = match r.role.as_str() {
            "tenant" => crate::access::Role::Tenant,
            "provider" => crate::access::Role::Provider,
            other => {
                return Err(Status::invalid_argument(format!(
                    "token role {other:?}: expected \"tenant\" or \"provider\""
                )))
            }
        };
        let name = r.name;
        let (info, token) = self
            .change_access(move |a| a.add_token_for(role, &name))
            .await?;
        tracing::info!(id = %info.id, name = %info.name, "token added");
        Ok(Response::new(proto::NewToken { id: info.id, token }))
    }

    async fn worker_token_add(
        &self,
        req: Request<proto::WorkerTokenAddRequest>,
    ) -> std::result::Result<Response<proto::NewToken>, Status> {
        admin_only(&req, "add worker tokens")?;
        let name = req.into_inner().name;
        let (info, token) = self
            .change_access(move |a| a.add_worker_token(&name))
            .await?;
        tracing::info!(id = %info.id, "worker enrolment token added");
        Ok(Response::new(proto::NewToken { id: info.id, token }))
    }

    async fn token_list(
        &self,
        req: Request<proto::TokenListRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "list tokens")?;
        let json = serde_json::to_string(&self.access.tokens())
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::JsonReply { json }))
    }

    async fn token_revoke(
        &self,
        req: Request<proto::TokenRevokeRequest>,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        admin_only(&req, "revoke tokens")?;
        let id = req.into_inner().id;
        let info = self.change_access(move |a| a.revoke(&id)).await?;
        tracing::info!(id = %info.id, role = %info.role, "token revoked");
        let json = serde_json::to_string(&info).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::JsonReply { json }))
    }
}

impl Api {
    /// Gives the core the tenants' quotas.
    pub(super) fn send_quotas(&self) {
        let q = self
            .access
            .tenants()
            .into_iter()
            .map(|t| (t.name, t.quota))
            .collect();
        // Queued at once when there is room (always at start); otherwise as soon as there is.
        if let Err(crossbeam_channel::TrySendError::Full(req)) = self.core.try_send(Req::Quotas(q))
        {
            let core = self.core.clone();
            tokio::spawn(async move {
                offer_patiently(&core, req).await;
            });
        }
    }
}

impl Api {
    /// Changes the access registry (a file write: off the async threads).
    async fn change_access<T: Send + 'static>(
        &self,
        change: impl FnOnce(&Access) -> std::result::Result<T, crate::access::AccessError>
            + Send
            + 'static,
    ) -> std::result::Result<T, Status> {
        let access = self.access.clone();
        tokio::task::spawn_blocking(move || change(&access))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(access_status)
    }
}

impl Api {
    /// Hands `tenant` `amount` credits (nothing for zero).
    async fn grant(
        &self,
        tenant: &str,
        amount: flotilla_pool::Credits,
    ) -> std::result::Result<(), Status> {
        if amount > flotilla_pool::Credits::ZERO {
            let tenant = tenant.to_string();
            self.ask(|reply| Req::Grant {
                tenant,
                amount,
                reply,
            })
            .await?;
        }
        Ok(())
    }

    /// Runs `f` on the allocator on a blocking thread (it may run the batch system's
    /// commands, and waits for a round in progress); its result as JSON.
    async fn with_alloc<T: serde::Serialize + Send + 'static>(
        &self,
        f: impl FnOnce(&crate::alloc::Allocator) -> std::result::Result<T, crate::alloc::AllocError>
            + Send
            + 'static,
    ) -> std::result::Result<Response<proto::JsonReply>, Status> {
        let alloc = self.alloc.clone();
        let value = tokio::task::spawn_blocking(move || f(&alloc))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| match e {
                crate::alloc::AllocError::Refused(m) => Status::invalid_argument(m),
                e @ crate::alloc::AllocError::NoQueue(_) => Status::not_found(e.to_string()),
                other => Status::internal(other.to_string()),
            })?;
        let json = serde_json::to_string(&value).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::JsonReply { json }))
    }
}

/// Credits handed to a tenant as `flag` gives them: "" is none; positive, or refused (a
/// `--grant 0` did nothing and said nothing).
fn credits_arg(text: &str, flag: &str) -> std::result::Result<flotilla_pool::Credits, Status> {
    if text.trim().is_empty() {
        return Ok(flotilla_pool::Credits::ZERO);
    }
    let amount = flotilla_pool::Credits::parse(text, flag)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    if amount.is_negative() || amount == flotilla_pool::Credits::ZERO {
        return Err(Status::invalid_argument(format!(
            "{flag} {amount}: a tenant is handed a positive amount"
        )));
    }
    Ok(amount)
}

fn access_status(e: crate::access::AccessError) -> Status {
    match e {
        crate::access::AccessError::Refused(m) => Status::invalid_argument(m),
        other => Status::internal(other.to_string()),
    }
}

pub(super) fn read_chunk(path: &Path, off: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(off)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(1 << 20).read_to_end(&mut buf);
    buf
}

#[tonic::async_trait]
impl Workers for Api {
    async fn register(
        &self,
        req: Request<proto::RegisterRequest>,
    ) -> std::result::Result<Response<proto::RegisterReply>, Status> {
        let who = principal(&req)?;
        let enrolment = match &who {
            Principal::Admin { token } | Principal::Enrolment { token } => token.clone(),
            _ => return Err(deny(&who, "register workers")),
        };
        let req = req.into_inner();
        // A provider's worker is that provider's (its token says so), at its price; the
        // operator's own workers are free.
        let provider = self.access.provider_of(&enrolment);
        let price = flotilla_pool::Price::parse(&req.price)
            .map_err(|e| Status::invalid_argument(format!("the worker's --price: {e}")))?;
        if provider.is_none() && req.as_provider {
            return Err(Status::invalid_argument(
                "--provider-token: the token is not a provider's (a worker enrolment token \
                 goes with --token-file; `flotilla admin provider add NAME` makes a \
                 provider's)",
            ));
        }
        if provider.is_none() && price != flotilla_pool::Price::default() {
            return Err(Status::invalid_argument(
                "the worker has a --price but enrolled with a token that is not a provider's \
                 (`flotilla admin provider add NAME` makes one; `flotilla worker \
                 --provider-token FILE`)",
            ));
        }
        if let Some(r) = &req.resources {
            let amounts = [("cpus", r.cpus), ("gpus", r.gpus)]
                .into_iter()
                .chain(r.custom.iter().map(|c| (c.name.as_str(), c.amount)));
            for (name, v) in amounts {
                if !v.is_finite() || v < 0.0 {
                    return Err(Status::invalid_argument(format!(
                        "the worker offers {name} = {v}: amounts must be finite and not negative"
                    )));
                }
            }
        }
        // A worker speaks for its id before a reconnect only with that id's credential.
        let previous = req.previous_worker.and_then(|p| {
            let proved = matches!(
                self.access.authenticate(&req.previous_credential),
                Some(Principal::Worker { worker, .. }) if worker.0 == p
            );
            if !proved {
                tracing::warn!(
                    claimed = p,
                    "a worker claims a previous id without its credential: it claims nothing"
                );
            }
            proved.then_some(WorkerId::new(p))
        });
        let mut reply = self
            .ask(|reply| Req::Register {
                req,
                previous,
                offer: (provider, price),
                reply,
            })
            .await?;
        let me = WorkerId::new(reply.worker);
        reply.credential = self.access.credential(me, &enrolment);
        reply.data_key = crate::access::key_hex(&self.access.data_key(me));
        Ok(Response::new(reply))
    }

    type SessionStream = BoxStream<proto::CoordinatorMessage>;
    async fn session(
        &self,
        req: Request<Streaming<proto::WorkerMessage>>,
    ) -> std::result::Result<Response<Self::SessionStream>, Status> {
        let who = principal(&req)?;
        let Principal::Worker { worker: me, .. } = &who else {
            return Err(deny(
                &who,
                "open a worker session (it takes a worker's credential)",
            ));
        };
        let me = *me;
        let slot = self.streams.acquire(&who)?;
        let mut inbound = req.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("a session starts with a message naming the worker")
        })?;
        let worker = WorkerId::new(first.worker);
        if worker != me {
            return Err(Status::permission_denied(format!(
                "the credential of {me} opens {me}'s session, not {worker}'s"
            )));
        }
        let rx = self.sessions.lock().remove(&worker).ok_or_else(|| {
            Status::failed_precondition(format!(
                "worker {worker} is not registered (or already has a session)"
            ))
        })?;
        let core = self.core.clone();
        if !offer_patiently(&core, Req::FromWorker(first)).await {
            return Err(Status::unavailable("the coordinator is stopping"));
        }
        let (access, holder) = (self.access.clone(), who.clone());
        let store = self.store.clone();
        let group = self.group.clone();
        let mut revoked = access.revocations();
        let stopping = self.stop.subscribe();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = inbound.message() => m,
                    changed = revoked.changed() => {
                        if changed.is_err() || !access.still_valid(&holder) {
                            tracing::warn!(%worker, "its enrolment token was revoked: session closed");
                            break;
                        }
                        continue;
                    }
                };
                match msg {
                    Ok(Some(m)) => {
                        if m.worker != worker.0 {
                            tracing::warn!(%worker, claimed = m.worker, "session message names another worker; closing");
                            break;
                        }
                        // A preempted attempt's checkpoint goes into the coordinator's store
                        // (disk work: off the async threads) before the core hears of it.
                        // Every listed file is stored from the bytes sent: a worker cannot name
                        // an object of the store it did not send.
                        let m = if m.finished.iter().any(|r| !r.checkpoint.is_empty()) {
                            let store = store.clone();
                            let (m, kept) = match tokio::task::spawn_blocking(move || {
                                keep_checkpoints(&store, m)
                            })
                            .await
                            {
                                Ok(r) => r,
                                Err(_) => break,
                            };
                            // In a group, the next leader must be able to hand them out too.
                            if let Some(node) = &group {
                                for (hash, data) in &kept {
                                    if let Err(e) = node.replicate_object(hash, data).await {
                                        tracing::warn!(%worker, "a checkpoint file ({hash}) is not on a majority of the group: {e}");
                                    }
                                }
                            }
                            m
                        } else {
                            m
                        };
                        if !offer_patiently(&core, Req::FromWorker(m)).await {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(%worker, "session stream error: {}", e.message());
                        break;
                    }
                }
            }
            // A session that ends because the coordinator stops is not a lost worker: the
            // worker comes back to the restarted coordinator with its attempts. Taken as lost,
            // its attempts were placed again (journaled) on workers not yet disconnected, and
            // after the restart its running attempts were cancelled and run again.
            if !*stopping.borrow() {
                offer_patiently(&core, Req::SessionClosed(worker)).await;
            }
        });
        let out = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok);
        Ok(Response::new(revocable(
            Box::pin(out),
            self.access.clone(),
            who,
            (slot, self.stop.subscribe()),
        )))
    }
}

/// Puts the checkpoint files a worker sent with preempted attempts into the coordinator's
/// store, naming each by the hash the store computed; an attempt whose files cannot all be
/// kept (a full store) resumes from nothing rather than from part of its checkpoint. Returns
/// the message and the files kept (hash, bytes).
fn keep_checkpoints(
    store: &crate::objects::ObjectStore,
    mut m: proto::WorkerMessage,
) -> (proto::WorkerMessage, Vec<(String, Vec<u8>)>) {
    let mut all = Vec::new();
    for r in &mut m.finished {
        let mut kept = Vec::with_capacity(r.checkpoint.len());
        for c in std::mem::take(&mut r.checkpoint) {
            if crate::objects::safe_relative(&c.path).is_err() {
                tracing::warn!(path = %c.path, "a checkpoint file outside its folder: dropped");
                kept.clear();
                break;
            }
            match store.put_bytes(&c.data) {
                Ok((hash, size)) => kept.push((
                    proto::CheckpointFile {
                        path: c.path,
                        hash,
                        size,
                        data: Vec::new(),
                    },
                    c.data,
                )),
                Err(e) => {
                    tracing::warn!("keeping a checkpoint file {}: {e}", c.path);
                    kept.clear();
                    break;
                }
            }
        }
        let (files, data): (Vec<_>, Vec<_>) = kept.into_iter().unzip();
        all.extend(files.iter().map(|f| f.hash.clone()).zip(data));
        r.checkpoint = files;
    }
    (m, all)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::check_transfer_inputs;
    use crate::plan::check_job_dir;

    fn graph(text: &str) -> flotilla_core::TaskGraph {
        flotilla_core::parse_job(text, "job.toml")
            .and_then(|s| s.expand())
            .expect("a valid job")
    }

    #[test]
    fn transfer_inputs_come_from_the_folder_or_an_ancestor() {
        let chain = r#"
staging = "transfer"
[[task]]
id = "a"
cmd = ["x"]
inputs = ["seed"]
outputs = ["a.out"]
[[task]]
id = "b"
cmd = ["x"]
after = ["a"]
outputs = ["b.out"]
[[task]]
id = "c"
cmd = ["x"]
after = ["b"]
inputs = ["a.out", "b.out", "*.csv"]
"#;
        let seed: HashSet<&str> = ["seed"].into();
        // "a.out" comes from a grandparent: accepted (and staged, see the placement tests).
        assert_eq!(
            check_transfer_inputs(&graph(chain), &seed, "job.toml"),
            Ok(())
        );
        let e = check_transfer_inputs(&graph(chain), &HashSet::new(), "job.toml").unwrap_err();
        assert!(
            e.contains("task \"a\": input \"seed\" is neither in the job folder"),
            "{e}"
        );
        let unordered = chain.replace("after = [\"b\"]", "");
        let e = check_transfer_inputs(&graph(&unordered), &seed, "job.toml").unwrap_err();
        assert!(
            e.starts_with("job.toml: task \"c\": input \"a.out\" is an output of task \"a\""),
            "{e}"
        );
    }

    #[test]
    fn a_transfer_input_pattern_matching_an_unordered_output_is_refused() {
        let job = r#"
staging = "transfer"
[[task]]
id = "split"
array = "0..3"
cmd = ["x"]
outputs = ["shards/{i}.csv"]
[[task]]
id = "count"
cmd = ["x"]
after = ["split"]
inputs = ["shards/*.csv", "notes/*.txt"]
outputs = ["shards/count.txt"]
"#;
        let none = HashSet::new();
        // After every producer (its own output under the same folder does not count).
        assert_eq!(
            check_transfer_inputs(&graph(job), &none, "job.toml"),
            Ok(())
        );
        // Without `after`: the shards are never staged for it.
        let e = check_transfer_inputs(
            &graph(&job.replace("after = [\"split\"]", "")),
            &none,
            "job.toml",
        )
        .unwrap_err();
        assert!(
            e.contains("task \"count\": input pattern \"shards/*.csv\" matches \"shards/0.csv\", an output of task \"split[0]\"")
                && e.contains("add it to `after`"),
            "{e}"
        );
        // After one shard only: the others are refused, naming one.
        let e = check_transfer_inputs(
            &graph(&job.replace("after = [\"split\"]", "after = [\"split[0]\"]")),
            &none,
            "job.toml",
        )
        .unwrap_err();
        assert!(e.contains("matches \"shards/1.csv\""), "{e}");
        // `*` stays within a folder, as staging matches: deeper outputs are not matched.
        let deeper = job
            .replace("shards/{i}.csv", "shards/{i}/part.csv")
            .replace("after = [\"split\"]", "");
        assert_eq!(
            check_transfer_inputs(&graph(&deeper), &none, "job.toml"),
            Ok(())
        );
    }

    #[test]
    fn job_folders_are_a_jobs_own_folder() {
        // `/` once became a WASM task's writable preopen: the whole file system.
        for bad in [
            "/",
            "relative/dir",
            "/home",
            "/home/",
            "/tmp",
            "/etc/x",
            "/proc/1",
            "/usr/lib/x",
            "/home/u/../../etc",
            "/home/u/./j",
            "//etc",
        ] {
            let e = check_job_dir(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        for ok in [
            "/home/u/jobs/sweep",
            "/tmp/flotilla-test/job",
            "/data/run1",
            "/srv/x/",
        ] {
            assert_eq!(check_job_dir(ok), Ok(()), "{ok}");
        }
    }
}
