//! Transfer staging end to end: tasks run in sandboxes in their workers' work folders (not in
//! the job folder), their declared outputs travel peer to peer between two workers, and
//! `flotilla submit --wait` gathers every output back into the job folder, hash-checked.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::{Duration, Instant};

use kit::{assert_succeeded, job_id_of, wait_until, Cluster};

/// A chain a → b → c: each reads its predecessor's output and appends its own line; each
/// also writes an undeclared `scratch-<id>` that must not reach the job folder. With the
/// workers of [`two_workers`], a and c need 2 CPUs (only w0 has them) and b needs 2 GiB of
/// memory (only w1 has it), so every edge crosses workers.
const CHAIN: &str = r#"name = "chain"
staging = "transfer"

[[task]]
id = "a"
resources = { cpus = 2 }
cmd = ["sh", "-c", "echo a > scratch-a && mkdir -p out && echo line-a > out/a.txt"]
outputs = ["out/a.txt"]

[[task]]
id = "b"
after = ["a"]
resources = { cpus = 1, mem = "2GiB" }
cmd = ["sh", "-c", "echo b > scratch-b && cat out/a.txt > b.txt && echo line-b >> b.txt"]
outputs = ["b.txt"]

[[task]]
id = "c"
after = ["b"]
resources = { cpus = 2 }
cmd = ["sh", "-c", "echo c > scratch-c && mkdir -p deep/er && cat b.txt > deep/er/c.txt && echo line-c >> deep/er/c.txt"]
outputs = ["deep/er/c.txt"]
"#;

/// w0: 2 CPUs, 1 GiB; w1: 1 CPU, 4 GiB.
fn two_workers() -> Cluster {
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(2, &["--mem", "1GiB"]);
    c.add_worker_with(1, &["--mem", "4GiB"]);
    c.wait_workers(2);
    c
}

#[test]
fn transfer_chain_outputs_are_gathered_into_the_job_folder() {
    let c = two_workers();
    let dir = c.job_dir();
    let file = dir.join("chain.toml");
    std::fs::write(&file, CHAIN).unwrap();
    let started = Instant::now();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "submit --wait failed: {stderr}");
    assert!(
        stderr.contains("gathered 3 outputs"),
        "no gather reported: {stderr}"
    );
    let job = job_id_of(&out);
    let s = c.wait_job(job, Duration::from_secs(30));
    assert_succeeded(&s);
    // Sandboxes were never cleaned: each finished attempt's goes once its outputs are stored.
    for w in ["w0", "w1"] {
        let sandboxes = dir.parent().unwrap().join(w).join("sandbox");
        let left: Vec<_> = std::fs::read_dir(&sandboxes)
            .unwrap_or_else(|e| panic!("{}: {e}", sandboxes.display()))
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{w} kept sandboxes {left:?}");
    }
    // Each task ran where its resources forced it: a and c on w0, b on w1.
    let names = c.live_workers();
    let ran_on = |t: &str| names[&kit::task(&s, t).worker.unwrap()].clone();
    assert_eq!(
        [ran_on("a"), ran_on("b"), ran_on("c")],
        ["w0", "w1", "w0"],
        "placement"
    );
    eprintln!(
        "transfer chain: {:.2} s wall",
        started.elapsed().as_secs_f64()
    );

    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    assert_eq!(read("out/a.txt"), "line-a\n");
    assert_eq!(read("b.txt"), "line-a\nline-b\n");
    assert_eq!(read("deep/er/c.txt"), "line-a\nline-b\nline-c\n");
    // The tasks did not run in the job folder, and only declared outputs came back (no
    // temporary files left either).
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b.txt", "chain.toml", "deep", "out"], "job folder");
    assert_eq!(
        std::fs::read_dir(dir.join("out")).unwrap().count(),
        1,
        "out/ holds only a.txt"
    );
}

