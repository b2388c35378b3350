//! What goes wrong, end to end through the `flotilla` binary and a real coordinator and
//! worker: failing, timed-out, memory-hungry tasks, missing outputs, retries, malformed job
//! files, a wrong token, cancellation, and captured logs. Each case checks the exit code
//! and that the message names what went wrong.

#![allow(clippy::unwrap_used)]

mod kit;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use flotilla::cluster::state::{JobState, TaskState};
use kit::{assert_succeeded, job_id_of, task, wait_until, Cluster};

const WAIT: Duration = Duration::from_secs(60);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn submit_wait(c: &Cluster, name: &str, toml: &str) -> Output {
    let path = c.job_dir().join(name);
    std::fs::write(&path, toml).unwrap();
    c.cli(&["submit", "--wait", &path.display().to_string()])
}

#[test]
fn failing_task_fails_the_job_names_its_exit_code_and_submit_wait_exits_nonzero() {
    let c = Cluster::start(1, 2);
    let out = submit_wait(
        &c,
        "fail.toml",
        r#"
name = "fail"
[defaults]
retries = 0
[[task]]
id = "bad"
cmd = ["sh", "-c", "echo about to fail; echo 'first line' >&2; echo 'reason: no input.dat' >&2; exit 7"]
[[task]]
id = "next"
after = ["bad"]
cmd = ["touch", "next-ran"]
"#,
    );
    assert!(
        !out.status.success(),
        "submit --wait succeeded on a failing job"
    );
    let job = job_id_of(&out);
    let s = c.wait_job(job, WAIT);
    assert_eq!(s.state, JobState::Failed);
    let bad = task(&s, "bad");
    assert_eq!(bad.state, TaskState::Failed);
    let msg = bad.message.clone().unwrap_or_default();
    assert!(
        msg.contains("code 7"),
        "message {msg:?} does not name the exit code"
    );
    assert!(
        text(&out.stdout).contains("code 7"),
        "submit --wait did not report the failure: {}",
        text(&out.stdout)
    );
    // The summary shows the last lines the task wrote to its stderr: why, without `logs`.
    let summary = text(&out.stdout);
    assert!(
        summary.contains("| reason: no input.dat") && summary.contains("| first line"),
        "{summary}"
    );
    assert_ne!(task(&s, "next").state, TaskState::Done);
    assert!(
        !c.job_dir().join("next-ran").exists(),
        "a dependent of a failed task ran"
    );
    // `flotilla wait` on the finished job agrees.
    let w = c.cli(&["wait", &job.0.to_string()]);
    assert!(!w.status.success());
    // `flotilla status JOB` lists the tasks: each one's state, attempts and message.
    let st = text(&c.cli(&["status", &job.0.to_string()]).stdout);
    let row = |name: &str| {
        st.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name} in:\n{st}"))
            .to_string()
    };
    assert!(st.contains("TASK") && st.contains("ATTEMPTS"), "{st}");
    assert!(
        row("bad").contains("failed") && row("bad").contains("code 7"),
        "{st}"
    );
    assert!(row("next").contains("cancelled"), "{st}");
    // submit names the job it made on stderr at once (the id came only at the end).
    assert!(
        text(&out.stderr).contains(&format!("submitted job {} (fail, 2 tasks)", job.0)),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn task_over_its_timeout_is_killed_and_says_timeout() {
    let c = Cluster::start(1, 2);
    let started = Instant::now();
    let out = submit_wait(
        &c,
        "slow.toml",
        r#"
name = "slow"
[defaults]
retries = 0
[[task]]
id = "sleeper"
cmd = ["sleep", "30"]
timeout = "300ms"
"#,
    );
    assert!(!out.status.success());
    let s = c.wait_job(job_id_of(&out), WAIT);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the task was not stopped at its timeout"
    );
    assert_eq!(s.state, JobState::Failed);
    let t = task(&s, "sleeper");
    assert_eq!(t.state, TaskState::Failed);
    let msg = t.message.clone().unwrap_or_default();
    assert!(
        msg.contains("timeout"),
        "message {msg:?} does not say timeout"
    );
    // Its time counts: the task's wall time and its worker's busy time are the 300 ms it
    // ran (they read 0, and the summary "busy 0 ms, utilization 0%").
    let wall = t.usage.map_or(0.0, |u| u.wall_seconds);
    assert!(wall >= 0.29, "wall {wall}");
    assert_eq!(s.per_worker.len(), 1);
    assert!(s.per_worker[0].busy_s >= 0.29, "{:?}", s.per_worker);
    assert!(
        text(&out.stdout).contains("1 task, busy ") && !text(&out.stdout).contains("busy 0"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn task_over_its_memory_limit_fails() {
    let c = Cluster::start(1, 2);
    let out = submit_wait(
        &c,
        "mem.toml",
        r#"
name = "mem"
[defaults]
retries = 0
resources = { mem = "64MiB" }
[[task]]
id = "small"
cmd = ["python3", "-c", "x = bytearray(1024); open('small-ok', 'w').write('ok')"]
[[task]]
id = "hog"
after = ["small"]
cmd = ["python3", "-c", "x = bytearray(512*1024*1024); open('hog-ok', 'w').write('ok')"]
"#,
    );
    assert!(!out.status.success());
    let s = c.wait_job(job_id_of(&out), WAIT);
    assert_eq!(s.state, JobState::Failed);
    // The same interpreter under the same limit ran (before the hog, which fails the job):
    // the hog failed for its memory.
    assert_eq!(
        task(&s, "small").state,
        TaskState::Done,
        "{:?}",
        task(&s, "small")
    );
    let hog = task(&s, "hog");
    assert_eq!(hog.state, TaskState::Failed);
    assert!(!c.job_dir().join("hog-ok").exists());
    // It failed because the allocation was refused, and its log says so.
    let err = c.cli(&["logs", &s.id.0.to_string(), "hog", "--stderr"]);
    assert!(
        text(&err.stdout).contains("MemoryError"),
        "the hog failed for another reason: {:?}, stderr {:?}",
        hog.message,
        text(&err.stdout)
    );
}

#[test]
fn missing_declared_output_fails_the_task_and_is_named() {
    let c = Cluster::start(1, 2);
    let out = submit_wait(
        &c,
        "outputs.toml",
        r#"
name = "outputs"
[defaults]
retries = 0
[[task]]
id = "forgetful"
cmd = ["sh", "-c", "mkdir -p result && echo ok > result/written.txt"]
outputs = ["result/written.txt", "result/never.txt"]
"#,
    );
    assert!(!out.status.success());
    let s = c.wait_job(job_id_of(&out), WAIT);
    assert_eq!(s.state, JobState::Failed);
    let t = task(&s, "forgetful");
    assert_eq!(t.state, TaskState::Failed);
    let msg = t.message.clone().unwrap_or_default();
    assert!(
        msg.contains("result/never.txt"),
        "message {msg:?} does not name the output"
    );
    assert!(
        !msg.contains("written.txt"),
        "message {msg:?} names an output that exists"
    );
}

#[test]
fn failed_attempt_is_retried_and_the_job_succeeds() {
    let c = Cluster::start(1, 2);
    let out = submit_wait(
        &c,
        "retry.toml",
        r#"
name = "retry"
[[task]]
id = "flaky"
retries = 1
cmd = ["sh", "-c", "echo error-$FLOTILLA_ATTEMPT >&2; if [ -e marker ]; then echo second >> attempts; exit 0; fi; touch marker; echo first >> attempts; exit 1"]
"#,
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let s = c.wait_job(job_id_of(&out), WAIT);
    assert_succeeded(&s);
    let t = task(&s, "flaky");
    assert_eq!(t.attempts, 2);
    assert_eq!(t.failures, 1);
    assert_eq!(s.retries, 1);
    // The first attempt's failure is not the done task's message.
    assert_eq!(t.message, None);
    let attempts = std::fs::read_to_string(c.job_dir().join("attempts")).unwrap();
    assert_eq!(attempts, "first\nsecond\n");
    // Each attempt's output stays readable: the latest by default, an earlier one asked for.
    let n = s.id.0.to_string();
    let latest = c.cli(&["logs", &n, "flaky", "--stderr"]);
    assert_eq!(
        text(&latest.stdout),
        "error-2\n",
        "{}",
        text(&latest.stderr)
    );
    let first = c.cli(&["logs", &n, "flaky", "--stderr", "--attempt", "1"]);
    assert_eq!(text(&first.stdout), "error-1\n", "{}", text(&first.stderr));
    let followed = c.cli(&[
        "logs",
        &n,
        "flaky",
        "--stderr",
        "--attempt",
        "1",
        "--follow",
    ]);
    assert_eq!(
        text(&followed.stdout),
        "error-1\n",
        "{}",
        text(&followed.stderr)
    );
    let none = c.cli(&["logs", &n, "flaky", "--attempt", "3"]);
    assert!(!none.status.success());
    assert!(
        text(&none.stderr)
            .contains("flaky of job 1 has no attempt 3: it has had 2, attempts 1 to 2"),
        "{}",
        text(&none.stderr)
    );
}

#[test]
fn malformed_job_file_is_refused_naming_file_line_and_field() {
    let c = Cluster::start(1, 1);
    // (file, text, line, field): a wrong type, an unknown key.
    let cases = [
        (
            "wrongtype.toml",
            "name = \"bad\"\n\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\ntimeout = 5\n",
            6,
            "timeout",
        ),
        (
            "unknownkey.toml",
            "name = \"bad\"\n\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n\n[[task]]\nid = \"b\"\ncommand = [\"true\"]\n",
            9,
            "command",
        ),
    ];
    for (file, toml, line, field) in cases {
        let path = c.job_dir().join(file);
        std::fs::write(&path, toml).unwrap();
        let p = path.display().to_string();
        let submit = c.cli(&["submit", &p]);
        let run = Command::new(kit::BIN)
            .args(["run", &p, "--gpus", "none", "--cpus", "1"])
            .current_dir(c.job_dir())
            .output()
            .unwrap();
        for (what, out) in [("submit", &submit), ("run", &run)] {
            assert!(!out.status.success(), "flotilla {what} accepted {file}");
            let err = text(&out.stderr);
            assert!(
                err.contains(&format!("{file}:{line}")),
                "flotilla {what}: {err:?} does not name {file}:{line}"
            );
            assert!(
                err.contains(field),
                "flotilla {what}: {err:?} does not name the field {field}"
            );
            // Said once: `submit` printed the refusal twice, its cause repeating it.
            assert_eq!(
                err.matches(&format!("{file}:{line}")).count(),
                1,
                "flotilla {what}: {err:?}"
            );
        }
    }
    // Nothing reached the coordinator; `flotilla run` started nothing either.
    let jobs = c.overview().unwrap().jobs.len();
    assert_eq!(jobs, 0);
    assert!(!c.job_dir().join(".flotilla").exists());
}

#[test]
fn client_with_a_wrong_token_is_refused() {
    let c = Cluster::start(1, 1);
    let path = c.job_dir().join("ok.toml");
    std::fs::write(
        &path,
        "name = \"ok\"\n[[task]]\nid = \"a\"\ncmd = [\"touch\", \"ran\"]\n",
    )
    .unwrap();
    let wrong = "0123456789abcdef-not-the-token";
    for args in [
        vec!["status"],
        vec!["submit", path.to_str().unwrap()],
        vec!["cancel", "1"],
    ] {
        let out = c.cli_with_token(&args, wrong);
        assert!(
            !out.status.success(),
            "flotilla {args:?} with a wrong token succeeded"
        );
        let err = text(&out.stderr).to_lowercase();
        assert!(
            err.contains("token") || err.contains("unauthenticated"),
            "flotilla {args:?}: {err:?} does not say the token was refused"
        );
    }
    // The refused submit did nothing; the right token works.
    assert!(c.overview().unwrap().jobs.is_empty());
    let ok = c.cli(&["status"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));

    // A worker with a wrong token stops, saying why (it retried every 2 s forever); one with
    // an empty token file does not start (it sent the empty token, refused, forever).
    let worker = |token_file: &std::path::Path| {
        Command::new(kit::BIN)
            .args([
                "worker",
                "--cpus",
                "1",
                "--gpus",
                "none",
                "--isolation",
                "none",
            ])
            .arg("--token-file")
            .arg(token_file)
            .env("FLOTILLA_SERVER", c.addr.to_string())
            .env_remove("FLOTILLA_TOKEN")
            .current_dir(c.job_dir())
            .output()
            .unwrap()
    };
    let bad = c.job_dir().join("bad.token");
    std::fs::write(&bad, wrong).unwrap();
    let out = worker(&bad);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("the coordinator refused this worker's token"),
        "{}",
        text(&out.stderr)
    );
    // A tenant's token is a token the coordinator knows, but a tenant may not register
    // workers: the worker stops too (it retried every 2 s forever).
    let out = c.cli(&["admin", "tenant", "add", "lab"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tenant = c.job_dir().join("tenant.token");
    std::fs::write(&tenant, kit::last_line(&out)).unwrap();
    let out = worker(&tenant);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("a tenant token may not register workers")
            && text(&out.stderr).contains("the worker stops"),
        "{}",
        text(&out.stderr)
    );
    // A worker enrolment token given as a provider's: refused, and the worker stops (it
    // joined as the operator's own worker without a word).
    let out = c.cli(&["admin", "worker-token", "add", "--name", "rack"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let enrol = c.job_dir().join("enrol.token");
    std::fs::write(&enrol, kit::last_line(&out)).unwrap();
    let out = Command::new(kit::BIN)
        .args([
            "worker",
            "--cpus",
            "1",
            "--gpus",
            "none",
            "--isolation",
            "none",
        ])
        .arg("--provider-token")
        .arg(&enrol)
        .env("FLOTILLA_SERVER", c.addr.to_string())
        .env_remove("FLOTILLA_TOKEN")
        .current_dir(c.job_dir())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--provider-token: the token is not a provider's")
            && text(&out.stderr).contains("the worker stops"),
        "{}",
        text(&out.stderr)
    );
    let empty = c.job_dir().join("empty.token");
    std::fs::write(&empty, "\n").unwrap();
    let out = worker(&empty);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("empty.token: the token file is empty"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn cancel_stops_a_running_job() {
    let c = Cluster::start(1, 2);
    let job = c.submit_toml(
        "long.toml",
        r#"
name = "long"
[[task]]
id = "long"
cmd = ["sh", "-c", "echo $$ > long.pid; exec sleep 600"]
[[task]]
id = "later"
after = ["long"]
cmd = ["touch", "later-ran"]
"#,
    );
    c.wait_status(job, "the long task to run", WAIT, |s| {
        task(s, "long").state == TaskState::Running
    });
    let pid: String = wait_until("the task's pid file", WAIT, || {
        std::fs::read_to_string(c.job_dir().join("long.pid"))
            .ok()
            .filter(|p| p.ends_with('\n'))
    });
    let pid = pid.trim().to_string();
    let started = Instant::now();
    let out = c.cli(&["cancel", &job.0.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = c.wait_job(job, WAIT);
    assert_eq!(s.state, JobState::Cancelled);
    // Both tasks end cancelled: the running one once its worker has stopped it, the
    // successor at once or, when it was already chained onto that worker behind the
    // running one (Assigned), once the worker has dropped it.
    c.wait_status(job, "both tasks to end cancelled", WAIT, |s| {
        task(s, "long").state == TaskState::Cancelled
            && task(s, "later").state == TaskState::Cancelled
    });
    // The process is gone long before its 600 s (however loaded the machine: it was killed).
    wait_until(
        "the cancelled task's process to end",
        Duration::from_secs(120),
        || {
            let alive = Command::new("kill")
                .args(["-0", &pid])
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            (!alive).then_some(())
        },
    );
    assert!(started.elapsed() < Duration::from_secs(600));
    assert!(!c.job_dir().join("later-ran").exists());
    assert!(
        text(&out.stderr).contains(&format!("cancelled job {}", job.0)),
        "{}",
        text(&out.stderr)
    );
    // Cancelling it again, or a job that succeeded, changes nothing and says so (both said
    // "cancelled job N").
    let again = c.cli(&["cancel", &job.0.to_string()]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("had already finished (cancelled)"),
        "{}",
        text(&again.stderr)
    );
    let done = c.submit_toml(
        "ok.toml",
        "name = \"ok\"\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n",
    );
    assert_eq!(c.wait_job(done, WAIT).state, JobState::Succeeded);
    let late = c.cli(&["cancel", &done.0.to_string()]);
    assert!(late.status.success(), "{}", text(&late.stderr));
    assert!(
        text(&late.stderr).contains("had already finished (succeeded)"),
        "{}",
        text(&late.stderr)
    );
    assert_eq!(c.wait_job(done, WAIT).state, JobState::Succeeded);
}

/// `logs` of a task that has not run says so (it said "wrote nothing" of a task still
/// waiting, and of one its job's cancel left unrun); `--follow` of one waits, and says it
/// never ran when its job ends first.
/// `flotilla retry` runs a failed job again under its id: its failed task and those
/// cancelled with it run, its done ones do not, and `--wait` follows it to success. A job
/// that succeeded, or one that does not exist, is refused with the reason.
#[test]
fn a_failed_job_is_retried_in_place_and_its_done_tasks_are_kept() {
    let c = Cluster::start(1, 2);
    let out = submit_wait(
        &c,
        "sweep.toml",
        "name = \"sweep\"\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"prep\"\ncmd = [\"sh\", \"-c\", \"echo x >> prep.count\"]\n\
         [[task]]\nid = \"sim\"\narray = \"0..3\"\nafter = [\"prep\"]\n\
         cmd = [\"sh\", \"-c\", \"echo x >> sim{i}.count; [ {i} -ne 1 ] || [ -e fixed ]\"]\n\
         [[task]]\nid = \"sum\"\nafter = [\"sim\"]\ncmd = [\"touch\", \"summed\"]\n",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let job = job_id_of(&out);
    let n = job.0.to_string();
    let s = c.wait_job(job, WAIT);
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(task(&s, "sim[1]").state, TaskState::Failed);
    assert_eq!(task(&s, "sum").state, TaskState::Cancelled);
    // `status --state` lists only the tasks in those states.
    let failed = c.cli(&["status", &n, "--state", "failed"]);
    let out = text(&failed.stdout);
    assert!(failed.status.success(), "{}", text(&failed.stderr));
    assert!(
        out.contains("sim[1]") && out.contains("1 task listed (failed)"),
        "{out}"
    );
    assert!(!out.contains("prep ") && !out.contains("sum "), "{out}");
    let both = c.cli(&["status", &n, "--state", "failed,cancelled", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&both.stdout).unwrap();
    let names: Vec<&str> = doc["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"sim[1]") && names.contains(&"sum"),
        "{names:?}"
    );
    assert!(!names.contains(&"prep"), "{names:?}");
    let bad = c.cli(&["status", &n, "--state", "broken"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("task state \"broken\": one of waiting, ready"),
        "{}",
        text(&bad.stderr)
    );
    // A page's next-page command keeps the page size asked for.
    let page = c.cli(&["status", &n, "--tasks-limit", "2"]);
    assert!(
        text(&page.stdout).contains(&format!(
            "tasks 0–1 of 5; the next page: flotilla status {n} --tasks-from 2 --tasks-limit 2"
        )),
        "{}",
        text(&page.stdout)
    );
    let page = c.cli(&[
        "status",
        &n,
        "--state",
        "failed,cancelled",
        "--tasks-limit",
        "1",
    ]);
    assert!(
        text(&page.stdout).contains(&format!(
            "1 task listed (failed or cancelled, of {}); the next page: flotilla status {n} \
             --state failed,cancelled --tasks-from ",
            s.counts.get(TaskState::Failed) + s.counts.get(TaskState::Cancelled)
        )) && text(&page.stdout).trim_end().ends_with("--tasks-limit 1"),
        "{}",
        text(&page.stdout)
    );
    let lines = |f: &str| {
        std::fs::read_to_string(c.job_dir().join(f))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    std::fs::write(c.job_dir().join("fixed"), "").unwrap();
    let again = c.cli(&["retry", &n, "--wait"]);
    let err = text(&again.stderr);
    assert!(again.status.success(), "{err}{}", text(&again.stdout));
    assert!(
        err.contains(&format!("job {n}: ")) && err.contains("again ("),
        "{err}"
    );
    let s = c.wait_job(job, WAIT);
    assert_eq!(s.state, JobState::Succeeded);
    assert!(c.job_dir().join("summed").exists());
    assert_eq!(lines("prep.count"), 1, "the done task ran again");
    assert_eq!(lines("sim1.count"), 2);
    // A sim that had succeeded before the failure stopped the job ran once; one stopped
    // by it ran at most twice (its stopped attempt, then the retry's).
    for f in ["sim0.count", "sim2.count"] {
        assert!((1..=2).contains(&lines(f)), "{f}: {}", lines(f));
    }
    let refused = c.cli(&["retry", &n]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains(&format!("job {n}: nothing to retry: it succeeded")),
        "{}",
        text(&refused.stderr)
    );
    let unknown = c.cli(&["retry", "999"]);
    assert!(!unknown.status.success());
    assert!(
        text(&unknown.stderr).contains("no job 999 (never submitted, or removed"),
        "{}",
        text(&unknown.stderr)
    );
}

#[test]
fn logs_of_a_task_that_never_ran_say_so() {
    let c = Cluster::start(1, 1);
    let go = c.job_dir().join("go");
    let job = c.submit_toml(
        "two.toml",
        &format!(
            "name = \"two\"\n[[task]]\nid = \"first\"\ncmd = [\"sh\", \"-c\", \"while [ ! -e {} ]; do sleep 0.05; done\"]\n\
             [[task]]\nid = \"second\"\nafter = [\"first\"]\ncmd = [\"echo\", \"never\"]\n",
            go.display()
        ),
    );
    let id = job.0.to_string();
    let waiting = c.cli(&["logs", &id, "second"]);
    assert!(waiting.status.success(), "{}", text(&waiting.stderr));
    assert_eq!(text(&waiting.stdout), "");
    assert!(
        text(&waiting.stderr)
            .contains("(second has not started yet; --follow waits for its output)"),
        "{}",
        text(&waiting.stderr)
    );
    let following = c.cli_piped(&["logs", &id, "second", "--follow"]);
    let cancel = c.cli(&["cancel", &id]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    let followed = following.wait_with_output().unwrap();
    let never = format!("(second never ran: job {id} ended (cancelled) before it started)");
    assert!(followed.status.success(), "{}", text(&followed.stderr));
    assert!(
        text(&followed.stderr).contains(&never),
        "{}",
        text(&followed.stderr)
    );
    let ended = c.cli(&["logs", &id, "second", "--stderr"]);
    assert!(
        text(&ended.stderr).contains(&never),
        "{}",
        text(&ended.stderr)
    );
    // The task that ran, silent, until the cancel: it ran, and wrote nothing.
    let first = c.cli(&["logs", &id, "first"]);
    let said = text(&first.stderr);
    assert!(
        said.contains("(first wrote nothing to stdout") && !said.contains("never ran"),
        "{said}"
    );
}

#[test]
fn logs_print_what_the_task_wrote() {
    let c = Cluster::start(1, 1);
    let out = submit_wait(
        &c,
        "talk.toml",
        r#"
name = "talk"
[[task]]
id = "talker"
array = "0..2"
cmd = ["sh", "-c", "echo hello from talker {i}; echo line two; [ {i} -eq 0 ] || echo complaint {i} >&2"]

[[task]]
id = "quiet"
cmd = ["true"]
"#,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = job_id_of(&out).0.to_string();
    let logs = c.cli(&["logs", &job, "talker[1]"]);
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    assert_eq!(text(&logs.stdout), "hello from talker 1\nline two\n");
    assert_eq!(
        text(&logs.stderr),
        "",
        "nothing is added to a task's output"
    );
    let err = c.cli(&["logs", &job, "talker[1]", "--stderr"]);
    assert_eq!(text(&err.stdout), "complaint 1\n");
    // A task that wrote nothing: said so on stderr (it printed nothing at all, found in
    // Kubernetes), stdout left empty.
    let quiet = c.cli(&["logs", &job, "quiet"]);
    assert!(quiet.status.success(), "{}", text(&quiet.stderr));
    assert_eq!(text(&quiet.stdout), "");
    assert!(
        text(&quiet.stderr).contains("quiet wrote nothing to stdout"),
        "{}",
        text(&quiet.stderr)
    );
    // An unknown task is an error that names it.
    let none = c.cli(&["logs", &job, "nobody"]);
    assert!(!none.status.success());
    assert!(
        text(&none.stderr).contains("nobody"),
        "{}",
        text(&none.stderr)
    );
    // An array's name alone: every instance's output, each under a header (it was an
    // error; a gang's ranks had to be read one by one), and with --follow, each line behind
    // its instance's name.
    let array = c.cli(&["logs", &job, "talker"]);
    assert!(array.status.success(), "{}", text(&array.stderr));
    assert_eq!(
        text(&array.stdout),
        "==> talker[0] <==\nhello from talker 0\nline two\n\n\
         ==> talker[1] <==\nhello from talker 1\nline two\n"
    );
    let followed = c.cli(&["logs", &job, "talker", "--follow", "--stderr"]);
    assert!(followed.status.success(), "{}", text(&followed.stderr));
    assert_eq!(text(&followed.stdout), "[talker[1]] complaint 1\n");
    // Those that wrote nothing are counted in one line, not one line each.
    assert_eq!(
        text(&followed.stderr),
        "(1 of the 2 instances of talker wrote nothing to stderr, or have not run)\n"
    );
    let headed = c.cli(&["logs", &job, "talker", "--stderr"]);
    assert_eq!(text(&headed.stdout), "==> talker[1] <==\ncomplaint 1\n");
}

/// WASM tasks through the cluster: a module that prints its argument and writes a file in
/// the job folder (preopened), one that runs out of fuel (fails, no retry helps), and one
/// that exits with a code.
#[test]
fn wasm_tasks_run_sandboxed_with_fuel_and_their_output_is_captured() {
    let c = Cluster::start(1, 2);
    // fd_write(1, iovec, 1, nwritten) prints "hi from wasm\n"; then path_open on the preopened
    // dir (fd 3) creates "made.txt" and writes the same bytes into it.
    let hello = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hi from wasm\n")
  (data (i32.const 64) "made.txt")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 13))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    ;; path_open(dirfd=3, dirflags=0, path=64, len=8, oflags=CREAT|TRUNC (1|8), rights, inheriting, fdflags=0, &fd=100)
    (drop (call $path_open (i32.const 3) (i32.const 0) (i32.const 64) (i32.const 8)
      (i32.const 9) (i64.const 0x1FFFFFFF) (i64.const 0x1FFFFFFF) (i32.const 0) (i32.const 100)))
    (drop (call $fd_write (i32.load (i32.const 100)) (i32.const 0) (i32.const 1) (i32.const 8)))))
"#;
    let spin = r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;
    let exit3 = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start") (call $exit (i32.const 3))))"#;
    let dir = c.job_dir();
    std::fs::write(dir.join("hello.wat"), hello).unwrap();
    std::fs::write(dir.join("spin.wat"), spin).unwrap();
    std::fs::write(dir.join("exit3.wat"), exit3).unwrap();
    let out = submit_wait(
        &c,
        "wasm.toml",
        "name = \"wasm\"\n[[task]]\nid = \"hello\"\nwasm = \"hello.wat\"\noutputs = [\"made.txt\"]\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let job = job_id_of(&out);
    assert_eq!(
        std::fs::read_to_string(dir.join("made.txt")).unwrap(),
        "hi from wasm\n"
    );
    let logs = c.cli(&["logs", &job.0.to_string(), "hello"]);
    assert_eq!(text(&logs.stdout), "hi from wasm\n");
    // Out of fuel: fails, with a message that says so.
    let out = submit_wait(
        &c,
        "spin.toml",
        "name = \"spin\"\n[defaults]\nretries = 0\n[[task]]\nid = \"spin\"\nwasm = { module = \"spin.wat\", fuel = 1000000 }\n",
    );
    assert!(!out.status.success());
    let s = c.status(job_id_of(&out)).unwrap();
    let spin = task(&s, "spin");
    assert_eq!(spin.state, TaskState::Failed);
    assert!(
        spin.message.as_deref().unwrap_or("").contains("fuel"),
        "{spin:?}"
    );
    // proc_exit(3): fails, naming the code.
    let out = submit_wait(
        &c,
        "exit3.toml",
        "name = \"exit3\"\n[defaults]\nretries = 0\n[[task]]\nid = \"exit3\"\nwasm = \"exit3.wat\"\n",
    );
    assert!(!out.status.success());
    let s = c.status(job_id_of(&out)).unwrap();
    let e3 = task(&s, "exit3");
    assert_eq!(e3.state, TaskState::Failed);
    assert!(e3.message.as_deref().unwrap_or("").contains('3'), "{e3:?}");
}

#[test]
fn a_job_larger_than_the_coordinator_takes_is_refused_at_submit_naming_the_limit() {
    // Ten million instances in five lines were once expanded on the coordinator's core
    // thread, stalling every other request.
    let c = Cluster::start(0, 1);
    let out = submit_wait(
        &c,
        "huge.toml",
        r#"
name = "huge"
[[task]]
id = "t"
array = "0..10000000"
cmd = ["true"]
"#,
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("huge.toml"), "{err}");
    assert!(err.contains("10000000 tasks"), "{err}");
    assert!(err.contains("--max-job-tasks"), "{err}");
    assert!(
        c.overview().unwrap().jobs.is_empty(),
        "nothing was accepted"
    );
}

#[test]
fn a_task_that_prints_without_end_is_kept_to_the_log_limit() {
    // Logs were unbounded: one chatty task could fill the coordinator's disk.
    let c = Cluster::start_with(
        1,
        1,
        kit::Opts {
            server_args: vec!["--max-log-bytes".into(), "1000".into()],
            ..kit::Opts::default()
        },
    );
    let out = submit_wait(
        &c,
        "chatty.toml",
        r#"
name = "chatty"
[[task]]
id = "talk"
cmd = ["sh", "-c", "i=0; while [ $i -lt 500 ]; do echo 0123456789; i=$((i+1)); done; echo the end; exit 3"]
"#,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // The end of what it wrote is what says why it failed: kept past the head.
    let job = job_id_of(&out).0.to_string();
    let logs = c.cli(&["logs", &job, "talk"]);
    let shown = text(&logs.stdout);
    assert!(shown.starts_with("0123456789\n0123456789\n"), "{shown}");
    assert!(
        shown.contains(
            "[flotilla: output over the cap of 1000 bytes (--max-log-bytes): its first 750 are above; the rest is dropped but for its last 250 bytes"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("bytes dropped here; the last 250 follow]\n"),
        "{shown}"
    );
    assert!(shown.ends_with("0123456789\nthe end\n"), "{shown}");
    assert!(shown.len() < 1300, "{} bytes kept", shown.len());
}

/// The end kept of an output past the cap outlives a coordinator killed before the
/// attempt ends: saved beside the log, it is written to it when the coordinator starts
/// again (it was only in memory, and a crashed coordinator lost a failed task's last lines).
#[test]
fn the_kept_end_of_an_output_survives_the_coordinator_s_crash() {
    let mut c = Cluster::start_with(
        1,
        1,
        kit::Opts {
            server_args: vec!["--max-log-bytes".into(), "1000".into()],
            ..kit::Opts::default()
        },
    );
    let (job, go) = c.submit_gated(
        "chatty",
        "i=0; while [ $i -lt 500 ]; do echo 0123456789; i=$((i+1)); done; echo the last words",
        "",
    );
    // Saved within seconds of being written, beside the log (job 1's task 0, attempt 1).
    let saved = c.root().join(format!("state/logs/{}/0.1.out.tail", job.0));
    wait_until("the kept end to be saved", WAIT, || {
        std::fs::read_to_string(&saved)
            .ok()
            .filter(|t| t.contains("the last words"))
    });
    c.kill_server();
    c.restart_server();
    std::fs::write(&go, "").unwrap();
    assert_succeeded(&c.wait_job(job, WAIT));
    let shown = text(&c.cli(&["logs", &job.0.to_string(), "t"]).stdout);
    assert!(shown.starts_with("0123456789\n"), "{shown}");
    assert!(shown.contains("0123456789\nthe last words\n"), "{shown}");
    assert!(!saved.exists(), "written and removed");
}

#[test]
fn a_wasm_module_is_held_to_the_workers_maxima() {
    // Modules without a memory maximum grew until the worker died; the job could not be
    // held below what it asked for.
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(1, &["--wasm-max-memory", "1MiB", "--wasm-max-time", "1s"]);
    c.wait_workers(1);
    // Grows its memory by 64 pages (4 MiB) and traps if refused; then spins.
    let grow = r#"(module (memory (export "memory") 1)
  (func (export "_start")
    (if (i32.lt_s (memory.grow (i32.const 64)) (i32.const 0)) (then unreachable))))"#;
    let spin = r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;
    let dir = c.job_dir();
    std::fs::write(dir.join("grow.wat"), grow).unwrap();
    std::fs::write(dir.join("spin.wat"), spin).unwrap();
    // The jobs ask for 64 MiB and a minute: the worker's maxima win.
    let out = submit_wait(
        &c,
        "grow.toml",
        "[defaults]\nretries = 0\n[[task]]\nid = \"grow\"\nwasm = { module = \"grow.wat\", memory = \"64MiB\" }\n",
    );
    assert!(!out.status.success());
    let s = c.wait_job(job_id_of(&out), WAIT);
    assert_eq!(task(&s, "grow").state, TaskState::Failed, "{s:?}");
    let out = submit_wait(
        &c,
        "spin.toml",
        "[defaults]\nretries = 0\n[[task]]\nid = \"spin\"\ntimeout = \"60s\"\nwasm = \"spin.wat\"\n",
    );
    assert!(!out.status.success());
    let s = c.wait_job(job_id_of(&out), WAIT);
    let spin = task(&s, "spin");
    assert_eq!(spin.state, TaskState::Failed, "{spin:?}");
    let m = spin.message.clone().unwrap_or_default();
    assert!(m.contains("timeout of 1s"), "{m}");
}

/// `flotilla run job.toml` in `dir` on `cpus` CPUs and no GPU, with `more` arguments, its
/// FLOTILLA_HOME inside `dir`.
fn local_run(dir: &std::path::Path, cpus: &str, more: &[&str]) -> Command {
    let mut cmd = Command::new(kit::BIN);
    cmd.args(["run", "job.toml", "--cpus", cpus, "--gpus", "none"])
        .args(more)
        .current_dir(dir)
        .env("FLOTILLA_HOME", dir.join(".home"));
    cmd
}

/// `flotilla run` in `dir` of a job `long` of two tasks that sleep, on one CPU, once its
/// first task has started; its stderr piped.
fn long_run(dir: &std::path::Path) -> std::process::Child {
    run_until(
        dir,
        "name = \"long\"\n[[task]]\nid = \"long\"\narray = \"0..2\"\ncmd = [\"sh\", \"-c\", \"echo $$ > long{i}.pid; exec sleep 600\"]\n",
        "long0.pid",
    )
}

/// `flotilla run` in `dir` of the job `toml` (on one CPU) once a task has written its pid
/// to `pid_file`; its stderr piped.
fn run_until(dir: &std::path::Path, toml: &str, pid_file: &str) -> std::process::Child {
    std::fs::write(dir.join("job.toml"), toml).unwrap();
    let run = local_run(dir, "1", &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        &format!("a task of the run to write {pid_file}"),
        WAIT,
        || {
            std::fs::read_to_string(dir.join(pid_file))
                .ok()
                .filter(|p| p.ends_with('\n'))
        },
    );
    run
}

/// A sweep with `keep_going = true` runs every point that does not need a failed one: the
/// failed points are listed, what needs them is not run, and `run` fails at the end. A
/// point failing before a task chained after it on the same worker is handled too. Once
/// the cause is fixed, `run --resume` runs again only what failed or was not run.
#[test]
fn a_job_that_keeps_going_runs_the_rest_and_fails_at_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"kg\"\nkeep_going = true\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"sim\"\narray = \"0..6\"\ncmd = [\"sh\", \"-c\", \"echo x >> ran{i}; [ {i} -ne 3 ] || [ -e fixed ]\"]\n\
         [[task]]\nid = \"reduce\"\nafter = [\"sim\"]\ncmd = [\"touch\", \"reduced\"]\n\
         [[task]]\nid = \"first\"\ncmd = [\"test\", \"-e\", \"fixed\"]\n\
         [[task]]\nid = \"second\"\nafter = [\"first\"]\ncmd = [\"true\"]\n",
    )
    .unwrap();
    let out = local_run(dir, "2", &["--json"]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for i in [0, 1, 2, 4, 5] {
        assert!(
            dir.join(format!("ran{i}")).exists(),
            "sim[{i}] did not run: {err}"
        );
    }
    assert!(
        !dir.join("reduced").exists(),
        "reduce ran after a failed sim"
    );
    let doc: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(doc["state"], "failed", "{doc}");
    let state = |name: &str| {
        doc["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| (t["state"].clone(), t["message"].clone()))
            .unwrap()
    };
    assert_eq!(state("sim[4]").0, "done");
    assert_eq!(state("sim[3]").0, "failed");
    assert_eq!(state("first").0, "failed");
    for t in ["reduce", "second"] {
        assert_eq!(
            state(t),
            (
                "cancelled".into(),
                "not run: it needs a task that failed".into()
            ),
            "{t}"
        );
    }
    // Fixed, resumed: the two that failed and the two not run run; no done one again.
    std::fs::write(dir.join("fixed"), "").unwrap();
    let resumed = local_run(dir, "2", &["--resume"]).output().unwrap();
    let err = text(&resumed.stderr);
    assert!(resumed.status.success(), "{err}{}", text(&resumed.stdout));
    assert!(
        err.contains(
            "resuming job 1 (kg), which ended failed: 4 failed or cancelled tasks run again, \
             its 5 done kept"
        ),
        "{err}"
    );
    assert!(dir.join("reduced").exists(), "{err}");
    let runs = |i: u32| {
        std::fs::read_to_string(dir.join(format!("ran{i}")))
            .unwrap()
            .lines()
            .count()
    };
    for i in [0, 1, 2, 4, 5] {
        assert_eq!(runs(i), 1, "sim[{i}] ran again");
    }
    assert_eq!(runs(3), 2);
    // Edited since: said. Another file of the same name in the folder is another job.
    let written = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    std::fs::write(dir.join("job.toml"), format!("{written}# edited\n")).unwrap();
    let again = local_run(dir, "2", &["--resume", "--json"])
        .output()
        .unwrap();
    let err = text(&again.stderr);
    assert!(again.status.success(), "{err}");
    assert!(
        err.contains("succeeded already")
            && err.contains("the job file changed since it was submitted"),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(doc["state"], "succeeded", "--json prints the job's status");
    std::fs::write(dir.join("other.toml"), &written).unwrap();
    let other = Command::new(kit::BIN)
        .args([
            "run",
            "other.toml",
            "--cpus",
            "2",
            "--gpus",
            "none",
            "--resume",
        ])
        .current_dir(dir)
        .env("FLOTILLA_HOME", dir.join(".home"))
        .output()
        .unwrap();
    let err = text(&other.stderr);
    assert!(
        err.contains("--resume: no job of other.toml in"),
        "resumed another file's job: {err}"
    );
    assert_eq!(runs(0), 2, "other.toml runs anew");
}

/// `flotilla run` in `dir` of a job `short` of one task that ends at once.
fn short_run(dir: &std::path::Path) -> Output {
    std::fs::write(
        dir.join("job.toml"),
        "name = \"short\"\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n",
    )
    .unwrap();
    local_run(dir, "1", &[]).output().unwrap()
}

/// `flotilla run` killed mid-job leaves that job running in its state folder; the next run
/// there cancels it and says so, instead of resuming it unannounced before its own job.
#[test]
fn a_run_after_an_interrupted_one_cancels_its_leftover_job_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut first = long_run(dir);
    first.kill().unwrap();
    first.wait().unwrap();

    let second = short_run(dir);
    let err = text(&second.stderr);
    assert!(second.status.success(), "{err}{}", text(&second.stdout));
    assert!(
        err.contains("cancelled job 1 (long), left unfinished by an earlier run"),
        "{err}"
    );
    assert!(err.contains("0 of 2 tasks done"), "{err}");
    assert!(
        text(&second.stdout).contains("short"),
        "{}",
        text(&second.stdout)
    );
}

/// Ctrl-C (SIGINT) of `flotilla run` says what it leaves: its job unfinished (with what was
/// done) and how to go on with it; it exits 130 as the default action did (which ended it
/// silently). `run --resume` goes on with that job: its done task is not run again, its
/// stopped one is. Ctrl-C of `flotilla wait` says the job goes on, and it does.
#[test]
fn ctrl_c_of_run_leaves_a_job_to_resume_and_of_wait_says_the_job_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let run = run_until(
        dir,
        "name = \"resumable\"\n[[task]]\nid = \"a\"\ncmd = [\"sh\", \"-c\", \"echo x >> a.count\"]\n\
         [[task]]\nid = \"b\"\nafter = [\"a\"]\ncmd = [\"sh\", \"-c\", \"echo $$ > b.pid; while [ ! -e go ]; do sleep 0.05; done; echo y >> b.count\"]\n",
        "b.pid",
    );
    // SAFETY: kill(2) on the child this test started and has not reaped.
    unsafe { libc::kill(run.id() as libc::pid_t, libc::SIGINT) };
    let out = run.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains(
            "interrupted: job 1 left unfinished (1 of 2 tasks done), its running tasks stopped: \
             `flotilla run --resume job.toml` goes on with it"
        ),
        "{err}"
    );
    std::fs::write(dir.join("go"), "").unwrap();
    let resumed = local_run(dir, "1", &["--resume"]).output().unwrap();
    let err = text(&resumed.stderr);
    assert!(resumed.status.success(), "{err}");
    assert!(
        err.contains("resuming job 1 (resumable), 1 of 2 tasks done"),
        "{err}"
    );
    let lines = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(lines("a.count"), 1, "the done task ran again");
    assert_eq!(lines("b.count"), 1);
    let again = local_run(dir, "1", &["--resume"]).output().unwrap();
    let err = text(&again.stderr);
    assert!(again.status.success(), "{err}");
    assert!(
        err.contains("--resume: job 1 (resumable) in ")
            && err.contains("succeeded already, all 2 tasks done: nothing to run"),
        "{err}"
    );
    assert_eq!(lines("a.count"), 1, "a succeeded job is not run again");
    let anew = local_run(dir, "1", &[]).output().unwrap();
    assert!(anew.status.success(), "{}", text(&anew.stderr));
    assert_eq!(lines("a.count"), 2, "a plain run runs the job anew");

    let c = Cluster::start(1, 1);
    let (job, go) = c.submit_gated("gated", "", "");
    let mut wait = c.cli_piped(&["wait", &job.0.to_string()]);
    // Kept open to the end: a closed pipe would end `wait` before the signal does.
    let mut progress = std::io::BufReader::new(wait.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut progress, &mut first).unwrap();
    assert!(first.contains("0/1 tasks done"), "{first}");
    // SAFETY: as above.
    unsafe { libc::kill(wait.id() as libc::pid_t, libc::SIGINT) };
    let out = wait.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains(&format!(
            "interrupted: job {n} goes on running on the coordinator; `flotilla wait {n}` \
             follows it again, `flotilla cancel {n}` stops it",
            n = job.0
        )),
        "{err}"
    );
    drop(progress);
    // A running task's status says how long it has run so far (its WALL was blank).
    let ran = wait_until("the task to run", WAIT, || {
        let s = c.status(job)?;
        let t = s.tasks.first()?;
        (t.state == TaskState::Running).then_some(t.running_s)?
    });
    assert!(ran >= 0.0, "{ran}");
    let shown = text(&c.cli(&["status", &job.0.to_string()]).stdout);
    assert!(shown.contains(" running "), "{shown}");
    std::fs::write(&go, "").unwrap();
    let s = c.wait_job(job, WAIT);
    assert_succeeded(&s);
    assert_eq!(s.tasks[0].running_s, None, "only while it runs");
}

/// `flotilla run` has one worker, this machine's: a task larger than it offers would wait
/// forever ("0/2 tasks done", no word why). The run refuses the job before anything runs
/// (it ran the tasks before the large one first, a whole sweep before its reduce), naming
/// the task, the line and what it needs; so is a gang whose members cannot fit side by side
/// (it was found only once ready, after what came before it had run), with --dry-run too.
#[test]
fn run_of_a_task_larger_than_the_machine_fails_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"big\"\n[[task]]\nid = \"small\"\ncmd = [\"touch\", \"small-ran\"]\n\
         [[task]]\nid = \"huge\"\nafter = [\"small\"]\nresources = { cpus = 64 }\ncmd = [\"true\"]\n",
    )
    .unwrap();
    for more in [&[][..], &["--json"][..]] {
        let out = local_run(dir, "2", more).output().unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("job.toml:8: task \"huge\"")
                && err.contains("needs cpus=64")
                && err.contains("it can never run on this machine's worker, so nothing was run"),
            "{err}"
        );
        assert_eq!(text(&out.stdout), "", "{more:?}");
        assert!(!dir.join("small-ran").exists(), "a task ran");
        assert!(!dir.join(".flotilla").exists(), "a state folder was made");
    }

    // A gang of three on two CPUs: each member fits, not all three at once. Refused before
    // anything runs, and by --dry-run (it ran what came before, then was cancelled once
    // ready; a dry run said nothing).
    std::fs::write(
        dir.join("job.toml"),
        "name = \"gang\"\n[[task]]\nid = \"g\"\ngroup = { size = 3 }\ncmd = [\"true\"]\n",
    )
    .unwrap();
    for more in [&["--json"][..], &["--dry-run"]] {
        let out = local_run(dir, "2", more).output().unwrap();
        assert!(!out.status.success(), "{more:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("task \"g\": field \"group\": a gang of 3 needs cpus=1 for each member")
                && err.contains("it can never run on this machine's worker"),
            "{more:?}: {err}"
        );
    }

    // A task that needs the network: refused the same way, and run with --allow-network.
    std::fs::write(
        dir.join("job.toml"),
        "name = \"net\"\n[[task]]\nid = \"fetch\"\nnetwork = true\ncmd = [\"true\"]\n",
    )
    .unwrap();
    let run = |more: &[&str]| local_run(dir, "1", more).output().unwrap();
    let without = run(&[]);
    assert!(!without.status.success());
    assert!(
        text(&without.stderr).contains("needs cpus=1 network=1"),
        "{}",
        text(&without.stderr)
    );
    let with = run(&["--allow-network"]);
    assert!(with.status.success(), "{}", text(&with.stderr));
}

/// A job that fails while another of its tasks runs: that task is being stopped, and the
/// summary says so ("1 running" in a failed job read as if it went on).
#[test]
fn the_summary_of_a_job_that_failed_mid_run_calls_its_running_tasks_stopping() {
    let c = Cluster::start(1, 2);
    let out = submit_wait(
        &c,
        "mid.toml",
        r#"
name = "mid"
[defaults]
retries = 0
[[task]]
id = "long"
cmd = ["sh", "-c", "trap '' TERM; echo $$ > long.pid; exec sleep 30"]
[[task]]
id = "bad"
cmd = ["sh", "-c", "while [ ! -s long.pid ]; do sleep 0.05; done; exit 3"]
"#,
    );
    assert!(!out.status.success());
    let summary = text(&out.stdout);
    let tasks = summary
        .lines()
        .find(|l| l.trim_start().starts_with("tasks:"))
        .unwrap_or_else(|| panic!("no tasks line in:\n{summary}"));
    assert!(tasks.contains("1 failed"), "{summary}");
    assert!(
        tasks.contains("1 stopping (running)") || tasks.contains("1 cancelled"),
        "{summary}"
    );
    assert!(
        !tasks.replace("stopping (running)", "").contains("running"),
        "{summary}"
    );
}

#[test]
fn a_server_whose_port_is_taken_says_so_and_leaves_no_state_behind() {
    let dir = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let state = dir.path().join("state");
    for flag in ["--listen", "--http-listen"] {
        let mut cmd = Command::new(kit::BIN);
        cmd.args(["server", "--state"]).arg(&state);
        if flag == "--http-listen" {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        let out = cmd.args([flag, &addr]).output().unwrap();
        assert!(!out.status.success(), "{flag}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("cannot listen on {addr} ({flag})"))
                && err.contains("in use")
                && err.contains("another process listens there"),
            "{flag}: {err}"
        );
        assert!(
            !state.exists(),
            "{flag}: a state folder for a server that never ran"
        );
    }
    // A worker's data port: the flag is named too.
    let c = Cluster::start(0, 1);
    let out = c
        .cli_command(&["worker", "--cpus", "1", "--data-listen", &addr], &c.token)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {addr} (--data-listen)")),
        "{err}"
    );
}

/// A failed `flotilla run` of a transfer job gathered nothing: its summary does not point at
/// "outputs in DIR" (a shared job's done tasks left theirs there, so it still does).
#[test]
fn a_failed_transfer_run_points_at_no_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (staging, points) in [("transfer", false), ("shared", true)] {
        std::fs::write(
            dir.join("job.toml"),
            format!(
                "name = \"f\"\nstaging = \"{staging}\"\n[[task]]\nid = \"bad\"\nretries = 0\n\
                 cmd = [\"false\"]\n"
            ),
        )
        .unwrap();
        let out = local_run(dir, "1", &[]).output().unwrap();
        assert!(!out.status.success());
        let summary = text(&out.stdout);
        assert!(summary.contains("1 failed"), "{summary}");
        assert_eq!(
            summary.contains("outputs in"),
            points,
            "{staging}: {summary}"
        );
    }
}

/// `submit`, `wait` and `retry` speak JSON for scripts: one line on stdout each, the
/// submission or the job's status document at its end (its progress on stderr).
#[test]
fn submit_wait_and_retry_print_one_json_line() {
    let c = Cluster::start(1, 2);
    let path = c.job_dir().join("flaky.toml");
    std::fs::write(
        &path,
        "name = \"flaky\"\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"a\"\ncmd = [\"true\"]\n\
         [[task]]\nid = \"b\"\nafter = [\"a\"]\ncmd = [\"test\", \"-e\", \"fixed\"]\n",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let json = |out: &Output| -> serde_json::Value {
        let text = text(&out.stdout);
        assert_eq!(text.lines().count(), 1, "one line: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    let submitted = c.cli(&["submit", file, "--json"]);
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    let doc = json(&submitted);
    assert_eq!(doc["name"], "flaky");
    assert_eq!(doc["tasks"], 2);
    let n = doc["job"].as_u64().expect("a job id").to_string();
    let waited = c.cli(&["wait", &n, "--json"]);
    assert_eq!(waited.status.code(), Some(1), "{}", text(&waited.stderr));
    let doc = json(&waited);
    assert_eq!(doc["state"], "failed", "{doc}");
    std::fs::write(c.job_dir().join("fixed"), "").unwrap();
    let retried = c.cli(&["retry", &n, "--json"]);
    assert!(retried.status.success(), "{}", text(&retried.stderr));
    let doc = json(&retried);
    assert_eq!(doc["tasks_again"], 1, "{doc}");
    assert_eq!(doc["done_kept"], 1, "{doc}");
    let waited = c.cli(&["wait", &n, "--json"]);
    assert!(waited.status.success(), "{}", text(&waited.stderr));
    assert_eq!(json(&waited)["state"], "succeeded");
    let both = c.cli(&["submit", file, "--wait", "--json"]);
    assert!(both.status.success(), "{}", text(&both.stderr));
    let doc = json(&both);
    assert_eq!(doc["state"], "succeeded", "{doc}");
    let id = doc["id"].as_u64().expect("the job's id");
    assert_ne!(id.to_string(), n, "a new job: {doc}");
}

/// A job none of whose tasks ran shows no makespan in the overview (it showed the time it
/// had waited as one), and the worker table shows memory.
#[test]
fn the_overview_shows_no_makespan_for_a_job_that_never_ran() {
    let c = Cluster::start(1, 1);
    let job = c.submit_toml(
        "big.toml",
        "name = \"toobig\"\n[[task]]\nid = \"t\"\nresources = { cpus = 8 }\ncmd = [\"true\"]\n",
    );
    let doc = wait_until("the job in the overview", WAIT, || {
        let out = c.cli(&["status", "--json"]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        doc["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["name"] == "toobig")
            .cloned()
    });
    assert_eq!(doc["ran"], false, "{doc}");
    let table = text(&c.cli(&["status"]).stdout);
    let row = table
        .lines()
        .find(|l| l.contains("toobig"))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert!(cells.contains(&"-"), "no makespan: {row}");
    assert!(
        table.contains("MEM USED") && table.contains(" of "),
        "{table}"
    );
    let out = c.cli(&["cancel", &job.0.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A finished `flotilla run` with more failures than its summary lists points at a command
/// that works: `status --run-state DIR` reads the run's state (it pointed at `flotilla
/// status 1 --state failed`, which needs a coordinator that is gone with the run).
#[test]
fn a_run_s_status_is_read_from_its_state_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"many\"\nkeep_going = true\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"t\"\narray = \"0..14\"\ncmd = [\"sh\", \"-c\", \"[ {i} -lt 2 ]\"]\n",
    )
    .unwrap();
    let out = local_run(dir, "2", &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let summary = text(&out.stdout);
    let state = dir.join(".flotilla");
    let hint = format!(
        "… and 2 more failed: `flotilla status 1 --state failed --run-state {}` lists them all",
        state.display()
    );
    assert!(summary.contains(&hint), "{summary}");
    let listed = Command::new(kit::BIN)
        .args(["status", "1", "--state", "failed", "--run-state"])
        .arg(&state)
        .current_dir(dir)
        .env("FLOTILLA_HOME", dir.join(".home"))
        .output()
        .unwrap();
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let shown = text(&listed.stdout);
    assert!(shown.contains("12 tasks listed (failed)"), "{shown}");
    assert!(
        shown.contains("t[13]") && !shown.contains("t[1] "),
        "{shown}"
    );
}
