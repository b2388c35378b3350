//! The coordinator's journal through the real server: `--fsync` fsyncs every append, a
//! damaged record stops the start with an error naming the file and the offset,
//! `--recover-journal` keeps the valid records before it, and a submission sent again with
//! its request id gets the job it made, across a restart.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use flotilla::cluster::state::JournalRecord;
use kit::{assert_succeeded, wait_until, Cluster, Opts};

const WAIT: Duration = Duration::from_secs(60);

const ONE_TASK: &str = r#"
name = "one"
[[task]]
id = "t"
cmd = ["true"]
"#;

fn journal_of(c: &Cluster) -> flotilla::cluster::state::JournalStatus {
    c.overview()
        .expect("the coordinator answers")
        .journal
        .expect("a server reports its journal")
}

#[test]
fn fsync_flag_fsyncs_every_append_and_its_absence_none() {
    // `flotilla server --fsync` was parsed and then ignored.
    let c = Cluster::start_with(
        1,
        1,
        Opts {
            server_args: vec!["--fsync".into()],
            ..Opts::default()
        },
    );
    let job = c.submit_toml("one.toml", ONE_TASK);
    assert_succeeded(&c.wait_job(job, WAIT));
    let j = journal_of(&c);
    assert!(j.fsync);
    assert!(j.records >= 3, "submitted, assigned, finished: {j:?}");
    assert!(j.syncs >= 2, "every batch is fsync'd: {j:?}");
    assert!(j.path.ends_with("journal.log"));

    let c = Cluster::start(1, 1);
    let job = c.submit_toml("one.toml", ONE_TASK);
    assert_succeeded(&c.wait_job(job, WAIT));
    let j = journal_of(&c);
    assert!(!j.fsync);
    assert_eq!(j.syncs, 0, "{j:?}");
    // The state folder the server made, and its journal, are its owner's only: they hold
    // every tenant's job files and output (they were world-readable).
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&c.state), 0o700);
    assert_eq!(mode(&c.state.join("journal.log")), 0o600);
}

/// Byte offset of record `n`'s header (format 2: 8-byte magic, 12-byte record headers).
fn record_offset(bytes: &[u8], n: usize) -> usize {
    let mut at = 8;
    for _ in 0..n {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 12 + len;
    }
    at
}

#[test]
fn a_damaged_record_stops_the_start_and_recovery_keeps_what_came_before_it() {
    // No workers: the jobs wait, and the journal holds one submission per job.
    let mut c = Cluster::start(0, 1);
    for i in 0..3 {
        c.submit_toml(
            &format!("j{i}.toml"),
            &ONE_TASK.replace("\"one\"", &format!("\"j{i}\"")),
        );
    }
    assert_eq!(c.overview().unwrap().jobs.len(), 3);
    c.kill_server();
    let path = c.state.join("journal.log");
    // The second job's submission (clock records come before each).
    let n = {
        let mut j = flotilla::cluster::journal::Journal::open(&path).unwrap();
        j.replay()
            .unwrap()
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, JournalRecord::JobSubmittedText { .. }))
            .nth(1)
            .expect("three submissions")
            .0
    };
    let mut bytes = std::fs::read(&path).unwrap();
    let at = record_offset(&bytes, n);
    // A damaged length: format 1 took it for a torn write and silently cut off the rest.
    bytes[at + 1] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();

    let out = c.server_output(&[]);
    assert!(
        !out.status.success(),
        "the coordinator started on a damaged journal"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("journal.log"), "{err}");
    assert!(err.contains(&format!("record {n} at byte {at}")), "{err}");
    assert!(err.contains("--recover-journal"), "{err}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "a refused start changes nothing"
    );

    // The logs of a job whose records the recovery will lose (as a task that printed
    // something leaves them).
    std::fs::create_dir_all(c.state.join("logs/9")).unwrap();
    c.restart_server_with(&["--recover-journal"]);
    let s = c.overview().expect("the coordinator answers");
    assert_eq!(
        s.jobs.len(),
        1,
        "only the records before the damage are kept"
    );
    let aside = c.state.join(format!("journal.log.damaged-{at}"));
    assert_eq!(
        std::fs::read(aside).unwrap(),
        bytes,
        "the damaged file is kept aside"
    );
    // The recovered coordinator goes on journaling, and gives no id twice (the lost jobs'
    // logs are still there: a new job 2 showed the old job 2's).
    let again = c.submit_toml("again.toml", ONE_TASK);
    assert_eq!(c.overview().unwrap().jobs.len(), 2);
    assert!(again.0 > 9, "job {} reuses an id that has logs", again.0);
}

