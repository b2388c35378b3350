//! Faults on purpose, with real processes: a worker SIGKILLed mid-job, and the coordinator
//! SIGKILLed mid-job and restarted on the same state directory and port. The job is the
//! 300-task hash DAG (each task sleeps 50 ms first so the kill lands mid-job); the result
//! must be identical, and `runs/<id>` counts how often each task really completed.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use flotilla::cluster::state::TaskState;
use kit::{assert_succeeded, wait_until, Cluster, HashDag};

const TASKS: usize = 300;

#[test]
fn worker_killed_mid_job_gives_identical_hashes_and_reruns_only_unfinished_tasks() {
    let dag = HashDag::random(TASKS, 0x3_0000_2222);
    let mut c = Cluster::start(3, 2);
    let dir = c.job_dir();
    // Worker names are fixed from the start; look them up before the race begins.
    let workers = c.live_workers();
    let job = c.submit(&dag.write(&dir, "workerkill", Some("0.05")));
    // Right before the kill: what the coordinator reports done, and who runs what.
    let snap = c.wait_status(
        job,
        "a third of the tasks done",
        Duration::from_secs(60),
        |s| {
            s.counts.done >= (TASKS / 3) as u64
                && s.tasks.iter().any(|t| t.state == TaskState::Running)
        },
    );
    let victim_id = snap
        .tasks
        .iter()
        .find(|t| t.state == TaskState::Running)
        .and_then(|t| t.worker)
        .expect("a running task has a worker");
    let victim: usize = workers[&victim_id][1..].parse().unwrap();
    c.kill_worker(victim);
    let killed_at = Instant::now();
    let done_before: Vec<usize> = snap
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Done)
        .map(|t| t.id.index())
        .collect();
    let running_on_victim: Vec<String> = snap
        .tasks
        .iter()
        .filter(|t| {
            matches!(t.state, TaskState::Running | TaskState::Assigned)
                && t.worker == Some(victim_id)
        })
        .map(|t| t.name.clone())
        .collect();
    assert!(!running_on_victim.is_empty());

    let s = c.wait_job(job, Duration::from_secs(90));
    eprintln!(
        "worker kill: {} done before the kill, {} on the victim; job makespan {:.2} s, {:.2} s after the kill, {} retries",
        done_before.len(),
        running_on_victim.len(),
        s.makespan_s,
        killed_at.elapsed().as_secs_f64(),
        s.retries
    );
    assert_succeeded(&s);
    dag.check_outputs(&dir);
    let runs = dag.completed_runs(&dir);
    let rerun: Vec<_> = done_before
        .iter()
        .filter(|&&i| runs[i] != 1)
        .map(|&i| (HashDag::id(i), runs[i]))
        .collect();
    assert!(
        rerun.is_empty(),
        "tasks done before the kill did not complete exactly once: {rerun:?}"
    );
    assert!(runs.iter().all(|&n| n >= 1));
    // What the victim was running finished elsewhere, on a later attempt (except what
    // it finished in the instant between the snapshot and the kill).
    let moved: Vec<&String> = running_on_victim
        .iter()
        .filter(|name| {
            let t = kit::task(&s, name);
            t.worker != Some(victim_id) && t.attempts >= 2
        })
        .collect();
    assert!(
        !moved.is_empty(),
        "none of {running_on_victim:?} was rerun on another worker"
    );
    // The victim is gone from the coordinator's workers.
    assert!(!c.live_workers().contains_key(&victim_id));
}

