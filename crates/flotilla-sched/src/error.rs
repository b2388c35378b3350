//! The crate's error type.

/// Everything that can fail in `flotilla-sched`: parsing a DAG or a performance model,
/// checking a schedule, or a policy giving a decision the simulator cannot carry out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// The DAG text is not valid JSON or does not have the expected shape.
    #[error("invalid dag json: {0}")]
    DagJson(#[source] serde_json::Error),
    /// The DAG names no processor.
    #[error("dag has no processors")]
    NoProcessors,
    /// Two processors have the same name.
    #[error("duplicate processor `{0}` in dag")]
    DuplicateProcessor(String),
    /// The DAG's bandwidth is zero, negative or not finite.
    #[error("dag bandwidth must be a finite number > 0, got {0}")]
    Bandwidth(f64),
    /// Two tasks have the same id.
    #[error("duplicate task id `{0}` in dag")]
    DuplicateTask(String),
    /// A task does not give one cost per processor.
    #[error("task `{task}` has {got} costs but the dag has {expected} processors")]
    CostArity {
        /// The task's id.
        task: String,
        /// The number of processors.
        expected: usize,
        /// The number of costs given.
        got: usize,
    },
    /// A task's cost is negative or not finite.
    #[error(
        "task `{task}` has cost {cost} on processor `{processor}`; costs must be finite and >= 0"
    )]
    BadCost {
        /// The task's id.
        task: String,
        /// The processor's name.
        processor: String,
        /// The offending cost.
        cost: f64,
    },
    /// An edge names a task that the DAG does not define.
    #[error("edge {edge} ({from} -> {to}) names unknown task `{unknown}`")]
    UnknownTask {
        /// The edge's position in the `edges` list (0-based).
        edge: usize,
        /// The edge's `from`.
        from: String,
        /// The edge's `to`.
        to: String,
        /// The id that is not a task.
        unknown: String,
    },
    /// The same edge appears twice.
    #[error("duplicate edge {from} -> {to} in dag")]
    DuplicateEdge {
        /// The edge's `from`.
        from: String,
        /// The edge's `to`.
        to: String,
    },
    /// An edge's data size is negative or not finite.
    #[error("edge {from} -> {to} has data {data}; data must be finite and >= 0")]
    BadData {
        /// The edge's `from`.
        from: String,
        /// The edge's `to`.
        to: String,
        /// The offending size.
        data: f64,
    },
    /// The edges form a cycle; the tasks of one cycle are listed in order.
    #[error("dag has a cycle: {}", cycle_text(.0))]
    Cycle(Vec<String>),
    /// The DAG has more processors than a policy's `valid_on` bitmask can describe.
    #[error("dag has {0} processors; the simulator supports at most 64")]
    TooManyProcessors(usize),
    /// A performance model's JSON is invalid.
    #[error("invalid performance model json: {0}")]
    ModelJson(#[source] serde_json::Error),
    /// A performance model was written by an unknown format version.
    #[error("unsupported performance model version {0} (expected 1)")]
    ModelVersion(u32),
    /// A performance model entry holds impossible statistics.
    #[error("invalid performance model entry ({codelet}, {arch}, {footprint}): {reason}")]
    ModelEntry {
        /// The entry's codelet.
        codelet: String,
        /// The entry's architecture.
        arch: String,
        /// The entry's footprint.
        footprint: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A policy name is not one of the built-in policies.
    #[error("unknown policy `{0}` (expected eager, ws, random, dmda or heft)")]
    UnknownPolicy(String),
    /// A policy placed a task on a unit that does not exist or cannot run it.
    #[error("policy `{policy}` placed task `{task}` on unit {unit}, which cannot run it")]
    BadDecision {
        /// The policy's name.
        policy: String,
        /// The task's id.
        task: String,
        /// The unit's index.
        unit: usize,
    },
    /// The simulation stopped with tasks that never ran (a policy left them unreachable).
    #[error("simulation with policy `{policy}` stalled: {left} tasks never ran")]
    Stalled {
        /// The policy's name.
        policy: String,
        /// How many tasks did not run.
        left: usize,
    },
    /// A schedule breaks a rule of its DAG.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(#[from] ScheduleViolation),
}

/// One way a [`Schedule`](crate::Schedule) can contradict its [`Dag`](crate::Dag).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleViolation {
    /// A placement names a task the DAG does not have.
    #[error("placement of unknown task `{0}`")]
    UnknownTask(String),
    /// A placement names a processor the DAG does not have.
    #[error("task `{task}` placed on unknown processor `{processor}`")]
    UnknownProcessor {
        /// The task's id.
        task: String,
        /// The processor's name.
        processor: String,
    },
    /// A task is placed more than once.
    #[error("task `{0}` is placed more than once")]
    Duplicate(String),
    /// A task is not placed.
    #[error("task `{0}` is not placed")]
    Missing(String),
    /// A placement's length is not the task's cost on its processor.
    #[error("task `{task}` runs {got} on `{processor}` but costs {expected} there")]
    Duration {
        /// The task's id.
        task: String,
        /// The processor's name.
        processor: String,
        /// The task's cost.
        expected: f64,
        /// `end - start` in the schedule.
        got: f64,
    },
    /// A task starts before time 0.
    #[error("task `{task}` starts at {start} < 0")]
    NegativeStart {
        /// The task's id.
        task: String,
        /// Its start.
        start: f64,
    },
    /// A task starts before an input from a predecessor has arrived.
    #[error("task `{task}` starts at {start} but its input from `{pred}` arrives at {arrival}")]
    Dependency {
        /// The task's id.
        task: String,
        /// The predecessor's id.
        pred: String,
        /// The task's start.
        start: f64,
        /// When the predecessor's data reaches the task's processor.
        arrival: f64,
    },
    /// Two tasks overlap on one processor.
    #[error("tasks `{first}` and `{second}` overlap on processor `{processor}`")]
    Overlap {
        /// The processor's name.
        processor: String,
        /// The task that starts first.
        first: String,
        /// The task that starts before `first` ends.
        second: String,
    },
    /// The makespan is not the latest end.
    #[error("makespan is {got} but the last task ends at {expected}")]
    Makespan {
        /// The latest end.
        expected: f64,
        /// The schedule's makespan.
        got: f64,
    },
}

fn cycle_text(cycle: &[String]) -> String {
    let mut text = cycle.join(" -> ");
    if let Some(first) = cycle.first() {
        text.push_str(" -> ");
        text.push_str(first);
    }
    text
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, SchedError>;
