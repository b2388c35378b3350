//! The job file, version 1, as data: [`JobSpec`] and its parts.
//!
//! A spec is what the file says, nothing merged: `[defaults]` stay apart from the tasks and
//! arrays stay one [`TaskSpec`], so that [`JobSpec::to_toml`] writes back an equal job.
//! [`JobSpec::expand`] applies the defaults, expands arrays and substitutes `{i}`.
//! [`parse_job`](crate::parse_job) reads one from TOML.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::format_duration;
use crate::error::{JobError, Problem, Result};
use crate::graph::TaskGraph;
use crate::resources::{ResourceRequest, Resources};
use crate::size::format_size;
use crate::source::{Locator, SourceMap};

/// The most instances one array, or one whole job, may expand to.
pub const MAX_INSTANCES: u64 = 10_000_000;

/// The most dependency edges a job may expand to (an array depending on a whole array
/// has one edge per pair).
pub const MAX_EDGES: u64 = 100_000_000;

/// The string replaced by the array index.
pub const INDEX_PLACEHOLDER: &str = "{i}";

/// What a `{i}` found in a string is, from the text around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placeholder {
    /// The index placeholder: replaced.
    Index,
    /// `{{i}}`: a written `{i}`.
    Escaped,
    /// A shell's `${i}`: kept as written.
    Shell,
}

/// The kind of the `{i}` between `before` and `after` (the text on either side of it).
pub(crate) fn placeholder_at(before: &str, after: &str) -> Placeholder {
    if before.ends_with('{') && after.starts_with('}') {
        Placeholder::Escaped
    } else if before.ends_with('$') {
        Placeholder::Shell
    } else {
        Placeholder::Index
    }
}

/// Whether `s` holds an index placeholder that is replaced (not `{{i}}`, not `${i}`).
pub fn has_index_placeholder(s: &str) -> bool {
    let mut at = 0;
    while let Some(p) = s[at..].find(INDEX_PLACEHOLDER) {
        let start = at + p;
        let end = start + INDEX_PLACEHOLDER.len();
        if placeholder_at(&s[..start], &s[end..]) == Placeholder::Index {
            return true;
        }
        at = end;
    }
    false
}

/// The WASM entry point used when a job does not name one.
pub const DEFAULT_WASM_ENTRY: &str = "_start";

/// How a task's files reach the worker that runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Staging {
    /// Workers see the job's folder (one machine, or a shared file system).
    #[default]
    Shared,
    /// Declared inputs and outputs travel between workers.
    Transfer,
}

impl Staging {
    /// The name used in job files.
    pub fn as_str(self) -> &'static str {
        match self {
            Staging::Shared => "shared",
            Staging::Transfer => "transfer",
        }
    }
}

/// `[defaults]`: what every task gets unless it says otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Defaults {
    /// Attempts after the first (default 2).
    pub retries: u32,
    /// Time limit of one attempt.
    pub timeout: Option<Duration>,
    /// Resources; a task's keys replace these one by one.
    pub resources: ResourceRequest,
    /// Priority; higher runs first (default 0).
    pub priority: i64,
    /// Environment; a task's variables are added to (and replace) these.
    pub env: BTreeMap<String, String>,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            retries: 2,
            timeout: None,
            resources: ResourceRequest::default(),
            priority: 0,
            env: BTreeMap::new(),
        }
    }
}

/// An `after` entry: a whole task (every instance of an array) or one array element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dependency {
    /// The task's id.
    pub task: String,
    /// The element, for `"tile[3]"`.
    pub index: Option<u64>,
}

impl Dependency {
    /// Parses `"tile"` or `"tile[3]"`. Returns `None` for anything else.
    pub fn parse(text: &str) -> Option<Dependency> {
        match text.split_once('[') {
            None => Some(Dependency {
                task: text.to_string(),
                index: None,
            }),
            Some((task, rest)) => {
                let digits = rest.strip_suffix(']')?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                Some(Dependency {
                    task: task.to_string(),
                    index: Some(digits.parse().ok()?),
                })
            }
        }
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}[{i}]", self.task),
            None => f.write_str(&self.task),
        }
    }
}