#[test]
fn coordinator_killed_and_restarted_mid_job_loses_nothing_and_reruns_nothing() {
    let dag = HashDag::random(TASKS, 0x3_0000_3333);
    let mut c = Cluster::start(2, 2);
    let dir = c.job_dir();
    let job = c.submit(&dag.write(&dir, "coordkill", Some("0.05")));
    let snap = c.wait_status(
        job,
        "a third of the tasks done",
        Duration::from_secs(60),
        |s| s.counts.done >= (TASKS / 3) as u64,
    );
    c.kill_server();
    let killed_at = Instant::now();
    // Let the workers finish (and fail to report) a few tasks during the outage.
    let completed = |runs: Vec<usize>| runs.iter().filter(|&&n| n > 0).count();
    let at_kill = completed(dag.completed_runs(&dir));
    wait_until(
        "tasks to complete while the coordinator is down",
        Duration::from_secs(20),
        || (completed(dag.completed_runs(&dir)) >= at_kill + 3).then_some(()),
    );
    let during_outage = completed(dag.completed_runs(&dir)) - at_kill;
    c.restart_server();
    let restarted_at = Instant::now();
    let outage = killed_at.elapsed();
    // The workers come back by themselves.
    c.wait_workers(2);
    // Generous: an assignment journaled but never delivered before the kill waits for the
    // coordinator's reconcile grace (30 s) before it is placed again.
    let s = c.wait_job(job, Duration::from_secs(90));
    let after_restart = restarted_at.elapsed().as_secs_f64();
    eprintln!(
        "coordinator kill: {} done at the kill, {} completed during a {:.2} s outage; makespan {:.2} s, {:.2} s after the restart, {} retries",
        snap.counts.done,
        during_outage,
        outage.as_secs_f64(),
        s.makespan_s,
        after_restart,
        s.retries
    );
    if after_restart > 20.0 {
        eprintln!(
            "note: a task assigned just before the kill was never received by its worker and \
             waited for the reconcile grace before it was placed again"
        );
    }
    assert_succeeded(&s);
    dag.check_outputs(&dir);
    let runs = dag.completed_runs(&dir);
    let twice: Vec<_> = runs
        .iter()
        .enumerate()
        .filter(|(_, &n)| n != 1)
        .map(|(i, &n)| (HashDag::id(i), n))
        .collect();
    assert!(
        twice.is_empty(),
        "tasks not completed exactly once: {twice:?}"
    );
    // Tasks done before the kill kept their attempt: none was started again.
    let done_before: HashSet<_> = snap
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::Done)
        .map(|t| (t.name.clone(), t.attempts))
        .collect();
    for t in &s.tasks {
        if let Some((_, a)) = done_before.iter().find(|(n, _)| n == &t.name) {
            assert_eq!(
                t.attempts, *a,
                "{} was started again after the restart",
                t.name
            );
        }
    }
}

