//! The shared pool in the state machine: where pool jobs may run, holds and settlement,
//! verification by replicas, budgets, and the same ledger and verdicts after a replay.

use flotilla_pool::{Account, Credits, Price};

use super::*;

/// A coordinator whose journal is kept as the server keeps it (each journaled event's
/// record, then the records the coordinator made while applying it).
struct Pooled {
    sim: Sim,
    journal: Vec<JournalRecord>,
}

impl Pooled {
    fn new() -> Pooled {
        Pooled {
            sim: Sim::new(0),
            journal: Vec::new(),
        }
    }

    fn ev(&mut self, e: Event) -> Vec<Command> {
        let rec = JournalRecord::from_event(&e);
        let out = self.sim.ev(e);
        self.journal.extend(rec);
        self.journal.extend(self.sim.c.take_journal_records());
        out
    }

    fn join(&mut self, spec: WorkerSpec) -> (WorkerId, Vec<Command>) {
        let id = self.sim.c.next_worker_id();
        let out = self.ev(Event::WorkerJoined {
            worker: id,
            spec,
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        });
        (id, out)
    }

    fn submit(&mut self, tenant: &str, text: &str) -> (JobId, Vec<Command>) {
        let spec = parse_job(text, "job.toml").expect("a valid job");
        let job = self.sim.c.next_job_id();
        let out = self.ev(Event::JobSubmitted {
            job,
            spec,
            dir: "/jobs".into(),
            tenant: tenant.into(),
        });
        (job, out)
    }

    /// Attempt `attempt` of `t` succeeded on `w` with one output of hash `hash`, using
    /// `cpu_s` CPU seconds.
    fn done(
        &mut self,
        w: WorkerId,
        t: TaskRef,
        attempt: u32,
        hash: &str,
        cpu_s: f64,
    ) -> Vec<Command> {
        self.ev(Event::TaskFinished {
            worker: w,
            task: t,
            attempt,
            result: AttemptResult {
                outcome: AttemptOutcome::Succeeded,
                usage: Usage {
                    cpu_seconds: cpu_s,
                    peak_rss_bytes: 0,
                    wall_seconds: cpu_s,
                    ..Default::default()
                },
                outputs: vec![ObjectRef {
                    path: "out.txt".into(),
                    hash: hash.into(),
                    size: 1,
                }],
                variant: None,
            },
        })
    }

    /// Grants `t` `n` credits.
    fn grant(&mut self, n: i64) {
        self.ev(Event::CreditsGranted {
            tenant: "t".into(),
            amount: Credits::whole(n),
        });
    }

    /// Three providers, the first (`mallory`, cheapest) returning wrong results; its id.
    fn three_providers(&mut self) -> WorkerId {
        let (bad, _) = self.join(provider("mallory", 1.0, "1"));
        self.join(provider("alice", 1.0, "2"));
        self.join(provider("bob", 1.0, "3"));
        bad
    }

    /// Runs every assignment in `out` (wrong on `bad`, right elsewhere, 1 s each): the
    /// commands that follows.
    fn round(&mut self, out: &[Command], bad: WorkerId) -> Vec<Command> {
        let mut next = Vec::new();
        for (w, a) in assigns(out) {
            let hash = if w == bad { "wrong" } else { "right" };
            next.extend(self.done(w, a.task, a.attempt, hash, 1.0));
        }
        next
    }

    fn balance(&self, a: Account) -> Credits {
        self.sim.c.ledger().balance(&a)
    }
}

/// A provider's worker: `cpus` CPUs at `cpu_price` credits per CPU-hour.
fn provider(name: &str, cpus: f64, cpu_price: &str) -> WorkerSpec {
    WorkerSpec {
        name: format!("{name}-w"),
        data_addr: format!("addr-{name}"),
        provider: Some(name.into()),
        price: Price::parse(&format!("cpu={cpu_price}")).expect("a price"),
        ..wspec(cpus, &[])
    }
}

fn pool_job(n: usize, pool: &str) -> String {
    format!(
        "name = \"p\"\nstaging = \"transfer\"\n[pool]\n{pool}\n[[task]]\nid = \"t\"\narray = \
         \"0..{n}\"\ncmd = [\"work\", \"{{i}}\"]\noutputs = [\"out.txt\"]\ntimeout = \"10s\"\n"
    )
}

fn tenant(name: &str) -> Account {
    Account::Tenant(name.into())
}

/// Credits per CPU-second when the price is 3600 per CPU-hour.
const SECOND: &str = "3600";

#[test]
fn a_job_without_a_pool_section_never_lands_on_a_provider_s_machine() {
    let mut p = Pooled::new();
    let (pw, _) = p.join(provider("alice", 4.0, SECOND));
    let (job, out) = p.submit("t", "[[task]]\nid = \"a\"\ncmd = [\"a\"]\n");
    assert!(assigns(&out).is_empty(), "not on {pw}");
    // It says why it waits (it said nothing).
    let why = p.sim.c.job_status(job).unwrap().waiting.unwrap_or_default();
    assert!(
        why.starts_with("task a waits: the job has no [pool] section"),
        "{why}"
    );
    let (own, out) = p.join(wspec(1.0, &[]));
    assert_eq!(assigns(&out)[0].0, own);
    assert_eq!(p.sim.state(job, "a"), TaskState::Assigned);
    // trusted-only: the same.
    let (job2, out) = p.submit(
        "t",
        "[pool]\ntrust = \"trusted-only\"\n[[task]]\nid = \"b\"\ncmd = [\"b\"]\n",
    );
    assert!(assigns(&out).is_empty());
    assert_eq!(p.sim.state(job2, "b"), TaskState::Ready);
    // It waits for room on the operator's worker, not for a rule: no reason given.
    assert_eq!(p.sim.c.job_status(job2).unwrap().waiting, None);
    assert_eq!(p.sim.c.job_status(job).unwrap().waiting, None);
}

