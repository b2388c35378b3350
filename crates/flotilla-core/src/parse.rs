//! Reading a job file: TOML text to a validated [`JobSpec`].
//!
//! The TOML reader checks syntax and unknown keys (every table denies unknown fields); the
//! leaf values are read as spanned `toml::Value`s and converted here, so that a value of the
//! wrong type is reported with its field's name and line. Then
//! [`validate`](crate::validate) runs the checks that need the whole job.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_spanned::Spanned;
use toml::Value;

use crate::duration::parse_duration;
use crate::error::{CoreError, JobError, Problem, Result};
use crate::job::{
    Defaults, Dependency, Group, JobSpec, Staging, TaskBody, TaskSpec, VariantSpec, WasmSpec,
};
use crate::pool::{Objective, PoolSpec, Trust, Verify};
use crate::resources::ResourceRequest;
use crate::resources::NETWORK;
use crate::size::parse_size;
use crate::source::{FieldPositions, LineIndex, SourceMap, TaskPositions};

type V = Option<Spanned<Value>>;
type SpannedMap = Spanned<BTreeMap<String, Spanned<Value>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: V,
    staging: V,
    keep_going: V,
    defaults: Option<Spanned<RawDefaults>>,
    pool: Option<Spanned<RawPool>>,
    task: Option<Vec<Spanned<RawTask>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    budget: V,
    max_price: Option<SpannedMap>,
    deadline: V,
    verify: V,
    trust: V,
    objective: V,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    retries: V,
    timeout: V,
    resources: Option<SpannedMap>,
    priority: V,
    env: Option<SpannedMap>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    id: V,
    cmd: V,
    array: V,
    after: Option<Spanned<Vec<Spanned<Value>>>>,
    inputs: V,
    outputs: V,
    env: Option<SpannedMap>,
    cwd: V,
    resources: Option<SpannedMap>,
    retries: V,
    timeout: V,
    priority: V,
    variant: Option<Spanned<Vec<Spanned<RawVariant>>>>,
    wasm: V,
    group: V,
    network: V,
    checkpoint: V,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariant {
    name: V,
    cmd: V,
    resources: Option<SpannedMap>,
    env: Option<SpannedMap>,
}

/// Parses and validates a job file. `file_name` is used in error messages, and its stem is
/// the job's name when the file gives none.
///
/// ```
/// let job = flotilla_core::parse_job("[[task]]\nid = \"a\"\ncmd = [\"true\"]\n", "dir/hello.toml")?;
/// assert_eq!(job.name, "hello");
/// # Ok::<(), flotilla_core::CoreError>(())
/// ```
pub fn parse_job(text: &str, file_name: &str) -> Result<JobSpec> {
    let lines = LineIndex::new(text);
    let raw: RawJob = toml::from_str(text).map_err(|e| toml_error(&e, &lines, file_name))?;
    let mut cx = Cx {
        lines: &lines,
        source: SourceMap {
            file: file_name.to_string(),
            ..SourceMap::default()
        },
        task: None,
        variant: None,
    };
    let spec = cx.job(raw, file_name)?;
    spec.validate()?;
    Ok(spec)
}

