//! Tenants: Dominant Resource Fairness between them, and their quotas (CPUs, GPUs, running
//! jobs), with the reason a waiting job gives in its status.

use super::*;

const MANY: &str = "[[task]]\nid = \"t\"\narray = \"0..100\"\ncmd = [\"x\"]\n";

/// Tasks in flight per tenant.
fn flying(sim: &Sim) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for j in sim.c.jobs() {
        *m.entry(j.tenant.clone()).or_default() += j.counts.assigned + j.counts.running;
    }
    m
}

#[test]
fn a_tenant_that_arrives_later_gets_its_fair_share_as_tasks_end() {
    let mut sim = Sim::new(0);
    let (w, _) = sim.join(wspec(4.0, &[]));
    let (a, out) = sim.submit_as("alice", MANY);
    assert_eq!(assigns(&out).len(), 4, "alice alone takes the whole worker");
    let (b, out) = sim.submit_as("bob", MANY);
    assert!(assigns(&out).is_empty(), "nothing is preempted");
    // As alice's tasks end, bob (the smaller dominant share) gets the freed CPUs until
    // both hold 2; then they alternate.
    let mut next_a = 0u32;
    for _ in 0..2 {
        let t = TaskRef {
            job: a,
            task: TaskId::new(next_a),
        };
        next_a += 1;
        let out = sim.finish(w, t, 1, AttemptOutcome::Succeeded);
        let got: Vec<JobId> = assigns(&out).iter().map(|(_, x)| x.task.job).collect();
        assert_eq!(got, vec![b], "the freed CPU goes to bob");
    }
    assert_eq!(flying(&sim)["alice"], 2);
    assert_eq!(flying(&sim)["bob"], 2);
    // Equal shares: the tie goes to the tenant with the older job (alice), then bob.
    let t = TaskRef {
        job: a,
        task: TaskId::new(next_a),
    };
    let out = sim.finish(w, t, 1, AttemptOutcome::Succeeded);
    assert_eq!(assigns(&out)[0].1.task.job, a);
    let bt = TaskRef {
        job: b,
        task: TaskId::new(0),
    };
    let out = sim.finish(w, bt, 1, AttemptOutcome::Succeeded);
    assert_eq!(assigns(&out)[0].1.task.job, b);
    assert_eq!(flying(&sim)["alice"], 2);
    assert_eq!(flying(&sim)["bob"], 2);
}

#[test]
fn dominant_shares_count_gpus_against_cpus() {
    // Alice's tasks take 1 GPU (of 2) and half a CPU each, bob's 1 CPU (of 8): one alice
    // task is a dominant share of 1/2, worth four of bob's.
    let gpu = "[[task]]\nid = \"g\"\narray = \"0..10\"\ncmd = [\"x\"]\nresources = { cpus = 0.5, gpus = 1 }\n";
    let cpu = "[[task]]\nid = \"c\"\narray = \"0..10\"\ncmd = [\"x\"]\n";
    // Both wait for a worker, as after a coordinator restart.
    let mut sim = Sim::new(0);
    let (a, _) = sim.submit_as("alice", gpu);
    let (b, _) = sim.submit_as("bob", cpu);
    let (_, out) = sim.join(wspec(8.0, &[16 << 30, 16 << 30]));
    let order: Vec<&str> = assigns(&out)
        .iter()
        .map(|(_, x)| {
            if x.task.job == a {
                "a"
            } else if x.task.job == b {
                "b"
            } else {
                "?"
            }
        })
        .collect();
    // Equal shares go to the older job: alice (1/2); bob until 4/8 = 1/2; alice's second
    // GPU (share 1); bob fills the 7 CPUs alice's two tasks leave.
    assert_eq!(order, ["a", "b", "b", "b", "b", "a", "b", "b", "b"]);
}

#[test]
fn quotas_cap_cpus_and_running_jobs_and_say_why_a_job_waits() {
    let mut sim = Sim::new(0);
    let mut q = BTreeMap::new();
    q.insert(
        "alice".to_string(),
        Quota {
            cpus: Some(2.0),
            running_jobs: Some(1),
            ..Quota::default()
        },
    );
    sim.c.set_quotas(q);
    let (w, _) = sim.join(wspec(8.0, &[]));
    let (a1, out) = sim.submit_as("alice", MANY);
    assert_eq!(assigns(&out).len(), 2, "her CPU quota");
    let s = sim.c.job_status(a1).unwrap();
    let why = s.waiting.expect("a reason");
    assert!(
        why.contains(
            "tenant \"alice\" holds 2 CPUs and 0 GPUs of its quota (2 CPUs, no limit on GPUs)"
        ) && why.contains("wait for its running ones"),
        "{why}"
    );
    let (a2, out) = sim.submit_as("alice", MANY);
    assert!(assigns(&out).is_empty());
    let why = sim.c.job_status(a2).unwrap().waiting.expect("a reason");
    assert!(why.contains("its --running-jobs quota"), "{why}");
    // Others are not held back by her quota.
    let (b, out) = sim.submit_as("bob", MANY);
    assert_eq!(assigns(&out).len(), 6);
    assert!(sim.c.job_status(b).unwrap().waiting.is_none());
    // Her first job ends (cancelled): the second one runs, within her CPUs.
    let out = sim.ev(Event::JobCancelled { job: a1 });
    for (worker, task, attempt) in cancels(&out) {
        sim.ev(Event::TaskFinished {
            worker,
            task,
            attempt,
            result: AttemptResult {
                outcome: AttemptOutcome::Cancelled,
                usage: Usage::default(),
                outputs: vec![],
                variant: None,
            },
        });
    }
    let f = flying(&sim);
    assert_eq!(f["alice"], 2, "{f:?}");
    assert!(sim.c.job_status(a2).unwrap().counts.assigned > 0);
    let _ = w;
}

