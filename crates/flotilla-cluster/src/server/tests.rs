//! The server in-process: supervision of the core thread, bounded queues.

use std::net::SocketAddr;

use crate::state::TaskState;

use super::*;

#[tokio::test]
async fn a_panic_in_the_core_stops_the_server_with_an_error() {
    // The core thread once died alone: the process stayed up answering "stopping" forever.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let server = Server::start(ServerConfig::new(listen, dir.path()))
        .await
        .expect("starts");
    assert!(server.core.try_send(Req::Panic).is_ok(), "the core is up");
    let e = server.wait().await.expect_err("a failed core is an error");
    assert!(
        e.to_string()
            .contains("the core thread panicked: injected by a test"),
        "{e}"
    );
}

#[tokio::test]
async fn a_stopped_server_ends_without_error() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let server = Server::start(ServerConfig::new(listen, dir.path()))
        .await
        .expect("starts");
    server.stop();
    server.wait().await.expect("a clean stop");
}

#[tokio::test]
async fn a_server_started_again_on_the_same_state_right_after_wait_finds_its_journal_free() {
    // `wait` once returned before the core thread had closed the journal: starting again on
    // the same state at once failed "in use by another coordinator" (`bench cluster
    // --restarts` failed so at every try).
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    for round in 0..5 {
        let server = Server::start(ServerConfig::new(listen, dir.path()))
            .await
            .unwrap_or_else(|e| panic!("start {round}: {e}"));
        server.stop();
        server.wait().await.expect("a clean stop");
    }
}

/// The `Workers` service of a server reached through `remote`, presenting `token`.
async fn workers_client(
    remote: &crate::Remote,
    token: &str,
) -> crate::proto::workers_client::WorkersClient<
    tonic::codegen::InterceptedService<tonic::transport::Channel, crate::auth::TokenAdd>,
> {
    crate::proto::workers_client::WorkersClient::with_interceptor(
        remote.channel().await.expect("connects"),
        crate::auth::TokenAdd::new(token).expect("ascii"),
    )
}

/// A request the full core queue cannot take is refused as busy (the client retries);
/// before, the queue grew without limit.
#[tokio::test]
async fn a_full_request_queue_refuses_new_requests_as_busy() {
    use crate::proto::coordinator_server::Coordinator as _;
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (core, _rx) = queue::queue(1);
    let (stop, _) = watch::channel(false);
    let access = Arc::new(Access::open(dir.path(), "an-admin-token-0123456789").expect("opened"));
    let api = rpc::Api {
        core,
        sessions: Arc::new(Mutex::new(HashMap::new())),
        store: Arc::new(crate::objects::ObjectStore::open(&dir.path().join("o")).expect("a store")),
        max_job_tasks: 10,
        access: access.clone(),
        stop,
        streams: rpc::StreamCounts::new(16),
        alloc: Arc::new(
            crate::alloc::Allocator::open(
                dir.path(),
                crate::alloc::Systems::on_path(),
                access,
                "/usr/bin/flotilla".into(),
                "127.0.0.1:1".into(),
            )
            .expect("opened"),
        ),
        group: None,
    };
    let watch = || {
        let mut r = tonic::Request::new(proto::WatchRequest { job: 1 });
        r.extensions_mut().insert(crate::access::Principal::Admin {
            token: "tok-1".into(),
        });
        r
    };
    assert!(api.watch(watch()).await.is_ok(), "the first one is queued");
    let e = api.watch(watch()).await.err().expect("the queue is full");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("busy"), "{}", e.message());
}

