//! The unit of work that travels through the queues.

use std::sync::Arc;

use crate::task::TaskNode;

/// A queued piece of work: a plain closure (the `spawn`/`scope` API) or a codelet task.
pub(crate) enum Job {
    /// A closure from `spawn`, `scope` or `parallel_for`.
    Closure(Box<dyn FnOnce() + Send + 'static>),
    /// A codelet task whose dependencies are satisfied.
    Task(Arc<TaskNode>),
}
