//! The checks that need the whole job: names, duplicate ids, ranges and instance counts,
//! commands and variants, resources, groups, `{i}` outside arrays, dependencies and cycles.
//!
//! They run on a [`JobSpec`], parsed or built in code; with a [`SourceMap`](crate::SourceMap)
//! the errors name file and line.

use std::collections::{BTreeMap, HashMap};

use crate::error::{JobError, Problem, Result};
use crate::job::{JobSpec, TaskBody, TaskSpec, MAX_EDGES, MAX_INSTANCES};
use crate::resources::ResourceRequest;
use crate::source::Locator;

/// Whether `s` is a valid task id, variant name or custom resource name.
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

const RESERVED_RESOURCES: [&str; 4] = ["cpus", "gpus", "mem", "gpu_mem"];

fn check_resources(r: &ResourceRequest) -> Option<Problem> {
    if let Some((name, amount)) = r.first_bad_amount() {
        return Some(Problem::BadAmount { name, amount });
    }
    r.custom.keys().find_map(|k| {
        if !is_valid_name(k) {
            Some(Problem::BadName(k.clone()))
        } else if RESERVED_RESOURCES.contains(&k.as_str()) {
            Some(Problem::BadValue {
                value: format!("custom resource {k:?}"),
                reason: "the name is reserved".into(),
            })
        } else {
            None
        }
    })
}

fn check_env(env: &BTreeMap<String, String>) -> Option<Problem> {
    env.keys().find_map(|k| {
        (k.is_empty() || k.contains(['=', '\0'])).then(|| Problem::BadValue {
            value: format!("environment variable {k:?}"),
            reason: "names must be non-empty, without '=' or NUL".into(),
        })
    })
}

fn check_command(cmd: &[String]) -> Option<Problem> {
    match cmd.first() {
        None => Some(Problem::EmptyCommand),
        Some(p) if p.is_empty() => Some(Problem::EmptyProgram),
        Some(_) => None,
    }
}

/// A path a task names (inputs, outputs, cwd, a WASM module) stays inside its job folder:
/// relative, with no `..` component and no NUL byte. Checked at submit, so a task that would
/// escape its sandbox never runs.
fn check_inside(path: &str) -> Option<Problem> {
    let bad = |reason: &str| {
        Some(Problem::BadValue {
            value: format!("{path:?}"),
            reason: reason.into(),
        })
    };
    if path.is_empty() {
        return bad("paths must be non-empty");
    }
    if path.contains('\0') {
        return bad("a path has no NUL byte");
    }
    if path.starts_with('/') {
        return bad("paths are relative to the job folder (no absolute paths)");
    }
    if path.split('/').any(|c| c == "..") {
        return bad("paths stay inside the job folder (no '..')");
    }
    None
}

fn has_index(s: &str) -> bool {
    crate::job::has_index_placeholder(s)
}

/// The first field of a non-array task that uses `{i}`: (variant index, field).
fn index_use(task: &TaskSpec) -> Option<(Option<usize>, &'static str)> {
    let any = |v: &[String]| v.iter().any(|s| has_index(s));
    let env = |e: &BTreeMap<String, String>| e.values().any(|s| has_index(s));
    match &task.body {
        TaskBody::Command(cmd) if any(cmd) => return Some((None, "cmd")),
        TaskBody::Wasm(w) if any(&w.args) => return Some((None, "wasm")),
        TaskBody::Variants(vs) => {
            for (i, v) in vs.iter().enumerate() {
                if any(&v.cmd) {
                    return Some((Some(i), "cmd"));
                }
                if env(&v.env) {
                    return Some((Some(i), "env"));
                }
            }
        }
        _ => {}
    }
    if env(&task.env) {
        return Some((None, "env"));
    }
    if any(&task.inputs) {
        return Some((None, "inputs"));
    }
    if any(&task.outputs) {
        return Some((None, "outputs"));
    }
    if any(&task.checkpoint) {
        return Some((None, "checkpoint"));
    }
    if task.cwd.as_deref().is_some_and(has_index) {
        return Some((None, "cwd"));
    }
    None
}

