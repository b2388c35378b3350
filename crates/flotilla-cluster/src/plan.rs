//! A job file checked as a submission checks it, with nothing started: what
//! `flotilla run --dry-run` and `flotilla submit --dry-run` print.
//!
//! [`plan_file`] reads, validates and expands the file, reads the inputs a transfer job would
//! upload, and applies the coordinator's input checks ([`input_problems`]): what a submission
//! would refuse is an error here too. What only running would find is reported as warnings:
//! in shared staging an input that is neither in the job folder nor any task's output (the
//! task would fail when it runs) or that is made by a task that does not run before it (a
//! race), and, in either staging, an input pattern that matches nothing at all.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use flotilla_core::{Staging, TaskGraph, TaskId, TaskKind};
use serde::Serialize;

use crate::client::is_glob;
use crate::error::{ClusterError, Result};

/// At most this many warnings are listed; the rest are counted.
pub const MAX_WARNINGS: usize = 20;

/// What a dry run found.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The job's name.
    pub name: String,
    /// The job file, as given.
    pub file: String,
    /// `shared` or `transfer`.
    pub staging: Staging,
    /// Task instances (an array of 100 counts 100).
    pub tasks: u64,
    /// Dependencies between instances.
    pub dependencies: usize,
    /// The longest chain of instances, each after the one before.
    pub longest_chain: usize,
    /// Transfer staging: files of the job folder that would be uploaded, and their bytes.
    pub uploads: usize,
    /// Their total size in bytes.
    pub upload_bytes: u64,
    /// Each `[[task]]`, in file order.
    pub task_tables: Vec<PlanTask>,
    /// What only running would find (at most [`MAX_WARNINGS`]).
    pub warnings: Vec<String>,
    /// Warnings beyond those listed.
    pub more_warnings: usize,
}

/// One `[[task]]` of a [`Plan`].
#[derive(Debug, Clone, Serialize)]
pub struct PlanTask {
    /// Its id.
    pub id: String,
    /// Its instances.
    pub instances: u64,
    /// What it runs as the file writes it (`{i}` kept): the command, `wasm MODULE`, or its
    /// variants.
    pub runs: String,
    /// What its first instance needs (defaults applied), or each variant's.
    pub resources: String,
    /// The ids of the tasks it runs after.
    pub after: Vec<String>,
}

