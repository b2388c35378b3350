//! Tests of `parse_job`: the brief's example, and one test per kind of error, each checking
//! that the message names the file, the line and the field.

use std::time::Duration;

use crate::error::{JobError, Problem};
use crate::graph::TaskKind;
use crate::job::{JobSpec, Staging, TaskBody};
use crate::resources::Resources;
use crate::{parse_job, CoreError};

/// BRIEF.md §3, verbatim.
const MANDELBROT: &str = r#"name = "mandelbrot"          # default: the file's stem
staging = "shared"           # "shared": workers see the job folder; "transfer": declared files travel

[defaults]                   # for every task unless it overrides
retries = 2                  # attempts after the first
timeout = "5m"
resources = { cpus = 1 }

[[task]]
id = "tile"                  # unique in the job: letters, digits, '-', '_'
array = "0..64"              # optional: tile[0] .. tile[63]; "{i}" is replaced in cmd, env, inputs, outputs
cmd = ["./mandel", "--tile", "{i}", "--out", "tiles/{i}.pgm"]
outputs = ["tiles/{i}.pgm"]
resources = { cpus = 1, mem = "256MiB" }

[[task]]
id = "stitch"
after = ["tile"]             # all of the array; "tile[3]" for one element
cmd = ["./stitch", "tiles", "mandel.pgm"]
inputs = ["tiles/*.pgm"]
outputs = ["mandel.pgm"]
"#;

/// BRIEF.md §3's variant example, under a task header.
const VARIANTS: &str = r#"
[[task]]
id = "sim"
array = "0..8"

[[task.variant]]
name = "gpu"
cmd = ["./sim", "--cuda", "{i}"]
resources = { gpus = 1, cpus = 1 }
[[task.variant]]
name = "cpu"
cmd = ["./sim", "--threads", "2", "{i}"]
resources = { cpus = 2 }
"#;

fn job_error(text: &str) -> JobError {
    match parse_job(text, "job.toml") {
        Ok(spec) => panic!("expected an error, parsed {spec:?}"),
        Err(CoreError::Job(e)) => *e,
        Err(other) => panic!("expected a job error, got {other}"),
    }
}

/// Asserts the error is at `line`, names `task` and `field`, and says `fragment`.
#[track_caller]
fn check(
    text: &str,
    line: usize,
    task: Option<&str>,
    field: Option<&str>,
    fragment: &str,
) -> JobError {
    let e = job_error(text);
    let msg = e.to_string();
    assert_eq!(e.file.as_deref(), Some("job.toml"), "{msg}");
    assert_eq!(e.line(), Some(line), "{msg}");
    assert!(msg.starts_with(&format!("job.toml:{line}: ")), "{msg}");
    assert_eq!(e.task.as_deref(), task, "{msg}");
    assert_eq!(e.field.as_deref(), field, "{msg}");
    if let Some(field) = field {
        assert!(msg.contains(&format!("field {field:?}: ")), "{msg}");
    }
    assert!(
        msg.contains(fragment),
        "{msg:?} should contain {fragment:?}"
    );
    assert!(!msg.ends_with('.'), "{msg}");
    e
}

#[test]
fn the_briefs_mandelbrot_job_parses_and_expands() {
    let job = parse_job(MANDELBROT, "examples/mandelbrot/job.toml").unwrap();
    assert_eq!(job.name, "mandelbrot");
    assert_eq!(job.staging, Staging::Shared);
    assert_eq!(job.defaults.retries, 2);
    assert_eq!(job.defaults.timeout, Some(Duration::from_secs(300)));
    assert_eq!(job.defaults.resources.cpus, Some(1.0));
    assert_eq!(job.tasks.len(), 2);
    assert_eq!(job.tasks[0].array, Some(0..64));

    let g = job.expand().unwrap();
    assert_eq!(g.len(), 65);
    assert_eq!(g.edge_count(), 64);
    let stitch = g.by_name("stitch").unwrap();
    assert_eq!(stitch.index(), 64);
    let tiles: Vec<_> = (0..64)
        .map(|i| g.by_name(&format!("tile[{i}]")).unwrap())
        .collect();
    assert_eq!(g.preds(stitch), &tiles[..]);
    assert_eq!(g.roots().collect::<Vec<_>>(), tiles);
    for (i, &t) in tiles.iter().enumerate() {
        let inst = g.task(t);
        assert_eq!(inst.id.index(), i);
        assert_eq!(inst.name, format!("tile[{i}]"));
        assert_eq!(inst.index, Some(i as u64));
        assert_eq!(g.succs(t), &[stitch]);
        let TaskKind::Command { cmd, .. } = &inst.kind else {
            panic!("tile is a command")
        };
        assert_eq!(
            cmd,
            &[
                "./mandel",
                "--tile",
                &i.to_string(),
                "--out",
                &format!("tiles/{i}.pgm")
            ]
        );
        assert_eq!(inst.outputs, vec![format!("tiles/{i}.pgm")]);
        assert_eq!(inst.resources.mem, 256 << 20);
        assert_eq!(inst.resources.cpus, 1.0);
        assert_eq!(inst.retries, 2);
        assert_eq!(inst.timeout, Some(Duration::from_secs(300)));
    }
    let s = g.task(stitch);
    assert_eq!(s.inputs, vec!["tiles/*.pgm".to_string()]);
    assert_eq!(s.resources, Resources::default());
    assert_eq!(g.topological_order().last(), Some(&stitch));
    // Round trip.
    assert_eq!(parse_job(&job.to_toml(), "x.toml").unwrap(), job);
}

