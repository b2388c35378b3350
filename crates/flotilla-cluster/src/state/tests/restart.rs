//! Journal replay after a restart, invalid events, status views, scale, rejoining workers.

use super::*;

/// Attempt 1 of `task` succeeded on `worker` in `wall` seconds (with `variant`).
fn succeeded_in(worker: WorkerId, task: TaskRef, wall: f64, variant: Option<&str>) -> Event {
    Event::TaskFinished {
        worker,
        task,
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage {
                wall_seconds: wall,
                ..Usage::default()
            },
            outputs: vec![],
            variant: variant.map(str::to_string),
        },
    }
}

/// Submits `text` as a job (folder `/d`, tenant `t`), journaling its submission and what
/// it caused (assignments), as the server does; its id and the commands.
fn submit_journaled(
    sim: &mut Sim,
    journal: &mut Vec<JournalRecord>,
    text: &str,
) -> (JobId, Vec<Command>) {
    let job = sim.c.next_job_id();
    let ev = Event::JobSubmitted {
        job,
        spec: parse_job(text, "job.toml").unwrap(),
        dir: "/d".into(),
        tenant: "t".into(),
    };
    journal.extend(JournalRecord::from_event(&ev));
    let out = sim.ev(ev);
    journal.extend(sim.c.take_journal_records());
    (job, out)
}

/// Runs a replay of `records` into a fresh coordinator and calls `recovered`.
fn replayed(records: &[JournalRecord], now: Millis) -> Coordinator {
    let mut c = Coordinator::new(config(0));
    let mut sink = Vec::new();
    for r in records {
        c.replay(now, r.clone(), &mut sink).expect("replays");
    }
    c.recovered(now);
    c
}

#[test]
fn after_a_restart_finished_tasks_stay_done_and_assigned_ones_wait_for_their_worker() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n[[task]]\nid = \"end\"\ncmd = [\"y\"]\nafter = [\"t\"]\n";
    let (job, _) = submit_journaled(&mut sim, &mut journal, text);
    let (w1, _) = sim.join(wspec(3.0, &[]));
    journal.extend(sim.c.take_journal_records());
    assert_eq!(journal.len(), 4, "the submission and three assignments");
    let t = |i: u32| TaskRef {
        job,
        task: TaskId::new(i),
    };
    let ev = Event::TaskFinished {
        worker: w1,
        task: t(0),
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    journal.extend(sim.c.take_journal_records()); // t[3] assigned
    assert_eq!(journal.len(), 6);
    // Crash. Replay at a later time.
    let mut c = replayed(&journal, 10_000);
    assert!(c.next_job_id() > job);
    assert!(c.next_worker_id() > w1, "worker ids are not reused");
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Done);
    for i in 1..4 {
        assert_eq!(
            s.tasks[i].state,
            TaskState::Assigned,
            "t[{i}] waits for its worker"
        );
    }
    // A new worker joins: nothing is placed during the grace.
    let mut out = Vec::new();
    let w2 = c.next_worker_id();
    c.handle(
        10_001,
        Event::WorkerJoined {
            worker: w2,
            spec: wspec(8.0, &[]),
            running: vec![],
            held: vec![],
            previous: None,
        },
        &mut out,
    )
    .unwrap();
    assert!(assigns(&out).is_empty(), "{out:?}");
    // The old worker comes back under a new id reporting t[1] running and a stale attempt.
    let w3 = c.next_worker_id();
    out.clear();
    c.handle(
        10_002,
        Event::WorkerJoined {
            worker: w3,
            spec: wspec(3.0, &[]),
            running: vec![(t(1), 1), (t(0), 1), (t(2), 7)],
            held: vec![],
            previous: Some(w1),
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(
        c.job_status(job).unwrap().tasks[1].state,
        TaskState::Running
    );
    assert_eq!(c.job_status(job).unwrap().tasks[1].worker, Some(w3));
    let mut cx = cancels(&out);
    cx.sort();
    assert_eq!(
        cx,
        vec![(w3, t(0), 1), (w3, t(2), 7)],
        "finished or unknown attempts are cancelled"
    );
    // It had finished t[2] while the coordinator was down: applied once.
    out.clear();
    let fin = |w, i, ok: bool| Event::TaskFinished {
        worker: w,
        task: t(i),
        attempt: 1,
        result: AttemptResult {
            outcome: if ok {
                AttemptOutcome::Succeeded
            } else {
                AttemptOutcome::Cancelled
            },
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    c.handle(10_003, fin(w3, 2, true), &mut out).unwrap();
    assert_eq!(c.job_status(job).unwrap().tasks[2].state, TaskState::Done);
    out.clear();
    c.handle(10_004, fin(w3, 2, true), &mut out).unwrap();
    assert!(out.is_empty(), "a duplicate is ignored");
    assert_eq!(c.job_status(job).unwrap().counts.done, 2);
    // t[3]'s worker never reports: after the grace it is placed again (attempt 2).
    out.clear();
    c.handle(14_999, Event::Tick, &mut out).unwrap();
    assert!(assigns(&out).is_empty());
    c.handle(15_000, Event::Tick, &mut out).unwrap();
    let a = assigns(&out);
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].1.task, a[0].1.attempt), (t(3), 2));
    // t[0] was never rerun.
    assert_eq!(c.job_status(job).unwrap().tasks[0].attempts, 1);
}