#[test]
fn outputs_lost_after_the_job_ended_are_rebuilt_from_lineage_at_gather() {
    // Regression: with its only holder killed after the job ended, the gather failed with
    // "held by no live worker". Now the tasks that made the lost outputs run again (the job
    // runs again) and the gather waits for them, then writes every output.
    let mut c = Cluster::start(0, 2);
    c.add_worker_with(2, &["--mem", "4GiB"]);
    c.wait_workers(1);
    let dir = c.job_dir();
    let file = dir.join("chain.toml");
    std::fs::write(&file, CHAIN).unwrap();
    let job = c.submit(&file);
    let s = c.wait_job(job, Duration::from_secs(30));
    assert_succeeded(&s);
    c.kill_worker(0);
    c.wait_until_workers(0);
    c.add_worker_with(2, &["--mem", "4GiB"]);
    c.wait_workers(1);
    let out = c.cli(&["wait", &job.0.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gather after the holder died: {err}");
    assert!(
        err.contains("were lost with their workers") && err.contains("(a, b, c)"),
        "the gather does not say what it rebuilt: {err}"
    );
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    assert_eq!(read("out/a.txt"), "line-a\n");
    assert_eq!(read("deep/er/c.txt"), "line-a\nline-b\nline-c\n");
    let s = c.status(job).unwrap();
    assert_succeeded(&s);
    for t in &s.tasks {
        assert_eq!(t.attempts, 2, "{} ran again once", t.name);
    }
    // The dead worker is named in the summary, not shown as "(?)".
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("(?)"), "{stdout}");
}

/// A sweep with `keep_going` where a few points fail: the done points' outputs are
/// gathered too, and it is said which (they stayed on the workers, unsaid, until a retry
/// made every task succeed: a scientist's walkthrough).
#[test]
fn a_failed_transfer_job_gathers_its_done_tasks_outputs() {
    let c = two_workers();
    let file = c.job_dir().join("sweep.toml");
    std::fs::write(
        &file,
        "name = \"sweep\"\nstaging = \"transfer\"\nkeep_going = true\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"sim\"\narray = \"0..4\"\noutputs = [\"res/{i}.txt\"]\n\
         cmd = [\"sh\", \"-c\", \"[ {i} -ne 2 ] && mkdir -p res && echo {i} > res/{i}.txt\"]\n",
    )
    .unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("gathered 3 outputs")
            && err.contains("of its 3 done tasks")
            && err.contains("the job failed: the others' are not there"),
        "{err}"
    );
    for i in [0, 1, 3] {
        let got = std::fs::read_to_string(c.job_dir().join(format!("res/{i}.txt")));
        assert_eq!(
            got.ok().as_deref(),
            Some(format!("{i}\n").as_str()),
            "res/{i}.txt"
        );
    }
    assert!(!c.job_dir().join("res/2.txt").exists());
}