#[test]
fn a_replica_with_no_other_provider_connected_says_why_it_waits() {
    // verify = 2 on a pool of one provider: the second replica waited for ever, silently.
    let mut p = Pooled::new();
    p.grant(1000);
    let (a, _) = p.join(provider("alice", 1.0, SECOND));
    let (job, out) = p.submit("t", &pool_job(1, "verify = 2"));
    let (w, first) = &assigns(&out)[0];
    assert_eq!(*w, a);
    assert_eq!(p.sim.c.job_status(job).unwrap().waiting, None, "it runs");
    let out = p.done(a, first.task, 1, "good", 2.0);
    assert!(assigns(&out).is_empty());
    let why = p.sim.c.job_status(job).unwrap().waiting.unwrap_or_default();
    assert!(
        why.starts_with("task t[0] waits: provider alice ran it already")
            && why.contains("2 distinct providers"),
        "{why}"
    );
    // A second provider joins: the replica runs there, and the reason is gone.
    let (b, out) = p.join(provider("bob", 1.0, SECOND));
    assert_eq!(assigns(&out)[0].0, b);
    assert_eq!(p.sim.c.job_status(job).unwrap().waiting, None);
    // A price above the job's max_price is named.
    let (job2, out) = p.submit("t", &pool_job(1, "max_price = { cpu = 1 }"));
    assert!(assigns(&out).is_empty());
    let why = p
        .sim
        .c
        .job_status(job2)
        .unwrap()
        .waiting
        .unwrap_or_default();
    assert!(why.contains("provider alice asks cpu=3600"), "{why}");
    let (job3, _) = p.submit("t", &pool_job(1, "trust = \"trusted-only\""));
    let why = p
        .sim
        .c
        .job_status(job3)
        .unwrap()
        .waiting
        .unwrap_or_default();
    assert!(why.contains("trust = \"trusted-only\""), "{why}");
}

#[test]
fn quorum_two_runs_on_two_providers_pays_both_and_charges_the_consumer_once_each() {
    let mut p = Pooled::new();
    p.grant(1000);
    let (a, _) = p.join(provider("alice", 1.0, SECOND));
    let (b, _) = p.join(provider("bob", 1.0, SECOND));
    let (job, out) = p.submit("t", &pool_job(1, "verify = 2"));
    let first = assigns(&out);
    assert_eq!(first.len(), 1, "one replica at a time");
    let (w1, a1) = &first[0];
    let t = a1.task;
    // Held: 10 s × 1 CPU × 1 credit/s.
    assert_eq!(p.balance(Account::Escrow("t".into())), Credits::whole(10));
    let out = p.done(*w1, t, 1, "good", 2.0);
    assert_eq!(
        p.sim.state(job, "t[0]"),
        TaskState::Assigned,
        "a second replica"
    );
    let (w2, a2) = &assigns(&out)[0];
    assert_ne!(w1, w2, "on another provider");
    assert!([a, b].contains(w2));
    assert_eq!(a2.attempt, 2);
    let out = p.done(*w2, t, 2, "good", 3.0);
    assert_eq!(p.sim.state(job, "t[0]"), TaskState::Done);
    assert_eq!(job_finished(&out), vec![(job, JobState::Succeeded)]);
    // 2 + 3 credits, 5 % to the platform.
    assert_eq!(p.balance(tenant("t")), Credits::whole(995));
    assert_eq!(p.balance(Account::Escrow("t".into())), Credits::ZERO);
    assert_eq!(p.balance(Account::Platform), Credits::micro(250_000));
    let paid =
        p.balance(Account::Provider("alice".into())) + p.balance(Account::Provider("bob".into()));
    assert_eq!(paid, Credits::micro(4_750_000));
    assert_eq!(p.sim.c.ledger().total(), Credits::whole(1000));
    let s = p.sim.c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].cost, Some(5.0));
    // Where it ran is both providers that agreed, whose runs its cost paid (it showed one
    // provider, and the placement of the second replica, or none).
    let shown = &s.tasks[0];
    assert_eq!(shown.agreed, ["alice", "bob"]);
    assert_eq!(
        shown.placement.as_ref().map(|r| r.why.as_str()),
        Some("verified: the results of alice and bob agree")
    );
    assert_eq!(s.pool.as_ref().unwrap().spent, 5.0);
    // A duplicate report changes nothing.
    p.done(*w2, t, 2, "good", 3.0);
    assert_eq!(p.balance(tenant("t")), Credits::whole(995));
}

