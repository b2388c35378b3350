//! Retries, cancellation, lost workers and lineage.

use super::*;

#[test]
fn retryable_failures_back_off_exponentially_then_fail_the_job() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
[defaults]
retries = 3
[[task]]
id = "flaky"
cmd = ["x"]
[[task]]
id = "other"
cmd = ["y"]
resources = { cpus = 1 }
"#,
    );
    let (w, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    let flaky = sim.tref(job, "flaky");
    assert_eq!(a[0].1.task, flaky);
    let running_other = a[1].1.task;
    sim.ev(Event::TaskStarted {
        worker: w,
        task: running_other,
        attempt: 1,
    });
    let mut attempt = 1;
    // Backoffs: 100, 200, then capped at 350.
    for (k, delay) in [100u64, 200, 350].into_iter().enumerate() {
        let out = sim.finish(w, flaky, attempt, failed("boom", true));
        assert!(notified(&out).contains(&(flaky, TaskState::Backoff)));
        assert_eq!(sim.state(job, "flaky"), TaskState::Backoff);
        assert_eq!(sim.c.job_status(job).unwrap().retries, k as u32 + 1);
        assert!(assigns(&out).is_empty());
        sim.now += delay - 1;
        let out = sim.ev(Event::Tick);
        assert!(assigns(&out).is_empty());
        assert_eq!(sim.state(job, "flaky"), TaskState::Backoff);
        sim.now += 1;
        let out = sim.ev(Event::Tick);
        let a = assigns(&out);
        assert_eq!(a.len(), 1, "retried at exactly the deadline");
        attempt += 1;
        assert_eq!(a[0].1.attempt, attempt);
    }
    let out = sim.finish(w, flaky, attempt, failed("boom", true));
    assert_eq!(sim.state(job, "flaky"), TaskState::Failed);
    assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
    assert_eq!(
        cancels(&out),
        vec![(w, running_other, 1)],
        "the running task is cancelled"
    );
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.running, 1, "until the worker confirms");
    assert!(s.tasks[flaky.task.index()]
        .message
        .as_deref()
        .unwrap()
        .contains("no retries left"));
    let failed_at = s.makespan_s;
    // The cancelled attempt stops 2 s later: its time is in the worker's busy time, so the
    // makespan runs until it stopped (utilization read 3909 % before).
    sim.now += 2_000;
    let out = sim.finish(w, running_other, 1, AttemptOutcome::Cancelled);
    assert_eq!(notified(&out), vec![(running_other, TaskState::Cancelled)]);
    assert!(job_finished(&out).is_empty(), "JobFinished only once");
    let s = sim.c.job_status(job).unwrap();
    assert!(
        (s.makespan_s - (failed_at + 2.0)).abs() < 1e-9,
        "{} after failing at {failed_at}",
        s.makespan_s
    );
    assert_eq!(sim.c.workers()[0].used.cpus, 0.0);
}

#[test]
fn a_non_retryable_failure_fails_for_good() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(DIAMOND);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let out = sim.finish(w, sim.tref(job, "a"), 1, failed("bad command", false));
    assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.failed, 1);
    assert_eq!(s.counts.cancelled, 3);
    assert_eq!(s.retries, 0);
}

#[test]
fn cancelling_a_job_cancels_waiting_tasks_and_stops_running_ones() {
    let mut sim = Sim::new(1);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"x\"]\n");
    let (w, out) = sim.join(wspec(1.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 2);
    sim.ev(Event::TaskStarted {
        worker: w,
        task: a[0].1.task,
        attempt: 1,
    });
    let out = sim.ev(Event::JobCancelled { job });
    assert_eq!(job_finished(&out), vec![(job, JobState::Cancelled)]);
    let mut c = cancels(&out);
    c.sort();
    assert_eq!(c, vec![(w, a[0].1.task, 1), (w, a[1].1.task, 1)]);
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(
        (s.counts.cancelled, s.counts.running, s.counts.assigned),
        (2, 1, 1)
    );
    // Again: nothing; unknown job: refused.
    assert!(sim.ev(Event::JobCancelled { job }).is_empty());
    assert_eq!(
        sim.try_ev(Event::JobCancelled {
            job: JobId::new(77)
        })
        .unwrap_err(),
        StateError::UnknownJob(JobId::new(77))
    );
    // Reports end them: even a success after the cancel is no reason to run more.
    sim.finish(w, a[0].1.task, 1, AttemptOutcome::Cancelled);
    let out = sim.finish(w, a[1].1.task, 1, AttemptOutcome::Succeeded);
    assert!(assigns(&out).is_empty());
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.state, JobState::Cancelled);
    assert_eq!(s.counts.cancelled + s.counts.done, 4);
    assert!(sim.c.workers()[0].tasks.is_empty());
}

