//! Gangs (`group = { size = N }`): all-or-nothing placement, ranks and rendezvous keys,
//! restarts of the whole gang counted as one retry.

use super::tests::{assigns, wspec, Sim};
use super::*;

fn gang_job(size: u32, retries: u32) -> String {
    format!(
        "name = \"g\"\n[defaults]\nretries = {retries}\n[[task]]\nid = \"train\"\ncmd = [\"train\"]\ngroup = {{ size = {size} }}\nresources = {{ cpus = 1 }}\n"
    )
}

fn failed(message: &str) -> AttemptOutcome {
    AttemptOutcome::Failed {
        message: message.into(),
        retryable: true,
    }
}

fn gangs(out: &[Command]) -> Vec<(WorkerId, String, GangAssignment)> {
    assigns(out)
        .into_iter()
        .map(|(w, a)| (w, a.name.clone(), a.gang.clone().expect("a gang member")))
        .collect()
}

#[test]
fn a_gang_is_placed_all_at_once_or_not_at_all() {
    let mut sim = Sim::new(2);
    let (w1, _) = sim.join(wspec(2.0, &[]));
    let (job, out) = sim.submit(&gang_job(3, 0));
    assert!(
        assigns(&out).is_empty(),
        "2 free cpus for a gang of 3: nothing starts, nothing is queued"
    );
    assert_eq!(sim.state(job, "train[0]"), TaskState::Ready);
    let (w2, out) = sim.join(wspec(1.0, &[]));
    let g = gangs(&out);
    assert_eq!(g.len(), 3);
    let mut ranks: Vec<u32> = g.iter().map(|x| x.2.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, vec![0, 1, 2]);
    assert!(g.iter().all(|x| x.2.size == 3 && x.2.key == g[0].2.key));
    assert_eq!(g.iter().filter(|x| x.0 == w1).count(), 2);
    assert_eq!(g.iter().filter(|x| x.0 == w2).count(), 1);
    for (_, name, gang) in &g {
        assert_eq!(name, &format!("train[{}]", gang.rank));
    }
    // Nothing queued: every member holds reserved resources.
    let w = &sim.c.workers_map()[&w1];
    assert!(w.queue.is_empty() && w.slots.values().all(|s| s.reserved));
}

#[test]
fn gangs_of_an_array_take_turns_when_only_one_fits() {
    let mut sim = Sim::new(2);
    let (w, _) = sim.join(wspec(2.0, &[]));
    let text = "[[task]]\nid = \"r\"\narray = \"0..4\"\ncmd = [\"r\"]\ngroup = { size = 2 }\nresources = { cpus = 1 }\n";
    let (job, out) = sim.submit(text);
    let first = gangs(&out);
    assert_eq!(
        first.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(),
        vec!["r[0]", "r[1]"]
    );
    assert_eq!(sim.state(job, "r[2]"), TaskState::Ready);
    let a0 = sim.tref(job, "r[0]");
    let a1 = sim.tref(job, "r[1]");
    let out = sim.finish(w, a0, 1, AttemptOutcome::Succeeded);
    assert!(
        assigns(&out).is_empty(),
        "one free cpu does not fit the next gang of 2"
    );
    let out = sim.finish(w, a1, 1, AttemptOutcome::Succeeded);
    let second = gangs(&out);
    assert_eq!(
        second.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(),
        vec!["r[2]", "r[3]"]
    );
    assert_ne!(second[0].2.key, first[0].2.key);
    assert_eq!((second[0].2.rank, second[1].2.rank), (0, 1));
}

