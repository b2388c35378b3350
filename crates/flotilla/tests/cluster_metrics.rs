//! `flotilla server --http-listen`: `/metrics` in the Prometheus text format, behind the
//! API's tokens, scraped and parsed while a job runs and after it ends.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kit::{last_line, wait_until, Cluster, Opts};

/// `GET path` with an optional bearer token: (status code, body).
fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let (code, _, body) = request(addr, path, &auth);
    (code, body)
}

/// `GET path` with extra header lines: (status code, the head, body).
fn request(addr: SocketAddr, path: &str, headers: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let head = raw.split("\r\n\r\n").next().unwrap_or("").to_string();
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {raw:?}"));
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    // A chunked body: join the chunks.
    let body = if raw
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        out
    } else {
        body.to_string()
    };
    (code, head, body)
}

/// The `name=value` of the `Set-Cookie` header in `head`, and its attributes.
fn set_cookie(head: &str) -> (String, String) {
    let line = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie:")
                .then(|| l[11..].trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Set-Cookie in {head}"));
    let pair = line.split(';').next().unwrap().to_string();
    (pair, line)
}

/// Parses the text format: every sample line is `name{labels} value`, every name carries
/// the `flotilla_` prefix, every metric has its `# TYPE`; returns samples by
/// `name{labels}`.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut typed = Vec::new();
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split_whitespace().next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("{line:?}: value: {e}"));
        let name = key.split('{').next().unwrap();
        assert!(name.starts_with("flotilla_"), "{line:?}");
        assert!(
            typed.iter().any(|t| name.starts_with(t.as_str())),
            "{name} has no # TYPE"
        );
        samples.insert(key.to_string(), value);
    }
    samples
}

#[test]
fn metrics_are_served_behind_the_token_and_parse() {
    let opts = Opts {
        server_args: vec!["--http-listen".into(), "127.0.0.1:0".into()],
        ..Opts::default()
    };
    let c = Cluster::start_with(2, 2, opts);
    let http = c.http.expect("the coordinator serves HTTP");

    // A client given the HTTP port by mistake is told what it reached (it said only that a
    // gRPC header was missing).
    let wrong = c
        .cli_command(&["status"], &c.token)
        .env("FLOTILLA_SERVER", http.to_string())
        .output()
        .expect("the flotilla binary runs");
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("the address answers HTTP but is not a coordinator's API"),
        "{err}"
    );

    // No token, or a wrong one: 401.
    let (code, body) = get(http, "/metrics", None);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("Bearer"), "{body}");
    assert_eq!(get(http, "/metrics", Some("not-a-token")).0, 401);
    // The scheme in any case (RFC 9110).
    let lower = format!("Authorization: bearer {}\r\n", c.token);
    assert_eq!(request(http, "/metrics", &lower).0, 200);

    // No job yet: every task state has its series at 0, so the autoscalers' demand,
    // sum(flotilla_tasks{state=~"ready|assigned|running"}), is 0 rather than no value (an
    // HPA given no value keeps the replicas it last set).
    let (code, body) = get(http, "/metrics", Some(&c.token));
    assert_eq!(code, 200, "{body}");
    let m = parse(&body);
    for state in [
        "waiting",
        "ready",
        "assigned",
        "running",
        "done",
        "failed",
        "cancelled",
        "backoff",
    ] {
        let key = format!("flotilla_tasks{{state=\"{state}\"}}");
        assert_eq!(m.get(&key), Some(&0.0), "{key} in {body}");
    }

    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice"]));
    let job = "name = \"m\"\n[[task]]\nid = \"t\"\narray = \"0..12\"\ncmd = [\"true\"]\n";
    let path = c.job_dir().join("m.toml");
    std::fs::write(&path, job).unwrap();
    let out = c.cli_with_token(&["submit", "--wait", &path.display().to_string()], &alice);
    assert!(out.status.success());

    // The admin sees the job's tasks done, dispatches counted, both workers.
    let m = wait_until(
        "the finished job in the metrics",
        Duration::from_secs(30),
        || {
            let (code, body) = get(http, "/metrics", Some(&c.token));
            assert_eq!(code, 200, "{body}");
            let m = parse(&body);
            (m.get("flotilla_tasks{state=\"done\"}") == Some(&12.0)).then_some(m)
        },
    );
    assert!(m["flotilla_tasks_dispatched_total"] >= 12.0, "{m:?}");
    assert_eq!(m["flotilla_workers"], 2.0);
    assert_eq!(m["flotilla_tenant_done_tasks{tenant=\"alice\"}"], 12.0);
    assert_eq!(m["flotilla_ready_queue_depth"], 0.0);
    assert!(m["flotilla_journal_append_seconds_count"] >= 1.0, "{m:?}");
    assert!(
        m["flotilla_scheduling_latency_seconds_count"] >= 1.0,
        "{m:?}"
    );
    assert!(m.contains_key("flotilla_lost_workers_total"));
    assert!(m
        .keys()
        .any(|k| k.starts_with("flotilla_worker_utilization_ratio{")));
    // Each worker's series names its id too (workers of one name were one series).
    let ids = m
        .keys()
        .filter(|k| k.starts_with("flotilla_worker_cpus{") && k.contains("id=\"w"))
        .count();
    assert_eq!(ids, 2, "{m:?}");

    // A tenant sees its own jobs only.
    let bob = last_line(&c.cli(&["admin", "tenant", "add", "bob"]));
    let (code, body) = get(http, "/metrics", Some(&bob));
    assert_eq!(code, 200);
    let m = parse(&body);
    assert!(!m.keys().any(|k| k.contains("alice")), "{body}");
    assert_eq!(
        m.get("flotilla_tasks{state=\"done\"}"),
        Some(&0.0),
        "{body}"
    );

    // A worker's enrolment token sees no jobs: 403.
    let wt = last_line(&c.cli(&["admin", "worker-token", "add", "--name", "w"]));
    assert_eq!(get(http, "/metrics", Some(&wt)).0, 403);

    // A drained worker leaves; it is not counted lost (every drain and scale-down was).
    let out = c.cli(&["admin", "worker", "drain", "w0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = wait_until(
        "the drained worker to leave",
        Duration::from_secs(60),
        || {
            let m = parse(&get(http, "/metrics", Some(&c.token)).1);
            (m.get("flotilla_workers") == Some(&1.0)).then_some(m)
        },
    );
    assert_eq!(m["flotilla_lost_workers_total"], 0.0, "{m:?}");
}

