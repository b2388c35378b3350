//! The coordinator's state machine and one agent state per worker, wired by
//! [`ClusterSim`](crate::sim::ClusterSim) as the sessions wire them (assignments, cancels and
//! retractions down; starts, finishes and returns up), with random jobs, random workers (GPUs
//! shared and whole), random durations (so random finish orders), failures and retries. Both
//! sides keep their own ledger: the agent must never refuse what the coordinator placed (they
//! agree on what fits), the agent's ledger never exceeds the worker (the simulation checks
//! both after every step), and every job ends.

use flotilla_core::parse_job;
use proptest::prelude::*;

use super::*;
use crate::sim::{ClusterSim, Start};
use crate::state::{Config, GpuInfo, JobState, WorkerSpec};

fn worker_spec(i: usize, cpus: f64, gpus: usize) -> WorkerSpec {
    WorkerSpec {
        name: format!("w{i}"),
        hostname: "host".into(),
        hw_class: if gpus == 0 { "cpu" } else { "gpu" }.into(),
        resources: Resources {
            cpus,
            mem: 8 << 30,
            ..Resources::zero()
        },
        gpus: (0..gpus)
            .map(|g| GpuInfo {
                index: g as u32,
                model: "test".into(),
                mem_bytes: 16 << 30,
            })
            .collect(),
        data_addr: format!("w{i}"),
        ..WorkerSpec::default()
    }
}

/// A job of `n` tasks in layers: task i depends on a random earlier one (or none), needs a
/// random amount of CPUs, and some use a GPU share, whole GPUs, or GPU memory only.
fn job_text(tasks: &[(Option<usize>, u8, u8)]) -> String {
    let mut s = String::from("[defaults]\nretries = 3\n");
    for (i, (after, cpus, gpu)) in tasks.iter().enumerate() {
        s.push_str(&format!("[[task]]\nid = \"t{i}\"\ncmd = [\"x\"]\n"));
        if let Some(a) = after.filter(|&a| a < i) {
            s.push_str(&format!("after = [\"t{a}\"]\n"));
        }
        let gpus = match gpu {
            0 => String::new(),
            1 => ", gpus = 0.5, gpu_mem = \"4GiB\"".into(),
            // GPU memory and no GPU: counts against the worker's GPU memory in all.
            3 => ", gpu_mem = \"12GiB\"".into(),
            _ => ", gpus = 1".into(),
        };
        s.push_str(&format!("resources = {{ cpus = {cpus}{gpus} }}\n"));
    }
    s
}

fn run(workers: &[(u8, u8)], tasks: &[(Option<usize>, u8, u8)], fates: &[u8]) {
    let mut sim = ClusterSim::new(Config {
        retry_backoff_ms: 0,
        max_backoff_ms: 0,
        reconcile_grace_ms: 0,
        queue_depth: 2,
        chain_depth: 4,
        ..Config::default()
    });
    for (i, &(cpus, gpus)) in workers.iter().enumerate() {
        sim.add_worker(worker_spec(i, f64::from(cpus), usize::from(gpus)))
            .expect("a valid offer");
    }
    let spec = parse_job(&job_text(tasks), "job.toml").expect("a valid job");
    let job = sim.submit(spec).expect("accepted");
    // How long each attempt takes and how it ends, as the fates say: the finish orders vary,
    // most succeed.
    let mut fate = fates.iter().cycle();
    let mut duration = |_: &Start<'_>| {
        let f = *fate.next().expect("cycle");
        let outcome = if f % 7 == 3 {
            AttemptOutcome::Failed {
                message: "exit 1".into(),
                retryable: true,
            }
        } else {
            AttemptOutcome::Succeeded
        };
        Ok((1 + u64::from(f % 13) * 7, outcome))
    };
    // The simulation fails on an agent refusing what the coordinator placed, on an agent's
    // ledger over its worker, and on a run that does not end.
    if let Err(e) = sim.run(100_000, &mut duration) {
        panic!("{e}");
    }
    let status = sim.coordinator().job_status(job).expect("known job");
    assert_ne!(
        status.state,
        JobState::Running,
        "the job hangs: {:?}",
        status
            .tasks
            .iter()
            .map(|t| (&t.name, t.state))
            .collect::<Vec<_>>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_coordinator_and_its_agents_agree_on_what_fits_and_every_job_ends(
        workers in prop::collection::vec((1u8..5, 0u8..3), 1..4),
        tasks in prop::collection::vec(
            (prop::option::weighted(0.6, 0usize..40), 1u8..3, prop::sample::select(vec![0u8, 0, 0, 1, 2, 3])),
            1..40,
        ),
        fates in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        // Every task must fit some worker, or the job is refused: give the first worker
        // room for the largest request.
        let mut workers = workers;
        workers[0].0 = workers[0].0.max(2);
        if tasks.iter().any(|t| t.2 > 0) {
            workers[0].1 = workers[0].1.max(1);
        }
        run(&workers, &tasks, &fates);
    }
}
