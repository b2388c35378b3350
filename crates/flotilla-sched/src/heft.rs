//! HEFT, the static list scheduler of Topcuoglu, Hariri and Wu, "Performance-effective and
//! low-complexity task scheduling for heterogeneous computing" (IEEE TPDS 13(3), 2002).
//!
//! 1. Upward rank: `rank(t) = mean_cost(t) + max over successors s of
//!    (mean_comm(t, s) + rank(s))`, where `mean_cost` averages the task's cost over the
//!    processors and `mean_comm` is the edge's `data / bandwidth` (the paper's
//!    `L + data / B` with no start-up latency and one bandwidth).
//! 2. Tasks are taken in decreasing rank (ties: lower task index first). The task taken is
//!    always the highest-ranked *ready* task, which is the same order whenever ranks
//!    strictly decrease along edges (any positive cost makes them) and stays a valid
//!    topological order when zero costs make a task and its successor tie.
//! 3. Each task goes to the processor that gives it the earliest finish time, using the
//!    insertion policy: it may fill an idle gap between two tasks already scheduled there
//!    if the gap is long enough and starts after its inputs arrive (ties: lowest processor).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::dag::Dag;
use crate::schedule::{Placement, Schedule};

/// HEFT's plan: ranks, the order tasks were scheduled in, and the schedule.
#[derive(Clone, Debug)]
pub struct HeftPlan {
    /// Upward rank per task index.
    pub ranks: Vec<f64>,
    /// Task indices in the order HEFT scheduled them.
    pub order: Vec<usize>,
    /// Processor index per task index.
    pub processor: Vec<usize>,
    /// The resulting schedule (policy `"heft"`).
    pub schedule: Schedule,
}

/// Upward ranks per task index (see the [module docs](self)).
pub fn upward_ranks(dag: &Dag) -> Vec<f64> {
    let np = dag.processors().len() as f64;
    let mut rank = vec![0.0; dag.tasks().len()];
    for &t in dag.topo_order().iter().rev() {
        let mean_cost = dag.tasks()[t].cost.iter().sum::<f64>() / np;
        let tail = dag
            .out_edges(t)
            .iter()
            .map(|&e| {
                let edge = dag.edges()[e];
                edge.data / dag.bandwidth() + rank[edge.to]
            })
            .fold(0.0, f64::max);
        rank[t] = mean_cost + tail;
    }
    rank
}

/// Ranks quantized to 1e-9 of the largest rank, so that ranks equal up to rounding (the
/// paper's t3 and t4 are both 80, reached by different sums) tie exactly.
fn rank_keys(ranks: &[f64]) -> Vec<i64> {
    let scale = ranks.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    if scale == 0.0 {
        return vec![0; ranks.len()];
    }
    ranks
        .iter()
        .map(|r| (r / scale * 1e9).round() as i64)
        .collect()
}

/// Runs HEFT on `dag`.
pub fn heft(dag: &Dag) -> HeftPlan {
    let n = dag.tasks().len();
    let np = dag.processors().len();
    let ranks = upward_ranks(dag);
    let keys = rank_keys(&ranks);

    let mut waiting: Vec<usize> = (0..n).map(|t| dag.in_edges(t).len()).collect();
    let mut ready: BinaryHeap<(i64, Reverse<usize>)> = (0..n)
        .filter(|&t| waiting[t] == 0)
        .map(|t| (keys[t], Reverse(t)))
        .collect();
    // Busy intervals per processor, sorted by start.
    let mut busy: Vec<Vec<(f64, f64)>> = vec![Vec::new(); np];
    let mut processor = vec![0; n];
    let mut finish = vec![0.0; n];
    let mut order = Vec::with_capacity(n);
    let mut placements = Vec::with_capacity(n);

    while let Some((_, Reverse(t))) = ready.pop() {
        order.push(t);
        let mut best: Option<(f64, f64, usize, usize)> = None; // (eft, est, proc, slot)
        for (p, slots) in busy.iter().enumerate() {
            let data_ready = dag
                .in_edges(t)
                .iter()
                .map(|&e| {
                    let edge = dag.edges()[e];
                    finish[edge.from] + dag.comm_time(edge.data, processor[edge.from], p)
                })
                .fold(0.0, f64::max);
            let cost = dag.tasks()[t].cost[p];
            let (est, slot) = earliest_slot(slots, data_ready, cost);
            let eft = est + cost;
            if best.is_none_or(|(b, ..)| eft < b) {
                best = Some((eft, est, p, slot));
            }
        }
        let (eft, est, p, slot) = best.expect("a dag has at least one processor");
        busy[p].insert(slot, (est, eft));
        processor[t] = p;
        finish[t] = eft;
        placements.push(Placement {
            task: dag.tasks()[t].id.clone(),
            processor: dag.processors()[p].clone(),
            start: est,
            end: eft,
        });
        for &e in dag.out_edges(t) {
            let s = dag.edges()[e].to;
            waiting[s] -= 1;
            if waiting[s] == 0 {
                ready.push((keys[s], Reverse(s)));
            }
        }
    }
    HeftPlan {
        ranks,
        order,
        processor,
        schedule: Schedule::from_placements("heft", placements),
    }
}