#[test]
fn replay_rebuilds_backoff_cancel_and_the_perf_model() {
    let mut sim = Sim::new(0);
    let mut journal = Vec::new();
    let (job, _) = submit_journaled(&mut sim, &mut journal, VARIANTS);
    let (w, out) = sim.join(wspec(1.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let a = assigns(&out);
    let ev = succeeded_in(w, a[0].1.task, 2.0, Some("cpu"));
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    journal.extend(sim.c.take_journal_records());
    journal.push(JournalRecord::JobCancelled { job });
    let c = replayed(&journal, 50);
    assert_eq!(
        c.perf_model()
            .stats("t:v/sim/cpu", "cpu", 0)
            .map(|s| s.count),
        Some(1)
    );
    let s = c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Cancelled);
    assert_eq!(s.counts.done, 1);
    assert_eq!(s.counts.cancelled, 39);
    assert_eq!(s.tasks[0].variant.as_deref(), Some("cpu"));
}

#[test]
fn replayed_assignments_are_validated() {
    let mut c = Coordinator::new(config(0));
    let mut out = Vec::new();
    let spec = parse_job(VARIANTS, "job.toml").unwrap();
    let job = c.next_job_id();
    c.handle(
        0,
        Event::JobSubmitted {
            job,
            spec,
            dir: String::new(),
            tenant: String::new(),
        },
        &mut out,
    )
    .unwrap();
    let task = TaskRef {
        job,
        task: TaskId::new(0),
    };
    let assigned = |worker: u32, attempt: u32, variant: &str| Event::TaskAssigned {
        worker: WorkerId::new(worker),
        task,
        attempt,
        variant: Some(variant.into()),
        gpu_indices: vec![],
        hw_class: "cpu".into(),
    };
    c.handle(0, assigned(4, 1, "cpu"), &mut out).unwrap();
    assert!(
        c.handle(0, assigned(4, 1, "cpu"), &mut out).is_err(),
        "not newer"
    );
    assert!(
        c.handle(0, assigned(5, 2, "fpga"), &mut out).is_err(),
        "no such variant"
    );
    c.handle(0, assigned(5, 2, "gpu"), &mut out).unwrap();
    assert_eq!(c.next_worker_id(), WorkerId::new(6));
    let bad = TaskRef {
        job,
        task: TaskId::new(999),
    };
    let e = c
        .handle(
            0,
            Event::TaskAssigned {
                worker: WorkerId::new(1),
                task: bad,
                attempt: 1,
                variant: None,
                gpu_indices: vec![],
                hw_class: String::new(),
            },
            &mut out,
        )
        .unwrap_err();
    assert_eq!(e, StateError::UnknownTask(bad));
    // A live worker cannot be named by a replayed assignment.
    let w = c.join(wspec(1.0, &[]), &mut out);
    assert!(c.handle(0, assigned(w.0, 9, "cpu"), &mut out).is_err());
}

#[test]
fn invalid_events_change_nothing() {
    let mut sim = Sim::new(1);
    let (job, _) = sim.submit(DIAMOND);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let snapshot = |c: &Coordinator| {
        (
            serde_json::to_string(&c.job_status(job)).unwrap(),
            serde_json::to_string(&c.workers()).unwrap(),
            c.next_job_id(),
        )
    };
    let before = snapshot(&sim.c);
    let ghost_task = TaskRef {
        job: JobId::new(42),
        task: TaskId::new(0),
    };
    let bad_task = TaskRef {
        job,
        task: TaskId::new(40),
    };
    let mut bad_gpu = wspec(1.0, &[1, 1]);
    bad_gpu.gpus[1].index = 0;
    let mut neg = wspec(1.0, &[]);
    neg.resources.cpus = -1.0;
    let events = vec![
        Event::JobCancelled {
            job: JobId::new(42),
        },
        Event::TaskStarted {
            worker: w,
            task: ghost_task,
            attempt: 1,
        },
        Event::TaskStarted {
            worker: w,
            task: bad_task,
            attempt: 1,
        },
        Event::TaskReturned {
            worker: WorkerId::new(99),
            task: sim.tref(job, "a"),
            attempt: 1,
        },
        Event::WorkerLost {
            worker: WorkerId::new(99),
            reason: String::new(),
        },
        Event::WorkerJoined {
            worker: w,
            spec: wspec(1.0, &[]),
            running: vec![],
            held: vec![],
            previous: None,
        },
        Event::WorkerJoined {
            worker: WorkerId::new(50),
            spec: bad_gpu,
            running: vec![],
            held: vec![],
            previous: None,
        },
        Event::WorkerJoined {
            worker: WorkerId::new(51),
            spec: neg,
            running: vec![],
            held: vec![],
            previous: None,
        },
        Event::TaskFinished {
            worker: WorkerId::new(99),
            task: sim.tref(job, "a"),
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage::default(),
                outputs: vec![],
                variant: None,
            },
        },
    ];
    for e in events {
        let r = sim.try_ev(e.clone());
        assert!(r.is_err(), "{e:?} should be refused");
        assert_eq!(snapshot(&sim.c), before, "{e:?} changed something");
    }
    assert!(sim
        .try_ev(Event::TaskReturned {
            worker: w,
            task: bad_task,
            attempt: 1
        })
        .is_err());
}

#[test]
fn a_cancelled_attempt_of_a_running_job_is_placed_again_without_a_retry() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let ta = sim.tref(job, "a");
    let out = sim.finish(w, ta, 1, AttemptOutcome::Cancelled);
    let a = assigns(&out);
    assert_eq!((a[0].1.task, a[0].1.attempt), (ta, 2));
    assert_eq!(sim.c.job_status(job).unwrap().tasks[0].failures, 0);
}