#[test]
fn a_lost_worker_s_tasks_are_placed_again_and_its_late_reports_ignored() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..2\"\ncmd = [\"x\"]\n");
    let (w1, out) = sim.join(wspec(2.0, &[]));
    let a = assigns(&out);
    assert_eq!(a.len(), 2);
    sim.ev(Event::TaskStarted {
        worker: w1,
        task: a[0].1.task,
        attempt: 1,
    });
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "no heartbeat".into(),
    });
    let n = notified(&out);
    assert!(n.contains(&(a[0].1.task, TaskState::Ready)));
    assert!(n.contains(&(a[1].1.task, TaskState::Ready)));
    let s = sim.c.job_status(job).unwrap();
    assert!(s
        .tasks
        .iter()
        .all(|t| t.failures == 0 && t.message.as_deref().unwrap().contains("lost")));
    // Unknown worker: refused. Lost worker again: refused (ids are not reused).
    assert_eq!(
        sim.try_ev(Event::WorkerLost {
            worker: w1,
            reason: String::new()
        })
        .unwrap_err(),
        StateError::UnknownWorker(w1)
    );
    let e = sim
        .try_ev(Event::WorkerJoined {
            worker: w1,
            spec: wspec(1.0, &[]),
            running: vec![],
            held: vec![],
            previous: None,
        })
        .unwrap_err();
    assert_eq!(e, StateError::DuplicateWorker(w1));
    let (w2, out) = sim.join(wspec(2.0, &[]));
    let a2 = assigns(&out);
    assert_eq!(a2.len(), 2);
    assert!(a2.iter().all(|(w, x)| *w == w2 && x.attempt == 2));
    // The lost worker's late reports: ignored, never double counted.
    let out = sim.finish(w1, a[0].1.task, 1, AttemptOutcome::Succeeded);
    assert!(out.is_empty());
    let out = sim.ev(Event::TaskStarted {
        worker: w1,
        task: a[1].1.task,
        attempt: 1,
    });
    assert!(out.is_empty());
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 0);
    // A worker that never existed: refused.
    let e = sim
        .try_ev(Event::TaskStarted {
            worker: WorkerId::new(500),
            task: a[1].1.task,
            attempt: 2,
        })
        .unwrap_err();
    assert_eq!(e, StateError::UnknownWorker(WorkerId::new(500)));
    // A stale attempt from a live worker: ignored.
    assert!(sim
        .ev(Event::TaskStarted {
            worker: w2,
            task: a[1].1.task,
            attempt: 1
        })
        .is_empty());
    for (w, x) in a2 {
        sim.finish(w, x.task, x.attempt, AttemptOutcome::Succeeded);
    }
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 2);
}

/// A task with no declared outputs leaves nothing on its worker: the worker's loss does not
/// run it again (a scaled-down pod's finished tasks were rerun, 45 s of work each).
#[test]
fn a_lost_worker_reruns_only_the_finished_tasks_whose_outputs_it_held() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
staging = "transfer"
[[task]]
id = "made"
cmd = ["m"]
outputs = ["m.out"]
[[task]]
id = "quiet"
cmd = ["q"]
[[task]]
id = "last"
cmd = ["l"]
"#,
    );
    let (w1, out) = sim.join(wspec(2.0, &[]));
    assert_eq!(names(&sim, &out), vec!["made", "quiet"]);
    let (made, quiet) = (sim.tref(job, "made"), sim.tref(job, "quiet"));
    let out = sim.finish_with(
        w1,
        made,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("m.out", 5)],
        None,
        1.0,
    );
    assert_eq!(names(&sim, &out), vec!["last"]);
    sim.finish(w1, quiet, 1, AttemptOutcome::Succeeded);
    // w1 dies with `last` running and both finished tasks' results on it.
    sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "scaled down".into(),
    });
    assert_eq!(sim.state(job, "quiet"), TaskState::Done);
    assert_eq!(
        sim.state(job, "made"),
        TaskState::Ready,
        "m.out is gone: made again"
    );
    assert_eq!(sim.state(job, "last"), TaskState::Ready);
}

