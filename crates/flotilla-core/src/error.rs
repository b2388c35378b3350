//! Errors: one enum for the crate, [`CoreError`], and its [`Result`] alias.
//!
//! Job-file errors are a [`JobError`]: where (file, line, column), what (task, variant,
//! field) and the [`Problem`]. Its `Display` reads like
//! `job.toml:12: task "stitch": field "after": no task named "tiles"`.

use std::fmt;

use crate::resources::Resources;

/// The result of everything in this crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

/// Everything that can go wrong in `flotilla-core`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// A job file (or a job spec built in code) is invalid.
    #[error("{0}")]
    Job(Box<JobError>),
    /// A duration string such as `"5m"` could not be parsed.
    #[error("invalid duration {input:?}: {reason}")]
    InvalidDuration {
        /// The text that was given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A byte size such as `"256MiB"` could not be parsed.
    #[error("invalid size {input:?}: {reason}")]
    InvalidSize {
        /// The text that was given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
}

impl CoreError {
    /// The job error inside, if this is one.
    pub fn as_job(&self) -> Option<&JobError> {
        match self {
            CoreError::Job(e) => Some(e),
            _ => None,
        }
    }
}

impl From<JobError> for CoreError {
    fn from(e: JobError) -> Self {
        CoreError::Job(Box::new(e))
    }
}

/// A position in a source file, both 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// Line, counting from 1.
    pub line: usize,
    /// Column in characters, counting from 1.
    pub column: usize,
}

/// An invalid job: where it is, which task and field, and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct JobError {
    /// The file the job came from; `None` for a spec built in code or received over the wire.
    pub file: Option<String>,
    /// Where in the file, when known.
    pub pos: Option<Pos>,
    /// The task's id, when the error is about one task.
    pub task: Option<String>,
    /// The variant's name, when the error is about one variant.
    pub variant: Option<String>,
    /// The field, dotted for nested keys (`"resources.mem"`, `"defaults.timeout"`).
    pub field: Option<String>,
    /// What is wrong.
    pub problem: Problem,
}

impl JobError {
    /// An error with only a problem; the builder methods add the rest.
    pub fn new(problem: Problem) -> Self {
        JobError {
            file: None,
            pos: None,
            task: None,
            variant: None,
            field: None,
            problem,
        }
    }

    /// Sets the task.
    pub fn task(mut self, task: impl Into<String>) -> Self {
        self.task = Some(task.into());
        self
    }

    /// Sets the variant.
    pub fn variant(mut self, variant: impl Into<String>) -> Self {
        self.variant = Some(variant.into());
        self
    }

    /// Sets the field.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The line, when known.
    pub fn line(&self) -> Option<usize> {
        self.pos.map(|p| p.line)
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.pos) {
            (Some(file), Some(pos)) => write!(f, "{file}:{}: ", pos.line)?,
            (Some(file), None) => write!(f, "{file}: ")?,
            (None, Some(pos)) => write!(f, "line {}: ", pos.line)?,
            (None, None) => {}
        }
        if let Some(task) = &self.task {
            write!(f, "task {task:?}: ")?;
        }
        if let Some(variant) = &self.variant {
            write!(f, "variant {variant:?}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "field {field:?}: ")?;
        }
        write!(f, "{}", self.problem)
    }
}

impl std::error::Error for JobError {}

fn did_you_mean(near: &Option<String>) -> String {
    near.as_ref()
        .map(|k| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default()
}

/// The key among `expected` (backquoted words, as the TOML reader lists them) that `key` is
/// likely a typo of: the most alike, if alike enough (Jaro-Winkler above 0.8, as `resource`
/// is to `resources`).
pub(crate) fn nearest_key(key: &str, expected: &str) -> Option<String> {
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|k| (strsim::jaro_winkler(key, k), k))
        .filter(|(score, k)| *score > 0.8 && *k != key)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.to_string())
}

