//! A static task DAG with per-processor costs, for the simulator, the HEFT planner and
//! `flotilla simulate --dag FILE.json`.
//!
//! The JSON form ([`DagSpec`]):
//!
//! ```json
//! {"processors": ["p1", "p2"], "bandwidth": 1.0,
//!  "tasks": [{"id": "t1", "cost": [14, 16]}, {"id": "t2", "cost": [13, 19], "kind": "gemm"}],
//!  "edges": [{"from": "t1", "to": "t2", "data": 18}]}
//! ```
//!
//! `cost[i]` is the task's execution time on `processors[i]`. Sending an edge's `data`
//! between two different processors takes `data / bandwidth`; on the same processor it is
//! free. `kind` is optional and informative (the static policies ignore it); `edges` may be
//! left out. Unknown fields are rejected so that a misspelt field is an error, not a silently
//! empty DAG.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SchedError};

/// The JSON form of a DAG.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DagSpec {
    /// Processor names, in cost order.
    pub processors: Vec<String>,
    /// Data units per time unit between two different processors.
    pub bandwidth: f64,
    /// The tasks.
    pub tasks: Vec<TaskSpec>,
    /// The dependencies.
    #[serde(default)]
    pub edges: Vec<EdgeSpec>,
}

/// One task of a [`DagSpec`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Unique id.
    pub id: String,
    /// Execution time on each processor, in the order of `processors`.
    pub cost: Vec<f64>,
    /// What kind of task it is (e.g. `"gemm"`); informative only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// One dependency of a [`DagSpec`]: `to` needs `data` from `from`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    /// The producing task's id.
    pub from: String,
    /// The consuming task's id.
    pub to: String,
    /// How much data flows along the edge.
    #[serde(default)]
    pub data: f64,
}

/// One task of a checked [`Dag`].
#[derive(Clone, Debug, PartialEq)]
pub struct DagTask {
    /// Unique id.
    pub id: String,
    /// Execution time per processor.
    pub cost: Vec<f64>,
    /// Optional kind.
    pub kind: Option<String>,
}

/// One edge of a checked [`Dag`], by task index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DagEdge {
    /// Index of the producing task.
    pub from: usize,
    /// Index of the consuming task.
    pub to: usize,
    /// Data along the edge.
    pub data: f64,
}

/// A checked DAG: unique ids, one finite non-negative cost per processor, known tasks in
/// every edge, no duplicate edge, no cycle, a positive bandwidth.
///
/// Tasks are addressed by their index in [`Dag::tasks`], edges by their index in
/// [`Dag::edges`].
#[derive(Clone, Debug)]
pub struct Dag {
    processors: Vec<String>,
    bandwidth: f64,
    tasks: Vec<DagTask>,
    edges: Vec<DagEdge>,
    preds: Vec<Vec<usize>>,
    succs: Vec<Vec<usize>>,
    topo: Vec<usize>,
    index: HashMap<String, usize>,
}

/// Parses and checks a DAG from its JSON form (see the [module docs](self)).
pub fn parse_dag(json: &str) -> Result<Dag> {
    let spec: DagSpec = serde_json::from_str(json).map_err(SchedError::DagJson)?;
    Dag::from_spec(spec)
}

