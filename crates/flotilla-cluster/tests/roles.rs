//! Every RPC × every role, through a real coordinator on 127.0.0.1: allowed or refused, as
//! the security model says (ARCHITECTURE.md, "Security model"). Also: another tenant's job
//! is answered exactly like a job that does not exist, and a revoked token is refused at
//! once, on open streams too.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use flotilla_cluster::access::Quota;
use flotilla_cluster::auth::TokenAdd;
use flotilla_cluster::proto::admin_client::AdminClient;
use flotilla_cluster::proto::coordinator_client::CoordinatorClient;
use flotilla_cluster::proto::objects_client::ObjectsClient;
use flotilla_cluster::proto::workers_client::WorkersClient;
use flotilla_cluster::proto::{self, PROTOCOL_VERSION};
use flotilla_cluster::{Client, Remote, Server, ServerConfig};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::Code;

type Chan = InterceptedService<Channel, TokenAdd>;

/// What a call got: `ok`, or the status code's name.
fn outcome<T>(r: Result<T, tonic::Status>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(s) => code_name(s.code()).into(),
    }
}

fn code_name(c: Code) -> &'static str {
    match c {
        Code::PermissionDenied => "denied",
        Code::Unauthenticated => "unauthenticated",
        Code::NotFound => "not found",
        Code::FailedPrecondition => "precondition",
        Code::InvalidArgument => "invalid",
        other => {
            eprintln!("unexpected code {other:?}");
            "other"
        }
    }
}

struct Setup {
    addr: String,
    channel: Channel,
}

impl Setup {
    fn coordinator(&self, token: &str) -> CoordinatorClient<Chan> {
        CoordinatorClient::with_interceptor(
            self.channel.clone(),
            TokenAdd::new(token).expect("ascii"),
        )
    }
    fn admin(&self, token: &str) -> AdminClient<Chan> {
        AdminClient::with_interceptor(self.channel.clone(), TokenAdd::new(token).expect("ascii"))
    }
    fn workers(&self, token: &str) -> WorkersClient<Chan> {
        WorkersClient::with_interceptor(self.channel.clone(), TokenAdd::new(token).expect("ascii"))
    }
    fn objects(&self, token: &str) -> ObjectsClient<Chan> {
        ObjectsClient::with_interceptor(self.channel.clone(), TokenAdd::new(token).expect("ascii"))
    }
    /// Submits [`JOB`] from `dir` presenting `token`.
    async fn submit(
        &self,
        token: &str,
        dir: &std::path::Path,
    ) -> Result<tonic::Response<proto::SubmitReply>, tonic::Status> {
        self.coordinator(token)
            .submit(proto::SubmitRequest {
                file_name: "job.toml".into(),
                toml: JOB.into(),
                dir: dir.display().to_string(),
                ..Default::default()
            })
            .await
    }

    async fn client(&self, token: &str) -> Client {
        Client::connect(&Remote::new(self.addr.clone(), token))
            .await
            .expect("connects")
    }
}

fn register_request() -> proto::RegisterRequest {
    proto::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        name: "w".into(),
        hostname: "h".into(),
        hw_class: "cpu".into(),
        resources: Some(proto::ResourceSet {
            cpus: 1.0,
            ..Default::default()
        }),
        data_addr: "127.0.0.1:9".into(),
        ..Default::default()
    }
}

/// A job that stays running: its task needs more CPUs than any worker here offers.
const JOB: &str =
    "name = \"owned\"\n[[task]]\nid = \"t\"\ncmd = [\"true\"]\nresources = { cpus = 64 }\n";

async fn start() -> (Server, Setup, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let server = Server::start(ServerConfig::new(listen, dir.path().join("state")))
        .await
        .expect("starts");
    let addr = server.addr().to_string();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("a uri")
        .connect()
        .await
        .expect("connects");
    (server, Setup { addr, channel }, dir)
}