#[test]
fn the_briefs_variant_example_parses_and_merges_resources() {
    let job = parse_job(VARIANTS, "sim.toml").unwrap();
    assert_eq!(job.name, "sim");
    let TaskBody::Variants(vs) = &job.tasks[0].body else {
        panic!("variants expected")
    };
    assert_eq!(vs.len(), 2);
    let g = job.expand().unwrap();
    assert_eq!(g.len(), 8);
    let TaskKind::Variants(vi) = &g.task(g.by_name("sim[5]").unwrap()).kind else {
        panic!("variants expected")
    };
    assert_eq!(vi[0].name, "gpu");
    assert_eq!(vi[0].cmd, vec!["./sim", "--cuda", "5"]);
    assert_eq!(vi[0].resources.gpus, 1.0);
    assert_eq!(vi[1].cmd[3], "5");
    assert_eq!(vi[1].resources.cpus, 2.0);
    assert_eq!(parse_job(&job.to_toml(), "sim.toml").unwrap(), job);
}

#[test]
fn defaults_and_overrides_merge_per_key() {
    let text = r#"
staging = "transfer"
[defaults]
retries = 5
priority = 3
timeout = "1h30m"
resources = { cpus = 2, mem = "1GiB", license = 1 }
env = { A = "1", B = "2" }

[[task]]
id = "w"
wasm = { module = "score.wasm", args = ["--n", "{i}"], fuel = 1000, memory = "64MiB" }
array = "5..7"
env = { B = "x{i}" }
cwd = "runs/{i}"
resources = { mem = 512, gpu_mem = "2GiB", gpus = 0.5 }
retries = 0
timeout = "10s"
priority = -1
group = { size = 2 }

[[task]]
id = "plain"
wasm = "plain.wasm"
after = ["w[6]"]
"#;
    let job = parse_job(text, "j.toml").unwrap();
    assert_eq!(job.staging, Staging::Transfer);
    let g = job.expand().unwrap();
    let w6 = g.task(g.by_name("w[6]").unwrap());
    assert_eq!(w6.id.index(), 1);
    assert_eq!(w6.retries, 0);
    assert_eq!(w6.priority, -1);
    assert_eq!(w6.timeout, Some(Duration::from_secs(10)));
    assert_eq!(w6.group.map(|g| g.size), Some(2));
    assert_eq!(w6.resources.cpus, 2.0);
    assert_eq!(w6.resources.gpus, 0.5);
    assert_eq!(w6.resources.mem, 512);
    assert_eq!(w6.resources.gpu_mem, 2 << 30);
    assert_eq!(w6.resources.custom.get("license"), Some(&1.0));
    let TaskKind::Wasm(w) = &w6.kind else {
        panic!("wasm expected")
    };
    assert_eq!(w.module, "score.wasm");
    assert_eq!(w.entry, "_start");
    assert_eq!(w.args, vec!["--n", "6"]);
    assert_eq!(w.fuel, Some(1000));
    assert_eq!(w.memory, Some(64 << 20));
    assert_eq!(w.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(w.env.get("B").map(String::as_str), Some("x6"));
    assert_eq!(w.cwd.as_deref(), Some("runs/6"));

    let plain = g.task(g.by_name("plain").unwrap());
    assert_eq!(plain.retries, 5);
    assert_eq!(plain.priority, 3);
    assert_eq!(plain.timeout, Some(Duration::from_secs(5400)));
    assert_eq!(g.preds(plain.id), &[w6.id]);
    assert_eq!(g.by_name("w[5]").map(|t| t.index()), Some(0));
    assert_eq!(g.by_name("w[7]"), None);
    assert_eq!(g.by_name("w"), None);
    assert_eq!(g.instances_of("w").map(<[_]>::len), Some(2));
    assert_eq!(parse_job(&job.to_toml(), "j.toml").unwrap(), job);
}

#[test]
fn syntax_errors_name_the_line() {
    check(
        "name = \"x\"\n\n[[task]]\nid = \"a\"\ncmd = [\"x\"\n",
        5,
        None,
        Some("cmd"),
        "invalid array",
    );
    check(
        "[[task]\nid = \"a\"\n",
        1,
        None,
        None,
        "invalid table header",
    );
    let e = check(
        "name = \"a\"\nname = \"b\"\n",
        2,
        None,
        None,
        "duplicate key",
    );
    assert!(matches!(e.problem, Problem::Toml(_)));
}

#[test]
fn unknown_keys_are_rejected_with_key_and_line() {
    let e = check(
        "[[task]]\nid = \"a\"\ncmds = [\"x\"]\n",
        3,
        Some("a"),
        Some("cmds"),
        "unknown key",
    );
    assert!(
        e.to_string().contains("`cmd`"),
        "the message lists the keys: {e}"
    );
    // A typo is told the key it is nearest to; a word like none of them is not.
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nresource = { cpus = 2 }\n",
        4,
        Some("a"),
        Some("resource"),
        "unknown key (did you mean `resources`?), expected one of",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nzzz = 1\n",
        4,
        Some("a"),
        Some("zzz"),
        "unknown key, expected one of",
    );
    check("version = 1\n", 1, None, Some("version"), "unknown key");
    check(
        "[defaults]\nretry = 1\n",
        2,
        None,
        Some("defaults.retry"),
        "unknown key",
    );
    check(
        "[pool]\nbudgit = 3\n[[task]]\nid = \"a\"\ncmd = [\"x\"]\n",
        2,
        None,
        Some("pool.budgit"),
        "unknown key (did you mean `budget`?), expected one of `budget`",
    );
    // A table after the tasks is not part of the last task.
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n\n[defaults]\nretry = 1\n",
        6,
        None,
        Some("defaults.retry"),
        "unknown key",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n[[task]]\nid = \"b\"\ncmd = [\"x\"]\n\
         [task.env]\nX = \"1\"\n[task.oops]\nk = 1\n",
        9,
        Some("b"),
        Some("oops"),
        "unknown key",
    );
    check(
        "[[task]]\nid = \"a\"\n\n[[task.variant]]\nname = \"v\"\ncmd = [\"x\"]\nresource = {}\n",
        7,
        Some("a"),
        Some("resource"),
        "unknown key",
    );
    check(
        "[[task]]\nid = \"a\"\nwasm = { module = \"m.wasm\", fule = 3 }\n",
        3,
        Some("a"),
        Some("wasm.fule"),
        "unknown key (did you mean `fuel`?), expected one of `module`, `entry`, `args`, `fuel`, `memory`",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\ngroup = { size = 2, gang = 1 }\n",
        4,
        Some("a"),
        Some("group.gang"),
        "unknown key",
    );
}

