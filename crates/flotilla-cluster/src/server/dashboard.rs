//! The web dashboard, on the coordinator's HTTP listener: a login page, one page of
//! embedded HTML/CSS/JS (no CDN: it works offline), a JSON API under `/api/` and a stream of
//! server-sent events.
//!
//! # Access
//! The same tokens and roles as the gRPC API. `GET /?token=T` or the login form exchanges a
//! token once for a session: an `HttpOnly`, `SameSite=Strict` cookie holding a random id that
//! maps to the token here; every request re-checks the token, so a revoked token's sessions
//! die with it. `/api/` also takes `Authorization: Bearer T`. A tenant sees its own jobs, the
//! admin every job.
//!
//! # Never in the scheduler's way
//! The cluster view and the event stream read the snapshots the core publishes (at most two a
//! second, see [`super::http`]). A job's status, trace and the model go through the core's
//! queue like the gRPC requests, but each answer is kept for a second per job and scope: ten
//! dashboards watching a job cost one request a second.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use bytes::Bytes;
use flotilla_core::JobId;
use futures::Stream;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::oneshot;

use super::core::Req;
use super::http::Http;
use crate::access::Scope;

const LOGIN: &str = include_str!("dashboard/login.html");
const INDEX: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// The session cookie's name.
const COOKIE: &str = "flotilla_session";

/// The tasks of a job's page (its table shows the first 500).
const PAGE_TASKS: usize = 500;

/// The attempts of a job's timeline: those that ended last (and every running one).
const PAGE_SPANS: usize = 2000;

/// The sessions one token may hold at once (browsers, tabs after a login each).
const SESSIONS_PER_TOKEN: usize = 32;

/// How often an event stream sends the cluster view.
const EVENT_EVERY: Duration = Duration::from_secs(1);

/// How long an answer from the core is served again (per job and scope).
const KEEP: Duration = Duration::from_secs(1);

/// Sessions and the answers kept from the core.
#[derive(Default)]
pub(crate) struct Dashboard {
    /// Session id → token.
    sessions: Mutex<HashMap<String, String>>,
    /// (what, scope) → (when, JSON).
    kept: Mutex<Kept>,
}

/// Answers from the core by (what, scope), with when they came.
type Kept = HashMap<(String, String), (Instant, Bytes)>;

/// A request without a valid session or token (401).
struct Refused(&'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (StatusCode::UNAUTHORIZED, format!("{}\n", self.0)).into_response()
    }
}

/// The dashboard's side of [`Http`]: the core's queue.
#[derive(Clone)]
pub(crate) struct Core(pub(crate) super::queue::CoreQueue);

fn scope_key(s: &Scope) -> String {
    match s {
        Scope::All => String::new(),
        Scope::Tenant(t) => format!("tenant:{t}"),
    }
}

/// The caller's token: the session cookie's, else a bearer token.
fn token_of(http: &Http, headers: &HeaderMap) -> Option<String> {
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string());
    if let Some(id) = cookie {
        if let Some(t) = http.dashboard.sessions.lock().get(&id) {
            return Some(t.clone());
        }
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(super::http::bearer)
        .map(|t| t.trim().to_string())
}

/// The caller's scope, or 401.
fn scope_of(http: &Http, headers: &HeaderMap) -> Result<Scope, Refused> {
    let token = token_of(http, headers).ok_or(Refused("log in first"))?;
    let p = http
        .access
        .authenticate(&token)
        .ok_or(Refused("the token is not valid (unknown or revoked)"))?;
    p.scope().ok_or(Refused(
        "this token sees no jobs: use the admin's or a tenant's",
    ))
}

