//! The expanded task graph: one [`TaskInstance`] per task or array element, with defaults
//! applied and `{i}` substituted, and the dependencies between instances.
//!
//! Ids are dense (`0..n`), in file order, array elements in index order. Edges are stored
//! as compressed adjacency lists (one offsets table and one flat id list per direction),
//! so a million instances cost a few allocations, not a million. The graph is acyclic by
//! construction: building it computes a topological order, and a cycle is an error.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{CoreError, JobError, Problem, Result};
use crate::ids::TaskId;
use crate::job::{Group, JobSpec, Staging, TaskBody, INDEX_PLACEHOLDER};
use crate::resources::Resources;
use crate::source::Locator;
use crate::validate::find_cycle;

/// One alternative of a [`TaskKind::Variants`] instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantInstance {
    /// The variant's name.
    pub name: String,
    /// The command, `{i}` substituted.
    pub cmd: Vec<String>,
    /// Environment: defaults, then the task's, then the variant's.
    pub env: BTreeMap<String, String>,
    /// Working directory (the task's), `{i}` substituted.
    pub cwd: Option<String>,
    /// Resources: defaults, then the task's, then the variant's.
    pub resources: Resources,
}

/// A WASM module to run, as one instance needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WasmInstance {
    /// Path of the module.
    pub module: String,
    /// Exported function to call.
    pub entry: String,
    /// Arguments, `{i}` substituted.
    pub args: Vec<String>,
    /// Fuel limit, if any.
    pub fuel: Option<u64>,
    /// Memory limit in bytes, if any.
    pub memory: Option<u64>,
    /// Environment: defaults, then the task's.
    pub env: BTreeMap<String, String>,
    /// Working directory, `{i}` substituted.
    pub cwd: Option<String>,
}

/// What one instance runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TaskKind {
    /// A process.
    Command {
        /// Program and arguments, `{i}` substituted.
        cmd: Vec<String>,
        /// Environment: defaults, then the task's, `{i}` substituted in values.
        env: BTreeMap<String, String>,
        /// Working directory, `{i}` substituted.
        cwd: Option<String>,
    },
    /// Alternatives; the scheduler picks one.
    Variants(Vec<VariantInstance>),
    /// A WASI module.
    Wasm(WasmInstance),
}

/// One node of the graph: a task, or one element of an array task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInstance {
    /// Dense id, the instance's position in [`TaskGraph::tasks`].
    pub id: TaskId,
    /// `"tile[3]"` for an array element, `"stitch"` otherwise.
    pub name: String,
    /// The task's id in the job file (`"tile"`).
    pub base: String,
    /// The array index, for an array element.
    pub index: Option<u64>,
    /// What it runs.
    pub kind: TaskKind,
    /// Input path patterns, `{i}` substituted.
    pub inputs: Vec<String>,
    /// Output path patterns, `{i}` substituted.
    pub outputs: Vec<String>,
    /// Resources, defaults merged. For [`TaskKind::Variants`], what the variants inherit;
    /// each variant carries its own.
    pub resources: Resources,
    /// Attempts after the first.
    pub retries: u32,
    /// Time limit of one attempt.
    pub timeout: Option<Duration>,
    /// Higher runs first.
    pub priority: i64,
    /// Gang scheduling, if any.
    pub group: Option<Group>,
    /// Its gang and its rank in it, for a task with `group`.
    pub gang: Option<GangMember>,
    /// Checkpoint file patterns, `{i}` substituted.
    pub checkpoint: Vec<String>,
}

/// A task instance's place in its gang: the gang is the instances `first..first + size`,
/// started together, each told its `rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GangMember {
    /// The gang's first instance (rank 0).
    pub first: TaskId,
    /// This instance's rank, `0..size`.
    pub rank: u32,
    /// How many instances the gang has.
    pub size: u32,
}