/// Checks the job file at `path` as a submission would and says what would run.
pub fn plan_file(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).map_err(|e| ClusterError::io(path, e))?;
    let abs = std::fs::canonicalize(path).map_err(|e| ClusterError::io(path, e))?;
    let dir = abs.parent().unwrap_or(Path::new("/")).to_path_buf();
    let file = path.display().to_string();
    let spec = flotilla_core::parse_job(&text, &file)?;
    check_job_dir(&dir.display().to_string()).map_err(ClusterError::Config)?;
    spec.validate()?;
    let graph = spec.expand()?;
    let (uploads, upload_bytes, present): (usize, u64, HashSet<String>) =
        if spec.staging == Staging::Transfer {
            let files = crate::client::uploads(&graph, &dir)?;
            let bytes = files.iter().map(|f| f.data.len() as u64).sum();
            (
                files.len(),
                bytes,
                files.into_iter().map(|f| f.path).collect(),
            )
        } else {
            let present = graph
                .tasks()
                .iter()
                .flat_map(|t| t.inputs.iter())
                .filter(|p| !is_glob(p) && dir.join(p).exists())
                .cloned()
                .collect();
            (0, 0, present)
        };
    let present_refs: HashSet<&str> = present.iter().map(String::as_str).collect();
    let pattern_matches_a_file = |p: &str| {
        glob::glob(&dir.join(p).to_string_lossy())
            .map(|mut m| m.any(|f| f.is_ok_and(|f| f.is_file())))
            .unwrap_or(false)
    };
    let mut problems = input_problems(&graph, &present_refs, &pattern_matches_a_file);
    let mut warnings = flotilla_core::lint::placeholder_warnings(&spec);
    for p in problems.drain(..) {
        if p.refused_in(spec.staging) {
            return Err(ClusterError::Config(format!("{file}: {p}")));
        }
        warnings.push(p.to_string());
    }
    let more_warnings = warnings.len().saturating_sub(MAX_WARNINGS);
    warnings.truncate(MAX_WARNINGS);
    // `flotilla run` takes it, a coordinator with its default limit would not.
    let tasks = graph.tasks().len() as u64;
    if tasks > crate::server::DEFAULT_MAX_JOB_TASKS {
        warnings.insert(
            0,
            format!(
                "the job expands to {tasks} tasks: `flotilla run` takes it, but a coordinator \
                 refuses more than {} by default (`flotilla server --max-job-tasks`)",
                crate::server::DEFAULT_MAX_JOB_TASKS
            ),
        );
    }
    let task_tables = spec
        .tasks
        .iter()
        .map(|t| {
            let first = graph
                .instances_of(&t.id)
                .and_then(|i| i.first())
                .or_else(|| graph.tasks().iter().find(|i| i.base == t.id));
            // What runs as the file writes it (`{i}` kept); what it needs with the
            // defaults applied, from its first instance.
            let (runs, resources) = match first.map(|i| (&i.kind, i)) {
                Some((TaskKind::Command { cmd, .. }, i)) => match &t.body {
                    flotilla_core::TaskBody::Command(template) => {
                        (template.join(" "), i.resources.to_string())
                    }
                    _ => (cmd.join(" "), i.resources.to_string()),
                },
                Some((TaskKind::Wasm(w), i)) => {
                    (format!("wasm {}", w.module), i.resources.to_string())
                }
                Some((TaskKind::Variants(vs), _)) => (
                    format!(
                        "variants {}",
                        vs.iter()
                            .map(|v| v.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    vs.iter()
                        .map(|v| format!("{}: {}", v.name, v.resources))
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                None => (String::new(), String::new()),
            };
            let mut after: Vec<String> = t.after.iter().map(|d| d.task.clone()).collect();
            after.dedup();
            PlanTask {
                id: t.id.clone(),
                instances: t.instance_count(),
                runs,
                resources,
                after,
            }
        })
        .collect();
    let (_, chain) = graph.critical_path(|_| 1.0);
    Ok(Plan {
        name: spec.name.clone(),
        file,
        staging: spec.staging,
        tasks: graph.len() as u64,
        dependencies: graph.edge_count(),
        longest_chain: chain.len(),
        uploads,
        upload_bytes,
        task_tables,
        warnings,
        more_warnings,
    })
}

/// A job folder is where a job's tasks read and write (in shared staging, a WASM task's
/// writable preopen), so it must name a job's own folder: absolute, normalised (no `.` or
/// `..`), and neither the root, a system folder, nor a folder of the whole machine.
pub fn check_job_dir(dir: &str) -> std::result::Result<(), String> {
    let path = Path::new(dir);
    let refuse = |why: &str| Err(format!("job folder {dir:?} refused: {why}"));
    if !path.is_absolute() {
        return refuse("it must be an absolute path");
    }
    if dir.split('/').any(|c| c == "." || c == "..") || dir.contains("//") {
        return refuse("it must be normalised (no '.', '..' or '//')");
    }
    const WHOLE: &[&str] = &[
        "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media",
        "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
    ];
    const SYSTEM: &[&str] = &[
        "/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/sbin", "/sys", "/usr",
    ];
    let trimmed = if dir.len() > 1 {
        dir.trim_end_matches('/')
    } else {
        dir
    };
    if WHOLE.contains(&trimmed) {
        return refuse(
            "a task would get a folder of the whole machine (put the job file in a folder of \
             its own)",
        );
    }
    if SYSTEM.iter().any(|s| path.starts_with(s)) {
        return refuse("it is inside a system folder (put the job file in a folder of its own)");
    }
    Ok(())
}

/// Something wrong with a task's declared inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum InputProblem {
    /// An input (or a pattern input's match) that is an output of a task that does not run
    /// before the one reading it.
    MadeLater {
        /// The task instance reading it.
        task: String,
        /// The input as declared.
        input: String,
        /// For a pattern: the output it matched.
        matched: Option<String>,
        /// The instance making it.
        producer: String,
    },
    /// A plain input neither present (uploaded, or in the job folder) nor any task's output.
    Nowhere {
        /// The task instance reading it.
        task: String,
        /// The input.
        input: String,
    },
    /// A pattern input matching no file of the job folder and no task's output.
    MatchesNothing {
        /// The task instance reading it.
        task: String,
        /// The pattern.
        pattern: String,
    },
}

impl InputProblem {
    /// Whether a submission in `staging` is refused for it (else it is a dry run's warning).
    pub fn refused_in(&self, staging: Staging) -> bool {
        staging == Staging::Transfer && !matches!(self, InputProblem::MatchesNothing { .. })
    }
}

impl std::fmt::Display for InputProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputProblem::MadeLater {
                task,
                input,
                matched: Some(output),
                producer,
            } => write!(
                f,
                "task {task:?}: input pattern {input:?} matches {output:?}, an output of task \
                 {producer:?}, which does not run before it: add it to `after` (only outputs \
                 of tasks it runs after are staged for it)"
            ),
            InputProblem::MadeLater {
                task,
                input,
                matched: None,
                producer,
            } => write!(
                f,
                "task {task:?}: input {input:?} is an output of task {producer:?}, which does \
                 not run before it: add it to `after`"
            ),
            InputProblem::Nowhere { task, input } => write!(
                f,
                "task {task:?}: input {input:?} is neither in the job folder nor an output of \
                 any task"
            ),
            InputProblem::MatchesNothing { task, pattern } => write!(
                f,
                "task {task:?}: input pattern {pattern:?} matches no file of the job folder \
                 and no task's output"
            ),
        }
    }
}