#[test]
fn a_request_id_names_a_submission_of_its_tenant_until_the_job_is_removed_and_after_a_replay() {
    let mut sim = Sim::new(0);
    let (a, _) = sim.submit_as("alice", MANY);
    sim.c.note_submission(a, "alice", "req-1");
    assert_eq!(sim.c.submission("alice", "req-1"), Some(a));
    assert_eq!(
        sim.c.submission("bob", "req-1"),
        None,
        "another tenant's id"
    );
    assert_eq!(sim.c.submission("alice", "req-2"), None);
    // The record it journals gives the same answer to a coordinator that replays it.
    let records = sim.c.take_journal_records();
    let key = records
        .iter()
        .find_map(|r| match r {
            JournalRecord::Submission { job, key } if *job == a => Some(key.clone()),
            _ => None,
        })
        .expect("a Submission record");
    let mut replayed = Sim::new(0);
    let (b, _) = replayed.submit_as("alice", MANY);
    assert_eq!(b, a);
    let mut out = Vec::new();
    replayed
        .c
        .replay(0, JournalRecord::Submission { job: a, key }, &mut out)
        .expect("replay");
    assert_eq!(replayed.c.submission("alice", "req-1"), Some(a));
    // Removed, the job no longer answers for the id.
    sim.ev(Event::JobCancelled { job: a });
    sim.ev(Event::JobRemoved { job: a });
    assert_eq!(sim.c.submission("alice", "req-1"), None);
}

/// A task larger than its tenant's whole CPU quota, with nothing of the tenant running: the
/// reason said it waited "for its running ones", which would never end.
#[test]
fn a_task_larger_than_the_whole_quota_says_it_cannot_run() {
    let mut sim = Sim::new(0);
    let mut q = BTreeMap::new();
    q.insert(
        "frank".to_string(),
        Quota {
            cpus: Some(0.5),
            ..Quota::default()
        },
    );
    sim.c.set_quotas(q);
    sim.join(wspec(8.0, &[]));
    let (job, out) = sim.submit_as("frank", "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n");
    assert!(assigns(&out).is_empty());
    let why = sim.c.job_status(job).unwrap().waiting.expect("a reason");
    assert!(
        why.contains(
            "task a needs more than the tenant's whole quota (0.5 CPUs, no limit on GPUs)"
        ) && why.contains("flotilla admin tenant set frank --cpus N"),
        "{why}"
    );
}

/// A job whose task can never fit its tenant's quota held back every other job of the
/// tenant, idle workers and all (found by a new operator's walkthrough); the other jobs
/// run, and only that one says why it waits.
#[test]
fn a_task_larger_than_the_whole_quota_holds_back_no_other_job() {
    let mut sim = Sim::new(0);
    let mut q = BTreeMap::new();
    q.insert(
        "bob".to_string(),
        Quota {
            cpus: Some(2.0),
            ..Quota::default()
        },
    );
    sim.c.set_quotas(q);
    sim.join(wspec(8.0, &[]));
    let (huge, out) = sim.submit_as(
        "bob",
        "[[task]]\nid = \"h\"\ncmd = [\"x\"]\nresources = { cpus = 64 }\n",
    );
    assert!(assigns(&out).is_empty());
    let (small, out) = sim.submit_as(
        "bob",
        "[[task]]\nid = \"s\"\ncmd = [\"x\"]\narray = \"0..3\"\n",
    );
    // Two of its three tasks fit the quota's 2 CPUs at once.
    assert_eq!(assigns(&out).len(), 2, "{out:?}");
    let why = sim.c.job_status(huge).unwrap().waiting.expect("a reason");
    assert!(
        why.contains("task h needs more than the tenant's whole quota"),
        "{why}"
    );
    let s = sim.c.job_status(small).unwrap();
    assert!(
        s.waiting.as_deref().is_none_or(|w| !w.contains("task h")),
        "{:?}",
        s.waiting
    );
}

/// Two tenants' jobs of the same name learn apart: a tenant could read another's runtimes
/// through the model by naming a job alike, and their samples mixed.
#[test]
fn tenants_jobs_of_one_name_have_codelets_of_their_own() {
    let mut sim = Sim::new(0);
    sim.join(wspec(8.0, &[]));
    let file = "name = \"w\"\n[[task]]\nid = \"map\"\ncmd = [\"x\"]\n";
    let (a, _) = sim.submit_as("alice", file);
    let (b, _) = sim.submit_as("bob", file);
    let (c, _) = sim.submit_as(crate::access::ADMIN_TENANT, file);
    let codelet = |j| sim.c.jobs_map()[&j].classes[0].codelet.clone();
    assert_eq!(codelet(a), "alice:w/map");
    assert_eq!(codelet(b), "bob:w/map");
    assert_eq!(codelet(c), "w/map");
}