/// The name of an instance: `base[index]` or `base`.
pub fn instance_name(base: &str, index: Option<u64>) -> String {
    match index {
        Some(i) => format!("{base}[{i}]"),
        None => base.to_string(),
    }
}

#[derive(Debug, Clone)]
struct BaseEntry {
    first: usize,
    count: usize,
    start: Option<u64>,
}

/// Compressed adjacency lists: the neighbours of `v` are `ids[off[v]..off[v + 1]]`.
#[derive(Debug, Clone, Default)]
struct Adjacency {
    off: Vec<usize>,
    ids: Vec<TaskId>,
}

impl Adjacency {
    fn of(&self, v: usize) -> &[TaskId] {
        &self.ids[self.off[v]..self.off[v + 1]]
    }

    /// The reverse lists, each sorted by id.
    fn reversed(&self, n: usize) -> Adjacency {
        let mut off = vec![0usize; n + 1];
        for id in &self.ids {
            off[id.index() + 1] += 1;
        }
        for v in 0..n {
            off[v + 1] += off[v];
        }
        let mut next = off.clone();
        let mut ids = vec![TaskId::new(0); self.ids.len()];
        for v in 0..n {
            for p in self.of(v) {
                ids[next[p.index()]] = TaskId::new(v as u32);
                next[p.index()] += 1;
            }
        }
        Adjacency { off, ids }
    }
}

/// A job expanded into instances and the edges between them; acyclic.
#[derive(Debug, Clone)]
pub struct TaskGraph {
    tasks: Vec<TaskInstance>,
    preds: Adjacency,
    succs: Adjacency,
    topo: Vec<TaskId>,
    bases: HashMap<String, BaseEntry>,
    /// The job's `keep_going`: a task failing for good leaves the others running.
    keep_going: bool,
}

impl TaskGraph {
    /// This graph with the job's `keep_going` set: a task that fails for good does not end
    /// the job; the tasks that need it are cancelled, every other one runs.
    pub fn keeping_going(mut self, keep_going: bool) -> TaskGraph {
        self.keep_going = keep_going;
        self
    }

    /// Whether a task failing for good leaves the job's other tasks running.
    pub fn keep_going(&self) -> bool {
        self.keep_going
    }

    /// Builds a graph from instances made in code. `deps[v]` lists the predecessors of
    /// instance `v`. Instances must have ids `0..n` in order; the instances of one base must
    /// be consecutive, with consecutive indices (as [`JobSpec::expand`] makes them), and each
    /// name must be [`instance_name`]`(base, index)`. Duplicate edges are dropped; an edge to
    /// a missing instance, a self-edge or a cycle is an error.
    pub fn from_instances(tasks: Vec<TaskInstance>, deps: Vec<Vec<TaskId>>) -> Result<TaskGraph> {
        let n = tasks.len();
        let fail = |name: &str, p: Problem| -> CoreError {
            JobError::new(p).task(name).field("after").into()
        };
        if deps.len() != n {
            let p = Problem::BadValue {
                value: format!("{} dependency lists", deps.len()),
                reason: format!("expected one per instance ({n})"),
            };
            return Err(JobError::new(p).into());
        }
        if u32::try_from(n).is_err() {
            let p = Problem::TooManyInstances {
                count: n as u128,
                max: u64::from(u32::MAX),
            };
            return Err(JobError::new(p).into());
        }
        let mut bases: HashMap<String, BaseEntry> = HashMap::new();
        for (i, t) in tasks.iter().enumerate() {
            let bad = |reason: String| -> CoreError {
                let p = Problem::BadValue {
                    value: format!("instance {:?} with id {}", t.name, t.id),
                    reason,
                };
                JobError::new(p).task(&t.name).into()
            };
            if t.id.index() != i {
                return Err(bad(format!(
                    "ids must be dense and in order; expected t{i}"
                )));
            }
            if t.name != instance_name(&t.base, t.index) {
                return Err(bad("the name must be base or base[index]".into()));
            }
            match bases.get_mut(&t.base) {
                None => {
                    bases.insert(
                        t.base.clone(),
                        BaseEntry {
                            first: i,
                            count: 1,
                            start: t.index,
                        },
                    );
                }
                Some(e) => {
                    let next = e.start.and_then(|s| s.checked_add(e.count as u64));
                    if e.first + e.count != i || next.is_none() || next != t.index {
                        return Err(bad(format!(
                            "instances of {:?} must be consecutive with consecutive indices",
                            t.base
                        )));
                    }
                    e.count += 1;
                }
            }
        }
        let mut adj = Adjacency {
            off: Vec::with_capacity(n + 1),
            ids: Vec::new(),
        };
        adj.off.push(0);
        for (v, mut list) in deps.into_iter().enumerate() {
            list.sort_unstable();
            list.dedup();
            for p in &list {
                if p.index() >= n {
                    return Err(fail(&tasks[v].name, Problem::NoSuchTask(p.to_string())));
                }
                if p.index() == v {
                    return Err(fail(&tasks[v].name, Problem::SelfDependency));
                }
            }
            adj.ids.extend(list);
            adj.off.push(adj.ids.len());
        }
        Self::build(tasks, adj, bases).map_err(|cycle| {
            let name = cycle[0].clone();
            fail(&name, Problem::Cycle { path: cycle })
        })
    }

