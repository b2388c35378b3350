//! Property tests over generated valid jobs: `to_toml` then `parse_job` gives an equal
//! spec that expands, and closing a cycle is reported with a real cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::Index;

use super::*;
use crate::error::Problem;
use crate::parse_job;

fn text() -> impl Strategy<Value = String> {
    // Anything but '{' (so "{i}" only appears where a test puts it), quotes and newlines
    // included, to exercise TOML escaping.
    prop_oneof!["[^{]{0,8}", "[a-z\"\\\\\n\t ]{0,6}"]
}

fn nonempty_text() -> impl Strategy<Value = String> {
    prop_oneof!["[^{]{1,8}", "[a-z./\"]{1,6}"]
}

/// A path inside the job folder: relative, no `..` component, no NUL.
fn path_text() -> impl Strategy<Value = String> {
    nonempty_text().prop_filter("a path inside the job folder", |p| {
        !p.starts_with('/') && !p.contains('\0') && !p.split('/').any(|c| c == "..")
    })
}

fn strings(min: usize, max: usize) -> impl Strategy<Value = Vec<String>> {
    vec(text(), min..=max)
}

fn paths() -> impl Strategy<Value = Vec<String>> {
    vec(path_text(), 0..3)
}

fn env() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map("[A-Za-z_][A-Za-z0-9_ .]{0,6}", text(), 0..3)
}

fn request() -> impl Strategy<Value = ResourceRequest> {
    (
        proptest::option::of(prop_oneof![0.0..64.0f64, (0u8..16).prop_map(f64::from)]),
        proptest::option::of(0.0..8.0f64),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        btree_map("x-[a-z0-9_]{0,5}", 0.0..100.0f64, 0..3),
    )
        .prop_map(|(cpus, gpus, mem, gpu_mem, custom)| ResourceRequest {
            cpus,
            gpus,
            mem,
            gpu_mem,
            custom,
        })
}

fn duration() -> impl Strategy<Value = Duration> {
    (0u64..10_000_000, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n))
}

fn command() -> impl Strategy<Value = Vec<String>> {
    (nonempty_text(), strings(0, 3)).prop_map(|(p, mut rest)| {
        rest.insert(0, p);
        rest
    })
}

fn wasm() -> impl Strategy<Value = WasmSpec> {
    (
        path_text(),
        "[a-z_]{1,6}",
        strings(0, 3),
        proptest::option::of(0..=i64::MAX as u64),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(module, entry, args, fuel, memory)| WasmSpec {
            module,
            entry,
            args,
            fuel,
            memory,
        })
}

fn variants() -> impl Strategy<Value = Vec<VariantSpec>> {
    vec((command(), request(), env()), 1..4).prop_map(|vs| {
        vs.into_iter()
            .enumerate()
            .map(|(i, (cmd, resources, env))| VariantSpec {
                name: format!("v{i}"),
                cmd,
                resources,
                env,
            })
            .collect()
    })
}

fn body() -> impl Strategy<Value = TaskBody> {
    prop_oneof![
        command().prop_map(TaskBody::Command),
        variants().prop_map(TaskBody::Variants),
        wasm().prop_map(TaskBody::Wasm),
    ]
}

/// A task without id and dependencies, plus the choices that make them.
#[derive(Debug, Clone)]
struct Seed {
    task: TaskSpec,
    deps: Vec<(Index, bool, Index)>,
    use_index: bool,
}

fn seed() -> impl Strategy<Value = Seed> {
    let shape = (
        proptest::option::of((0u64..20, 1u64..6)),
        body(),
        paths(),
        paths(),
        env(),
        proptest::option::of(path_text()),
        request(),
    );
    let knobs = (
        proptest::option::of(any::<u32>()),
        proptest::option::of(duration()),
        proptest::option::of(any::<i64>()),
        proptest::option::of(1u32..64),
        vec((any::<Index>(), any::<bool>(), any::<Index>()), 0..3),
        any::<bool>(),
        "[a-zA-Z0-9_-]{0,6}",
    );
    (shape, knobs).prop_map(
        |(
            (array, body, inputs, outputs, env, cwd, resources),
            (retries, timeout, priority, group, deps, use_index, id),
        )| {
            let mut task = TaskSpec::new(id, body);
            task.array = array.map(|(start, len)| start..start + len);
            task.inputs = inputs;
            task.outputs = outputs;
            task.env = env;
            task.cwd = cwd;
            task.resources = resources;
            task.retries = retries;
            task.timeout = timeout;
            task.priority = priority;
            // A gang size must divide an array's length.
            let len = task.instance_count();
            task.group = group.map(|size| Group {
                size: if task.array.is_none() || len.is_multiple_of(u64::from(size)) {
                    size
                } else {
                    1
                },
            });
            Seed {
                task,
                deps,
                use_index,
            }
        },
    )
}

/// Adds `{i}` to the fields of an array task.
fn use_index(task: &mut TaskSpec) {
    let add = |s: &mut String| s.push_str("-{i}");
    match &mut task.body {
        TaskBody::Command(cmd) => cmd.iter_mut().for_each(add),
        TaskBody::Variants(vs) => vs.iter_mut().for_each(|v| v.cmd.iter_mut().for_each(add)),
        TaskBody::Wasm(w) => w.args.iter_mut().for_each(add),
    }
    task.outputs.iter_mut().for_each(add);
    task.env.values_mut().for_each(add);
    if let Some(c) = &mut task.cwd {
        add(c);
    }
}

