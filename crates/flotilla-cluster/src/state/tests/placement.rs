//! Submission, ordering, resources and GPUs, queues, variants, locality and stealing.

use super::*;

#[test]
fn submission_makes_roots_ready_and_the_rest_waiting() {
    let mut sim = Sim::new(0);
    let (job, out) = sim.submit(DIAMOND);
    assert!(
        notified(&out).is_empty(),
        "initial states are read from job_status"
    );
    assert_eq!(sim.state(job, "a"), TaskState::Ready);
    for n in ["b", "c", "d"] {
        assert_eq!(sim.state(job, n), TaskState::Waiting);
    }
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.counts.ready, 1);
    assert_eq!(s.counts.waiting, 3);
    assert_eq!(s.total, 4);
    assert_eq!(sim.c.next_job_id(), JobId::new(job.0 + 1));
    assert_eq!(sim.c.jobs().len(), 1);
}

#[test]
fn a_bad_or_duplicate_submission_is_refused_and_changes_nothing() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let before = (sim.c.jobs(), sim.c.next_job_id());
    let spec = parse_job(DIAMOND, "job.toml").unwrap();
    let e = sim
        .try_ev(Event::JobSubmitted {
            job,
            spec: spec.clone(),
            dir: String::new(),
            tenant: String::new(),
        })
        .unwrap_err();
    assert_eq!(e, StateError::DuplicateJob(job));
    // A cycle built in code (parse_job would refuse it earlier).
    let mut bad = spec;
    bad.tasks[0].after = vec![flotilla_core::Dependency::parse("d").unwrap()];
    let e = sim
        .try_ev(Event::JobSubmitted {
            job: JobId::new(99),
            spec: bad,
            dir: String::new(),
            tenant: String::new(),
        })
        .unwrap_err();
    assert!(matches!(e, StateError::BadJob { .. }), "{e}");
    assert!(e.to_string().contains("cycle"), "{e}");
    assert_eq!((sim.c.jobs(), sim.c.next_job_id()), before);
}

#[test]
fn an_empty_job_succeeds_at_once() {
    let mut sim = Sim::new(0);
    let job = sim.c.next_job_id();
    let spec = flotilla_core::JobSpec::new("empty");
    let out = sim.ev(Event::JobSubmitted {
        job,
        spec,
        dir: String::new(),
        tenant: String::new(),
    });
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    assert_eq!(
        sim.c.job_status(job).unwrap().finished_state(),
        Some(JobState::Succeeded)
    );
}

#[test]
fn dependencies_run_in_order_and_the_job_succeeds_once() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let (w, out) = sim.join(wspec(4.0, &[]));
    let a = assigns(&out);
    assert_eq!(names(&sim, &out), vec!["a"]);
    assert_eq!(a[0].0, w);
    assert_eq!(a[0].1.attempt, 1);
    assert_eq!(a[0].1.job_name, "diamond");
    assert_eq!(
        a[0].1.kind,
        AssignedKind::Command {
            cmd: vec!["a".into()],
            env: vec![],
            cwd: None
        }
    );
    assert_eq!(sim.state(job, "a"), TaskState::Assigned);
    let ta = sim.tref(job, "a");
    let out = sim.ev(Event::TaskStarted {
        worker: w,
        task: ta,
        attempt: 1,
    });
    assert_eq!(notified(&out), vec![(ta, TaskState::Running)]);
    let out = sim.finish(w, ta, 1, AttemptOutcome::Succeeded);
    let n = notified(&out);
    assert!(n.contains(&(ta, TaskState::Done)));
    assert!(n.contains(&(sim.tref(job, "b"), TaskState::Ready)));
    assert!(n.contains(&(sim.tref(job, "c"), TaskState::Ready)));
    assert_eq!(
        names(&sim, &out),
        vec!["b", "c"],
        "both placed in one batch"
    );
    assert_eq!(
        out.iter()
            .filter(|c| matches!(c, Command::Assign { .. }))
            .count(),
        1
    );
    assert_eq!(sim.state(job, "d"), TaskState::Waiting);
    let out = sim.finish(w, sim.tref(job, "b"), 1, AttemptOutcome::Succeeded);
    assert!(assigns(&out).is_empty(), "d still waits for c");
    assert_eq!(sim.state(job, "d"), TaskState::Waiting);
    let out = sim.finish(w, sim.tref(job, "c"), 1, AttemptOutcome::Succeeded);
    assert_eq!(names(&sim, &out), vec!["d"]);
    let out = sim.finish(w, sim.tref(job, "d"), 1, AttemptOutcome::Succeeded);
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.done, 4);
    assert_eq!(s.retries, 0);
    // A duplicate report changes nothing and finishes nothing twice.
    let out = sim.finish(w, sim.tref(job, "d"), 1, AttemptOutcome::Succeeded);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 4);
}

