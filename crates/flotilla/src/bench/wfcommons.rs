//! Real scientific workflow traces (WfCommons JSON, Pegasus runs) as Flotilla jobs: each
//! task becomes a scaled `sleep` that first checks its parents' markers exist, so a run
//! proves both the DAG's order and the scheduler's makespan against the lower bound
//! max(critical path, total work / cores).

use std::collections::HashMap;

use serde::Deserialize;

/// What went wrong reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Not WfCommons JSON.
    #[error("{file}: not a WfCommons trace: {message}")]
    Format {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Deserialize)]
struct Trace {
    workflow: Workflow,
}

#[derive(Deserialize)]
struct Workflow {
    tasks: Vec<Task>,
}

#[derive(Deserialize)]
struct Task {
    name: String,
    #[serde(default)]
    parents: Vec<String>,
    #[serde(default, rename = "runtimeInSeconds")]
    runtime_in_seconds: Option<f64>,
    #[serde(default)]
    runtime: Option<f64>,
}

/// A trace turned into a job.
#[derive(Clone, Debug)]
pub struct TraceJob {
    /// The job file's text.
    pub toml: String,
    /// Tasks.
    pub tasks: usize,
    /// The longest chain of (scaled) runtimes, seconds.
    pub critical_path: f64,
    /// The sum of (scaled) runtimes, seconds.
    pub total_work: f64,
    /// Each task's id in the job and its (scaled) runtime, seconds.
    pub runtimes: Vec<(String, f64)>,
}

impl TraceJob {
    /// The makespan no schedule on `cores` cores can beat.
    pub fn lower_bound(&self, cores: f64) -> f64 {
        self.critical_path.max(self.total_work / cores)
    }
}

/// Each trace task's (scaled) runtime, by the trace's name (its job's name) and the task's id:
/// what a simulated attempt of it takes.
pub struct TraceRuntimes(HashMap<String, HashMap<String, f64>>);

impl TraceRuntimes {
    /// From traces named as their jobs are.
    pub fn new(traces: &[(String, TraceJob)]) -> TraceRuntimes {
        TraceRuntimes(
            traces
                .iter()
                .map(|(name, tj)| (name.clone(), tj.runtimes.iter().cloned().collect()))
                .collect(),
        )
    }

