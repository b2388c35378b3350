//! A schedule of a [`Dag`]: which processor ran each task, from when to when, and a checker
//! for it.

use serde::{Deserialize, Serialize};

use crate::dag::Dag;
use crate::error::{Result, ScheduleViolation};

/// One task's placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// The task's id.
    pub task: String,
    /// The processor's name.
    pub processor: String,
    /// When it starts.
    pub start: f64,
    /// When it ends.
    pub end: f64,
}

/// A complete schedule, as printed by `flotilla simulate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// The policy that made it.
    pub policy: String,
    /// The latest end (0 for an empty DAG).
    pub makespan: f64,
    /// One placement per task, ordered by start time (then processor, then task id).
    pub placements: Vec<Placement>,
}

/// Relative and absolute slack for comparing times computed in different orders.
fn slack(x: f64) -> f64 {
    1e-9 * (1.0 + x.abs())
}

/// `|a - b| <= tol`, false when either is NaN.
fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

impl Schedule {
    /// Builds a schedule from placements, sorting them and computing the makespan.
    pub fn from_placements(policy: &str, mut placements: Vec<Placement>) -> Schedule {
        placements.sort_by(|a, b| {
            a.start
                .total_cmp(&b.start)
                .then_with(|| a.processor.cmp(&b.processor))
                .then_with(|| a.task.cmp(&b.task))
        });
        let makespan = placements.iter().map(|p| p.end).fold(0.0, f64::max);
        Schedule {
            policy: policy.to_owned(),
            makespan,
            placements,
        }
    }

    /// The placement of task `id`, if any.
    pub fn placement(&self, id: &str) -> Option<&Placement> {
        self.placements.iter().find(|p| p.task == id)
    }