/// Every task's declared inputs against what is `present` (transfer staging: the uploaded
/// files; shared: the plain inputs found in the job folder) and the tasks' outputs: a plain
/// input must be present or an output of an ancestor; a pattern must not match an output of
/// a task that does not run before it (its `*` stays within a folder, as staging matches),
/// and, when `pattern_matches_a_file` says no file matches it and no output can, it matches
/// nothing. Each input is reported once (its first instance), in task order.
pub fn input_problems(
    graph: &TaskGraph,
    present: &HashSet<&str>,
    pattern_matches_a_file: &dyn Fn(&str) -> bool,
) -> Vec<InputProblem> {
    let mut producers: HashMap<&str, TaskId> = HashMap::new();
    let mut pattern_outputs = false;
    for t in graph.tasks() {
        for o in &t.outputs {
            pattern_outputs |= is_glob(o);
            producers.insert(o.as_str(), t.id);
        }
    }
    let ancestors_of = |t: TaskId| {
        let mut seen = HashSet::new();
        let mut stack = vec![t];
        while let Some(x) = stack.pop() {
            for &q in graph.preds(x) {
                if seen.insert(q) {
                    stack.push(q);
                }
            }
        }
        seen
    };
    // Exact outputs in order, so a pattern is compared with those sharing its literal prefix.
    let sorted: BTreeMap<&str, TaskId> = producers
        .iter()
        .filter(|(o, _)| !is_glob(o))
        .map(|(o, t)| (*o, *t))
        .collect();
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    let mut reported: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    for t in graph.tasks() {
        // Its ancestors, gathered once when a check needs them: a reducer over the outputs
        // of a large array checks each against a set, not a list or a walk.
        let mut ancestors: Option<HashSet<TaskId>> = None;
        for input in &t.inputs {
            if reported.contains(input.as_str()) {
                continue;
            }
            if is_glob(input) {
                let Ok(pattern) = glob::Pattern::new(input) else {
                    continue;
                };
                let prefix = &input[..input.find(['*', '?', '[']).unwrap_or(input.len())];
                let mut any_output = false;
                let unordered = sorted
                    .range(prefix..)
                    .take_while(|(o, _)| o.starts_with(prefix))
                    .filter(|(o, &p)| p != t.id && pattern.matches_with(o, opts))
                    .find(|(_, &p)| {
                        any_output = true;
                        !ancestors
                            .get_or_insert_with(|| ancestors_of(t.id))
                            .contains(&p)
                    });
                if let Some((output, &p)) = unordered {
                    reported.insert(input);
                    out.push(InputProblem::MadeLater {
                        task: t.name.clone(),
                        input: input.clone(),
                        matched: Some(output.to_string()),
                        producer: graph.task(p).name.clone(),
                    });
                } else if !any_output && !pattern_outputs && !pattern_matches_a_file(input) {
                    reported.insert(input);
                    out.push(InputProblem::MatchesNothing {
                        task: t.name.clone(),
                        pattern: input.clone(),
                    });
                }
                continue;
            }
            if present.contains(input.as_str()) {
                continue;
            }
            match producers.get(input.as_str()) {
                Some(&p)
                    if graph.preds(t.id).contains(&p)
                        || ancestors
                            .get_or_insert_with(|| ancestors_of(t.id))
                            .contains(&p) => {}
                Some(&p) => {
                    reported.insert(input);
                    out.push(InputProblem::MadeLater {
                        task: t.name.clone(),
                        input: input.clone(),
                        matched: None,
                        producer: graph.task(p).name.clone(),
                    });
                }
                None => {
                    reported.insert(input);
                    out.push(InputProblem::Nowhere {
                        task: t.name.clone(),
                        input: input.clone(),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(toml: &str) -> TaskGraph {
        flotilla_core::parse_job(toml, "job.toml")
            .and_then(|s| s.expand())
            .expect("a valid job")
    }

    const CHAIN: &str = r#"
[[task]]
id = "a"
cmd = ["x"]
inputs = ["seed"]
outputs = ["a.out"]
[[task]]
id = "b"
cmd = ["x"]
after = ["a"]
outputs = ["b.out"]
[[task]]
id = "c"
cmd = ["x"]
after = ["b"]
inputs = ["a.out", "b.out", "*.csv"]
"#;

    #[test]
    fn inputs_come_from_the_folder_or_an_ancestor() {
        let seed: HashSet<&str> = ["seed"].into();
        let some_csv = |p: &str| p == "*.csv";
        assert_eq!(input_problems(&graph(CHAIN), &seed, &some_csv), vec![]);
        // Nothing in the folder: "seed" is nowhere, "*.csv" matches nothing.
        assert_eq!(
            input_problems(&graph(CHAIN), &HashSet::new(), &|_| false),
            vec![
                InputProblem::Nowhere {
                    task: "a".into(),
                    input: "seed".into()
                },
                InputProblem::MatchesNothing {
                    task: "c".into(),
                    pattern: "*.csv".into()
                }
            ]
        );
        // Without `after = ["b"]`, "a.out" is made by a task that may run after "c".
        let unordered = CHAIN.replace("after = [\"b\"]", "");
        let found = input_problems(&graph(&unordered), &seed, &some_csv);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            found[0].to_string(),
            "task \"c\": input \"a.out\" is an output of task \"a\", which does not run before \
             it: add it to `after`"
        );
        // Refused in transfer staging; a warning in shared staging.
        assert!(found[0].refused_in(Staging::Transfer));
        assert!(!found[0].refused_in(Staging::Shared));
    }

    #[test]
    fn a_pattern_matching_nothing_is_only_a_warning_and_not_when_outputs_are_patterns() {
        let found = input_problems(&graph(CHAIN), &["seed"].into(), &|_| false);
        assert_eq!(found.len(), 1);
        assert!(!found[0].refused_in(Staging::Transfer));
        // An output that is itself a pattern could make a match: nothing is said.
        let with_pattern_output = CHAIN.replace("outputs = [\"b.out\"]", "outputs = [\"b/*.out\"]");
        let found = input_problems(&graph(&with_pattern_output), &["seed"].into(), &|_| false);
        assert!(
            found
                .iter()
                .all(|p| !matches!(p, InputProblem::MatchesNothing { .. })),
            "{found:?}"
        );
    }

    #[test]
    fn an_input_missing_from_every_instance_is_reported_once() {
        let job = r#"
[[task]]
id = "p"
array = "0..1000"
cmd = ["x"]
inputs = ["common.dat", "in/{i}.dat"]
"#;
        let found = input_problems(&graph(job), &HashSet::new(), &|_| false);
        // One for the shared file, one per instance's own file.
        assert_eq!(found.len(), 1001);
        assert_eq!(
            found[0],
            InputProblem::Nowhere {
                task: "p[0]".into(),
                input: "common.dat".into()
            }
        );
    }
}