#[test]
fn events_and_records_convert_both_ways() {
    let e = Event::JobCancelled { job: JobId::new(3) };
    assert!(e.journaled());
    let r = JournalRecord::from_event(&e).unwrap();
    assert_eq!(r.into_event(), Some(e));
    for e in [
        Event::Tick,
        Event::WorkerLost {
            worker: WorkerId::new(1),
            reason: String::new(),
        },
        Event::TaskStarted {
            worker: WorkerId::new(1),
            task: TaskRef {
                job: JobId::new(1),
                task: TaskId::new(0),
            },
            attempt: 1,
        },
    ] {
        assert!(!e.journaled());
        assert!(JournalRecord::from_event(&e).is_none());
    }
    assert_eq!(TaskState::Backoff.to_string(), "backoff");
    assert_eq!(JobState::Succeeded.to_string(), "succeeded");
    assert_eq!(
        TaskRef {
            job: JobId::new(2),
            task: TaskId::new(5)
        }
        .to_string(),
        "job-2/t5"
    );
}

#[test]
fn worker_status_reports_use_and_utilization() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\ncmd = [\"x\"]\nresources = { cpus = 2 }\n");
    let (w, _) = sim.join(wspec(4.0, &[]));
    let ws = &sim.c.workers()[0];
    assert_eq!(ws.used.cpus, 2.0);
    assert_eq!(ws.tasks, vec![(sim.tref(job, "t"), 1)]);
    sim.now = 10_000;
    sim.finish_with(
        w,
        sim.tref(job, "t"),
        1,
        AttemptOutcome::Succeeded,
        vec![],
        None,
        20.0,
    );
    let ws = &sim.c.workers()[0];
    assert!(
        (ws.utilization - 0.5).abs() < 1e-9,
        "20 cpu-s over 4 cpus x 10 s: {}",
        ws.utilization
    );
    assert_eq!(ws.used.cpus, 0.0);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.makespan_s, 10.0);
    assert_eq!(s.tasks[0].usage.unwrap().cpu_seconds, 20.0);
    assert_eq!(s.task_by_name("t"), Some((TaskId::new(0), 1, true)));
    assert_eq!(sim.c.task_status(job, "t").as_ref(), Some(&s.tasks[0]));
    assert!(sim.c.task_status(job, "nope").is_none());
    assert_eq!(sim.c.job_summary(job).unwrap().done, 1);
    assert!(sim.c.job_summary(JobId::new(9)).is_none());
}

/// The scale target: a 1,000,000-instance array plus a reduce, 2 workers, every Assign
/// answered by TaskFinished. Each event touches O(log n) state (no scan of the tasks).
#[test]
fn a_million_task_job_runs_to_completion() {
    const N: u32 = 1_000_000;
    let mut c = Coordinator::new(Config {
        queue_depth: 4,
        ..config(4)
    });
    let text = format!(
        "[[task]]\nid = \"map\"\narray = \"0..{N}\"\ncmd = [\"m\", \"{{i}}\"]\n[[task]]\nid = \"reduce\"\ncmd = [\"r\"]\nafter = [\"map\"]\n"
    );
    let spec = parse_job(&text, "big.toml").unwrap();
    let job = c.next_job_id();
    let mut out = Vec::new();
    c.handle(
        0,
        Event::JobSubmitted {
            job,
            spec,
            dir: String::new(),
            tenant: String::new(),
        },
        &mut out,
    )
    .unwrap();
    let mut pending = std::collections::VecDeque::new();
    for _ in 0..2 {
        let w = c.join(wspec(4.0, &[]), &mut out);
        let _ = w;
    }
    let mut finished_jobs = 0;
    let mut now = 0;
    let mut events = 0u64;
    loop {
        for cmd in out.drain(..) {
            match cmd {
                Command::Assign { worker, tasks } => {
                    for a in tasks {
                        pending.push_back((worker, a.task, a.attempt));
                    }
                }
                Command::Notify(Notification::JobFinished { state, .. }) => {
                    assert_eq!(state, JobState::Succeeded);
                    finished_jobs += 1;
                }
                _ => {}
            }
        }
        let Some((worker, task, attempt)) = pending.pop_front() else {
            break;
        };
        now += 1;
        events += 1;
        c.handle(
            now,
            Event::TaskFinished {
                worker,
                task,
                attempt,
                result: AttemptResult {
                    outcome: AttemptOutcome::Succeeded,
                    usage: Usage::default(),
                    outputs: vec![],
                    variant: None,
                },
            },
            &mut out,
        )
        .unwrap();
    }
    assert_eq!(finished_jobs, 1);
    assert_eq!(events, u64::from(N) + 1);
    let s = c.jobs();
    assert_eq!(s[0].done, u64::from(N) + 1);
    assert!(c.jobs_map()[&job].all_final());
}