/// Turns a TOML reader error into a job error with line and, when it can be told, field.
fn toml_error(e: &toml::de::Error, lines: &LineIndex<'_>, file: &str) -> CoreError {
    let message = e.message().trim();
    let span = e.span();
    let mut err = if let Some(rest) = message.strip_prefix("unknown field `") {
        let (key, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected = tail
            .trim_start_matches(", expected ")
            .trim_start_matches("one of ")
            .to_string();
        let field = match span.as_ref().and_then(|s| table_of(lines, s.start)) {
            Some(table) if table != key => format!("{table}.{key}"),
            _ => key.to_string(),
        };
        let near = crate::error::nearest_key(key, &expected);
        JobError::new(Problem::UnknownKey { expected, near }).field(field)
    } else {
        let text = message
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
            // What serde calls a map, TOML calls a table.
            .replace("expected a map", "expected a table");
        let key = span.as_ref().and_then(|s| key_before(lines, s.start));
        let hint = match (&span, &key) {
            // `[task]` for `[[task]]`: a table where a list of tables is read.
            (Some(s), None) if text.contains("expected a sequence") => {
                let line = lines.line_text(s.start).trim();
                line.strip_prefix('[')
                    .filter(|rest| !rest.starts_with('['))
                    .and_then(|rest| rest.split_once(']'))
                    .map(|(name, _)| {
                        format!(" (`[{name}]` is one table; tasks and variants are a list: write `[[{name}]]`)", name = name.trim())
                    })
            }
            // `env = "x"`, `resources = 4`: a table is written in braces.
            (Some(_), Some(key))
                if text.starts_with("invalid type") && text.ends_with("expected a table") =>
            {
                let example = match key.as_str() {
                    "env" => "env = { NAME = \"value\" }",
                    "resources" => "resources = { cpus = 2, mem = \"4GiB\" }",
                    "group" => "group = { size = 4 }",
                    _ => "{ key = value }",
                };
                Some(format!(" (a table is written in braces: {example})"))
            }
            // `after = "a"` for `after = ["a"]`, and the like.
            (Some(_), Some(_))
                if text.starts_with("invalid type: string")
                    && text.ends_with("expected a sequence") =>
            {
                Some(" (a list is written in brackets: [\"a\", \"b\"])".to_string())
            }
            _ => None,
        };
        let mut e = JobError::new(Problem::Toml(format!("{text}{}", hint.unwrap_or_default())));
        if let Some(key) = key {
            e = e.field(key);
        }
        e
    };
    if let Some(s) = &span {
        err.task = enclosing_task(lines, s.start);
        if err.task.is_some() {
            err.variant = enclosing_variant(lines, s.start);
        }
    }
    err.file = Some(file.to_string());
    err.pos = span.map(|s| lines.pos(s.start));
    err.into()
}

#[derive(Deserialize)]
struct LooseJob {
    task: Option<Vec<Spanned<LooseTask>>>,
}

#[derive(Deserialize)]
struct LooseTask {
    id: Option<Value>,
}

/// A second lenient reading for [`enclosing_variant`] (its own: a `[task.variant]` written
/// with one bracket must not stop [`enclosing_task`]).
#[derive(Deserialize)]
struct LooseVariants {
    task: Option<Vec<Spanned<LooseTaskVariants>>>,
}

#[derive(Deserialize)]
struct LooseTaskVariants {
    variant: Option<Vec<Spanned<LooseVariant>>>,
}

#[derive(Deserialize)]
struct LooseVariant {
    name: Option<Value>,
}

/// The name of the `[[task.variant]]` whose table holds `offset`, read as
/// [`enclosing_task`] reads the task: the last variant table starting before `offset`, when
/// the nearest table header above `offset` is a variant's.
fn enclosing_variant(lines: &LineIndex<'_>, offset: usize) -> Option<String> {
    let header = lines.text()[..offset]
        .lines()
        .rev()
        .map(str::trim_start)
        .find(|l| l.starts_with('['))?;
    let header: String = header.chars().filter(|c| !c.is_whitespace()).collect();
    if header != "[[task.variant]]" {
        return None;
    }
    let loose: LooseVariants = toml::from_str(lines.text()).ok()?;
    let task = loose
        .task?
        .into_iter()
        .take_while(|t| t.span().start <= offset)
        .last()?
        .into_inner();
    let variant = task
        .variant?
        .into_iter()
        .take_while(|v| v.span().start <= offset)
        .last()?
        .into_inner();
    variant.name?.as_str().map(str::to_string)
}

/// The id of the task whose table holds `offset`, found by a lenient second reading (it
/// ignores unknown keys) and the nearest table header above `offset`.
fn enclosing_task(lines: &LineIndex<'_>, offset: usize) -> Option<String> {
    let loose: LooseJob = toml::from_str(lines.text()).ok()?;
    let task = loose
        .task?
        .into_iter()
        .take_while(|t| t.span().start <= offset)
        .last()?;
    let inside = task.span().contains(&offset) || {
        let header = lines.text()[..offset]
            .lines()
            .rev()
            .map(str::trim_start)
            .find(|l| l.starts_with('['))
            .unwrap_or("");
        let header: String = header.chars().filter(|c| !c.is_whitespace()).collect();
        ["[[task]]", "[[task.", "[task."]
            .iter()
            .any(|h| header.starts_with(h))
    };
    let id = task.into_inner().id?;
    inside.then(|| id.as_str().map(str::to_string)).flatten()
}

/// The dotted name of the plain table (`[pool]`, `[defaults]`, `[task.env]` as `env`) whose
/// header is the nearest above `offset`, to name a key in it as `pool.budget`; `None` in a
/// task's or a variant's own table (`[[task]]`), whose keys are named as they are.
fn table_of(lines: &LineIndex<'_>, offset: usize) -> Option<String> {
    let header = std::iter::once(lines.line_text(offset))
        .chain(lines.text()[..lines.line_start(offset)].lines().rev())
        .map(str::trim_start)
        .find(|l| l.starts_with('['))?;
    if header.starts_with("[[") {
        return None;
    }
    let name: String = header[1..]
        .split(']')
        .next()?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let name = name.strip_prefix("task.").unwrap_or(&name);
    (!name.is_empty() && name != "task").then(|| name.to_string())
}

/// The key of a `key = value` line when `offset` is inside the value.
fn key_before(lines: &LineIndex<'_>, offset: usize) -> Option<String> {
    let text = lines.line_text(offset);
    let col = lines.pos(offset).column - 1;
    let (key, _) = text.split_once('=')?;
    if key.chars().count() >= col {
        return None;
    }
    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
    (!key.is_empty()).then(|| key.to_string())
}

struct Cx<'a> {
    lines: &'a LineIndex<'a>,
    source: SourceMap,
    task: Option<String>,
    variant: Option<String>,
}