/// A worker that does not read its commands is dropped once its queue is full, and its
/// tasks are placed again; before, the coordinator held its commands without limit.
#[tokio::test]
async fn a_worker_that_does_not_read_its_commands_is_dropped() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut config = ServerConfig::new(listen, dir.path().join("state"));
    config.worker_queue = 1;
    // Only the full queue can lose it.
    config.heartbeat_timeout = Duration::from_secs(600);
    let server = Server::start(config).await.expect("starts");
    let remote = crate::Remote::new(server.addr().to_string(), server.token());
    let mut workers = workers_client(&remote, server.token()).await;
    // Registered, but its session is never opened: nothing reads its queue.
    workers
        .register(proto::RegisterRequest {
            protocol_version: proto::PROTOCOL_VERSION,
            name: "deaf".into(),
            resources: Some(proto::ResourceSet {
                cpus: 64.0,
                ..Default::default()
            }),
            data_addr: "127.0.0.1:9".into(),
            ..Default::default()
        })
        .await
        .expect("registered");
    let mut client = crate::Client::connect(&remote).await.expect("a client");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("a job folder");
    // Each job is placed on its own turn of the core, so each sends the worker a message of
    // its own: the second finds the queue full. (Polls for the event, giving up after a
    // minute.)
    let mut jobs = Vec::new();
    let mut lost = false;
    for i in 0..3 {
        let text = format!("name = \"j{i}\"\n[[task]]\nid = \"t\"\ncmd = [\"true\"]\n");
        let job = client
            .submit_text("job.toml", &text, &job_dir.display().to_string())
            .await
            .expect("submitted")
            .job;
        jobs.push(job);
        for _ in 0..3000 {
            let s = client.job_status(job).await.expect("a job");
            if s.tasks[0].state != TaskState::Ready {
                break;
            }
            // Placed and lost within one turn of the core: the task is ready again at once.
            let gone = client
                .cluster_status()
                .await
                .expect("status")
                .workers
                .is_empty();
            if gone {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if client
            .cluster_status()
            .await
            .expect("status")
            .workers
            .is_empty()
        {
            lost = true;
            break;
        }
    }
    assert!(lost, "the deaf worker is still there");
    let s = client.job_status(jobs[0]).await.expect("a job");
    let m = s.tasks[0].message.clone().unwrap_or_default();
    assert!(m.contains("did not read its commands"), "{m}");
    server.stop();
    server.wait().await.expect("stopped");
}

/// One token cannot hold more than `max_streams` streams open; a closed one frees its slot.
#[tokio::test]
async fn streams_per_token_are_bounded() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut config = ServerConfig::new(listen, dir.path().join("state"));
    config.max_streams = 2;
    let server = Server::start(config).await.expect("starts");
    let remote = crate::Remote::new(server.addr().to_string(), server.token());
    let mut client = crate::Client::connect(&remote).await.expect("a client");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("a job folder");
    let job = client
        .submit_text(
            "job.toml",
            "[[task]]\nid = \"t\"\ncmd = [\"true\"]\n",
            &job_dir.display().to_string(),
        )
        .await
        .expect("submitted")
        .job;
    let a = client.watch(job).await.expect("one");
    let b = client.watch(job).await.expect("two");
    let e = client.watch(job).await.expect_err("a third is refused");
    assert!(e.to_string().contains("streams are open"), "{e}");
    drop(a);
    // Its slot is freed once the coordinator sees it closed (polled, a minute at most).
    let mut again = None;
    for _ in 0..3000 {
        if let Ok(s) = client.watch(job).await {
            again = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "the closed stream's slot was not freed");
    // Streams still open do not hold the stop: they end, saying why.
    server.stop();
    let mut b = b;
    let end = loop {
        match b.message().await {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(&end, Err(e) if e.code() == tonic::Code::Unavailable) || matches!(end, Ok(None)),
        "{end:?}"
    );
    server.wait().await.expect("stopped");
}

/// A coordinator over TLS refuses a worker whose object server would send its objects in
/// the clear; one with a certificate fingerprint registers. (Before, the object path was
/// plain TCP whatever the coordinator used.)
#[tokio::test]
async fn a_tls_coordinator_refuses_workers_whose_objects_travel_in_the_clear() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("a certificate");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).expect("written");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("written");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut config = ServerConfig::new(listen, dir.path().join("state"));
    config.tls = Some(crate::ServerTls {
        cert: cert.clone(),
        key,
    });
    let server = Server::start(config).await.expect("starts");
    let mut remote = crate::Remote::new(
        format!("localhost:{}", server.addr().port()),
        server.token(),
    );
    remote.tls_ca = Some(cert);
    let mut workers = workers_client(&remote, server.token()).await;
    let register = |data_cert: &str| proto::RegisterRequest {
        protocol_version: proto::PROTOCOL_VERSION,
        name: "w".into(),
        resources: Some(proto::ResourceSet {
            cpus: 1.0,
            ..Default::default()
        }),
        data_addr: "127.0.0.1:9".into(),
        data_cert: data_cert.into(),
        ..Default::default()
    };
    let e = workers
        .register(register(""))
        .await
        .expect_err("a plain object server is refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("uses TLS"), "{}", e.message());
    workers
        .register(register(&"ab".repeat(32)))
        .await
        .expect("a TLS object server registers");
    server.stop();
    server.wait().await.expect("a clean stop");
}

/// One peer address holds at most `max_connections_per_peer` connections on the gRPC port:
/// one more is closed at once; when one of its connections ends, it may connect again.
/// (Before, connections were unbounded: a peer could hold any number open without ever
/// authenticating.)
#[tokio::test]
async fn a_peer_holds_at_most_its_share_of_connections() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut config = ServerConfig::new(listen, dir.path().join("state"));
    config.max_connections_per_peer = 2;
    let server = Server::start(config).await.expect("starts");
    let held = [
        tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("first"),
        tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("second"),
    ];
    // The third is accepted by the kernel, then closed by the server without a byte.
    let mut third = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connects");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(60), third.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "a connection over the cap was served");
    let remote = crate::Remote::new(server.addr().to_string(), server.token());
    assert!(
        crate::Client::connect(&remote).await.is_err()
            || crate::Client::connect(&remote)
                .await
                .expect("a client")
                .cluster_status()
                .await
                .is_err(),
        "a client over the cap was served"
    );
    drop(held);
    // Its connections ended: it is served again (once the server has seen them close).
    let mut served = false;
    for _ in 0..600 {
        if let Ok(mut c) = crate::Client::connect(&remote).await {
            if c.cluster_status().await.is_ok() {
                served = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        served,
        "the peer was not served again after its connections closed"
    );
    server.stop();
    server.wait().await.expect("a clean stop");
}

/// A price belongs to a provider's worker: one enrolled with another token is refused, as is
/// a price that does not read; a provider's worker registers at its price.
#[tokio::test]
async fn only_a_providers_worker_has_a_price() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let server = Server::start(ServerConfig::new(listen, dir.path().join("state")))
        .await
        .expect("starts");
    let remote = crate::Remote::new(server.addr().to_string(), server.token());
    let provider = crate::Client::connect(&remote)
        .await
        .expect("a client")
        .provider_add("acme")
        .await
        .expect("added")
        .token;
    let register = |price: &str| proto::RegisterRequest {
        protocol_version: proto::PROTOCOL_VERSION,
        name: "w".into(),
        resources: Some(proto::ResourceSet {
            cpus: 1.0,
            ..Default::default()
        }),
        price: price.into(),
        ..Default::default()
    };
    let workers = |token: &str| {
        let remote = remote.clone();
        let token = token.to_string();
        async move { workers_client(&remote, &token).await }
    };
    let e = workers(server.token())
        .await
        .register(register("cpu=0.02"))
        .await
        .expect_err("a priced worker without a provider token");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("provider"), "{}", e.message());
    let e = workers(&provider)
        .await
        .register(register("cpu=cheap"))
        .await
        .expect_err("a price that does not read");
    assert!(e.message().contains("--price"), "{}", e.message());
    workers(&provider)
        .await
        .register(register("cpu=0.02"))
        .await
        .expect("a provider's worker at its price");
    let list = crate::Client::connect(&remote)
        .await
        .expect("a client")
        .provider_list()
        .await
        .expect("listed");
    assert_eq!(list[0].name, "acme");
    assert_eq!(list[0].prices, vec!["cpu=0.02,gpu=0,mem_gb=0".to_string()]);
    server.stop();
    server.wait().await.expect("a clean stop");
}