    /// Checks the schedule against `dag`: every task placed exactly once on a known
    /// processor, starting at or after 0, running exactly its cost there, after every input
    /// has arrived (the predecessor's end plus `data / bandwidth` across processors), never
    /// overlapping another task on its processor, and `makespan` the latest end. Times are
    /// compared with a 1e-9 relative slack.
    pub fn validate(&self, dag: &Dag) -> Result<()> {
        let n = dag.tasks().len();
        // (processor, start, end) per task index.
        let mut at: Vec<Option<(usize, f64, f64)>> = vec![None; n];
        for p in &self.placements {
            let t = dag
                .task_index(&p.task)
                .ok_or_else(|| ScheduleViolation::UnknownTask(p.task.clone()))?;
            let proc = dag.processor_index(&p.processor).ok_or_else(|| {
                ScheduleViolation::UnknownProcessor {
                    task: p.task.clone(),
                    processor: p.processor.clone(),
                }
            })?;
            if at[t].is_some() {
                return Err(ScheduleViolation::Duplicate(p.task.clone()).into());
            }
            if p.start.is_nan() || p.start < 0.0 {
                return Err(ScheduleViolation::NegativeStart {
                    task: p.task.clone(),
                    start: p.start,
                }
                .into());
            }
            let cost = dag.tasks()[t].cost[proc];
            let got = p.end - p.start;
            if !close(got, cost, slack(p.end)) {
                return Err(ScheduleViolation::Duration {
                    task: p.task.clone(),
                    processor: p.processor.clone(),
                    expected: cost,
                    got,
                }
                .into());
            }
            at[t] = Some((proc, p.start, p.end));
        }
        let mut placed = Vec::with_capacity(n);
        for (t, slot) in at.iter().enumerate() {
            match slot {
                Some(s) => placed.push(*s),
                None => return Err(ScheduleViolation::Missing(dag.tasks()[t].id.clone()).into()),
            }
        }
        for e in dag.edges() {
            let (pf, _, end) = placed[e.from];
            let (pt, start, _) = placed[e.to];
            let arrival = end + dag.comm_time(e.data, pf, pt);
            if start < arrival - slack(arrival) {
                return Err(ScheduleViolation::Dependency {
                    task: dag.tasks()[e.to].id.clone(),
                    pred: dag.tasks()[e.from].id.clone(),
                    start,
                    arrival,
                }
                .into());
            }
        }
        let mut by_proc: Vec<Vec<(f64, f64, usize)>> = vec![Vec::new(); dag.processors().len()];
        for (t, &(p, s, e)) in placed.iter().enumerate() {
            by_proc[p].push((s, e, t));
        }
        for (p, list) in by_proc.iter_mut().enumerate() {
            list.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            for w in list.windows(2) {
                let ((_, end, first), (start, _, second)) = (w[0], w[1]);
                if start < end - slack(end) {
                    return Err(ScheduleViolation::Overlap {
                        processor: dag.processors()[p].clone(),
                        first: dag.tasks()[first].id.clone(),
                        second: dag.tasks()[second].id.clone(),
                    }
                    .into());
                }
            }
        }
        let latest = placed.iter().map(|p| p.2).fold(0.0, f64::max);
        if !close(self.makespan, latest, slack(latest)) {
            return Err(ScheduleViolation::Makespan {
                expected: latest,
                got: self.makespan,
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::parse_dag;
    use crate::error::SchedError;

    fn dag() -> Dag {
        parse_dag(
            r#"{"processors": ["a", "b"], "bandwidth": 2,
                "tasks": [{"id": "x", "cost": [1, 2]}, {"id": "y", "cost": [3, 4]}, {"id": "z", "cost": [2, 2]}],
                "edges": [{"from": "x", "to": "y", "data": 4}]}"#,
        )
        .unwrap()
    }

    fn pl(task: &str, processor: &str, start: f64, end: f64) -> Placement {
        Placement {
            task: task.into(),
            processor: processor.into(),
            start,
            end,
        }
    }

    fn violation(s: &Schedule) -> ScheduleViolation {
        match s.validate(&dag()) {
            Err(SchedError::InvalidSchedule(v)) => v,
            other => panic!("expected a violation, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_valid_schedule_and_catches_each_violation() {
        // x on a [0,1]; y on b needs 4/2 = 2 of transfer: starts at 3; z on a [1,3].
        let good = Schedule::from_placements(
            "hand",
            vec![
                pl("y", "b", 3.0, 7.0),
                pl("x", "a", 0.0, 1.0),
                pl("z", "a", 1.0, 3.0),
            ],
        );
        good.validate(&dag()).unwrap();
        assert_eq!(good.makespan, 7.0);
        assert_eq!(good.placements[0].task, "x");

        let early = Schedule::from_placements(
            "hand",
            vec![
                pl("x", "a", 0.0, 1.0),
                pl("y", "b", 2.5, 6.5),
                pl("z", "a", 1.0, 3.0),
            ],
        );
        assert!(matches!(
            violation(&early),
            ScheduleViolation::Dependency { .. }
        ));
        let overlap = Schedule::from_placements(
            "hand",
            vec![
                pl("x", "a", 0.0, 1.0),
                pl("y", "a", 1.0, 4.0),
                pl("z", "a", 3.0, 5.0),
            ],
        );
        assert_eq!(
            violation(&overlap).to_string(),
            "tasks `y` and `z` overlap on processor `a`"
        );
        let missing =
            Schedule::from_placements("hand", vec![pl("x", "a", 0.0, 1.0), pl("y", "a", 1.0, 4.0)]);
        assert_eq!(violation(&missing), ScheduleViolation::Missing("z".into()));
        let twice = Schedule::from_placements(
            "hand",
            vec![
                pl("x", "a", 0.0, 1.0),
                pl("x", "b", 0.0, 2.0),
                pl("y", "a", 1.0, 4.0),
                pl("z", "b", 2.0, 4.0),
            ],
        );
        assert_eq!(violation(&twice), ScheduleViolation::Duplicate("x".into()));
        let short = Schedule::from_placements(
            "hand",
            vec![
                pl("x", "a", 0.0, 1.0),
                pl("y", "a", 1.0, 3.0),
                pl("z", "b", 0.0, 2.0),
            ],
        );
        assert!(matches!(
            violation(&short),
            ScheduleViolation::Duration { .. }
        ));
        let unknown = Schedule::from_placements("hand", vec![pl("x", "c", 0.0, 1.0)]);
        assert!(matches!(
            violation(&unknown),
            ScheduleViolation::UnknownProcessor { .. }
        ));
        let mut wrong_makespan = good.clone();
        wrong_makespan.makespan = 8.0;
        assert!(matches!(
            violation(&wrong_makespan),
            ScheduleViolation::Makespan { .. }
        ));
        let negative = Schedule::from_placements(
            "hand",
            vec![
                pl("x", "a", -1.0, 0.0),
                pl("y", "a", 1.0, 4.0),
                pl("z", "b", 0.0, 2.0),
            ],
        );
        assert!(matches!(
            violation(&negative),
            ScheduleViolation::NegativeStart { .. }
        ));
    }

    #[test]
    fn serializes_to_the_cli_shape() {
        let s = Schedule::from_placements("dmda", vec![pl("x", "a", 0.0, 1.5)]);
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"policy": "dmda", "makespan": 1.5,
                "placements": [{"task": "x", "processor": "a", "start": 0.0, "end": 1.5}]})
        );
    }
}