#[test]
fn a_corrupting_provider_is_outvoted_unpaid_and_then_gets_no_work() {
    let mut p = Pooled::new();
    p.grant(1000);
    let bad = p.three_providers();
    let (job, mut out) = p.submit("t", &pool_job(6, "verify = 2"));
    let mut guard = 0;
    while p.sim.c.job_summary(job).unwrap().state == JobState::Running {
        guard += 1;
        assert!(guard < 100, "the job ends");
        assert!(
            !assigns(&out).is_empty(),
            "something runs: {:?}",
            p.sim.c.job_status(job)
        );
        out = p.round(&out, bad);
    }
    assert_eq!(p.sim.c.job_summary(job).unwrap().state, JobState::Succeeded);
    let rep = p.sim.c.reputation("mallory");
    assert!(rep.rejected >= 2 && rep.accepted == 0, "{rep:?}");
    assert!(!p.sim.c.provider_eligible("mallory"));
    assert_eq!(
        p.balance(Account::Provider("mallory".into())),
        Credits::ZERO
    );
    assert!(p.sim.c.job_status(job).unwrap().pool.unwrap().rejected >= 2);
    // Every accepted result is the right one, and nothing stays held.
    assert_eq!(p.balance(Account::Escrow("t".into())), Credits::ZERO);
    assert_eq!(p.sim.c.ledger().total(), Credits::whole(1000));
    // Excluded: a new job's tasks never go to mallory.
    let (_, out) = p.submit("t", &pool_job(3, "verify = 2"));
    assert!(assigns(&out).iter().all(|(w, _)| *w != bad));
}

#[test]
fn the_cheapest_provider_with_room_is_chosen_and_max_price_is_kept() {
    let mut p = Pooled::new();
    p.grant(1000);
    let (dear, _) = p.join(provider("dear", 1.0, "5"));
    let (cheap, _) = p.join(provider("cheap", 1.0, "1"));
    let (_, out) = p.submit("t", &pool_job(3, "verify = 1\nmax_price = { cpu = 4 }"));
    let placed = assigns(&out);
    assert_eq!(
        placed.len(),
        1,
        "one fits on the cheap one; dear is above max_price"
    );
    assert_eq!(placed[0].0, cheap);
    assert!(
        placed[0].1.reason.why.contains("cheapest"),
        "{}",
        placed[0].1.reason.why
    );
    let (_, out) = p.submit("t", &pool_job(1, "verify = 1"));
    assert_eq!(
        assigns(&out)[0].0,
        dear,
        "the cheap one is full: the next tier"
    );
}

#[test]
fn a_job_out_of_budget_pauses_and_a_raise_resumes_it() {
    let mut p = Pooled::new();
    p.grant(1000);
    let (w, _) = p.join(provider("alice", 1.0, SECOND));
    // Each attempt holds 10 credits; the budget is 15.
    let (job, out) = p.submit("t", &pool_job(3, "verify = 1\nbudget = 15"));
    let (_, a) = assigns(&out).pop().expect("the first fits");
    let out = p.done(w, a.task, a.attempt, "x", 4.0);
    // Spent 4: 11 left, enough for one more hold.
    let (_, a) = assigns(&out).pop().expect("the second fits");
    let out = p.done(w, a.task, a.attempt, "x", 4.0);
    // Spent 8: 7 left < 10.
    assert!(assigns(&out).is_empty());
    let s = p.sim.c.job_summary(job).unwrap();
    let why = s.waiting.expect("says why");
    // What the next attempt needs, what is left, and what a hold is.
    assert!(
        why.contains("out of budget: its next task's hold is 10 credits, its budget has 7 left")
            && why.contains("holds its price for the task's timeout")
            && why.contains(&format!("`flotilla budget {} +N`", job.0)),
        "{why}"
    );
    assert_eq!(s.pool.unwrap().spent, 8.0);
    let out = p.ev(Event::BudgetRaised {
        job,
        amount: Credits::whole(50),
    });
    let (_, a) = assigns(&out).pop().expect("resumed");
    p.done(w, a.task, a.attempt, "x", 1.0);
    let s = p.sim.c.job_summary(job).unwrap();
    assert_eq!(s.state, JobState::Succeeded);
    assert_eq!(s.pool.unwrap().budget, Some(65.0));
    // A tenant with no credits: paused, saying so.
    let (job2, _) = p.submit("poor", &pool_job(1, "verify = 1"));
    let why = p.sim.c.job_summary(job2).unwrap().waiting.unwrap();
    assert!(
        why.contains("tenant \"poor\" has 0 credits, its next task's hold is 10"),
        "{why}"
    );
}

#[test]
fn a_lost_or_failed_attempt_releases_its_hold_whole() {
    let mut p = Pooled::new();
    p.grant(100);
    let (w, _) = p.join(provider("alice", 1.0, SECOND));
    let (_, out) = p.submit("t", &pool_job(1, "verify = 1"));
    assert_eq!(assigns(&out).len(), 1);
    assert_eq!(p.balance(tenant("t")), Credits::whole(90));
    p.ev(Event::WorkerLost {
        worker: w,
        reason: "gone".into(),
    });
    assert_eq!(p.balance(tenant("t")), Credits::whole(100));
    assert_eq!(p.balance(Account::Provider("alice".into())), Credits::ZERO);
}

#[test]
fn a_replay_rebuilds_the_same_ledger_verdicts_and_reputations() {
    let mut p = Pooled::new();
    p.grant(1000);
    let bad = p.three_providers();
    let (job, mut out) = p.submit("t", &pool_job(4, "verify = 2\nbudget = 500"));
    // Run two rounds, then "crash".
    for _ in 0..2 {
        out = p.round(&out, bad);
    }
    let mut c = Coordinator::new(config(0));
    let mut sink = Vec::new();
    for r in &p.journal {
        c.replay(p.sim.now, r.clone(), &mut sink).expect("replays");
    }
    c.recovered(p.sim.now);
    let live = p.sim.c.ledger();
    let again = c.ledger();
    assert_eq!(
        live.balances().collect::<Vec<_>>(),
        again.balances().collect::<Vec<_>>()
    );
    assert_eq!(live.transactions(), again.transactions());
    for who in ["mallory", "alice", "bob"] {
        assert_eq!(c.reputation(who), p.sim.c.reputation(who), "{who}");
    }
    let (a, b) = (p.sim.c.job_status(job).unwrap(), c.job_status(job).unwrap());
    let states = |s: &JobStatus| s.tasks.iter().map(|t| t.state).collect::<Vec<_>>();
    assert_eq!(states(&a), states(&b));
    // The verdicts' agreeing providers are rebuilt; placements not journaled are not
    // guessed (they read "eager: placed on w2", which a pool job never is).
    let agreed = |s: &JobStatus| s.tasks.iter().map(|t| t.agreed.clone()).collect::<Vec<_>>();
    assert_eq!(agreed(&a), agreed(&b));
    assert!(agreed(&b).iter().any(|a| a.len() == 2), "{:?}", agreed(&b));
    for t in &b.tasks {
        if let Some(r) = &t.placement {
            assert_eq!(r.policy, "verify", "{r:?}");
        }
    }
    assert_eq!(
        a.pool.as_ref().map(|p| (p.spent, p.held)),
        b.pool.as_ref().map(|p| (p.spent, p.held))
    );
}

