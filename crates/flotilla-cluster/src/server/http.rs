//! The coordinator's HTTP listener (`flotilla server --http-listen ADDR`): `/metrics` in
//! the Prometheus text format, behind the same tokens as the API.
//!
//! # Never in the scheduler's way
//! The core thread counts events with atomic counters and histograms (a few nanoseconds
//! each) and publishes a [`Snapshot`] of the cluster's state at most twice a second, and
//! only while someone asks for one (a scrape sets [`Metrics::wanted`]). A scrape reads the
//! latest snapshot: however many clients scrape, the core builds at most two a second, and
//! no HTTP request ever waits on the core.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::access::{Access, Scope};
use crate::state::ClusterStatus;

/// How often the core publishes a snapshot at most.
pub(crate) const SNAPSHOT_EVERY: Duration = Duration::from_millis(500);

/// Histogram buckets, seconds: 10 µs to 5 s in 1-2.5-5 steps.
const SECONDS: [f64; 19] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// The coordinator's state as the HTTP side reads it.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// When the core built it.
    pub(crate) at: Instant,
    /// The cluster (every job, as the admin sees it); filtered per caller.
    pub(crate) status: ClusterStatus,
}

/// What the core counts as it goes, and where it publishes its snapshots.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Attempts sent to workers.
    pub(crate) dispatched: Counter,
    /// Bytes of inputs that workers were told to fetch from another holder.
    pub(crate) transferred_bytes: Counter,
    /// Workers declared lost (silent, stream closed, overflowed).
    pub(crate) lost_workers: Counter,
    /// Seconds per journal append (one group commit).
    pub(crate) journal_append: Histogram,
    /// Seconds per commit on a group's majority (a group of coordinators only).
    pub(crate) group_commit: Histogram,
    /// Seconds the core spends on one batch of requests: the state machine's events and
    /// placement, the journal and the dispatch.
    pub(crate) scheduling: Histogram,
    /// Set by a scrape: the core publishes a snapshot at its next tick.
    pub(crate) wanted: AtomicBool,
    /// Snapshots published (a test's and an operator's check of the rate bound).
    pub(crate) published: AtomicU64,
    snapshots: watch::Sender<Arc<Snapshot>>,
}

impl Metrics {
    pub(crate) fn new() -> Arc<Metrics> {
        let empty = Arc::new(Snapshot {
            at: Instant::now(),
            status: ClusterStatus {
                jobs: Vec::new(),
                workers: Vec::new(),
                journal: None,
                leader: None,
                group: None,
            },
        });
        Arc::new(Metrics {
            dispatched: Counter::default(),
            transferred_bytes: Counter::default(),
            lost_workers: Counter::default(),
            journal_append: Histogram::new(SECONDS.iter().copied()),
            group_commit: Histogram::new(SECONDS.iter().copied()),
            scheduling: Histogram::new(SECONDS.iter().copied()),
            wanted: AtomicBool::new(false),
            published: AtomicU64::new(0),
            snapshots: watch::channel(empty).0,
        })
    }

    /// The core's side: publishes `status` as the newest snapshot.
    pub(crate) fn publish(&self, status: ClusterStatus) {
        self.published.fetch_add(1, Ordering::Relaxed);
        self.snapshots.send_replace(Arc::new(Snapshot {
            at: Instant::now(),
            status,
        }));
    }

    /// A snapshot at most about a second old: asks the core for a new one when the latest
    /// is older, and waits up to two seconds for it (a busy core answers later, never
    /// slower).
    pub(crate) async fn fresh(&self) -> Arc<Snapshot> {
        let mut rx = self.snapshots.subscribe();
        // None published yet (the empty one made at start), or an old one.
        let stale = self.published.load(Ordering::Relaxed) == 0
            || rx.borrow().at.elapsed() > 2 * SNAPSHOT_EVERY;
        self.wanted.store(true, Ordering::Relaxed);
        if stale {
            let _ = tokio::time::timeout(Duration::from_secs(2), rx.changed()).await;
        }
        let latest = rx.borrow().clone();
        latest
    }