#[test]
fn wrong_types_name_the_field() {
    check(
        "[[task]]\nid = \"a\"\ncmd = \"x\"\n",
        3,
        Some("a"),
        Some("cmd"),
        "expected an array of strings, found a string: write [\"x\"]",
    );
    // A command line in one string: its words, or a shell.
    check(
        "[[task]]\nid = \"a\"\ncmd = \"echo hi\"\n",
        3,
        Some("a"),
        Some("cmd"),
        "write [\"echo\", \"hi\"] (the program, then its arguments; it is not run through a shell), or [\"sh\", \"-c\", \"echo hi\"] for a shell line",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\noutputs = \"a.txt\"\n",
        4,
        Some("a"),
        Some("outputs"),
        "found a string: write [\"a.txt\"]",
    );
    // A table given as something else says how a table is written.
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nenv = \"X=1\"\n",
        4,
        Some("a"),
        Some("env"),
        "(a table is written in braces: env = { NAME = \"value\" })",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nresources = 4\n",
        4,
        Some("a"),
        Some("resources"),
        "(a table is written in braces: resources = { cpus = 2, mem = \"4GiB\" })",
    );
    check(
        "[[task]]\nid = 7\ncmd = [\"x\"]\n",
        2,
        None,
        Some("id"),
        "expected a string, found integer",
    );
    check("task = 5\n", 1, None, Some("task"), "invalid type");
    check(
        "staging = \"nfs\"\n",
        1,
        None,
        Some("staging"),
        "use \"shared\" or \"transfer\"",
    );
    check(
        "[defaults]\nretries = -1\n",
        2,
        None,
        Some("defaults.retries"),
        "-1 is not allowed",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nenv = { K = 1 }\n",
        4,
        Some("a"),
        Some("env.K"),
        "expected a string, found integer",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nresources = { cpus = \"many\" }\n",
        4,
        Some("a"),
        Some("resources.cpus"),
        "expected a number, found string",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nafter = [3]\n",
        4,
        Some("a"),
        Some("after"),
        "expected a string, found integer",
    );
}

#[test]
fn missing_id_and_variant_fields_are_reported() {
    check("[[task]]\ncmd = [\"x\"]\n", 1, None, Some("id"), "missing");
    check(
        "[[task]]\nid = \"a\"\n[[task.variant]]\ncmd = [\"x\"]\n",
        3,
        Some("a"),
        Some("variant.name"),
        "missing",
    );
    check(
        "[[task]]\nid = \"a\"\nwasm = { entry = \"main\" }\n",
        3,
        Some("a"),
        Some("wasm"),
        "needs `module`",
    );
}

#[test]
fn bad_durations_and_sizes_name_the_field() {
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\ntimeout = \"5 minutes\"\n",
        4,
        Some("a"),
        Some("timeout"),
        "invalid duration \"5 minutes\"",
    );
    check(
        "[defaults]\ntimeout = 30\n",
        2,
        None,
        Some("defaults.timeout"),
        "expected a duration",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nresources = { mem = \"lots\" }\n",
        4,
        Some("a"),
        Some("resources.mem"),
        "invalid size \"lots\"",
    );
}

#[test]
fn bad_ids_and_duplicate_ids_are_rejected() {
    check(
        "[[task]]\nid = \"a b\"\ncmd = [\"x\"]\n",
        2,
        Some("a b"),
        Some("id"),
        "invalid name",
    );
    let e = check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n\n[[task]]\nid = \"a\"\ncmd = [\"y\"]\n",
        6,
        Some("a"),
        Some("id"),
        "duplicate task id \"a\" (first defined on line 1)",
    );
    assert!(matches!(e.problem, Problem::DuplicateTask { .. }));
}

#[test]
fn bad_ranges_are_rejected() {
    let task = |range: &str| format!("[[task]]\nid = \"t\"\ncmd = [\"x\"]\narray = {range}\n");
    for (range, fragment) in [
        ("\"5..5\"", "it is empty"),
        ("\"10..5\"", "the end is before the start"),
        ("\"abc\"", "expected \"start..end\""),
        ("\"0..x\"", "non-negative integers"),
        ("\"-1..3\"", "non-negative integers"),
        ("\"0..99999999999999999999999\"", "too large"),
        ("-4", "negative"),
        ("1.5", "expected a range"),
        ("\"0..20000000\"", "more than the limit of 10000000"),
    ] {
        check(&task(range), 4, Some("t"), Some("array"), fragment);
    }
    // The limit also holds for the job as a whole.
    let two = "[[task]]\nid = \"a\"\narray = \"0..6000000\"\ncmd = [\"x\"]\n\
               [[task]]\nid = \"b\"\narray = \"0..6000000\"\ncmd = [\"x\"]\n";
    check(two, 7, Some("b"), Some("array"), "12000000 instances");
    // Plain integers and inclusive ranges are ranges too.
    let job = parse_job(&task("3"), "j.toml").unwrap();
    assert_eq!(job.tasks[0].array, Some(0..3));
    let job = parse_job(&task("\"2..=4\""), "j.toml").unwrap();
    assert_eq!(job.tasks[0].array, Some(2..5));
}