/// `[[task.variant]]`: one way to run a task; the scheduler picks one per instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantSpec {
    /// Unique within the task.
    pub name: String,
    /// The command; `{i}` is replaced.
    pub cmd: Vec<String>,
    /// Resources, layered over the task's and the defaults'.
    pub resources: ResourceRequest,
    /// Environment, added to the task's.
    pub env: BTreeMap<String, String>,
}

/// `wasm = "m.wasm"` or `wasm = { module, entry, args, fuel, memory }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WasmSpec {
    /// Path of the module.
    pub module: String,
    /// Exported function to call (default `_start`).
    pub entry: String,
    /// Arguments; `{i}` is replaced.
    pub args: Vec<String>,
    /// Fuel limit, if any.
    pub fuel: Option<u64>,
    /// Memory limit in bytes, if any.
    pub memory: Option<u64>,
}

impl WasmSpec {
    /// A module run from `_start` with no arguments and no limits.
    pub fn new(module: impl Into<String>) -> Self {
        WasmSpec {
            module: module.into(),
            entry: DEFAULT_WASM_ENTRY.to_string(),
            args: Vec::new(),
            fuel: None,
            memory: None,
        }
    }
}

/// What a task runs: exactly one of `cmd`, `variant` and `wasm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TaskBody {
    /// `cmd = [...]`: one command.
    Command(Vec<String>),
    /// `[[task.variant]]`: alternatives.
    Variants(Vec<VariantSpec>),
    /// `wasm = ...`: a WASI module.
    Wasm(WasmSpec),
}

/// `group = { size = N }`: a gang of N instances started together, each told its rank.
///
/// On an array, consecutive runs of `size` instances form the gangs (the array's length must
/// be a multiple of `size`); on a task without `array`, the task runs as `size` instances
/// `id[0]`..`id[size-1]`, as if it had `array = "0..size"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Group {
    /// How many run together; at least 1.
    pub size: u32,
}

/// `[[task]]`: one task, or one array of tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Unique in the job: letters, digits, `-`, `_`.
    pub id: String,
    /// `array = "0..64"`: the indices, half-open.
    pub array: Option<Range<u64>>,
    /// What it runs.
    pub body: TaskBody,
    /// What must finish first.
    pub after: Vec<Dependency>,
    /// Input path patterns; `{i}` is replaced.
    pub inputs: Vec<String>,
    /// Output path patterns; `{i}` is replaced.
    pub outputs: Vec<String>,
    /// Environment, added to the defaults'; `{i}` is replaced in values.
    pub env: BTreeMap<String, String>,
    /// Working directory, relative to the job's folder; `{i}` is replaced.
    pub cwd: Option<String>,
    /// Resources, layered over the defaults'. A task table's `network = true` is written
    /// here as the custom resource [`NETWORK`](crate::NETWORK) = 1: the task needs the network,
    /// which only workers started with `--allow-network` offer (a sandboxed task has none
    /// otherwise).
    pub resources: ResourceRequest,
    /// Attempts after the first, if not the default.
    pub retries: Option<u32>,
    /// Time limit of one attempt, if not the default.
    pub timeout: Option<Duration>,
    /// Priority, if not the default.
    pub priority: Option<i64>,
    /// Gang scheduling, if any.
    pub group: Option<Group>,
    /// Checkpoint files the task writes when it gets SIGTERM (path patterns, `{i}`
    /// replaced): when its worker is reclaimed they are kept off the machine and the task
    /// resumes from them elsewhere. Not serialized (see [`JobSpec::pool`]).
    #[serde(skip)]
    pub checkpoint: Vec<String>,
}

impl TaskSpec {
    /// A task with only an id and a body.
    pub fn new(id: impl Into<String>, body: TaskBody) -> Self {
        TaskSpec {
            id: id.into(),
            array: None,
            body,
            after: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            resources: ResourceRequest::default(),
            retries: None,
            timeout: None,
            priority: None,
            group: None,
            checkpoint: Vec::new(),
        }
    }

    /// How many instances it expands to (1 when it is not an array, 0 for an empty range).
    pub fn instance_count(&self) -> u64 {
        self.indices().map_or(1, |r| r.end.saturating_sub(r.start))
    }

    /// The array indices of its instances: `array`, or `0..size` for a `group` that is not
    /// an array (a gang of `size` ranks), or `None` for one plain task.
    pub fn indices(&self) -> Option<Range<u64>> {
        self.array
            .clone()
            .or_else(|| self.group.map(|g| 0..u64::from(g.size)))
    }
}