type PResult<T> = std::result::Result<T, Problem>;

impl Cx<'_> {
    fn err(&self, span: Range<usize>, field: &str, problem: Problem) -> CoreError {
        let mut e = JobError::new(problem).field(field);
        e.task.clone_from(&self.task);
        e.variant.clone_from(&self.variant);
        e.file = Some(self.source.file.clone());
        e.pos = Some(self.lines.pos(span.start));
        e.into()
    }

    /// Converts a spanned value, reporting failure at its line under `field`.
    fn conv<T>(
        &self,
        v: &Spanned<Value>,
        field: &str,
        f: impl FnOnce(&Value) -> PResult<T>,
    ) -> Result<T> {
        f(v.get_ref()).map_err(|p| self.err(v.span(), field, p))
    }

    fn opt<T>(
        &self,
        v: &V,
        field: &str,
        f: impl FnOnce(&Value) -> PResult<T>,
    ) -> Result<Option<T>> {
        v.as_ref().map(|v| self.conv(v, field, f)).transpose()
    }

    fn job(&mut self, raw: RawJob, file_name: &str) -> Result<JobSpec> {
        let mut top = FieldPositions::default();
        let name = match &raw.name {
            Some(v) => {
                top.fields.insert("name", self.lines.pos(v.span().start));
                self.conv(v, "name", string)?
            }
            None => Path::new(file_name)
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or(file_name)
                .to_string(),
        };
        let staging = match &raw.staging {
            Some(v) => {
                top.fields.insert("staging", self.lines.pos(v.span().start));
                self.conv(v, "staging", |v| match string(v)?.as_str() {
                    "shared" => Ok(Staging::Shared),
                    "transfer" => Ok(Staging::Transfer),
                    other => Err(Problem::BadValue {
                        value: format!("{other:?}"),
                        reason: "use \"shared\" or \"transfer\"".into(),
                    }),
                })?
            }
            None => Staging::default(),
        };
        let keep_going = match &raw.keep_going {
            Some(v) => {
                top.fields
                    .insert("keep_going", self.lines.pos(v.span().start));
                self.conv(v, "keep_going", boolean)?
            }
            None => false,
        };
        let mut defaults = Defaults::default();
        if let Some(d) = raw.defaults {
            let d = d.into_inner();
            let mut mark = |f: &'static str, v: Option<Range<usize>>| {
                if let Some(s) = v {
                    top.fields.insert(f, self.lines.pos(s.start));
                }
            };
            mark("defaults.retries", d.retries.as_ref().map(Spanned::span));
            mark("defaults.timeout", d.timeout.as_ref().map(Spanned::span));
            mark("defaults.priority", d.priority.as_ref().map(Spanned::span));
            mark(
                "defaults.resources",
                d.resources.as_ref().map(Spanned::span),
            );
            mark("defaults.env", d.env.as_ref().map(Spanned::span));
            if let Some(r) = self.opt(&d.retries, "defaults.retries", retries)? {
                defaults.retries = r;
            }
            defaults.timeout = self.opt(&d.timeout, "defaults.timeout", timeout)?;
            if let Some(p) = self.opt(&d.priority, "defaults.priority", integer)? {
                defaults.priority = p;
            }
            if let Some(r) = &d.resources {
                defaults.resources = self.resources(r, "defaults.resources")?;
            }
            if let Some(e) = &d.env {
                defaults.env = self.env(e, "defaults.env")?;
            }
        }
        let pool = match raw.pool {
            Some(p) => Some(self.pool(p.into_inner(), &mut top)?),
            None => None,
        };
        self.source.top = top;
        let mut tasks = Vec::new();
        for raw_task in raw.task.unwrap_or_default() {
            tasks.push(self.task(raw_task)?);
        }
        Ok(JobSpec {
            name,
            staging,
            keep_going,
            defaults,
            tasks,
            pool,
            source: Some(std::mem::take(&mut self.source)),
        })
    }

    fn pool(&mut self, raw: RawPool, top: &mut FieldPositions) -> Result<PoolSpec> {
        let mut mark = |f: &'static str, v: Option<Range<usize>>| {
            if let Some(s) = v {
                top.fields.insert(f, self.lines.pos(s.start));
            }
        };
        mark("pool.budget", raw.budget.as_ref().map(Spanned::span));
        mark("pool.max_price", raw.max_price.as_ref().map(Spanned::span));
        mark("pool.deadline", raw.deadline.as_ref().map(Spanned::span));
        mark("pool.verify", raw.verify.as_ref().map(Spanned::span));
        mark("pool.trust", raw.trust.as_ref().map(Spanned::span));
        mark("pool.objective", raw.objective.as_ref().map(Spanned::span));
        let mut p = PoolSpec {
            budget: self.opt(&raw.budget, "pool.budget", credits)?,
            deadline: self.opt(&raw.deadline, "pool.deadline", deadline)?,
            ..PoolSpec::default()
        };
        if let Some(m) = &raw.max_price {
            for (k, v) in m.get_ref() {
                let field = format!("pool.max_price.{k}");
                let price = Some(self.conv(v, &field, |v| {
                    non_negative_number(v, "credits per unit-hour, 0 or more")
                })?);
                match k.as_str() {
                    "cpu" => p.max_price.cpu = price,
                    "gpu" => p.max_price.gpu = price,
                    "mem_gb" => p.max_price.mem_gb = price,
                    _ => {
                        return Err(self.err(
                            v.span(),
                            &field,
                            Problem::UnknownKey {
                                expected: "`cpu`, `gpu`, `mem_gb`".into(),
                                near: crate::error::nearest_key(k, "`cpu`, `gpu`, `mem_gb`"),
                            },
                        ))
                    }
                }
            }
        }
        if let Some(v) = self.opt(&raw.verify, "pool.verify", |v| match v {
            Value::Integer(k) if (1..=9).contains(k) => Ok(Verify::Quorum(*k as u32)),
            Value::String(s) if s == "adaptive" => Ok(Verify::Adaptive),
            Value::Integer(_) | Value::String(_) => Err(Problem::BadValue {
                value: v.to_string(),
                reason: "use a number of agreeing results from 1 to 9, or \"adaptive\"".into(),
            }),
            _ => Err(type_error("1, 2, 3 … or \"adaptive\"", v)),
        })? {
            p.verify = v;
        }
        if let Some(t) = self.opt(&raw.trust, "pool.trust", |v| match string(v)?.as_str() {
            "any" => Ok(Trust::Any),
            "trusted-only" => Ok(Trust::TrustedOnly),
            other => Err(Problem::BadValue {
                value: format!("{other:?}"),
                reason: "use \"any\" or \"trusted-only\"".into(),
            }),
        })? {
            p.trust = t;
        }
        if let Some(o) = self.opt(&raw.objective, "pool.objective", |v| {
            match string(v)?.as_str() {
                "cost" => Ok(Objective::Cost),
                "time" => Ok(Objective::Time),
                "energy" => Ok(Objective::Energy),
                other => Err(Problem::BadValue {
                    value: format!("{other:?}"),
                    reason: "use \"cost\", \"time\" or \"energy\"".into(),
                }),
            }
        })? {
            p.objective = o;
        }
        Ok(p)
    }

    fn task(&mut self, raw: Spanned<RawTask>) -> Result<TaskSpec> {
        let start = raw.span();
        let raw = raw.into_inner();
        self.task = None;
        self.variant = None;
        let mut pos = TaskPositions::default();
        pos.own.start = Some(self.lines.pos(start.start));
        let id = match &raw.id {
            Some(v) => self.conv(v, "id", string)?,
            None => return Err(self.err(start, "id", Problem::Missing)),
        };
        self.task = Some(id.clone());
        let spans: [(&'static str, Option<Range<usize>>); 17] = [
            ("id", raw.id.as_ref().map(Spanned::span)),
            ("cmd", raw.cmd.as_ref().map(Spanned::span)),
            ("array", raw.array.as_ref().map(Spanned::span)),
            ("after", raw.after.as_ref().map(Spanned::span)),
            ("inputs", raw.inputs.as_ref().map(Spanned::span)),
            ("outputs", raw.outputs.as_ref().map(Spanned::span)),
            ("env", raw.env.as_ref().map(Spanned::span)),
            ("cwd", raw.cwd.as_ref().map(Spanned::span)),
            ("resources", raw.resources.as_ref().map(Spanned::span)),
            ("retries", raw.retries.as_ref().map(Spanned::span)),
            ("timeout", raw.timeout.as_ref().map(Spanned::span)),
            ("priority", raw.priority.as_ref().map(Spanned::span)),
            ("variant", raw.variant.as_ref().map(Spanned::span)),
            ("wasm", raw.wasm.as_ref().map(Spanned::span)),
            ("group", raw.group.as_ref().map(Spanned::span)),
            ("network", raw.network.as_ref().map(Spanned::span)),
            ("checkpoint", raw.checkpoint.as_ref().map(Spanned::span)),
        ];
        for (field, span) in spans {
            if let Some(s) = span {
                pos.own.fields.insert(field, self.lines.pos(s.start));
            }
        }

        let given: Vec<(&'static str, Range<usize>)> = [
            ("cmd", raw.cmd.as_ref().map(Spanned::span)),
            ("variant", raw.variant.as_ref().map(Spanned::span)),
            ("wasm", raw.wasm.as_ref().map(Spanned::span)),
        ]
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect();
        if given.len() != 1 {
            let found = given.iter().map(|(k, _)| *k).collect();
            let problem = Problem::KindConflict { found };
            return Err(match given.get(1) {
                Some((field, span)) => self.err(span.clone(), field, problem),
                None => {
                    let mut e = JobError::new(problem).task(&id);
                    e.file = Some(self.source.file.clone());
                    e.pos = Some(self.lines.pos(start.start));
                    e.into()
                }
            });
        }
        if let Some(w) = &raw.wasm {
            self.check_keys(w, "wasm", &["module", "entry", "args", "fuel", "memory"])?;
        }
        if let Some(g) = &raw.group {
            self.check_keys(g, "group", &["size"])?;
        }
        let body = if let Some(cmd) = &raw.cmd {
            TaskBody::Command(self.conv(cmd, "cmd", command)?)
        } else if let Some(w) = &raw.wasm {
            TaskBody::Wasm(self.conv(w, "wasm", wasm)?)
        } else if let Some(variants) = raw.variant {
            let mut out = Vec::new();
            for v in variants.into_inner() {
                let (spec, p) = self.variant(v)?;
                out.push(spec);
                pos.variants.push(p);
            }
            self.variant = None;
            TaskBody::Variants(out)
        } else {
            unreachable!("exactly one of cmd, variant and wasm was checked above")
        };

        let mut after = Vec::new();
        if let Some(list) = &raw.after {
            for item in list.get_ref() {
                pos.after.push(self.lines.pos(item.span().start));
                after.push(self.conv(item, "after", |v| {
                    let text = string(v)?;
                    Dependency::parse(&text).ok_or(Problem::BadDependency(text))
                })?);
            }
        }
        let task = TaskSpec {
            array: self.opt(&raw.array, "array", array)?,
            body,
            after,
            inputs: self
                .opt(&raw.inputs, "inputs", strings)?
                .unwrap_or_default(),
            outputs: self
                .opt(&raw.outputs, "outputs", strings)?
                .unwrap_or_default(),
            checkpoint: self
                .opt(&raw.checkpoint, "checkpoint", strings)?
                .unwrap_or_default(),
            env: match &raw.env {
                Some(e) => self.env(e, "env")?,
                None => BTreeMap::new(),
            },
            cwd: self.opt(&raw.cwd, "cwd", string)?,
            resources: {
                let mut r = match &raw.resources {
                    Some(r) => self.resources(r, "resources")?,
                    None => ResourceRequest::default(),
                };
                // `network = true`: the task needs the network, which only workers started
                // with `--allow-network` offer (as the custom resource `network`).
                if self.opt(&raw.network, "network", boolean)? == Some(true) {
                    r.custom.insert(NETWORK.to_string(), 1.0);
                }
                r
            },
            retries: self.opt(&raw.retries, "retries", retries)?,
            timeout: self.opt(&raw.timeout, "timeout", timeout)?,
            priority: self.opt(&raw.priority, "priority", integer)?,
            group: self.opt(&raw.group, "group", group)?,
            id,
        };
        self.source.tasks.push(pos);
        Ok(task)
    }

    fn variant(&mut self, raw: Spanned<RawVariant>) -> Result<(VariantSpec, FieldPositions)> {
        let start = raw.span();
        let raw = raw.into_inner();
        self.variant = None;
        let mut pos = FieldPositions {
            start: Some(self.lines.pos(start.start)),
            ..FieldPositions::default()
        };
        for (field, span) in [
            ("name", raw.name.as_ref().map(Spanned::span)),
            ("cmd", raw.cmd.as_ref().map(Spanned::span)),
            ("resources", raw.resources.as_ref().map(Spanned::span)),
            ("env", raw.env.as_ref().map(Spanned::span)),
        ] {
            if let Some(s) = span {
                pos.fields.insert(field, self.lines.pos(s.start));
            }
        }
        let name = match &raw.name {
            Some(v) => self.conv(v, "variant.name", string)?,
            None => return Err(self.err(start, "variant.name", Problem::Missing)),
        };
        self.variant = Some(name.clone());
        let cmd = match &raw.cmd {
            Some(v) => self.conv(v, "cmd", command)?,
            None => return Err(self.err(start, "cmd", Problem::Missing)),
        };
        let resources = match &raw.resources {
            Some(r) => self.resources(r, "resources")?,
            None => ResourceRequest::default(),
        };
        let env = match &raw.env {
            Some(e) => self.env(e, "env")?,
            None => BTreeMap::new(),
        };
        Ok((
            VariantSpec {
                name,
                cmd,
                resources,
                env,
            },
            pos,
        ))
    }

    /// Rejects keys outside `allowed` in an inline table (one read as a plain value).
    fn check_keys(&self, v: &Spanned<Value>, field: &str, allowed: &[&str]) -> Result<()> {
        let Some(t) = v.get_ref().as_table() else {
            return Ok(());
        };
        match t.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => {
                let expected = allowed
                    .iter()
                    .map(|a| format!("`{a}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let near = crate::error::nearest_key(k, &expected);
                Err(self.err(
                    v.span(),
                    &format!("{field}.{k}"),
                    Problem::UnknownKey { expected, near },
                ))
            }
            None => Ok(()),
        }
    }

    fn env(&self, map: &SpannedMap, field: &str) -> Result<BTreeMap<String, String>> {
        map.get_ref()
            .iter()
            .map(|(k, v)| Ok((k.clone(), self.conv(v, &format!("{field}.{k}"), string)?)))
            .collect()
    }

    fn resources(&self, map: &SpannedMap, field: &str) -> Result<ResourceRequest> {
        let mut r = ResourceRequest::default();
        for (k, v) in map.get_ref() {
            let f = format!("{field}.{k}");
            match k.as_str() {
                "cpus" => r.cpus = Some(self.conv(v, &f, number)?),
                "gpus" => r.gpus = Some(self.conv(v, &f, number)?),
                "mem" => r.mem = Some(self.conv(v, &f, size)?),
                "gpu_mem" => r.gpu_mem = Some(self.conv(v, &f, size)?),
                _ => {
                    if let Some(meant) = builtin_resource_meant(k) {
                        // A custom resource no worker offers would keep the task waiting.
                        return Err(self.err(
                            v.span(),
                            field,
                            Problem::BadValue {
                                value: format!("a resource named {k:?}"),
                                reason: format!(
                                    "did you mean `{meant}`? (any other name is a custom \
                                     resource, which a worker must offer)"
                                ),
                            },
                        ));
                    }
                    r.custom.insert(k.clone(), self.conv(v, &f, number)?);
                }
            }
        }
        Ok(r)
    }
}

/// The built-in resource a name most likely misspells (`cpu` for `cpus`), if any.
fn builtin_resource_meant(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase().replace('-', "_");
    Some(match n.as_str() {
        "cpu" | "cores" | "core" | "ncpus" | "num_cpus" | "threads" | "cpus" => "cpus",
        "gpu" | "ngpus" | "num_gpus" | "gpus" => "gpus",
        "memory" | "ram" | "mem_bytes" | "mem" => "mem",
        "gpumem" | "gpu_memory" | "vram" | "gpu_mem" => "gpu_mem",
        _ => return None,
    })
}

fn type_error(expected: &'static str, v: &Value) -> Problem {
    Problem::Type {
        expected,
        found: v.type_str(),
    }
}

fn string(v: &Value) -> PResult<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| type_error("a string", v))
}