#[test]
fn replay_accepts_what_was_accepted_live() {
    // Live: a stale report from a worker that never got anything is accepted (and so
    // journaled); a lineage rerun reassigns a Done task. Both must replay.
    let mut sim = Sim::new(0);
    let mut journal = Vec::new();
    let (job, _) = submit_journaled(&mut sim, &mut journal, "staging = \"transfer\"\n[[task]]\nid = \"a\"\ncmd = [\"a\"]\noutputs = [\"a.out\"]\n[[task]]\nid = \"b\"\ncmd = [\"b\"]\nafter = [\"a\"]\n");
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (w2, _) = sim.join(wspec(1.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let ta = sim.tref(job, "a");
    let stale = Event::TaskFinished {
        worker: w2,
        task: ta,
        attempt: 9,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&stale));
    assert!(sim.ev(stale).is_empty());
    let done = Event::TaskFinished {
        worker: w1,
        task: ta,
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![obj("a.out", 3)],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&done));
    sim.ev(done);
    journal.extend(sim.c.take_journal_records()); // b on w1 (it holds a.out)
                                                  // w1 dies with b queued: a is rerun (on w2), b waits.
    sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "killed".into(),
    });
    journal.extend(sim.c.take_journal_records());
    assert_eq!(sim.state(job, "a"), TaskState::Assigned);
    assert_eq!(sim.state(job, "b"), TaskState::Waiting);
    let mut c = replayed(&journal, 100);
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Assigned);
    assert_eq!(s.tasks[0].attempts, 2);
    // b's assignment to w1 was journaled, its loss was not: it waits for w1 like any
    // replayed assignment, then goes back to waiting for the rerun of a.
    assert_eq!(s.tasks[1].state, TaskState::Assigned);
    let mut out = Vec::new();
    c.handle(100 + 5_000, Event::Tick, &mut out).unwrap();
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Ready);
    assert_eq!(
        s.tasks[1].state,
        TaskState::Waiting,
        "b waits for the rerun of a"
    );
    assert!(c.next_worker_id() > w2);
}

/// Regression (coordinator SIGKILLed between journaling an assignment and sending it): the
/// worker comes back under a new id naming its previous one; the attempts journaled for the
/// old id that it does not report are placed again at once, not after the grace.
#[test]
fn a_rejoining_worker_releases_the_assignments_it_never_received() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "[[task]]\nid = \"t\"\narray = \"0..2\"\ncmd = [\"x\"]\n";
    let (job, _) = submit_journaled(&mut sim, &mut journal, text);
    let (w1, _) = sim.join(wspec(2.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let t = |i: u32| TaskRef {
        job,
        task: TaskId::new(i),
    };
    let mut c = replayed(&journal, 10_000);
    // w1 comes back as a new worker: it runs t[0]; t[1]'s assignment never reached it.
    let w2 = c.next_worker_id();
    let mut out = Vec::new();
    c.handle(
        10_001,
        Event::WorkerJoined {
            worker: w2,
            spec: wspec(2.0, &[]),
            running: vec![(t(0), 1)],
            held: vec![],
            previous: Some(w1),
        },
        &mut out,
    )
    .unwrap();
    assert!(
        assigns(&out).is_empty(),
        "nothing moves during the grace yet"
    );
    c.handle(
        10_001,
        Event::WorkerReconciled {
            worker: w2,
            previous: w1,
        },
        &mut out,
    )
    .unwrap();
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Running);
    assert_eq!(s.tasks[0].worker, Some(w2));
    // t[1] is placed again at once, on w2, with a new attempt (well before the grace ends).
    let a = assigns(&out);
    assert_eq!(a.len(), 1, "{out:?}");
    assert_eq!(a[0].0, w2);
    assert_eq!(a[0].1.task, t(1));
    assert_eq!(c.job_status(job).unwrap().tasks[1].attempts, 2);
}