const AB: &str = "[[task]]\nid = \"a\"\narray = \"0..4\"\ncmd = [\"x\"]\n\n[[task]]\nid = \"b\"\ncmd = [\"y\"]\n";

#[test]
fn bad_dependencies_are_rejected() {
    let with = |after: &str| format!("{AB}after = [{after}]\n");
    check(
        &with("\"tiles\""),
        9,
        Some("b"),
        Some("after"),
        "no task named \"tiles\"",
    );
    check(
        &with("\"a[4]\""),
        9,
        Some("b"),
        Some("after"),
        "\"a[4]\" is out of range: \"a\" has indices 0..4",
    );
    check(
        &with("\"b\""),
        9,
        Some("b"),
        Some("after"),
        "cannot depend on itself",
    );
    check(
        &with("\"a[x]\""),
        9,
        Some("b"),
        Some("after"),
        "invalid dependency \"a[x]\"",
    );
    let e = job_error(&format!(
        "{AB}after = [\"a\"]\n\n[[task]]\nid = \"c\"\ncmd = [\"z\"]\nafter = [\"b[0]\"]\n"
    ));
    assert_eq!(e.line(), Some(14));
    assert_eq!(
        e.problem,
        Problem::NotAnArray {
            dep: "b[0]".into(),
            task: "b".into()
        }
    );
    // Each element of a multi-line list has its own line.
    check(
        &format!("{AB}after = [\n  \"a[1]\",\n  \"nope\",\n]\n"),
        11,
        Some("b"),
        Some("after"),
        "no task named \"nope\"",
    );
    // The example from the brief's error style.
    let e = job_error("[[task]]\nid = \"tile\"\ncmd = [\"x\"]\n\n[[task]]\nid = \"stitch\"\ncmd = [\"y\"]\nafter = [\"tiles\"]\n");
    assert_eq!(
        e.to_string(),
        r#"job.toml:8: task "stitch": field "after": no task named "tiles""#
    );
}

#[test]
fn cycles_are_reported_as_a_path() {
    let text = "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nafter = [\"c\"]\n\n\
                [[task]]\nid = \"b\"\ncmd = [\"x\"]\nafter = [\"a\"]\n\n\
                [[task]]\nid = \"c\"\ncmd = [\"x\"]\nafter = [\"b\"]\n";
    let e = check(
        text,
        4,
        Some("a"),
        Some("after"),
        "dependency cycle: a -> b -> c -> a",
    );
    assert_eq!(
        e.problem,
        Problem::Cycle {
            path: vec!["a".into(), "b".into(), "c".into(), "a".into()]
        }
    );
}

#[test]
fn a_task_needs_exactly_one_kind() {
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\nwasm = \"m.wasm\"\n",
        4,
        Some("a"),
        Some("wasm"),
        "exactly one of \"cmd\", \"variant\" and \"wasm\"; found cmd and wasm",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n[[task.variant]]\nname = \"v\"\ncmd = [\"y\"]\n",
        4,
        Some("a"),
        Some("variant"),
        "found cmd and variant",
    );
    check("\n[[task]]\nid = \"a\"\n", 2, Some("a"), None, "found none");
}

#[test]
fn empty_commands_are_rejected() {
    check(
        "[[task]]\nid = \"a\"\ncmd = []\n",
        3,
        Some("a"),
        Some("cmd"),
        "the command is empty",
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"\", \"x\"]\n",
        3,
        Some("a"),
        Some("cmd"),
        "program (first element) is empty",
    );
    let e = check(
        "[[task]]\nid = \"a\"\n[[task.variant]]\nname = \"v\"\ncmd = []\n",
        5,
        Some("a"),
        Some("cmd"),
        "the command is empty",
    );
    assert_eq!(e.variant.as_deref(), Some("v"));
    assert!(
        e.to_string()
            .contains("task \"a\": variant \"v\": field \"cmd\""),
        "{e}"
    );
    check(
        "[[task]]\nid = \"a\"\nvariant = []\n",
        3,
        Some("a"),
        Some("variant"),
        "at least one variant",
    );
}

#[test]
fn duplicate_variant_names_are_rejected() {
    let e = check(
        "[[task]]\nid = \"a\"\n[[task.variant]]\nname = \"v\"\ncmd = [\"x\"]\n\
         [[task.variant]]\nname = \"v\"\ncmd = [\"y\"]\n",
        7,
        Some("a"),
        Some("name"),
        "duplicate variant name \"v\"",
    );
    assert_eq!(e.variant.as_deref(), Some("v"));
}

#[test]
fn a_resource_name_that_misspells_a_builtin_is_refused_with_the_builtin() {
    let task = |res: &str| format!("[[task]]\nid = \"a\"\ncmd = [\"x\"]\nresources = {res}\n");
    for (given, meant) in [
        ("cpu", "cpus"),
        ("gpu", "gpus"),
        ("memory", "mem"),
        ("gpu-mem", "gpu_mem"),
        ("CPUS", "cpus"),
    ] {
        check(
            &task(&format!("{{ {given} = 1 }}")),
            4,
            Some("a"),
            Some("resources"),
            &format!("did you mean `{meant}`?"),
        );
    }
    // Another name is a custom resource, as documented.
    let job = parse_job(&task("{ license = 1 }"), "job.toml").expect("parses");
    assert!(format!("{job:?}").contains("license"));
}