/// What is wrong with a job.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    /// TOML syntax, or a value of the wrong shape caught by the TOML reader.
    #[error("{0}")]
    Toml(String),
    /// A key the job format does not have.
    #[error("unknown key{}, expected one of {expected}", did_you_mean(.near))]
    UnknownKey {
        /// The keys allowed there, as the TOML reader lists them.
        expected: String,
        /// The allowed key it is nearest to, if one is near (a typo: `resource`).
        near: Option<String>,
    },
    /// A required key is absent.
    #[error("missing")]
    Missing,
    /// A value has the wrong type.
    #[error("expected {expected}, found {found}")]
    Type {
        /// What the field takes.
        expected: &'static str,
        /// The TOML type that was given.
        found: &'static str,
    },
    /// One string where a list of strings is read (`outputs = "a.txt"`, `cmd = "echo hi"`).
    #[error("expected an array of strings, found a string: write {suggestion}")]
    StringForList {
        /// How the list is written, with the string given.
        suggestion: String,
    },
    /// A value has the right type but is not allowed.
    #[error("{value} is not allowed: {reason}")]
    BadValue {
        /// The value, as written.
        value: String,
        /// What is allowed instead.
        reason: String,
    },
    /// A name (task id, variant name, resource name) has characters outside
    /// letters, digits, `-` and `_`, or is empty.
    #[error("invalid name {0:?}: use letters, digits, '-' and '_'")]
    BadName(String),
    /// Two tasks share an id.
    #[error("duplicate task id {id:?}{}", first_line.map(|l| format!(" (first defined on line {l})")).unwrap_or_default())]
    DuplicateTask {
        /// The id.
        id: String,
        /// Where the first task with this id is, when known.
        first_line: Option<usize>,
    },
    /// An `array` range that is empty, reversed or not a range.
    #[error("invalid range {text:?}: {reason}")]
    BadRange {
        /// The range as written.
        text: String,
        /// Why it was rejected.
        reason: String,
    },
    /// Too many task instances.
    #[error("{count} instances is more than the limit of {max}")]
    TooManyInstances {
        /// How many the job or array would have.
        count: u128,
        /// The limit.
        max: u64,
    },
    /// Too many dependency edges after expansion.
    #[error(
        "the dependencies expand to {count} edges, more than the limit of {max}; \
         depend on single elements (\"task[3]\") instead of whole arrays"
    )]
    TooManyEdges {
        /// How many edges the job would have.
        count: u128,
        /// The limit.
        max: u64,
    },
    /// An `after` entry that is not `name` or `name[index]`.
    #[error("invalid dependency {0:?}: expected \"task\" or \"task[index]\"")]
    BadDependency(String),
    /// `after` names a task that does not exist.
    #[error("no task named {0:?}")]
    NoSuchTask(String),
    /// `after` indexes a task that is not an array.
    #[error("{dep:?} indexes task {task:?}, which is not an array")]
    NotAnArray {
        /// The entry as written.
        dep: String,
        /// The task it names.
        task: String,
    },
    /// `after` names an array element that does not exist.
    #[error("{dep:?} is out of range: {task:?} has indices {start}..{end}")]
    IndexOutOfRange {
        /// The entry as written.
        dep: String,
        /// The array task it names.
        task: String,
        /// First index of the array.
        start: u64,
        /// One past the last index.
        end: u64,
    },
    /// A task lists itself in `after`.
    #[error("a task cannot depend on itself")]
    SelfDependency,
    /// The dependencies form a cycle. `a -> b` means `b` runs after `a`; the first and last
    /// names are the same.
    #[error("dependency cycle: {}", path.join(" -> "))]
    Cycle {
        /// The tasks (or instances) on the cycle, the first repeated at the end.
        path: Vec<String>,
    },
    /// A task with none, or more than one, of `cmd`, `variant` and `wasm`.
    #[error(
        "a task needs exactly one of \"cmd\", \"variant\" and \"wasm\"; found {}",
        if found.is_empty() { "none".to_string() } else { found.join(" and ") }
    )]
    KindConflict {
        /// The keys that were given.
        found: Vec<&'static str>,
    },
    /// A command with no elements.
    #[error("the command is empty")]
    EmptyCommand,
    /// A command whose program (first element) is the empty string.
    #[error("the program (first element) is empty")]
    EmptyProgram,
    /// A task with `variant = []`.
    #[error("at least one variant is required")]
    NoVariants,
    /// Two variants of one task share a name.
    #[error("duplicate variant name {0:?}")]
    DuplicateVariant(String),
    /// A resource amount that is negative, NaN or infinite.
    #[error("{name} = {amount} is not allowed: amounts must be finite and not negative")]
    BadAmount {
        /// The resource.
        name: String,
        /// The amount given.
        amount: f64,
    },
    /// A gang (`group`) of size zero.
    #[error("group size must be at least 1")]
    ZeroGroupSize,
    /// An array whose length is not a multiple of its gang size.
    #[error("the array has {count} instances, not a multiple of the group size {size}: every gang needs {size}")]
    GroupSize {
        /// The gang size.
        size: u32,
        /// The array's length.
        count: u64,
    },
    /// `{i}` used in a task that is not an array.
    #[error("\"{{i}}\" is only replaced in array tasks; add `array = \"0..n\"` or remove it")]
    IndexOutsideArray,
    /// An invalid duration.
    #[error("invalid duration {input:?}: {reason}")]
    Duration {
        /// The text.
        input: String,
        /// Why.
        reason: String,
    },
    /// An invalid byte size.
    #[error("invalid size {input:?}: {reason}")]
    Size {
        /// The text.
        input: String,
        /// Why.
        reason: String,
    },
    /// A task's resources exceed every capacity offered.
    #[error("needs {needs}, which exceeds every capacity offered{}", capacities_note(.offered))]
    Unsatisfiable {
        /// What the task asks for (defaults merged).
        needs: Resources,
        /// How many capacities were offered.
        offered: usize,
    },
    /// A gang's members together exceed the one machine offered (`flotilla run`).
    #[error("a gang of {size} needs {needs} for each member, all at once, side by side")]
    GangTooLarge {
        /// Its members.
        size: u32,
        /// What each member asks for (defaults merged; its smallest variant's).
        needs: Resources,
    },
    /// No variant of a task fits any capacity offered.
    #[error("no variant fits any capacity offered{}: {}", capacities_note(.offered),
        needs.iter().map(|(n, r)| format!("{n} needs {r}")).collect::<Vec<_>>().join("; "))]
    NoVariantFits {
        /// Each variant's name and needs (defaults merged).
        needs: Vec<(String, Resources)>,
        /// How many capacities were offered.
        offered: usize,
    },
}