/// After a restart, only the worker that proves it was the attempt's worker (its previous id,
/// checked by the server with that id's credential) may take the attempt, report its result
/// or claim its outputs. Any worker could, once: and `gather` wrote outputs with hashes of a
/// stranger's choosing into the user's folder.
#[test]
fn after_a_restart_only_the_proven_previous_worker_claims_attempts_and_outputs() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "staging = \"transfer\"\n[[task]]\nid = \"a\"\ncmd = [\"x\"]\noutputs = [\"a.out\"]\n[[task]]\nid = \"b\"\ncmd = [\"y\"]\narray = \"0..2\"\n";
    let (job, _) = submit_journaled(&mut sim, &mut journal, text);
    let (w1, _) = sim.join(wspec(3.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let a = sim.tref(job, "a");
    let ev = Event::TaskFinished {
        worker: w1,
        task: a,
        attempt: 1,
        result: AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: vec![obj("a.out", 5)],
            variant: None,
        },
    };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    journal.extend(sim.c.take_journal_records());
    let b0 = sim.tref(job, "b[0]");
    let b1 = sim.tref(job, "b[1]");
    let mut c = replayed(&journal, 10_000);
    // A stranger (no proven previous id) claims everything w1 had: refused.
    let stranger = c.next_worker_id();
    let mut out = Vec::new();
    c.handle(
        10_001,
        Event::WorkerJoined {
            worker: stranger,
            spec: wspec(3.0, &[]),
            running: vec![(b0, 1)],
            held: vec![(a, obj("a.out", 5))],
            previous: None,
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(cancels(&out), vec![(stranger, b0, 1)], "not adopted");
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[b0.task.index()].worker, Some(w1), "still w1's");
    // a.out's only holder has not rejoined: its outputs may still come back.
    assert!(c.rejoining(job));
    // Nor may it report b[1]'s result, nor claim w1's identity with a forged id later.
    out.clear();
    c.handle(
        10_002,
        Event::TaskFinished {
            worker: stranger,
            task: b1,
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage::default(),
                outputs: vec![],
                variant: None,
            },
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(
        c.job_status(job).unwrap().tasks[b1.task.index()].state,
        TaskState::Assigned
    );
    // w1 comes back proven: it takes b[0], reports b[1], and holds a.out; a claim on an
    // object it was never recorded holding (another hash) is ignored.
    let back = c.next_worker_id();
    out.clear();
    let forged = ObjectRef {
        hash: "forged".into(),
        ..obj("a.out", 5)
    };
    c.handle(
        10_003,
        Event::WorkerJoined {
            worker: back,
            spec: wspec(3.0, &[]),
            running: vec![(b0, 1)],
            held: vec![(a, forged.clone()), (a, obj("a.out", 5))],
            previous: Some(w1),
        },
        &mut out,
    )
    .unwrap();
    assert!(cancels(&out).is_empty(), "{out:?}");
    let s = c.job_status(job).unwrap();
    assert_eq!(s.tasks[b0.task.index()].worker, Some(back));
    assert_eq!(s.tasks[b0.task.index()].state, TaskState::Running);
    out.clear();
    c.handle(
        10_004,
        Event::TaskFinished {
            worker: back,
            task: b1,
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage::default(),
                outputs: vec![],
                variant: None,
            },
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(
        c.job_status(job).unwrap().tasks[b1.task.index()].state,
        TaskState::Done
    );
    let j = &c.jobs_map()[&job];
    assert_eq!(
        j.outputs[&a.task],
        vec![obj("a.out", 5)],
        "no forged object"
    );
    assert!(j.holders[&a.task].contains(&back));
    assert!(!j.holders[&a.task].contains(&stranger));
    // Still within the grace, but every output has a live holder: gathering need not wait
    // for the grace to end (it did, while w1's old id was still listed beside `back`).
    assert!(!c.rejoining(job));
}

#[test]
fn a_compacted_journal_replays_to_the_same_state() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let (old, _) = submit_journaled(
        &mut sim,
        &mut journal,
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n",
    );
    let (w, out) = sim.join(wspec(1.0, &[]));
    journal.extend(sim.c.take_journal_records());
    let a = assigns(&out);
    let ev = succeeded_in(w, a[0].1.task, 2.0, None);
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    journal.extend(sim.c.take_journal_records());
    let ev = Event::JobRemoved { job: old };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let (live, _) = submit_journaled(
        &mut sim,
        &mut journal,
        "[[task]]\nid = \"b\"\narray = \"0..3\"\ncmd = [\"y\"]\n",
    );
    assert!(
        !sim.c.perf_model().is_empty(),
        "the removed job taught the model"
    );
    // What the journal's compaction writes: the live job's records, then the checkpoint.
    let mut compacted: Vec<JournalRecord> = journal
        .iter()
        .filter(|r| r.job() == Some(live))
        .cloned()
        .collect();
    assert!(compacted.len() < journal.len());
    compacted.push(sim.c.checkpoint());
    let full = replayed(&journal, 1_000);
    let mut small = replayed(&compacted, 1_000);
    assert!(small.job_status(old).is_none(), "the removed job is gone");
    assert_eq!(small.job_status(live), full.job_status(live));
    assert_eq!(small.next_job_id(), full.next_job_id());
    assert!(small.next_job_id() > live, "job ids are not reused");
    assert!(small.next_worker_id() > w, "worker ids are not reused");
    assert_eq!(small.perf_model().to_json(), full.perf_model().to_json());
    // A checkpoint that does not read back is refused, naming what is wrong.
    let mut c = Coordinator::new(config(0));
    let err = c
        .replay(
            0,
            JournalRecord::Checkpoint {
                next_job: 1,
                next_worker: 1,
                model: "{".into(),
            },
            &mut Vec::new(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("performance model"), "{err}");

    // After the restart the worker re-sends its report on the removed job: it changes
    // nothing and is not journaled. An older version journaled it, and a later compaction
    // kept it before the checkpoint, where a replay took it for a report on an unknown job
    // and the coordinator could not start again (found by a walkthrough of cluster.md):
    // such a record replays as nothing.
    let stale = succeeded_in(w, a[0].1.task, 2.0, None);
    assert!(small.reports_on_a_removed_job(&stale));
    let mut broken: Vec<JournalRecord> = JournalRecord::from_event(&stale).into_iter().collect();
    broken.extend(compacted.iter().cloned());
    let again = replayed(&broken, 1_000);
    assert_eq!(again.job_status(live), full.job_status(live));
}

#[test]
fn outputs_lost_after_success_reopen_the_job_and_the_reopening_replays() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "staging = \"transfer\"\n[[task]]\nid = \"a\"\ncmd = [\"a\"]\noutputs = [\"a.out\"]\n[[task]]\nid = \"b\"\ncmd = [\"b\"]\nafter = [\"a\"]\noutputs = [\"b.out\"]\n[[task]]\nid = \"quiet\"\ncmd = [\"q\"]\n";
    let (job, _) = submit_journaled(&mut sim, &mut journal, text);
    let (w1, _) = sim.join(wspec(4.0, &[]));
    for (name, out) in [("a", Some("a.out")), ("quiet", None), ("b", Some("b.out"))] {
        journal.extend(sim.c.take_journal_records());
        let t = sim.tref(job, name);
        let ev = Event::TaskFinished {
            worker: w1,
            task: t,
            attempt: 1,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage::default(),
                outputs: out.map(|p| obj(p, 3)).into_iter().collect(),
                variant: None,
            },
        };
        journal.extend(JournalRecord::from_event(&ev));
        sim.ev(ev);
    }
    journal.extend(sim.c.take_journal_records());
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
    assert!(sim.c.lost_outputs(job).is_empty());
    // The only holder dies after the end: a gather finds a and b lost (quiet has none).
    sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "killed".into(),
    });
    let lost = sim.c.lost_outputs(job);
    assert_eq!(lost, vec![sim.tref(job, "a").task, sim.tref(job, "b").task]);
    let ev = Event::JobReopened { job, tasks: lost };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Running, "the job runs again");
    assert_eq!(s.finished_ms, None);
    assert_eq!(sim.state(job, "a"), TaskState::Ready);
    assert_eq!(sim.state(job, "b"), TaskState::Waiting);
    assert_eq!(
        sim.state(job, "quiet"),
        TaskState::Done,
        "nothing of it was lost"
    );
    // The dead worker keeps its name in the job's status.
    assert_eq!(s.workers.get(&w1).map(String::as_str), Some("w4"));
    // A restart now replays the reopening: the same tasks wait to run again.
    let c = replayed(&journal, 10_000);
    let r = c.job_status(job).unwrap();
    assert_eq!(r.state, JobState::Running);
    let states: Vec<TaskState> = r.tasks.iter().map(|t| t.state).collect();
    assert_eq!(
        states,
        vec![TaskState::Ready, TaskState::Waiting, TaskState::Done]
    );
    // A new worker reruns a, then b; the job succeeds again.
    let (w2, out) = sim.join(wspec(4.0, &[]));
    assert_eq!(names(&sim, &out), vec!["a"]);
    let out = sim.finish_with(
        w2,
        sim.tref(job, "a"),
        2,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 3)],
        None,
        1.0,
    );
    assert_eq!(names(&sim, &out), vec!["b"]);
    sim.finish_with(
        w2,
        sim.tref(job, "b"),
        2,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 3)],
        None,
        1.0,
    );
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
    assert!(sim.c.lost_outputs(job).is_empty());
}