#[test]
fn rm_forgets_a_finished_job_across_a_restart_and_refuses_a_running_one() {
    let mut c = Cluster::start(1, 1);
    let job = c.submit_toml("one.toml", ONE_TASK);
    assert_succeeded(&c.wait_job(job, WAIT));
    let long = c.submit_toml(
        "long.toml",
        "name = \"long\"\n[[task]]\nid = \"t\"\ncmd = [\"sleep\", \"600\"]\n",
    );
    let out = c.cli(&["rm", &long.0.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("it has not ended: its tasks run or wait (cancel it first)"),
        "{err}"
    );

    let out = c.cli(&["rm", &job.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.status(job).is_none(), "the removed job is still known");
    let out = c.cli(&["rm", &job.0.to_string()]);
    assert!(!out.status.success());
    // Said with what it may mean: removed (ids are never given twice).
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "no job {} (never submitted, or removed: by `flotilla rm` or the retention of \
             finished jobs; ids are never given twice)",
            job.0
        )),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    c.kill_server();
    c.restart_server();
    let s = c.overview().expect("the coordinator answers");
    assert_eq!(s.jobs.len(), 1, "the removal survives the restart");
    assert_eq!(s.jobs[0].id, long);
}

/// A client that lost a submission's answer sends it again with the same request id and gets
/// the job it made, also after the coordinator restarted (the id is journaled with the job);
/// another id makes another job, and so does the same id once its job is removed.
#[test]
fn a_submission_sent_again_with_its_request_id_gets_the_job_it_made_across_a_restart() {
    // No workers: the jobs wait.
    let mut c = Cluster::start(0, 1);
    let file = c.job_dir().join("one.toml");
    std::fs::write(&file, ONE_TASK).unwrap();
    let first = c.submit_with_id(&file, "req-1").expect("submitted");
    assert_eq!(c.submit_with_id(&file, "req-1"), Some(first));
    let other = c.submit_with_id(&file, "req-2").expect("submitted");
    assert_ne!(other, first);
    c.kill_server();
    c.restart_server();
    let again = wait_until("the restarted coordinator", WAIT, || {
        c.submit_with_id(&file, "req-1")
    });
    assert_eq!(again, first);
    assert_eq!(c.overview().unwrap().jobs.len(), 2);
    for cmd in ["cancel", "rm"] {
        let out = c.cli(&[cmd, &first.0.to_string()]);
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
    let new = c.submit_with_id(&file, "req-1").expect("submitted");
    assert!(new.0 > other.0, "{new} after {other}");
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A job's times (submitted, finished, makespan, and so the workers' utilization) are the same
/// after the coordinator restarts: the journal keeps the clock they were made at. They used
/// to count from the restart: a job finished before it showed a makespan of 0 ms, and one
/// running across it a utilization above 100%.
#[test]
fn a_jobs_times_are_the_same_after_a_restart() {
    let mut c = Cluster::start(1, 1);
    let before = unix_ms();
    let done = c.submit_toml(
        "nap.toml",
        "name = \"nap\"\n[[task]]\nid = \"t\"\ncmd = [\"sleep\", \"0.3\"]\n",
    );
    let was = c.wait_job(done, WAIT);
    assert_succeeded(&was);
    let after = unix_ms();
    assert!(
        (before..=after).contains(&was.submitted_ms),
        "submitted_ms is the Unix time of the submission: {} not in {before}..={after}",
        was.submitted_ms
    );
    assert!(was.makespan_s >= 0.3, "{}", was.makespan_s);
    let running = c.submit_toml(
        "long.toml",
        "name = \"long\"\n[[task]]\nid = \"t\"\ncmd = [\"sleep\", \"600\"]\n",
    );
    let submitted = c.status(running).unwrap().submitted_ms;

    for stop in ["SIGKILL", "SIGTERM"] {
        if stop == "SIGKILL" {
            c.kill_server();
        } else {
            c.stop_server();
        }
        c.restart_server();
        let now = wait_until("the restarted coordinator", WAIT, || c.status(done));
        assert_eq!(
            (now.submitted_ms, now.finished_ms, now.makespan_s),
            (was.submitted_ms, was.finished_ms, was.makespan_s),
            "after a {stop}"
        );
        for w in &now.per_worker {
            assert!(
                w.busy_s <= now.makespan_s,
                "worker {} busy {} s in a makespan of {} s",
                w.worker,
                w.busy_s,
                now.makespan_s
            );
        }
        assert_eq!(c.status(running).unwrap().submitted_ms, submitted);
    }
}

/// `flotilla wait` and `flotilla logs --follow` follow a job through its coordinator stopped
/// (SIGTERM) and started again,
/// and through a kill (SIGKILL) and start: it connects again and ends with the job's outcome.
/// It failed at the kill with "the server may speak TLS" (the server speaks none), and at
/// the stop with "the coordinator is stopping".
#[test]
fn wait_follows_a_job_through_coordinator_restarts() {
    let mut c = Cluster::start(1, 1);
    let (job, go) = c.submit_gated("gated", "echo before", "echo after");
    let mut wait = c.cli_piped(&["wait", &job.0.to_string()]);
    // Its first progress line: it follows the job's events.
    let rx = lines_of(&mut wait);
    let first = rx
        .recv_timeout(WAIT)
        .expect("a progress line from flotilla wait");
    assert!(first.contains("0/1 tasks done"), "{first}");
    // And one following the task's output (`logs --follow`), once its first line came.
    let mut logs = c.cli_piped(&["logs", &job.0.to_string(), "t", "--follow"]);
    let lrx = lines_of(&mut logs);
    let line = lrx
        .recv_timeout(WAIT)
        .expect("the task's first line from flotilla logs --follow");
    assert_eq!(line, "before");
    c.stop_server();
    c.restart_server();
    c.kill_server();
    c.restart_server();
    std::fs::write(&go, "").unwrap();
    let status = wait_until("flotilla wait to end", Duration::from_secs(180), || {
        wait.try_wait().unwrap()
    });
    let mut err = String::new();
    std::io::Read::read_to_string(&mut wait.stderr.take().unwrap(), &mut err).unwrap();
    let out: Vec<String> = rx.iter().collect();
    assert!(status.success(), "{status}: {err}\n{out:?}");
    assert!(
        out.iter().any(|l| l.contains("succeeded")),
        "{out:?}\n{err}"
    );
    assert_succeeded(&c.wait_job(job, WAIT));
    let status = wait_until("flotilla logs --follow to end", WAIT, || {
        logs.try_wait().unwrap()
    });
    let rest: Vec<String> = lrx.iter().collect();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut logs.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "logs --follow: {status}: {err}");
    assert_eq!(
        rest,
        ["after"],
        "logs --follow printed twice or lost a line: {err}"
    );
}