#[test]
fn older_jobs_first_then_priority_then_id() {
    let mut sim = Sim::new(0);
    let (j1, _) = sim.submit(
        r#"
[[task]]
id = "low"
array = "0..2"
cmd = ["x"]
[[task]]
id = "high"
array = "0..2"
priority = 5
cmd = ["x"]
"#,
    );
    let (j2, _) = sim.submit("[[task]]\nid = \"other\"\npriority = 100\ncmd = [\"x\"]\n");
    let (w, out) = sim.join(wspec(1.0, &[]));
    let mut order = names(&sim, &out);
    let mut cur = assigns(&out)[0].1.task;
    for _ in 0..4 {
        let out = sim.finish(w, cur, 1, AttemptOutcome::Succeeded);
        let a = assigns(&out);
        assert_eq!(a.len(), 1);
        cur = a[0].1.task;
        order.push(sim.name(cur));
    }
    assert_eq!(
        order,
        vec!["high[0]", "high[1]", "low[0]", "low[1]", "other"]
    );
    assert_eq!(cur.job, j2);
    let _ = j1;
}

#[test]
fn resources_are_never_oversubscribed_and_custom_resources_count() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
[[task]]
id = "t"
array = "0..6"
cmd = ["x"]
resources = { cpus = 1.5, mem = "5GiB", licence = 1 }
"#,
    );
    let mut spec = wspec(8.0, &[]);
    spec.resources.custom.insert("licence".into(), 2.0);
    let (w, out) = sim.join(spec);
    // cpus would allow 5, mem 3 (16 GiB), licences 2.
    assert_eq!(assigns(&out).len(), 2);
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.used.custom["licence"], 2.0);
    assert_eq!(ws.used.cpus, 3.0);
    let first = assigns(&out)[0].1.task;
    let out = sim.finish(w, first, 1, AttemptOutcome::Succeeded);
    assert_eq!(assigns(&out).len(), 1, "one licence came back");
    assert_eq!(sim.c.job_status(job).unwrap().counts.assigned, 2);
}

#[test]
fn fractional_gpus_share_an_index_and_whole_gpus_take_free_ones() {
    let mut sim = Sim::new(0);
    let (_, _) = sim.submit(
        r#"
[[task]]
id = "half"
array = "0..3"
cmd = ["x"]
resources = { cpus = 0, gpus = 0.5, gpu_mem = "4GiB" }
"#,
    );
    let (w, out) = sim.join(wspec(8.0, &[10 << 30, 10 << 30]));
    let a = assigns(&out);
    assert_eq!(a.len(), 3);
    let idx: Vec<Vec<u32>> = a.iter().map(|(_, x)| x.gpu_indices.clone()).collect();
    assert_eq!(idx, vec![vec![0], vec![0], vec![1]], "packed two per GPU");
    let mut sim2 = Sim::new(0);
    sim2.submit(
        r#"
[[task]]
id = "mem"
array = "0..3"
cmd = ["x"]
resources = { cpus = 0, gpus = 0.25, gpu_mem = "6GiB" }
"#,
    );
    let (_, out) = sim2.join(wspec(8.0, &[10 << 30, 10 << 30]));
    let idx: Vec<Vec<u32>> = assigns(&out)
        .iter()
        .map(|(_, x)| x.gpu_indices.clone())
        .collect();
    assert_eq!(idx, vec![vec![0], vec![1]], "GPU memory limits the sharing");
    // Whole GPUs: two 1-GPU tasks take both indices; a 2-GPU task waits for both.
    let mut sim3 = Sim::new(0);
    let (job, _) = sim3.submit(
        r#"
[[task]]
id = "one"
array = "0..2"
cmd = ["x"]
resources = { cpus = 0, gpus = 1 }
[[task]]
id = "two"
cmd = ["x"]
resources = { cpus = 0, gpus = 2 }
"#,
    );
    let (w3, out) = sim3.join(wspec(8.0, &[1 << 30, 1 << 30]));
    let a = assigns(&out);
    let idx: Vec<Vec<u32>> = a.iter().map(|(_, x)| x.gpu_indices.clone()).collect();
    assert_eq!(idx, vec![vec![0], vec![1]]);
    let out = sim3.finish(w3, a[0].1.task, 1, AttemptOutcome::Succeeded);
    assert!(assigns(&out).is_empty(), "one GPU free is not enough");
    let out = sim3.finish(w3, a[1].1.task, 1, AttemptOutcome::Succeeded);
    let a = assigns(&out);
    assert_eq!(a[0].1.gpu_indices, vec![0, 1]);
    assert_eq!(a[0].1.resources.gpus, 2.0);
    assert_eq!(sim3.state(job, "two"), TaskState::Assigned);
    let _ = w;
}