/// Two workers each running one task when the coordinator restarts: both come back under
/// new ids at once, each reporting its own attempt, in either order. Both attempts are
/// adopted: none is cancelled, none placed again. (Running the image in containers, one was
/// cancelled and run again after a SIGTERM restart; the cause was the server taking the
/// stop's closed sessions for lost workers, tested in tests/cluster_faults.rs. This is the
/// state machine's part, with and without queues and steals.)
#[test]
fn two_workers_that_rejoin_at_once_keep_their_running_attempts() {
    for queue_depth in [0, 4] {
        for w2_first in [false, true] {
            let mut sim = Sim::new(queue_depth);
            let mut journal: Vec<JournalRecord> = Vec::new();
            let (w1, _) = sim.join(wspec(1.0, &[]));
            let (w2, _) = sim.join(wspec(1.0, &[]));
            let text = "[[task]]\nid = \"slow\"\narray = \"0..2\"\ncmd = [\"x\"]\n";
            let (job, mut out) = submit_journaled(&mut sim, &mut journal, text);
            journal.extend(sim.c.take_journal_records());
            // Until each worker runs one (a worker with a queue may take both first, and
            // the idle one then steal).
            let mut on: std::collections::BTreeMap<WorkerId, (TaskRef, u32)> = Default::default();
            for _ in 0..10 {
                for (w, a) in assigns(&out) {
                    on.insert(w, (a.task, a.attempt));
                }
                let mut next = Vec::new();
                for c in &out {
                    if let Command::Retract {
                        worker,
                        task,
                        attempt,
                    } = c
                    {
                        on.remove(worker);
                        sim.now += 1;
                        next.extend(sim.ev(Event::TaskReturned {
                            worker: *worker,
                            task: *task,
                            attempt: *attempt,
                        }));
                    }
                }
                journal.extend(sim.c.take_journal_records());
                out = next;
                if out.is_empty() {
                    break;
                }
            }
            assert_eq!(on.len(), 2, "one task on each worker: {on:?}");
            for (&w, &(task, attempt)) in &on {
                sim.ev(Event::TaskStarted {
                    worker: w,
                    task,
                    attempt,
                });
            }
            journal.extend(sim.c.take_journal_records());
            // Restart: both come back, each with its own attempt running.
            let mut c = replayed(&journal, 10_000);
            let order = if w2_first { [w2, w1] } else { [w1, w2] };
            let mut out = Vec::new();
            for (k, prev) in order.into_iter().enumerate() {
                let id = c.next_worker_id();
                let now = 10_001 + k as u64;
                c.handle(
                    now,
                    Event::WorkerJoined {
                        worker: id,
                        spec: wspec(1.0, &[]),
                        running: vec![on[&prev]],
                        held: vec![],
                        previous: Some(prev),
                    },
                    &mut out,
                )
                .unwrap();
                c.handle(
                    now,
                    Event::WorkerReconciled {
                        worker: id,
                        previous: prev,
                    },
                    &mut out,
                )
                .unwrap();
            }
            let ctx = format!("queue depth {queue_depth}, w2 first: {w2_first}");
            assert!(cancels(&out).is_empty(), "{ctx}: {out:?}");
            assert!(assigns(&out).is_empty(), "{ctx}: {out:?}");
            let s = c.job_status(job).unwrap();
            for t in &s.tasks {
                assert_eq!(t.state, TaskState::Running, "{ctx}: {t:?}");
            }
        }
    }
}