    /// The metrics in the Prometheus/OpenMetrics text format, as `scope` may see them.
    pub(crate) fn encode(&self, snap: &Snapshot, scope: &Scope) -> String {
        let mut r = Registry::with_prefix("flotilla");
        r.register(
            "tasks_dispatched",
            "Attempts sent to workers (rate() of it is the dispatch rate)",
            self.dispatched.clone(),
        );
        r.register(
            "transferred_bytes",
            "Bytes of task inputs fetched from another worker or the coordinator",
            self.transferred_bytes.clone(),
        );
        r.register(
            "lost_workers",
            "Workers declared lost (silent past the heartbeat timeout, or their session closed without saying they leave; a drained or stopped worker is not lost)",
            self.lost_workers.clone(),
        );
        r.register(
            "journal_append_seconds",
            "Time per journal append (one group commit of a batch)",
            self.journal_append.clone(),
        );
        r.register(
            "group_commit_seconds",
            "Time per commit of a batch on a majority of the group of coordinators (0 samples alone)",
            self.group_commit.clone(),
        );
        r.register(
            "scheduling_latency_seconds",
            "Time the coordinator's core spends on one batch of requests (events, placement, journal, dispatch)",
            self.scheduling.clone(),
        );

        let jobs: Vec<_> = snap
            .status
            .jobs
            .iter()
            .filter(|j| scope.sees(&j.tenant))
            .collect();
        let by_state = Family::<Vec<(String, String)>, Gauge>::default();
        // Every state has its series, 0 when no job holds such tasks: with none at all, a sum
        // over them (the autoscalers' demand) would be no value instead of 0, and an HPA then
        // keeps the replicas it last set instead of scaling down.
        let mut states: BTreeMap<&str, u64> = TASK_STATES.iter().map(|s| (*s, 0)).collect();
        let mut retries = 0u64;
        let per_tenant_running = Family::<Vec<(String, String)>, Gauge>::default();
        let per_tenant_done = Family::<Vec<(String, String)>, Gauge>::default();
        let per_tenant_jobs = Family::<Vec<(String, String)>, Gauge>::default();
        for j in &jobs {
            let c = &j.counts;
            for (name, n) in TASK_STATES.iter().zip([
                c.waiting,
                c.ready,
                c.assigned,
                c.running,
                c.done,
                c.failed,
                c.cancelled,
                c.backoff,
            ]) {
                *states.entry(name).or_default() += n;
            }
            retries += u64::from(j.retries);
            let tenant = vec![("tenant".to_string(), tenant_label(&j.tenant))];
            per_tenant_running
                .get_or_create(&tenant)
                .inc_by(gauge(c.running + c.assigned));
            per_tenant_done.get_or_create(&tenant).inc_by(gauge(c.done));
            // Running now: with tasks placed or running (a job held back by its tenant's
            // --running-jobs quota is not, though its state is).
            let jobs_running = per_tenant_jobs.get_or_create(&tenant);
            if j.state == crate::state::JobState::Running && c.running + c.assigned > 0 {
                jobs_running.inc();
            }
        }
        for (name, n) in &states {
            by_state
                .get_or_create(&vec![("state".to_string(), name.to_string())])
                .set(gauge(*n));
        }
        r.register(
            "tasks",
            "Tasks of the jobs the coordinator holds, by state",
            by_state,
        );
        let ready = Gauge::<i64>::default();
        ready.set(gauge(states.get("ready").copied().unwrap_or(0)));
        r.register(
            "ready_queue_depth",
            "Tasks ready to run and not yet placed",
            ready,
        );
        let retried = Gauge::<i64>::default();
        retried.set(gauge(retries));
        r.register(
            "retries",
            "Retries of the tasks of the jobs the coordinator holds",
            retried,
        );
        r.register(
            "tenant_running_tasks",
            "Tasks placed or running, per tenant",
            per_tenant_running,
        );
        r.register(
            "tenant_done_tasks",
            "Tasks done, per tenant (jobs the coordinator holds)",
            per_tenant_done,
        );
        r.register(
            "tenant_running_jobs",
            "Jobs with tasks placed or running, per tenant",
            per_tenant_jobs,
        );

        let util = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        let cpus = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        let used = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
        let workers = Gauge::<i64>::default();
        for w in &snap.status.workers {
            // Its name and its id: workers share a name (the host name, by default), and
            // series of the same labels were one.
            let l = vec![
                ("worker".to_string(), w.name.clone()),
                ("id".to_string(), w.id.to_string()),
            ];
            util.get_or_create(&l).set(w.utilization);
            cpus.get_or_create(&l).set(w.resources.cpus);
            used.get_or_create(&l).set(w.used.cpus);
            workers.inc();
        }
        r.register("workers", "Workers connected", workers);
        r.register(
            "worker_utilization_ratio",
            "CPU time its finished tasks used over its CPUs x time connected (it moves when a task ends; worker_cpus_used / worker_cpus is what its tasks hold now)",
            util,
        );
        r.register("worker_cpus", "CPUs each worker offers", cpus);
        r.register("worker_cpus_used", "CPUs in use on each worker", used);
        let age = Gauge::<f64, AtomicU64>::default();
        age.set(snap.at.elapsed().as_secs_f64());
        r.register(
            "snapshot_age_seconds",
            "Age of the state snapshot these gauges come from",
            age,
        );
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &r) {
            tracing::warn!("encoding the metrics: {e}");
        }
        out
    }
}