pub(crate) fn validate(spec: &JobSpec) -> Result<()> {
    let loc = Locator {
        source: spec.source.as_ref(),
    };
    if spec.name.is_empty()
        || spec
            .name
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\')
    {
        let p = Problem::BadValue {
            value: format!("{:?}", spec.name),
            reason: "a job name must be non-empty, without '/', '\\' or control characters".into(),
        };
        return Err(loc.top(JobError::new(p).field("name"), "name").into());
    }
    if let Some(p) = check_resources(&spec.defaults.resources) {
        let f = "defaults.resources";
        return Err(loc.top(JobError::new(p).field(f), f).into());
    }
    if let Some(p) = check_env(&spec.defaults.env) {
        let f = "defaults.env";
        return Err(loc.top(JobError::new(p).field(f), f).into());
    }
    if let Some(pool) = &spec.pool {
        use crate::pool::{Trust, Verify};
        let compares = pool.trust == Trust::Any && pool.verify != Verify::Quorum(1);
        if compares && spec.staging != crate::job::Staging::Transfer {
            let p = Problem::BadValue {
                value: pool.verify.to_toml(),
                reason: "verifying results compares each replica's outputs, which needs \
                         staging = \"transfer\" (or verify = 1, or trust = \"trusted-only\")"
                    .into(),
            };
            let f = "pool.verify";
            return Err(loc.top(JobError::new(p).field(f), f).into());
        }
    }

    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(spec.tasks.len());
    let mut total: u128 = 0;
    for (t, task) in spec.tasks.iter().enumerate() {
        check_task(spec, &loc, t, task, &mut ids, &mut total)?;
    }
    let preds = resolve_dependencies(spec, &loc, &ids)?;
    if let Some(cycle) = find_cycle(preds.len(), |t| preds[t].iter().copied()) {
        // The cycle starts and ends at the task that comes first in the file; the error
        // points at that task's `after` entry naming its predecessor on the cycle.
        let first = cycle[0];
        let pred = cycle[cycle.len() - 2];
        let task = &spec.tasks[first];
        let k = task
            .after
            .iter()
            .position(|d| d.task == spec.tasks[pred].id)
            .unwrap_or(0);
        let path = cycle.iter().map(|&i| spec.tasks[i].id.clone()).collect();
        let e = JobError::new(Problem::Cycle { path })
            .task(&task.id)
            .field("after");
        return Err(loc.after(e, first, k).into());
    }
    Ok(())
}