#[test]
fn a_leaving_worker_s_sole_outputs_are_handed_to_a_peer_and_nothing_reruns() {
    // A drained or scaled-down worker took the only copy of its outputs with it: each such
    // task ran again. Now the coordinator plans a copy to a peer first.
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
staging = "transfer"
[[task]]
id = "made"
cmd = ["m"]
outputs = ["m.out"]
[[task]]
id = "quiet"
cmd = ["q"]
[[task]]
id = "last"
after = ["made"]
cmd = ["l"]
outputs = ["l.out"]
"#,
    );
    let (w1, _) = sim.join(wspec(2.0, &[]));
    let (made, quiet) = (sim.tref(job, "made"), sim.tref(job, "quiet"));
    let m_out = vec![obj("m.out", 5)];
    sim.finish_with(
        w1,
        made,
        1,
        AttemptOutcome::Succeeded,
        m_out.clone(),
        None,
        1.0,
    );
    sim.finish(w1, quiet, 1, AttemptOutcome::Succeeded);
    // No peer yet: nothing to plan.
    assert!(sim.c.handoff(w1).is_empty());
    let (w2, _) = sim.join(wspec(1.0, &[]));
    let (w3, _) = sim.join(wspec(1.0, &[]));
    // w3 is leaving too (reclaimed): not a peer to copy to.
    sim.ev(Event::WorkerAvailability {
        worker: w3,
        available: false,
    });
    sim.ev(Event::WorkerAvailability {
        worker: w1,
        available: false,
    });
    let plan = sim.c.handoff(w1);
    assert_eq!(
        plan,
        vec![Handoff {
            task: made,
            objects: m_out,
            to: w2
        }],
        "only the task with outputs, to the available peer"
    );
    sim.ev(Event::ObjectsCopied {
        worker: w2,
        task: made,
    });
    assert!(sim.c.handoff(w1).is_empty(), "held elsewhere now");
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "it left".into(),
    });
    assert!(
        !notified(&out).iter().any(|(t, _)| *t == made),
        "made is not run again: {:?}",
        notified(&out)
    );
    assert_eq!(sim.state(job, "made"), TaskState::Done);
    assert_eq!(sim.state(job, "quiet"), TaskState::Done);
    // A stale copy (of a worker gone) is ignored, not refused as an error.
    sim.ev(Event::ObjectsCopied {
        worker: w1,
        task: made,
    });
}