#[test]
fn the_dashboard_exchanges_a_token_for_a_session_and_scopes_its_api() {
    let opts = Opts {
        server_args: vec!["--http-listen".into(), "127.0.0.1:0".into()],
        ..Opts::default()
    };
    let c = Cluster::start_with(1, 1, opts);
    let http = c.http.unwrap();
    let job = c.submit_toml(
        "d.toml",
        "name = \"d\"\n[[task]]\nid = \"a\"\ncmd = [\"sh\", \"-c\", \"echo hello\"]\n",
    );
    c.wait_job(job, Duration::from_secs(60));

    // Nobody logged in: the login page, and the API refuses.
    let (code, _, body) = request(http, "/", "");
    assert_eq!(code, 200);
    assert!(body.contains("name=\"token\""), "{body}");
    assert_eq!(request(http, "/api/cluster", "").0, 401);
    assert_eq!(request(http, "/?token=nope", "").0, 401);

    // The token is exchanged once for an HttpOnly session cookie and a redirect.
    let (code, head, _) = request(http, &format!("/?token={}", c.token), "");
    assert_eq!(code, 303, "{head}");
    let (session, cookie) = set_cookie(&head);
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!session.contains(&c.token), "the cookie is not the token");
    let with = format!("Cookie: {session}\r\n");
    let (code, _, body) = request(http, "/", &with);
    assert_eq!(code, 200);
    assert!(body.contains("/app.js"), "{body}");
    let (code, _, body) = request(http, &format!("/api/jobs/{}", job.0), &with);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"done\""), "{body}");
    let (code, _, body) = request(http, &format!("/api/jobs/{}/logs/a", job.0), &with);
    assert_eq!((code, body.as_str()), (200, "hello\n"));
    let (code, _, body) = request(http, &format!("/api/jobs/{}/trace", job.0), &with);
    assert_eq!(code, 200);
    assert!(body.contains("\"outcome\":\"succeeded\""), "{body}");
    let (code, _, body) = request(http, "/api/model", &with);
    assert_eq!(code, 200);
    assert!(
        body.contains("\"d/a\""),
        "the admin sees every codelet: {body}"
    );
    let (code, _, body) = request(http, "/api/ledger", &with);
    assert_eq!(code, 200);
    assert!(body.contains("\"accounts\""), "{body}");
    assert_eq!(request(http, "/api/providers", &with).0, 200);
    assert_eq!(request(http, "/app.js", "").0, 200);

    // A tenant's session sees no other tenant's job; revoking its token ends its session.
    let out = c.cli(&["admin", "tenant", "add", "carol"]);
    let carol = last_line(&out);
    let (_, head, _) = request(http, &format!("/?token={carol}"), "");
    let carol_with = format!("Cookie: {}\r\n", set_cookie(&head).0);
    assert_eq!(
        request(http, &format!("/api/jobs/{}", job.0), &carol_with).0,
        404
    );
    let (code, _, body) = request(http, "/api/cluster", &carol_with);
    assert_eq!(code, 200);
    assert!(body.contains("\"jobs\":[]"), "{body}");
    // Nor what another tenant runs (the admin's codelets are JOB/TASK, a tenant's TENANT:JOB/TASK).
    let (code, _, body) = request(http, "/api/model", &carol_with);
    assert_eq!(code, 200);
    assert!(!body.contains("d/a"), "{body}");
    let id = String::from_utf8_lossy(&out.stderr)
        .split("(token ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap()
        .to_string();
    // Her event stream, open when the token is revoked, ends (it went on showing her jobs).
    let mut events = TcpStream::connect(http).unwrap();
    write!(
        events,
        "GET /api/events HTTP/1.1\r\nHost: {http}\r\n{carol_with}Connection: close\r\n\r\n"
    )
    .unwrap();
    // A bound for a hung test only: the stream ends within a second of the revocation.
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut first = [0u8; 4096];
    let n = events.read(&mut first).unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    assert!(c.cli(&["admin", "token", "revoke", &id]).status.success());
    assert_eq!(request(http, "/api/cluster", &carol_with).0, 401);
    // Read until the chunked body's end; the bound only keeps a failing test from hanging
    // (the stream sends an event a second while it stays open).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut rest = Vec::new();
    let mut buf = [0u8; 4096];
    while !rest.ends_with(b"0\r\n\r\n") {
        assert!(
            std::time::Instant::now() < deadline,
            "the event stream of a revoked token stayed open"
        );
        match events.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => rest.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading the event stream: {e}"),
        }
    }
    assert!(
        rest.ends_with(b"0\r\n\r\n"),
        "the stream did not end: {}",
        String::from_utf8_lossy(&rest)
    );
}