fn strings(v: &Value) -> PResult<Vec<String>> {
    const WHAT: &str = "an array of strings";
    if let Some(s) = v.as_str() {
        return Err(Problem::StringForList {
            suggestion: format!("[{s:?}]"),
        });
    }
    v.as_array()
        .ok_or_else(|| type_error(WHAT, v))?
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| type_error(WHAT, s))
        })
        .collect()
}

/// A command: [`strings`], where one string gets the two ways it may have been meant (its
/// words as the program and its arguments, or a line for a shell).
fn command(v: &Value) -> PResult<Vec<String>> {
    match v.as_str() {
        Some(s) if s.split_whitespace().nth(1).is_some() => {
            let words: Vec<String> = s.split_whitespace().map(|w| format!("{w:?}")).collect();
            Err(Problem::StringForList {
                suggestion: format!(
                    "[{}] (the program, then its arguments; it is not run through a shell), or [\"sh\", \"-c\", {s:?}] for a shell line",
                    words.join(", ")
                ),
            })
        }
        _ => strings(v),
    }
}

fn integer(v: &Value) -> PResult<i64> {
    v.as_integer().ok_or_else(|| type_error("an integer", v))
}

fn non_negative<T: TryFrom<i64>>(v: &Value, expected: &'static str) -> PResult<T> {
    let n = v.as_integer().ok_or_else(|| type_error(expected, v))?;
    T::try_from(n).map_err(|_| Problem::BadValue {
        value: n.to_string(),
        reason: format!("expected {expected}"),
    })
}