/// A new session for `token` if it is one that sees jobs: the `Set-Cookie` value.
fn open_session(http: &Http, token: &str) -> Option<String> {
    let p = http.access.authenticate(token.trim())?;
    p.scope()?;
    let id: String = rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let token = token.trim().to_string();
    let mut sessions = http.dashboard.sessions.lock();
    // Sessions of revoked tokens go; a token holds at most 32 (each login opens one, and
    // older ones beyond that are dropped, whichever they are).
    sessions.retain(|_, t| http.access.authenticate(t).is_some());
    let mine: Vec<String> = sessions
        .iter()
        .filter(|(_, t)| **t == token)
        .map(|(k, _)| k.clone())
        .collect();
    for k in mine.iter().skip(SESSIONS_PER_TOKEN - 1) {
        sessions.remove(k);
    }
    sessions.insert(id.clone(), token);
    Some(format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/"))
}

#[derive(Deserialize)]
pub(crate) struct TokenQuery {
    token: Option<String>,
}

/// `/`: the dashboard for a session, `?token=T` exchanged for one, else the login page.
pub(crate) async fn index(
    State(http): State<Http>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    if let Some(t) = q.token {
        return match open_session(&http, &t) {
            // The token leaves the address bar (and the history) at once.
            Some(cookie) => ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response(),
            None => login_page(StatusCode::UNAUTHORIZED, "That token is not valid here."),
        };
    }
    match scope_of(&http, &headers) {
        Ok(_) => page(INDEX),
        Err(_) => login_page(StatusCode::OK, ""),
    }
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

/// `POST /login`.
pub(crate) async fn login(State(http): State<Http>, Form(f): Form<LoginForm>) -> Response {
    match open_session(&http, &f.token) {
        Some(cookie) => ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response(),
        None => login_page(StatusCode::UNAUTHORIZED, "That token is not valid here."),
    }
}

/// `POST /logout`.
pub(crate) async fn logout(State(http): State<Http>, headers: HeaderMap) -> Response {
    if let Some(t) = token_of(&http, &headers) {
        http.dashboard.sessions.lock().retain(|_, v| *v != t);
    }
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Redirect::to("/"),
    )
        .into_response()
}

fn page(html: &'static str) -> Response {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'self'; script-src 'self'",
            ),
        ],
        Html(html),
    )
        .into_response()
}

fn login_page(code: StatusCode, message: &str) -> Response {
    let html = LOGIN.replace("{{message}}", &escape(message));
    (code, [(header::CACHE_CONTROL, "no-store")], Html(html)).into_response()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `/app.js`, `/app.css`.
pub(crate) async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

pub(crate) async fn app_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

/// A JSON answer; kept answers are shared, not copied.
fn json(body: Bytes) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `/api/cluster`: the jobs the caller sees and the workers, from the latest snapshot.
pub(crate) async fn cluster(State(http): State<Http>, headers: HeaderMap) -> Response {
    let scope = match scope_of(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let snap = http.metrics.fresh().await;
    json(Bytes::from(cluster_json(&snap.status, &scope)))
}

fn cluster_json(status: &crate::state::ClusterStatus, scope: &Scope) -> String {
    let doc = serde_json::json!({
        "jobs": status.jobs.iter().filter(|j| scope.sees(&j.tenant)).collect::<Vec<_>>(),
        "workers": status.workers,
        "admin": *scope == Scope::All,
    });
    doc.to_string()
}

/// Asks the core, or answers from what was kept for `what` and this scope in the last
/// second.
async fn kept(
    http: &Http,
    what: String,
    scope: &Scope,
    make: impl FnOnce(oneshot::Sender<Result<String, tonic::Status>>) -> Req,
) -> Response {
    let key = (what, scope_key(scope));
    if let Some((at, body)) = http.dashboard.kept.lock().get(&key) {
        if at.elapsed() < KEEP {
            return json(body.clone());
        }
    }
    let (tx, rx) = oneshot::channel();
    if let Err(s) = super::rpc::offer(&http.core.0, make(tx)) {
        return (StatusCode::SERVICE_UNAVAILABLE, s.message().to_string()).into_response();
    }
    match rx.await {
        Ok(Ok(body)) => {
            let body = Bytes::from(body);
            let mut k = http.dashboard.kept.lock();
            // Old answers go: the map holds at most what was asked in the last second.
            k.retain(|_, (at, _)| at.elapsed() < KEEP);
            k.insert(key, (Instant::now(), body.clone()));
            json(body)
        }
        Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
            (StatusCode::NOT_FOUND, s.message().to_string()).into_response()
        }
        Ok(Err(s)) => (StatusCode::BAD_REQUEST, s.message().to_string()).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordinator is stopping",
        )
            .into_response(),
    }
}

/// `/api/jobs/{id}`: one job with its tasks.
pub(crate) async fn job(
    State(http): State<Http>,
    Path(id): Path<u64>,
    headers: HeaderMap,
) -> Response {
    job_document(&http, id, &headers, false).await
}

/// `/api/jobs/{id}/trace`: its attempts in time, those running, and its graph when small.
pub(crate) async fn trace(
    State(http): State<Http>,
    Path(id): Path<u64>,
    headers: HeaderMap,
) -> Response {
    job_document(&http, id, &headers, true).await
}