impl Dag {
    /// Checks a [`DagSpec`] and builds the DAG.
    pub fn from_spec(spec: DagSpec) -> Result<Dag> {
        let DagSpec {
            processors,
            bandwidth,
            tasks,
            edges,
        } = spec;
        if processors.is_empty() {
            return Err(SchedError::NoProcessors);
        }
        let mut seen = HashMap::new();
        for p in &processors {
            if seen.insert(p.as_str(), ()).is_some() {
                return Err(SchedError::DuplicateProcessor(p.clone()));
            }
        }
        if !bandwidth.is_finite() || bandwidth <= 0.0 {
            return Err(SchedError::Bandwidth(bandwidth));
        }
        let mut index = HashMap::with_capacity(tasks.len());
        let mut checked = Vec::with_capacity(tasks.len());
        for (i, t) in tasks.into_iter().enumerate() {
            if index.insert(t.id.clone(), i).is_some() {
                return Err(SchedError::DuplicateTask(t.id));
            }
            if t.cost.len() != processors.len() {
                return Err(SchedError::CostArity {
                    task: t.id,
                    expected: processors.len(),
                    got: t.cost.len(),
                });
            }
            if let Some((p, &c)) = t
                .cost
                .iter()
                .enumerate()
                .find(|(_, c)| !c.is_finite() || **c < 0.0)
            {
                return Err(SchedError::BadCost {
                    task: t.id,
                    processor: processors[p].clone(),
                    cost: c,
                });
            }
            checked.push(DagTask {
                id: t.id,
                cost: t.cost,
                kind: t.kind,
            });
        }
        let n = checked.len();
        let mut preds = vec![Vec::new(); n];
        let mut succs = vec![Vec::new(); n];
        let mut pairs = HashMap::with_capacity(edges.len());
        let mut checked_edges = Vec::with_capacity(edges.len());
        for (e, edge) in edges.into_iter().enumerate() {
            let lookup = |id: &str| {
                index
                    .get(id)
                    .copied()
                    .ok_or_else(|| SchedError::UnknownTask {
                        edge: e,
                        from: edge.from.clone(),
                        to: edge.to.clone(),
                        unknown: id.to_owned(),
                    })
            };
            let from = lookup(&edge.from)?;
            let to = lookup(&edge.to)?;
            if !edge.data.is_finite() || edge.data < 0.0 {
                return Err(SchedError::BadData {
                    from: edge.from,
                    to: edge.to,
                    data: edge.data,
                });
            }
            if pairs.insert((from, to), ()).is_some() {
                return Err(SchedError::DuplicateEdge {
                    from: edge.from,
                    to: edge.to,
                });
            }
            preds[to].push(checked_edges.len());
            succs[from].push(checked_edges.len());
            checked_edges.push(DagEdge {
                from,
                to,
                data: edge.data,
            });
        }
        let mut dag = Dag {
            processors,
            bandwidth,
            tasks: checked,
            edges: checked_edges,
            preds,
            succs,
            topo: Vec::new(),
            index,
        };
        dag.topo = dag.topological_order()?;
        Ok(dag)
    }