/// A read in the same turn as a change is answered once the change is in the journal: a
/// client is never shown what a crash could take back. Found by the stress passes: a job
/// seen succeeded, the coordinator SIGKILLed, and the job running again after its restart.
#[test]
fn a_read_in_the_turn_of_a_change_is_answered_after_the_change_is_written() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let config = ServerConfig::new(listen, dir.path());
    let access = Arc::new(Access::open(dir.path(), "an-admin-token-0123456789").expect("opened"));
    let journal = crate::journal::Journal::open(dir.path().join("journal.log")).expect("a journal");
    let mut core = Core::recover(
        &config,
        journal,
        Arc::new(Mutex::new(HashMap::new())),
        access,
        http::Metrics::new(),
        None,
    )
    .expect("a core");
    let (queue, inbox) = queue::queue(8);
    let (granted, mut granted_rx) = tokio::sync::oneshot::channel();
    let (status, status_rx) = queue::tests::ask();
    // Both wait in the queue before the core runs: one turn takes them together.
    for req in [
        Req::Grant {
            tenant: "default".into(),
            amount: flotilla_pool::Credits::from_f64(5.0),
            reply: granted,
        },
        status,
        Req::Stop,
    ] {
        assert!(queue.try_send(req).is_ok());
    }
    let early = Arc::new(Mutex::new(Vec::new()));
    let seen = early.clone();
    let mut status_rx = Some(status_rx);
    core.before_append = Some(Box::new(move || {
        // At the append: has anything been answered yet?
        let status = status_rx.as_mut().map(|rx| rx.try_recv().is_ok());
        seen.lock().push((status, granted_rx.try_recv().is_ok()));
        status_rx = None;
    }));
    core.run(inbox).expect("runs and stops");
    assert_eq!(
        early.lock().first().copied(),
        Some((Some(false), false)),
        "nothing of the turn is answered before its records are written"
    );
}