/// A job's status, or its trace, through the core (kept a second).
async fn job_document(http: &Http, id: u64, headers: &HeaderMap, trace: bool) -> Response {
    let scope = match scope_of(http, headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let (job, s) = (JobId::new(id), scope.clone());
    let what = format!("{} {id}", if trace { "trace" } else { "job" });
    // A page's worth: the first tasks of the table, the latest bars of the timeline.
    let limit = Some(if trace { PAGE_SPANS } else { PAGE_TASKS });
    kept(http, what, &scope, move |reply| Req::Status {
        job: Some(job),
        scope: s,
        trace,
        limit,
        from: 0,
        states: Vec::new(),
        reply,
    })
    .await
}

/// `/api/model`: the performance model.
pub(crate) async fn model(State(http): State<Http>, headers: HeaderMap) -> Response {
    let scope = match scope_of(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let s = scope.clone();
    kept(&http, "model".into(), &scope, move |reply| Req::Model {
        scope: s,
        reply,
    })
    .await
}

/// `/api/ledger`: the pool's accounts the caller sees (a tenant its own).
pub(crate) async fn ledger(State(http): State<Http>, headers: HeaderMap) -> Response {
    let scope = match scope_of(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let s = scope.clone();
    kept(&http, "ledger".into(), &scope, move |reply| Req::Ledger {
        scope: s,
        tenant: None,
        reply,
    })
    .await
}

/// `/api/providers`: the pool's providers, their workers, prices, reputation and earnings.
pub(crate) async fn providers(State(http): State<Http>, headers: HeaderMap) -> Response {
    let scope = match scope_of(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let providers = http.access.providers();
    let s = scope.clone();
    kept(&http, "providers".into(), &scope, move |reply| {
        Req::Providers {
            scope: s,
            providers,
            reply,
        }
    })
    .await
}

#[derive(Deserialize)]
pub(crate) struct LogQuery {
    stderr: Option<bool>,
}

/// `/api/jobs/{id}/logs/{task}?stderr=true`: the last 64 KiB a task's latest attempt wrote.
pub(crate) async fn logs(
    State(http): State<Http>,
    Path((id, task)): Path<(u64, String)>,
    Query(q): Query<LogQuery>,
    headers: HeaderMap,
) -> Response {
    const TAIL: u64 = 64 << 10;
    let scope = match scope_of(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let (tx, rx) = oneshot::channel();
    let req = Req::LogInfo {
        job: JobId::new(id),
        task,
        attempt: None,
        scope,
        reply: tx,
    };
    if let Err(s) = super::rpc::offer(&http.core.0, req) {
        return (StatusCode::SERVICE_UNAVAILABLE, s.message().to_string()).into_response();
    }
    let info = match rx.await {
        Ok(Ok(info)) => info,
        Ok(Err(s)) => return (StatusCode::NOT_FOUND, s.message().to_string()).into_response(),
        Err(_) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the coordinator is stopping",
            )
                .into_response()
        }
    };
    let path = if q.stderr.unwrap_or(false) {
        info.err
    } else {
        info.out
    };
    let text = tokio::task::spawn_blocking(move || {
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let from = len.saturating_sub(TAIL);
        let bytes = super::rpc::read_chunk(&path, from);
        String::from_utf8_lossy(&bytes).into_owned()
    })
    .await
    .unwrap_or_default();
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

/// `/api/events`: a `cluster` event with the cluster view from the newest snapshot, once a
/// second (the core builds snapshots only while someone listens).
pub(crate) async fn events(State(http): State<Http>, headers: HeaderMap) -> Response {
    let scope = match scope_of(&http, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    Sse::new(event_stream(http, headers, scope))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The stream of `/api/events` for the caller of `headers`: it ends once its token is
/// revoked or its session logged out (asked again before each event: a stream opened before
/// a revocation went on showing the tenant's jobs for as long as it stayed open).
fn event_stream(
    http: Http,
    headers: HeaderMap,
    scope: Scope,
) -> impl Stream<Item = Result<Event, Infallible>> {
    async_stream(move |tx| async move {
        loop {
            if scope_of(&http, &headers).ok().as_ref() != Some(&scope) {
                return;
            }
            // The newest snapshot, asking the core for one (the same path as a scrape).
            let snap = http.metrics.fresh().await;
            let body = cluster_json(&snap.status, &scope);
            if tx
                .send(Ok(Event::default().event("cluster").data(body)))
                .await
                .is_err()
            {
                return;
            }
            // One event a second at most: a page need not redraw more often, and each event
            // makes it fetch its job's status and timeline.
            tokio::time::sleep(EVENT_EVERY).await;
        }
    })
}

/// A stream fed by a task through a small channel (dropped with the client).
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Event, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