#[test]
fn a_preempted_attempt_resumes_elsewhere_from_its_checkpoint_and_its_provider_is_paid() {
    let mut p = Pooled::new();
    p.grant(100);
    let (first, _) = p.join(provider("alice", 1.0, SECOND));
    let text =
        "name = \"ck\"\nstaging = \"transfer\"\n[pool]\nverify = 1\n[[task]]\nid = \"sim\"\n\
                cmd = [\"sim\"]\ntimeout = \"10s\"\ncheckpoint = [\"state/*.ckpt\"]\n\
                outputs = [\"out.txt\"]\n";
    let (job, out) = p.submit("t", text);
    let (w, a) = assigns(&out).pop().expect("placed");
    assert_eq!(w, first);
    assert_eq!(a.checkpoint, vec!["state/*.ckpt".to_string()]);
    assert!(a.resume.is_empty());
    // Its owner reclaims it: nothing more goes there; the attempt ends preempted.
    p.ev(Event::WorkerAvailability {
        worker: first,
        available: false,
    });
    let ckpt = ObjectRef {
        path: "state/a.ckpt".into(),
        hash: "c".repeat(64),
        size: 10,
    };
    let out = p.ev(Event::TaskFinished {
        worker: first,
        task: a.task,
        attempt: a.attempt,
        result: AttemptResult {
            outcome: AttemptOutcome::Preempted {
                checkpoint: vec![ckpt.clone()],
            },
            usage: Usage {
                cpu_seconds: 3.0,
                peak_rss_bytes: 0,
                wall_seconds: 3.0,
                ..Default::default()
            },
            outputs: Vec::new(),
            variant: None,
        },
    });
    assert!(assigns(&out).is_empty(), "not on the reclaimed worker");
    let s = p.sim.c.job_status(job).unwrap();
    assert_eq!(s.tasks[0].state, TaskState::Ready);
    assert_eq!(s.tasks[0].failures, 0, "a preemption is no failure");
    assert!(s.tasks[0]
        .message
        .as_deref()
        .unwrap_or("")
        .contains("checkpoint"));
    // Spot: the provider is paid for the 3 s its checkpoint carries forward.
    assert_eq!(p.balance(tenant("t")), Credits::whole(97));
    let (second, out) = p.join(provider("bob", 1.0, SECOND));
    let (w, a2) = assigns(&out).pop().expect("placed again");
    assert_eq!(w, second);
    assert_eq!(a2.resume, vec![ckpt]);
    p.done(second, a2.task, a2.attempt, "x", 2.0);
    let s = p.sim.c.job_summary(job).unwrap();
    assert_eq!(s.state, JobState::Succeeded);
    assert_eq!(
        s.pool.unwrap().spent,
        5.0,
        "the work once: 3 s there, 2 s here"
    );
    // Back: it takes work again.
    p.ev(Event::WorkerAvailability {
        worker: first,
        available: true,
    });
    let (_, out) = p.submit("t", &pool_job(2, "verify = 1"));
    assert!(assigns(&out).iter().any(|(w, _)| *w == first));
}

/// What a task's run returns in [`a_wrong_result_found_late_reruns_every_task_that_read_it`]:
/// `mallory` lies about task `a`; every other result is a function of the task and the
/// inputs it was given, so a task that read a wrong input returns a wrong result too.
fn derived(p: &Pooled, w: WorkerId, bad: WorkerId, a: &Assignment) -> String {
    let name = p.sim.name(a.task);
    if w == bad && name == "a" {
        return "lie".into();
    }
    let read: Vec<&str> = a.inputs.iter().map(|(o, _)| o.hash.as_str()).collect();
    format!("{name}({})", read.join(","))
}

/// A pool where `mallory` (the cheapest, one CPU) has earned trust honestly; `alice` and
/// `bob` are dearer, with four CPUs each. Returns mallory's worker.
fn trusted_mallory() -> (Pooled, WorkerId) {
    let mut p = Pooled::new();
    p.grant(100_000);
    let (bad, _) = p.join(provider("mallory", 1.0, "1"));
    p.join(provider("alice", 4.0, "2"));
    p.join(provider("bob", 4.0, "3"));
    let mut guard = 0;
    while p.sim.c.reputation("mallory").streak < 5 {
        guard += 1;
        assert!(guard < 10, "mallory earns a streak");
        let (warm, mut out) = p.submit("t", &pool_job(4, "verify = 2"));
        while p.sim.c.job_summary(warm).unwrap().state == JobState::Running {
            assert!(!assigns(&out).is_empty(), "the warm-up job runs");
            out = p.round(&out, WorkerId(u32::MAX));
        }
    }
    (p, bad)
}