    /// The runtime of task instance `task` (`"id"` or `"id[i]"`) of job `job`, seconds;
    /// one second for a task no trace names.
    pub fn of(&self, job: &str, task: &str) -> f64 {
        let base = task.split('[').next().unwrap_or(task);
        self.0
            .get(job)
            .and_then(|t| t.get(base))
            .copied()
            .unwrap_or(1.0)
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Converts a WfCommons trace to a job whose tasks sleep `scale × runtime` seconds (at
/// least `min_sleep`). Each task writes `done/<task>` after checking that every parent's
/// marker exists (exit code 3 otherwise).
pub fn job_from_trace(
    json: &str,
    file: &str,
    name: &str,
    scale: f64,
    min_sleep: f64,
) -> Result<TraceJob, TraceError> {
    let bad = |message: String| TraceError::Format {
        file: file.to_string(),
        message,
    };
    let trace: Trace = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let tasks = &trace.workflow.tasks;
    let index: HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let cost: Vec<f64> = tasks
        .iter()
        .map(|t| (t.runtime_in_seconds.or(t.runtime).unwrap_or(0.0) * scale).max(min_sleep))
        .collect();
    // Topological order for the critical path (and to refuse cycles).
    let n = tasks.len();
    let mut indeg = vec![0usize; n];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, t) in tasks.iter().enumerate() {
        for p in &t.parents {
            let Some(&pi) = index.get(p.as_str()) else {
                return Err(bad(format!("task {} names an unknown parent {p}", t.name)));
            };
            indeg[i] += 1;
            children[pi].push(i);
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut finish = vec![0.0f64; n];
    let mut seen = 0;
    while let Some(i) = ready.pop() {
        seen += 1;
        let start = tasks[i]
            .parents
            .iter()
            .filter_map(|p| index.get(p.as_str()))
            .map(|&p| finish[p])
            .fold(0.0, f64::max);
        finish[i] = start + cost[i];
        for &c in &children[i] {
            indeg[c] -= 1;
            if indeg[c] == 0 {
                ready.push(c);
            }
        }
    }
    if seen != n {
        return Err(bad("the task graph has a cycle".into()));
    }
    let mut toml = format!(
        "# {file} as scaled sleeps (scale {scale})\nname = \"{name}\"\n\n[defaults]\nretries = 1\ntimeout = \"10m\"\n"
    );
    for (i, t) in tasks.iter().enumerate() {
        let id = sanitize(&t.name);
        let checks: String = t
            .parents
            .iter()
            .map(|p| format!("test -f done/{} || exit 3; ", sanitize(p)))
            .collect();
        let script = format!(
            "{checks}sleep {:.3}; mkdir -p done; echo {id} > done/{id}",
            cost[i]
        );
        toml.push_str(&format!(
            "\n[[task]]\nid = \"{id}\"\ncmd = [\"sh\", \"-c\", {}]\noutputs = [\"done/{id}\"]\n",
            toml_str(&script)
        ));
        if !t.parents.is_empty() {
            let after: Vec<String> = t
                .parents
                .iter()
                .map(|p| format!("\"{}\"", sanitize(p)))
                .collect();
            toml.push_str(&format!("after = [{}]\n", after.join(", ")));
        }
    }
    Ok(TraceJob {
        runtimes: tasks
            .iter()
            .zip(&cost)
            .map(|(t, c)| (sanitize(&t.name), *c))
            .collect(),
        toml,
        tasks: n,
        critical_path: finish.iter().copied().fold(0.0, f64::max),
        total_work: cost.iter().sum(),
    })
}

fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A simulated worker named `name` (its host too) of hardware class `hw_class` offering
/// `cpus` CPUs, for the benchmarks in virtual time.
pub(crate) fn sim_worker(
    name: String,
    hw_class: &str,
    cpus: f64,
) -> flotilla_cluster::state::WorkerSpec {
    flotilla_cluster::state::WorkerSpec {
        hostname: name.clone(),
        name,
        hw_class: hw_class.into(),
        resources: flotilla_core::Resources {
            cpus,
            ..flotilla_core::Resources::zero()
        },
        data_addr: String::new(),
        ..flotilla_cluster::state::WorkerSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_trace_becomes_a_valid_job_with_its_bounds() {
        let json = r#"{"workflow": {"tasks": [
            {"name": "a", "parents": [], "runtimeInSeconds": 10},
            {"name": "b.1", "parents": ["a"], "runtimeInSeconds": 20},
            {"name": "c", "parents": ["a"], "runtime": 5},
            {"name": "d", "parents": ["b.1", "c"], "runtimeInSeconds": 1}]}}"#;
        let j = job_from_trace(json, "t.json", "t", 0.1, 0.0).unwrap();
        assert_eq!(j.tasks, 4);
        assert!((j.critical_path - 3.1).abs() < 1e-9);
        assert!((j.total_work - 3.6).abs() < 1e-9);
        let spec = flotilla_core::parse_job(&j.toml, "t.toml").unwrap();
        let g = spec.expand().unwrap();
        assert_eq!(g.len(), 4);
        let d = g.by_name("d").unwrap();
        assert_eq!(g.preds(d).len(), 2);
        assert!(j.toml.contains("test -f done/b_1 || exit 3"));
    }

    #[test]
    fn unknown_parents_and_cycles_are_refused() {
        let e = job_from_trace(
            r#"{"workflow": {"tasks": [{"name": "a", "parents": ["zz"]}]}}"#,
            "x.json",
            "x",
            1.0,
            0.0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.json") && e.contains("zz"), "{e}");
        let e = job_from_trace(
            r#"{"workflow": {"tasks": [{"name": "a", "parents": ["b"]}, {"name": "b", "parents": ["a"]}]}}"#,
            "y.json",
            "y",
            1.0,
            0.0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cycle"), "{e}");
    }
}