/// `flotilla retry` of a job that failed: the failed task and the tasks cancelled with the
/// job run again (retries counted afresh), the done one does not; an attempt still stopping
/// when the job ended counts nothing, whatever it reports (a late success is not taken as
/// done: a replay, which knows no live worker, cancels it at the job's end), and runs again
/// after the retry; the time the job sat ended is not in its makespan; and a restart
/// replays the retry to the same state.
#[test]
fn a_failed_job_retried_runs_its_failed_and_cancelled_tasks_again_and_the_retry_replays() {
    let mut sim = Sim::new(0);
    let mut journal: Vec<JournalRecord> = Vec::new();
    let text = "[defaults]\nretries = 0\n[[task]]\nid = \"done\"\ncmd = [\"d\"]\n[[task]]\nid = \"bad\"\ncmd = [\"b\"]\n[[task]]\nid = \"slow\"\ncmd = [\"s\"]\n[[task]]\nid = \"child\"\ncmd = [\"c\"]\nafter = [\"bad\"]\n[[task]]\nid = \"quick\"\ncmd = [\"q\"]\n";
    let (job, _) = submit_journaled(&mut sim, &mut journal, text);
    let (w, out) = sim.join(wspec(4.0, &[]));
    journal.extend(sim.c.take_journal_records());
    assert_eq!(names(&sim, &out), vec!["done", "bad", "slow", "quick"]);
    let record = |sim: &mut Sim, journal: &mut Vec<JournalRecord>, ev: Event| {
        journal.extend(JournalRecord::from_event(&ev));
        let out = sim.ev(ev);
        journal.extend(sim.c.take_journal_records());
        out
    };
    let finished = |t: TaskRef, attempt: u32, outcome: AttemptOutcome| Event::TaskFinished {
        worker: w,
        task: t,
        attempt,
        result: AttemptResult {
            outcome,
            usage: Usage::default(),
            outputs: vec![],
            variant: None,
        },
    };
    let (done, bad, slow, quick) = (
        sim.tref(job, "done"),
        sim.tref(job, "bad"),
        sim.tref(job, "slow"),
        sim.tref(job, "quick"),
    );
    sim.now = 1_000;
    record(
        &mut sim,
        &mut journal,
        finished(done, 1, AttemptOutcome::Succeeded),
    );
    let out = record(
        &mut sim,
        &mut journal,
        finished(bad, 1, failed("boom", true)),
    );
    assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
    assert_eq!(
        cancels_of(&out),
        vec![(w, slow, 1), (w, quick, 1)],
        "slow and quick are stopped"
    );
    assert_eq!(sim.state(job, "child"), TaskState::Cancelled);
    // quick had ended before its cancel arrived: its success counts nothing now.
    record(
        &mut sim,
        &mut journal,
        finished(quick, 1, AttemptOutcome::Succeeded),
    );
    assert_eq!(sim.state(job, "quick"), TaskState::Cancelled);
    assert!(sim.c.retry_refusal(job).is_none());
    // bad, child, quick, and slow (still stopping) run again.
    assert_eq!(sim.c.retry_count(job), 4);
    // An hour later, slow not yet stopped, the job is retried.
    sim.now = 3_601_000;
    let out = record(&mut sim, &mut journal, Event::JobRetried { job });
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Running);
    assert_eq!(s.finished_ms, None);
    assert_eq!(
        names(&sim, &out),
        vec!["bad", "quick"],
        "bad and quick run again at once"
    );
    assert_eq!(sim.state(job, "done"), TaskState::Done, "done is kept");
    assert_eq!(sim.state(job, "child"), TaskState::Waiting);
    assert_eq!(
        sim.state(job, "slow"),
        TaskState::Assigned,
        "still stopping"
    );
    // A restart here replays the retry: the same states, but for slow, whose stopping
    // attempt the replay knows of no live worker for (cancelled at the job's end, it is
    // ready again; the worker's late report of it is stale).
    let r = replayed(&journal, sim.now).job_status(job).unwrap();
    assert_eq!(r.state, JobState::Running);
    let again: Vec<TaskState> = r.tasks.iter().map(|t| t.state).collect();
    use TaskState::{Assigned, Done, Ready, Waiting};
    assert_eq!(again, vec![Done, Assigned, Ready, Waiting, Assigned]);
    // slow's stopped attempt reports, even as a success: it runs again, as a replay has it.
    let out = record(
        &mut sim,
        &mut journal,
        finished(slow, 1, AttemptOutcome::Succeeded),
    );
    assert_eq!(names(&sim, &out), vec!["slow"]);
    let live: Vec<TaskState> = sim
        .c
        .job_status(job)
        .unwrap()
        .tasks
        .iter()
        .map(|t| t.state)
        .collect();
    let r = replayed(&journal, sim.now).job_status(job).unwrap();
    let again: Vec<TaskState> = r.tasks.iter().map(|t| t.state).collect();
    assert_eq!(
        again, live,
        "a replay holds what the live coordinator holds"
    );
    record(
        &mut sim,
        &mut journal,
        finished(quick, 2, AttemptOutcome::Succeeded),
    );
    let out = record(
        &mut sim,
        &mut journal,
        finished(bad, 2, AttemptOutcome::Succeeded),
    );
    assert_eq!(names(&sim, &out), vec!["child"]);
    let child = sim.tref(job, "child");
    sim.now = 3_602_000;
    record(
        &mut sim,
        &mut journal,
        finished(child, 1, AttemptOutcome::Succeeded),
    );
    let out = record(
        &mut sim,
        &mut journal,
        finished(slow, 2, AttemptOutcome::Succeeded),
    );
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    let s = sim.c.job_status(job).unwrap();
    assert!(
        (s.makespan_s - 2.0).abs() < 1e-9,
        "the hour it sat failed is not run time: {}",
        s.makespan_s
    );
    let r = replayed(&journal, sim.now).job_status(job).unwrap();
    assert_eq!(r.state, JobState::Succeeded);
    assert_eq!(r.counts.done, 5);
    // A job that succeeded has nothing to retry.
    let refused = sim.try_ev(Event::JobRetried { job });
    assert!(
        matches!(&refused, Err(StateError::NotRetryable { why, .. }) if why == "it succeeded"),
        "{refused:?}"
    );
    // What the live coordinator journaled after is taken by a replay: the job's removal.
    let ev = Event::JobRemoved { job };
    journal.extend(JournalRecord::from_event(&ev));
    sim.ev(ev);
    let r = replayed(&journal, sim.now);
    assert!(r.job_status(job).is_none());
}