#[test]
fn queued_tasks_wait_beyond_capacity_and_are_promoted_in_order() {
    let mut sim = Sim::new(2);
    let (job, _) = sim.submit(
        "[[task]]\nid = \"t\"\narray = \"0..6\"\ncmd = [\"x\"]\nresources = { cpus = 1 }\n",
    );
    let (w, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 4, "2 in capacity + 2 queued, in one Assign");
    assert_eq!(
        out.iter()
            .filter(|c| matches!(c, Command::Assign { .. }))
            .count(),
        1
    );
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.queued, 2);
    assert_eq!(ws.used.cpus, 2.0);
    // Starting a queued task while the capacity is full is refused and changes nothing.
    let t2 = a[2].1.task;
    let e = sim
        .try_ev(Event::TaskStarted {
            worker: w,
            task: t2,
            attempt: 1,
        })
        .unwrap_err();
    assert!(matches!(e, StateError::Conflict { .. }), "{e}");
    assert_eq!(sim.c.workers()[0].queued, 2);
    // A finish frees one cpu: the first queued task is promoted, one more is queued.
    let out = sim.finish(w, a[0].1.task, 1, AttemptOutcome::Succeeded);
    assert_eq!(assigns(&out).len(), 1);
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.queued, 2);
    assert_eq!(ws.used.cpus, 2.0);
    sim.ev(Event::TaskStarted {
        worker: w,
        task: t2,
        attempt: 1,
    });
    assert_eq!(sim.state(job, "t[2]"), TaskState::Running);
    assert_eq!(sim.c.workers()[0].used.cpus, 2.0);
}

#[test]
fn queued_tasks_never_hold_gpus() {
    let mut sim = Sim::new(4);
    sim.submit("[[task]]\nid = \"g\"\narray = \"0..3\"\ncmd = [\"x\"]\nresources = { cpus = 0, gpus = 1 }\n");
    let (_, out) = sim.join(wspec(4.0, &[1 << 30]));
    assert_eq!(assigns(&out).len(), 1);
    assert_eq!(sim.c.workers()[0].queued, 0);
}

#[test]
fn variants_are_explored_then_chosen_by_earliest_predicted_finish() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(VARIANTS);
    let (gw, out1) = sim.join(wspec(1.0, &[1 << 30]));
    let (cw, out2) = sim.join(wspec(1.0, &[]));
    let mut seen: BTreeMap<(WorkerId, String), usize> = BTreeMap::new();
    let mut running: std::collections::VecDeque<(WorkerId, Assignment)> = assigns(&out1).into();
    running.extend(assigns(&out2));
    let mut log = Vec::new();
    while let Some((w, a)) = running.pop_front() {
        let v = a.variant.clone().unwrap();
        *seen.entry((w, v.clone())).or_default() += 1;
        log.push((w, v.clone(), a.reason.policy.clone()));
        // Check the command is the chosen variant's.
        let AssignedKind::Command { cmd, .. } = &a.kind else {
            panic!("a command")
        };
        assert_eq!(cmd.contains(&"--cuda".to_string()), v == "gpu");
        assert!(!a.reason.alternatives.is_empty());
        let wall = match (w == gw, v.as_str()) {
            (true, "gpu") => 1.0,
            (true, _) => 10.0,
            (false, _) => 8.0,
        };
        let out = sim.finish_with(
            w,
            a.task,
            a.attempt,
            AttemptOutcome::Succeeded,
            vec![],
            Some(v),
            wall,
        );
        running.extend(assigns(&out));
    }
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
    // Every feasible pair was explored until calibrated (3 samples)...
    assert!(seen[&(gw, "gpu".to_string())] >= 3);
    assert!(seen[&(gw, "cpu".to_string())] >= 3);
    assert!(seen[&(cw, "cpu".to_string())] >= 3);
    assert!(!seen.contains_key(&(cw, "gpu".to_string())), "no GPU there");
    // ...then the GPU variant wins on the GPU worker.
    let tail: Vec<_> = log.iter().rev().take(10).collect();
    assert!(tail.iter().all(|(_, _, p)| p == "dmda"), "{tail:?}");
    assert!(tail.iter().any(|(w, v, _)| *w == gw && v == "gpu"));
    assert!(
        !tail.iter().any(|(w, v, _)| *w == gw && v == "cpu"),
        "{tail:?}"
    );
    let m = sim.c.perf_model();
    assert_eq!(
        m.predict("v/sim/gpu", "gpu", 0),
        Prediction::Calibrated(1.0)
    );
    assert_eq!(
        m.predict("v/sim/cpu", "cpu", 0),
        Prediction::Calibrated(8.0)
    );
    // Status reports the variant and the reason.
    let s = sim.c.job_status(job).unwrap();
    assert!(s
        .tasks
        .iter()
        .all(|t| t.variant.is_some() && t.placement.is_some()));
}