    /// Computes successors and a topological order; on a cycle, returns its instance names
    /// in execution order, first repeated at the end.
    fn build(
        tasks: Vec<TaskInstance>,
        preds: Adjacency,
        bases: HashMap<String, BaseEntry>,
    ) -> std::result::Result<TaskGraph, Vec<String>> {
        let n = tasks.len();
        let succs = preds.reversed(n);
        let mut indeg: Vec<usize> = (0..n).map(|v| preds.of(v).len()).collect();
        let mut queue: VecDeque<TaskId> = (0..n)
            .filter(|&v| indeg[v] == 0)
            .map(|v| TaskId::new(v as u32))
            .collect();
        let mut topo = Vec::with_capacity(n);
        while let Some(v) = queue.pop_front() {
            topo.push(v);
            for s in succs.of(v.index()) {
                indeg[s.index()] -= 1;
                if indeg[s.index()] == 0 {
                    queue.push_back(*s);
                }
            }
        }
        if topo.len() < n {
            let cycle = find_cycle(n, |v| preds.of(v).iter().map(|p| p.index()))
                .expect("Kahn's algorithm left nodes, so there is a cycle");
            return Err(cycle.into_iter().map(|v| tasks[v].name.clone()).collect());
        }
        Ok(TaskGraph {
            tasks,
            preds,
            succs,
            topo,
            bases,
            keep_going: false,
        })
    }

    /// Number of instances.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether there are no instances.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Number of dependency edges.
    pub fn edge_count(&self) -> usize {
        self.preds.ids.len()
    }

    /// All instances, indexed by id.
    pub fn tasks(&self) -> &[TaskInstance] {
        &self.tasks
    }

    /// One instance. Panics if `id` is not from this graph.
    pub fn task(&self, id: TaskId) -> &TaskInstance {
        &self.tasks[id.index()]
    }

    /// What must finish before `id`, sorted by id. Panics if `id` is not from this graph.
    pub fn preds(&self, id: TaskId) -> &[TaskId] {
        self.preds.of(id.index())
    }

    /// What waits for `id`, sorted by id. Panics if `id` is not from this graph.
    pub fn succs(&self, id: TaskId) -> &[TaskId] {
        self.succs.of(id.index())
    }

    /// Every instance, each after all its predecessors (Kahn's order: roots by id first).
    pub fn topological_order(&self) -> &[TaskId] {
        &self.topo
    }

