//! What a finished job leaves behind goes: `flotilla rm` (or the retention of finished jobs,
//! `flotilla server --retain-finished`) removes its status and logs on the coordinator, the
//! files uploaded with it, and the objects and logs it left on workers. Before, sandboxes,
//! the object stores and uploads were never cleaned.

#![allow(clippy::unwrap_used)]

mod kit;

use std::path::Path;
use std::time::Duration;

use kit::{assert_succeeded, job_id_of, wait_until, Cluster, Opts};

const JOB: &str = r#"name = "leftovers"
staging = "transfer"

[[task]]
id = "a"
inputs = ["seed.txt"]
cmd = ["sh", "-c", "cat seed.txt > a.txt"]
outputs = ["a.txt"]

[[task]]
id = "b"
after = ["a"]
cmd = ["sh", "-c", "cat a.txt a.txt > b.txt"]
outputs = ["b.txt"]
"#;

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter(|e| e.path().is_file()).count())
        .unwrap_or(0)
}

#[test]
fn removing_a_job_cleans_the_coordinator_and_the_workers() {
    let c = Cluster::start(2, 1);
    let dir = c.job_dir();
    std::fs::write(dir.join("seed.txt"), "seed\n").unwrap();
    let file = dir.join("leftovers.toml");
    std::fs::write(&file, JOB).unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = job_id_of(&out);
    assert_succeeded(&c.wait_job(job, Duration::from_secs(30)));
    let root = c.root();
    let held = |w: &str| files_in(&root.join(w).join("objects"));
    assert!(
        held("w0") + held("w1") >= 2,
        "the outputs are held on the workers"
    );
    assert_eq!(
        files_in(&c.state.join("objects")),
        1,
        "seed.txt was uploaded"
    );
    let out = c.cli(&["rm", &job.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        "the workers to drop the removed job's objects and logs",
        Duration::from_secs(30),
        || {
            let logs = files_in(&root.join("w0/logs")) + files_in(&root.join("w1/logs"));
            (held("w0") + held("w1") == 0 && logs == 0).then_some(())
        },
    );
    assert_eq!(files_in(&c.state.join("objects")), 0, "the upload was kept");
    // The gathered copies in the job folder are the user's: untouched.
    assert_eq!(
        std::fs::read_to_string(dir.join("b.txt")).unwrap(),
        "seed\nseed\n"
    );
}

#[test]
fn finished_jobs_are_removed_after_the_retention() {
    let opts = Opts {
        server_args: vec!["--retain-finished".into(), "1s".into()],
        ..Opts::default()
    };
    let c = Cluster::start_with(1, 1, opts);
    let id = c.submit_toml("quick.toml", "[[task]]\nid = \"t\"\ncmd = [\"true\"]\n");
    wait_until("the job to be removed", Duration::from_secs(60), || {
        let overview = c.overview()?;
        overview.jobs.iter().all(|j| j.id != id).then_some(())
    });
    let out = c.cli(&["status", &id.0.to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job"));
}

/// Removed jobs' records are dropped from the journal (`--compact-journal-after`), and a
/// coordinator restarted on the compacted journal goes on: the ids it gave are not given
/// again.
#[test]
fn the_journal_is_compacted_once_jobs_are_removed() {
    let opts = Opts {
        server_args: vec![
            "--retain-finished".into(),
            "1s".into(),
            "--compact-journal-after".into(),
            "1B".into(),
        ],
        ..Opts::default()
    };
    let mut c = Cluster::start_with(1, 1, opts);
    let journal = c.state.join("journal.log");
    let marker = "marker-of-the-removed-job";
    // The task waits for `go`: finished, the job is removed within 1–2 s, and a test that
    // looked at it only then could find it gone already.
    let (first, go) = c.submit_gated("first", "", &format!("echo {marker}"));
    let holds_marker = || {
        let bytes = std::fs::read(&journal).unwrap();
        bytes.windows(marker.len()).any(|w| w == marker.as_bytes())
    };
    assert!(holds_marker(), "the job is in the journal");
    std::fs::write(&go, "").unwrap();
    wait_until(
        "the removed job's records to leave the journal",
        Duration::from_secs(60),
        || (!holds_marker()).then_some(()),
    );
    c.kill_server();
    c.restart_server();
    let second = c.submit_toml("second.toml", "[[task]]\nid = \"t\"\ncmd = [\"true\"]\n");
    assert!(
        second > first,
        "job ids are not reused: {second} after {first}"
    );
    assert_succeeded(&c.wait_job(second, Duration::from_secs(60)));
    let out = c.cli(&["status", &first.0.to_string()]);
    assert!(!out.status.success(), "the removed job stays removed");
}

/// Disk caps: the coordinator refuses a submission whose uploads do not fit under
/// `--max-uploads`, and a worker's object store refuses an output beyond `--max-store`
/// (the task fails, naming the cap, and the worker goes on). Before, nothing bounded them.
#[test]
fn disk_caps_refuse_uploads_and_outputs_that_do_not_fit() {
    let opts = Opts {
        server_args: vec!["--max-uploads".into(), "1KiB".into()],
        ..Opts::default()
    };
    let mut c = Cluster::start_with(0, 1, opts);
    c.add_worker_with(1, &["--max-store", "1KiB"]);
    c.wait_workers(1);
    let dir = c.job_dir();
    std::fs::write(dir.join("big.txt"), vec![b'x'; 4096]).unwrap();
    let file = dir.join("upload.toml");
    std::fs::write(
        &file,
        "name = \"upload\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\n\
         inputs = [\"big.txt\"]\ncmd = [\"cat\", \"big.txt\"]\n",
    )
    .unwrap();
    let out = c.cli(&["submit", &file.display().to_string()]);
    assert!(!out.status.success(), "an upload over the cap was taken");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("larger than the whole object store")
            && err.contains("raise flotilla server --max-uploads")
            && err.contains("big.txt"),
        "{err}"
    );
    let id = c.submit_toml(
        "output.toml",
        "name = \"output\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\nretries = 0\n\
         cmd = [\"sh\", \"-c\", \"head -c 4096 /dev/zero > out.bin\"]\noutputs = [\"out.bin\"]\n",
    );
    let s = c.wait_job(id, Duration::from_secs(60));
    let message = s.tasks[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("larger than the whole object store") && message.contains("--max-store"),
        "{message}"
    );
    // The worker is unharmed: a job that fits runs.
    let small = c.submit_toml(
        "small.toml",
        "name = \"small\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\n\
         cmd = [\"sh\", \"-c\", \"echo fits > out.txt\"]\noutputs = [\"out.txt\"]\n",
    );
    assert_succeeded(&c.wait_job(small, Duration::from_secs(60)));
}

/// `--max-sandbox`: a transfer task whose folder grows past the cap (many small files) is
/// stopped and fails saying so; one file past it is stopped by the kernel (SIGXFSZ), also
/// named; the worker goes on. Before, a task could fill the worker's disk.
#[test]
fn a_task_folder_past_the_sandbox_cap_is_stopped() {
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(1, &["--max-sandbox", "1MiB"]);
    c.wait_workers(1);
    let many = c.submit_toml(
        "many.toml",
        "name = \"many\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\nretries = 0\n\
         cmd = [\"sh\", \"-c\", \"for i in $(seq 40); do head -c 100000 /dev/zero > f$i; done; \
         sleep 60\"]\n",
    );
    let s = c.wait_job(many, Duration::from_secs(60));
    let message = s.tasks[0].message.clone().unwrap_or_default();
    assert!(message.contains("--max-sandbox"), "{message}");
    let one = c.submit_toml(
        "one.toml",
        "name = \"one\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\nretries = 0\n\
         cmd = [\"sh\", \"-c\", \"head -c 4000000 /dev/zero > big\"]\n",
    );
    let s = c.wait_job(one, Duration::from_secs(60));
    let message = s.tasks[0].message.clone().unwrap_or_default();
    assert!(message.contains("--max-sandbox"), "{message}");
    // The writer killed, the task going on to end well: the cut file fails it (it passed,
    // the file silently truncated).
    let on = c.submit_toml(
        "on.toml",
        "name = \"on\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\nretries = 0\n\
         cmd = [\"sh\", \"-c\", \"head -c 4000000 /dev/zero > big; echo wrote\"]\n",
    );
    let s = c.wait_job(on, Duration::from_secs(60));
    assert_eq!(
        s.tasks[0].state,
        flotilla::cluster::state::TaskState::Failed,
        "{s:?}"
    );
    let message = s.tasks[0].message.clone().unwrap_or_default();
    assert!(message.contains("was cut there"), "{message}");
    let small = c.submit_toml(
        "small.toml",
        "name = \"small\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\n\
         cmd = [\"sh\", \"-c\", \"echo fits > out.txt\"]\noutputs = [\"out.txt\"]\n",
    );
    assert_succeeded(&c.wait_job(small, Duration::from_secs(60)));
}