#[test]
fn a_single_bracket_task_table_says_to_write_two() {
    check(
        "name = \"j\"\n[task]\nid = \"t\"\ncmd = [\"x\"]\n",
        2,
        None,
        None,
        "write `[[task]]`",
    );
    check(
        "[[task]]\nid = \"t\"\n[task.variant]\nname = \"a\"\ncmd = [\"x\"]\n",
        3,
        Some("t"),
        None,
        "write `[[task.variant]]`",
    );
    check(
        "[[task]]\nid = \"t\"\ncmd = [\"x\"]\nafter = \"a\"\n",
        4,
        Some("t"),
        Some("after"),
        "a list is written in brackets",
    );
}

#[test]
fn an_unknown_key_in_a_variant_names_the_variant() {
    let e = check(
        "[[task]]\nid = \"a\"\n[[task.variant]]\nname = \"v\"\ncmd = [\"x\"]\n\
         [[task.variant]]\nname = \"w\"\ncmd = [\"y\"]\ntimeout = \"1s\"\n",
        9,
        Some("a"),
        Some("timeout"),
        "unknown key",
    );
    assert_eq!(e.variant.as_deref(), Some("w"), "{e}");
    assert!(e.to_string().contains("variant \"w\": "), "{e}");
}

#[test]
fn a_timeout_of_zero_is_refused() {
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\ntimeout = \"0s\"\n",
        4,
        Some("a"),
        Some("timeout"),
        "a timeout must be longer than 0",
    );
    check(
        "[defaults]\ntimeout = \"0ms\"\n[[task]]\nid = \"a\"\ncmd = [\"x\"]\n",
        2,
        None,
        Some("defaults.timeout"),
        "a timeout must be longer than 0",
    );
}

#[test]
fn negative_and_nan_resources_are_rejected() {
    let task = |res: &str| format!("[[task]]\nid = \"a\"\ncmd = [\"x\"]\nresources = {res}\n");
    check(
        &task("{ cpus = -1 }"),
        4,
        Some("a"),
        Some("resources"),
        "cpus = -1 is not allowed",
    );
    check(
        &task("{ gpus = nan }"),
        4,
        Some("a"),
        Some("resources"),
        "gpus = NaN is not allowed",
    );
    check(
        &task("{ fpga = -0.5 }"),
        4,
        Some("a"),
        Some("resources"),
        "fpga = -0.5",
    );
    check(
        &task("{ mem = -1 }"),
        4,
        Some("a"),
        Some("resources.mem"),
        "-1 is not allowed",
    );
    check(
        &task("{ \"a b\" = 1 }"),
        4,
        Some("a"),
        Some("resources"),
        "invalid name \"a b\"",
    );
    check(
        "[defaults]\nresources = { cpus = inf }\n",
        2,
        None,
        Some("defaults.resources"),
        "cpus = inf",
    );
    let e = check(
        "[[task]]\nid = \"a\"\n[[task.variant]]\nname = \"g\"\ncmd = [\"x\"]\nresources = { gpus = -2 }\n",
        6,
        Some("a"),
        Some("resources"),
        "gpus = -2",
    );
    assert_eq!(e.variant.as_deref(), Some("g"));
}

#[test]
fn zero_group_size_is_rejected() {
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\ngroup = { size = 0 }\n",
        4,
        Some("a"),
        Some("group"),
        "group size must be at least 1",
    );
    let job = parse_job(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\ngroup = { size = 4 }\n",
        "j.toml",
    )
    .unwrap();
    assert_eq!(job.tasks[0].group.map(|g| g.size), Some(4));
}

#[test]
fn index_placeholder_outside_arrays_names_the_field() {
    let base = "[[task]]\nid = \"a\"\n";
    for (extra, line, field) in [
        ("cmd = [\"x\", \"{i}\"]\n", 3, "cmd"),
        ("cmd = [\"x\"]\nenv = { N = \"{i}\" }\n", 4, "env"),
        ("cmd = [\"x\"]\ninputs = [\"in/{i}\"]\n", 4, "inputs"),
        ("cmd = [\"x\"]\noutputs = [\"out/{i}\"]\n", 4, "outputs"),
        ("cmd = [\"x\"]\ncwd = \"d{i}\"\n", 4, "cwd"),
        (
            "wasm = { module = \"m.wasm\", args = [\"{i}\"] }\n",
            3,
            "wasm",
        ),
    ] {
        check(
            &format!("{base}{extra}"),
            line,
            Some("a"),
            Some(field),
            "\"{i}\" is only replaced in array tasks",
        );
    }
    let e = check(
        &format!("{base}[[task.variant]]\nname = \"v\"\ncmd = [\"x\", \"{{i}}\"]\n"),
        5,
        Some("a"),
        Some("cmd"),
        "only replaced in array tasks",
    );
    assert_eq!(e.variant.as_deref(), Some("v"));
}

#[test]
fn too_many_edges_are_rejected() {
    let text = "[[task]]\nid = \"a\"\narray = \"0..20000\"\ncmd = [\"x\"]\n\
                [[task]]\nid = \"b\"\narray = \"0..20000\"\ncmd = [\"x\"]\nafter = [\"a\"]\n";
    check(text, 9, Some("b"), Some("after"), "400000000 edges");
}

#[test]
fn the_name_defaults_to_the_file_stem() {
    let text = "[[task]]\nid = \"a\"\ncmd = [\"x\"]\n";
    assert_eq!(
        parse_job(text, "jobs/render.job.toml").unwrap().name,
        "render.job"
    );
    assert_eq!(parse_job(text, "plain").unwrap().name, "plain");
    let empty = parse_job("", "empty.toml").unwrap();
    assert_eq!(empty, JobSpec::new("empty"));
    assert!(empty.expand().unwrap().is_empty());
}

