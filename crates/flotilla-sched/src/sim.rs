//! A discrete-event simulator that runs a placement policy on a [`Dag`] in virtual time.
//!
//! `heft` is planned statically ([`crate::heft()`]); every other policy runs online through the
//! [`Policy`] trait, exactly as the runtime drives it:
//!
//! - **Machine.** One memory node and one unit ([`UnitKind::Cpu`], whatever the processor
//!   is) per DAG processor; node, unit and arch are all named after the processor. Every
//!   pair of nodes is linked with the DAG's bandwidth and no latency.
//! - **Model.** A [`PerfModel`] calibrated after one sample and fed each task's true cost on
//!   each processor under codelet = the task's id, arch = the processor's name,
//!   footprint = 0: the policies know the costs exactly, as with a fully calibrated StarPU.
//! - **Readiness.** A task is placed when its last predecessor finishes. Its inputs are
//!   the edges into it: `data` rounded to whole bytes, valid on the predecessor's node. The
//!   submitter is the processor whose completion made it ready (none for source tasks).
//! - **Queues.** [`Decision::Unit`] goes to that processor's FIFO; [`Decision::Central`] to
//!   one shared FIFO; [`Decision::Local`] to the back of the submitter's deque (the shared
//!   FIFO if there is no submitter). An idle processor takes, in this order: the front of its
//!   FIFO, the back of its own deque, the front of the shared FIFO, the front of the longest
//!   other deque (a steal; ties: lowest processor). Processors pick in index order.
//! - **Execution.** A task taken at time `now` by processor `p` starts at
//!   `max(now, arrival of every input)`, where an input from processor `q` arrives
//!   `data / bandwidth` after its producer ends (at once when `q == p`), and runs its cost on
//!   `p`; the processor is busy meanwhile.
//! - **Load.** `free_at[p]` is when `p`'s running and FIFO-queued work should end: the end of
//!   what it runs, advanced for each [`Decision::Unit`] by
//!   `max(free_at, input arrival) + predicted` (the true cost when the policy predicts
//!   nothing).
//! - **Time.** Completions are events in a binary heap ordered by `(time, seq)`; all
//!   completions at one instant are applied before the tasks they release are placed, so the
//!   run is deterministic for a given seed.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use flotilla_core::UnitId;

use crate::dag::Dag;
use crate::error::{Result, SchedError};
use crate::heft::heft;
use crate::model::PerfModel;
use crate::platform::{Link, Platform, UnitKind};
use crate::policy::{BuiltinPolicy, Decision, InputView, Load, Policy, PolicyKind, TaskView};
use crate::schedule::{Placement, Schedule};

/// The footprint under which the simulator's model records every task.
pub const SIM_FOOTPRINT: u64 = 0;

/// Simulates `kind` on `dag`; `seed` seeds the `random` policy.
pub fn simulate(dag: &Dag, kind: PolicyKind, seed: u64) -> Result<Schedule> {
    if kind == PolicyKind::Heft {
        return Ok(heft(dag).schedule);
    }
    let mut policy = BuiltinPolicy::from_kind(kind, seed);
    let mut schedule = simulate_with(dag, &mut policy)?;
    schedule.policy = kind.to_string();
    Ok(schedule)
}

/// The platform the simulator gives the policies for `dag` (see the [module docs](self)).
pub fn sim_platform(dag: &Dag) -> Result<Platform> {
    let np = dag.processors().len();
    if np > 64 {
        return Err(SchedError::TooManyProcessors(np));
    }
    let link = Link {
        bandwidth: dag.bandwidth(),
        latency: 0.0,
    };
    let mut platform = Platform::new();
    platform.set_default_link(link);
    let nodes: Vec<_> = dag
        .processors()
        .iter()
        .map(|p| platform.add_node(p))
        .collect();
    for (i, &a) in nodes.iter().enumerate() {
        for &b in &nodes[i + 1..] {
            platform.set_link(a, b, link);
        }
    }
    for (p, &node) in dag.processors().iter().zip(&nodes) {
        platform.add_unit(UnitKind::Cpu, node, p);
    }
    Ok(platform)
}

/// The model the simulator gives the policies for `dag`: every task's exact cost on every
/// processor, calibrated (see the [module docs](self)).
pub fn sim_model(dag: &Dag) -> PerfModel {
    let mut model = PerfModel::with_min_samples(1);
    for task in dag.tasks() {
        for (p, &cost) in dag.processors().iter().zip(&task.cost) {
            model.record(&task.id, p, SIM_FOOTPRINT, cost);
        }
    }
    model
}