#[test]
fn a_task_sees_no_token_and_dies_with_its_worker() {
    // Tasks inherited the worker's environment (FLOTILLA_TOKEN with it), and kept running
    // after their worker was killed while the coordinator reran them elsewhere.
    let mut c = Cluster::start(1, 1);
    let dir = c.job_dir();
    let job = c.submit_toml(
        "orphan.toml",
        r#"
name = "orphan"
[[task]]
id = "env"
cmd = ["sh", "-c", "env > env.txt"]
[[task]]
id = "long"
after = ["env"]
cmd = ["sh", "-c", "echo $$ > pid.txt; exec sleep 600"]
"#,
    );
    let pid: i32 = wait_until("the long task to start", Duration::from_secs(60), || {
        std::fs::read_to_string(dir.join("pid.txt"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    let env = std::fs::read_to_string(dir.join("env.txt")).unwrap();
    assert!(!env.contains("FLOTILLA_TOKEN"), "{env}");
    assert!(!env.contains(&c.token), "the token reached a task");
    assert!(env.contains("FLOTILLA_TASK=env"), "{env}");
    assert!(env.contains("PATH="), "{env}");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    c.kill_worker(0);
    wait_until(
        "the task to die with its worker",
        Duration::from_secs(30),
        || {
            // A zombie is dead too (its parent, the worker, is gone; init reaps it).
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            (stat.is_empty() || stat.contains(") Z ")).then_some(())
        },
    );
    let _ = job;
}

/// SIGTERM to a worker (systemd stopping it, a pod evicted, a node drained) is a drain: its
/// running task gets SIGTERM and the grace period, writes its checkpoint, and resumes
/// elsewhere from it; the worker leaves and exits on its own. Before, only SIGINT was heard
/// and SIGTERM killed the worker at once (found writing the Kubernetes manifests).
#[test]
fn a_worker_sent_sigterm_drains_and_its_task_resumes_elsewhere_from_its_checkpoint() {
    let mut c = Cluster::start(1, 1);
    let progress = c.root().join("progress");
    let job = format!(
        "name = \"resumable\"\nstaging = \"transfer\"\n\
         [[task]]\nid = \"sim\"\ntimeout = \"1h\"\ncheckpoint = [\"state/*.ckpt\"]\n\
         outputs = [\"out.txt\"]\ncmd = [\"sh\", \"-c\", \"mkdir -p state; \
         n=$(cat state/n.ckpt 2>/dev/null || echo 0); from=$n; \
         trap 'echo $n > state/n.ckpt; exit 143' TERM; \
         while [ $n -lt 60 ]; do n=$((n+1)); [ $n -eq $((from+5)) ] && touch {}; sleep 0.1; done; \
         echo resumed-from=$from > out.txt\"]\n",
        progress.display()
    );
    let id = c.submit_toml("resumable.toml", &job);
    wait_until("the task to make progress", Duration::from_secs(60), || {
        progress.exists().then_some(())
    });
    c.add_worker(1);
    c.wait_workers(2);
    c.signal_worker(0, libc::SIGTERM);
    let s = c.wait_job(id, Duration::from_secs(120));
    assert_succeeded(&s);
    let t = &s.tasks[0];
    assert_eq!(t.attempts, 2, "{t:?}");
    assert_eq!(t.failures, 0, "a preemption is no failure: {t:?}");
    let status = wait_until("the worker to exit", Duration::from_secs(120), || {
        c.worker_status(0)
    });
    assert!(status.success(), "it left cleanly, not killed: {status:?}");
    let out = c.cli(&["wait", &id.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read_to_string(c.job_dir().join("out.txt")).expect("the output");
    let from: u32 = got
        .trim()
        .strip_prefix("resumed-from=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{got:?}"));
    assert!(
        from >= 5,
        "it resumed from its checkpoint, not from 0: {got:?}"
    );
}

/// A gang in transfer staging resumes together from the checkpoint its rank 0 left when
/// rank 0's worker was drained. Rank 1, stopped with it, started from nothing before (an ML
/// engineer's walkthrough: the ranks disagreed on the step and every restart failed).
#[test]
fn a_drained_gang_resumes_every_rank_from_rank_0_s_checkpoint() {
    let mut c = Cluster::start(2, 1);
    let progress = c.root().join("progress");
    let job = format!(
        "name = \"dp\"\nstaging = \"transfer\"\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"train\"\ngroup = {{ size = 2 }}\ntimeout = \"1h\"\n\
         checkpoint = [\"state/*.ckpt\"]\noutputs = [\"out{{i}}.txt\"]\n\
         cmd = [\"sh\", \"-c\", \"mkdir -p state; r=$FLOTILLA_RANK; \
         n=$(cat state/n.ckpt 2>/dev/null || echo 0); from=$n; \
         if [ $r -eq 0 ]; then trap 'echo $n > state/n.ckpt; exit 143' TERM; fi; \
         while [ $n -lt 60 ]; do n=$((n+1)); \
         if [ $r -eq 0 ] && [ $n -eq $((from+5)) ]; then touch {}; fi; sleep 0.1; done; \
         echo resumed-from=$from > out$r.txt\"]\n",
        progress.display()
    );
    let id = c.submit_toml("dp.toml", &job);
    wait_until("rank 0 to make progress", Duration::from_secs(60), || {
        progress.exists().then_some(())
    });
    c.add_worker(1);
    c.wait_workers(3);
    // The worker running rank 0 (workers are named w0, w1, … in start order).
    let s = c.status(id).expect("the job's status");
    let rank0 = s
        .tasks
        .iter()
        .find(|t| t.name == "train[0]")
        .and_then(|t| t.worker)
        .expect("rank 0 runs");
    let name = &s.workers[&rank0];
    let i: usize = name
        .strip_prefix('w')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a worker name: {name}"));
    c.signal_worker(i, libc::SIGTERM);
    let s = c.wait_job(id, Duration::from_secs(120));
    assert_succeeded(&s);
    let out = c.cli(&["wait", &id.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from = |r: u32| -> u32 {
        let got = std::fs::read_to_string(c.job_dir().join(format!("out{r}.txt")))
            .unwrap_or_else(|e| panic!("rank {r}'s output: {e}"));
        got.trim()
            .strip_prefix("resumed-from=")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{got:?}"))
    };
    assert!(
        from(0) >= 5,
        "rank 0 resumed from its checkpoint: {}",
        from(0)
    );
    assert_eq!(from(1), from(0), "rank 1 resumed from rank 0's checkpoint");
}

/// A batch system ending an allocation (`scancel`, a preemption) signals every process of
/// it: the task gets SIGTERM, from outside, just before its worker does. That is a
/// preemption too (it was a failure, with `retries = 0` the job's end; found removing an
/// allocation queue with work running): the task resumes elsewhere from its checkpoint.
#[test]
fn a_task_sigtermed_with_its_worker_is_preempted_not_failed() {
    let mut c = Cluster::start(1, 1);
    let progress = c.root().join("progress");
    let pid_file = c.root().join("task.pid");
    let job = format!(
        "name = \"together\"\nstaging = \"transfer\"\n[defaults]\nretries = 0\n\
         [[task]]\nid = \"sim\"\ntimeout = \"1h\"\ncheckpoint = [\"state/*.ckpt\"]\n\
         outputs = [\"out.txt\"]\ncmd = [\"sh\", \"-c\", \"mkdir -p state; echo $$ > {pid}; \
         n=$(cat state/n.ckpt 2>/dev/null || echo 0); from=$n; \
         trap 'echo $n > state/n.ckpt; exit 143' TERM; \
         while [ $n -lt 60 ]; do n=$((n+1)); [ $n -eq $((from+5)) ] && touch {progress}; sleep 0.1; done; \
         echo resumed-from=$from > out.txt\"]\n",
        pid = pid_file.display(),
        progress = progress.display()
    );
    let id = c.submit_toml("together.toml", &job);
    wait_until("the task to make progress", Duration::from_secs(60), || {
        progress.exists().then_some(())
    });
    let task: i32 = std::fs::read_to_string(&pid_file)
        .expect("the task's pid")
        .trim()
        .parse()
        .expect("a pid");
    c.add_worker(1);
    c.wait_workers(2);
    // The task first, as the batch system's signal may reach it first; once its worker has
    // seen it end (reaped: the pid is gone), the worker.
    // SAFETY: kill(2) on a pid this test's task wrote; no memory is involved.
    assert_eq!(unsafe { libc::kill(task, libc::SIGTERM) }, 0);
    wait_until("the task to be reaped", Duration::from_secs(60), || {
        // SAFETY: as above; signal 0 only checks that the process exists.
        (unsafe { libc::kill(task, 0) } != 0).then_some(())
    });
    c.signal_worker(0, libc::SIGTERM);
    let s = c.wait_job(id, Duration::from_secs(120));
    assert_succeeded(&s);
    let t = &s.tasks[0];
    assert_eq!((t.attempts, t.failures), (2, 0), "{t:?}");
    let got = std::fs::read_to_string(c.job_dir().join("out.txt"));
    if let Ok(got) = got {
        assert!(!got.contains("resumed-from=0"), "{got:?}");
    }
}

/// `--idle-timeout`: a worker with nothing to run leaves on its own (a batch allocation's
/// worker gives its machine back) once its work is done, and the coordinator forgets it;
/// `--time-limit`: a worker leaves before its allocation's end, exit 0.
#[test]
fn workers_leave_when_idle_or_when_their_time_limit_is_near() {
    let mut c = Cluster::start(0, 1);
    c.add_worker_with(1, &["--idle-timeout", "1s"]);
    c.wait_workers(1);
    let id = c.submit_toml(
        "short.toml",
        "name = \"short\"\n[[task]]\nid = \"t\"\ncmd = [\"true\"]\n",
    );
    assert_succeeded(&c.wait_job(id, Duration::from_secs(60)));
    // It says why it leaves (it left without a word).
    let said = c.wait_worker_line(0, "leaving", Duration::from_secs(120));
    assert!(
        said.starts_with("flotilla worker w0: leaving: nothing to run for 1s"),
        "{said}"
    );
    let status = wait_until("the idle worker to leave", Duration::from_secs(120), || {
        c.worker_status(0)
    });
    assert!(status.success(), "it left cleanly: {status:?}");
    c.wait_until_workers(0);
    // 16 s: --grace 1s + 15 s, so it starts leaving at once.
    c.add_worker_with(1, &["--time-limit", "16s", "--grace", "1s"]);
    let status = wait_until(
        "the time-limited worker to leave",
        Duration::from_secs(120),
        || c.worker_status(1),
    );
    assert!(status.success(), "it left cleanly: {status:?}");
    let said = c.wait_worker_line(1, "leaving", Duration::from_secs(10));
    assert!(
        said.contains("its time limit is near (--time-limit)"),
        "{said}"
    );
}

/// A coordinator stopped with SIGTERM (systemd restarting it, a pod restarted) while each
/// worker runs a task, then started again: the workers come back with their attempts and
/// nothing runs twice. Before, the stop closed the workers' sessions, the coordinator took
/// each closure for a lost worker and queued its task on the other worker (journaled), and
/// after the restart it cancelled the running attempt and ran the task again (found running
/// the image in containers, deploy/container/smoke.sh).
#[test]
fn a_coordinator_stopped_with_sigterm_mid_job_reruns_nothing() {
    let mut c = Cluster::start(2, 1);
    let dir = c.job_dir();
    let job = c.submit_toml(
        "graceful.toml",
        r#"
name = "graceful"
[[task]]
id = "slow"
array = "0..2"
cmd = ["sh", "-c", "echo run >> runs-{i}.txt; while [ ! -e go ]; do sleep 0.05; done"]
"#,
    );
    c.wait_status(job, "both tasks running", Duration::from_secs(60), |s| {
        s.counts.running == 2
    });
    c.stop_server();
    c.restart_server();
    c.wait_workers(2);
    c.wait_status(
        job,
        "both tasks running again, on the workers that came back",
        Duration::from_secs(60),
        |s| s.counts.running == 2,
    );
    std::fs::write(dir.join("go"), b"").unwrap();
    let s = c.wait_job(job, Duration::from_secs(60));
    assert_succeeded(&s);
    for t in &s.tasks {
        assert_eq!(
            t.attempts, 1,
            "{} was placed again: {:?}",
            t.name, t.message
        );
        assert_eq!(t.failures, 0, "{}", t.name);
    }
    for i in 0..2 {
        let runs = std::fs::read_to_string(dir.join(format!("runs-{i}.txt"))).unwrap();
        assert_eq!(runs.lines().count(), 1, "slow[{i}] ran {runs:?}");
    }
}

/// A task placed again because its worker was lost is said in `wait`'s progress (the
/// count of done tasks only went back, unexplained: a scientist's walkthrough).
#[test]
fn wait_says_when_a_task_is_placed_again_after_its_worker_is_lost() {
    let mut c = Cluster::start(2, 1);
    let job = c.submit_toml(
        "two.toml",
        "name = \"two\"\n[[task]]\nid = \"t\"\narray = \"0..2\"\n\
         cmd = [\"sh\", \"-c\", \"touch started{i}; while [ ! -e go ]; do sleep 0.05; done\"]\n",
    );
    let dir = c.job_dir();
    wait_until("both tasks to run", Duration::from_secs(60), || {
        (dir.join("started0").exists() && dir.join("started1").exists()).then_some(())
    });
    let mut wait = c.cli_piped(&["wait", &job.0.to_string()]);
    // Lines as they come, on a thread: a line that never comes fails the test, not hangs it.
    let stdout = wait.stdout.take().expect("its stdout");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| {
        lines
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no line saying {what}"))
    };
    let first = next("the progress");
    assert!(first.contains("0/2 tasks done"), "{first}");
    c.kill_worker(0);
    let said = loop {
        let l = next("the task placed again");
        if l.contains("placed again") {
            break l;
        }
    };
    assert!(
        said.contains("placed again (attempt 1): worker w") && said.contains("lost"),
        "{said}"
    );
    std::fs::write(dir.join("go"), "").unwrap();
    let status = wait.wait().expect("wait exits");
    assert!(status.success(), "{said}");
    assert_succeeded(&c.wait_job(job, Duration::from_secs(60)));
}
