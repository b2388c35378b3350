//! `Logs` with `follow` through a real coordinator and worker on 127.0.0.1, in one process.

use std::time::Duration;

use flotilla_cluster::worker::Isolation;
use flotilla_cluster::{run_worker, Client, Remote, Server, ServerConfig, WorkerConfig};
use tokio::sync::watch;

/// A stream opened while its task is still queued (no worker yet: the task has no attempt,
/// so no log file) follows the first attempt once it starts, and ends when the task ends.
/// It used to poll the file of the attempt that never ran, for ever (seen in CI: `flotilla
/// logs --follow` started on a loaded machine before the task was placed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opened_on_a_queued_task_follows_its_first_attempt() {
    let text = follow_from_queued("cmd = [\"sh\", \"-c\", \"echo one; echo two\"]\n").await;
    assert_eq!(text, [(1, "one\ntwo\n".to_string())]);
}

/// A task that fails and is tried again: the stream goes on with the new attempt's output
/// after the failed one's (it used to wait on the failed attempt's file for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_stream_goes_on_with_the_next_attempt() {
    let text = follow_from_queued(
        "retries = 1\ncmd = [\"sh\", \"-c\", \"if [ -e marker ]; then echo second; else touch marker; echo first; exit 1; fi\"]\n",
    )
    .await;
    assert_eq!(
        text,
        [(1, "first\n".to_string()), (2, "second\n".to_string())]
    );
}

/// Submits a one-task job (`task` is the rest of its `[[task]]` table), opens a followed
/// stream of its stdout before any worker exists, starts one, and returns what the stream
/// carried until it ended, attempt by attempt.
async fn follow_from_queued(task: &str) -> Vec<(u32, String)> {
    let dir = tempfile::tempdir().expect("temporary folder");
    let server = Server::start(ServerConfig::new(
        ([127, 0, 0, 1], 0).into(),
        dir.path().join("state"),
    ))
    .await
    .expect("coordinator starts");
    let remote = Remote::new(server.addr().to_string(), server.token().to_string());
    let mut client = Client::connect(&remote).await.expect("client connects");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).expect("job folder");
    let job = client
        .submit_text(
            "job.toml",
            &format!("name = \"j\"\n[[task]]\nid = \"t\"\n{task}"),
            &job_dir.display().to_string(),
        )
        .await
        .expect("job accepted")
        .job;
    // Answered: the coordinator has looked the task up (queued, no attempt yet) and follows.
    let mut stream = client
        .logs(job, "t", true, false)
        .await
        .expect("logs stream opens");

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut wc = WorkerConfig::local(remote.clone());
    wc.name = "w".into();
    wc.cpus = 1.0;
    wc.work_dir = dir.path().join("worker");
    wc.isolation = Isolation::None;
    let worker = tokio::spawn(run_worker(wc, stop_rx));

    // Bounded only so that the old behaviour fails instead of hanging the suite.
    let read = async {
        let mut text: Vec<(u32, String)> = Vec::new();
        while let Some(chunk) = stream.message().await.expect("stream ends cleanly") {
            let data = String::from_utf8_lossy(&chunk.data);
            match text.last_mut() {
                Some((a, t)) if *a == chunk.attempt => t.push_str(&data),
                _ => text.push((chunk.attempt, data.into_owned())),
            }
        }
        text
    };
    let text = tokio::time::timeout(Duration::from_secs(300), read)
        .await
        .expect("the stream ends with the task");
    let _ = stop_tx.send(true);
    let _ = worker.await;
    server.stop();
    let _ = server.wait().await;
    text
}