/// A job that keeps going past a failed task may be retried while it runs: the failed
/// task runs again (its retries afresh), what waits for it is released when it succeeds,
/// and the job succeeds. A running job with no failed task has nothing to retry, and a job
/// that does not exist is unknown.
#[test]
fn a_job_that_keeps_going_is_retried_while_it_runs() {
    let mut sim = Sim::new(0);
    let text = "keep_going = true\n[defaults]\nretries = 1\n[[task]]\nid = \"bad\"\ncmd = [\"b\"]\n[[task]]\nid = \"child\"\ncmd = [\"c\"]\nafter = [\"bad\"]\n[[task]]\nid = \"long\"\ncmd = [\"l\"]\n";
    let (job, _) = sim.submit(text);
    let (w, out) = sim.join(wspec(2.0, &[]));
    assert_eq!(names(&sim, &out), vec!["bad", "long"]);
    let refused = sim.try_ev(Event::JobRetried { job });
    assert!(
        matches!(&refused, Err(StateError::NotRetryable { .. })),
        "{refused:?}"
    );
    let bad = sim.tref(job, "bad");
    sim.finish(w, bad, 1, failed("boom", true));
    sim.now += 1_000; // its backoff
    let out = sim.ev(Event::Tick);
    assert_eq!(names(&sim, &out), vec!["bad"]);
    let out = sim.finish(w, bad, 2, failed("boom", true));
    assert!(job_finished(&out).is_empty(), "long still runs");
    assert_eq!(sim.state(job, "bad"), TaskState::Failed);
    let out = sim.ev(Event::JobRetried { job });
    assert_eq!(names(&sim, &out), vec!["bad"]);
    // Its retries are counted afresh: one failure is retried again.
    let out = sim.finish(w, bad, 3, failed("boom", true));
    assert_eq!(sim.state(job, "bad"), TaskState::Backoff, "{out:?}");
    sim.now += 1_000;
    let out = sim.ev(Event::Tick);
    assert_eq!(names(&sim, &out), vec!["bad"]);
    let out = sim.finish(w, bad, 4, AttemptOutcome::Succeeded);
    assert_eq!(names(&sim, &out), vec!["child"]);
    sim.finish(w, sim.tref(job, "child"), 1, AttemptOutcome::Succeeded);
    let out = sim.finish(w, sim.tref(job, "long"), 1, AttemptOutcome::Succeeded);
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    let unknown = sim.try_ev(Event::JobRetried {
        job: JobId::new(99),
    });
    assert!(
        matches!(unknown, Err(StateError::UnknownJob(_))),
        "{unknown:?}"
    );
}

/// A status listing only the tasks in some states pages through them: each page says where
/// the next starts, the last says none; the counts stay whole.
#[test]
fn a_status_filtered_by_state_pages_through_the_tasks_in_those_states() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        "[[task]]\nid = \"a\"\narray = \"0..6\"\ncmd = [\"x\"]\n[[task]]\nid = \"b\"\nafter = [\"a\"]\ncmd = [\"y\"]\n",
    );
    let page = |from: usize| {
        let s = sim
            .c
            .job_status_in(job, from, 2, &[TaskState::Ready])
            .unwrap();
        let names: Vec<String> = s.tasks.iter().map(|t| t.name.clone()).collect();
        (names, s.tasks_next, s.counts.waiting)
    };
    assert_eq!(page(0), (vec!["a[0]".into(), "a[1]".into()], Some(2), 1));
    assert_eq!(page(2), (vec!["a[2]".into(), "a[3]".into()], Some(4), 1));
    // b waits: the last page of ready tasks has nothing after it.
    assert_eq!(page(4), (vec!["a[4]".into(), "a[5]".into()], None, 1));
    let waiting = sim
        .c
        .job_status_in(job, 0, 10, &[TaskState::Waiting])
        .unwrap();
    let names: Vec<&str> = waiting.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["b"]);
    assert_eq!(waiting.tasks_in, vec![TaskState::Waiting]);
    // Unfiltered, a cut page says where the next starts too.
    let all = sim.c.job_status_range(job, 0, 4).unwrap();
    assert_eq!((all.tasks.len(), all.tasks_next), (4, Some(4)));
    assert!(sim
        .c
        .job_status_range(job, 4, 4)
        .unwrap()
        .tasks_next
        .is_none());
}