fn retries(v: &Value) -> PResult<u32> {
    non_negative(v, "a non-negative integer")
}

fn boolean(v: &Value) -> PResult<bool> {
    match v {
        Value::Boolean(b) => Ok(*b),
        _ => Err(type_error("true or false", v)),
    }
}

fn number(v: &Value) -> PResult<f64> {
    match v {
        Value::Integer(i) => Ok(*i as f64),
        Value::Float(f) => Ok(*f),
        _ => Err(type_error("a number", v)),
    }
}

fn non_negative_number(v: &Value, expected: &'static str) -> PResult<f64> {
    let x = number(v).map_err(|_| type_error(expected, v))?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(Problem::BadValue {
            value: v.to_string(),
            reason: format!("expected {expected}"),
        })
    }
}

fn size(v: &Value) -> PResult<u64> {
    match v {
        Value::Integer(_) => non_negative(v, "a size in bytes"),
        Value::String(s) => parse_size(s).map_err(Problem::from_value_error),
        _ => Err(type_error("a size (\"256MiB\" or a number of bytes)", v)),
    }
}

fn duration(v: &Value) -> PResult<Duration> {
    let s = v
        .as_str()
        .ok_or_else(|| type_error("a duration string such as \"30s\"", v))?;
    parse_duration(s).map_err(Problem::from_value_error)
}

