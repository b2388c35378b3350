//! Sandboxed tasks (`flotilla worker --isolation required`, bubblewrap): a task that tries to
//! read the coordinator's token or the worker's folder, kill its worker or the coordinator,
//! write outside its folder, fork-bomb, or reach the network fails at that, while the job's
//! other tasks and the worker are unharmed. The same probes run on a worker without a
//! sandbox succeed at their attacks, so the probes do detect them.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use flotilla::cluster::state::{JobState, TaskState};
use kit::{job_id_of, Cluster};

/// Whether this machine can sandbox (bubblewrap installed, namespaces allowed); CI must.
fn sandbox_or_skip() -> bool {
    let ok = flotilla::exec::sandbox::find_bwrap()
        .is_some_and(|b| flotilla::exec::sandbox::probe(&b).is_ok());
    if !ok {
        assert!(
            std::env::var_os("FLOTILLA_REQUIRE_SANDBOX").is_none(),
            "FLOTILLA_REQUIRE_SANDBOX is set but no sandbox can be made (apt-get install bubblewrap)"
        );
        eprintln!("no sandbox on this machine (bubblewrap): skipped");
    }
    ok
}

/// A file a probe tries to create in a system folder (one per cluster: tests run at once).
fn usr_mark(c: &Cluster) -> String {
    format!(
        "/usr/flotilla-was-here-{}",
        c.root().file_name().unwrap().to_string_lossy()
    )
}

/// Each probe exits 0 when the attack failed, 1 when it succeeded.
fn probes(c: &Cluster, worker_pid: u32) -> String {
    let root = c.root().display().to_string();
    let state = c.state.display().to_string();
    let server = c.server_pid().unwrap();
    let port = c.addr.port();
    let mark = usr_mark(c);
    format!(
        r#"name = "probes"

[[task]]
id = "read-token"
cmd = ["sh", "-c", "if cat {state}/token || ls {root}/w0; then exit 1; fi; exit 0"]

[[task]]
id = "kill-worker"
cmd = ["sh", "-c", "kill -9 {worker_pid} 2>/dev/null && exit 1; kill -9 {server} 2>/dev/null && exit 1; kill -9 -1; exit 0"]

[[task]]
id = "write-outside"
cmd = ["sh", "-c", "touch {root}/outside 2>/dev/null; touch {root}/w0/planted 2>/dev/null && exit 1; touch {mark} 2>/dev/null && exit 1; exit 0"]

[[task]]
id = "fork-bomb"
cmd = ["sh", "-c", "sh -c 'for i in $(seq 400); do sleep 3 & done' 2> bomb.err; grep -qi fork bomb.err"]

[[task]]
id = "network"
cmd = ["python3", "-c", "import socket, sys; s = socket.socket(); s.settimeout(3); sys.exit(1 if s.connect_ex(('127.0.0.1', {port})) == 0 else 0)"]

[[task]]
id = "signals"
cmd = ["sh", "-c", "m=$(awk '/^SigIgn/ {{ print $2 }}' /proc/self/status); [ $((0x$m & 0x1006)) -eq 0 ] || {{ echo ignored $m >&2; exit 1; }}"]

[[task]]
id = "honest"
cmd = ["sh", "-c", "echo fine > honest.txt; tr '\\0' ' ' < /proc/1/cmdline > pid1.txt"]
"#
    )
}