#[test]
fn lost_outputs_are_rebuilt_from_lineage() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        r#"
staging = "transfer"
[[task]]
id = "a"
cmd = ["a"]
outputs = ["a.out"]
[[task]]
id = "b"
cmd = ["b"]
after = ["a"]
outputs = ["b.out"]
[[task]]
id = "c"
cmd = ["c"]
after = ["b"]
outputs = ["c.out"]
[[task]]
id = "side"
cmd = ["s"]
"#,
    );
    let (w1, out) = sim.join(wspec(1.0, &[]));
    let ta = sim.tref(job, "a");
    assert_eq!(assigns(&out)[0].1.task, ta);
    let out = sim.finish_with(
        w1,
        ta,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 5)],
        None,
        1.0,
    );
    let tb = sim.tref(job, "b");
    assert_eq!(assigns(&out)[0].1.task, tb);
    assert_eq!(
        assigns(&out)[0].1.inputs,
        vec![(obj("a.out", 5), "addr-1".to_string())]
    );
    let out = sim.finish_with(
        w1,
        tb,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 5)],
        None,
        1.0,
    );
    // c goes next (id order puts c before side).
    let tc = sim.tref(job, "c");
    assert_eq!(assigns(&out)[0].1.task, tc);
    // w1 dies holding a.out and b.out; c was assigned to it and is requeued.
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "killed".into(),
    });
    assert_eq!(
        sim.state(job, "b"),
        TaskState::Waiting,
        "b needs a's lost output"
    );
    assert_eq!(sim.state(job, "a"), TaskState::Ready);
    assert_eq!(sim.state(job, "c"), TaskState::Waiting);
    assert!(notified(&out).contains(&(tb, TaskState::Waiting)));
    let (w2, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(names(&sim, &out), vec!["a"]);
    let out = sim.finish_with(
        w2,
        ta,
        2,
        AttemptOutcome::Succeeded,
        vec![obj("a.out", 5)],
        None,
        1.0,
    );
    let a = assigns(&out);
    assert_eq!(sim.name(a[0].1.task), "b");
    assert_eq!(a[0].1.inputs, vec![(obj("a.out", 5), "addr-1".to_string())]);
    assert_eq!(a[0].1.attempt, 2);
    let out = sim.finish_with(
        w2,
        tb,
        2,
        AttemptOutcome::Succeeded,
        vec![obj("b.out", 5)],
        None,
        1.0,
    );
    assert_eq!(names(&sim, &out), vec!["c"]);
    let out = sim.finish_with(
        w2,
        tc,
        2,
        AttemptOutcome::Succeeded,
        vec![obj("c.out", 5)],
        None,
        1.0,
    );
    assert_eq!(names(&sim, &out), vec!["side"]);
    let ts = sim.tref(job, "side");
    let out = sim.finish(w2, ts, 1, AttemptOutcome::Succeeded);
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    assert_eq!(sim.c.job_status(job).unwrap().retries, 0);
}

#[test]
fn outputs_still_held_elsewhere_need_no_rerun_and_unneeded_ones_are_not_rebuilt() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(TRANSFER);
    let (w1, out1) = sim.join(wspec(1.0, &[]));
    let (w2, out2) = sim.join(wspec(1.0, &[]));
    let (ta, tb) = (assigns(&out1)[0].1.task, assigns(&out2)[0].1.task);
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
    let tc = assigns(&out)[0].1.task;
    sim.ev(Event::TaskStarted {
        worker: w2,
        task: tc,
        attempt: 1,
    });
    let out = sim.finish_with(
        w2,
        tc,
        1,
        AttemptOutcome::Succeeded,
        vec![obj("c.out", 1)],
        None,
        1.0,
    );
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    // Nothing needs a.out any more: losing w1 reruns nothing.
    let out = sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "gone".into(),
    });
    assert!(notified(&out).is_empty());
    assert_eq!(sim.c.job_status(job).unwrap().counts.done, 3);
}

#[test]
fn a_registration_offering_absurd_resources_is_refused_and_changes_nothing() {
    // One Register with `gpus = 1e10` once made the coordinator allocate ~170 GB.
    let mut sim = Sim::new(0);
    let mut spec = wspec(4.0, &[]);
    spec.resources.gpus = 1e10;
    let id = sim.c.next_worker_id();
    let e = sim
        .try_ev(Event::WorkerJoined {
            worker: id,
            spec,
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        })
        .unwrap_err();
    assert!(e.to_string().contains("gpus = 10000000000"), "{e}");
    assert!(sim.c.workers().is_empty());
    // A sane offer still joins.
    sim.join(wspec(4.0, &[]));
    assert_eq!(sim.c.workers().len(), 1);
}

