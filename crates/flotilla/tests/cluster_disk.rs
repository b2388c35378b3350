//! The coordinator's state folder on a disk that fills up (a small tmpfs the test mounts) and
//! on a read-only one: it refuses new jobs with a clear error, acknowledges nothing it could
//! not write, loses nothing it acknowledged, and takes work again once there is space.
//! Mounting needs root: CI runs as root and sets `FLOTILLA_REQUIRE_ROOT`.

#![allow(clippy::unwrap_used)]

mod kit;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use kit::{assert_succeeded, wait_until, Cluster, Opts};

/// Whether this test may mount file systems (root); CI must.
fn root_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var_os("FLOTILLA_REQUIRE_ROOT").is_none(),
            "FLOTILLA_REQUIRE_ROOT is set but this test does not run as root"
        );
        eprintln!("not root: cannot mount a small file system; skipped");
    }
    root
}

/// A job of `n` independent tasks named `name-*` (its text grows with `n`).
fn job(name: &str, n: usize) -> String {
    let mut t = format!("name = \"{name}\"\n");
    for i in 0..n {
        t.push_str(&format!(
            "\n[[task]]\nid = \"{name}-{i}\"\ncmd = [\"true\"]\nenv = {{ PADDING = \"{}\" }}\n",
            "x".repeat(40)
        ));
    }
    t
}

/// Writes zeros to `path` until the disk is full.
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    // What is left is smaller than a chunk: fill it a page at a time.
    while f.write_all(&chunk[..4096]).is_ok() {}
    let _ = f.sync_all();
}

#[test]
fn a_full_disk_refuses_new_jobs_loses_nothing_and_resumes_when_space_returns() {
    if !root_or_skip() {
        return;
    }
    let opts = Opts {
        state_tmpfs: Some("4m".into()),
        ..Opts::default()
    };
    let mut c = Cluster::start_with(0, 1, opts);
    c.add_worker(2);
    c.wait_workers(1);
    let a = c.submit_toml("a.toml", &job("a", 3));
    assert_succeeded(&c.wait_job(a, Duration::from_secs(60)));

    // Job w's tasks wait until the test says: their reports come on a full disk (more of
    // them than the slack of the journal's last page holds).
    let go = c.job_dir().join("go");
    let w_file = c.job_dir().join("w.toml");
    let mut w_toml = String::from("name = \"w\"\n");
    for i in 0..100 {
        w_toml.push_str(&format!(
            "[[task]]\nid = \"wait-{i}\"\n\
             cmd = [\"sh\", \"-c\", \"while [ ! -e '{}' ]; do sleep 0.05; done\"]\n",
            go.display()
        ));
    }
    std::fs::write(&w_file, w_toml).unwrap();
    let w = c.submit(&w_file);
    wait_until("w's tasks to run", Duration::from_secs(60), || {
        (c.status(w)?.counts.running > 0).then_some(())
    });

    let filler = c.state.join("filler");
    fill(&filler);
    // A new job is refused at once, saying why: it would not be taken and then held
    // unacknowledged (a client that gives up would take that for a refusal, and a job
    // sent again would then run twice).
    let b_file = c.job_dir().join("b.toml");
    std::fs::write(&b_file, job("b", 200)).unwrap();
    let out = c.cli(&["submit", &b_file.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a job was taken on a full disk");
    assert!(
        err.contains("disk is full") && err.contains("journal"),
        "{err}"
    );
    // w's reports cannot be written: the coordinator holds it, unacknowledged, says so,
    // and refuses new jobs whatever their size.
    std::fs::write(&go, "").unwrap();
    let error = wait_until(
        "the coordinator to report that its journal cannot be written",
        Duration::from_secs(60),
        || c.overview()?.journal?.error,
    );
    assert!(error.contains("No space left"), "{error}");
    let c_file = c.job_dir().join("c.toml");
    std::fs::write(&c_file, job("c", 5)).unwrap();
    let out = c.cli(&["submit", &c_file.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a job was taken on a full disk");
    assert!(
        err.contains("cannot write its journal") && err.contains("No space left"),
        "{err}"
    );
    // Space returns: w's reports are written and w ends; new jobs are taken again.
    std::fs::remove_file(&filler).unwrap();
    assert_succeeded(&c.wait_job(w, Duration::from_secs(120)));
    assert!(c.overview().unwrap().journal.unwrap().error.is_none());
    let b = c.submit(&b_file);
    assert_succeeded(&c.wait_job(b, Duration::from_secs(120)));
    let cj = c.submit(&c_file);
    assert_succeeded(&c.wait_job(cj, Duration::from_secs(60)));
    // Nothing acknowledged was lost: a restart finds every job, each done once.
    c.kill_server();
    c.restart_server();
    for (job, n) in [(a, 3), (w, 100), (b, 200), (cj, 5)] {
        let s = c.status(job).unwrap();
        assert_succeeded(&s);
        assert_eq!(s.total, n);
        assert!(s.tasks.iter().all(|t| t.attempts == 1), "{job} ran twice");
    }
}

#[test]
fn a_read_only_state_folder_is_refused_at_start_with_its_name() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mount = |args: &[&str]| {
        let ok = Command::new("mount")
            .args(args)
            .arg(&state)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount {args:?} {}", state.display());
    };
    mount(&["-t", "tmpfs", "-o", "size=1m", "tmpfs"]);
    mount(&["-o", "remount,ro"]);
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["server", "--listen", "127.0.0.1:0", "--state"])
        .arg(&state)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = Command::new("umount").arg("-l").arg(&state).status();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a coordinator started on a read-only disk"
    );
    assert!(
        err.contains(&state.display().to_string()) && err.contains("Read-only"),
        "the error does not name the folder and why: {err}"
    );
}