#[tokio::test]
async fn every_rpc_for_every_role() {
    let (server, s, dir) = start().await;
    let admin = server.token().to_string();
    let mut root = s.client(&admin).await;
    let alice = root
        .tenant_add("alice", &Quota::default())
        .await
        .expect("added")
        .token;
    let bob = root
        .tenant_add("bob", &Quota::default())
        .await
        .expect("added")
        .token;
    let carol = root
        .tenant_add("carol", &Quota::default())
        .await
        .expect("added");
    root.token_revoke(&carol.id).await.expect("revoked");
    let enrol = root.worker_token_add("rack").await.expect("added").token;
    let provider = root.provider_add("acme").await.expect("added").token;
    let reg = s
        .workers(&enrol)
        .register(register_request())
        .await
        .expect("an enrolment token registers")
        .into_inner();
    let worker = reg.worker;
    let credential = reg.credential.clone();
    assert!(credential.starts_with("wc."), "{credential}");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("a job folder");
    let job = s
        .coordinator(&alice)
        .submit(proto::SubmitRequest {
            file_name: "job.toml".into(),
            toml: JOB.into(),
            dir: job_dir.display().to_string(),
            // A tenant cannot file a job under another name.
            tenant: "bob".into(),
            files: vec![],
            request_id: String::new(),
        })
        .await
        .expect("alice submits")
        .into_inner()
        .job;
    let missing = job + 1000;

    let roles: [(&str, String); 8] = [
        ("admin", admin.clone()),
        ("owner", alice.clone()),
        ("other tenant", bob.clone()),
        ("enrolment", enrol.clone()),
        ("provider", provider.clone()),
        ("worker", credential.clone()),
        ("revoked", carol.token.clone()),
        ("no token", "flt_not-a-token".into()),
    ];
    // Expected outcome per RPC, in the order of `roles`.
    let table: Vec<(&str, [&str; 8])> = vec![
        (
            "Submit",
            [
                "ok",
                "ok",
                "ok",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Status(all)",
            [
                "ok",
                "ok",
                "ok",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Status(job)",
            [
                "ok",
                "ok",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Watch",
            [
                "ok",
                "ok",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Logs",
            [
                "ok",
                "ok",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Outputs",
            [
                "ok",
                "ok",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        // Refused because the job runs, which shows the call was let through.
        (
            "Remove",
            [
                "precondition",
                "precondition",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "TenantAdd",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "TenantSet",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "TenantList",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "WorkerTokenAdd",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "TokenList",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "TokenRevoke",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Register",
            [
                "ok",
                "denied",
                "denied",
                "ok",
                "ok",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Session",
            [
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "ok",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        // The coordinator's objects: the admin, or a ticket (none here).
        (
            "Fetch",
            [
                "not found",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Budget",
            [
                "precondition",
                "precondition",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Cancel",
            [
                "ok",
                "ok",
                "not found",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        // Asked by the admin last: it stops the server.
        (
            "ProviderAdd",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "WorkerDrain",
            [
                "not found",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "AllocList",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "AllocInfo",
            [
                "not found",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "ProviderList",
            [
                "ok",
                "ok",
                "ok",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Ledger",
            [
                "ok",
                "ok",
                "ok",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
        (
            "Shutdown",
            [
                "ok",
                "denied",
                "denied",
                "denied",
                "denied",
                "denied",
                "unauthenticated",
                "unauthenticated",
            ],
        ),
    ];
    // The job is filed under alice's name although the request said "bob"; bob's list does
    // not show it, and asking for it is answered like asking for a job that never was.
    let mine = s
        .client(&alice)
        .await
        .cluster_status()
        .await
        .expect("status");
    assert!(mine.jobs.iter().all(|j| j.tenant == "alice"), "{mine:?}");
    assert!(mine.jobs.iter().any(|j| j.id.0 == job));
    assert!(mine.journal.is_none(), "the journal is the operator's");
    let theirs = s.client(&bob).await.cluster_status().await.expect("status");
    assert!(theirs
        .jobs
        .iter()
        .all(|j| j.id.0 != job && j.tenant == "bob"));
    for call in ["status", "cancel", "outputs"] {
        let ask = |j: u64| {
            let mut c = s.coordinator(&bob);
            async move {
                match call {
                    "status" => c
                        .status(proto::StatusRequest {
                            job: Some(j),
                            trace: false,
                            task_from: 0,
                            task_limit: None,
                            states: Vec::new(),
                        })
                        .await
                        .map(|_| ()),
                    "cancel" => c.cancel(proto::CancelRequest { job: j }).await.map(|_| ()),
                    _ => c
                        .outputs(proto::OutputsRequest { job: j })
                        .await
                        .map(|_| ()),
                }
            }
        };
        let foreign = ask(job).await.expect_err("alice's job");
        let none = ask(missing).await.expect_err("no job");
        assert_eq!(foreign.code(), none.code(), "{call}");
        assert_eq!(
            foreign.message().replace(&job.to_string(), "N"),
            none.message().replace(&missing.to_string(), "N"),
            "{call}"
        );
    }
    let mut got: BTreeMap<(String, &str), String> = BTreeMap::new();
    let mut spare = 0;
    for (rpc, _) in &table {
        let mut order: Vec<&(&str, String)> = roles.iter().collect();
        if *rpc == "Shutdown" {
            order.reverse();
        }
        for (role, token) in order {
            let r = match *rpc {
                "Submit" => outcome(s.submit(token, &job_dir).await),
                "Status(all)" => outcome(
                    s.coordinator(token)
                        .status(proto::StatusRequest {
                            job: None,
                            trace: false,
                            task_from: 0,
                            task_limit: None,
                            states: Vec::new(),
                        })
                        .await,
                ),
                "Status(job)" => outcome(
                    s.coordinator(token)
                        .status(proto::StatusRequest {
                            job: Some(job),
                            trace: false,
                            task_from: 0,
                            task_limit: None,
                            states: Vec::new(),
                        })
                        .await,
                ),
                "Watch" => match s
                    .coordinator(token)
                    .watch(proto::WatchRequest { job })
                    .await
                {
                    Ok(r) => outcome(r.into_inner().message().await),
                    Err(e) => outcome::<()>(Err(e)),
                },
                "Logs" => match s
                    .coordinator(token)
                    .logs(proto::LogsRequest {
                        job,
                        task: "t".into(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) => outcome(r.into_inner().message().await),
                    Err(e) => outcome::<()>(Err(e)),
                },
                "Outputs" => outcome(
                    s.coordinator(token)
                        .outputs(proto::OutputsRequest { job })
                        .await,
                ),
                "Remove" => outcome(
                    s.coordinator(token)
                        .remove(proto::RemoveRequest { job })
                        .await,
                ),
                "Budget" => outcome(
                    s.coordinator(token)
                        .budget(proto::BudgetRequest {
                            job,
                            amount: "+5".into(),
                        })
                        .await,
                ),
                "Cancel" => outcome(
                    s.coordinator(token)
                        .cancel(proto::CancelRequest { job })
                        .await,
                ),
                "TenantAdd" => {
                    spare += 1;
                    outcome(
                        s.admin(token)
                            .tenant_add(proto::TenantAddRequest {
                                name: format!("spare{spare}"),
                                ..Default::default()
                            })
                            .await,
                    )
                }
                "TenantSet" => outcome(
                    s.admin(token)
                        .tenant_set(proto::TenantSetRequest {
                            name: "bob".into(),
                            tasks: Some(1000),
                            ..Default::default()
                        })
                        .await,
                ),
                "TenantList" => outcome(
                    s.admin(token)
                        .tenant_list(proto::TenantListRequest {})
                        .await,
                ),
                "WorkerTokenAdd" => outcome(
                    s.admin(token)
                        .worker_token_add(proto::WorkerTokenAddRequest::default())
                        .await,
                ),
                "TokenList" => outcome(s.admin(token).token_list(proto::TokenListRequest {}).await),
                "TokenRevoke" => {
                    let victim = root.worker_token_add("victim").await.expect("added");
                    outcome(
                        s.admin(token)
                            .token_revoke(proto::TokenRevokeRequest { id: victim.id })
                            .await,
                    )
                }
                "Register" => outcome(s.workers(token).register(register_request()).await),
                "ProviderAdd" => {
                    spare += 1;
                    outcome(
                        s.admin(token)
                            .provider_add(proto::ProviderAddRequest {
                                name: format!("prov{spare}"),
                            })
                            .await,
                    )
                }
                "Ledger" => outcome(
                    s.coordinator(token)
                        .ledger(proto::LedgerRequest::default())
                        .await,
                ),
                "WorkerDrain" => outcome(
                    s.admin(token)
                        .worker_drain(proto::WorkerDrainRequest {
                            name: "nobody".into(),
                        })
                        .await,
                ),
                "AllocList" => outcome(s.admin(token).alloc_list(proto::AllocListRequest {}).await),
                "AllocInfo" => outcome(
                    s.admin(token)
                        .alloc_info(proto::AllocQueueRequest {
                            queue: 99,
                            reason: String::new(),
                        })
                        .await,
                ),
                "ProviderList" => outcome(
                    s.coordinator(token)
                        .provider_list(proto::ProviderListRequest {})
                        .await,
                ),
                "Session" => {
                    let first = proto::WorkerMessage {
                        worker,
                        ..Default::default()
                    };
                    let (tx, rx) = tokio::sync::mpsc::channel(1);
                    tx.send(first).await.expect("queued");
                    let r = s
                        .workers(token)
                        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                        .await;
                    drop(tx);
                    outcome(r)
                }
                "Fetch" => match s
                    .objects(token)
                    .fetch(proto::FetchRequest {
                        hash: "0".repeat(64),
                        ticket: String::new(),
                    })
                    .await
                {
                    Ok(r) => outcome(r.into_inner().message().await),
                    Err(e) => outcome::<()>(Err(e)),
                },
                "Shutdown" => outcome(
                    s.coordinator(token)
                        .shutdown(proto::ShutdownRequest {})
                        .await,
                ),
                other => unreachable!("{other}"),
            };
            got.insert((rpc.to_string(), role), r);
        }
    }
    let mut wrong = Vec::new();
    for (rpc, want) in &table {
        for ((role, _), w) in roles.iter().zip(want) {
            let g = &got[&(rpc.to_string(), *role)];
            if g != w {
                wrong.push(format!("{rpc} as {role}: got {g}, want {w}"));
            }
        }
    }
    assert!(wrong.is_empty(), "role table:\n{}", wrong.join("\n"));

    // The admin's Shutdown (asked last) stopped it.
    server.wait().await.expect("stopped");
}

#[tokio::test]
async fn a_revoked_token_ends_its_open_streams_at_once() {
    let (server, s, dir) = start().await;
    let admin = server.token().to_string();
    let mut root = s.client(&admin).await;
    let alice = root
        .tenant_add("alice", &Quota::default())
        .await
        .expect("added");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("a job folder");
    let job = s
        .submit(&alice.token, &job_dir)
        .await
        .expect("submitted")
        .into_inner()
        .job;
    let mut watch = s
        .coordinator(&alice.token)
        .watch(proto::WatchRequest { job })
        .await
        .expect("watching")
        .into_inner();
    watch
        .message()
        .await
        .expect("the job's state")
        .expect("an event");
    // A worker's session ends too when its enrolment token is revoked.
    let enrol = root.worker_token_add("rack").await.expect("added");
    let reg = s
        .workers(&enrol.token)
        .register(register_request())
        .await
        .expect("registered")
        .into_inner();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(proto::WorkerMessage {
        worker: reg.worker,
        ..Default::default()
    })
    .await
    .expect("queued");
    let mut session = s
        .workers(&reg.credential)
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("a session")
        .into_inner();

    root.token_revoke(&alice.id).await.expect("revoked");
    root.token_revoke(&enrol.id).await.expect("revoked");
    let end = watch.message().await.expect_err("the stream ends");
    assert_eq!(end.code(), Code::Unauthenticated, "{end:?}");
    loop {
        match session.message().await {
            Ok(Some(_)) => continue, // assignments sent before the revocation
            Ok(None) => break,
            Err(e) => {
                assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
                break;
            }
        }
    }
    drop(tx);
    // And every new call with them is refused.
    let e = s
        .coordinator(&alice.token)
        .status(proto::StatusRequest {
            job: None,
            trace: false,
            task_from: 0,
            task_limit: None,
            states: Vec::new(),
        })
        .await
        .expect_err("revoked");
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = s
        .workers(&reg.credential)
        .register(register_request())
        .await
        .expect_err("revoked with its enrolment token");
    assert_eq!(e.code(), Code::Unauthenticated);
    server.stop();
    server.wait().await.expect("stopped");
}

#[tokio::test]
async fn a_tenant_over_its_task_quota_is_refused_at_submit() {
    let (server, s, dir) = start().await;
    let mut root = s.client(server.token()).await;
    let quota = Quota {
        tasks: Some(5),
        ..Quota::default()
    };
    let small = root.tenant_add("small", &quota).await.expect("added");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("a job folder");
    let toml = "[[task]]\nid = \"t\"\narray = \"0..6\"\ncmd = [\"true\"]\n";
    let e = s
        .coordinator(&small.token)
        .submit(proto::SubmitRequest {
            file_name: "big.toml".into(),
            toml: toml.into(),
            dir: job_dir.display().to_string(),
            ..Default::default()
        })
        .await
        .expect_err("over its quota");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(
        e.message().contains("big.toml") && e.message().contains("tasks quota: 5"),
        "{}",
        e.message()
    );
    // The admin is not bound by it; a tenant listing shows the quota.
    let tenants = root.tenant_list().await.expect("listed");
    assert_eq!(tenants[0].quota.tasks, Some(5));
    server.stop();
    server.wait().await.expect("stopped");
}

/// A worker offering a non-finite or negative amount is refused, naming it: a worker that
/// offered `cpus = NaN` (`flotilla worker --cpus nan`) was accepted and never given a task.
#[tokio::test]
async fn a_worker_offering_nan_or_negative_amounts_is_refused() {
    let (server, s, _dir) = start().await;
    let admin = server.token().to_string();
    let offers = [
        ("cpus = NaN", f64::NAN, 0.0, 1.0),
        ("cpus = inf", f64::INFINITY, 0.0, 1.0),
        ("gpus = -1", 1.0, -1.0, 1.0),
        ("licence = NaN", 1.0, 0.0, f64::NAN),
    ];
    for (what, cpus, gpus, custom) in offers {
        let mut req = register_request();
        req.resources = Some(proto::ResourceSet {
            cpus,
            gpus,
            custom: vec![proto::CustomResource {
                name: "licence".into(),
                amount: custom,
            }],
            ..Default::default()
        });
        let e = s.workers(&admin).register(req).await.expect_err("refused");
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
        assert!(
            e.message().contains(&format!("the worker offers {what}")),
            "{what}: {}",
            e.message()
        );
    }
    s.workers(&admin)
        .register(register_request())
        .await
        .expect("a finite offer registers");
}