#[test]
fn a_finished_job_is_removed_from_memory_and_a_running_or_stopping_one_is_not() {
    // Finished jobs were never dropped: a coordinator's memory grew with every job it ran.
    let mut sim = Sim::new(0);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let (job, out) = sim.submit("[[task]]\nid = \"t\"\ncmd = [\"x\"]\n");
    let t = assigns(&out)[0].1.task;
    let refused = sim.try_ev(Event::JobRemoved { job }).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("job 1 cannot be removed: it has not ended"),
        "{refused}"
    );
    // Cancelled, but its attempt still holds the worker until it reports.
    sim.ev(Event::JobCancelled { job });
    let refused = sim.try_ev(Event::JobRemoved { job }).unwrap_err();
    assert!(refused.to_string().contains("still stopping"), "{refused}");
    sim.finish(w, t, 1, AttemptOutcome::Cancelled);
    sim.ev(Event::JobRemoved { job });
    assert!(sim.c.job_status(job).is_none());
    assert!(sim.c.jobs().is_empty());
    assert_eq!(
        sim.try_ev(Event::JobRemoved { job }).unwrap_err(),
        StateError::UnknownJob(job)
    );
    // A worker that rejoins re-sends its recent results, this job's among them: ignored,
    // as the worker is not wrong to (it once logged "event refused: unknown job").
    sim.finish(w, t, 1, AttemptOutcome::Cancelled);
    sim.ev(Event::TaskStarted {
        worker: w,
        task: t,
        attempt: 1,
    });
    assert!(sim.c.jobs().is_empty());
    // A job never submitted is still refused.
    let never = TaskRef {
        job: JobId::new(job.0 + 100),
        task: t.task,
    };
    assert_eq!(
        sim.try_ev(Event::TaskStarted {
            worker: w,
            task: never,
            attempt: 1,
        })
        .unwrap_err(),
        StateError::UnknownJob(never.job)
    );
    // Ids are not reused.
    let (next, _) = sim.submit("[[task]]\nid = \"t\"\ncmd = [\"x\"]\n");
    assert!(next.0 > job.0);
    // Journaled, and replayed after a restart.
    assert!(Event::JobRemoved { job }.journaled());
    let mut c = Coordinator::new(config(0));
    let mut sink = Vec::new();
    let spec = parse_job("[[task]]\nid = \"t\"\ncmd = [\"x\"]\n", "job.toml").unwrap();
    for r in [
        JournalRecord::JobSubmitted {
            job,
            spec: Box::new(spec),
            dir: "/jobs".into(),
            tenant: "t".into(),
        },
        JournalRecord::JobCancelled { job },
        JournalRecord::JobRemoved { job },
    ] {
        c.replay(0, r, &mut sink).unwrap();
    }
    assert!(c.job_status(job).is_none());
    assert_eq!(c.next_job_id(), JobId::new(job.0 + 1));
}

#[test]
fn a_worker_may_speak_only_of_the_attempts_it_was_given() {
    // Any session could once write into any task's log.
    let mut sim = Sim::new(0);
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (w2, _) = sim.join(wspec(1.0, &[]));
    let (_, out) = sim.submit("[[task]]\nid = \"t\"\ncmd = [\"x\"]\n");
    let (w, a) = assigns(&out)[0].clone();
    let other = if w == w1 { w2 } else { w1 };
    assert!(sim.c.gave(w, a.task, a.attempt));
    assert!(!sim.c.gave(other, a.task, a.attempt));
    assert!(!sim.c.gave(w, a.task, a.attempt + 1));
    let unknown = TaskRef {
        job: JobId::new(99),
        task: TaskId::new(0),
    };
    assert!(!sim.c.gave(w, unknown, 1));
    // After it finished, its last words (output sent with the result) still count.
    sim.finish(w, a.task, a.attempt, AttemptOutcome::Succeeded);
    assert!(sim.c.gave(w, a.task, a.attempt));
}