/// A task's time limit: a duration longer than 0 (a limit of 0 killed every attempt at its
/// start; no limit is written by leaving the key out).
fn timeout(v: &Value) -> PResult<Duration> {
    let d = duration(v)?;
    if d.is_zero() {
        return Err(Problem::BadValue {
            value: format!("timeout = {v}"),
            reason: "a timeout must be longer than 0 (leave it out for none)".into(),
        });
    }
    Ok(d)
}

/// A job's deadline: longer than 0 (a deadline of 0 was missed at submission).
fn deadline(v: &Value) -> PResult<Duration> {
    let d = duration(v)?;
    if d.is_zero() {
        return Err(Problem::BadValue {
            value: format!("deadline = {v}"),
            reason: "a deadline must be after the submission (leave it out for none)".into(),
        });
    }
    Ok(d)
}

/// The most credits an amount may be: the ledger's largest, in whole credits.
const MAX_CREDITS: f64 = 9_223_372_036_854.0;

/// An amount of credits, as the ledger counts them: 0 or more, at most [`MAX_CREDITS`],
/// exact to a millionth (`0.0000001` became 0, `1e30` the ledger's largest amount, and
/// `flotilla budget` refused both).
fn credits(v: &Value) -> PResult<f64> {
    let x = non_negative_number(v, "a number of credits, 0 or more")?;
    let bad = |reason: &str| Problem::BadValue {
        value: v.to_string(),
        reason: reason.into(),
    };
    if x > MAX_CREDITS {
        return Err(bad(
            "more than the ledger holds (at most 9223372036854 credits)",
        ));
    }
    let micro = x * 1e6;
    if (micro - micro.round()).abs() > 1e-6 * micro.max(1.0) {
        return Err(bad(
            "credits are counted to a millionth: at most six decimals",
        ));
    }
    Ok(x)
}