#[test]
fn transfer_staging_lists_inputs_and_prefers_the_worker_holding_most_bytes() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(TRANSFER);
    let (w1, out1) = sim.join(wspec(1.0, &[]));
    let (w2, out2) = sim.join(wspec(1.0, &[]));
    let (a1, a2) = (assigns(&out1), assigns(&out2));
    assert_eq!((a1.len(), a2.len()), (1, 1));
    let (ta, tb) = (a1[0].1.task, a2[0].1.task);
    assert_eq!(sim.name(ta), "a");
    sim.finish_with(
        w1,
        ta,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 10)],
        None,
        1.0,
    );
    let out = sim.finish_with(
        w2,
        tb,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 1000)],
        None,
        1.0,
    );
    let a = assigns(&out);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, w2, "w2 holds 1000 of the 1010 input bytes");
    assert_eq!(a[0].1.reason.policy, "locality");
    let mut inputs = a[0].1.inputs.clone();
    inputs.sort_by(|x, y| x.0.path.cmp(&y.0.path));
    assert_eq!(
        inputs,
        vec![
            (obj("a.out", 10), "addr-1".into()),
            (obj("b.out", 1000), "addr-1".into())
        ]
    );
    let _ = job;
}

#[test]
fn an_idle_worker_steals_queued_tasks() {
    let mut sim = Sim::new(3);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n");
    let (w1, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(assigns(&out).len(), 4, "1 running + 3 queued");
    let (w2, out) = sim.join(wspec(1.0, &[]));
    let r = retracts(&out);
    assert_eq!(r.len(), 2, "half of the 3 queued, rounded up: {out:?}");
    assert!(r.iter().all(|(w, _, _)| *w == w1));
    // No more retractions while those are pending.
    let out = sim.ev(Event::Tick);
    assert!(retracts(&out).is_empty());
    // One comes back and goes to the idle worker with a new attempt, no retry counted.
    let (_, t, a) = r[0];
    let out = sim.ev(Event::TaskReturned {
        worker: w1,
        task: t,
        attempt: a,
    });
    let a2 = assigns(&out);
    assert_eq!(a2.len(), 1);
    assert_eq!(a2[0].0, w2);
    assert_eq!(a2[0].1.task, t);
    assert_eq!(a2[0].1.attempt, 2);
    assert_eq!(sim.c.job_status(job).unwrap().retries, 0);
    // The other had started before the Retract arrived: the worker says so, it stays.
    // (w1 runs its queue in order: t[0], then t[1], then t[2].)
    let (_, t, a) = r[1];
    assert_eq!(sim.name(t), "t[2]");
    sim.finish(w1, sim.tref(job, "t[0]"), 1, AttemptOutcome::Succeeded);
    let early = sim.try_ev(Event::TaskStarted {
        worker: w1,
        task: t,
        attempt: a,
    });
    assert!(early.is_err(), "t[1] was promoted first");
    sim.finish(w1, sim.tref(job, "t[1]"), 1, AttemptOutcome::Succeeded);
    sim.ev(Event::TaskStarted {
        worker: w1,
        task: t,
        attempt: a,
    });
    let e = sim
        .try_ev(Event::TaskReturned {
            worker: w1,
            task: t,
            attempt: a,
        })
        .unwrap_err();
    assert!(matches!(e, StateError::Conflict { .. }));
    assert_eq!(sim.state(job, &sim.name(t)), TaskState::Running);
}

/// A task shape that fits nowhere is skipped for the rest of a pass, but only that shape: a
/// smaller task of a later job is still placed in the same pass, and the big one runs once
/// a worker large enough joins.
#[test]
fn a_shape_that_fits_nowhere_does_not_block_smaller_tasks_of_later_jobs() {
    let mut sim = Sim::new(0);
    let big = "[[task]]\nid = \"big\"\nresources = { cpus = 4 }\ncmd = [\"x\"]\n";
    let (b1, _) = sim.submit(big);
    let (b2, _) = sim.submit(big);
    let (small, _) = sim.submit("[[task]]\nid = \"small\"\ncmd = [\"x\"]\n");
    let (_, out) = sim.join(wspec(2.0, &[]));
    assert_eq!(names(&sim, &out), vec!["small"]);
    assert_eq!(assigns(&out)[0].1.task.job, small);
    let (_, out) = sim.join(wspec(8.0, &[]));
    let jobs: Vec<_> = assigns(&out).iter().map(|(_, a)| a.task.job).collect();
    assert_eq!(jobs, vec![b1, b2]);
}

#[test]
fn a_task_longer_than_a_worker_has_left_goes_to_another_worker_or_waits() {
    let mut sim = Sim::new(0);
    // Learned: `long` takes 600 s on this hardware class, `short` 10 s; `new` is unknown.
    let mut model = flotilla_sched::PerfModel::new();
    for _ in 0..3 {
        model.record("lim/long", "cpu", 0, 600.0);
        model.record("lim/short", "cpu", 0, 10.0);
    }
    sim.c.set_perf_model(model);
    // A worker with 2 minutes left (a batch allocation near its end).
    let leaving = sim.join_leaving(wspec(4.0, &[]), 120_000);
    let (job, out) = sim.submit(
        r#"
name = "lim"
[[task]]
id = "long"
cmd = ["true"]
[[task]]
id = "short"
cmd = ["true"]
[[task]]
id = "new"
cmd = ["true"]
"#,
    );
    let placed: Vec<String> = assigns(&out).iter().map(|(_, a)| a.name.clone()).collect();
    assert!(placed.contains(&"short".to_string()), "{placed:?}");
    assert!(
        placed.contains(&"new".to_string()),
        "unknown runtime: may go"
    );
    assert!(!placed.contains(&"long".to_string()), "{placed:?}");
    assert_eq!(sim.state(job, "long"), TaskState::Ready);
    // A worker with no limit takes it.
    let (other, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!((a[0].0, a[0].1.name.as_str()), (other, "long"));
    assert!(other != leaving);
}

#[test]
fn the_work_left_for_a_batch_queue_counts_what_its_workers_could_run() {
    let mut sim = Sim::new(0);
    let mut model = flotilla_sched::PerfModel::new();
    for _ in 0..3 {
        model.record("wl/a", "node", 0, 30.0);
    }
    sim.c.set_perf_model(model);
    let (_job, _) = sim.submit(
        r#"
name = "wl"
[[task]]
id = "a"
cmd = ["true"]
resources = { cpus = 2 }
[[task]]
id = "b"
cmd = ["true"]
after = ["a"]
[[task]]
id = "big"
cmd = ["true"]
resources = { cpus = 64 }
"#,
    );
    let shape = WorkerShape {
        cpus: 4.0,
        gpus: 0.0,
        hw_class: Some("node".into()),
        time_s: None,
    };
    let w = sim.c.work_left(&shape, 60.0, 100);
    // `a` waits (2 CPUs); `big` fits no such worker; `b` follows `a`, its time unknown.
    assert_eq!(w.waiting_cpus, 2.0);
    assert_eq!(w.left.len(), 2, "{w:?}");
    assert_eq!((w.left[0].cpus, w.left[0].secs), (2.0, 30.0));
    assert_eq!((w.left[1].cpus, w.left[1].secs), (1.0, 60.0));
    assert_eq!(w.left[1].preds, vec![0]);
    assert!(!w.truncated);
    let cut = sim.c.work_left(&shape, 60.0, 1);
    assert!(cut.truncated && cut.left.len() == 1);
    assert_eq!((w.deadline_s, w.due_cpu_s), (None, 0.0));
    // Taken by a worker: no longer waiting, still left.
    sim.join(wspec(4.0, &[]));
    let w = sim.c.work_left(&shape, 60.0, 100);
    assert_eq!(w.waiting_cpus, 0.0);
    assert_eq!(w.left.len(), 2);
    // A job with a deadline: its work is due by it.
    sim.now += 1_000;
    sim.submit(
        r#"
name = "due"
[pool]
deadline = "10m"
trust = "trusted-only"
[[task]]
id = "x"
cmd = ["true"]
"#,
    );
    let w = sim.c.work_left(&shape, 60.0, 100);
    assert_eq!(w.deadline_s, Some(600.0));
    assert_eq!(w.due_cpu_s, 60.0);
}

#[test]
fn tasks_queued_on_a_leaving_worker_that_would_outlast_it_are_taken_back() {
    let mut sim = Sim::new(4);
    // A worker of 1 CPU with 2 minutes left; three tasks of a runtime not known yet: one
    // runs, two are queued there.
    let leaving = sim.join_leaving(wspec(1.0, &[]), 120_000);
    let (job, out) =
        sim.submit("name = \"late\"\n[[task]]\nid = \"t\"\narray = \"0..3\"\ncmd = [\"true\"]\n");
    assert_eq!(assigns(&out).len(), 3, "one reserved, two queued");
    // Now it is known to take 10 minutes here: the queued two are taken back, once.
    let mut model = flotilla_sched::PerfModel::new();
    for _ in 0..3 {
        model.record("late/t", "cpu", 0, 600.0);
    }
    sim.c.set_perf_model(model);
    let out = sim.ev(Event::Tick);
    let back = retracts(&out);
    assert_eq!(back.len(), 2, "{out:?}");
    assert!(back.iter().all(|(w, _, _)| *w == leaving));
    assert!(retracts(&sim.ev(Event::Tick)).is_empty(), "sent once");
    // Returned, they wait for another worker rather than go back there.
    for (w, t, a) in back {
        let out = sim.ev(Event::TaskReturned {
            worker: w,
            task: t,
            attempt: a,
        });
        assert!(assigns(&out).is_empty(), "{out:?}");
        assert_eq!(
            sim.c.job_status(job).unwrap().tasks[t.task.index()].state,
            TaskState::Ready
        );
    }
    let (other, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 2);
    assert!(a.iter().all(|(w, _)| *w == other));
}

#[test]
fn a_task_cut_at_its_allocations_end_with_no_checkpoint_needs_more_than_it_ran() {
    let mut sim = Sim::new(0);
    // A task of a runtime not known yet, on an allocation's worker with 100 s left.
    let first = sim.join_leaving(wspec(1.0, &[]), 100_000);
    let (job, _) = sim.submit("name = \"cut\"\n[[task]]\nid = \"sim\"\ncmd = [\"true\"]\n");
    let t = sim.tref(job, "sim");
    assert_eq!(sim.state(job, "sim"), TaskState::Assigned);
    // The allocation ends: the attempt is preempted after 95 s, with no checkpoint.
    sim.now += 95_000;
    let preempted = AttemptOutcome::Preempted {
        checkpoint: Vec::new(),
    };
    sim.finish_with(first, t, 1, preempted, Vec::new(), None, 95.0);
    sim.ev(Event::WorkerLost {
        worker: first,
        reason: "its allocation ended".into(),
    });
    assert_eq!(sim.state(job, "sim"), TaskState::Ready);
    let message = sim.message(t);
    // 1.25 × 95 s, rounded up.
    assert!(
        message.contains("after 1m35s, with no checkpoint") && message.contains("1m59s left"),
        "{message}"
    );

    // A batch queue whose allocations offer less asks for nothing, and says why; one with
    // longer allocations counts it with the time it needs.
    let shape = |time_s: f64| WorkerShape {
        cpus: 1.0,
        gpus: 0.0,
        hw_class: Some("cpu".into()),
        time_s: Some(time_s),
    };
    let short = sim.c.work_left(&shape(110.0), 60.0, 100);
    assert_eq!(
        (short.waiting_cpus, short.left.len()),
        (0.0, 0),
        "{short:?}"
    );
    assert_eq!(short.too_long, 1);
    let (name, needs) = short.longest.expect("the longest");
    assert!(
        name.ends_with("/sim") && needs == 95.0 * super::coordinator::CUT_MARGIN,
        "{name} {needs}"
    );
    let long = sim.c.work_left(&shape(600.0), 60.0, 100);
    assert_eq!((long.waiting_cpus, long.too_long), (1.0, 0), "{long:?}");
    assert_eq!(long.left[0].secs, 95.0 * super::coordinator::CUT_MARGIN);

    // The next allocation's worker offers about what the last did: not taken there.
    let next = sim.join_leaving(wspec(1.0, &[]), 105_000);
    assert_eq!(sim.state(job, "sim"), TaskState::Ready);
    // One with 2 minutes (more than 1.25 × 95 s) takes it.
    let roomy = sim.join_leaving(wspec(1.0, &[]), 120_000);
    assert_eq!(sim.state(job, "sim"), TaskState::Assigned);
    assert!(next != roomy);
    // Preempted there with a checkpoint, it has moved on: what it ran is no bound now.
    sim.now += 110_000;
    let checkpoint = AttemptOutcome::Preempted {
        checkpoint: vec![ObjectRef {
            path: "s.ckpt".into(),
            hash: "c".repeat(64),
            size: 1,
        }],
    };
    sim.finish_with(roomy, t, 2, checkpoint, Vec::new(), None, 110.0);
    let w = sim.c.work_left(&shape(110.0), 60.0, 100);
    assert_eq!((w.too_long, w.left.len()), (0, 1), "{w:?}");
}

/// In shared staging a task's checkpoint files stay in the job's folder and nothing is
/// shipped: a task that declares them resumes on the next worker, whatever it has left (it
/// was held back as one with no checkpoint, its allocation queue asking for nothing, the
/// job waiting for good).
#[test]
fn a_task_cut_at_its_allocations_end_in_shared_staging_resumes_from_its_checkpoint() {
    let mut sim = Sim::new(0);
    let first = sim.join_leaving(wspec(1.0, &[]), 100_000);
    let (job, _) = sim.submit(
        "name = \"cut\"\n[[task]]\nid = \"sim\"\ncmd = [\"true\"]\ncheckpoint = [\"s.ckpt\"]\n",
    );
    let t = sim.tref(job, "sim");
    assert_eq!(sim.state(job, "sim"), TaskState::Assigned);
    sim.now += 95_000;
    // Leaving, the worker takes nothing more; its attempt ends preempted.
    sim.ev(Event::WorkerAvailability {
        worker: first,
        available: false,
    });
    let preempted = AttemptOutcome::Preempted {
        checkpoint: Vec::new(),
    };
    sim.finish_with(first, t, 1, preempted, Vec::new(), None, 95.0);
    assert_eq!(sim.state(job, "sim"), TaskState::Ready);
    let message = sim.message(t);
    assert!(
        message.contains("resumes from the checkpoint files it left in the job's folder"),
        "{message}"
    );
    // The next allocation's worker, with no more time than the last, takes it.
    sim.join_leaving(wspec(1.0, &[]), 105_000);
    assert_eq!(sim.state(job, "sim"), TaskState::Assigned);
}

/// A ready task larger than every connected worker is named, with what it needs, until a
/// worker that could take it joins (a user saw only "0/1 tasks done", forever).
#[test]
fn a_task_too_large_for_every_worker_is_named_in_the_job_s_status() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
[[task]]
id = "fits"
cmd = ["a"]
[[task]]
id = "huge"
cmd = ["b"]
resources = { cpus = 4, custom = 1 }
"#,
    );
    // No worker at all: said as such.
    let s = sim.c.job_summary(job).unwrap();
    assert_eq!(s.never_fits.as_deref(), Some("no worker is connected"));
    let (_w1, _) = sim.join(wspec(2.0, &[]));
    let s = sim.c.job_summary(job).unwrap();
    let why = s.never_fits.clone().unwrap_or_default();
    assert!(
        why.contains("task huge needs cpus=4 custom=1")
            && why.contains("the only connected worker offers cpus=2"),
        "{why}"
    );
    assert_eq!(s.waiting.as_deref(), Some(why.as_str()));
    assert_eq!(
        sim.c.job_status(job).unwrap().waiting.as_deref(),
        Some(why.as_str())
    );
    // Four CPUs but not the custom resource: still too large.
    let (_w2, _) = sim.join(wspec(4.0, &[]));
    assert!(sim.c.job_summary(job).unwrap().never_fits.is_some());
    let mut big = wspec(8.0, &[]);
    big.resources.custom.insert("custom".into(), 1.0);
    let _ = sim.join(big);
    let s = sim.c.job_summary(job).unwrap();
    assert_eq!((s.never_fits, s.waiting), (None, None));
}

