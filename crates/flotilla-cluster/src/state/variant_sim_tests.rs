//! Variant choice pays off (issue: GPUs, "a sweep whose tasks have both variants must finish
//! sooner on a CPU+GPU worker than with either variant alone"): the coordinator's own
//! placement, driven in virtual time with calibrated costs, on one worker with 4 CPUs and 1 GPU.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use flotilla_core::parse_job;
use flotilla_sched::PerfModel;

use super::tests::{assigns, config, wspec};
use super::*;

const CPU_S: f64 = 4.0;
const GPU_S: f64 = 1.0;
const POINTS: usize = 48;

/// A running attempt: (finish ms, task, attempt, variant, cpus and gpus in thousandths).
type Running = (u64, TaskRef, u32, String, u64, u64);

fn sweep(variants: &[&str]) -> String {
    let mut s = format!("name = \"sweep\"\n[[task]]\nid = \"point\"\narray = \"0..{POINTS}\"\n");
    for v in variants {
        let res = if *v == "gpu" {
            "{ gpus = 1, cpus = 1 }"
        } else {
            "{ cpus = 1 }"
        };
        s.push_str(&format!(
            "[[task.variant]]\nname = \"{v}\"\ncmd = [\"run\", \"--{v}\"]\nresources = {res}\n"
        ));
    }
    s
}

/// Runs the sweep to the end in virtual time; returns (makespan in seconds, tasks per variant).
fn makespan(variants: &[&str], queue_depth: usize) -> (f64, usize, usize) {
    let mut c = Coordinator::new(config(queue_depth));
    // Calibrated: three measurements of each variant on this hardware class.
    let mut model = PerfModel::new();
    for _ in 0..3 {
        model.record("sweep/point/cpu", "gpu", 0, CPU_S);
        model.record("sweep/point/gpu", "gpu", 0, GPU_S);
    }
    c.set_perf_model(model);
    let mut out = Vec::new();
    let w = c.next_worker_id();
    c.handle(
        0,
        Event::WorkerJoined {
            worker: w,
            spec: wspec(4.0, &[80 << 30]),
            running: Vec::new(),
            held: Vec::new(),
            previous: None,
        },
        &mut out,
    )
    .expect("a valid worker");
    let job = c.next_job_id();
    c.handle(
        0,
        Event::JobSubmitted {
            job,
            spec: parse_job(&sweep(variants), "sweep.toml").expect("a valid job"),
            dir: "/j".into(),
            tenant: "t".into(),
        },
        &mut out,
    )
    .expect("a valid job");
    // The worker, emulated: it starts what it was given in order, when it fits.
    let (mut free_cpus, mut free_gpus) = (4.0f64, 1.0f64);
    let mut queue: std::collections::VecDeque<(TaskRef, u32, String, f64, f64)> =
        std::collections::VecDeque::new();
    let mut running: BinaryHeap<Reverse<Running>> = BinaryHeap::new();
    let (mut on_cpu, mut on_gpu) = (0, 0);
    let mut now = 0u64;
    loop {
        let done = out.iter().any(|c| {
            matches!(
                c,
                Command::Notify(Notification::JobFinished {
                    state: JobState::Succeeded,
                    ..
                })
            )
        });
        if done {
            return (now as f64 / 1000.0, on_cpu, on_gpu);
        }
        for (_, a) in assigns(&out) {
            let v = a.variant.clone().expect("a variant");
            queue.push_back((a.task, a.attempt, v, a.resources.cpus, a.resources.gpus));
        }
        out.clear();
        let mut i = 0;
        while i < queue.len() {
            let (task, attempt, v, cpus, gpus) = queue[i].clone();
            if cpus > free_cpus + 1e-9 || gpus > free_gpus + 1e-9 {
                i += 1;
                continue;
            }
            queue.remove(i);
            free_cpus -= cpus;
            free_gpus -= gpus;
            let cost = if v == "gpu" { GPU_S } else { CPU_S };
            if v == "gpu" {
                on_gpu += 1;
            } else {
                on_cpu += 1;
            }
            c.handle(
                now,
                Event::TaskStarted {
                    worker: w,
                    task,
                    attempt,
                },
                &mut out,
            )
            .expect("the coordinator agrees it fits");
            running.push(Reverse((
                now + (cost * 1000.0) as u64,
                task,
                attempt,
                v,
                (cpus * 1000.0) as u64,
                (gpus * 1000.0) as u64,
            )));
        }
        if !out.is_empty() {
            continue; // starts may free room for more assignments
        }
        let Some(Reverse((t, task, attempt, v, cpus, gpus))) = running.pop() else {
            panic!("nothing running and the job is not done");
        };
        now = t;
        free_cpus += cpus as f64 / 1000.0;
        free_gpus += gpus as f64 / 1000.0;
        let wall = if v == "gpu" { GPU_S } else { CPU_S };
        c.handle(
            now,
            Event::TaskFinished {
                worker: w,
                task,
                attempt,
                result: AttemptResult {
                    outcome: AttemptOutcome::Succeeded,
                    usage: Usage {
                        cpu_seconds: wall,
                        peak_rss_bytes: 0,
                        wall_seconds: wall,
                        ..Default::default()
                    },
                    outputs: Vec::new(),
                    variant: Some(v),
                },
            },
            &mut out,
        )
        .expect("a valid finish");
    }
}

#[test]
fn a_sweep_with_both_variants_beats_either_variant_alone() {
    // Without and with batched dispatch (tasks queued on the worker beyond what is free).
    for depth in [0, 2] {
        let (cpu_only, n_cpu, _) = makespan(&["cpu"], depth);
        let (gpu_only, _, n_gpu) = makespan(&["gpu"], depth);
        let (both, mixed_cpu, mixed_gpu) = makespan(&["gpu", "cpu"], depth);
        // 48 points: 4 CPUs × 4 s → 48 s; 1 GPU × 1 s → 48 s; together the GPU takes most
        // of them (1 task/s) and the 3 CPUs left (one drives the GPU) add 0.75 task/s.
        assert_eq!((n_cpu, n_gpu), (POINTS, POINTS));
        assert!((cpu_only - 48.0).abs() < 1e-6, "cpu only {cpu_only}");
        assert!((gpu_only - 48.0).abs() < 1e-6, "gpu only {gpu_only}");
        assert_eq!(mixed_cpu + mixed_gpu, POINTS);
        assert!(
            mixed_cpu > 0 && mixed_gpu > mixed_cpu,
            "{mixed_cpu} on CPUs, {mixed_gpu} on the GPU"
        );
        let bound = POINTS as f64 / (1.0 / GPU_S + 3.0 / CPU_S);
        assert!(
            both < 0.7 * cpu_only.min(gpu_only) && both <= bound + CPU_S,
            "queue depth {depth}: both variants {both} s ({mixed_cpu} cpu + {mixed_gpu} gpu), cpu only {cpu_only} s, gpu only {gpu_only} s, bound {bound:.1} s"
        );
        eprintln!(
            "queue depth {depth}, sweep of {POINTS}: cpu only {cpu_only} s, gpu only {gpu_only} s, both {both} s ({mixed_cpu} cpu + {mixed_gpu} gpu; lower bound {bound:.1} s)"
        );
    }
}