#[test]
fn check_fits_names_the_task_and_each_variant() {
    let text = "[defaults]\nresources = { mem = \"1GiB\" }\n\n\
                [[task]]\nid = \"small\"\ncmd = [\"x\"]\n\n\
                [[task]]\nid = \"sim\"\n\
                [[task.variant]]\nname = \"gpu\"\ncmd = [\"x\"]\nresources = { gpus = 1 }\n\
                [[task.variant]]\nname = \"cpu\"\ncmd = [\"x\"]\nresources = { cpus = 16 }\n\n\
                [[task]]\nid = \"big\"\ncmd = [\"x\"]\nresources = { cpus = 4, license = 1 }\n";
    let job = parse_job(text, "job.toml").unwrap();
    let laptop = Resources {
        cpus: 8.0,
        mem: 16 << 30,
        ..Resources::default()
    };
    let mut gpu_box = laptop.clone();
    gpu_box.gpus = 1.0;
    let mut licensed = laptop.clone();
    licensed.custom.insert("license".into(), 2.0);

    let e = job.check_fits(std::slice::from_ref(&laptop)).unwrap_err();
    let e = e.as_job().unwrap();
    assert_eq!(e.task.as_deref(), Some("sim"));
    assert_eq!(e.field.as_deref(), Some("variant"));
    assert_eq!(e.line(), Some(10), "the first [[task.variant]]");
    let msg = e.to_string();
    assert!(
        msg.contains("no variant fits any capacity offered (1 offered)"),
        "{msg}"
    );
    assert!(
        msg.contains("gpu needs cpus=1 gpus=1 mem=1GiB; cpu needs cpus=16 mem=1GiB"),
        "{msg}"
    );

    let e = job
        .check_fits(&[laptop.clone(), gpu_box.clone()])
        .unwrap_err();
    let e = e.as_job().unwrap();
    assert_eq!(e.task.as_deref(), Some("big"));
    assert_eq!(e.field.as_deref(), Some("resources"));
    assert_eq!(e.line(), Some(22), "the task's resources line");
    assert!(
        e.to_string().contains("needs cpus=4 mem=1GiB license=1"),
        "{e}"
    );

    job.check_fits(&[gpu_box, licensed]).unwrap();
    assert!(job
        .check_fits(&[])
        .unwrap_err()
        .to_string()
        .contains("none were offered"));
}

#[test]
fn specs_built_in_code_are_validated_without_a_file() {
    let mut job = parse_job(MANDELBROT, "job.toml").unwrap();
    job.source = None;
    job.tasks[1].after.push(crate::job::Dependency {
        task: "nope".into(),
        index: None,
    });
    let e = job.expand().unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"task "stitch": field "after": no task named "nope""#
    );
}

#[test]
fn sub_tables_read_like_inline_tables() {
    let text = "[[task]]\nid = \"a\"\narray = \"0..2\"\ncmd = [\"x\"]\n\
                [task.resources]\ncpus = 0.5\ngpu_mem = \"1GiB\"\n\
                [task.env]\nN = \"{i}\"\n\
                [task.wasm_is_not_here]\n";
    let e = job_error(text);
    assert_eq!(e.field.as_deref(), Some("wasm_is_not_here"));
    assert_eq!(e.line(), Some(10));
    let ok = text.replace("[task.wasm_is_not_here]\n", "");
    let g = parse_job(&ok, "j.toml").unwrap().expand().unwrap();
    let a1 = g.task(g.by_name("a[1]").unwrap());
    assert_eq!(a1.resources.cpus, 0.5);
    assert_eq!(a1.resources.gpu_mem, 1 << 30);
    assert!(matches!(&a1.kind, TaskKind::Command { env, .. } if env["N"] == "1"));
}

#[test]
fn paths_that_leave_the_job_folder_are_refused_at_submit_naming_the_field() {
    // They were joined to the sandbox unchecked (cwd, module) or caught only after the task
    // ran (outputs).
    for (body, line, field, fragment) in [
        (
            "cmd = [\"x\"]\ncwd = \"/etc\"\n",
            4,
            "cwd",
            "no absolute paths",
        ),
        ("cmd = [\"x\"]\ncwd = \"a/../..\"\n", 4, "cwd", "no '..'"),
        (
            "wasm = { module = \"/opt/m.wasm\" }\n",
            3,
            "wasm",
            "no absolute paths",
        ),
        ("wasm = { module = \"../m.wasm\" }\n", 3, "wasm", "no '..'"),
        (
            "cmd = [\"x\"]\noutputs = [\"ok\", \"../../x\"]\n",
            4,
            "outputs",
            "\"../../x\"",
        ),
        (
            "cmd = [\"x\"]\ninputs = [\"/home/u/.ssh/id_ed25519\"]\n",
            4,
            "inputs",
            "no absolute",
        ),
        ("cmd = [\"x\"]\ninputs = [\"\"]\n", 4, "inputs", "non-empty"),
    ] {
        check(
            &format!("[[task]]\nid = \"a\"\n{body}"),
            line,
            Some("a"),
            Some(field),
            fragment,
        );
    }
    // Dots inside names are fine.
    assert!(parse_job(
        "[[task]]\nid = \"a\"\ncmd = [\"x\"]\ncwd = \"a..b/.c\"\noutputs = [\"x..y\"]\n",
        "job.toml"
    )
    .and_then(|s| s.expand())
    .is_ok());
}