    /// Instances with no predecessors, by id.
    pub fn roots(&self) -> impl Iterator<Item = TaskId> + '_ {
        (0..self.len())
            .filter(|&v| self.preds.of(v).is_empty())
            .map(|v| TaskId::new(v as u32))
    }

    /// The instance named `"stitch"` or `"tile[3]"`.
    pub fn by_name(&self, name: &str) -> Option<TaskId> {
        let (base, index) = match name.split_once('[') {
            Some((base, rest)) => {
                let digits = rest.strip_suffix(']')?;
                if !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                (base, Some(digits.parse::<u64>().ok()?))
            }
            None => (name, None),
        };
        let e = self.bases.get(base)?;
        let offset = match (e.start, index) {
            (None, None) => 0,
            (Some(start), Some(i)) if i >= start && i - start < e.count as u64 => {
                usize::try_from(i - start).ok()?
            }
            _ => return None,
        };
        Some(TaskId::new((e.first + offset) as u32))
    }

    /// All instances of the task with this id (one, or every element of an array).
    pub fn instances_of(&self, base: &str) -> Option<&[TaskInstance]> {
        let e = self.bases.get(base)?;
        Some(&self.tasks[e.first..e.first + e.count])
    }

    /// The most expensive chain of dependent instances, where a chain costs the sum of
    /// `cost` over its instances: (total, instances from first to last). `(0.0, [])` for an
    /// empty graph. Linear in instances plus edges.
    pub fn critical_path(&self, cost: impl Fn(TaskId) -> f64) -> (f64, Vec<TaskId>) {
        let n = self.len();
        let mut dist = vec![0.0f64; n];
        let mut from: Vec<Option<TaskId>> = vec![None; n];
        let mut best_end: Option<TaskId> = None;
        for &v in &self.topo {
            let mut best: Option<TaskId> = None;
            for &p in self.preds(v) {
                if best.is_none_or(|b| dist[p.index()] > dist[b.index()]) {
                    best = Some(p);
                }
            }
            dist[v.index()] = cost(v) + best.map_or(0.0, |b| dist[b.index()]);
            from[v.index()] = best;
            if best_end.is_none_or(|b| dist[v.index()] > dist[b.index()]) {
                best_end = Some(v);
            }
        }
        let Some(end) = best_end else {
            return (0.0, Vec::new());
        };
        let mut path = vec![end];
        while let Some(p) = from[path[path.len() - 1].index()] {
            path.push(p);
        }
        path.reverse();
        (dist[end.index()], path)
    }
}