#[test]
fn a_failed_member_restarts_the_whole_gang_counting_one_retry() {
    let mut sim = Sim::new(0);
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (w2, _) = sim.join(wspec(1.0, &[]));
    let (job, out) = sim.submit(&gang_job(2, 1));
    let first = gangs(&out);
    assert_eq!(first.len(), 2);
    let r0 = sim.tref(job, "train[0]");
    let r1 = sim.tref(job, "train[1]");
    let (on0, on1) = (
        first.iter().find(|x| x.2.rank == 0).unwrap().0,
        first.iter().find(|x| x.2.rank == 1).unwrap().0,
    );
    assert_ne!(on0, on1);
    assert!([w1, w2].contains(&on0));
    for (w, t) in [(on0, r0), (on1, r1)] {
        sim.ev(Event::TaskStarted {
            worker: w,
            task: t,
            attempt: 1,
        });
    }
    // Rank 1 crashes: rank 0 is told to stop.
    let out = sim.finish(on1, r1, 1, failed("exit 3"));
    assert_eq!(sim.state(job, "train[1]"), TaskState::Backoff);
    assert_eq!(
        super::tests::cancels_of(&out),
        vec![(on0, r0, 1)],
        "the other member is cancelled"
    );
    // Rank 0's collective fails (its peer died): that is the same restart, not a new failure.
    let out = sim.finish(on0, r0, 1, failed("peer 1 lost"));
    assert!(assigns(&out).is_empty(), "rank 1 is still in backoff");
    assert_eq!(sim.state(job, "train[0]"), TaskState::Ready);
    assert_eq!(sim.c.job_status(job).unwrap().retries, 1);
    // Backoff over: the gang starts again as a whole, under a new key.
    sim.now += 1_000;
    let out = sim.ev(Event::Tick);
    let second = gangs(&out);
    assert_eq!(second.len(), 2);
    assert_ne!(second[0].2.key, first[0].2.key);
    assert!(second.iter().all(|x| x.2.key.ends_with("-2")));
    // A second failure: no retries left (one per gang restart), the job fails.
    let on0 = second.iter().find(|x| x.2.rank == 0).unwrap().0;
    let out = sim.finish(on0, r0, 2, failed("exit 3"));
    assert_eq!(sim.state(job, "train[0]"), TaskState::Failed);
    assert_eq!(
        sim.c.job_status(job).unwrap().state,
        JobState::Failed,
        "{out:?}"
    );
}

#[test]
fn a_lost_worker_restarts_the_gang_without_counting_a_retry() {
    let mut sim = Sim::new(0);
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (w2, _) = sim.join(wspec(1.0, &[]));
    let (job, out) = sim.submit(&gang_job(2, 0));
    let first = gangs(&out);
    let on_w2 = first.iter().find(|x| x.0 == w2).unwrap();
    let other = first.iter().find(|x| x.0 == w1).unwrap();
    let other_ref = sim.tref(job, &other.1);
    let out = sim.ev(Event::WorkerLost {
        worker: w2,
        reason: "heartbeat".into(),
    });
    assert_eq!(super::tests::cancels_of(&out), vec![(w1, other_ref, 1)]);
    assert_eq!(sim.state(job, &on_w2.1), TaskState::Ready);
    // The survivor reports its failure (its peer vanished): not counted, retries = 0 holds.
    let out = sim.finish(w1, other_ref, 1, failed("peer lost"));
    assert_eq!(sim.state(job, &other.1), TaskState::Ready);
    assert!(assigns(&out).is_empty(), "one cpu left for a gang of 2");
    let (_, out) = sim.join(wspec(1.0, &[]));
    assert_eq!(gangs(&out).len(), 2);
    assert_eq!(sim.c.job_status(job).unwrap().retries, 0);
}