/// Runs what `out` assigns and cancels until `stop` holds: cancels end cancelled, an
/// assignment `hold` picks is kept in `held` (not run), others end with [`derived`] results
/// (for the chain's job `job`) or right ones (`wrong` on `bad`, for any other job).
fn drive(
    p: &mut Pooled,
    mut out: Vec<Command>,
    (job, bad): (JobId, WorkerId),
    stop: &dyn Fn(&Pooled) -> bool,
    hold: &dyn Fn(&Pooled, &Assignment) -> bool,
    held: &mut Vec<(WorkerId, Assignment)>,
) -> Vec<Command> {
    let mut guard = 0;
    while !stop(p) {
        guard += 1;
        assert!(guard < 100, "it gets there: {:?}", p.sim.c.job_status(job));
        let mut more = Vec::new();
        for (w, t, attempt) in cancels_of(&out) {
            held.retain(|(_, a)| (a.task, a.attempt) != (t, attempt));
            more.extend(p.sim.ev(Event::TaskFinished {
                worker: w,
                task: t,
                attempt,
                result: AttemptResult {
                    outcome: AttemptOutcome::Cancelled,
                    usage: Usage::default(),
                    outputs: Vec::new(),
                    variant: None,
                },
            }));
        }
        for (w, a) in assigns(&out) {
            if hold(p, &a) {
                held.push((w, a));
                continue;
            }
            let h = if a.task.job == job {
                derived(p, w, bad, &a)
            } else if w == bad {
                "wrong".into()
            } else {
                "right".into()
            };
            more.extend(p.done(w, a.task, a.attempt, &h, 1.0));
        }
        assert!(!more.is_empty() || stop(p), "something happens");
        out = more;
    }
    out
}

#[test]
fn a_wrong_result_found_late_reruns_its_readers_even_when_it_is_the_job_s_last_task() {
    let (mut p, bad) = trusted_mallory();
    // a -> b, and x beside them (two CPUs each but a): a goes to mallory, which lies and is
    // believed; b runs on the lie; x is kept running.
    let text = "name = \"late\"\nstaging = \"transfer\"\n[pool]\nverify = \"adaptive\"\n\
        [[task]]\nid = \"a\"\ncmd = [\"a\"]\noutputs = [\"a.txt\"]\ntimeout = \"10s\"\n\
        [[task]]\nid = \"b\"\ncmd = [\"b\"]\nafter = [\"a\"]\ninputs = [\"a.txt\"]\n\
        outputs = [\"b.txt\"]\ntimeout = \"10s\"\nresources = { cpus = 2 }\n\
        [[task]]\nid = \"x\"\ncmd = [\"x\"]\noutputs = [\"x.txt\"]\ntimeout = \"10s\"\n\
        resources = { cpus = 2 }\n";
    let (job, out) = p.submit("t", text);
    let mut held = Vec::new();
    let is = |name: &'static str| {
        move |p: &Pooled, a: &Assignment| a.task.job == job && p.sim.name(a.task) == name
    };
    let out = drive(
        &mut p,
        out,
        (job, bad),
        &|p| p.sim.state(job, "b") == TaskState::Done,
        &is("x"),
        &mut held,
    );
    assert_eq!(p.sim.state(job, "a"), TaskState::Done, "the lie believed");
    // mallory is caught on another job; a is verified again (its runs held for now).
    let (catch, more) = p.submit("t", &pool_job(1, "verify = 2"));
    let mut out2 = out;
    out2.extend(more);
    let out = drive(
        &mut p,
        out2,
        (job, bad),
        &|p| p.sim.c.job_summary(catch).unwrap().state != JobState::Running,
        &|_, a| a.task.job == job,
        &mut held,
    );
    assert!(p.sim.c.reputation("mallory").rejected > 0, "mallory caught");
    // x ends: every task but a is done now (b with the lie).
    let (xs, rest): (Vec<_>, Vec<_>) = held.drain(..).partition(|(_, a)| p.sim.name(a.task) == "x");
    held = rest;
    let mut out3 = out;
    for (w, a) in xs {
        let h = derived(&p, w, bad, &a);
        out3.extend(p.done(w, a.task, a.attempt, &h, 1.0));
    }
    let out = drive(
        &mut p,
        out3,
        (job, bad),
        &|p| p.sim.state(job, "x") == TaskState::Done,
        &is("a"),
        &mut held,
    );
    assert_eq!(p.sim.state(job, "b"), TaskState::Done);
    // Now a's runs end with the honest result, which differs: b, which read the lie, runs
    // again instead of the job ending with it.
    let mut out4 = out;
    for (w, a) in held.drain(..) {
        let h = derived(&p, w, bad, &a);
        out4.extend(p.done(w, a.task, a.attempt, &h, 1.0));
    }
    drive(
        &mut p,
        out4,
        (job, bad),
        &|p| p.sim.c.job_summary(job).unwrap().state != JobState::Running,
        &|_, _| false,
        &mut held,
    );
    assert_eq!(p.sim.c.job_summary(job).unwrap().state, JobState::Succeeded);
    let s = p.sim.c.job_status(job).unwrap();
    let (b, _, _) = s.task_by_name("b").expect("b");
    assert_eq!(
        p.sim.c.jobs_map()[&job].outputs[&b][0].hash,
        "b(a())",
        "b's accepted result read the honest a"
    );
    assert_eq!(p.sim.c.ledger().total(), Credits::whole(100_000));
}