fn job() -> impl Strategy<Value = JobSpec> {
    let defaults = (
        any::<u32>(),
        proptest::option::of(duration()),
        request(),
        any::<i64>(),
        env(),
    )
        .prop_map(|(retries, timeout, resources, priority, env)| Defaults {
            retries,
            timeout,
            resources,
            priority,
            env,
        });
    (
        "[a-zA-Z0-9 ._-]{1,10}",
        prop_oneof![Just(Staging::Shared), Just(Staging::Transfer)],
        defaults,
        vec(seed(), 2..8),
    )
        .prop_map(|(name, staging, defaults, seeds)| {
            let mut tasks: Vec<TaskSpec> = Vec::new();
            for (k, seed) in seeds.into_iter().enumerate() {
                let mut task = seed.task;
                task.id = format!("{}{k}", task.id);
                if seed.use_index && task.array.is_some() {
                    use_index(&mut task);
                }
                if k > 0 {
                    for (target, whole, element) in seed.deps {
                        let other = &tasks[target.index(k)];
                        let index = match (&other.array, whole) {
                            (Some(r), false) => {
                                Some(r.start + element.index((r.end - r.start) as usize) as u64)
                            }
                            _ => None,
                        };
                        task.after.push(Dependency {
                            task: other.id.clone(),
                            index,
                        });
                    }
                }
                tasks.push(task);
            }
            JobSpec {
                name,
                staging,
                keep_going: false,
                defaults,
                tasks,
                pool: None,
                source: None,
            }
        })
}

/// Each task's predecessor tasks (by position), from its `after` entries.
fn task_preds(spec: &JobSpec) -> Vec<BTreeSet<usize>> {
    let pos: BTreeMap<&str, usize> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    spec.tasks
        .iter()
        .map(|t| t.after.iter().map(|d| pos[d.task.as_str()]).collect())
        .collect()
}

fn ancestors(preds: &[BTreeSet<usize>], of: usize) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<usize> = preds[of].iter().copied().collect();
    while let Some(v) = stack.pop() {
        if seen.insert(v) {
            stack.extend(preds[v].iter().copied());
        }
    }
    seen
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x10B5),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn generated_jobs_round_trip_through_toml_and_expand(spec in job()) {
        spec.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let text = spec.to_toml();
        let parsed = parse_job(&text, "gen.toml")
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&parsed, &spec, "{}", text);

        let g = parsed.expand().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want: u64 = spec.tasks.iter().map(TaskSpec::instance_count).sum();
        prop_assert_eq!(g.len() as u64, want);
        // Every instance depends on exactly the instances its task's `after` names.
        for inst in g.tasks() {
            let task = spec.task(&inst.base).expect("instance of a known task");
            let mut expected = BTreeSet::new();
            for d in &task.after {
                let other = g.instances_of(&d.task).expect("dependency expanded");
                for o in other {
                    if d.index.is_none() || d.index == o.index {
                        expected.insert(o.id);
                    }
                }
            }
            let got: BTreeSet<_> = g.preds(inst.id).iter().copied().collect();
            prop_assert_eq!(got, expected, "{}", inst.name);
            prop_assert_eq!(g.by_name(&inst.name), Some(inst.id));
            if let crate::TaskKind::Command { cmd, .. } = &inst.kind {
                // Generated text has no '{', so any placeholder was put there to be replaced.
                prop_assert!(cmd.iter().all(|s| !s.contains(INDEX_PLACEHOLDER)), "{:?}", cmd);
            }
        }
        prop_assert_eq!(g.topological_order().len(), g.len());
    }

    #[test]
    fn closing_a_cycle_is_reported_with_a_real_cycle(spec in job(), pick in any::<Index>()) {
        let mut spec = spec;
        let preds = task_preds(&spec);
        let mut pairs: Vec<(usize, usize)> = Vec::new();
        for j in 0..spec.tasks.len() {
            pairs.extend(ancestors(&preds, j).into_iter().map(|i| (i, j)));
        }
        if pairs.is_empty() {
            let first = spec.tasks[0].id.clone();
            spec.tasks[1].after.push(Dependency { task: first, index: None });
            pairs.push((0, 1));
        }
        // j runs after i (transitively); making i run after j closes a cycle.
        let (i, j) = *pick.get(&pairs);
        let target = spec.tasks[j].id.clone();
        spec.tasks[i].after.push(Dependency { task: target, index: None });
        let preds = task_preds(&spec);

        let text = spec.to_toml();
        for err in [spec.validate().unwrap_err(), parse_job(&text, "gen.toml").unwrap_err()] {
            let job_err = err.as_job().expect("a job error");
            let Problem::Cycle { path } = &job_err.problem else {
                return Err(TestCaseError::fail(format!("not a cycle error: {err}")));
            };
            prop_assert!(path.len() >= 3, "{}", err);
            prop_assert_eq!(path.first(), path.last());
            let pos = |id: &str| spec.tasks.iter().position(|t| t.id == id);
            for w in path.windows(2) {
                let (a, b) = (pos(&w[0]), pos(&w[1]));
                prop_assert!(a.is_some() && b.is_some(), "{}", err);
                let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
                prop_assert!(preds[b].contains(&a), "{} does not run after {}: {}", w[1], w[0], err);
            }
            prop_assert_eq!(job_err.task.as_deref(), Some(path[0].as_str()));
            prop_assert_eq!(job_err.field.as_deref(), Some("after"));
        }
    }
}