#[test]
fn network_true_asks_for_the_network_resource() {
    let spec = crate::parse_job(
        "[[task]]\nid = \"fetch\"\nnetwork = true\ncmd = [\"curl\", \"x\"]\n[[task]]\nid = \"calc\"\nnetwork = false\ncmd = [\"true\"]\n",
        "job.toml",
    )
    .expect("valid");
    assert_eq!(
        spec.tasks[0].resources.custom.get(crate::NETWORK),
        Some(&1.0)
    );
    assert!(spec.tasks[1].resources.custom.is_empty());
    let e = crate::parse_job(
        "[[task]]\nid = \"t\"\nnetwork = \"yes\"\ncmd = [\"true\"]\n",
        "job.toml",
    )
    .expect_err("not a boolean");
    let m = e.to_string();
    assert!(m.contains("network") && m.contains("true or false"), "{m}");
}

const POOL_JOB: &str = r#"staging = "transfer"

[pool]
budget = 100.0
max_price = { cpu = 0.05, gpu = 1 }
deadline = "2h"
verify = 2
trust = "any"
objective = "cost"

[[task]]
id = "a"
cmd = ["true"]
"#;

#[test]
fn the_pool_section_parses_and_round_trips() {
    use crate::pool::{MaxPrice, Objective, PoolSpec, Trust, Verify};
    let job = parse_job(POOL_JOB, "job.toml").unwrap();
    let want = PoolSpec {
        budget: Some(100.0),
        max_price: MaxPrice {
            cpu: Some(0.05),
            gpu: Some(1.0),
            mem_gb: None,
        },
        deadline: Some(std::time::Duration::from_secs(7200)),
        verify: Verify::Quorum(2),
        trust: Trust::Any,
        objective: Objective::Cost,
    };
    assert_eq!(job.pool.as_ref(), Some(&want));
    let again = parse_job(&job.to_toml(), "job.toml").unwrap();
    assert_eq!(again, job);
    let adaptive = parse_job(
        "staging = \"transfer\"\n[pool]\nverify = \"adaptive\"\ntrust = \"trusted-only\"\nobjective = \"energy\"\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n",
        "job.toml",
    )
    .unwrap();
    let p = adaptive.pool.unwrap();
    assert_eq!(
        (p.verify, p.trust, p.objective, p.budget),
        (
            Verify::Adaptive,
            Trust::TrustedOnly,
            Objective::Energy,
            None
        )
    );
    assert!(
        parse_job("[[task]]\nid = \"a\"\ncmd = [\"true\"]\n", "j.toml")
            .unwrap()
            .pool
            .is_none()
    );
}