    /// Kahn's algorithm (lowest index first among ready tasks); on a cycle, names one.
    fn topological_order(&self) -> Result<Vec<usize>> {
        let n = self.tasks.len();
        let mut indegree: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
            .filter(|&t| indegree[t] == 0)
            .map(std::cmp::Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(std::cmp::Reverse(t)) = ready.pop() {
            order.push(t);
            for &e in &self.succs[t] {
                let s = self.edges[e].to;
                indegree[s] -= 1;
                if indegree[s] == 0 {
                    ready.push(std::cmp::Reverse(s));
                }
            }
        }
        if order.len() == n {
            return Ok(order);
        }
        // Every task left has a predecessor that is also left: walking predecessors from
        // any of them must come back to a task already on the path.
        let start = (0..n)
            .find(|&t| indegree[t] > 0)
            .expect("a task is left when the order is short");
        let mut on_path = vec![usize::MAX; n];
        let mut path = Vec::new();
        let mut t = start;
        while on_path[t] == usize::MAX {
            on_path[t] = path.len();
            path.push(t);
            t = self.preds[t]
                .iter()
                .map(|&e| self.edges[e].from)
                .find(|&p| indegree[p] > 0)
                .expect("a task left by Kahn's algorithm has a predecessor left");
        }
        let mut cycle: Vec<String> = path[on_path[t]..]
            .iter()
            .map(|&i| self.tasks[i].id.clone())
            .collect();
        cycle.reverse(); // walked backwards along edges
                         // Start the cycle at its smallest id, so the message does not depend on the walk.
        if let Some(min) = (0..cycle.len()).min_by(|&a, &b| cycle[a].cmp(&cycle[b])) {
            cycle.rotate_left(min);
        }
        Err(SchedError::Cycle(cycle))
    }

    /// Processor names.
    pub fn processors(&self) -> &[String] {
        &self.processors
    }

    /// Data units per time unit between two different processors.
    pub fn bandwidth(&self) -> f64 {
        self.bandwidth
    }

    /// The tasks.
    pub fn tasks(&self) -> &[DagTask] {
        &self.tasks
    }

    /// The edges.
    pub fn edges(&self) -> &[DagEdge] {
        &self.edges
    }

    /// Indices (into [`Dag::edges`]) of the edges into task `t`.
    pub fn in_edges(&self, t: usize) -> &[usize] {
        &self.preds[t]
    }

    /// Indices (into [`Dag::edges`]) of the edges out of task `t`.
    pub fn out_edges(&self, t: usize) -> &[usize] {
        &self.succs[t]
    }

    /// The tasks in a topological order (Kahn's, lowest index first among ready tasks).
    pub fn topo_order(&self) -> &[usize] {
        &self.topo
    }

    /// The index of the task with id `id`.
    pub fn task_index(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// The index of the processor named `name`.
    pub fn processor_index(&self, name: &str) -> Option<usize> {
        self.processors.iter().position(|p| p == name)
    }

    /// Time to send `data` from processor `from` to processor `to`: `data / bandwidth`, or 0
    /// on the same processor.
    pub fn comm_time(&self, data: f64, from: usize, to: usize) -> f64 {
        if from == to {
            0.0
        } else {
            data / self.bandwidth
        }
    }

    /// The DAG's JSON form.
    pub fn to_spec(&self) -> DagSpec {
        DagSpec {
            processors: self.processors.clone(),
            bandwidth: self.bandwidth,
            tasks: self
                .tasks
                .iter()
                .map(|t| TaskSpec {
                    id: t.id.clone(),
                    cost: t.cost.clone(),
                    kind: t.kind.clone(),
                })
                .collect(),
            edges: self
                .edges
                .iter()
                .map(|e| EdgeSpec {
                    from: self.tasks[e.from].id.clone(),
                    to: self.tasks[e.to].id.clone(),
                    data: e.data,
                })
                .collect(),
        }
    }

    /// The DAG as pretty-printed JSON, readable by [`parse_dag`].
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.to_spec())
            .expect("a dag of strings and finite numbers serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SMALL: &str = r#"{"processors": ["a", "b"], "bandwidth": 2,
        "tasks": [{"id": "x", "cost": [1, 2]}, {"id": "y", "cost": [3, 4], "kind": "gemm"},
                  {"id": "z", "cost": [0, 0]}],
        "edges": [{"from": "x", "to": "y", "data": 4}, {"from": "x", "to": "z", "data": 0}]}"#;

    fn err(json: &str) -> String {
        parse_dag(json).unwrap_err().to_string()
    }

    #[test]
    fn parses_tasks_edges_and_kinds() {
        let dag = parse_dag(SMALL).unwrap();
        assert_eq!(dag.processors(), ["a", "b"]);
        assert_eq!(dag.tasks().len(), 3);
        assert_eq!(dag.tasks()[1].kind.as_deref(), Some("gemm"));
        assert_eq!(dag.task_index("z"), Some(2));
        assert_eq!(dag.processor_index("b"), Some(1));
        assert_eq!(dag.in_edges(1), [0]);
        assert_eq!(dag.out_edges(0), [0, 1]);
        assert_eq!(dag.comm_time(4.0, 0, 1), 2.0);
        assert_eq!(dag.comm_time(4.0, 1, 1), 0.0);
        assert_eq!(dag.topo_order(), [0, 1, 2]);
        let no_edges =
            parse_dag(r#"{"processors":["a"],"bandwidth":1,"tasks":[{"id":"t","cost":[1]}]}"#);
        assert_eq!(no_edges.unwrap().edges().len(), 0);
    }

    #[test]
    fn names_the_cycle() {
        let json = r#"{"processors": ["p"], "bandwidth": 1,
            "tasks": [{"id": "s", "cost": [1]}, {"id": "a", "cost": [1]}, {"id": "b", "cost": [1]},
                      {"id": "c", "cost": [1]}, {"id": "d", "cost": [1]}],
            "edges": [{"from": "s", "to": "a"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"},
                      {"from": "c", "to": "a"}, {"from": "c", "to": "d"}]}"#;
        assert_eq!(err(json), "dag has a cycle: a -> b -> c -> a");
        let self_loop = r#"{"processors": ["p"], "bandwidth": 1,
            "tasks": [{"id": "a", "cost": [1]}], "edges": [{"from": "a", "to": "a"}]}"#;
        assert_eq!(err(self_loop), "dag has a cycle: a -> a");
    }

    #[test]
    fn rejects_bad_dags_with_clear_errors() {
        let cases = [
            (
                r#"{"processors": ["a", "b"], "bandwidth": 1, "tasks": [{"id": "t3", "cost": [1]}]}"#,
                "task `t3` has 1 costs but the dag has 2 processors",
            ),
            (
                r#"{"processors": ["a"], "bandwidth": 1, "tasks": [{"id": "t", "cost": [1]}],
                    "edges": [{"from": "t", "to": "u", "data": 1}]}"#,
                "edge 0 (t -> u) names unknown task `u`",
            ),
            (
                r#"{"processors": ["a"], "bandwidth": 1, "tasks": [{"id": "t", "cost": [1]}, {"id": "t", "cost": [2]}]}"#,
                "duplicate task id `t` in dag",
            ),
            (
                r#"{"processors": ["a", "a"], "bandwidth": 1, "tasks": []}"#,
                "duplicate processor `a` in dag",
            ),
            (
                r#"{"processors": ["a", "b"], "bandwidth": 1, "tasks": [{"id": "t", "cost": [1, -2]}]}"#,
                "task `t` has cost -2 on processor `b`; costs must be finite and >= 0",
            ),
            (
                r#"{"processors": ["a"], "bandwidth": 0, "tasks": []}"#,
                "dag bandwidth must be a finite number > 0, got 0",
            ),
            (
                r#"{"processors": ["a"], "bandwidth": -3, "tasks": []}"#,
                "dag bandwidth must be a finite number > 0, got -3",
            ),
            (
                r#"{"processors": [], "bandwidth": 1, "tasks": []}"#,
                "dag has no processors",
            ),
            (
                r#"{"processors": ["a"], "bandwidth": 1, "tasks": [{"id": "t", "cost": [1]}, {"id": "u", "cost": [1]}],
                    "edges": [{"from": "t", "to": "u", "data": -1}]}"#,
                "edge t -> u has data -1; data must be finite and >= 0",
            ),
            (
                r#"{"processors": ["a"], "bandwidth": 1, "tasks": [{"id": "t", "cost": [1]}, {"id": "u", "cost": [1]}],
                    "edges": [{"from": "t", "to": "u"}, {"from": "t", "to": "u"}]}"#,
                "duplicate edge t -> u in dag",
            ),
        ];
        for (json, want) in cases {
            assert_eq!(err(json), want, "{json}");
        }
        let typo = err(r#"{"processors": ["a"], "bandwidth": 1, "tasks": [], "edge": []}"#);
        assert!(
            typo.starts_with("invalid dag json: unknown field `edge`"),
            "{typo}"
        );
        assert!(
            err("[1,").contains("line 1"),
            "json errors carry a position"
        );
    }

