//! Property test of the agent: random assignments (fitting or not, on random GPUs, chained or
//! not, some twice), finishes, cancellations, retractions and rejoins. After every step the
//! running attempts, summed here independently of the ledger, never exceed the worker; every
//! command stream keeps its order rules; and when it is all over every assignment ended
//! exactly once.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::ledger::{Ledger, LedgerGpu, EPS};
use flotilla_core::{JobId, Resources, TaskId};
use proptest::prelude::*;

use super::*;

const CPUS: f64 = 4.0;
const MEM: u64 = 1000;
const LIC: f64 = 2.0;
/// (index, memory) of the worker's GPUs.
const GPUS: [(u32, u64); 2] = [(0, 100), (1, 50)];

#[derive(Clone, Debug)]
enum Op {
    /// New assignments: (need, GPU indices, chained after the n-th earlier assignment).
    Assign(Vec<(Resources, Vec<u32>, Option<usize>)>),
    /// Assign again the n-th earlier assignment (a duplicate).
    Again(usize),
    /// The n-th running attempt ends.
    Finish(usize, u8),
    Cancel(usize),
    Retract(usize),
    Rejoin,
}

fn need() -> impl Strategy<Value = (Resources, Vec<u32>)> {
    (
        prop::sample::select(vec![0.5, 1.0, 2.0, 3.0, 5.0]),
        prop::sample::select(vec![0u64, 300, 700]),
        prop::sample::select(vec![0.0, 1.0]),
        prop::sample::select(vec![0.0, 0.5, 1.0, 2.0]),
        prop::sample::select(vec![0u64, 40, 80]),
        prop::sample::select(vec![
            vec![],
            vec![0],
            vec![1],
            vec![0, 1],
            vec![1, 0],
            vec![7],
        ]),
    )
        .prop_map(|(cpus, mem, lic, gpus, gpu_mem, idx)| {
            let mut r = Resources {
                cpus,
                mem,
                gpus,
                gpu_mem,
                ..Resources::zero()
            };
            if lic > 0.0 {
                r.custom.insert("lic".into(), lic);
            }
            // Most assignments name as many GPUs as they take, as the coordinator does.
            let idx = match Ledger::gpus_taken(&r) {
                0 if idx.len() != 1 => Vec::new(),
                1 if idx.len() == 2 => vec![idx[0]],
                _ => idx,
            };
            (r, idx)
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(
            (need(), prop::option::weighted(0.3, 0usize..64)),
            1..5
        )
        .prop_map(|v| Op::Assign(v.into_iter().map(|((r, g), a)| (r, g, a)).collect())),
        1 => (0usize..64).prop_map(Op::Again),
        5 => (0usize..8, 0u8..3).prop_map(|(i, o)| Op::Finish(i, o)),
        1 => (0usize..64).prop_map(Op::Cancel),
        1 => (0usize..64).prop_map(Op::Retract),
        1 => Just(Op::Rejoin),
    ]
}

fn worker() -> Agent<u32> {
    let mut cap = Resources {
        cpus: CPUS,
        mem: MEM,
        ..Resources::zero()
    };
    cap.custom.insert("lic".into(), LIC);
    let gpus: Vec<LedgerGpu> = GPUS
        .iter()
        .map(|&(index, mem_bytes)| LedgerGpu { index, mem_bytes })
        .collect();
    Agent::new(Ledger::new(cap, &gpus).expect("a valid offer"))
}

/// What the test knows, kept from the commands alone.
#[derive(Default)]
struct Model {
    /// Every assignment made, in order.
    works: Vec<Work<u32>>,
    /// Running, from `Start` commands.
    running: BTreeMap<Attempt, usize>,
    started_reports: BTreeSet<Attempt>,
    /// Attempts reported succeeded.
    succeeded: BTreeSet<Attempt>,
    /// How each assignment ended (finished, returned, dropped), counted.
    ends: BTreeMap<Attempt, u32>,
}

impl Model {
    /// Applies a batch of commands, checking their order rules.
    fn apply(&mut self, cmds: &[Command<u32>]) {
        for c in cmds {
            match c {
                Command::Report(Report::Started(k)) => {
                    assert!(
                        self.started_reports.insert(*k),
                        "{k:?} reported started twice"
                    );
                }
                Command::Start { key, payload } => {
                    let w = &self.works[*payload as usize];
                    assert_eq!(w.key, *key);
                    assert!(
                        self.started_reports.contains(key),
                        "{key:?} started before its start was reported"
                    );
                    if let Some(after) = w.after {
                        assert!(
                            self.succeeded.contains(&after),
                            "{key:?} started before {after:?} succeeded"
                        );
                    }
                    assert!(
                        self.running.insert(*key, *payload as usize).is_none(),
                        "{key:?} started twice"
                    );
                }
                Command::Report(Report::Finished(k, r)) => {
                    self.running.remove(k);
                    if r.outcome == AttemptOutcome::Succeeded {
                        self.succeeded.insert(*k);
                    }
                    *self.ends.entry(*k).or_default() += 1;
                }
                Command::Report(Report::Returned(k)) => {
                    assert!(
                        !self.running.contains_key(k),
                        "{k:?} returned while running"
                    );
                    *self.ends.entry(*k).or_default() += 1;
                }
                Command::Kill(k) => assert!(self.running.contains_key(k), "{k:?} killed idle"),
            }
        }
    }

    /// The running attempts never exceed the worker, summed from their needs.
    fn check_capacity(&self) {
        let mut cpus = 0.0;
        let mut mem = 0u64;
        let mut lic = 0.0;
        let mut share = [0.0f64; GPUS.len()];
        let mut gmem = [0u64; GPUS.len()];
        let mut loose_gmem = 0u64;
        for &i in self.running.values() {
            let w = &self.works[i];
            cpus += w.need.cpus;
            mem += w.need.mem;
            lic += w.need.custom.get("lic").copied().unwrap_or(0.0);
            if w.need.gpus <= 0.0 {
                loose_gmem += w.need.gpu_mem;
            }
            for ix in &w.gpus {
                let pos = GPUS
                    .iter()
                    .position(|g| g.0 == *ix)
                    .expect("a running attempt's GPUs exist");
                share[pos] += w.need.gpus.min(1.0);
                gmem[pos] += w.need.gpu_mem;
            }
        }
        assert!(cpus <= CPUS + EPS, "cpus {cpus} > {CPUS}");
        assert!(mem <= MEM, "mem {mem} > {MEM}");
        assert!(lic <= LIC + EPS, "lic {lic} > {LIC}");
        for (pos, (ix, cap)) in GPUS.iter().enumerate() {
            assert!(share[pos] <= 1.0 + EPS, "GPU {ix} shared {}", share[pos]);
            assert!(gmem[pos] <= *cap, "GPU {ix} memory {}", gmem[pos]);
        }
        let total: u64 = GPUS.iter().map(|g| g.1).sum();
        assert!(gmem.iter().sum::<u64>() + loose_gmem <= total);
    }
}

fn run(ops: Vec<Op>) {
    let mut a = worker();
    let mut m = Model::default();
    let mut now: Millis = 0;
    for op in ops {
        now += 1_000;
        let cmds = match op {
            Op::Assign(list) => {
                let mut works = Vec::new();
                for (need, gpus, after) in list {
                    let n = m.works.len();
                    let after = after.and_then(|i| m.works.get(i % n.max(1)).map(|w| w.key));
                    let w = Work {
                        key: (
                            TaskRef {
                                job: JobId::new(1),
                                task: TaskId::new(n as u32),
                            },
                            0,
                        ),
                        need,
                        gpus,
                        after,
                        payload: n as u32,
                    };
                    m.works.push(w.clone());
                    works.push(w);
                }
                a.message(&[], &[], works, now)
            }
            Op::Again(i) => match m.works.get(i % m.works.len().max(1)) {
                // Only while it is queued or running: an ended attempt is never sent again.
                Some(w) if m.running.contains_key(&w.key) || a.queued().any(|q| q.key == w.key) => {
                    let cmds = a.message(&[], &[], vec![w.clone()], now);
                    assert!(cmds.is_empty(), "a duplicate did something: {cmds:?}");
                    cmds
                }
                _ => Vec::new(),
            },
            Op::Finish(i, o) => {
                let running: Vec<Attempt> = a.running().copied().collect();
                match running.get(i % running.len().max(1)) {
                    Some(k) => {
                        let outcome = match o {
                            0 => AttemptOutcome::Succeeded,
                            1 => AttemptOutcome::Cancelled,
                            _ => AttemptOutcome::Failed {
                                message: "x".into(),
                                retryable: true,
                            },
                        };
                        let r = AttemptResult {
                            outcome,
                            usage: Usage::default(),
                            outputs: Vec::new(),
                            variant: None,
                        };
                        let cmds = a.finished(*k, r, now);
                        assert!(
                            matches!(cmds.first(), Some(Command::Report(Report::Finished(f, _))) if f == k),
                            "the finish comes first"
                        );
                        cmds
                    }
                    None => Vec::new(),
                }
            }
            Op::Cancel(i) | Op::Retract(i) => match m.works.get(i % m.works.len().max(1)) {
                Some(w) => {
                    let k = [w.key];
                    if matches!(op, Op::Cancel(_)) {
                        a.message(&k, &[], Vec::new(), now)
                    } else {
                        a.message(&[], &k, Vec::new(), now)
                    }
                }
                None => Vec::new(),
            },
            Op::Rejoin => {
                let r = a.rejoin(now);
                assert_eq!(r.running, m.running.keys().copied().collect::<Vec<_>>());
                for k in r.dropped {
                    *m.ends.entry(k).or_default() += 1;
                }
                Vec::new()
            }
        };
        m.apply(&cmds);
        m.check_capacity();
        assert_eq!(
            a.running().copied().collect::<Vec<_>>(),
            m.running.keys().copied().collect::<Vec<_>>()
        );
        if m.running.is_empty() {
            // Nothing runs: whatever waits, waits for a predecessor that has not succeeded.
            for w in a.queued() {
                assert!(
                    w.after.is_some_and(|p| !m.succeeded.contains(&p)),
                    "{:?} waits on an idle worker",
                    w.key
                );
            }
        }
        assert!(m.ends.values().all(|&n| n == 1), "an attempt ended twice");
    }
    // Drain: finish what runs (successes start chained work), then drop the rest.
    loop {
        let Some(k) = a.running().next().copied() else {
            break;
        };
        let r = AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            usage: Usage::default(),
            outputs: Vec::new(),
            variant: None,
        };
        let cmds = a.finished(k, r, now);
        m.apply(&cmds);
        m.check_capacity();
    }
    for k in a.rejoin(now).dropped {
        *m.ends.entry(k).or_default() += 1;
    }
    assert_eq!(a.ledger().held(), 0);
    assert_eq!(a.ledger().used(), &Resources::zero());
    for w in &m.works {
        assert_eq!(
            m.ends.get(&w.key).copied(),
            Some(1),
            "{:?} did not end exactly once",
            w.key
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_agent_never_overcommits_and_ends_every_assignment_once(
        ops in prop::collection::vec(op(), 1..80)
    ) {
        run(ops);
    }
}