/// The states of `flotilla_tasks{state}`, in the order of the counts' fields.
const TASK_STATES: [&str; 8] = [
    "waiting",
    "ready",
    "assigned",
    "running",
    "done",
    "failed",
    "cancelled",
    "backoff",
];

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn tenant_label(t: &str) -> String {
    if t.is_empty() {
        "admin".to_string()
    } else {
        t.to_string()
    }
}

/// How long an encoded answer is served again to callers of the same scope.
const REUSE: Duration = Duration::from_millis(250);

/// Encoded answers by scope, with when they were made.
pub(crate) type Encoded = std::collections::HashMap<String, (Instant, Arc<String>)>;

/// The HTTP side's shared state.
#[derive(Clone)]
pub(crate) struct Http {
    pub(crate) access: Arc<Access>,
    pub(crate) metrics: Arc<Metrics>,
    /// The latest encoded answer per scope (`""`: the admin's), reused for [`REUSE`]: many
    /// clients scraping at once cost one encoding per scope and period.
    pub(crate) encoded: Arc<parking_lot::Mutex<Encoded>>,
    /// The dashboard's sessions and kept answers.
    pub(crate) dashboard: Arc<super::dashboard::Dashboard>,
    /// The core's queue (the dashboard's job views).
    pub(crate) core: super::dashboard::Core,
}

/// The routes.
pub(crate) fn router(http: Http) -> Router {
    use super::dashboard as d;
    Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(d::index))
        .route("/login", axum::routing::post(d::login))
        .route("/logout", axum::routing::post(d::logout))
        .route("/app.js", get(d::app_js))
        .route("/app.css", get(d::app_css))
        .route("/api/cluster", get(d::cluster))
        .route("/api/events", get(d::events))
        .route("/api/model", get(d::model))
        .route("/api/ledger", get(d::ledger))
        .route("/api/providers", get(d::providers))
        .route("/api/jobs/{id}", get(d::job))
        .route("/api/jobs/{id}/trace", get(d::trace))
        .route("/api/jobs/{id}/logs/{task}", get(d::logs))
        .with_state(http)
}

/// Why a request is refused.
enum Refusal {
    /// No valid token (401, with the scheme to use).
    Unauthorized(&'static str),
    /// A token that sees no jobs (403).
    Forbidden(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Unauthorized(why) => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer realm=\"flotilla\"")],
                format!("{why}\n"),
            )
                .into_response(),
            Refusal::Forbidden(why) => (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
        }
    }
}

/// The token of an `Authorization` value: `Bearer T`, the scheme in any case (RFC 9110
/// makes it case-insensitive; `bearer T` was refused).
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// `Authorization: Bearer T`: the caller's scope, or why it is refused.
fn authorize(http: &Http, headers: &HeaderMap) -> std::result::Result<Scope, Refusal> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::trim)
        .ok_or(Refusal::Unauthorized(
            "no token: send `Authorization: Bearer TOKEN` (the admin's or a tenant's)",
        ))?;
    let principal = http
        .access
        .authenticate(token)
        .ok_or(Refusal::Unauthorized(
            "the token is not valid (unknown or revoked)",
        ))?;
    principal.scope().ok_or_else(|| {
        Refusal::Forbidden(format!(
            "a {} token sees no jobs: use the admin's or a tenant's",
            principal.role()
        ))
    })
}

async fn metrics(State(http): State<Http>, headers: HeaderMap) -> Response {
    let scope = match authorize(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let key = match &scope {
        Scope::All => String::new(),
        Scope::Tenant(t) => format!("tenant:{t}"),
    };
    let cached = http
        .encoded
        .lock()
        .get(&key)
        .filter(|(at, _)| at.elapsed() < REUSE)
        .map(|(_, body)| body.clone());
    let body = match cached {
        Some(body) => body,
        None => {
            let snap = http.metrics.fresh().await;
            let body = Arc::new(http.metrics.encode(&snap, &scope));
            http.encoded
                .lock()
                .insert(key, (Instant::now(), body.clone()));
            body
        }
    };
    let body = body.as_str().to_string();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