/// A time with a total order, for the event heap.
#[derive(Clone, Copy, PartialEq, Debug)]
struct Time(f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A task ends on a processor: `(time, seq, processor, task)`.
type Event = Reverse<(Time, u64, usize, usize)>;

struct Sim<'d> {
    dag: &'d Dag,
    platform: Platform,
    model: PerfModel,
    can_run: Vec<bool>,
    /// Predecessors still running, per task.
    waiting: Vec<usize>,
    submitter: Vec<Option<usize>>,
    /// Processor and end per task, once started.
    proc_of: Vec<usize>,
    end_of: Vec<f64>,
    fifo: Vec<VecDeque<usize>>,
    deque: Vec<VecDeque<usize>>,
    central: VecDeque<usize>,
    idle: Vec<bool>,
    free_at: Vec<f64>,
    events: BinaryHeap<Event>,
    seq: u64,
    placements: Vec<Placement>,
}

/// Simulates any policy on `dag` (see the [module docs](self)); the schedule is named after
/// `policy.name()`.
pub fn simulate_with(dag: &Dag, policy: &mut dyn Policy) -> Result<Schedule> {
    let n = dag.tasks().len();
    let np = dag.processors().len();
    let mut sim = Sim {
        dag,
        platform: sim_platform(dag)?,
        model: sim_model(dag),
        can_run: vec![true; np],
        waiting: (0..n).map(|t| dag.in_edges(t).len()).collect(),
        submitter: vec![None; n],
        proc_of: vec![usize::MAX; n],
        end_of: vec![f64::NAN; n],
        fifo: vec![VecDeque::new(); np],
        deque: vec![VecDeque::new(); np],
        central: VecDeque::new(),
        idle: vec![true; np],
        free_at: vec![0.0; np],
        events: BinaryHeap::new(),
        seq: 0,
        placements: Vec::with_capacity(n),
    };
    for t in 0..n {
        if sim.waiting[t] == 0 {
            sim.place(policy, t, 0.0)?;
        }
    }
    sim.dispatch(0.0);
    let mut released = Vec::new();
    while let Some(Reverse((Time(now), _, p, t))) = sim.events.pop() {
        sim.complete(p, t, &mut released);
        while let Some(&Reverse((Time(next), _, q, u))) = sim.events.peek() {
            if next != now {
                break;
            }
            sim.events.pop();
            sim.complete(q, u, &mut released);
        }
        for s in released.drain(..) {
            sim.place(policy, s, now)?;
        }
        sim.dispatch(now);
    }
    if sim.placements.len() < n {
        return Err(SchedError::Stalled {
            policy: policy.name().to_owned(),
            left: n - sim.placements.len(),
        });
    }
    Ok(Schedule::from_placements(policy.name(), sim.placements))
}

