//! What a job file may mean otherwise than it says, found in its text alone: warnings, never
//! errors (the file is valid). Today: braced words that look like a misspelt index
//! placeholder (`{I}`, `{index}`) or another runner's (`{rank}`, `{task_id}`), which are
//! passed to the program as written; only `{i}` is replaced.

use crate::job::{JobSpec, TaskBody, TaskSpec};

/// What a braced word most likely meant: the placeholder or variable that gives it (in a
/// task with indices when `indexed`: an array or a gang).
fn meant(word: &str, indexed: bool) -> Option<&'static str> {
    let w = word.trim();
    let index = |with_spaces: bool| match (indexed, with_spaces) {
        (true, true) => {
            Some("\"{i}\", with no spaces inside the braces (the index is also in FLOTILLA_INDEX)")
        }
        (true, false) => Some("\"{i}\" (the index is also in FLOTILLA_INDEX)"),
        (false, _) => Some(
            "an index? Only an array task (`array = \"0..n\"`) has one, as \"{i}\" and \
             FLOTILLA_INDEX",
        ),
    };
    if w == "i" && word != "i" {
        return index(true);
    }
    match w.to_ascii_lowercase().as_str() {
        "i" | "index" | "idx" | "array_index" | "array_task_id" => index(false),
        "rank" => Some("FLOTILLA_RANK, in a gang's environment"),
        "world_size" => Some("FLOTILLA_WORLD_SIZE, in a gang's environment"),
        "attempt" => Some("FLOTILLA_ATTEMPT, in the environment"),
        "job" | "job_id" | "jobid" => Some("FLOTILLA_JOB or FLOTILLA_JOB_ID, in the environment"),
        "task" | "task_name" | "task_id" | "taskid" => Some("FLOTILLA_TASK, in the environment"),
        _ => None,
    }
}

/// The braced words of `s` that [`meant`] knows (not `{i}` itself, not a shell's `${...}`;
/// none in a string that formats its own braces, as a Python `.format(` or f-string does).
fn suspects(s: &str, indexed: bool) -> Vec<(&str, &'static str)> {
    let mut found = Vec::new();
    if s.contains(".format(") || s.contains("f\"") || s.contains("f'") {
        return found;
    }
    let mut rest = s;
    let mut offset = 0;
    while let Some(open) = rest.find('{') {
        let at = offset + open;
        let after = &rest[open + 1..];
        let Some(close) = after.find(['}', '{']) else {
            break;
        };
        if after.as_bytes()[close] == b'}' {
            let word = &after[..close];
            let shell = at > 0 && s.as_bytes()[at - 1] == b'$';
            if !shell && word != "i" {
                if let Some(m) = meant(word, indexed) {
                    found.push((&s[at..at + close + 2], m));
                }
            }
        }
        offset = at + 1;
        rest = &s[offset..];
    }
    found
}

/// Every string of `task` where a placeholder is replaced, with the field it is in.
fn fields(task: &TaskSpec) -> Vec<(String, &str)> {
    let mut out: Vec<(String, &str)> = Vec::new();
    match &task.body {
        TaskBody::Command(cmd) => out.extend(cmd.iter().map(|s| ("cmd".to_string(), s.as_str()))),
        TaskBody::Wasm(w) => {
            out.extend(w.args.iter().map(|s| ("wasm args".to_string(), s.as_str())))
        }
        TaskBody::Variants(vs) => {
            for v in vs {
                let at = |f: &str| format!("variant {:?} {f}", v.name);
                out.extend(v.cmd.iter().map(|s| (at("cmd"), s.as_str())));
                out.extend(
                    v.env
                        .iter()
                        .map(|(k, s)| (at(&format!("env {k}")), s.as_str())),
                );
            }
        }
    }
    out.extend(
        task.env
            .iter()
            .map(|(k, s)| (format!("env {k}"), s.as_str())),
    );
    for (name, list) in [
        ("inputs", &task.inputs),
        ("outputs", &task.outputs),
        ("checkpoint", &task.checkpoint),
    ] {
        out.extend(list.iter().map(|s| (name.to_string(), s.as_str())));
    }
    if let Some(cwd) = &task.cwd {
        out.push(("cwd".to_string(), cwd.as_str()));
    }
    out
}