#[test]
fn a_member_that_finished_reruns_when_its_gang_restarts() {
    let mut sim = Sim::new(0);
    let (w, _) = sim.join(wspec(2.0, &[]));
    let (job, _) = sim.submit(&gang_job(2, 3));
    let r0 = sim.tref(job, "train[0]");
    let r1 = sim.tref(job, "train[1]");
    sim.finish(w, r1, 1, AttemptOutcome::Succeeded);
    assert_eq!(sim.state(job, "train[1]"), TaskState::Done);
    sim.finish(w, r0, 1, failed("exit 1"));
    sim.now += 1_000;
    let out = sim.ev(Event::Tick);
    let again = gangs(&out);
    assert_eq!(again.len(), 2, "both ranks run again");
    let out = sim.finish(w, r0, 2, AttemptOutcome::Succeeded);
    assert!(out
        .iter()
        .all(|c| !matches!(c, Command::Notify(Notification::JobFinished { .. }))));
    sim.finish(w, r1, 2, AttemptOutcome::Succeeded);
    assert_eq!(sim.c.job_status(job).unwrap().state, JobState::Succeeded);
}

/// In transfer staging a preempted member's checkpoint is every member's to resume from:
/// rank 0 alone writes a data-parallel job's checkpoint, and rank 1, stopped with it,
/// started from nothing (the ranks then disagreed on the step and the job failed). Every
/// member gets the union; at one path, the files kept last (the newer) win.
#[test]
fn a_preempted_member_s_checkpoint_resumes_the_whole_gang() {
    let mut sim = Sim::new(0);
    let (w1, _) = sim.join(wspec(1.0, &[]));
    let (w2, _) = sim.join(wspec(1.0, &[]));
    let job_file = format!(
        "staging = \"transfer\"\n{}checkpoint = [\"ckpt/*\"]\n",
        gang_job(2, 0)
    );
    let (job, out) = sim.submit(&job_file);
    let first = gangs(&out);
    assert_eq!(first.len(), 2);
    let on = |g: &[(WorkerId, String, GangAssignment)], rank| {
        g.iter().find(|x| x.2.rank == rank).unwrap().0
    };
    let (r0, r1) = (sim.tref(job, "train[0]"), sim.tref(job, "train[1]"));
    for (w, t) in [(on(&first, 0), r0), (on(&first, 1), r1)] {
        sim.ev(Event::TaskStarted {
            worker: w,
            task: t,
            attempt: 1,
        });
    }
    let file = |path: &str, c: char| ObjectRef {
        path: path.into(),
        hash: c.to_string().repeat(64),
        size: 1,
    };
    // Rank 1 preempted first, with a shard of its own and an older `latest`.
    let out = sim.finish(
        on(&first, 1),
        r1,
        1,
        AttemptOutcome::Preempted {
            checkpoint: vec![file("ckpt/rank1", 'a'), file("ckpt/latest", 'b')],
        },
    );
    assert_eq!(super::tests::cancels_of(&out), vec![(on(&first, 0), r0, 1)]);
    // Rank 0, stopping with its gang, is preempted too (its worker drained), with newer files.
    // The gang is placed again at once, on the same two workers (in a real drain they would
    // be others).
    let out = sim.finish(
        on(&first, 0),
        r0,
        1,
        AttemptOutcome::Preempted {
            checkpoint: vec![file("ckpt/rank0", 'c'), file("ckpt/latest", 'd')],
        },
    );
    let _ = (w1, w2);
    let second = assigns(&out);
    assert_eq!(second.len(), 2, "{out:?}");
    let resume = |rank: u32| -> Vec<(String, String)> {
        let a = &second
            .iter()
            .find(|(_, a)| a.gang.as_ref().is_some_and(|g| g.rank == rank))
            .unwrap()
            .1;
        let mut r: Vec<(String, String)> = a
            .resume
            .iter()
            .map(|o| (o.path.clone(), o.hash[..1].to_string()))
            .collect();
        r.sort();
        r
    };
    let want = |own: (&str, &str)| {
        let mut v = vec![
            ("ckpt/latest".to_string(), "d".to_string()),
            ("ckpt/rank0".to_string(), "c".to_string()),
        ];
        v.push((own.0.to_string(), own.1.to_string()));
        v.sort();
        v.dedup();
        v
    };
    // Every member resumes from the union, the newer `latest` winning.
    assert_eq!(resume(1), want(("ckpt/rank1", "a")));
    assert_eq!(resume(0), want(("ckpt/rank1", "a")));
}