/// `flotilla server --pod-deletion-cost`, as in a pod (the Kubernetes API a fake of the
/// test's, serving TLS with the service account's CA): each worker pod's
/// `controller.kubernetes.io/pod-deletion-cost` is the attempts on it, so that a scale-down
/// takes idle workers first. A worker whose pod the API does not know is left alone.
#[test]
fn each_worker_pods_deletion_cost_follows_the_attempts_on_it() {
    use flotilla::cluster::kube::{fake::FakeApi, DELETION_COST};
    let sa = tempfile::tempdir().unwrap();
    let api = FakeApi::start(sa.path(), &["w0", "w1"]).unwrap();
    let opts = Opts {
        server_args: vec!["--pod-deletion-cost".into()],
        server_env: vec![
            ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), api.at.port.to_string()),
            (
                "FLOTILLA_KUBE_SERVICE_ACCOUNT".into(),
                sa.path().display().to_string(),
            ),
        ],
        ..Opts::default()
    };
    let mut c = Cluster::start_with(2, 1, opts);
    let wait = Duration::from_secs(120);
    // The next cost set, as (pod, cost).
    let next = || {
        let r = api.next(wait).expect("a request to the Kubernetes API");
        assert!(
            r.line.starts_with("PATCH /api/v1/namespaces/ns/pods/"),
            "{}",
            r.line
        );
        assert_eq!(r.header("authorization"), Some("Bearer token"));
        let pod = r.line.split_whitespace().nth(1).unwrap()["/api/v1/namespaces/ns/pods/".len()..]
            .to_string();
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        let cost = body["metadata"]["annotations"][DELETION_COST]
            .as_str()
            .unwrap_or_else(|| panic!("no deletion cost in {}", r.body))
            .to_string();
        (pod, cost)
    };
    // Both idle: 0 each.
    let mut idle: Vec<_> = (0..2).map(|_| next()).collect();
    idle.sort();
    assert_eq!(
        idle,
        vec![("w0".into(), "0".into()), ("w1".into(), "0".into())]
    );
    // One task that runs until the test lets it end: its worker's cost is 1 at once.
    let (job, go) = c.submit_gated("busy", "", "");
    let (busy, cost) = next();
    assert_eq!(cost, "1", "{busy}");
    std::fs::write(&go, "").unwrap();
    kit::assert_succeeded(&c.wait_job(job, wait));
    // Done: back to 0, and the other worker's cost was never touched.
    assert_eq!(next(), (busy, "0".to_string()));
    // A worker that is no pod the API knows: asked once, then left alone.
    let i = c.add_worker(1);
    c.wait_workers(3);
    assert_eq!(next(), (format!("w{i}"), "0".to_string()));
    assert!(
        api.next(Duration::from_secs(3)).is_none(),
        "asked again for a pod that does not exist"
    );
}