/// `--rendezvous-port`: the gang rendezvous listens where it is told, and registering
/// workers are told that port (a firewall or a NetworkPolicy can list it).
#[tokio::test]
async fn the_gang_rendezvous_listens_on_the_port_given() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().expect("an address"), dir.path());
    config.rendezvous_port = port;
    let server = Server::start(config).await.expect("starts");
    let remote = crate::Remote::new(server.addr().to_string(), server.token());
    let mut workers = workers_client(&remote, server.token()).await;
    let reply = workers
        .register(proto::RegisterRequest {
            protocol_version: proto::PROTOCOL_VERSION,
            name: "w".into(),
            resources: Some(proto::ResourceSet {
                cpus: 1.0,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("registered")
        .into_inner();
    assert_eq!(reply.rendezvous_port, u32::from(port));
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok(),
        "something listens there"
    );
    server.stop();
    server.wait().await.expect("a clean stop");
}

/// A coordinator for [`FakeWorker`]s (which a heartbeat timeout would not lose), a client of
/// it, and a job folder: (its temporary folder, the server, how to reach it, the client, the
/// job folder).
async fn for_fake_workers() -> (
    tempfile::TempDir,
    Server,
    crate::Remote,
    crate::Client,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let mut config = ServerConfig::new(listen, dir.path().join("state"));
    config.heartbeat_timeout = Duration::from_secs(600);
    let server = Server::start(config).await.expect("starts");
    let remote = crate::Remote::new(server.addr().to_string(), server.token());
    let client = crate::Client::connect(&remote).await.expect("a client");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("a job folder");
    (dir, server, remote, client, job_dir)
}

/// A worker speaking the protocol by hand: registered, its session open.
struct FakeWorker {
    id: u32,
    tx: mpsc::UnboundedSender<proto::WorkerMessage>,
    rx: tonic::Streaming<proto::CoordinatorMessage>,
}

impl FakeWorker {
    async fn join(remote: &crate::Remote, token: &str, name: &str, data_addr: &str) -> Self {
        let reply = workers_client(remote, token)
            .await
            .register(proto::RegisterRequest {
                protocol_version: proto::PROTOCOL_VERSION,
                name: name.into(),
                resources: Some(proto::ResourceSet {
                    cpus: 2.0,
                    ..Default::default()
                }),
                data_addr: data_addr.into(),
                ..Default::default()
            })
            .await
            .expect("registered")
            .into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(proto::WorkerMessage {
            worker: reply.worker,
            ..Default::default()
        })
        .expect("queued");
        let rx = workers_client(remote, &reply.credential)
            .await
            .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .expect("a session")
            .into_inner();
        Self {
            id: reply.worker,
            tx,
            rx,
        }
    }

    fn say(&self, m: proto::WorkerMessage) {
        self.tx
            .send(proto::WorkerMessage {
                worker: self.id,
                ..m
            })
            .expect("the session is open");
    }

    /// The coordinator's next message; `None` when it ended the session. (Gives up after two
    /// minutes: a hang is a failure, not a wait for ever.)
    async fn next(&mut self, what: &str) -> Option<proto::CoordinatorMessage> {
        tokio::time::timeout(Duration::from_secs(120), self.rx.message())
            .await
            .unwrap_or_else(|_| panic!("no message came: waiting for {what}"))
            .ok()
            .flatten()
    }
}

/// Only a copy the coordinator ordered of a worker makes it a holder of a leaving worker's
/// outputs: a peer that claims, beside its own, the copy ordered of another peer (which
/// failed) is not believed, and that output, which then no live worker holds, is rebuilt.
/// Believing it would have a gather fetch from a worker that never had the bytes.
#[tokio::test]
async fn only_a_copy_ordered_of_a_worker_makes_it_a_holder() {
    let (_dir, server, remote, mut client, job_dir) = for_fake_workers().await;
    let mut leaver = FakeWorker::join(&remote, server.token(), "aa", "127.0.0.1:9").await;
    let text = "name = \"j\"\nstaging = \"transfer\"\n\
                [[task]]\nid = \"first\"\noutputs = [\"first.txt\"]\ncmd = [\"true\"]\n\
                [[task]]\nid = \"second\"\noutputs = [\"second.txt\"]\ncmd = [\"true\"]\n";
    let job = client
        .submit_text("job.toml", text, &job_dir.display().to_string())
        .await
        .expect("submitted")
        .job;
    // Both tasks run on the only worker, which makes their outputs.
    let mut given = Vec::new();
    while given.len() < 2 {
        let m = leaver.next("the assignments").await.expect("the session");
        given.extend(m.assign.into_iter().filter_map(|a| Some((a.task?, a.name))));
    }
    let object = |name: &str| proto::Object {
        path: format!("{name}.txt"),
        hash: "ab".repeat(32),
        size: 3,
    };
    leaver.say(proto::WorkerMessage {
        started: given.iter().map(|(k, _)| *k).collect(),
        ..Default::default()
    });
    leaver.say(proto::WorkerMessage {
        finished: given
            .iter()
            .map(|(k, name)| proto::TaskResult {
                task: Some(*k),
                usage: Some(proto::Usage::default()),
                outputs: vec![object(name)],
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    let end = client.wait(job, |_| {}).await.expect("the job ends");
    assert!(end.succeeded(), "{}", end.state);
    // Two peers; the leaver goes: each peer is ordered to copy one task's outputs.
    let bb = FakeWorker::join(&remote, server.token(), "bb", "127.0.0.1:10").await;
    let cc = FakeWorker::join(&remote, server.token(), "cc", "127.0.0.1:11").await;
    let mut peers = [bb, cc];
    leaver.say(proto::WorkerMessage {
        leaving: true,
        ..Default::default()
    });
    let mut ordered = Vec::new();
    for p in &mut peers {
        let m = p.next("a copy order").await.expect("the session");
        assert_eq!(m.copy.len(), 1, "{m:?}");
        let k = m.copy[0].task.expect("a task");
        let name = given
            .iter()
            .find(|(g, _)| (g.job, g.task) == (k.job, k.task))
            .map(|(_, n)| n.clone())
            .expect("a task of the job");
        ordered.push((k, name));
    }
    let [(kept_key, kept), (claimed_key, claimed)] = [ordered[0].clone(), ordered[1].clone()];
    // The first peer copies its own and claims the second's; the second's copy fails.
    peers[0].say(proto::WorkerMessage {
        copied: vec![
            proto::HeldObject {
                task: Some(kept_key),
                object: Some(object(&kept)),
            },
            proto::HeldObject {
                task: Some(claimed_key),
                object: Some(object(&claimed)),
            },
        ],
        ..Default::default()
    });
    peers[1].say(proto::WorkerMessage {
        copy_failed: vec![claimed_key],
        ..Default::default()
    });
    // Every order answered: the leaver's session ends.
    while leaver.next("the leaver's session to end").await.is_some() {}
    match client.outputs(job).await.expect("outputs") {
        crate::client::Outputs::Rebuilding(why) => {
            assert!(why.contains("1 task(s)"), "{why}");
            assert!(why.contains(&claimed) && !why.contains(&kept), "{why}");
        }
        crate::client::Outputs::Ready(outs) => {
            panic!("every output is held, by the claim it was not asked: {outs:?}")
        }
    }
    server.stop();
    server.wait().await.expect("a clean stop");
}

/// `flotilla logs` of a task whose latest attempt never ran (placed, then cancelled with its
/// job) shows the attempt before, which ran and said why it failed; it showed the empty
/// latest one ("wrote nothing").
#[tokio::test]
async fn the_logs_of_a_task_are_its_latest_attempt_that_ran() {
    let (_dir, server, remote, mut client, job_dir) = for_fake_workers().await;
    let mut w = FakeWorker::join(&remote, server.token(), "w", "127.0.0.1:9").await;
    let text = "name = \"j\"\n[[task]]\nid = \"t\"\nretries = 1\ncmd = [\"true\"]\n";
    let job = client
        .submit_text("job.toml", text, &job_dir.display().to_string())
        .await
        .expect("submitted")
        .job;
    let first = loop {
        let m = w.next("the first attempt").await.expect("the session");
        if let Some(k) = m.assign.first().and_then(|a| a.task) {
            break k;
        }
    };
    w.say(proto::WorkerMessage {
        started: vec![first],
        logs: vec![proto::TaskLog {
            task: Some(first),
            data: b"the first attempt's error\n".to_vec(),
            stderr: true,
        }],
        ..Default::default()
    });
    w.say(proto::WorkerMessage {
        finished: vec![proto::TaskResult {
            task: Some(first),
            outcome: proto::task_result::Outcome::Failed as i32,
            message: "exited with code 1".into(),
            retryable: true,
            usage: Some(proto::Usage::default()),
            ..Default::default()
        }],
        ..Default::default()
    });
    // The retry is placed; the job is cancelled before it starts.
    let second = loop {
        let m = w.next("the retry").await.expect("the session");
        if let Some(k) = m.assign.first().and_then(|a| a.task) {
            break k;
        }
    };
    assert_eq!(second.attempt, first.attempt + 1);
    client.cancel(job).await.expect("cancelled");
    w.say(proto::WorkerMessage {
        finished: vec![proto::TaskResult {
            task: Some(second),
            outcome: proto::task_result::Outcome::Cancelled as i32,
            usage: Some(proto::Usage::default()),
            ..Default::default()
        }],
        ..Default::default()
    });
    let end = client.wait(job, |_| {}).await.expect("the job ends");
    assert_eq!(end.state, "cancelled");
    let mut stream = client.logs(job, "t", false, true).await.expect("logs");
    let mut got = Vec::new();
    while let Some(chunk) = stream.message().await.expect("a chunk") {
        got.extend_from_slice(&chunk.data);
    }
    assert_eq!(String::from_utf8_lossy(&got), "the first attempt's error\n");
    server.stop();
    server.wait().await.expect("a clean stop");
}

/// A node that comes to lead a group while its API port is held for a moment (a client's
/// connection from the port to itself) waits for it rather than exit: it did exit, and the
/// group lost a node (an operator's walkthrough). A lone coordinator says at once.
#[tokio::test]
async fn a_leader_waits_for_its_api_port_and_a_lone_coordinator_does_not() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let at = held.local_addr().expect("its address");
    let e = bind_retrying(at, false, || panic!("a lone coordinator waits for nothing"))
        .await
        .expect_err("the port is taken");
    assert!(
        e.to_string()
            .contains(&format!("cannot listen on {at} (--listen)")),
        "{e}"
    );
    // The port is let go once the node waits for it.
    let mut held = Some(held);
    let mut waits = 0;
    let (_, bound) = bind_retrying(at, true, || {
        waits += 1;
        held = None;
    })
    .await
    .expect("bound once the port is free");
    assert_eq!(bound, at);
    assert_eq!(waits, 1);
}