/// A gang's members get PyTorch's `env://` settings: their rank among the members on their
/// host, and where rank 0 is reached (loopback when they share one host, else rank 0's
/// data address or host name) on a port from the gang's key, another on each restart.
#[test]
fn gang_members_are_told_their_local_rank_and_where_rank_0_listens() {
    let mut sim = Sim::new(0);
    let host = |name: &str, data: &str| WorkerSpec {
        hostname: name.into(),
        data_addr: data.into(),
        ..wspec(2.0, &[])
    };
    sim.join(host("a", "10.1.0.7:7001"));
    sim.join(host("b", "127.0.0.1:7002"));
    // 2 CPUs on each host: a gang of 4 one-CPU members fills both, two per host.
    let (job, out) = sim.submit(&gang_job(4, 1));
    let mut g: Vec<GangAssignment> = gangs(&out).into_iter().map(|x| x.2).collect();
    g.sort_by_key(|m| m.rank);
    assert_eq!(g.len(), 4);
    let on: Vec<(u32, u32)> = g.iter().map(|m| (m.local_rank, m.local_size)).collect();
    assert!(on.iter().all(|(_, n)| *n == 2), "{on:?}");
    let mut locals: Vec<u32> = on.iter().map(|(r, _)| *r).collect();
    locals.sort_unstable();
    assert_eq!(locals, vec![0, 0, 1, 1]);
    assert_eq!(g[0].local_rank, 0, "rank 0 is first on its host");
    assert!(g.iter().all(|m| m.master_addr == g[0].master_addr));
    assert!(
        ["10.1.0.7", "b"].contains(&g[0].master_addr.as_str()),
        "rank 0's data address, or its host name where that is loopback: {}",
        g[0].master_addr
    );
    assert!(g.iter().all(|m| m.master_port == g[0].master_port));
    assert_eq!(g[0].master_port, gang_port(&g[0].key));
    assert!((GANG_PORT_BASE..GANG_PORT_BASE + GANG_PORTS).contains(&g[0].master_port));
    // Another incarnation, another port (the key names it).
    assert_ne!(gang_port("job-1-t0-1"), gang_port("job-1-t0-2"));
    let _ = job;

    // One machine for the whole gang: loopback, unless its data address is one others reach.
    for (data, master) in [
        ("127.0.0.1:7001", "127.0.0.1"),
        ("10.1.0.9:7001", "10.1.0.9"),
    ] {
        let mut sim = Sim::new(0);
        sim.join(host("solo", data));
        let (_, out) = sim.submit(&gang_job(2, 0));
        let g = gangs(&out);
        assert_eq!(g.len(), 2);
        assert!(
            g.iter()
                .all(|x| x.2.master_addr == master && x.2.local_size == 2),
            "{data}: {g:?}"
        );
    }
    // Two pods of one node: the node's name, two networks (data addresses): not local to
    // each other, and rank 0 is reached at its own IP.
    let mut sim = Sim::new(0);
    sim.join(WorkerSpec {
        hostname: "node-1".into(),
        data_addr: "10.2.0.4:7001".into(),
        ..wspec(1.0, &[])
    });
    sim.join(WorkerSpec {
        hostname: "node-1".into(),
        data_addr: "10.2.0.5:7001".into(),
        ..wspec(1.0, &[])
    });
    let (_, out) = sim.submit(&gang_job(2, 0));
    let g = gangs(&out);
    assert_eq!(g.len(), 2);
    assert!(
        g.iter().all(|x| x.2.local_size == 1 && x.2.local_rank == 0),
        "{g:?}"
    );
    let rank0 = g.iter().find(|x| x.2.rank == 0).unwrap();
    assert!(
        ["10.2.0.4", "10.2.0.5"].contains(&rank0.2.master_addr.as_str()),
        "{g:?}"
    );
}