#[test]
fn a_worker_killed_mid_job_loses_no_output_of_a_transfer_job() {
    // Regression, as a new user found it: 80 independent tasks on 2 workers, one worker
    // SIGKILLed after 25 were done: the job said "succeeded", then the gather failed with
    // "the outputs of job-1/t4 (out/t10.txt) are held by no live worker" (outputs no later
    // task needed were never rebuilt, and `t4` was an internal index, not the task's id).
    let mut c = Cluster::start(0, 1);
    c.add_worker(2);
    c.add_worker(2);
    c.wait_workers(2);
    let mut toml = String::from("name = \"many\"\nstaging = \"transfer\"\n");
    for i in 0..80 {
        toml.push_str(&format!(
            "\n[[task]]\nid = \"t{i}\"\ncmd = [\"sh\", \"-c\", \"sleep 0.05; mkdir -p out && echo {i} > out/t{i}.txt\"]\noutputs = [\"out/t{i}.txt\"]\n"
        ));
    }
    let file = c.job_dir().join("many.toml");
    std::fs::write(&file, toml).unwrap();
    let job = c.submit(&file);
    c.wait_status(job, "25 tasks done", Duration::from_secs(120), |s| {
        s.counts.done >= 25
    });
    c.kill_worker(1);
    let out = c.cli(&["wait", &job.0.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "wait failed: {err}");
    for i in 0..80 {
        let got = std::fs::read_to_string(c.job_dir().join(format!("out/t{i}.txt")));
        assert_eq!(
            got.ok().as_deref(),
            Some(format!("{i}\n").as_str()),
            "out/t{i}.txt"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("(?)"), "{stdout}");
}

#[test]
fn lost_holder_of_a_needed_output_reruns_its_producer_then_gathers() {
    // w0: 2 CPUs, 1 GiB; w1: 1 CPU, 4 GiB. a runs on w0, b on w1; c needs 3 CPUs, which no
    // worker has yet, so it waits. Then w1 (the only holder of b's output) is killed: b must
    // rerun (from a's output, still on w0) on w2 (3 CPUs, 4 GiB), which then runs c.
    let mut c = two_workers();
    let runs = tempfile::tempdir().unwrap();
    let log = |id: &str| format!("echo {id} >> {}/{id}", runs.path().display());
    let toml = format!(
        r#"name = "lineage"
staging = "transfer"

[[task]]
id = "a"
resources = {{ cpus = 2 }}
cmd = ["sh", "-c", "echo line-a > a.txt && {}"]
outputs = ["a.txt"]

[[task]]
id = "b"
after = ["a"]
resources = {{ cpus = 1, mem = "2GiB" }}
cmd = ["sh", "-c", "cat a.txt > b.txt && echo line-b >> b.txt && {}"]
outputs = ["b.txt"]

[[task]]
id = "c"
after = ["b"]
resources = {{ cpus = 3 }}
cmd = ["sh", "-c", "cat b.txt > c.txt && echo line-c >> c.txt && {}"]
outputs = ["c.txt"]
"#,
        log("a"),
        log("b"),
        log("c")
    );
    let started = Instant::now();
    let job = c.submit_toml("lineage.toml", &toml);
    c.wait_status(job, "b to finish", Duration::from_secs(30), |s| {
        kit::task(s, "b").state == flotilla::cluster::state::TaskState::Done
    });
    c.kill_worker(1);
    c.wait_until_workers(1);
    c.add_worker_with(3, &["--mem", "4GiB"]);
    let s = c.wait_job(job, Duration::from_secs(30));
    assert_succeeded(&s);
    let out = c.cli(&["wait", &job.0.to_string()]);
    assert!(
        out.status.success(),
        "wait (and gather) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("lineage: {:.2} s wall", started.elapsed().as_secs_f64());
    let ran = |id: &str| {
        std::fs::read_to_string(runs.path().join(id))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    assert_eq!([ran("a"), ran("b"), ran("c")], [1, 2, 1], "runs of a, b, c");
    let dir = c.job_dir();
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    assert_eq!(read("a.txt"), "line-a\n");
    assert_eq!(read("b.txt"), "line-a\nline-b\n");
    assert_eq!(read("c.txt"), "line-a\nline-b\nline-c\n");
}

#[test]
fn plain_input_files_of_the_job_folder_are_uploaded_and_staged() {
    // data/in.txt is a file of the job folder, not produced by any task: `submit` uploads it,
    // the coordinator serves it, and tasks on both workers (a on w0, b on w1) read it in
    // their sandboxes.
    let c = two_workers();
    let dir = c.job_dir();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/in.txt"), "from-the-job-folder\n").unwrap();
    let toml = r#"name = "uploads"
staging = "transfer"

[[task]]
id = "a"
resources = { cpus = 2 }
inputs = ["data/in.txt"]
cmd = ["sh", "-c", "cat data/in.txt > a.txt && echo line-a >> a.txt"]
outputs = ["a.txt"]

[[task]]
id = "b"
after = ["a"]
resources = { cpus = 1, mem = "2GiB" }
inputs = ["data/in.txt", "a.txt"]
cmd = ["sh", "-c", "cat data/in.txt a.txt > b.txt"]
outputs = ["b.txt"]
"#;
    let file = dir.join("uploads.toml");
    std::fs::write(&file, toml).unwrap();
    let started = Instant::now();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "submit --wait failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = c.wait_job(job_id_of(&out), Duration::from_secs(30));
    assert_succeeded(&s);
    let names = c.live_workers();
    let ran_on = |t: &str| names[&kit::task(&s, t).worker.unwrap()].clone();
    assert_eq!([ran_on("a"), ran_on("b")], ["w0", "w1"], "placement");
    eprintln!("uploads: {:.2} s wall", started.elapsed().as_secs_f64());
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    assert_eq!(read("a.txt"), "from-the-job-folder\nline-a\n");
    assert_eq!(
        read("b.txt"),
        "from-the-job-folder\nfrom-the-job-folder\nline-a\n"
    );
    // The uploaded file is untouched, and not gathered over itself as an output.
    assert_eq!(read("data/in.txt"), "from-the-job-folder\n");
}

#[test]
fn uploaded_inputs_survive_a_coordinator_restart() {
    // a reads the uploaded file and finishes; b (3 CPUs: no worker yet) waits. The
    // coordinator is killed and restarted on its state; then a worker that fits b joins, and
    // b must still get the uploaded file from the restarted coordinator.
    let mut c = Cluster::start(1, 1);
    let dir = c.job_dir();
    std::fs::write(dir.join("in.txt"), "kept\n").unwrap();
    let toml = kit::UPLOADS_JOB;
    let job = c.submit_toml("restart.toml", toml);
    c.wait_status(job, "a to finish", Duration::from_secs(30), |s| {
        kit::task(s, "a").state == flotilla::cluster::state::TaskState::Done
    });
    c.kill_server();
    c.restart_server();
    c.add_worker(3);
    // Under the reconcile grace (30 s): w0 re-registers holding a's output, so b does not
    // wait for it to expire (nor is a rerun). (10 s was too tight for a loaded machine: the
    // restart, w0's reconnection backoff, a new worker's start and the transfer.)
    let s = c.wait_job(job, Duration::from_secs(25));
    assert_succeeded(&s);
    assert_eq!(kit::task(&s, "a").attempts, 1, "a was rerun");
    let out = c.cli(&["wait", &job.0.to_string()]);
    assert!(
        out.status.success(),
        "wait (and gather) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("b.txt")).unwrap(),
        "kept\nkept\n"
    );
}

#[test]
fn glob_inputs_upload_every_matching_file_and_stage_only_the_matches() {
    let c = two_workers();
    let dir = c.job_dir();
    std::fs::create_dir_all(dir.join("shards/deeper")).unwrap();
    for (name, text) in [("s1.csv", "1\n"), ("s2.csv", "2\n"), ("notes.txt", "no\n")] {
        std::fs::write(dir.join("shards").join(name), text).unwrap();
    }
    std::fs::write(dir.join("shards/deeper/s3.csv"), "3\n").unwrap();
    let toml = r#"name = "globs"
staging = "transfer"

[[task]]
id = "sum"
inputs = ["shards/*.csv"]
cmd = ["sh", "-c", "ls -R shards > seen.txt && cat shards/*.csv > sum.txt"]
outputs = ["sum.txt", "seen.txt"]
"#;
    let file = dir.join("globs.toml");
    std::fs::write(&file, toml).unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "submit --wait failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = c.wait_job(job_id_of(&out), Duration::from_secs(30));
    assert_succeeded(&s);
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    assert_eq!(read("sum.txt"), "1\n2\n");
    let seen = read("seen.txt");
    assert!(
        !seen.contains("notes.txt") && !seen.contains("s3.csv"),
        "only the matches were staged (`*` does not cross folders): {seen}"
    );
}

#[test]
fn an_input_made_by_a_grandparent_is_staged_and_a_missing_one_is_refused_at_submit() {
    // c reads a's output across b: it was never staged ("No such file or directory").
    let c = two_workers();
    let dir = c.job_dir();
    let job = CHAIN.replace(
        "cmd = [\"sh\", \"-c\", \"echo c > scratch-c && mkdir -p deep/er && cat b.txt > deep/er/c.txt",
        "inputs = [\"out/a.txt\"]\ncmd = [\"sh\", \"-c\", \"echo c > scratch-c && mkdir -p deep/er && cat out/a.txt b.txt > deep/er/c.txt",
    );
    assert_ne!(job, CHAIN);
    let file = dir.join("grand.toml");
    std::fs::write(&file, &job).unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "submit --wait failed: {stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("deep/er/c.txt")).unwrap(),
        "line-a\nline-a\nline-b\nline-c\n"
    );

    // An input nobody makes and the folder lacks: refused before anything runs.
    let missing = CHAIN.replace(
        "after = [\"a\"]\n",
        "after = [\"a\"]\ninputs = [\"nowhere.dat\"]\n",
    );
    let file = dir.join("missing.toml");
    std::fs::write(&file, &missing).unwrap();
    let out = c.cli(&["submit", &file.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("task \"b\": input \"nowhere.dat\" is neither in the job folder"),
        "{stderr}"
    );
}

/// A drained worker (a scale-down, an eviction) hands the outputs only it holds to a peer
/// before it goes: its finished task does not run again. Here `a` can run only on w0 (2 GiB
/// of memory) and `b` only on w1 (2 CPUs); w0 is drained while `b` waits. Before, `a` was
/// to run again from lineage, and with w0 gone nothing could run it: the job never ended.
#[test]
fn a_drained_worker_hands_its_outputs_to_a_peer_and_no_task_runs_again() {
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(1, &["--mem", "4GiB", "--grace", "1s"]);
    c.add_worker_with(2, &["--mem", "1GiB"]);
    c.wait_workers(2);
    let go = c.root().join("go");
    let job = format!(
        "name = \"handoff\"\nstaging = \"transfer\"\n\
         [[task]]\nid = \"a\"\nresources = {{ cpus = 1, mem = \"2GiB\" }}\n\
         cmd = [\"sh\", \"-c\", \"echo made-once > a.txt\"]\noutputs = [\"a.txt\"]\n\
         [[task]]\nid = \"b\"\nafter = [\"a\"]\nresources = {{ cpus = 2, mem = \"512MiB\" }}\n\
         cmd = [\"sh\", \"-c\", \"while [ ! -e {} ]; do sleep 0.05; done; cat a.txt > b.txt\"]\n\
         outputs = [\"b.txt\"]\n",
        go.display()
    );
    let id = c.submit_toml("handoff.toml", &job);
    c.wait_status(id, "b to run", Duration::from_secs(60), |s| {
        s.counts.running == 1 && s.counts.done == 1
    });
    let out = c.cli(&["admin", "worker", "drain", "w0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_until(
        "the drained worker to leave",
        Duration::from_secs(60),
        || c.worker_status(0),
    );
    assert!(status.success(), "it left cleanly: {status:?}");
    std::fs::write(&go, "").unwrap();
    let s = c.wait_job(id, Duration::from_secs(60));
    assert_succeeded(&s);
    let a = s.tasks.iter().find(|t| t.name == "a").unwrap();
    assert_eq!(a.attempts, 1, "a ran once: {a:?}");
    // Gathered from the peer that holds the copy.
    let out = c.cli(&["wait", &id.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = c.job_dir();
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "made-once\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("b.txt")).unwrap(),
        "made-once\n"
    );
}

/// A `cwd` in transfer staging is made in the attempt's folder: it held only the staged
/// inputs, so `cwd = "cases/{i}"` failed with "does not exist" unless an input lay under it.
#[test]
fn a_cwd_in_transfer_staging_is_made_in_the_attempts_folder() {
    let c = two_workers();
    let dir = c.job_dir();
    std::fs::write(dir.join("run_case.sh"), "echo case-$1 > out.txt\n").unwrap();
    let toml = r#"name = "cases"
staging = "transfer"

[[task]]
id = "case"
array = "0..2"
cwd = "cases/{i}"
inputs = ["run_case.sh"]
cmd = ["sh", "../../run_case.sh", "{i}"]
outputs = ["cases/{i}/out.txt"]
"#;
    let file = dir.join("cases.toml");
    std::fs::write(&file, toml).unwrap();
    let out = c.cli(&["submit", "--wait", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "submit --wait failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..2 {
        assert_eq!(
            std::fs::read_to_string(dir.join(format!("cases/{i}/out.txt"))).unwrap(),
            format!("case-{i}\n")
        );
    }
}