/// The trace of a job: a span per ended attempt (the worker's wall time ending when the
/// coordinator hears of it), a lost attempt from when it was heard to start, running ones
/// apart; pages keep the latest spans and the first tasks.
#[test]
fn a_trace_has_a_span_per_attempt_and_pages_keep_the_latest() {
    let mut sim = Sim::new(0);
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (job, out) = sim.submit(
        "[defaults]\nretries = 1\n[[task]]\nid = \"t\"\narray = \"0..3\"\ncmd = [\"true\"]\n",
    );
    let first = assigns(&out);
    assert_eq!(first.len(), 1, "one at a time on one CPU");
    let t0 = first[0].1.task;
    sim.now = 1_000;
    sim.ev(Event::TaskStarted {
        worker: w1,
        task: t0,
        attempt: 1,
    });
    sim.now = 3_000;
    // Failed after 1.5 s of its own: the span is [1.5 s, 3 s].
    let out = sim.finish_with(w1, t0, 1, failed("boom", true), Vec::new(), None, 1.5);
    let next = assigns(&out);
    let t1 = next[0].1.task;
    sim.now = 3_500;
    sim.ev(Event::TaskStarted {
        worker: w1,
        task: t1,
        attempt: 1,
    });
    let trace = sim.c.job_trace(job).unwrap();
    assert_eq!(trace.spans.len(), 1);
    let s = &trace.spans[0];
    assert_eq!(
        (s.start_ms, s.end_ms, s.outcome.as_str()),
        (1_500, 3_000, "failed")
    );
    assert_eq!(trace.running.len(), 1, "{:?}", trace.running);
    assert_eq!(trace.running[0].start_ms, 3_500);
    // Its worker lost mid-attempt: a `lost` span from its start.
    sim.now = 4_000;
    sim.ev(Event::WorkerLost {
        worker: w1,
        reason: "gone".into(),
    });
    let trace = sim.c.job_trace(job).unwrap();
    let lost = trace.spans.iter().find(|s| s.outcome == "lost").unwrap();
    assert_eq!((lost.start_ms, lost.end_ms), (3_500, 4_000));
    assert!(trace.running.is_empty());
    assert!(!trace.partial);
    // The last span only, flagged partial; the first task only.
    let page = sim.c.job_trace_last(job, 1).unwrap();
    assert_eq!(page.spans.len(), 1);
    assert_eq!(page.spans[0].outcome, "lost");
    assert!(page.partial);
    let status = sim.c.job_status_page(job, 1).unwrap();
    assert_eq!((status.tasks.len(), status.total), (1, 3));
    // The graph of a small job comes with its trace.
    assert_eq!(page.names.len(), 3);
}

/// A running job's time left comes from the learned runtimes: once its kind is calibrated
/// (three samples of 2 s here), the one task left on one CPU has 2 s to go.
#[test]
fn a_jobs_eta_comes_from_the_learned_runtimes() {
    let mut sim = Sim::new(0);
    let (w, _) = sim.join(wspec(1.0, &[]));
    let (job, out) = sim.submit("[[task]]\nid = \"t\"\narray = \"0..4\"\ncmd = [\"true\"]\n");
    assert_eq!(
        sim.c.job_summary(job).unwrap().eta_s,
        None,
        "nothing learned yet"
    );
    let mut next = assigns(&out);
    for _ in 0..3 {
        let t = next[0].1.task;
        next = assigns(&sim.finish_with(w, t, 1, AttemptOutcome::Succeeded, Vec::new(), None, 2.0));
    }
    let eta = sim.c.job_summary(job).unwrap().eta_s.unwrap();
    assert!((eta - 2.0).abs() < 1e-9, "{eta}");
    let t = next[0].1.task;
    sim.finish_with(w, t, 1, AttemptOutcome::Succeeded, Vec::new(), None, 2.0);
    assert_eq!(
        sim.c.job_summary(job).unwrap().eta_s,
        None,
        "a finished job has none"
    );
}

