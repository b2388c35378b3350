//! The command line as a user meets it: the version names its commit, shell completions,
//! the generated reference in docs/cli.md kept current, every job file in the docs parsed by
//! the real parser, tables, and clients that wait for a coordinator coming back.

#![allow(clippy::unwrap_used)]

mod kit;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kit::{Cluster, BIN};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn flotilla(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn version_names_the_commit() {
    let (ok, out, _) = flotilla(&["--version"]);
    assert!(ok);
    assert!(
        out.starts_with(&format!("flotilla {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F _flotilla"),
        ("zsh", "#compdef flotilla"),
        ("fish", "complete -c flotilla"),
    ] {
        let (ok, out, err) = flotilla(&["completions", shell]);
        assert!(ok, "{shell}: {err}");
        assert!(out.contains(marker), "{shell}: no {marker:?}");
        assert!(out.contains("submit"), "{shell}: subcommands completed");
    }
}

#[test]
fn docs_cli_md_is_the_generated_reference() {
    let (ok, generated, err) = flotilla(&["cli-reference"]);
    assert!(ok, "{err}");
    let path = repo().join("docs/cli.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: regenerate it with `cargo run -p flotilla -- cli-reference > docs/cli.md`",
        path.display()
    );
    // Every visible command is in it.
    for cmd in [
        "flotilla run",
        "flotilla admin tenant add",
        "flotilla completions",
    ] {
        assert!(generated.contains(&format!("## {cmd}\n")), "{cmd}");
    }
}

/// The fenced TOML blocks of a Markdown file, with the line each starts on.
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.starts_with("```toml") => current = Some((i + 2, String::new())),
            Some(_) if fence.starts_with("```") => blocks.push(current.take().unwrap()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```toml block");
    blocks
}

#[test]
fn every_job_file_in_the_docs_parses() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.push(repo().join("README.md"));
    files.sort();
    let mut parsed = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, block) in toml_blocks(&text) {
            let at = format!("{}:{line}", file.display());
            let spec = flotilla::core::parse_job(&block, &at)
                .unwrap_or_else(|e| panic!("{at}: the docs' job file does not parse: {e}"));
            spec.expand()
                .unwrap_or_else(|e| panic!("{at}: the docs' job file does not expand: {e}"));
            parsed += 1;
        }
    }
    assert!(
        parsed >= 10,
        "only {parsed} job files in the docs: the reference lost its examples?"
    );
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    for top in ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"] {
        files.push(repo().join(top));
    }
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let dir = file.parent().unwrap();
        // [text](target): relative targets only (no scheme, not an in-page anchor).
        for part in text.split("](").skip(1) {
            let Some(end) = part.find(')') else { continue };
            let target = &part[..end];
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let path = target.split('#').next().unwrap();
            assert!(
                dir.join(path).exists(),
                "{}: the link {target:?} leads nowhere",
                file.display()
            );
            assert!(
                !path.contains("shared/"),
                "{}: {target:?} points outside the repository",
                file.display()
            );
        }
    }
}

#[test]
fn a_client_waits_for_a_restarting_coordinator_and_says_where_it_looked() {
    let mut c = Cluster::start(1, 1);
    let job = c.submit_toml(
        "quick.toml",
        "name = \"quick\"\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n",
    );
    c.wait_job(job, Duration::from_secs(60));
    c.kill_server();

    // With nobody listening and little patience: a clear error naming the address.
    let out = c.cli(&["status", "--connect-timeout", "200ms"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&c.addr.to_string()) && err.contains("FLOTILLA_SERVER"),
        "{err}"
    );

    // `flotilla wait` started while the coordinator is down finishes once it is back.
    let wait = Command::new(BIN)
        .args(["wait", &job.0.to_string(), "--connect-timeout", "2m"])
        .current_dir(c.job_dir())
        .env("FLOTILLA_SERVER", c.addr.to_string())
        .env("FLOTILLA_TOKEN", &c.token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.restart_server();
    // It gives up on its own after its --connect-timeout: it cannot hang the test.
    let out = wait.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("succeeded"));

    // The overview is a table with its headers.
    let out = c.cli(&["status"]);
    let table = String::from_utf8_lossy(&out.stdout);
    for h in [
        "JOB",
        "DONE/TOTAL",
        "WORKER",
        "HOST",
        "CPUS USED",
        "MEM USED",
        "HW CLASS",
    ] {
        assert!(table.contains(h), "{h} missing from\n{table}");
    }
    assert!(table.contains("quick"), "{table}");

    // No token anywhere: the error says where it looked.
    let out = Command::new(BIN)
        .args(["status"])
        .current_dir(c.job_dir())
        .env("FLOTILLA_SERVER", c.addr.to_string())
        .env_remove("FLOTILLA_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(".flotilla/token") && err.contains("FLOTILLA_TOKEN"),
        "{err}"
    );
}

#[test]
fn log_lines_can_be_json() {
    let (_dir, out) = kit::run_local(
        "name = \"j\"\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n",
        &["--log-format", "json"],
        &[("FLOTILLA_LOG", "info")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let logs: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(!logs.is_empty(), "no JSON log lines in\n{err}");
    for l in &logs {
        assert!(l["level"].is_string() && l["fields"].is_object(), "{l}");
    }
    assert!(
        logs.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("coordinator listening"))),
        "{err}"
    );
}

/// Runs `flotilla ARGS` against `c` with its standard output a pipe whose reader has already
/// gone (as `flotilla status | head` once `head` has its lines): every write fails.
fn into_closed_pipe(c: &Cluster, args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    c.cli_command(args, &c.token)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let c = Cluster::start(1, 1);
    let job = c.submit_toml(
        "quick.toml",
        "name = \"quick\"\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n",
    );
    c.wait_job(job, Duration::from_secs(60));
    let id = job.0.to_string();
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["status", id.as_str()],
        vec!["wait", id.as_str()],
        vec!["devices"],
        vec!["admin", "token", "list"],
        vec!["completions", "bash"],
    ] {
        let out = into_closed_pipe(&c, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.is_empty(),
            "flotilla {args:?} into a closed pipe: {:?}, stderr:\n{err}",
            out.status
        );
    }
    // A real failure still says so: the pipe is not an excuse for hiding errors.
    let out = into_closed_pipe(&c, &["status", "no-such-job"]);
    assert!(!out.status.success(), "{out:?}");
}

/// `--pod-deletion-cost` outside a pod: the coordinator does not start, and says why.
#[test]
fn pod_deletion_costs_outside_a_pod_are_refused_naming_what_is_missing() {
    let state = tempfile::tempdir().unwrap();
    let refused = |env: &[(&str, String)]| {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--pod-deletion-cost",
            "--state",
        ])
        .arg(state.path())
        .env_remove("KUBERNETES_SERVICE_HOST");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{err}");
        err
    };
    let err = refused(&[]);
    assert!(
        err.contains("--pod-deletion-cost") && err.contains("KUBERNETES_SERVICE_HOST"),
        "{err}"
    );
    let none = state.path().join("none").display().to_string();
    let err = refused(&[
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT", "443".into()),
        ("FLOTILLA_KUBE_SERVICE_ACCOUNT", none),
    ]);
    assert!(err.contains("none/namespace"), "{err}");
}

/// A failed job's commands exit 1 even when their standard output is a pipe whose reader
/// has gone (`flotilla run job.toml | head -1`): the closed pipe ends the printing, not the
/// outcome (they exited 0). And the summary is final: tasks stopped because the job failed
/// show as cancelled, not "stopping".
#[test]
fn a_failed_jobs_exit_status_survives_a_closed_pipe_and_its_summary_is_final() {
    let c = Cluster::start(1, 2);
    let toml = "name = \"fails\"\n[[task]]\nid = \"bad\"\ncmd = [\"sh\", \"-c\", \"exit 3\"]\n\
                [[task]]\nid = \"slow\"\ncmd = [\"sleep\", \"300\"]\n";
    let file = c.job_dir().join("fails.toml");
    std::fs::write(&file, toml).unwrap();
    let path = file.display().to_string();
    let out = into_closed_pipe(&c, &["submit", &path, "--wait"]);
    assert_eq!(out.status.code(), Some(1), "submit --wait: {out:?}");
    let job = c.submit(&file);
    c.wait_job(job, Duration::from_secs(120));
    let out = into_closed_pipe(&c, &["wait", &job.0.to_string()]);
    assert_eq!(out.status.code(), Some(1), "wait: {out:?}");
    let run = |stdout: Stdio| {
        Command::new(BIN)
            .args(["run", "--cpus", "2", &path])
            .current_dir(c.job_dir())
            .env_remove("FLOTILLA_SERVER")
            .env("FLOTILLA_HOME", c.job_dir().join("home"))
            .stdout(stdout)
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = run(Stdio::from(writer));
    assert_eq!(out.status.code(), Some(1), "run: {out:?}");
    let out = run(Stdio::piped());
    assert_eq!(out.status.code(), Some(1), "run: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("1 cancelled, 1 failed") && !text.contains("stopping"),
        "{text}"
    );
}

/// A worker without `--work-dir` works in a folder of its own under the temporary
/// directory, and removes it when it exits (SIGTERM), as it does when the coordinator
/// refuses it at once; the folders of workers that were killed go when the next one starts.
/// A folder given is the worker's alone while it runs, and the attempt folders an earlier
/// worker left there go when the next starts.
#[test]
fn a_workers_default_work_folder_goes_with_it() {
    let c = Cluster::start(0, 1);
    let tmp = tempfile::tempdir().unwrap();
    let worker = |token: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["worker", "--server", &c.addr.to_string(), "--cpus", "1"])
            .args(["--gpus", "none", "--isolation", "none", "--name", "scratch"])
            .env("FLOTILLA_TOKEN", token)
            .env("TMPDIR", tmp.path());
        cmd
    };
    let leftovers = || std::fs::read_dir(tmp.path()).unwrap().count();
    // A killed worker's folder: its process is gone.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let killed = tmp.path().join(format!("flotilla-worker-{dead}"));
    std::fs::create_dir_all(killed.join("objects")).unwrap();
    std::fs::write(killed.join("objects").join("x"), "left").unwrap();
    // Its owner: this host and boot (a folder of another host's is kept).
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let here = format!(
        "{} {}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id")
    );
    std::fs::write(killed.join("owner"), &here).unwrap();
    let elsewhere = tmp
        .path()
        .join(format!("flotilla-worker-{}", dead + 1_000_000));
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("owner"), "another-host 0").unwrap();
    let (mut w, lines) = kit::spawn_logged(worker(&c.token), "scratch");
    c.wait_workers(1);
    assert!(!killed.exists(), "a killed worker's folder is left");
    assert!(elsewhere.exists(), "another host's folder was removed");
    std::fs::remove_dir_all(&elsewhere).unwrap();
    // It says on its terminal that it registered (tracing's info lines are off by default).
    let said = lines
        .iter()
        .find(|l| l.contains("registered"))
        .expect("the worker said nothing of its registration");
    assert!(
        said.starts_with("flotilla worker scratch: registered with ")
            && said.contains(" as w1 (cpus=1 gpus=0 mem="),
        "{said}"
    );
    let job = c.submit_toml(
        "hello.toml",
        "name = \"hello\"\n[[task]]\nid = \"a\"\ncmd = [\"echo\", \"hi\"]\n",
    );
    kit::assert_succeeded(&c.wait_job(job, Duration::from_secs(60)));
    assert_eq!(leftovers(), 1, "the worker's folder while it runs");
    w.signal(libc::SIGTERM);
    kit::wait_until("the worker to exit", Duration::from_secs(120), || {
        w.exited().then_some(())
    });
    assert_eq!(leftovers(), 0, "left behind in {}", tmp.path().display());
    let (mut w, _lines) = kit::spawn_logged(worker("not-a-token"), "refused");
    kit::wait_until(
        "the refused worker to exit",
        Duration::from_secs(120),
        || w.exited().then_some(()),
    );
    assert_eq!(leftovers(), 0, "left behind by a refused worker");
    // A folder given is kept, unless --remove-work-dir (as `flotilla alloc`'s workers run).
    let given = tmp.path().join("given");
    let left = given.join("sandbox").join("1-0-1");
    std::fs::create_dir_all(&left).unwrap();
    let mut cmd = worker(&c.token);
    cmd.arg("--work-dir").arg(&given).arg("--remove-work-dir");
    let (mut w, _lines) = kit::spawn_logged(cmd, "given");
    kit::wait_until(
        "the attempt folder left there to go",
        Duration::from_secs(120),
        || (!left.exists()).then_some(()),
    );
    // A second worker on the same folder is refused, naming it.
    let mut second = worker(&c.token);
    second
        .arg("--work-dir")
        .arg(&given)
        .arg("--remove-work-dir");
    let out = second.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("another worker uses this work folder"),
        "{err}"
    );
    assert!(
        given.join(".lock").exists(),
        "the refused worker removed the folder"
    );
    w.signal(libc::SIGTERM);
    kit::wait_until("the worker to exit", Duration::from_secs(120), || {
        w.exited().then_some(())
    });
    assert!(!given.exists(), "{} left behind", given.display());
}

/// `flotilla submit` checks the job file before it connects: a mistake is named at once,
/// with the path as given, even with no coordinator up (it waited 10 s for one, then said
/// only that none answered).
#[test]
fn submit_names_a_bad_job_file_before_looking_for_a_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "name = \"x\"\n[[task]]\nid = \"a\"\ncmd = \"python3 x.py\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["submit", "--connect-timeout", "60s"])
        .arg(&file)
        .env("FLOTILLA_SERVER", "127.0.0.1:1")
        .env("FLOTILLA_TOKEN", "x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("{}:4", file.display())) && err.contains("cmd"),
        "{err}"
    );
    assert!(!err.contains("no coordinator answered"), "{err}");
}

#[test]
fn a_dry_run_checks_the_job_and_its_inputs_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.toml");
    std::fs::write(dir.path().join("seed.txt"), "1").unwrap();
    let job = r#"
[[task]]
id = "make"
array = "0..3"
cmd = ["sh", "-c", "echo {i} > part{i}.txt"]
inputs = ["seed.txt"]
outputs = ["part{i}.txt"]
resources = { cpus = 2 }
[[task]]
id = "sum"
cmd = ["sh", "-c", "cat part*.txt > sum.txt"]
after = ["make"]
inputs = ["part*.txt", "missing.txt", "none/*.csv"]
outputs = ["sum.txt"]
"#;
    std::fs::write(&file, job).unwrap();
    let path = file.to_str().unwrap();
    let (ok, out, err) = flotilla(&["run", "--dry-run", path]);
    assert!(ok, "{err}");
    assert!(
        out.contains("4 tasks, 3 dependencies, longest chain 2, shared staging"),
        "{out}"
    );
    // The command as written (`{i}` kept), the resources with the defaults applied.
    assert!(
        out.contains("echo {i} > part{i}.txt") && out.contains("cpus=2"),
        "{out}"
    );
    assert!(out.contains("nothing was run"), "{out}");
    // What only running would find in shared staging is a warning.
    assert!(
        err.contains("warning: task \"sum\": input \"missing.txt\" is neither in the job folder")
            && err.contains("input pattern \"none/*.csv\" matches no file"),
        "{err}"
    );
    assert!(!err.contains("part*.txt"), "{err}");
    // Nothing started: no state folder, no outputs.
    assert!(!dir.path().join(".flotilla").exists());
    assert!(!dir.path().join("part0.txt").exists());
    // JSON for scripts.
    let (ok, out, _) = flotilla(&["submit", "--dry-run", "--json", path]);
    assert!(ok);
    let plan: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(plan["tasks"], 4);
    assert_eq!(plan["task_tables"][1]["after"][0], "make");
    assert_eq!(plan["warnings"].as_array().map(Vec::len), Some(2));
    // In transfer staging what a submission refuses is an error, named as submit names it.
    std::fs::write(
        &file,
        format!(
            "staging = \"transfer\"\n{}",
            job.replace("after = [\"make\"]", "")
        ),
    )
    .unwrap();
    let (ok, _, err) = flotilla(&["run", "--dry-run", path]);
    assert!(!ok);
    assert!(
        err.contains("task \"sum\": input pattern \"part*.txt\" matches \"part0.txt\", an output of task \"make[0]\", which does not run before it"),
        "{err}"
    );
}

/// `run` warns of what `--dry-run` warns of: an input pattern matching the output of a task
/// it does not run after raced silently. A job larger than a coordinator takes by default
/// is warned of (`run` takes it, `submit` was refused).
#[test]
fn run_warns_as_a_dry_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.toml");
    std::fs::write(
        &file,
        "[[task]]\nid = \"make\"\narray = \"0..2\"\ncmd = [\"sh\", \"-c\", \"echo {i} > part{i}.txt\"]\noutputs = [\"part{i}.txt\"]\n\
         [[task]]\nid = \"sum\"\ncmd = [\"sh\", \"-c\", \"cat part*.txt > sum.txt\"]\ninputs = [\"part*.txt\"]\noutputs = [\"sum.txt\"]\n",
    )
    .unwrap();
    let run = || {
        flotilla(&[
            "run",
            "--cpus",
            "1",
            "--gpus",
            "none",
            file.to_str().unwrap(),
        ])
    };
    let (_, _, err) = run();
    assert!(
        err.contains("warning: task \"sum\": input pattern \"part*.txt\" matches \"part0.txt\", an output of task \"make[0]\", which does not run before it"),
        "{err}"
    );
    std::fs::write(
        &file,
        "[[task]]\nid = \"t\"\narray = \"0..1000001\"\ncmd = [\"true\"]\n",
    )
    .unwrap();
    let (ok, _, err) = flotilla(&["run", "--dry-run", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: the job expands to 1000001 tasks: `flotilla run` takes it, but a coordinator refuses more than 1000000 by default"),
        "{err}"
    );
    // A misspelt placeholder is passed to the program as written: said by a dry run, a run
    // and a submission (which then goes to a coordinator that is not there).
    std::fs::write(
        &file,
        "[[task]]\nid = \"sim\"\narray = \"0..2\"\ncmd = [\"sh\", \"-c\", \"echo {index} > out{i}.txt\"]\n",
    )
    .unwrap();
    let said = "warning: task \"sim\": \"{index}\" in its cmd is passed as written (only \"{i}\" is replaced); did you mean \"{i}\"";
    let (ok, _, err) = flotilla(&["run", "--dry-run", file.to_str().unwrap()]);
    assert!(ok && err.contains(said), "{err}");
    let (ok, _, err) = run();
    assert!(ok && err.matches(said).count() == 1, "{err}");
    let written = std::fs::read_to_string(dir.path().join("out1.txt")).unwrap();
    assert_eq!(written.trim(), "{index}");
    let (ok, _, err) = flotilla(&[
        "submit",
        "--server",
        "127.0.0.1:9",
        "--connect-timeout",
        "0s",
        file.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains(said), "{err}");
}

#[test]
fn run_refuses_a_whole_machine_job_folder_before_writing_in_it() {
    // A job file straight in /tmp: the coordinator refuses /tmp as a job folder, and `run`
    // said so only after making /tmp/.flotilla (its token, journal, worker folder).
    let file = Path::new("/tmp").join(format!("flotilla-cli-test-{}.toml", std::process::id()));
    std::fs::write(&file, "[[task]]\nid = \"a\"\ncmd = [\"true\"]\n").unwrap();
    let state = Path::new("/tmp/.flotilla");
    let existed = state.exists();
    let (ok, _, err) = flotilla(&["run", file.to_str().unwrap()]);
    let (dry_ok, _, dry_err) = flotilla(&["run", "--dry-run", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    assert!(!ok && !dry_ok);
    // A folder for the file: the file it holds is named.
    let (folder_ok, _, folder_err) =
        flotilla(&["run", repo().join("examples/mandelbrot").to_str().unwrap()]);
    assert!(!folder_ok);
    assert!(
        folder_err.contains("examples/mandelbrot is a folder: give the job file (")
            && folder_err.contains("examples/mandelbrot/job.toml)"),
        "{folder_err}"
    );
    for e in [&err, &dry_err] {
        assert!(
            e.contains("refused: a task would get a folder of the whole machine (put the job file in a folder of its own)"),
            "{e}"
        );
    }
    if existed {
        eprintln!(
            "{} existed before the test: its creation is not checked",
            state.display()
        );
    } else {
        assert!(!state.exists(), "run made {}", state.display());
    }
}

/// Flags a newcomer gets wrong, refused before anything starts, each naming the flag:
/// a negative number (clap took it for a flag and suggested `-- -4`), a provider's worker
/// given a second token, and `--available always` (what `provider list` prints) accepted.
#[test]
fn worker_flags_are_checked_before_it_connects() {
    let (ok, _, err) = flotilla(&["worker", "--cpus", "-4", "--server", "127.0.0.1:1"]);
    assert!(!ok);
    assert!(
        err.contains("'-4' for '--cpus") && !err.contains("-- -4"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "flt_x\n").unwrap();
    let token = token.display().to_string();
    let (ok, _, err) = flotilla(&[
        "worker",
        "--server",
        "127.0.0.1:1",
        "--provider-token",
        &token,
        "--token-file",
        &token,
    ]);
    assert!(!ok);
    assert!(
        err.contains("--provider-token") && err.contains("leave out --token-file"),
        "{err}"
    );
    // Accepted: the worker goes on to the unknown --gpus value, which stops it.
    let out = Command::new(BIN)
        .args(["worker", "--server", "127.0.0.1:1", "--available", "always"])
        .args(["--gpus", "nonsense"])
        .env("FLOTILLA_TOKEN", "flt_x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--gpus") && !err.contains("--available"),
        "{err}"
    );
    // The batch system left out of `alloc add`: named.
    let (ok, _, err) = flotilla(&["alloc", "add", "--partition", "debug"]);
    assert!(!ok);
    assert!(
        err.contains("flotilla alloc add slurm --partition"),
        "{err}"
    );
}

/// A worker's offer beyond the machine, or a size without a unit, is said at start (it was
/// registered as given, silently); a port out of range stops it at once, naming the address.
#[test]
fn a_worker_says_what_its_offer_cannot_mean_and_refuses_a_bad_address() {
    let out = Command::new(BIN)
        .args([
            "worker",
            "--cpus",
            "100000",
            "--mem",
            "10",
            "--isolation",
            "none",
        ])
        .args(["--gpus", "none", "--server", "127.0.0.1:99999"])
        .env("FLOTILLA_TOKEN", "0123456789abcdef0123")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--cpus 100000 is more than this machine's"),
        "{err}"
    );
    assert!(err.contains("--mem 10 is 10 bytes"), "{err}");
    assert!(
        err.contains("the port \"99999\" is not a number from 1 to 65535"),
        "{err}"
    );
}