fn check_task<'a>(
    spec: &JobSpec,
    loc: &Locator<'_>,
    t: usize,
    task: &'a TaskSpec,
    ids: &mut HashMap<&'a str, usize>,
    total: &mut u128,
) -> Result<()> {
    let fail = |p: Problem, field: &str| -> crate::error::CoreError {
        loc.task(JobError::new(p).task(&task.id).field(field), t, field)
            .into()
    };
    let fail_variant = |p: Problem, v: usize, name: &str, field: &str| {
        let e = JobError::new(p).task(&task.id).variant(name).field(field);
        crate::error::CoreError::from(loc.variant(e, t, v, field))
    };
    if !is_valid_name(&task.id) {
        return Err(fail(Problem::BadName(task.id.clone()), "id"));
    }
    if let Some(&first) = ids.get(task.id.as_str()) {
        let first_line = spec.source.as_ref().and_then(|s| s.task_line(first));
        let p = Problem::DuplicateTask {
            id: task.id.clone(),
            first_line,
        };
        return Err(fail(p, "id"));
    }
    ids.insert(&task.id, t);
    if let Some(r) = &task.array {
        if r.start >= r.end {
            let reason = if r.start == r.end {
                "it is empty"
            } else {
                "the end is before the start"
            };
            let p = Problem::BadRange {
                text: format!("{}..{}", r.start, r.end),
                reason: reason.into(),
            };
            return Err(fail(p, "array"));
        }
    }
    let count = u128::from(task.instance_count());
    *total += count;
    if count > u128::from(MAX_INSTANCES) || *total > u128::from(MAX_INSTANCES) {
        let p = Problem::TooManyInstances {
            count: if count > u128::from(MAX_INSTANCES) {
                count
            } else {
                *total
            },
            max: MAX_INSTANCES,
        };
        return Err(fail(p, "array"));
    }
    match &task.body {
        TaskBody::Command(cmd) => {
            if let Some(p) = check_command(cmd) {
                return Err(fail(p, "cmd"));
            }
        }
        TaskBody::Wasm(w) => {
            if w.module.is_empty() {
                let p = Problem::BadValue {
                    value: "an empty module path".into(),
                    reason: "name the .wasm file".into(),
                };
                return Err(fail(p, "wasm"));
            }
            if let Some(p) = check_inside(&w.module) {
                return Err(fail(p, "wasm"));
            }
            if w.entry.is_empty() {
                let p = Problem::BadValue {
                    value: "an empty entry".into(),
                    reason: "name an exported function, or leave it out for _start".into(),
                };
                return Err(fail(p, "wasm"));
            }
            if w.fuel.is_some_and(|f| i64::try_from(f).is_err()) {
                let p = Problem::BadValue {
                    value: format!("fuel {}", w.fuel.unwrap_or_default()),
                    reason: format!("fuel is at most {}", i64::MAX),
                };
                return Err(fail(p, "wasm"));
            }
        }
        TaskBody::Variants(vs) => {
            if vs.is_empty() {
                return Err(fail(Problem::NoVariants, "variant"));
            }
            let mut names = HashMap::new();
            for (i, v) in vs.iter().enumerate() {
                if !is_valid_name(&v.name) {
                    return Err(fail_variant(
                        Problem::BadName(v.name.clone()),
                        i,
                        &v.name,
                        "name",
                    ));
                }
                if names.insert(v.name.as_str(), i).is_some() {
                    let p = Problem::DuplicateVariant(v.name.clone());
                    return Err(fail_variant(p, i, &v.name, "name"));
                }
                if let Some(p) = check_command(&v.cmd) {
                    return Err(fail_variant(p, i, &v.name, "cmd"));
                }
                if let Some(p) = check_resources(&v.resources) {
                    return Err(fail_variant(p, i, &v.name, "resources"));
                }
                if let Some(p) = check_env(&v.env) {
                    return Err(fail_variant(p, i, &v.name, "env"));
                }
            }
        }
    }
    if let Some(p) = check_resources(&task.resources) {
        return Err(fail(p, "resources"));
    }
    if let Some(p) = check_env(&task.env) {
        return Err(fail(p, "env"));
    }
    for (field, list) in [
        ("inputs", &task.inputs),
        ("outputs", &task.outputs),
        ("checkpoint", &task.checkpoint),
    ] {
        if let Some(p) = list.iter().find_map(|x| check_inside(x)) {
            return Err(fail(p, field));
        }
    }
    if task.cwd.as_deref() == Some("") {
        let p = Problem::BadValue {
            value: "an empty path".into(),
            reason: "leave cwd out to run in the job's folder".into(),
        };
        return Err(fail(p, "cwd"));
    }
    if let Some(p) = task.cwd.as_deref().and_then(check_inside) {
        return Err(fail(p, "cwd"));
    }
    if let Some(g) = task.group {
        if g.size == 0 {
            return Err(fail(Problem::ZeroGroupSize, "group"));
        }
        let count = task.instance_count();
        if !count.is_multiple_of(u64::from(g.size)) {
            let p = Problem::GroupSize {
                size: g.size,
                count,
            };
            return Err(fail(p, "group"));
        }
    }
    if task.indices().is_none() {
        if let Some((variant, field)) = index_use(task) {
            return Err(match (variant, &task.body) {
                (Some(i), TaskBody::Variants(vs)) => {
                    fail_variant(Problem::IndexOutsideArray, i, &vs[i].name, field)
                }
                _ => fail(Problem::IndexOutsideArray, field),
            });
        }
    }
    Ok(())
}