    fn arb_spec() -> impl Strategy<Value = DagSpec> {
        (1usize..4, 1usize..15, 0.1f64..10.0).prop_flat_map(|(np, nt, bw)| {
            (
                proptest::collection::vec(proptest::collection::vec(0.0f64..50.0, np), nt),
                proptest::collection::vec((0..nt, 0..nt, 0.0f64..20.0), 0..nt * 2),
            )
                .prop_map(move |(costs, raw_edges)| {
                    let mut seen = std::collections::HashSet::new();
                    let edges = raw_edges
                        .into_iter()
                        .filter(|(a, b, _)| a < b && seen.insert((*a, *b)))
                        .map(|(a, b, d)| EdgeSpec {
                            from: format!("t{a}"),
                            to: format!("t{b}"),
                            data: d,
                        })
                        .collect();
                    DagSpec {
                        processors: (0..np).map(|p| format!("p{p}")).collect(),
                        bandwidth: bw,
                        tasks: costs
                            .into_iter()
                            .enumerate()
                            .map(|(i, cost)| TaskSpec {
                                id: format!("t{i}"),
                                cost,
                                kind: (i % 2 == 0).then(|| "k".to_owned()),
                            })
                            .collect(),
                        edges,
                    }
                })
        })
    }

    proptest! {
        #[test]
        fn json_round_trip_and_topological_order(spec in arb_spec()) {
            let dag = Dag::from_spec(spec.clone()).unwrap();
            prop_assert_eq!(dag.to_spec(), spec.clone());
            let back = parse_dag(&dag.to_json()).unwrap();
            prop_assert_eq!(back.to_spec(), spec);
            let mut pos = vec![0; dag.tasks().len()];
            for (i, &t) in dag.topo_order().iter().enumerate() {
                pos[t] = i;
            }
            for e in dag.edges() {
                prop_assert!(pos[e.from] < pos[e.to]);
            }
        }

        #[test]
        fn a_back_edge_is_always_reported_as_a_cycle(spec in arb_spec()) {
            prop_assume!(!spec.edges.is_empty());
            let mut spec = spec;
            let e = spec.edges[0].clone();
            spec.edges.push(EdgeSpec { from: e.to.clone(), to: e.from.clone(), data: 1.0 });
            let err = Dag::from_spec(spec).unwrap_err();
            prop_assert!(matches!(err, SchedError::Cycle(ref c) if c.contains(&e.from) && c.contains(&e.to)), "{}", err);
        }
    }
}