/// A large job's status is a page: its counts, its failures off the page and what each
/// worker ran are whole, so that summaries stay right and the message small.
#[test]
fn a_status_page_keeps_the_counts_failures_and_worker_totals_whole() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        "[defaults]\nretries = 0\n[[task]]\nid = \"t\"\narray = \"0..30\"\ncmd = [\"x\"]\n",
    );
    let (w, mut out) = sim.join(wspec(2.0, &[]));
    // t[3] fails last (a failure ends the job); every other task succeeds.
    let mut held = None;
    loop {
        let a = assigns(&out);
        out = Vec::new();
        for (_, x) in a {
            if x.task.task.index() == 3 {
                held = Some(x);
            } else {
                out.extend(sim.finish(w, x.task, x.attempt, AttemptOutcome::Succeeded));
            }
        }
        if out.is_empty() {
            break;
        }
    }
    let x = held.expect("t[3] was assigned");
    let failed = AttemptOutcome::Failed {
        message: "boom".into(),
        retryable: false,
    };
    sim.finish(w, x.task, x.attempt, failed);
    let s = sim.c.job_status_range(job, 10, 5).unwrap();
    assert_eq!(s.total, 30);
    assert_eq!(s.tasks_from, 10);
    let ids: Vec<u32> = s.tasks.iter().map(|t| t.id.0).collect();
    assert_eq!(ids, vec![10, 11, 12, 13, 14]);
    assert!(!s.lists_every_task());
    assert_eq!((s.counts.done, s.counts.failed), (29, 1));
    let failed: Vec<&str> = s.failed_tasks().map(|t| t.name.as_str()).collect();
    assert_eq!(failed, vec!["t[3]"]);
    assert_eq!(s.per_worker.len(), 1);
    assert_eq!((s.per_worker[0].worker, s.per_worker[0].tasks), (w, 30));
    assert_eq!(s.workers.get(&w).map(String::as_str), Some("w2"));
    // A small job's status lists everything, and no failure twice.
    let all = sim.c.job_status(job).unwrap();
    assert!(all.lists_every_task() && all.failed.is_empty());
    assert_eq!(all.failed_tasks().count(), 1);
    // A page past the end is empty, not an error.
    let past = sim.c.job_status_range(job, 100, 5).unwrap();
    assert!(past.tasks.is_empty() && past.failed.len() == 1);
}

/// A worker cut off from the coordinator but not from its peers keeps its object server up
/// and may still hold outputs; once it is declared lost, nothing it holds is ever handed out
/// again: its outputs are made anew elsewhere, the next task's inputs name their new holder,
/// and when it rejoins (proving its old id) its old copies are not credited back, even for a
/// task whose output it still has. Peers only fetch from the holders an assignment names,
/// and check each object's hash, so a stale copy is never read.
#[test]
fn a_worker_declared_lost_is_never_again_a_source_of_its_old_outputs() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        "staging = \"transfer\"\n[[task]]\nid = \"a\"\ncmd = [\"a\"]\noutputs = [\"a.out\"]\n\
         [[task]]\nid = \"b\"\ncmd = [\"b\"]\nafter = [\"a\"]\nresources = { cpus = 2 }\n",
    );
    let far_spec = WorkerSpec {
        data_addr: "far:1".into(),
        ..wspec(1.0, &[])
    };
    let (far, out) = sim.join(far_spec.clone());
    let (w, a) = assigns(&out).pop().expect("a placed on the only worker");
    assert_eq!(w, far);
    let old = ObjectRef {
        path: "a.out".into(),
        hash: "old".into(),
        size: 3,
    };
    sim.finish_with(
        far,
        a.task,
        a.attempt,
        AttemptOutcome::Succeeded,
        vec![old.clone()],
        None,
        1.0,
    );
    // The link to the coordinator goes silent: declared lost. b (two CPUs) could not run
    // there anyway; its input now has no live holder.
    sim.ev(Event::WorkerLost {
        worker: far,
        reason: "no heartbeat".into(),
    });
    let near_spec = WorkerSpec {
        data_addr: "near:1".into(),
        ..wspec(2.0, &[])
    };
    let (near, out) = sim.join(near_spec);
    // a is made again on the live worker (lineage), with another output (not deterministic).
    let (w, a2) = assigns(&out).pop().expect("a made again");
    assert_eq!((w, a2.task), (near, a.task));
    let new = ObjectRef {
        path: "a.out".into(),
        hash: "new".into(),
        size: 3,
    };
    let out = sim.finish_with(
        near,
        a2.task,
        a2.attempt,
        AttemptOutcome::Succeeded,
        vec![new.clone()],
        None,
        1.0,
    );
    let (w, b) = assigns(&out).pop().expect("b placed");
    assert_eq!(w, near);
    assert_eq!(
        b.inputs,
        vec![(new.clone(), "near:1".to_string())],
        "only the new copy, from its maker"
    );
    // Then the far worker's link heals: it rejoins as its old self, claiming its old copy.
    let back = sim.c.next_worker_id();
    sim.ev(Event::WorkerJoined {
        worker: back,
        spec: far_spec,
        running: Vec::new(),
        held: vec![(a.task, old.clone())],
        previous: Some(far),
    });
    let j = &sim.c.jobs_map()[&job];
    assert_eq!(
        j.holders[&a.task.task],
        vec![near],
        "the old copy is never credited back"
    );
    assert_eq!(j.outputs[&a.task.task], vec![new]);
}