/// Warnings for braced words in `spec`'s tasks that are passed on as written but look
/// meant to be replaced: `task "sim": "{index}" in its cmd is passed as written; the index
/// is "{i}" ...`. One per task, field and word.
pub fn placeholder_warnings(spec: &JobSpec) -> Vec<String> {
    let mut out = Vec::new();
    for task in &spec.tasks {
        let mut seen: Vec<(String, String)> = Vec::new();
        let indexed = task.array.is_some() || task.group.is_some();
        for (field, text) in fields(task) {
            for (word, m) in suspects(text, indexed) {
                let key = (field.clone(), word.to_string());
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                out.push(format!(
                    "task {:?}: {word:?} in its {field} is passed as written (only \"{{i}}\" is \
                     replaced); did you mean {m}?",
                    task.id
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warnings(toml: &str) -> Vec<String> {
        placeholder_warnings(&crate::parse_job(toml, "job.toml").expect("a valid job"))
    }

    #[test]
    fn a_misspelt_index_placeholder_is_named_with_what_was_meant() {
        let w = warnings(
            "[[task]]\nid = \"sim\"\narray = \"0..4\"\ncmd = [\"./sim\", \"{index}\", \"--out\", \"out/{I}.txt\", \"{i}\"]\n",
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].contains(r#"task "sim": "{index}" in its cmd is passed as written"#),
            "{w:?}"
        );
        assert!(w[0].contains("did you mean \"{i}\""), "{w:?}");
        assert!(w[1].contains(r#""{I}""#), "{w:?}");
    }

    #[test]
    fn other_runners_placeholders_point_at_the_environment() {
        let w = warnings(
            "[[task]]\nid = \"train\"\ngroup = { size = 2 }\ncmd = [\"./train\", \"--rank\", \"{rank}\"]\nenv = { RUN = \"{ i }\" }\noutputs = [\"log-{attempt}.txt\"]\n",
        );
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w.iter().any(|m| m.contains("FLOTILLA_RANK")), "{w:?}");
        assert!(
            w.iter()
                .any(|m| m.contains("env RUN") && m.contains("no spaces")),
            "{w:?}"
        );
        assert!(
            w.iter()
                .any(|m| m.contains("outputs") && m.contains("FLOTILLA_ATTEMPT")),
            "{w:?}"
        );
    }

    #[test]
    fn shell_braces_and_the_right_placeholder_are_left_alone() {
        let w = warnings(
            "[[task]]\nid = \"t\"\narray = \"0..2\"\ncmd = [\"sh\", \"-c\", \"echo ${index} {1..3} {i} {}; awk '{print $1}' {{i}}\"]\n\
             [[task]]\nid = \"py\"\ncmd = [\"python3\", \"-c\", \"print('{job}'.format(job=1), f'{task}')\"]\n",
        );
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_task_without_indices_is_not_told_to_use_the_index() {
        let w = warnings("[[task]]\nid = \"t\"\ncmd = [\"x\", \"{index}\", \"{task_id}\"]\n");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("Only an array task"), "{w:?}");
        assert!(w[1].contains("FLOTILLA_TASK"), "{w:?}");
    }

    #[test]
    fn one_warning_per_task_field_and_word() {
        let w = warnings("[[task]]\nid = \"t\"\ncmd = [\"x\", \"{index}\", \"a{index}b\"]\n");
        assert_eq!(w.len(), 1, "{w:?}");
        let w = warnings(
            "[[task]]\nid = \"t\"\n[[task.variant]]\nname = \"v\"\ncmd = [\"y\", \"{idx}\"]\n",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains(r#"in its variant "v" cmd"#), "{w:?}");
    }
}