#[test]
fn a_wrong_result_found_late_reruns_every_task_that_read_it() {
    let (mut p, bad) = trusted_mallory();
    // A chain a -> b -> c, adaptive: a goes to mallory, trusted now, which lies about it and
    // is believed alone; b and c need two CPUs, so they run on alice and bob, honestly but
    // on the lie.
    let chain = "name = \"chain\"\nstaging = \"transfer\"\n[pool]\nverify = \"adaptive\"\n\
        [[task]]\nid = \"a\"\ncmd = [\"a\"]\noutputs = [\"a.txt\"]\ntimeout = \"10s\"\n\
        [[task]]\nid = \"b\"\ncmd = [\"b\"]\nafter = [\"a\"]\ninputs = [\"a.txt\"]\n\
        outputs = [\"b.txt\"]\ntimeout = \"10s\"\nresources = { cpus = 2 }\n\
        [[task]]\nid = \"c\"\ncmd = [\"c\"]\nafter = [\"b\"]\ninputs = [\"b.txt\"]\n\
        outputs = [\"c.txt\"]\ntimeout = \"10s\"\nresources = { cpus = 2 }\n";
    let (job, out) = p.submit("t", chain);
    let (w, a) = assigns(&out).pop().expect("a placed");
    assert_eq!(w, bad, "the cheapest");
    let h = derived(&p, w, bad, &a);
    let out = p.done(w, a.task, a.attempt, &h, 1.0);
    assert_eq!(
        p.sim.state(job, "a"),
        TaskState::Done,
        "the lie believed alone"
    );
    // b runs on the lie and is verified (alice and bob agree: they were given the same
    // input).
    let mut held = Vec::new();
    let out = drive(
        &mut p,
        out,
        (job, bad),
        &|p| p.sim.state(job, "b") == TaskState::Done,
        &|_, _| false,
        &mut held,
    );
    // mallory is caught on another job (verify = 2, outvoted): a, which it was trusted with
    // alone, is verified again, its new result differs, and everything that read the lie
    // runs again: b (done) is put back, c (its first run kept running) is cancelled.
    let (_, more) = p.submit("t", &pool_job(1, "verify = 2"));
    let mut out = out;
    out.extend(more);
    drive(
        &mut p,
        out,
        (job, bad),
        &|p| p.sim.c.job_summary(job).unwrap().state != JobState::Running,
        &|p, a| a.task.job == job && p.sim.name(a.task) == "c" && a.attempt == 1,
        &mut held,
    );
    assert_eq!(p.sim.c.job_summary(job).unwrap().state, JobState::Succeeded);
    assert!(
        held.is_empty(),
        "c's first run was cancelled mid-run: {held:?}"
    );
    let s = p.sim.c.job_status(job).unwrap();
    assert!(s.tasks[2].attempts > 1, "c ran again");
    assert!(s.tasks.iter().all(|t| t.failures == 0), "nothing counted");
    // Every accepted result is the honest chain's.
    let outputs = |t: &str| {
        let (id, _, _) = s.task_by_name(t).expect("a task");
        p.sim.c.jobs_map()[&job].outputs[&id].clone()
    };
    assert_eq!(outputs("a")[0].hash, "a()");
    assert_eq!(outputs("b")[0].hash, "b(a())");
    assert_eq!(outputs("c")[0].hash, "c(b(a()))");
    assert_eq!(p.balance(Account::Escrow("t".into())), Credits::ZERO);
    assert_eq!(p.sim.c.ledger().total(), Credits::whole(100_000));
}