/// Resolves every `after` entry; returns each task's predecessor tasks (deduplicated).
fn resolve_dependencies(
    spec: &JobSpec,
    loc: &Locator<'_>,
    ids: &HashMap<&str, usize>,
) -> Result<Vec<Vec<usize>>> {
    let mut preds = Vec::with_capacity(spec.tasks.len());
    let mut edges: u128 = 0;
    for (t, task) in spec.tasks.iter().enumerate() {
        let fail = |p: Problem, k: usize| -> crate::error::CoreError {
            let e = JobError::new(p).task(&task.id).field("after");
            loc.after(e, t, k).into()
        };
        let mut mine = Vec::with_capacity(task.after.len());
        for (k, dep) in task.after.iter().enumerate() {
            let Some(&target) = ids.get(dep.task.as_str()) else {
                return Err(fail(Problem::NoSuchTask(dep.task.clone()), k));
            };
            if target == t {
                return Err(fail(Problem::SelfDependency, k));
            }
            let other = &spec.tasks[target];
            let per_instance = match (dep.index, other.indices()) {
                (None, _) => other.instance_count(),
                (Some(_), None) => {
                    let p = Problem::NotAnArray {
                        dep: dep.to_string(),
                        task: other.id.clone(),
                    };
                    return Err(fail(p, k));
                }
                (Some(i), Some(r)) if !r.contains(&i) => {
                    let p = Problem::IndexOutOfRange {
                        dep: dep.to_string(),
                        task: other.id.clone(),
                        start: r.start,
                        end: r.end,
                    };
                    return Err(fail(p, k));
                }
                (Some(_), Some(_)) => 1,
            };
            edges += u128::from(task.instance_count()) * u128::from(per_instance);
            if edges > u128::from(MAX_EDGES) {
                let p = Problem::TooManyEdges {
                    count: edges,
                    max: MAX_EDGES,
                };
                return Err(fail(p, k));
            }
            mine.push(target);
        }
        mine.sort_unstable();
        mine.dedup();
        preds.push(mine);
    }
    Ok(preds)
}

/// Finds a cycle in a graph given by predecessor lists. Returns it in execution order
/// (`a -> b`: `b` runs after `a`), starting and ending at its smallest node. Iterative
/// depth-first search, linear in nodes plus edges.
pub(crate) fn find_cycle<I>(n: usize, preds: impl Fn(usize) -> I) -> Option<Vec<usize>>
where
    I: Iterator<Item = usize>,
{
    const WHITE: u8 = 0;
    const GRAY: u8 = 1;
    const BLACK: u8 = 2;
    let mut color = vec![WHITE; n];
    let mut stack: Vec<(usize, I)> = Vec::new();
    for root in 0..n {
        if color[root] != WHITE {
            continue;
        }
        color[root] = GRAY;
        stack.push((root, preds(root)));
        while let Some((node, iter)) = stack.last_mut() {
            let node = *node;
            match iter.next() {
                Some(p) if color[p] == WHITE => {
                    color[p] = GRAY;
                    stack.push((p, preds(p)));
                }
                Some(p) if color[p] == GRAY => {
                    // Stack from p to node is a chain of "runs after" links: each entry
                    // depends on the next, and node depends on p.
                    let from = stack
                        .iter()
                        .position(|(x, _)| *x == p)
                        .expect("a gray node is on the stack");
                    let mut cycle: Vec<usize> =
                        stack[from..].iter().map(|(x, _)| *x).rev().collect();
                    let min = cycle
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, &x)| x)
                        .map_or(0, |(i, _)| i);
                    cycle.rotate_left(min);
                    cycle.push(cycle[0]);
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    color[node] = BLACK;
                    stack.pop();
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_allow_letters_digits_dash_underscore() {
        assert!(is_valid_name("tile-2_b"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("a b"));
        assert!(!is_valid_name("a[1]"));
        assert!(!is_valid_name("é"));
    }

    #[test]
    fn find_cycle_reports_a_real_cycle_in_execution_order() {
        // 0 <- 1 <- 2 <- 0 (each after the previous) plus a tail 3 after 2.
        let preds: Vec<Vec<usize>> = vec![vec![2], vec![0], vec![1], vec![2]];
        let c = find_cycle(4, |i| preds[i].iter().copied()).unwrap();
        assert_eq!(c, vec![0, 1, 2, 0]);
        for w in c.windows(2) {
            assert!(
                preds[w[1]].contains(&w[0]),
                "{} must run after {}",
                w[1],
                w[0]
            );
        }
        let dag: Vec<Vec<usize>> = vec![vec![], vec![0], vec![0, 1], vec![2]];
        assert_eq!(find_cycle(4, |i| dag[i].iter().copied()), None);
    }
}