fn capacities_note(offered: &usize) -> String {
    if *offered == 0 {
        " (none were offered)".to_string()
    } else {
        format!(" ({offered} offered)")
    }
}

impl Problem {
    /// Turns a duration or size parse error into the matching problem.
    pub(crate) fn from_value_error(e: CoreError) -> Problem {
        match e {
            CoreError::InvalidDuration { input, reason } => Problem::Duration { input, reason },
            CoreError::InvalidSize { input, reason } => Problem::Size { input, reason },
            CoreError::Job(j) => j.problem,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_line_task_and_field() {
        let mut e = JobError::new(Problem::NoSuchTask("tiles".into()))
            .task("stitch")
            .field("after");
        e.file = Some("job.toml".into());
        e.pos = Some(Pos {
            line: 12,
            column: 9,
        });
        assert_eq!(
            e.to_string(),
            r#"job.toml:12: task "stitch": field "after": no task named "tiles""#
        );
        let c = CoreError::from(e.clone());
        assert_eq!(c.to_string(), e.to_string());
        assert_eq!(c.as_job().and_then(JobError::line), Some(12));
    }

    #[test]
    fn display_without_location_starts_with_task() {
        let e = JobError::new(Problem::SelfDependency)
            .task("a")
            .field("after");
        assert_eq!(
            e.to_string(),
            r#"task "a": field "after": a task cannot depend on itself"#
        );
    }
}