/// The lines a child writes on stdout, as they come.
fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    rx
}

/// `logs --follow` and `wait` follow a job through a coordinator killed while its port, for a
/// moment, accepts connections and drops them at once (as a coordinator that is killed right
/// after it accepted a reconnection does). The first call on such a connection failed as
/// "no HTTP/2 answer over plain TCP (connection reset): the server may speak TLS" and ended
/// `logs --follow` (seen in CI): a coordinator that answered before is lost, not one that
/// wants TLS.
#[test]
fn follows_ride_out_a_port_that_drops_connections_while_the_coordinator_is_down() {
    let mut c = Cluster::start(1, 1);
    let (job, go) = c.submit_gated("gated", "echo before", "echo after");
    let mut wait = c.cli_piped(&["wait", &job.0.to_string()]);
    let wait_lines = lines_of(&mut wait);
    let first = wait_lines
        .recv_timeout(WAIT)
        .expect("a progress line from flotilla wait");
    assert!(first.contains("0/1 tasks done"), "{first}");
    let mut logs = c.cli_piped(&["logs", &job.0.to_string(), "t", "--follow"]);
    let log_lines = lines_of(&mut logs);
    let line = log_lines
        .recv_timeout(WAIT)
        .expect("the task's first line from flotilla logs --follow");
    assert_eq!(line, "before");
    c.kill_server();
    // The port accepts, and drops, every connection for a while: at least four, over at
    // least 1.5 s, so that both followers (each tries again within 1 s) meet it.
    let port = std::net::TcpListener::bind(c.addr).expect("the killed coordinator's port");
    port.set_nonblocking(true).unwrap();
    let mut dropped = 0;
    let opened = std::time::Instant::now();
    let until = opened + WAIT;
    while dropped < 4 || opened.elapsed() < Duration::from_millis(1500) {
        match port.accept() {
            Ok((conn, _)) => {
                drop(conn);
                dropped += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    std::time::Instant::now() < until,
                    "the followers connected {dropped} times in {WAIT:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accepting on the coordinator's port: {e}"),
        }
    }
    drop(port);
    c.restart_server();
    std::fs::write(&go, "").unwrap();
    for (what, child, lines, expect) in [
        ("flotilla wait", &mut wait, &wait_lines, None),
        (
            "flotilla logs --follow",
            &mut logs,
            &log_lines,
            Some("after"),
        ),
    ] {
        let status = wait_until(&format!("{what} to end"), WAIT, || {
            child.try_wait().unwrap()
        });
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        let out: Vec<String> = lines.iter().collect();
        assert!(status.success(), "{what}: {status}: {err}\n{out:?}");
        if let Some(expect) = expect {
            assert_eq!(out, [expect], "{what} printed twice or lost a line: {err}");
        } else {
            assert!(
                out.iter().any(|l| l.contains("succeeded")),
                "{out:?}\n{err}"
            );
        }
    }
}

/// A coordinator stopped (SIGTERM) the moment it says it listens stops cleanly: its signals
/// are heard from before it starts. SIGTERM once came before the handler was set and ended the
/// process by the signal (seen stopping a coordinator right after a restart).
#[test]
fn a_coordinator_stopped_as_soon_as_it_listens_stops_cleanly() {
    let mut c = Cluster::start(0, 1);
    for _ in 0..5 {
        c.stop_server(); // asserts a clean exit
        c.restart_server();
    }
}