/// The earliest start `>= ready` of a task of length `cost` among the sorted busy
/// intervals `slots`, and the position to insert it at.
fn earliest_slot(slots: &[(f64, f64)], ready: f64, cost: f64) -> (f64, usize) {
    let mut prev_end = 0.0f64;
    for (i, &(start, end)) in slots.iter().enumerate() {
        let candidate = prev_end.max(ready);
        if candidate + cost <= start {
            return (candidate, i);
        }
        prev_end = prev_end.max(end);
    }
    (prev_end.max(ready), slots.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::parse_dag;

    const PAPER: &str = include_str!("../tests/data/topcuoglu2002.json");

    #[test]
    fn reproduces_the_papers_ranks_order_and_makespan() {
        let dag = parse_dag(PAPER).unwrap();
        let plan = heft(&dag);
        let expected_ranks = [
            108.0,
            77.0,
            80.0,
            80.0,
            69.0,
            63.0 + 1.0 / 3.0,
            42.0 + 2.0 / 3.0,
            35.0 + 2.0 / 3.0,
            44.0 + 1.0 / 3.0,
            14.0 + 2.0 / 3.0,
        ];
        for (i, (got, want)) in plan.ranks.iter().zip(expected_ranks).enumerate() {
            assert!(
                (got - want).abs() < 1e-9,
                "rank of t{}: {got} vs {want}",
                i + 1
            );
        }
        let order: Vec<&str> = plan
            .order
            .iter()
            .map(|&t| dag.tasks()[t].id.as_str())
            .collect();
        assert_eq!(
            order,
            ["t1", "t3", "t4", "t2", "t5", "t6", "t9", "t7", "t8", "t10"]
        );
        assert_eq!(plan.schedule.makespan, 80.0);
        plan.schedule.validate(&dag).unwrap();
        // The paper's Fig. 3(a) schedule, task by task (processor, start, end).
        let expected = [
            ("t1", "p3", 0.0, 9.0),
            ("t3", "p3", 9.0, 28.0),
            ("t4", "p2", 18.0, 26.0),
            ("t2", "p1", 27.0, 40.0),
            ("t5", "p3", 28.0, 38.0),
            ("t6", "p2", 26.0, 42.0),
            ("t9", "p2", 56.0, 68.0),
            ("t7", "p3", 38.0, 49.0),
            ("t8", "p1", 57.0, 62.0),
            ("t10", "p2", 73.0, 80.0),
        ];
        for (task, proc, start, end) in expected {
            let p = plan.schedule.placement(task).unwrap();
            assert_eq!(
                (p.processor.as_str(), p.start, p.end),
                (proc, start, end),
                "{task}"
            );
        }
    }

    #[test]
    fn insertion_fills_an_idle_gap() {
        assert_eq!(earliest_slot(&[(0.0, 2.0), (5.0, 6.0)], 1.0, 3.0), (2.0, 1));
        assert_eq!(earliest_slot(&[(0.0, 2.0), (5.0, 6.0)], 1.0, 3.5), (6.0, 2));
        assert_eq!(earliest_slot(&[(4.0, 6.0)], 0.0, 4.0), (0.0, 0));
        assert_eq!(earliest_slot(&[], 3.0, 1.0), (3.0, 0));
    }

    #[test]
    fn zero_cost_ties_still_schedule_predecessors_first() {
        // b (index 0) depends on a (index 1); both cost 0 and the edge carries no data, so
        // their ranks tie and the lower index alone would put b first.
        let dag = parse_dag(
            r#"{"processors": ["p", "q"], "bandwidth": 1,
                "tasks": [{"id": "b", "cost": [0, 0]}, {"id": "a", "cost": [0, 0]}],
                "edges": [{"from": "a", "to": "b", "data": 0}]}"#,
        )
        .unwrap();
        let plan = heft(&dag);
        assert_eq!(plan.order, [1, 0]);
        plan.schedule.validate(&dag).unwrap();
    }
}