/// A worker's utilization by a job counts the CPUs each attempt held: four tasks of half a
/// CPU and two of one, 1 s each, are 4 CPU-seconds (the summary read 148% of a 1-CPU
/// worker over 4 s when it counted 6 wall seconds).
#[test]
fn busy_cpu_seconds_count_the_cpus_each_attempt_held() {
    let mut sim = Sim::new(0);
    let (job, _) = sim.submit(
        "[[task]]\nid = \"h\"\narray = \"0..4\"\ncmd = [\"x\"]\nresources = { cpus = 0.5 }\n\
         [[task]]\nid = \"f\"\narray = \"0..2\"\ncmd = [\"x\"]\n",
    );
    let (w, mut out) = sim.join(wspec(1.0, &[]));
    loop {
        let a = assigns(&out);
        out = Vec::new();
        for (_, x) in a {
            out.extend(sim.finish(w, x.task, x.attempt, AttemptOutcome::Succeeded));
        }
        if out.is_empty() {
            break;
        }
    }
    let s = sim.c.job_status(job).unwrap();
    assert_eq!(s.counts.done, 6);
    assert_eq!(s.per_worker.len(), 1);
    let share = &s.per_worker[0];
    assert_eq!(share.tasks, 6);
    assert!((share.busy_s - 6.0).abs() < 1e-9, "{share:?}");
    assert!((share.cpu_busy_s - 4.0).abs() < 1e-9, "{share:?}");
}

/// `keep_going = true`: a task that fails for good leaves the job running; what needs it
/// (directly or not) is cancelled at the end, every other task runs, and the job fails once
/// nothing more can run. Without it the same failure ends the job at once.
#[test]
fn a_job_that_keeps_going_runs_what_does_not_need_the_failed_task() {
    let file = |keep: bool| {
        format!(
            r#"
keep_going = {keep}
[defaults]
retries = 0
[[task]]
id = "bad"
cmd = ["x"]
[[task]]
id = "child"
after = ["bad"]
cmd = ["x"]
[[task]]
id = "grandchild"
after = ["child"]
cmd = ["x"]
[[task]]
id = "free"
cmd = ["y"]
"#
        )
    };
    for keep in [false, true] {
        let mut sim = Sim::new(0);
        let (job, _) = sim.submit(&file(keep));
        let (w, out) = sim.join(wspec(1.0, &[]));
        let bad = sim.tref(job, "bad");
        let free = sim.tref(job, "free");
        assert_eq!(assigns(&out)[0].1.task, bad, "{keep}");
        let out = sim.finish(w, bad, 1, failed("boom", true));
        assert_eq!(sim.state(job, "bad"), TaskState::Failed);
        if !keep {
            assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
            assert_eq!(sim.state(job, "free"), TaskState::Cancelled);
            continue;
        }
        assert!(job_finished(&out).is_empty(), "the job goes on");
        let a = assigns(&out);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].1.task, free, "the task that does not need it runs");
        let out = sim.finish(w, free, 1, AttemptOutcome::Succeeded);
        assert_eq!(job_finished(&out), vec![(job, JobState::Failed)]);
        assert_eq!(sim.state(job, "free"), TaskState::Done);
        for t in ["child", "grandchild"] {
            assert_eq!(sim.state(job, t), TaskState::Cancelled, "{t}");
        }
        let s = sim.c.job_status(job).unwrap();
        let child = &s.tasks[sim.tref(job, "child").task.index()];
        assert_eq!(
            child.message.as_deref(),
            Some("not run: it needs a task that failed")
        );
    }
}