fn array(v: &Value) -> PResult<Range<u64>> {
    let text = match v {
        Value::Integer(n) => {
            return u64::try_from(*n)
                .map(|n| 0..n)
                .map_err(|_| Problem::BadRange {
                    text: n.to_string(),
                    reason: "the length is negative".into(),
                })
        }
        Value::String(s) => s.as_str(),
        _ => return Err(type_error("a range such as \"0..64\"", v)),
    };
    let bad = |reason: &str| Problem::BadRange {
        text: text.to_string(),
        reason: reason.to_string(),
    };
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| bad("expected \"start..end\", as in \"0..64\""))?;
    let (inclusive, b) = match b.strip_prefix('=') {
        Some(b) => (true, b),
        None => (false, b),
    };
    let num = |s: &str| -> PResult<u64> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad("start and end must be non-negative integers"));
        }
        s.parse().map_err(|_| bad("a bound is too large"))
    };
    let start = num(a)?;
    let mut end = num(b)?;
    if inclusive {
        end = end
            .checked_add(1)
            .ok_or_else(|| bad("a bound is too large"))?;
    }
    Ok(start..end)
}

fn group(v: &Value) -> PResult<Group> {
    let t = v
        .as_table()
        .ok_or_else(|| type_error("a table such as { size = 4 }", v))?;
    // Unknown keys are rejected by `Cx::check_keys` first.
    let size = t.get("size").ok_or(Problem::BadValue {
        value: "group".into(),
        reason: "it needs `size`".into(),
    })?;
    Ok(Group {
        size: non_negative::<u32>(size, "a group size")?,
    })
}

fn wasm(v: &Value) -> PResult<WasmSpec> {
    let t = match v {
        Value::String(s) => return Ok(WasmSpec::new(s.clone())),
        Value::Table(t) => t,
        _ => return Err(type_error("a module path or a table { module = ... }", v)),
    };
    let mut module = None;
    let mut spec = WasmSpec::new("");
    for (k, v) in t {
        match k.as_str() {
            "module" => module = Some(string(v)?),
            "entry" => spec.entry = string(v)?,
            "args" => spec.args = strings(v)?,
            "fuel" => spec.fuel = Some(non_negative(v, "a non-negative integer")?),
            "memory" => spec.memory = Some(size(v)?),
            _ => {} // Unknown keys are rejected by `Cx::check_keys` first.
        }
    }
    spec.module = module.ok_or(Problem::BadValue {
        value: "wasm".into(),
        reason: "the table needs `module`".into(),
    })?;
    Ok(spec)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