/// A gang whose members fit one by one but not side by side on the workers there are is
/// named too: it starts all at once or not at all.
#[test]
fn a_gang_too_large_for_the_workers_together_is_named_in_the_job_s_status() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
[[task]]
id = "rank"
cmd = ["r"]
group = { size = 3 }
resources = { cpus = 1 }
"#,
    );
    let _ = sim.join(wspec(1.0, &[]));
    let _ = sim.join(wspec(1.0, &[]));
    let why = sim
        .c
        .job_summary(job)
        .unwrap()
        .never_fits
        .unwrap_or_default();
    assert!(
        why.contains("the gang of task rank[0] needs 3 members of cpus=1 at once")
            && why.contains("the connected workers hold 2"),
        "{why}"
    );
    // A third CPU anywhere: the gang starts.
    let (_, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(assigns(&out).len(), 3);
    assert_eq!(sim.c.job_summary(job).unwrap().never_fits, None);
}

/// A worker busy in part whose own task ended with nothing new ready takes queued tasks of
/// another worker that fit its free CPUs now, rather than leave them waiting there.
#[test]
fn a_worker_with_free_cpus_takes_queued_tasks_that_fit_them() {
    let mut sim = Sim::new(3);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n");
    let (w1, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(assigns(&out).len(), 4, "1 running + 3 queued");
    // An idle worker with 2 CPUs takes 2 of the 3 queued; both start there.
    let (w2, out) = sim.join(wspec(2.0, &[]));
    let r = retracts(&out);
    assert_eq!(r.len(), 2, "{out:?}");
    let mut on_w2 = Vec::new();
    for (w, t, a) in r {
        let out = sim.ev(Event::TaskReturned {
            worker: w,
            task: t,
            attempt: a,
        });
        let a2 = assigns(&out);
        assert_eq!(a2.len(), 1);
        assert_eq!(a2[0].0, w2);
        sim.ev(Event::TaskStarted {
            worker: w2,
            task: t,
            attempt: a2[0].1.attempt,
        });
        on_w2.push((t, a2[0].1.attempt));
    }
    // Every CPU taken: nothing moves.
    assert!(retracts(&sim.ev(Event::Tick)).is_empty());
    // One of w2's ends: its free CPU takes the task still queued on w1 (w1 runs t[0]).
    let out = sim.finish(w2, on_w2[0].0, on_w2[0].1, AttemptOutcome::Succeeded);
    let r = retracts(&out);
    assert_eq!(r.len(), 1, "{out:?}");
    let (w, t, a) = r[0];
    assert_eq!(w, w1);
    assert_ne!(sim.name(t), "t[0]");
    // No second retraction while that one is pending.
    assert!(retracts(&sim.ev(Event::Tick)).is_empty());
    let out = sim.ev(Event::TaskReturned {
        worker: w1,
        task: t,
        attempt: a,
    });
    let a2 = assigns(&out);
    assert_eq!(a2.len(), 1, "{out:?}");
    assert_eq!(a2[0].0, w2, "placed again where it fits free");
    assert_eq!(a2[0].1.task, t);
    let _ = job;
}

/// A worker with free CPUs too few for any queued task takes none.
#[test]
fn a_worker_whose_free_cpus_fit_no_queued_task_takes_none() {
    let mut sim = Sim::new(3);
    sim.submit("[[task]]\nid = \"t\"\narray = \"0..3\"\nresources = { cpus = 2 }\ncmd = [\"x\"]\n");
    let (_, out) = sim.join(wspec(2.0, &[]));
    assert_eq!(assigns(&out).len(), 3, "1 running + 2 queued");
    // A 3-CPU worker takes one of them (idle, it steals half of 2), then has 1 CPU free.
    let (w2, out) = sim.join(wspec(3.0, &[]));
    let r = retracts(&out);
    assert_eq!(r.len(), 1, "{out:?}");
    let (w, t, a) = r[0];
    let out = sim.ev(Event::TaskReturned {
        worker: w,
        task: t,
        attempt: a,
    });
    assert_eq!(assigns(&out)[0].0, w2);
    assert!(retracts(&out).is_empty(), "{out:?}");
    assert!(retracts(&sim.ev(Event::Tick)).is_empty());
}

/// A worker with more free CPUs but too little memory finds nothing to take; one with fewer
/// CPUs but the memory still takes the queued task (the walk stopped at the first that found
/// nothing: a review).
#[test]
fn a_worker_with_room_takes_what_a_roomier_one_could_not() {
    let mut sim = Sim::new(1);
    let gib = 1u64 << 30;
    let spec = |cpus: f64, mem: u64| WorkerSpec {
        resources: Resources {
            cpus,
            mem,
            ..Resources::default()
        },
        ..wspec(cpus, &[])
    };
    let (v, _) = sim.join(spec(1.0, 16 * gib));
    let (a, _) = sim.join(spec(8.0, 3 * gib));
    let (b, _) = sim.join(spec(2.0, 16 * gib));
    let task = |id: &str, extra: &str, mem: &str| {
        format!(
            "[[task]]\nid = \"{id}\"\n{extra}resources = {{ cpus = 1, mem = \"{mem}\" }}\ncmd = [\"x\"]\n"
        )
    };
    let (mid, out) = sim.submit(&task("mid", "", "8GiB"));
    assert_eq!(assigns(&out)[0].0, b);
    let (_, out) = sim.submit(&task("small", "", "1GiB"));
    assert_eq!(assigns(&out)[0].0, a);
    let (big, out) = sim.submit(&task("big", "array = \"0..3\"\n", "4GiB"));
    let on_v: Vec<TaskRef> = assigns(&out)
        .iter()
        .filter(|(w, _)| *w == v)
        .map(|(_, x)| x.task)
        .collect();
    let on_b = assigns(&out).iter().filter(|(w, _)| *w == b).count();
    assert_eq!(
        (on_v.len(), on_b),
        (2, 1),
        "one on b, one on v, one queued on v"
    );
    let queued = on_v[1];
    let _ = big;
    // `mid` ends: b has a CPU and the memory free; a, with 7 CPUs free, has no memory.
    sim.ev(Event::TaskStarted {
        worker: b,
        task: sim.tref(mid, "mid"),
        attempt: 1,
    });
    let out = sim.finish(b, sim.tref(mid, "mid"), 1, AttemptOutcome::Succeeded);
    let r = retracts(&out);
    assert_eq!(r, vec![(v, queued, 1)], "{out:?}");
}