#[test]
fn bad_pool_values_name_their_field_and_line() {
    let job = |pool: &str| {
        format!("staging = \"transfer\"\n[pool]\n{pool}\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n")
    };
    check(
        &job("verify = 0"),
        3,
        None,
        Some("pool.verify"),
        "from 1 to 9",
    );
    check(
        &job("verify = \"often\""),
        3,
        None,
        Some("pool.verify"),
        "adaptive",
    );
    check(
        &job("budget = -1"),
        3,
        None,
        Some("pool.budget"),
        "0 or more",
    );
    check(
        &job("budget = \"lots\""),
        3,
        None,
        Some("pool.budget"),
        "credits",
    );
    // What the ledger cannot count: more than it holds, or finer than a millionth.
    check(
        &job("budget = 1e30"),
        3,
        None,
        Some("pool.budget"),
        "more than the ledger holds",
    );
    check(
        &job("budget = 0.0000001"),
        3,
        None,
        Some("pool.budget"),
        "at most six decimals",
    );
    check(
        &job("deadline = \"0s\""),
        3,
        None,
        Some("pool.deadline"),
        "a deadline must be after the submission",
    );
    for ok in [
        "budget = 0.000001",
        "budget = 2.5",
        "budget = 9223372036854",
    ] {
        parse_job(&job(ok), "job.toml").unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    check(
        &job("trust = \"some\""),
        3,
        None,
        Some("pool.trust"),
        "trusted-only",
    );
    check(
        &job("objective = \"speed\""),
        3,
        None,
        Some("pool.objective"),
        "energy",
    );
    check(
        &job("deadline = \"soon\""),
        3,
        None,
        Some("pool.deadline"),
        "soon",
    );
    check(
        &job("max_price = { tpu = 1.0 }"),
        3,
        None,
        Some("pool.max_price.tpu"),
        "mem_gb",
    );
    check(
        &job("max_price = { cpu = -0.1 }"),
        3,
        None,
        Some("pool.max_price.cpu"),
        "0 or more",
    );
    let e = job_error("[pool]\nverify = 2\n[[task]]\nid = \"a\"\ncmd = [\"true\"]\n");
    assert!(e.to_string().contains("staging = \"transfer\""), "{e}");
    let e = job_error(&job("cheap = true"));
    assert!(e.to_string().contains("cheap"), "{e}");
}

#[test]
fn checkpoint_patterns_expand_per_index_and_stay_in_the_job_folder() {
    let text = "[[task]]\nid = \"sim\"\narray = \"0..3\"\ncmd = [\"sim\", \"{i}\"]\n\
                checkpoint = [\"state/{i}/*.ckpt\"]\n";
    let job = parse_job(text, "job.toml").unwrap();
    assert_eq!(
        job.tasks[0].checkpoint,
        vec!["state/{i}/*.ckpt".to_string()]
    );
    let again = parse_job(&job.to_toml(), "job.toml").unwrap();
    assert_eq!(again.tasks[0].checkpoint, job.tasks[0].checkpoint);
    let g = job.expand().unwrap();
    assert_eq!(
        g.task(crate::TaskId::new(2)).checkpoint,
        vec!["state/2/*.ckpt".to_string()]
    );
    check(
        "[[task]]\nid = \"a\"\ncmd = [\"a\"]\ncheckpoint = [\"../x.ckpt\"]\n",
        4,
        Some("a"),
        Some("checkpoint"),
        "..",
    );
}

#[test]
fn in_transfer_staging_a_wasm_module_travels_as_an_input_of_its_task() {
    let text = |staging: &str| {
        format!(
            "name = \"j\"\nstaging = \"{staging}\"\n\n[[task]]\nid = \"w\"\nwasm = \"m.wasm\"\n\
             inputs = [\"data.csv\"]\n\n[[task]]\nid = \"listed\"\nwasm = \"m.wasm\"\n\
             inputs = [\"m.wasm\"]\n\n[[task]]\nid = \"p\"\ncmd = [\"true\"]\n"
        )
    };
    let g = parse_job(&text("transfer"), "j.toml")
        .unwrap()
        .expand()
        .unwrap();
    let inputs = |name: &str| g.task(g.by_name(name).unwrap()).inputs.clone();
    assert_eq!(inputs("w"), vec!["data.csv", "m.wasm"]);
    assert_eq!(inputs("listed"), vec!["m.wasm"], "listed once, not twice");
    assert!(inputs("p").is_empty());
    // Shared staging: the module is read where it is; nothing travels.
    let g = parse_job(&text("shared"), "j.toml")
        .unwrap()
        .expand()
        .unwrap();
    assert_eq!(g.task(g.by_name("w").unwrap()).inputs, vec!["data.csv"]);
}

#[test]
fn keep_going_is_read_written_and_carried_into_the_graph() {
    let text = "keep_going = true\n[[task]]\nid = \"a\"\ncmd = [\"x\"]\n";
    let spec = parse_job(text, "j.toml").unwrap();
    assert!(spec.keep_going);
    assert!(spec.expand().unwrap().keep_going());
    let again = parse_job(&spec.to_toml(), "j.toml").unwrap();
    assert_eq!(again, spec, "{}", spec.to_toml());
    let plain = parse_job("[[task]]\nid = \"a\"\ncmd = [\"x\"]\n", "j.toml").unwrap();
    assert!(!plain.keep_going && !plain.expand().unwrap().keep_going());
    assert!(!plain.to_toml().contains("keep_going"));
    let e = job_error("keep_going = \"yes\"\n[[task]]\nid = \"a\"\ncmd = [\"x\"]\n");
    assert_eq!(e.field.as_deref(), Some("keep_going"), "{e}");
}

#[test]
fn a_shell_s_dollar_brace_i_and_a_doubled_placeholder_are_kept_as_written() {
    // A bash loop's `${i}` was replaced by the index (and refused outside arrays); `{{i}}`
    // writes a `{i}`.
    let job = parse_job(
        "[[task]]\nid = \"loop\"\ncmd = [\"bash\", \"-c\", \"for i in a b; do echo ${i}; done\"]\n\
         [[task]]\nid = \"t\"\narray = \"0..2\"\ncmd = [\"echo\", \"{i}\", \"${i}\", \"{{i}}\", \"x{i}y{i}\"]\n\
         env = { N = \"{{i}}-{i}\" }\n",
        "j.toml",
    )
    .unwrap();
    let g = job.expand().unwrap();
    let kind = |name: &str| g.task(g.by_name(name).unwrap()).kind.clone();
    let TaskKind::Command { cmd, .. } = kind("loop") else {
        panic!("a command")
    };
    assert_eq!(cmd[2], "for i in a b; do echo ${i}; done");
    let TaskKind::Command { cmd, env, .. } = kind("t[1]") else {
        panic!("a command")
    };
    assert_eq!(cmd, vec!["echo", "1", "${i}", "{i}", "x1y1"]);
    assert_eq!(env.get("N").map(String::as_str), Some("{i}-1"));
}

#[test]
fn a_gang_too_large_for_one_machine_is_named() {
    let spec = parse_job(
        "[[task]]\nid = \"g\"\ngroup = { size = 4 }\nresources = { cpus = 1, mem = \"1GiB\" }\ncmd = [\"x\"]\n",
        "job.toml",
    )
    .expect("a valid job");
    let machine = |cpus: f64, mem: u64| Resources {
        cpus,
        mem,
        ..Resources::default()
    };
    assert!(spec.check_gangs_fit(&machine(4.0, 4 << 30)).is_ok());
    let e = spec.check_gangs_fit(&machine(3.0, 64 << 30)).unwrap_err();
    assert!(
        e.to_string().contains(
            "task \"g\": field \"group\": a gang of 4 needs cpus=1 mem=1GiB for each member"
        ),
        "{e}"
    );
    assert!(
        spec.check_gangs_fit(&machine(8.0, 3 << 30)).is_err(),
        "memory too"
    );
    // GPUs as charged: 1.5 takes 2 whole ones; 0.6 cannot share a GPU; 0.5 can.
    let gang = |gpus: &str| {
        parse_job(
            &format!("[[task]]\nid = \"g\"\ngroup = {{ size = 2 }}\nresources = {{ gpus = {gpus} }}\ncmd = [\"x\"]\n"),
            "job.toml",
        )
        .expect("a valid job")
    };
    let with_gpus = |gpus: f64| Resources {
        cpus: 8.0,
        gpus,
        mem: 64 << 30,
        ..Resources::default()
    };
    assert!(gang("1.5").check_gangs_fit(&with_gpus(3.0)).is_err());
    assert!(gang("1.5").check_gangs_fit(&with_gpus(4.0)).is_ok());
    assert!(gang("0.6").check_gangs_fit(&with_gpus(1.0)).is_err());
    assert!(gang("0.5").check_gangs_fit(&with_gpus(1.0)).is_ok());
}