impl Sim<'_> {
    /// When every input of `t` is on processor `p`.
    fn arrival(&self, t: usize, p: usize) -> f64 {
        self.dag
            .in_edges(t)
            .iter()
            .map(|&e| {
                let edge = self.dag.edges()[e];
                let q = self.proc_of[edge.from];
                self.end_of[edge.from] + self.dag.comm_time(edge.data, q, p)
            })
            .fold(0.0, f64::max)
    }

    fn place(&mut self, policy: &mut dyn Policy, t: usize, now: f64) -> Result<()> {
        let inputs: Vec<InputView> = self
            .dag
            .in_edges(t)
            .iter()
            .map(|&e| {
                let edge = self.dag.edges()[e];
                InputView {
                    bytes: edge.data.round() as u64,
                    valid_on: 1u64 << self.proc_of[edge.from],
                }
            })
            .collect();
        let task = &self.dag.tasks()[t];
        let view = TaskView {
            codelet: &task.id,
            footprint: SIM_FOOTPRINT,
            priority: 0,
            can_run: &self.can_run,
            inputs: &inputs,
            submitter: self.submitter[t].map(|p| UnitId::new(p as u32)),
        };
        let load = Load {
            now,
            free_at: &self.free_at,
        };
        match policy.place(&view, &self.platform, &load, &self.model) {
            Decision::Unit { unit, predicted } => {
                let p = unit.index();
                if !view.can_run_on(unit) {
                    return Err(SchedError::BadDecision {
                        policy: policy.name().to_owned(),
                        task: task.id.clone(),
                        unit: p,
                    });
                }
                let exec = predicted.unwrap_or(task.cost[p]);
                self.free_at[p] = self.free_at[p].max(now).max(self.arrival(t, p)) + exec;
                self.fifo[p].push_back(t);
            }
            Decision::Local => match self.submitter[t] {
                Some(p) => self.deque[p].push_back(t),
                None => self.central.push_back(t),
            },
            Decision::Central => self.central.push_back(t),
        }
        Ok(())
    }

    fn take(&mut self, p: usize) -> Option<usize> {
        if let Some(t) = self.fifo[p].pop_front() {
            return Some(t);
        }
        if let Some(t) = self.deque[p].pop_back() {
            return Some(t);
        }
        if let Some(t) = self.central.pop_front() {
            return Some(t);
        }
        let victim = (0..self.deque.len())
            .filter(|&q| q != p && !self.deque[q].is_empty())
            .max_by(|&a, &b| {
                self.deque[a]
                    .len()
                    .cmp(&self.deque[b].len())
                    .then(b.cmp(&a))
            })?;
        self.deque[victim].pop_front()
    }

    fn dispatch(&mut self, now: f64) {
        for p in 0..self.idle.len() {
            if !self.idle[p] {
                continue;
            }
            let Some(t) = self.take(p) else { continue };
            let start = now.max(self.arrival(t, p));
            let end = start + self.dag.tasks()[t].cost[p];
            self.idle[p] = false;
            self.proc_of[t] = p;
            self.end_of[t] = end;
            self.free_at[p] = self.free_at[p].max(end);
            self.placements.push(Placement {
                task: self.dag.tasks()[t].id.clone(),
                processor: self.dag.processors()[p].clone(),
                start,
                end,
            });
            self.seq += 1;
            self.events.push(Reverse((Time(end), self.seq, p, t)));
        }
    }

    fn complete(&mut self, p: usize, t: usize, released: &mut Vec<usize>) {
        self.idle[p] = true;
        for &e in self.dag.out_edges(t) {
            let s = self.dag.edges()[e].to;
            self.waiting[s] -= 1;
            if self.waiting[s] == 0 {
                self.submitter[s] = Some(p);
                released.push(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::{parse_dag, DagSpec, EdgeSpec, TaskSpec};
    use proptest::prelude::*;

    const PAPER: &str = include_str!("../tests/data/topcuoglu2002.json");

    #[test]
    fn every_policy_gives_a_valid_deterministic_schedule_of_the_paper_dag() {
        let dag = parse_dag(PAPER).unwrap();
        for kind in PolicyKind::ALL {
            let s = simulate(&dag, kind, 42).unwrap();
            s.validate(&dag).unwrap();
            assert_eq!(s.policy, kind.to_string());
            assert_eq!(
                s,
                simulate(&dag, kind, 42).unwrap(),
                "{kind} is deterministic"
            );
            // No schedule beats the critical path on the fastest processors with free
            // communication, and HEFT's 80 is known.
            assert!(
                s.makespan >= 9.0 + 11.0 + 7.0 + 7.0,
                "{kind}: {}",
                s.makespan
            );
        }
        assert_eq!(simulate(&dag, PolicyKind::Heft, 0).unwrap().makespan, 80.0);
    }

    #[test]
    fn a_chain_runs_where_its_data_is_with_dmda() {
        // Two identical processors, a chain with heavy edges: dmda keeps it on one processor.
        let dag = parse_dag(
            r#"{"processors": ["a", "b"], "bandwidth": 1,
                "tasks": [{"id": "x", "cost": [1, 1]}, {"id": "y", "cost": [1, 1]}, {"id": "z", "cost": [1, 1]}],
                "edges": [{"from": "x", "to": "y", "data": 100}, {"from": "y", "to": "z", "data": 100}]}"#,
        )
        .unwrap();
        let s = simulate(&dag, PolicyKind::Dmda, 0).unwrap();
        s.validate(&dag).unwrap();
        assert_eq!(s.makespan, 3.0);
    }

    #[test]
    fn work_stealing_keeps_children_local_and_idle_processors_steal() {
        // root fans out to 4 unit tasks (data 0): the root's processor queues them all,
        // the other processor steals, so both finish by 1 + 2.
        let mut tasks = vec![TaskSpec {
            id: "root".into(),
            cost: vec![1.0, 1.0],
            kind: None,
        }];
        let mut edges = Vec::new();
        for i in 0..4 {
            tasks.push(TaskSpec {
                id: format!("c{i}"),
                cost: vec![1.0, 1.0],
                kind: None,
            });
            edges.push(EdgeSpec {
                from: "root".into(),
                to: format!("c{i}"),
                data: 0.0,
            });
        }
        let dag = Dag::from_spec(DagSpec {
            processors: vec!["a".into(), "b".into()],
            bandwidth: 1.0,
            tasks,
            edges,
        })
        .unwrap();
        let s = simulate(&dag, PolicyKind::Ws, 0).unwrap();
        s.validate(&dag).unwrap();
        assert_eq!(s.makespan, 3.0);
        // The owner pops its newest child first (LIFO), the thief takes the oldest.
        assert_eq!(s.placement("c3").unwrap().processor, "a");
        assert_eq!(s.placement("c0").unwrap().processor, "b");
    }

    #[test]
    fn too_many_processors_is_an_error() {
        let dag = Dag::from_spec(DagSpec {
            processors: (0..65).map(|i| format!("p{i}")).collect(),
            bandwidth: 1.0,
            tasks: vec![TaskSpec {
                id: "t".into(),
                cost: vec![1.0; 65],
                kind: None,
            }],
            edges: vec![],
        })
        .unwrap();
        assert!(matches!(
            simulate(&dag, PolicyKind::Eager, 0),
            Err(SchedError::TooManyProcessors(65))
        ));
    }

    struct Nowhere;

    impl Policy for Nowhere {
        fn name(&self) -> &str {
            "nowhere"
        }
        fn place(
            &mut self,
            _: &TaskView<'_>,
            _: &Platform,
            _: &Load<'_>,
            _: &PerfModel,
        ) -> Decision {
            Decision::Unit {
                unit: UnitId::new(9),
                predicted: None,
            }
        }
    }

    #[test]
    fn a_custom_policy_naming_a_missing_unit_is_an_error() {
        let dag = parse_dag(PAPER).unwrap();
        let mut policy = BuiltinPolicy::Custom(Box::new(Nowhere));
        let err = simulate_with(&dag, &mut policy).unwrap_err();
        assert_eq!(
            err.to_string(),
            "policy `nowhere` placed task `t1` on unit 9, which cannot run it"
        );
    }

    fn arb_dag() -> impl Strategy<Value = Dag> {
        (
            1usize..5,
            1usize..40,
            prop_oneof![Just(0.5f64), Just(1.0), Just(4.0)],
        )
            .prop_flat_map(|(np, nt, bw)| {
                (
                    proptest::collection::vec(
                        proptest::collection::vec(prop_oneof![Just(0.0f64), 0.5f64..20.0], np),
                        nt,
                    ),
                    proptest::collection::vec(
                        (0..nt, 0..nt, prop_oneof![Just(0.0f64), 0.0f64..30.0]),
                        0..nt * 3,
                    ),
                )
                    .prop_map(move |(costs, raw)| {
                        let mut seen = std::collections::HashSet::new();
                        let edges = raw
                            .into_iter()
                            .filter(|(a, b, _)| a < b && seen.insert((*a, *b)))
                            .map(|(a, b, d)| EdgeSpec {
                                from: format!("t{a}"),
                                to: format!("t{b}"),
                                data: d.round(),
                            })
                            .collect();
                        Dag::from_spec(DagSpec {
                            processors: (0..np).map(|p| format!("p{p}")).collect(),
                            bandwidth: bw,
                            tasks: costs
                                .into_iter()
                                .enumerate()
                                .map(|(i, cost)| TaskSpec {
                                    id: format!("t{i}"),
                                    cost,
                                    kind: None,
                                })
                                .collect(),
                            edges,
                        })
                        .expect("generated dags are valid")
                    })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_policy_respects_dependencies_and_never_overlaps(dag in arb_dag(), seed in 0u64..1000) {
            for kind in PolicyKind::ALL {
                let s = simulate(&dag, kind, seed).unwrap();
                prop_assert!(s.validate(&dag).is_ok(), "{}: {:?}", kind, s.validate(&dag));
                prop_assert_eq!(s.placements.len(), dag.tasks().len());
                // Never faster than the longest chain of cheapest costs.
                let mut lb = vec![0.0f64; dag.tasks().len()];
                for &t in dag.topo_order() {
                    let start = dag.in_edges(t).iter().map(|&e| lb[dag.edges()[e].from]).fold(0.0, f64::max);
                    lb[t] = start + dag.tasks()[t].cost.iter().copied().fold(f64::INFINITY, f64::min);
                }
                let bound = lb.iter().copied().fold(0.0, f64::max);
                prop_assert!(s.makespan >= bound - 1e-9, "{}: {} < {}", kind, s.makespan, bound);
            }
        }
    }
}
