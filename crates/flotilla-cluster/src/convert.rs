//! Conversions between the wire types (`proto`) and the pure states' types (the
//! coordinator's and the agent's). The only place that knows both.

use flotilla_core::{JobId, Resources, TaskId, WorkerId};

use crate::agent::{Attempt, Work};
use crate::proto;
use crate::state::{self, AssignedKind, AttemptOutcome, AttemptResult, Event, TaskRef};

pub(crate) fn key(task: TaskRef, attempt: u32) -> proto::TaskKey {
    proto::TaskKey {
        job: task.job.0,
        task: task.task.0,
        attempt,
    }
}

pub(crate) fn task_key(k: &proto::TaskKey) -> (TaskRef, u32) {
    (
        TaskRef {
            job: JobId::new(k.job),
            task: TaskId::new(k.task),
        },
        k.attempt,
    )
}

pub(crate) fn resources_to_proto(r: &Resources) -> proto::ResourceSet {
    proto::ResourceSet {
        cpus: r.cpus,
        gpus: r.gpus,
        mem: r.mem,
        gpu_mem: r.gpu_mem,
        custom: r
            .custom
            .iter()
            .map(|(n, a)| proto::CustomResource {
                name: n.clone(),
                amount: *a,
            })
            .collect(),
    }
}

pub(crate) fn resources_from_proto(r: &proto::ResourceSet) -> Resources {
    let mut out = Resources::zero();
    out.cpus = r.cpus;
    out.gpus = r.gpus;
    out.mem = r.mem;
    out.gpu_mem = r.gpu_mem;
    out.custom = r
        .custom
        .iter()
        .map(|c| (c.name.clone(), c.amount))
        .collect();
    out
}

pub(crate) fn object_from(o: &proto::Object) -> state::ObjectRef {
    state::ObjectRef {
        path: o.path.clone(),
        hash: o.hash.clone(),
        size: o.size,
    }
}

fn object_to(o: &state::ObjectRef) -> proto::Object {
    proto::Object {
        path: o.path.clone(),
        hash: o.hash.clone(),
        size: o.size,
    }
}

/// The event of a registration; `previous` is the id the worker proved it had before (its
/// claims on that id's attempts and outputs are taken only then).
pub(crate) fn worker_joined(
    worker: WorkerId,
    req: proto::RegisterRequest,
    previous: Option<WorkerId>,
) -> Event {
    let resources = req
        .resources
        .as_ref()
        .map(resources_from_proto)
        .unwrap_or_else(Resources::zero);
    let spec = state::WorkerSpec {
        name: req.name,
        hostname: req.hostname,
        hw_class: req.hw_class,
        resources,
        gpus: req
            .gpus
            .iter()
            .map(|g| state::GpuInfo {
                index: g.index,
                model: g.model.clone(),
                mem_bytes: g.mem_bytes,
            })
            .collect(),
        data_addr: req.data_addr,
        provider: None,
        price: flotilla_pool::Price::default(),
        availability: req.availability,
        preemptible: req.preemptible,
        unavailable: req.unavailable,
        cpu_watts: if req.cpu_watts.is_finite() && req.cpu_watts >= 0.0 {
            req.cpu_watts
        } else {
            0.0
        },
    };
    let running = req.running.iter().map(task_key).collect();
    let held = req
        .held
        .iter()
        .filter_map(|h| {
            let (t, _) = task_key(h.task.as_ref()?);
            Some((t, object_from(h.object.as_ref()?)))
        })
        .collect();
    Event::WorkerJoined {
        worker,
        spec,
        running,
        held,
        previous,
    }
}

pub(crate) fn task_finished(worker: WorkerId, r: proto::TaskResult) -> Option<Event> {
    let (task, attempt) = task_key(r.task.as_ref()?);
    let outcome = match proto::task_result::Outcome::try_from(r.outcome) {
        Ok(proto::task_result::Outcome::Succeeded) => state::AttemptOutcome::Succeeded,
        Ok(proto::task_result::Outcome::Cancelled) => state::AttemptOutcome::Cancelled,
        Ok(proto::task_result::Outcome::Preempted) => state::AttemptOutcome::Preempted {
            checkpoint: r
                .checkpoint
                .iter()
                .map(|c| state::ObjectRef {
                    path: c.path.clone(),
                    hash: c.hash.clone(),
                    size: c.size,
                })
                .collect(),
        },
        _ => state::AttemptOutcome::Failed {
            message: r.message.clone(),
            retryable: r.retryable,
        },
    };
    let usage = r
        .usage
        .map(|u| state::Usage {
            cpu_seconds: u.cpu_seconds,
            peak_rss_bytes: u.peak_rss_bytes,
            wall_seconds: u.wall_seconds,
            energy_j: u.energy_j.filter(|e| e.is_finite() && *e >= 0.0),
            energy_estimated: u.energy_estimated,
            fuel: u.fuel,
        })
        .unwrap_or_default();
    Some(Event::TaskFinished {
        worker,
        task,
        attempt,
        result: state::AttemptResult {
            outcome,
            usage,
            outputs: r.outputs.iter().map(object_from).collect(),
            variant: (!r.variant.is_empty()).then_some(r.variant),
        },
    })
}