mod props {
    //! Random pool histories: providers joining, leaving and reclaimed, jobs with budgets
    //! and verification, results right, wrong, failed, cancelled, preempted and repeated,
    //! grants and budget raises. After every event the ledger's total is the credits handed
    //! out and no account but the issuer's is negative; at the end a replay of the journal
    //! rebuilds the same ledger.

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Join {
            price: u8,
            cpus: u8,
        },
        Lose(u8),
        Reclaim(u8),
        Restore(u8),
        Submit {
            n: u8,
            verify: u8,
            budget: Option<u8>,
        },
        Grant(u8),
        Raise(u8),
        Finish {
            pick: u8,
            how: u8,
            cpu_s: u8,
        },
        Repeat,
        Tick,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, 1u8..3).prop_map(|(price, cpus)| Op::Join { price, cpus }),
            any::<u8>().prop_map(Op::Lose),
            any::<u8>().prop_map(Op::Reclaim),
            any::<u8>().prop_map(Op::Restore),
            (1u8..4, 0u8..3, prop::option::of(1u8..40))
                .prop_map(|(n, verify, budget)| Op::Submit { n, verify, budget }),
            (1u8..200).prop_map(Op::Grant),
            any::<u8>().prop_map(Op::Raise),
            (any::<u8>(), 0u8..7, 0u8..20)
                .prop_map(|(pick, how, cpu_s)| Op::Finish { pick, how, cpu_s })
                .boxed(),
            Just(Op::Repeat),
            Just(Op::Tick),
        ]
    }

    fn check(p: &Pooled) -> std::result::Result<(), TestCaseError> {
        let l = p.sim.c.ledger();
        prop_assert_eq!(l.total(), l.issued(), "credits made or lost");
        let leaked = p.sim.c.leaked_holds();
        prop_assert!(
            leaked.is_empty(),
            "holds of attempts that ended: {:?}",
            leaked
        );
        let held: f64 = p
            .sim
            .c
            .jobs()
            .iter()
            .filter_map(|j| j.pool.as_ref().map(|p| p.held))
            .sum();
        let escrow = l.balance(&Account::Escrow("t".into())).as_f64();
        prop_assert!(
            (held - escrow).abs() < 1e-6,
            "jobs hold {} but escrow is {}",
            held,
            escrow
        );
        for (a, b) in l.balances() {
            if *a != Account::Issuer {
                prop_assert!(!b.is_negative(), "{:?} is {}", a, b);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn the_ledger_balances_under_any_history_and_replays_the_same(
            ops in prop::collection::vec(op(), 1..80)
        ) {
            let mut p = Pooled::new();
            p.grant(50);
            let mut workers: Vec<WorkerId> = Vec::new();
            let mut jobs: Vec<JobId> = Vec::new();
            let mut flight: Vec<(WorkerId, TaskRef, u32)> = Vec::new();
            let mut last: Option<Event> = None;
            let mut n_prov = 0;
            for op in ops {
                let out = match op {
                    Op::Join { price, cpus } => {
                        n_prov += 1;
                        let spec = provider(
                            &format!("p{n_prov}"),
                            f64::from(cpus),
                            ["0", "1", "360", "3600"][usize::from(price)],
                        );
                        let (w, out) = p.join(spec);
                        workers.push(w);
                        out
                    }
                    Op::Lose(i) | Op::Reclaim(i) | Op::Restore(i) if workers.is_empty() => {
                        let _ = i;
                        Vec::new()
                    }
                    Op::Lose(i) => {
                        let w = workers.remove(usize::from(i) % workers.len());
                        flight.retain(|f| f.0 != w);
                        p.ev(Event::WorkerLost { worker: w, reason: "gone".into() })
                    }
                    Op::Reclaim(i) | Op::Restore(i) => {
                        let w = workers[usize::from(i) % workers.len()];
                        let available = matches!(op, Op::Restore(_));
                        p.ev(Event::WorkerAvailability { worker: w, available })
                    }
                    Op::Submit { n, verify, budget } => {
                        let verify = ["1", "2", "\"adaptive\""][usize::from(verify)];
                        let budget = budget.map_or(String::new(), |b| format!("\nbudget = {b}"));
                        let text = pool_job(usize::from(n), &format!("verify = {verify}{budget}"))
                            .replace("\n[[task]]\n", "\n[[task]]\ncheckpoint = [\"s.ckpt\"]\n");
                        let (job, out) = p.submit("t", &text);
                        jobs.push(job);
                        out
                    }
                    Op::Grant(n) => {
                        p.grant(i64::from(n));
                        Vec::new()
                    }
                    Op::Raise(i) if !jobs.is_empty() => {
                        let job = jobs[usize::from(i) % jobs.len()];
                        let ev = Event::BudgetRaised { job, amount: Credits::whole(5) };
                        let mut out = Vec::new();
                        if p.sim.c.handle(p.sim.now, ev.clone(), &mut out).is_ok() {
                            p.journal.extend(JournalRecord::from_event(&ev));
                            p.journal.extend(p.sim.c.take_journal_records());
                        }
                        out
                    }
                    Op::Raise(_) => Vec::new(),
                    Op::Finish { pick, how, cpu_s } if !flight.is_empty() => {
                        let (w, task, attempt) = flight.remove(usize::from(pick) % flight.len());
                        let outcome = match how {
                            0 | 1 => AttemptOutcome::Succeeded,
                            2 => AttemptOutcome::Failed { message: "x".into(), retryable: true },
                            3 => AttemptOutcome::Cancelled,
                            4 => AttemptOutcome::Preempted { checkpoint: Vec::new() },
                            5 => AttemptOutcome::Preempted {
                                checkpoint: vec![ObjectRef {
                                    path: "s.ckpt".into(),
                                    hash: "c".repeat(64),
                                    size: 1,
                                }],
                            },
                            _ => AttemptOutcome::Succeeded,
                        };
                        // One provider in three returns a wrong hash.
                        let hash = if how == 6 || w.0 % 3 == 0 { "wrong" } else { "right" };
                        let ev = Event::TaskFinished {
                            worker: w,
                            task,
                            attempt,
                            result: AttemptResult {
                                outcome,
                                usage: Usage {
                                    cpu_seconds: f64::from(cpu_s),
                                    wall_seconds: f64::from(cpu_s),
                                    ..Usage::default()
                                },
                                outputs: vec![ObjectRef { path: "out.txt".into(), hash: hash.into(), size: 1 }],
                                variant: None,
                            },
                        };
                        last = Some(ev.clone());
                        p.ev(ev)
                    }
                    Op::Finish { .. } => Vec::new(),
                    Op::Repeat => match last.clone() {
                        // A duplicate report (a retry after a partition): no effect.
                        Some(ev) => {
                            let mut out = Vec::new();
                            let _ = p.sim.c.handle(p.sim.now, ev, &mut out);
                            p.journal.extend(p.sim.c.take_journal_records());
                            out
                        }
                        None => Vec::new(),
                    },
                    Op::Tick => {
                        p.sim.now += 1_000;
                        p.ev(Event::Tick)
                    }
                };
                for (w, a) in assigns(&out) {
                    flight.push((w, a.task, a.attempt));
                }
                flight.retain(|(w, t, a)| p.sim.c.gave(*w, *t, *a));
                check(&p)?;
            }
            // A restart: the journal gives the same ledger.
            let mut c = Coordinator::new(config(0));
            let mut sink = Vec::new();
            for r in &p.journal {
                c.replay(p.sim.now, r.clone(), &mut sink).expect("replays");
            }
            c.recovered(p.sim.now);
            prop_assert_eq!(
                c.ledger().balances().collect::<Vec<_>>(),
                p.sim.c.ledger().balances().collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn a_deadline_sends_work_to_faster_dearer_machines_only_when_the_cheap_ones_would_miss_it() {
    // A slow cheap class (100 s a task) and a fast dear one (10 s), learned.
    let mut model = flotilla_sched::PerfModel::new();
    for _ in 0..3 {
        model.record("t:p/t", "slow", 0, 100.0);
        model.record("t:p/t", "fast", 0, 10.0);
    }
    let run = |deadline: &str| -> WorkerId {
        let mut p = Pooled::new();
        p.sim.c.set_perf_model(model.clone());
        p.grant(1_000_000);
        let slow = WorkerSpec {
            hw_class: "slow".into(),
            ..provider("cheap", 1.0, "1")
        };
        let fast = WorkerSpec {
            hw_class: "fast".into(),
            ..provider("dear", 1.0, "20")
        };
        p.join(slow);
        p.join(fast);
        let (_, out) = p.submit(
            "t",
            &pool_job(1, &format!("verify = 1\ndeadline = \"{deadline}\"")),
        );
        let (w, a) = assigns(&out).pop().expect("placed");
        assert_eq!(a.reason.policy, "pool-cost");
        w
    };
    // 1 h: the cheap machine's 100 s fit. 1 min: only the fast one's 10 s do.
    assert_eq!(run("1h"), WorkerId::new(1));
    assert_eq!(run("1m"), WorkerId::new(2));
}

#[test]
fn a_job_that_fails_before_its_deadline_did_not_miss_it() {
    let mut p = Pooled::new();
    p.grant(1_000_000);
    p.join(provider("cheap", 1.0, "1"));
    let (job, out) = p.submit("t", &pool_job(1, "verify = 1\ndeadline = \"1h\""));
    let (w, a) = assigns(&out).pop().expect("placed");
    let deadline = |p: &Pooled| {
        p.sim
            .c
            .job_status(job)
            .and_then(|s| s.pool)
            .and_then(|pool| pool.deadline)
    };
    assert_eq!(deadline(&p).as_deref(), Some("on track"));
    p.sim.finish(w, a.task, a.attempt, failed("boom", false));
    assert_eq!(
        deadline(&p).as_deref(),
        Some("not met: the job failed"),
        "it failed 1 h before its deadline: not a missed deadline"
    );
}

/// A `verify = 2` job cancelled while a replica's result waited for the other's: its hold
/// stayed in escrow for good (through `rm` and restarts). A cancelled job gives no verdict:
/// every hold is released, and a restart releases those an older version left.
#[test]
fn a_cancelled_job_releases_the_holds_of_replicas_awaiting_a_verdict() {
    let mut p = Pooled::new();
    p.grant(1000);
    let (a, _) = p.join(provider("alice", 1.0, SECOND));
    let (job, out) = p.submit("t", &pool_job(1, "verify = 2"));
    let first = assigns(&out)[0].1.clone();
    // The first replica is done; the second cannot run (no other provider): it waits.
    let out = p.done(a, first.task, 1, "good", 2.0);
    assert!(assigns(&out).is_empty());
    assert_eq!(p.balance(Account::Escrow("t".into())), Credits::whole(10));
    p.ev(Event::JobCancelled { job });
    assert_eq!(p.balance(Account::Escrow("t".into())), Credits::ZERO);
    assert_eq!(p.balance(tenant("t")), Credits::whole(1000));
    assert!(p.sim.c.leaked_holds().is_empty());
    let s = p.sim.c.job_status(job).unwrap();
    assert_eq!(s.pool.as_ref().map(|p| p.held), Some(0.0));

    // A journal that ended with such a hold open (written by an older version: cut before
    // the release) is healed by the restart.
    let cut = p
        .journal
        .iter()
        .position(
            |r| matches!(r, JournalRecord::Ledger { tx, .. } if tx.key.starts_with("release/")),
        )
        .expect("the release was journaled");
    let mut c = Coordinator::new(config(0));
    let mut sink = Vec::new();
    for r in &p.journal[..cut] {
        c.replay(p.sim.now, r.clone(), &mut sink).expect("replays");
    }
    assert_eq!(
        c.ledger().balance(&Account::Escrow("t".into())),
        Credits::whole(10)
    );
    c.recovered(p.sim.now);
    assert_eq!(
        c.ledger().balance(&Account::Escrow("t".into())),
        Credits::ZERO
    );
    assert!(c.leaked_holds().is_empty());
}

/// `verify = 2` with one provider in reach: the first task's second replica may not run on
/// the provider that ran its first, and that blocked the whole array behind it. The provider
/// sat idle while later tasks were ready (a walkthrough of the pool docs saw it).
#[test]
fn a_replica_no_worker_may_run_does_not_hold_back_the_tasks_behind_it() {
    let mut p = Pooled::new();
    p.grant(1000);
    let (a, out) = p.join(provider("alice", 1.0, SECOND));
    assert!(assigns(&out).is_empty());
    let (_, out) = p.submit("t", &pool_job(3, "verify = 2"));
    let placed = assigns(&out);
    assert_eq!(placed.len(), 1, "one CPU");
    let (w, first) = placed[0].clone();
    assert_eq!(w, a);
    // Its first replica done: the second may not run on alice; t[1] may.
    let out = p.done(a, first.task, first.attempt, "good", 1.0);
    let next = assigns(&out);
    assert_eq!(next.len(), 1, "alice takes the next task: {next:?}");
    assert_ne!(next[0].1.task, first.task);
}