#[test]
fn sandboxed_tasks_fail_at_their_attacks_and_harm_nothing() {
    if !sandbox_or_skip() {
        return;
    }
    let mut c = Cluster::start(0, 1);
    add_worker_ignoring_stop_signals(&mut c, 4, &["--isolation", "required", "--task-pids", "64"]);
    c.wait_workers(1);
    let worker = c.worker_pid(0).unwrap();
    let dir = c.job_dir();
    let file = dir.join("probes.toml");
    std::fs::write(&file, probes(&c, worker)).unwrap();
    let out = c.cli(&["submit", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = job_id_of(&out);
    let s = c.wait_job(job, Duration::from_secs(60));
    let failed: Vec<String> = s
        .tasks
        .iter()
        .filter(|t| t.state != TaskState::Done)
        .map(|t| format!("{} {:?} {:?}", t.name, t.state, t.message))
        .collect();
    assert!(failed.is_empty(), "attacks that worked: {failed:?}");
    assert_eq!(s.state, JobState::Succeeded);
    assert_eq!(
        std::fs::read_to_string(dir.join("honest.txt")).unwrap(),
        "fine\n"
    );
    // The task entered the worker's sandbox holder (the init of its PID namespace is
    // `flotilla-enter`), not a sandbox of its own.
    let init = std::fs::read_to_string(dir.join("pid1.txt")).unwrap();
    assert!(init.contains("flotilla-enter"), "the task's PID 1: {init}");
    assert!(
        !c.root().join("outside").exists(),
        "wrote outside its folder"
    );
    assert!(
        !c.root().join("w0/planted").exists(),
        "wrote into the worker's folder"
    );
    assert!(!std::path::Path::new(&usr_mark(&c)).exists());
    // The worker and the coordinator live on, and take more work.
    assert!(c.worker_pid(0).is_some());
    assert_eq!(c.live_workers().len(), 1);
    let again = dir.join("again.toml");
    std::fs::write(
        &again,
        "[[task]]\nid = \"after\"\ncmd = [\"sh\", \"-c\", \"echo ok > after.txt\"]\n",
    )
    .unwrap();
    let out = c.cli(&["submit", "--wait", &again.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("after.txt")).unwrap(),
        "ok\n"
    );
    // A task that fails at its process limit is told which limit (its shell said only
    // "Cannot fork").
    let bomb = dir.join("bomb.toml");
    std::fs::write(
        &bomb,
        "[[task]]\nid = \"bomb\"\nretries = 0\n\
         cmd = [\"sh\", \"-c\", \"for i in $(seq 400); do sleep 3 & done; wait\"]\n",
    )
    .unwrap();
    let out = c.cli(&["submit", &bomb.display().to_string()]);
    let s = c.wait_job(job_id_of(&out), Duration::from_secs(60));
    let message = s.tasks[0].message.clone().unwrap_or_default();
    assert!(
        message.contains("reached its limit of 64 processes"),
        "{message}"
    );
}

/// A task that fails after a fork bomb on the same worker slot is not said to have reached
/// its process limit: a cgroup kept for the next attempt counts its refused forks on, and
/// the next attempt's failure was blamed on them.
#[test]
fn a_failure_after_a_fork_bomb_is_not_blamed_on_the_process_limit() {
    if !sandbox_or_skip() {
        return;
    }
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(1, &["--isolation", "required", "--task-pids", "32"]);
    c.wait_workers(1);
    let job = c.submit_toml(
        "after-bomb.toml",
        r#"name = "after-bomb"
[defaults]
retries = 0
[[task]]
id = "bomb"
cmd = ["sh", "-c", "sh -c 'for i in $(seq 100); do sleep 3 & done' 2> bomb.err; grep -qi fork bomb.err"]
[[task]]
id = "plain"
after = ["bomb"]
cmd = ["sh", "-c", "exit 3"]
"#,
    );
    let s = c.wait_job(job, Duration::from_secs(60));
    assert_eq!(kit::task(&s, "bomb").state, TaskState::Done, "{s:?}");
    let plain = kit::task(&s, "plain");
    let message = plain.message.clone().unwrap_or_default();
    assert!(
        message.contains("exited with code 3") && !message.contains("limit"),
        "{message}"
    );
}

/// Adds a worker started as a shell starts a background job, SIGINT and SIGQUIT ignored:
/// its tasks (the probe "signals") must not inherit that, nor the SIGPIPE flotilla-enter
/// ignores.
fn add_worker_ignoring_stop_signals(c: &mut Cluster, cpus: u32, args: &[&str]) {
    // SAFETY: dispositions of catchable signals, put back at once after the spawn.
    let was = unsafe {
        [
            libc::signal(libc::SIGINT, libc::SIG_IGN),
            libc::signal(libc::SIGQUIT, libc::SIG_IGN),
        ]
    };
    c.add_worker_with(cpus, args);
    // SAFETY: as above.
    unsafe {
        libc::signal(libc::SIGINT, was[0]);
        libc::signal(libc::SIGQUIT, was[1]);
    }
}

#[test]
fn without_a_sandbox_the_same_probes_succeed_at_their_attacks() {
    // The control: the probes do detect what they look for.
    let mut c = Cluster::start(0, 1);
    add_worker_ignoring_stop_signals(&mut c, 2, &["--isolation", "none"]);
    c.wait_workers(1);
    let dir = c.job_dir();
    let text = probes(&c, 0);
    // Only the harmless ones, each a job of its own: reading the token, writing outside,
    // the network.
    // And "signals", no attack: an unsandboxed task gets every signal at its default too.
    for k in ["read-token", "write-outside", "network", "signals"] {
        let block = text
            .split("[[task]]")
            .find(|b| b.contains(&format!("id = \"{k}\"")))
            .unwrap();
        let file = dir.join(format!("{k}.toml"));
        std::fs::write(&file, format!("[[task]]{block}")).unwrap();
        let out = c.cli(&["submit", &file.display().to_string()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = c.wait_job(job_id_of(&out), Duration::from_secs(60));
        let expected = if k == "signals" {
            TaskState::Done
        } else {
            TaskState::Failed
        };
        assert_eq!(s.tasks[0].state, expected, "{k}: {:?}", s.tasks[0].message);
    }
    assert!(c.root().join("outside").exists());
    // Root without a sandbox writes into /usr; a user without one would be refused there.
    let _ = std::fs::remove_file(usr_mark(&c));
}

#[test]
fn a_task_that_asks_for_the_network_runs_only_where_it_is_allowed() {
    if !sandbox_or_skip() {
        return;
    }
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(2, &["--isolation", "required"]); // w0: no network
    c.wait_workers(1);
    let port = c.addr.port();
    let dir = c.job_dir();
    let job = format!(
        "[[task]]\nid = \"net\"\nnetwork = true\ncmd = [\"python3\", \"-c\", \"import socket, sys; s = socket.socket(); s.settimeout(3); sys.exit(s.connect_ex(('127.0.0.1', {port})))\"]\n"
    );
    let file = dir.join("net.toml");
    std::fs::write(&file, job).unwrap();
    let out = c.cli(&["submit", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = job_id_of(&out);
    // No worker offers the network: it waits.
    let s = c.status(id).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Ready);
    c.add_worker_with(2, &["--isolation", "required", "--allow-network"]); // w1
    let s = c.wait_job(id, Duration::from_secs(60));
    assert_eq!(s.state, JobState::Succeeded, "{:?}", s.tasks[0].message);
    let names = c.live_workers();
    assert_eq!(names[&s.tasks[0].worker.unwrap()], "w1");
}

/// Processes whose command line is exactly `args` (NUL-separated in /proc).
fn procs_running(args: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = args.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn a_sandboxed_task_dies_with_its_killed_worker_and_a_memory_hog_with_its_cgroup() {
    if !sandbox_or_skip() {
        return;
    }
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(2, &["--isolation", "required"]);
    c.wait_workers(1);
    let dir = c.job_dir();
    // A unique command line, to find the task's process from outside its pid namespace.
    let nap = format!(
        "{}.{}",
        300 + std::process::id() % 97,
        std::process::id() % 9973
    );
    let file = dir.join("nap.toml");
    std::fs::write(
        &file,
        format!("[[task]]\nid = \"nap\"\ncmd = [\"sleep\", \"{nap}\"]\n"),
    )
    .unwrap();
    let out = c.cli(&["submit", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    kit::wait_until("the task to run", Duration::from_secs(30), || {
        (!procs_running(&["sleep", &nap]).is_empty()).then_some(())
    });
    c.kill_worker(0);
    kit::wait_until(
        "the killed worker's task to end",
        Duration::from_secs(30),
        || procs_running(&["sleep", &nap]).is_empty().then_some(()),
    );
    // A task over its memory is killed by its cgroup (where the machine has one) or refused
    // its allocation (rlimit): either way it fails for its memory, and the worker goes on.
    c.add_worker_with(2, &["--isolation", "required"]);
    c.wait_workers(1);
    let hog = dir.join("hog.toml");
    std::fs::write(
        &hog,
        "[defaults]\nretries = 0\nresources = { mem = \"64MiB\" }\n[[task]]\nid = \"hog\"\ncmd = [\"python3\", \"-c\", \"x = bytearray(512*1024*1024); x[::4096] = b'1' * len(x[::4096]); open('hog-ok', 'w').write('ok')\"]\n",
    )
    .unwrap();
    let out = c.cli(&["submit", &hog.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = c.wait_job(job_id_of(&out), Duration::from_secs(60));
    assert_eq!(s.tasks[0].state, TaskState::Failed);
    assert!(!dir.join("hog-ok").exists());
    let err = c.cli(&["logs", &s.id.0.to_string(), "hog", "--stderr"]);
    let why = format!(
        "{:?} {}",
        s.tasks[0].message,
        String::from_utf8_lossy(&err.stdout)
    );
    assert!(
        why.contains("memory limit") || why.contains("MemoryError"),
        "failed for another reason: {why}"
    );
    assert_eq!(c.live_workers().len(), 1);
}

/// Transfer staging in the sandbox holder: a task sees its own folder (its inputs, where it
/// writes its outputs) and none of the other attempts' folders beside it; its output comes
/// back whole.
#[test]
fn a_transfer_task_sees_only_its_own_folder() {
    if !sandbox_or_skip() {
        return;
    }
    let mut c = Cluster::start(0, 2);
    c.add_worker_with(2, &["--isolation", "required"]);
    c.wait_workers(1);
    std::fs::write(c.job_dir().join("in.txt"), "input\n").unwrap();
    let id = c.submit_toml(
        "own.toml",
        "name = \"own\"\nstaging = \"transfer\"\n\
         [[task]]\nid = \"t\"\narray = \"0..2\"\ninputs = [\"in.txt\"]\n\
         cmd = [\"sh\", \"-c\", \"sleep 1; ls .. | wc -l > seen-$FLOTILLA_INDEX.txt; cat in.txt >> seen-$FLOTILLA_INDEX.txt\"]\n\
         outputs = [\"seen-{i}.txt\"]\n",
    );
    kit::assert_succeeded(&c.wait_job(id, Duration::from_secs(60)));
    let out = c.cli(&["wait", &id.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..2 {
        let seen = std::fs::read_to_string(c.job_dir().join(format!("seen-{i}.txt"))).unwrap();
        assert_eq!(seen, "1\ninput\n", "task {i} saw beside its folder: {seen}");
    }
}

/// `flotilla-enter` on its own: a task in the holder has no capabilities, its own PID
/// namespace and only its folder of the folders beside it; a holder whose pid now names
/// another process (its mount namespace differs) is refused.
#[test]
fn flotilla_enter_drops_capabilities_and_checks_its_holder() {
    if !sandbox_or_skip() {
        return;
    }
    let Some(bwrap) = flotilla::exec::sandbox::find_bwrap() else {
        return;
    };
    let holder = match flotilla::exec::Holder::start(&bwrap, None) {
        Ok(h) => h,
        Err(e) => {
            assert!(
                std::env::var_os("FLOTILLA_REQUIRE_SANDBOX").is_none(),
                "no sandbox holder: {e}"
            );
            eprintln!("no sandbox holder here ({e}): skipped");
            return;
        }
    };
    let enter = std::path::PathBuf::from(env!("CARGO_BIN_EXE_flotilla-enter"));
    let r = holder.reference(&enter);
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::create_dir_all(dir.path().join("other")).unwrap();
    let run = |mnt: u64, script: &str| {
        std::process::Command::new(&enter)
            .args([
                "--holder",
                &r.pid.to_string(),
                "--holder-mnt",
                &mnt.to_string(),
            ])
            .arg("--own")
            .arg(&own)
            .arg("--cwd")
            .arg(&own)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    let out = run(
        r.mnt,
        "grep CapEff /proc/self/status; echo pid=$$; ls ..; echo done > mark",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("pid=2"), "{text}");
    assert!(text.contains("own") && !text.contains("other"), "{text}");
    assert!(own.join("mark").is_file());
    let out = run(r.mnt + 1, "true");
    assert_eq!(out.status.code(), Some(126));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no longer the sandbox holder"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(holder);
}

/// Regression: a worker's cgroups were one folder per worker name, and a starting worker
/// killed and removed the attempts found there as leftovers of its earlier life, so two
/// workers of one name on a machine (two clusters, or tests run at once) broke each other's
/// running tasks ("could not open cgroup.procs").
#[test]
fn a_worker_of_the_same_name_leaves_the_running_tasks_of_another_alone() {
    if !sandbox_or_skip() {
        return;
    }
    let mut a = Cluster::start(0, 1);
    a.add_worker_with(1, &["--isolation", "required"]); // w0
    a.wait_workers(1);
    let go = a.job_dir().join("go");
    std::fs::create_dir_all(a.job_dir()).unwrap();
    let go_s = go.display().to_string();
    // The task runs until the test says go (a file in its job folder).
    let id = a.submit_toml(
        "wait",
        &format!(
            "[[task]]\nid = \"wait\"\ncmd = [\"sh\", \"-c\", \"while [ ! -e {go_s} ]; do sleep 0.05; done\"]\n"
        ),
    );
    a.wait_status(id, "the task to start", Duration::from_secs(60), |s| {
        s.tasks[0].state == TaskState::Running
    });
    // Another cluster's worker of the same name starts and runs a task of its own.
    let mut b = Cluster::start(0, 1);
    b.add_worker_with(1, &["--isolation", "required"]); // w0 too
    b.wait_workers(1);
    let other = b.submit_toml("other", "[[task]]\nid = \"x\"\ncmd = [\"true\"]\n");
    assert_eq!(
        b.wait_job(other, Duration::from_secs(60)).state,
        JobState::Succeeded
    );
    drop(b);
    std::fs::write(&go, "").unwrap();
    let s = a.wait_job(id, Duration::from_secs(60));
    assert_eq!(s.state, JobState::Succeeded, "{:?}", s.tasks[0].message);
    assert_eq!(s.tasks[0].failures, 0, "the first attempt was broken");
    assert_eq!(s.tasks[0].attempts, 1);
}

/// A worker started with a relative `--work-dir` (as a user types it): every sandboxed task
/// failed with "flotilla-enter: open_tree wa/sandbox/…: No such file or directory", the
/// sandbox resolving the folder from elsewhere. The folder is made absolute at start.
#[test]
fn a_worker_with_a_relative_work_dir_runs_sandboxed_transfer_tasks() {
    if !sandbox_or_skip() {
        return;
    }
    let c = Cluster::start(0, 1);
    let here = c.root().join("cwd");
    std::fs::create_dir_all(&here).unwrap();
    let mut cmd = std::process::Command::new(kit::BIN);
    cmd.args(["worker", "--server", &c.addr.to_string(), "--cpus", "1"])
        .args(["--gpus", "none", "--name", "rel", "--isolation", "required"])
        .args(["--work-dir", "wa"])
        .current_dir(&here)
        .env("FLOTILLA_TOKEN", &c.token)
        .env_remove("FLOTILLA_SERVER");
    let (_worker, _lines) = kit::spawn_logged(cmd, "rel");
    c.wait_workers(1);
    let id = c.submit_toml(
        "rel.toml",
        "name = \"rel\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\n\
         cmd = [\"sh\", \"-c\", \"echo ok > out.txt\"]\noutputs = [\"out.txt\"]\n",
    );
    kit::assert_succeeded(&c.wait_job(id, Duration::from_secs(60)));
    assert!(
        here.join("wa").join("objects").is_dir(),
        "its folder is where it was started"
    );
}

/// `flotilla run` keeps its state (the admin token, the journal, its worker's folder) in the
/// job folder's `.flotilla`, as a server started there does by default: a sandboxed task
/// sees that folder empty and read-only, through the shared sandbox and through one of its
/// own (a task asking for the network). Before, it read the token and could write the
/// journal (found by a walkthrough of cluster.md).
#[test]
fn a_sandboxed_task_sees_nothing_of_the_state_in_its_job_folder() {
    if !sandbox_or_skip() {
        return;
    }
    let probe = "ls -A .flotilla | wc -l > seen-$0.txt; \
                 if cat .flotilla/token; then echo read >> seen-$0.txt; fi; \
                 if echo x >> .flotilla/journal.log; then echo wrote >> seen-$0.txt; fi; true";
    let toml = format!(
        "name = \"peek\"\n\
         [[task]]\nid = \"shared\"\ncmd = [\"sh\", \"-c\", \"{probe}\", \"shared\"]\n\
         [[task]]\nid = \"own\"\nnetwork = true\ncmd = [\"sh\", \"-c\", \"{probe}\", \"own\"]\n"
    );
    let (dir, out) = kit::run_local(&toml, &["--isolation", "bwrap", "--allow-network"], &[]);
    assert!(out.status.success(), "{out:?}");
    for which in ["shared", "own"] {
        let seen = std::fs::read_to_string(dir.path().join(format!("seen-{which}.txt")))
            .unwrap_or_else(|e| panic!("{which}: {e}"));
        assert_eq!(seen.trim(), "0", "{which}: {seen:?}");
    }
    let token = std::fs::read_to_string(dir.path().join(".flotilla/token")).unwrap();
    assert!(!token.trim().is_empty(), "the run's token is still there");
}