/// A whole job file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job's name (default: the file's stem).
    pub name: String,
    /// How files reach workers.
    pub staging: Staging,
    /// `keep_going = true`: a task that fails for good does not end the job; the tasks that
    /// need it are cancelled and every other one runs (the job fails at its end). Not
    /// serialized, as [`pool`](JobSpec::pool): journals keep the job file's text.
    #[serde(skip)]
    pub keep_going: bool,
    /// `[defaults]`.
    pub defaults: Defaults,
    /// The tasks, in file order.
    pub tasks: Vec<TaskSpec>,
    /// `[pool]`: what the job pays and trusts on a shared pool (`None`: the operator's own
    /// workers only). Not serialized: the coordinator's journal keeps it in a record of its
    /// own, so journals written before it existed read unchanged.
    #[serde(skip)]
    pub pool: Option<crate::pool::PoolSpec>,
    /// Where the parts were in the file, when parsed from one; it makes later errors name
    /// the line. Neither serialized nor compared.
    #[serde(skip)]
    pub source: Option<SourceMap>,
}

impl PartialEq for JobSpec {
    /// Compares everything but [`source`](JobSpec::source).
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.staging == other.staging
            && self.keep_going == other.keep_going
            && self.defaults == other.defaults
            && self.tasks == other.tasks
            && self.pool == other.pool
    }
}

impl JobSpec {
    /// An empty job with default settings.
    pub fn new(name: impl Into<String>) -> Self {
        JobSpec {
            name: name.into(),
            ..JobSpec::default()
        }
    }

    /// The task with this id.
    pub fn task(&self, id: &str) -> Option<&TaskSpec> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// Checks everything [`parse_job`](crate::parse_job) checks beyond TOML types: names,
    /// duplicate ids, ranges, dependencies, cycles, commands, variants, resources, groups and
    /// `{i}` outside arrays. Use it on a spec built in code or received over the wire.
    pub fn validate(&self) -> Result<()> {
        crate::validate::validate(self)
    }

    /// Validates, then expands into a graph of task instances: defaults applied, arrays
    /// expanded, `{i}` substituted. Linear in instances plus edges.
    pub fn expand(&self) -> Result<TaskGraph> {
        crate::graph::expand(self)
    }

    /// The resources task `task` (index in [`tasks`](JobSpec::tasks)) needs: defaults
    /// merged. For a task with variants, what the variants inherit.
    pub fn task_resources(&self, task: usize) -> Option<Resources> {
        let t = self.tasks.get(task)?;
        Some(self.defaults.resources.overlay(&t.resources).resolve())
    }