pub(crate) fn assignment(a: state::Assignment) -> proto::Assignment {
    let mut out = proto::Assignment {
        task: Some(key(a.task, a.attempt)),
        name: a.name,
        job_name: a.job_name,
        job_dir: a.job_dir,
        transfer: a.staging == flotilla_core::Staging::Transfer,
        variant: a.variant.unwrap_or_default(),
        resources: Some(resources_to_proto(&a.resources)),
        gpu_indices: a.gpu_indices,
        timeout_ms: a.timeout_ms,
        index: a.index,
        // The checkpoint to resume from comes from the coordinator (`from` empty).
        inputs: a
            .inputs
            .iter()
            .map(|(o, from)| (o, from.as_str()))
            .chain(a.resume.iter().map(|o| (o, "")))
            .map(|(o, from)| proto::Input {
                object: Some(object_to(o)),
                from: from.to_string(),
                ticket: String::new(),
                from_cert: String::new(),
            })
            .collect(),
        outputs: a.outputs,
        after: a.after.map(|(t, attempt)| key(t, attempt)),
        checkpoint: a.checkpoint,
        gang: a.gang.map(|g| proto::GangInfo {
            rank: g.rank,
            size: g.size,
            key: g.key,
            local_rank: g.local_rank,
            local_size: g.local_size,
            master_addr: g.master_addr,
            master_port: u32::from(g.master_port),
        }),
        ..Default::default()
    };
    let env = |env: Vec<(String, String)>| -> Vec<proto::EnvVar> {
        env.into_iter()
            .map(|(name, value)| proto::EnvVar { name, value })
            .collect()
    };
    match a.kind {
        AssignedKind::Command { cmd, env: e, cwd } => {
            out.cmd = cmd;
            out.env = env(e);
            out.cwd = cwd.unwrap_or_default();
        }
        AssignedKind::Wasm {
            module,
            entry,
            args,
            env: e,
            fuel,
            memory,
        } => {
            out.wasm_module = module;
            out.wasm_entry = entry;
            out.wasm_args = args;
            out.env = env(e);
            out.wasm_fuel = fuel;
            out.wasm_memory = memory;
        }
    }
    out
}

/// An assignment as the agent's state sees it, the wire form kept as what to run. `None`
/// without a task key (nothing could be reported about it).
pub(crate) fn work(a: proto::Assignment) -> Option<Work<Box<proto::Assignment>>> {
    let key = task_key(a.task.as_ref()?);
    Some(Work {
        key,
        need: a
            .resources
            .as_ref()
            .map(resources_from_proto)
            .unwrap_or_else(Resources::zero),
        gpus: a.gpu_indices.clone(),
        after: a.after.as_ref().map(task_key),
        payload: Box::new(a),
    })
}

/// An attempt's end as the worker reports it.
pub(crate) fn task_result(k: Attempt, r: AttemptResult) -> proto::TaskResult {
    use proto::task_result::Outcome;
    let mut checkpoint = Vec::new();
    let (outcome, message, retryable) = match r.outcome {
        AttemptOutcome::Succeeded => (Outcome::Succeeded, String::new(), false),
        AttemptOutcome::Cancelled => (Outcome::Cancelled, "cancelled".to_string(), false),
        AttemptOutcome::Failed { message, retryable } => (Outcome::Failed, message, retryable),
        AttemptOutcome::Preempted { checkpoint: files } => {
            // The bytes are added by the worker's shell (they are not the state's).
            checkpoint = files
                .iter()
                .map(|o| proto::CheckpointFile {
                    path: o.path.clone(),
                    hash: o.hash.clone(),
                    size: o.size,
                    data: Vec::new(),
                })
                .collect();
            (Outcome::Preempted, "preempted".to_string(), false)
        }
    };
    proto::TaskResult {
        task: Some(key(k.0, k.1)),
        outcome: outcome as i32,
        message,
        retryable,
        usage: Some(proto::Usage {
            cpu_seconds: r.usage.cpu_seconds,
            peak_rss_bytes: r.usage.peak_rss_bytes,
            wall_seconds: r.usage.wall_seconds,
            energy_j: r.usage.energy_j,
            energy_estimated: r.usage.energy_estimated,
            fuel: r.usage.fuel,
        }),
        outputs: r.outputs.iter().map(object_to).collect(),
        variant: r.variant.unwrap_or_default(),
        checkpoint,
        // Added by the worker's shell, which timed the staging.
        stage_seconds: 0.0,
        stage_bytes: 0,
    }
}