/// `s` with each `{i}` replaced by `index` (kept when `None`), but for a shell's `${i}`, kept
/// as written, and `{{i}}`, written `{i}`.
fn substitute(s: &str, index: Option<&str>) -> String {
    if !s.contains(INDEX_PLACEHOLDER) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find(INDEX_PLACEHOLDER) {
        let (before, after) = (&rest[..p], &rest[p + INDEX_PLACEHOLDER.len()..]);
        match crate::job::placeholder_at(before, after) {
            crate::job::Placeholder::Escaped => {
                out.push_str(&before[..before.len() - 1]);
                out.push_str(INDEX_PLACEHOLDER);
                rest = &after[1..];
                continue;
            }
            crate::job::Placeholder::Shell => {
                out.push_str(before);
                out.push_str(INDEX_PLACEHOLDER);
            }
            crate::job::Placeholder::Index => {
                out.push_str(before);
                out.push_str(index.unwrap_or(INDEX_PLACEHOLDER));
            }
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

fn substitute_all(v: &[String], index: Option<&str>) -> Vec<String> {
    v.iter().map(|s| substitute(s, index)).collect()
}

fn substitute_env(env: &BTreeMap<String, String>, index: Option<&str>) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| (k.clone(), substitute(v, index)))
        .collect()
}

fn merged_env(
    low: &BTreeMap<String, String>,
    high: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = low.clone();
    env.extend(high.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

pub(crate) fn expand(spec: &JobSpec) -> Result<TaskGraph> {
    spec.validate()?;
    let d = &spec.defaults;
    let n: usize = spec.tasks.iter().map(|t| t.instance_count() as usize).sum();
    let mut tasks = Vec::with_capacity(n);
    let mut firsts = Vec::with_capacity(spec.tasks.len());
    let mut bases = HashMap::with_capacity(spec.tasks.len());
    for task in &spec.tasks {
        let first = tasks.len();
        firsts.push(first);
        bases.insert(
            task.id.clone(),
            BaseEntry {
                first,
                count: task.instance_count() as usize,
                start: task.indices().map(|r| r.start),
            },
        );
        let request = d.resources.overlay(&task.resources);
        let resources = request.resolve();
        let env = merged_env(&d.env, &task.env);
        let variants: Vec<(
            &crate::job::VariantSpec,
            Resources,
            BTreeMap<String, String>,
        )> = match &task.body {
            TaskBody::Variants(vs) => vs
                .iter()
                .map(|v| {
                    (
                        v,
                        request.overlay(&v.resources).resolve(),
                        merged_env(&env, &v.env),
                    )
                })
                .collect(),
            _ => Vec::new(),
        };
        let indices: Box<dyn Iterator<Item = Option<u64>>> = match task.indices() {
            Some(r) => Box::new(r.map(Some)),
            None => Box::new(std::iter::once(None)),
        };
        for index in indices {
            let text = index.map(|i| i.to_string());
            let i = text.as_deref();
            let cwd = task.cwd.as_deref().map(|c| substitute(c, i));
            let kind = match &task.body {
                TaskBody::Command(cmd) => TaskKind::Command {
                    cmd: substitute_all(cmd, i),
                    env: substitute_env(&env, i),
                    cwd,
                },
                TaskBody::Variants(_) => TaskKind::Variants(
                    variants
                        .iter()
                        .map(|(v, res, env)| VariantInstance {
                            name: v.name.clone(),
                            cmd: substitute_all(&v.cmd, i),
                            env: substitute_env(env, i),
                            cwd: cwd.clone(),
                            resources: res.clone(),
                        })
                        .collect(),
                ),
                TaskBody::Wasm(w) => TaskKind::Wasm(WasmInstance {
                    module: w.module.clone(),
                    entry: w.entry.clone(),
                    args: substitute_all(&w.args, i),
                    fuel: w.fuel,
                    memory: w.memory,
                    env: substitute_env(&env, i),
                    cwd,
                }),
            };
            tasks.push(TaskInstance {
                id: TaskId::new(tasks.len() as u32),
                name: instance_name(&task.id, index),
                base: task.id.clone(),
                index,
                kind,
                inputs: {
                    let mut inputs = substitute_all(&task.inputs, i);
                    // A WASM module is the task's program, a file of the job folder (or an
                    // earlier task's output): in transfer staging it travels as an input,
                    // listed or not (a process's program is the worker's).
                    if let (Staging::Transfer, TaskBody::Wasm(w)) = (spec.staging, &task.body) {
                        if !inputs.contains(&w.module) {
                            inputs.push(w.module.clone());
                        }
                    }
                    inputs
                },
                outputs: substitute_all(&task.outputs, i),
                checkpoint: substitute_all(&task.checkpoint, i),
                resources: resources.clone(),
                retries: task.retries.unwrap_or(d.retries),
                timeout: task.timeout.or(d.timeout),
                priority: task.priority.unwrap_or(d.priority),
                group: task.group,
                gang: task.group.map(|g| {
                    let position = (tasks.len() - first) as u32;
                    GangMember {
                        first: TaskId::new((first as u32) + position / g.size * g.size),
                        rank: position % g.size,
                        size: g.size,
                    }
                }),
            });
        }
    }

    let index_of: HashMap<&str, usize> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(t, task)| (task.id.as_str(), t))
        .collect();
    let mut adj = Adjacency {
        off: Vec::with_capacity(n + 1),
        ids: Vec::new(),
    };
    adj.off.push(0);
    for task in &spec.tasks {
        // The same predecessor list serves every instance of the task.
        let mut list: Vec<TaskId> = Vec::new();
        for dep in &task.after {
            let target = index_of[dep.task.as_str()];
            let first = firsts[target];
            let other = &spec.tasks[target];
            match (dep.index, other.indices()) {
                (Some(i), Some(r)) => list.push(TaskId::new((first as u64 + (i - r.start)) as u32)),
                _ => list.extend(
                    (first..first + other.instance_count() as usize).map(|v| TaskId::new(v as u32)),
                ),
            }
        }
        list.sort_unstable();
        list.dedup();
        for _ in 0..task.instance_count() {
            adj.ids.extend_from_slice(&list);
            adj.off.push(adj.ids.len());
        }
    }

    let graph = TaskGraph::build(tasks, adj, bases).map_err(|cycle| {
        // Validation rejects task-level cycles, so this only guards against a bug there.
        let base = cycle[0].split('[').next().unwrap_or_default().to_string();
        let t = index_of.get(base.as_str()).copied().unwrap_or(0);
        let e = JobError::new(Problem::Cycle { path: cycle })
            .task(base)
            .field("after");
        CoreError::from(
            Locator {
                source: spec.source.as_ref(),
            }
            .task(e, t, "after"),
        )
    })?;
    Ok(graph.keeping_going(spec.keep_going))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Dependency, TaskSpec};
    use crate::parse_job;

    fn cmd_task(id: &str) -> TaskSpec {
        TaskSpec::new(id, TaskBody::Command(vec!["run".into(), "{i}".into()]))
    }

    fn instance(id: u32, base: &str) -> TaskInstance {
        TaskInstance {
            id: TaskId::new(id),
            name: base.to_string(),
            base: base.to_string(),
            index: None,
            kind: TaskKind::Command {
                cmd: vec!["x".into()],
                env: BTreeMap::new(),
                cwd: None,
            },
            inputs: Vec::new(),
            outputs: Vec::new(),
            resources: Resources::default(),
            retries: 0,
            timeout: None,
            priority: 0,
            group: None,
            gang: None,
            checkpoint: Vec::new(),
        }
    }

    #[test]
    fn a_million_element_array_and_a_reduce_expand_in_linear_time() {
        let mut map = cmd_task("map");
        map.array = Some(0..1_000_000);
        let mut reduce = TaskSpec::new("reduce", TaskBody::Command(vec!["sum".into()]));
        reduce.after = vec![Dependency {
            task: "map".into(),
            index: None,
        }];
        let mut job = JobSpec::new("big");
        job.tasks = vec![map, reduce];
        let g = job.expand().unwrap();
        assert_eq!(g.len(), 1_000_001);
        assert_eq!(g.edge_count(), 1_000_000);
        let r = g.by_name("reduce").unwrap();
        assert_eq!(r.index(), 1_000_000);
        assert_eq!(g.preds(r).len(), 1_000_000);
        assert_eq!(g.roots().count(), 1_000_000);
        let last = g.by_name("map[999999]").unwrap();
        assert_eq!(g.succs(last), &[r]);
        assert!(matches!(&g.task(last).kind, TaskKind::Command { cmd, .. } if cmd[1] == "999999"));
        assert_eq!(g.topological_order().last(), Some(&r));
        let (len, path) = g.critical_path(|_| 1.0);
        assert_eq!(len, 2.0);
        assert_eq!(path.len(), 2);
    }

    #[test]
    fn element_dependencies_and_duplicates_expand_to_single_edges() {
        let text = r#"
[[task]]
id = "a"
array = "10..13"
cmd = ["a", "{i}"]

[[task]]
id = "b"
array = "0..2"
cmd = ["b", "{i}"]
after = ["a[11]", "a[11]", "a[12]"]

[[task]]
id = "c"
cmd = ["c"]
after = ["b", "b[1]", "a[10]"]
"#;
        let g = parse_job(text, "j.toml").unwrap().expand().unwrap();
        let id = |n: &str| g.by_name(n).unwrap();
        assert_eq!(g.preds(id("b[0]")), &[id("a[11]"), id("a[12]")]);
        assert_eq!(g.preds(id("b[1]")), &[id("a[11]"), id("a[12]")]);
        assert_eq!(g.preds(id("c")), &[id("a[10]"), id("b[0]"), id("b[1]")]);
        assert_eq!(g.succs(id("a[11]")), &[id("b[0]"), id("b[1]")]);
        assert_eq!(g.succs(id("a[10]")), &[id("c")]);
        assert_eq!(g.edge_count(), 7);
        assert_eq!(
            g.roots().collect::<Vec<_>>(),
            vec![id("a[10]"), id("a[11]"), id("a[12]")]
        );
        let pos: HashMap<TaskId, usize> = g
            .topological_order()
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, i))
            .collect();
        assert_eq!(pos.len(), g.len());
        for t in g.tasks() {
            for p in g.preds(t.id) {
                assert!(pos[p] < pos[&t.id], "{} before {}", p, t.id);
            }
        }
    }

    #[test]
    fn critical_path_follows_the_most_expensive_chain() {
        // Diamond: s -> {cheap, dear} -> t, plus a lone expensive task.
        let text = r#"
[[task]]
id = "s"
cmd = ["x"]
[[task]]
id = "cheap"
cmd = ["x"]
after = ["s"]
[[task]]
id = "dear"
cmd = ["x"]
after = ["s"]
[[task]]
id = "t"
cmd = ["x"]
after = ["cheap", "dear"]
[[task]]
id = "lone"
cmd = ["x"]
"#;
        let g = parse_job(text, "j.toml").unwrap().expand().unwrap();
        let costs: HashMap<&str, f64> = [
            ("s", 1.0),
            ("cheap", 2.0),
            ("dear", 5.0),
            ("t", 1.0),
            ("lone", 6.0),
        ]
        .into();
        let cost = |id: TaskId| costs[g.task(id).name.as_str()];
        let (total, path) = g.critical_path(cost);
        assert_eq!(total, 7.0);
        let names: Vec<&str> = path.iter().map(|&t| g.task(t).name.as_str()).collect();
        assert_eq!(names, vec!["s", "dear", "t"]);
        let (total, path) =
            g.critical_path(|id| if g.task(id).name == "lone" { 10.0 } else { 1.0 });
        assert_eq!(total, 10.0);
        assert_eq!(path, vec![g.by_name("lone").unwrap()]);
    }

    #[test]
    fn from_instances_rejects_cycles_with_a_real_path() {
        let tasks: Vec<TaskInstance> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, n)| instance(i as u32, n))
            .collect();
        let t = TaskId::new;
        // d after c, c after b, b after a... and b after c: b <-> c cycle.
        let deps = vec![vec![], vec![t(0), t(2)], vec![t(1)], vec![t(2)]];
        let e = TaskGraph::from_instances(tasks.clone(), deps.clone()).unwrap_err();
        let Problem::Cycle { path } = &e.as_job().unwrap().problem else {
            panic!("cycle expected: {e}")
        };
        assert_eq!(path, &vec!["b".to_string(), "c".into(), "b".into()]);
        assert_eq!(
            e.to_string(),
            r#"task "b": field "after": dependency cycle: b -> c -> b"#
        );

        let ok = vec![vec![], vec![t(0)], vec![t(1), t(1)], vec![t(2), t(0)]];
        let g = TaskGraph::from_instances(tasks.clone(), ok).unwrap();
        assert_eq!(g.preds(t(2)), &[t(1)]);
        assert_eq!(g.topological_order(), &[t(0), t(1), t(2), t(3)]);
        assert_eq!(g.by_name("c"), Some(t(2)));
        assert_eq!(g.by_name("c[0]"), None);

        let self_loop = vec![vec![], vec![t(1)], vec![], vec![]];
        assert!(TaskGraph::from_instances(tasks.clone(), self_loop)
            .unwrap_err()
            .to_string()
            .contains("cannot depend on itself"));
        let dangling = vec![vec![t(9)], vec![], vec![], vec![]];
        assert!(TaskGraph::from_instances(tasks.clone(), dangling)
            .unwrap_err()
            .to_string()
            .contains("no task named \"t9\""));
        let mut shuffled = tasks.clone();
        shuffled.swap(0, 1);
        assert!(TaskGraph::from_instances(shuffled, vec![vec![]; 4]).is_err());
        let mut split = tasks;
        split[2].base = "a".into();
        split[2].name = "a".into();
        assert!(TaskGraph::from_instances(split, vec![vec![]; 4]).is_err());
    }

    #[test]
    fn expansion_guards_against_cycles_that_validation_missed() {
        // Build the cyclic instance lists directly, as a buggy validation would let through.
        let tasks = vec![instance(0, "x"), instance(1, "y")];
        let preds = Adjacency {
            off: vec![0, 1, 2],
            ids: vec![TaskId::new(1), TaskId::new(0)],
        };
        let cycle = TaskGraph::build(tasks, preds, HashMap::new()).unwrap_err();
        assert_eq!(cycle, vec!["x", "y", "x"]);
    }

    #[test]
    fn a_group_without_array_runs_as_its_ranks() {
        let text = r#"
[[task]]
id = "prep"
cmd = ["x"]
[[task]]
id = "train"
cmd = ["train", "--rank-hint", "{i}"]
after = ["prep"]
group = { size = 3 }
[[task]]
id = "eval"
cmd = ["x"]
after = ["train[2]"]
"#;
        let g = parse_job(text, "j.toml").unwrap().expand().unwrap();
        assert_eq!(g.len(), 5);
        for r in 0..3u32 {
            let t = g.by_name(&format!("train[{r}]")).unwrap();
            let inst = g.task(t);
            let gang = inst.gang.unwrap();
            assert_eq!((gang.first, gang.rank, gang.size), (TaskId::new(1), r, 3));
            assert_eq!(g.preds(t), &[TaskId::new(0)]);
            match &inst.kind {
                TaskKind::Command { cmd, .. } => assert_eq!(cmd[2], r.to_string()),
                other => panic!("{other:?}"),
            }
        }
        let eval = g.by_name("eval").unwrap();
        assert_eq!(g.preds(eval), &[g.by_name("train[2]").unwrap()]);
        assert!(g.task(TaskId::new(0)).gang.is_none());
    }

    #[test]
    fn an_array_group_is_cut_into_gangs_of_size() {
        let text = "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n[[task]]\nid = \"w\"\narray = \"10..16\"\ncmd = [\"x\"]\ngroup = { size = 3 }\n";
        let g = parse_job(text, "j.toml").unwrap().expand().unwrap();
        let gangs: Vec<(u32, u32)> = (1..7)
            .map(|i| {
                let m = g.task(TaskId::new(i)).gang.unwrap();
                (m.first.0, m.rank)
            })
            .collect();
        assert_eq!(gangs, vec![(1, 0), (1, 1), (1, 2), (4, 0), (4, 1), (4, 2)]);
        let bad = "[[task]]\nid = \"w\"\narray = \"0..5\"\ncmd = [\"x\"]\ngroup = { size = 2 }\n";
        let e = parse_job(bad, "j.toml").unwrap_err().to_string();
        assert!(
            e.contains("j.toml:5") && e.contains("not a multiple of the group size 2"),
            "{e}"
        );
    }
}