    /// Checks that every task fits in at least one of `capacities` (the workers or machine
    /// on offer). A task with variants fits if any variant fits any capacity. The error
    /// names the task, and each variant's needs.
    pub fn check_fits(&self, capacities: &[Resources]) -> Result<()> {
        let loc = Locator {
            source: self.source.as_ref(),
        };
        let fits = |r: &Resources| capacities.iter().any(|c| r.fits_in(c));
        for (t, task) in self.tasks.iter().enumerate() {
            let base = self.defaults.resources.overlay(&task.resources);
            match &task.body {
                TaskBody::Variants(variants) => {
                    let needs: Vec<(String, Resources)> = variants
                        .iter()
                        .map(|v| (v.name.clone(), base.overlay(&v.resources).resolve()))
                        .collect();
                    if !needs.iter().any(|(_, r)| fits(r)) {
                        let e = JobError::new(Problem::NoVariantFits {
                            needs,
                            offered: capacities.len(),
                        })
                        .task(&task.id)
                        .field("variant");
                        return Err(loc.task(e, t, "variant").into());
                    }
                }
                TaskBody::Command(_) | TaskBody::Wasm(_) => {
                    let needs = base.resolve();
                    if !fits(&needs) {
                        let e = JobError::new(Problem::Unsatisfiable {
                            needs,
                            offered: capacities.len(),
                        })
                        .task(&task.id)
                        .field("resources");
                        return Err(loc.task(e, t, "resources").into());
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks that every gang's members fit side by side in `offer`, the one machine of
    /// `flotilla run` (its CPUs, memory and whole GPUs: a gang is never queued, its members
    /// start together). A gang with variants fits if one variant's members do. The error
    /// names the task and what each member needs.
    pub fn check_gangs_fit(&self, offer: &Resources) -> Result<()> {
        let loc = Locator {
            source: self.source.as_ref(),
        };
        let fit = |n: u32, r: &Resources| {
            let n = f64::from(n);
            // GPUs as the ledger charges them: whole ones rounded up per member; shares of
            // one GPU only as many to a GPU as fit in it (0.6 takes one of its own).
            let gpus = if r.gpus <= 0.0 {
                0.0
            } else if r.gpus >= 1.0 {
                n * r.gpus.ceil()
            } else {
                (n / (1.0 / r.gpus + 1e-9).floor()).ceil()
            };
            n * r.cpus <= offer.cpus + 1e-9
                && u128::from(r.mem) * n as u128 <= u128::from(offer.mem)
                && gpus <= offer.gpus + 1e-9
        };
        for (t, task) in self.tasks.iter().enumerate() {
            let Some(size) = task.group.map(|g| g.size).filter(|s| *s > 1) else {
                continue;
            };
            let base = self.defaults.resources.overlay(&task.resources);
            let needs: Vec<Resources> = match &task.body {
                TaskBody::Variants(vs) => vs
                    .iter()
                    .map(|v| base.overlay(&v.resources).resolve())
                    .collect(),
                TaskBody::Command(_) | TaskBody::Wasm(_) => vec![base.resolve()],
            };
            if needs.iter().any(|r| fit(size, r)) {
                continue;
            }
            let smallest = needs
                .into_iter()
                .min_by(|a, b| a.cpus.total_cmp(&b.cpus))
                .unwrap_or_default();
            let e = JobError::new(Problem::GangTooLarge {
                size,
                needs: smallest,
            })
            .task(&task.id)
            .field("group");
            return Err(loc.task(e, t, "group").into());
        }
        Ok(())
    }

    /// Writes the job as TOML that [`parse_job`](crate::parse_job) reads back into an equal
    /// spec.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        line(&mut out, "name", lit(self.name.as_str()));
        line(&mut out, "staging", lit(self.staging.as_str()));
        if self.keep_going {
            line(&mut out, "keep_going", lit(true));
        }
        out.push_str("\n[defaults]\n");
        let d = &self.defaults;
        line(&mut out, "retries", lit(i64::from(d.retries)));
        if let Some(t) = d.timeout {
            line(&mut out, "timeout", lit(format_duration(t)));
        }
        line(&mut out, "priority", lit(d.priority));
        if !d.resources.is_empty() {
            line(&mut out, "resources", resources_lit(&d.resources));
        }
        if !d.env.is_empty() {
            line(&mut out, "env", env_lit(&d.env));
        }
        if let Some(p) = &self.pool {
            out.push_str(&p.to_toml());
        }
        for task in &self.tasks {
            write_task(&mut out, task);
        }
        out
    }
}

fn write_task(out: &mut String, task: &TaskSpec) {
    out.push_str("\n[[task]]\n");
    line(out, "id", lit(task.id.as_str()));
    if let Some(r) = &task.array {
        line(out, "array", lit(format!("{}..{}", r.start, r.end)));
    }
    match &task.body {
        TaskBody::Command(cmd) => line(out, "cmd", strings_lit(cmd)),
        TaskBody::Wasm(w) => {
            let mut t = toml::Table::new();
            t.insert("module".into(), w.module.clone().into());
            t.insert("entry".into(), w.entry.clone().into());
            t.insert("args".into(), strings_value(&w.args));
            if let Some(fuel) = w.fuel {
                // Validation keeps fuel within i64; saturate rather than wrap otherwise.
                t.insert(
                    "fuel".into(),
                    i64::try_from(fuel).unwrap_or(i64::MAX).into(),
                );
            }
            if let Some(m) = w.memory {
                t.insert("memory".into(), format_size(m).into());
            }
            line(out, "wasm", toml::Value::Table(t).to_string());
        }
        TaskBody::Variants(_) => {}
    }
    if !task.after.is_empty() {
        let deps: Vec<String> = task.after.iter().map(Dependency::to_string).collect();
        line(out, "after", strings_lit(&deps));
    }
    if !task.inputs.is_empty() {
        line(out, "inputs", strings_lit(&task.inputs));
    }
    if !task.checkpoint.is_empty() {
        line(out, "checkpoint", strings_lit(&task.checkpoint));
    }
    if !task.outputs.is_empty() {
        line(out, "outputs", strings_lit(&task.outputs));
    }
    if !task.env.is_empty() {
        line(out, "env", env_lit(&task.env));
    }
    if let Some(cwd) = &task.cwd {
        line(out, "cwd", lit(cwd.as_str()));
    }
    if !task.resources.is_empty() {
        line(out, "resources", resources_lit(&task.resources));
    }
    if let Some(r) = task.retries {
        line(out, "retries", lit(i64::from(r)));
    }
    if let Some(t) = task.timeout {
        line(out, "timeout", lit(format_duration(t)));
    }
    if let Some(p) = task.priority {
        line(out, "priority", lit(p));
    }
    if let Some(g) = task.group {
        line(out, "group", format!("{{ size = {} }}", g.size));
    }
    if let TaskBody::Variants(variants) = &task.body {
        for v in variants {
            out.push_str("\n[[task.variant]]\n");
            line(out, "name", lit(v.name.as_str()));
            line(out, "cmd", strings_lit(&v.cmd));
            if !v.resources.is_empty() {
                line(out, "resources", resources_lit(&v.resources));
            }
            if !v.env.is_empty() {
                line(out, "env", env_lit(&v.env));
            }
        }
    }
}

fn line(out: &mut String, key: &str, value: String) {
    let _ = writeln!(out, "{} = {value}", key_lit(key));
}

fn lit(v: impl Into<toml::Value>) -> String {
    v.into().to_string()
}

/// A key, bare when TOML allows, quoted otherwise.
pub(crate) fn key_lit(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bare {
        key.to_string()
    } else {
        lit(key)
    }
}

fn strings_value(items: &[String]) -> toml::Value {
    toml::Value::Array(items.iter().map(|s| s.clone().into()).collect())
}

fn strings_lit(items: &[String]) -> String {
    strings_value(items).to_string()
}

fn env_lit(env: &BTreeMap<String, String>) -> String {
    let parts: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{} = {}", key_lit(k), lit(v.as_str())))
        .collect();
    format!("{{ {} }}", parts.join(", "))
}

fn resources_lit(r: &ResourceRequest) -> String {
    let mut parts = Vec::new();
    if let Some(c) = r.cpus {
        parts.push(format!("cpus = {}", lit(c)));
    }
    if let Some(g) = r.gpus {
        parts.push(format!("gpus = {}", lit(g)));
    }
    if let Some(m) = r.mem {
        parts.push(format!("mem = {}", lit(format_size(m))));
    }
    if let Some(m) = r.gpu_mem {
        parts.push(format!("gpu_mem = {}", lit(format_size(m))));
    }
    for (k, v) in &r.custom {
        parts.push(format!("{} = {}", key_lit(k), lit(*v)));
    }
    format!("{{ {} }}", parts.join(", "))
}

#[cfg(test)]
#[path = "job_props.rs"]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_parse_and_print() {
        let d = Dependency::parse("tile[3]").unwrap();
        assert_eq!(d.task, "tile");
        assert_eq!(d.index, Some(3));
        assert_eq!(d.to_string(), "tile[3]");
        assert_eq!(Dependency::parse("stitch").unwrap().index, None);
        for bad in [
            "tile[", "tile[]", "tile[x]", "tile[3]x", "tile[-1]", "t[{i}]",
        ] {
            assert!(Dependency::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn keys_are_quoted_only_when_needed() {
        assert_eq!(key_lit("OMP_NUM_THREADS"), "OMP_NUM_THREADS");
        assert_eq!(key_lit("a b"), "\"a b\"");
        assert_eq!(key_lit(""), "\"\"");
    }

    #[test]
    fn instance_count_handles_plain_and_empty_ranges() {
        let mut t = TaskSpec::new("t", TaskBody::Command(vec!["x".into()]));
        assert_eq!(t.instance_count(), 1);
        t.array = Some(5..10);
        assert_eq!(t.instance_count(), 5);
        t.array = Some(Range { start: 10, end: 5 });
        assert_eq!(t.instance_count(), 0);
    }
}
