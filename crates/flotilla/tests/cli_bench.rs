//! The `flotilla` binary: `simulate` and `bench` end to end, as a user runs them.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn flotilla(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env(
            "FLOTILLA_HOME",
            std::env::temp_dir().join(format!("flotilla-cli-test-{}", std::process::id())),
        )
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn paper_dag() -> String {
    format!(
        "{}/../flotilla-sched/tests/data/topcuoglu2002.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn simulate_reproduces_the_heft_paper_example() {
    let (ok, out, err) = flotilla(&[
        "simulate",
        "--dag",
        &paper_dag(),
        "--policy",
        "heft",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["policy"], "heft");
    assert_eq!(v["makespan"], 80.0);
    // As text, rounded (it printed `2499.6240000000003`), with the task count.
    let (ok, text, err) = flotilla(&["simulate", "--dag", &paper_dag(), "--policy", "heft"]);
    assert!(ok, "{err}");
    assert!(
        text.starts_with("policy heft: makespan 80.000 (10 tasks)\n"),
        "{text}"
    );
    assert_eq!(v["placements"].as_array().unwrap().len(), 10);
    for p in v["placements"].as_array().unwrap() {
        assert!(p["task"].is_string() && p["processor"].is_string());
        assert!(p["end"].as_f64().unwrap() >= p["start"].as_f64().unwrap());
    }
}

#[test]
fn simulate_runs_every_policy() {
    for policy in ["dmda", "eager", "ws", "random"] {
        let (ok, out, err) = flotilla(&[
            "simulate",
            "--dag",
            &paper_dag(),
            "--policy",
            policy,
            "--json",
        ]);
        assert!(ok, "{policy}: {err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        // No policy can beat the critical path on the fastest processors (t1→t3→t7→t10
        // at the per-task minimum costs is 9+11+7+7 = 34).
        assert!(v["makespan"].as_f64().unwrap() >= 34.0, "{policy}: {out}");
    }
}

#[test]
fn simulate_runs_the_cluster_s_own_placement() {
    let (ok, out, err) = flotilla(&["simulate", "--dag", &paper_dag(), "--cluster", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["policy"], "cluster");
    assert_eq!(v["placements"].as_array().unwrap().len(), 10);
    // The binary checked the schedule against the DAG; it cannot beat the critical path.
    assert!(v["makespan"].as_f64().unwrap() >= 34.0, "{out}");
    let procs: std::collections::BTreeSet<&str> = v["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["processor"].as_str().unwrap())
        .collect();
    assert!(procs.len() > 1, "one worker per processor, all used: {out}");
}

#[test]
fn simulate_rejects_a_cyclic_dag_with_the_cycle_named() {
    let dir = std::env::temp_dir().join(format!("flotilla-cli-cycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("cycle.json");
    std::fs::write(
        &f,
        r#"{"processors": ["p"], "bandwidth": 1, "tasks": [{"id": "a", "cost": [1]}, {"id": "b", "cost": [1]}],
            "edges": [{"from": "a", "to": "b", "data": 1}, {"from": "b", "to": "a", "data": 1}]}"#,
    )
    .unwrap();
    let (ok, _, err) = flotilla(&["simulate", "--dag", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("cycle") && err.contains("cycle.json"), "{err}");
    let f2 = dir.join("arity.json");
    std::fs::write(&f2, r#"{"processors": ["p", "q"], "bandwidth": 1, "tasks": [{"id": "a", "cost": [1]}], "edges": []}"#).unwrap();
    let (ok, _, err) = flotilla(&["simulate", "--dag", f2.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("`a`") && err.contains("2 processors"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bench_overhead_prints_one_json_line_with_the_ratio() {
    for deps in ["none", "chain"] {
        let (ok, out, err) = flotilla(&[
            "bench", "overhead", "--tasks", "2000", "--deps", deps, "--reps", "1", "--json",
        ]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let ours = v["ns_per_task"].as_f64().unwrap();
        let rayon = v["rayon_ns_per_task"].as_f64().unwrap();
        assert!(ours > 0.0 && rayon > 0.0);
        assert!((v["ratio"].as_f64().unwrap() - ours / rayon).abs() < 1e-9);
        assert!(v["codelet_ns_per_task"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn bench_cholesky_and_gemm_report_accurate_results() {
    let (ok, out, err) = flotilla(&[
        "bench", "cholesky", "--n", "256", "--tile", "64", "--reps", "1", "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["residual"].as_f64().unwrap() < 1e-12, "{out}");
    assert!(v["gflops"].as_f64().unwrap() > 0.0);
    // 4 tiles per side: 4 potrf + 6 trsm + 6 syrk + 4 gemm.
    assert_eq!(v["tasks_per_kind"]["cpu"], 20);
    let (ok, out, err) = flotilla(&[
        "bench",
        "gemm",
        "--n",
        "128",
        "--tile",
        "32",
        "--reps",
        "1",
        "--precision",
        "f32",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["residual"].as_f64().unwrap() < 1e-5, "{out}");
    assert_eq!(v["tasks_per_kind"]["cpu"], 64);
    // Mixed precision: the product in bf16 is measurably less accurate than in f32.
    let (ok, out, err) = flotilla(&[
        "bench",
        "gemm",
        "--n",
        "128",
        "--tile",
        "32",
        "--reps",
        "1",
        "--precision",
        "bf16",
        "--json",
    ]);
    assert!(ok, "{err}");
    let w: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(w["precision"], "bf16");
    let (f32_res, bf16_res) = (
        v["residual"].as_f64().unwrap(),
        w["residual"].as_f64().unwrap(),
    );
    assert!(bf16_res > 100.0 * f32_res && bf16_res < 1e-2, "{out}");
}

#[test]
fn bench_allreduce_on_device_memory_checks_and_reports_its_staging() {
    for (memory, chunk, overlap) in [
        ("cpu-device", "0", "false"),
        ("cpu-device", "65536", "false"),
        ("cpu-device", "65536", "true"),
    ] {
        let (ok, out, err) = flotilla(&[
            "bench",
            "allreduce",
            "--ranks",
            "2",
            "--bytes",
            "4KiB,1MiB",
            "--rounds",
            "1",
            "--memory",
            memory,
            "--chunk-bytes",
            chunk,
            "--overlap",
            overlap,
            "--json",
        ]);
        assert!(ok, "{err}");
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        for v in &lines {
            assert_eq!(v["memory"], memory);
            assert_eq!(v["pinned"], true, "the host device pins: {v}");
            assert!(v["busbw_gbs"].as_f64().unwrap() > 0.0);
        }
        // The last call (1 MiB) went through the pipeline when a chunk was forced.
        let want = if chunk == "0" { 0 } else { 65536 };
        assert_eq!(lines[1]["chunk_bytes"], want, "{out}");
        assert_eq!(
            lines[1]["overlap"],
            chunk != "0" && overlap == "true",
            "{out}"
        );
    }
    let (ok, _, err) = flotilla(&["bench", "allreduce", "--memory", "tpu"]);
    assert!(!ok);
    assert!(err.contains("tpu"), "{err}");
}

#[test]
fn bench_rejects_bad_arguments_clearly() {
    let (ok, _, err) = flotilla(&["bench", "cholesky", "--n", "100", "--tile", "64"]);
    assert!(!ok);
    assert!(err.contains("not a multiple"), "{err}");
    let (ok, _, err) = flotilla(&["bench", "cholesky", "--devices", "tpu"]);
    assert!(!ok);
    assert!(err.contains("tpu"), "{err}");
}

#[test]
fn devices_lists_what_discovery_found_and_why_others_were_skipped() {
    let (ok, out, err) = flotilla(&["devices", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let devices = v["devices"].as_array().unwrap();
    for d in devices {
        assert!(d["kind"] == "opencl" || d["kind"] == "cuda", "{d}");
        assert!(d["memory_bytes"].as_u64().unwrap() > 0);
    }
    let skipped = v["skipped"].as_array().unwrap();
    // Either GPUs are listed (with their PCI address, from the driver) or the reason there
    // are none is.
    let cuda_reason = skipped.iter().any(|s| {
        let s = s.as_str().unwrap();
        s == "no CUDA driver" || s.starts_with("cuda")
    });
    let gpus: Vec<&serde_json::Value> = devices.iter().filter(|d| d["kind"] == "cuda").collect();
    assert!(cuda_reason || !gpus.is_empty(), "{out}");
    for g in gpus {
        assert!(g["pci_bus_id"].is_string(), "{g}");
    }
    let (ok, text, err) = flotilla(&["devices"]);
    assert!(ok, "{err}");
    assert!(
        text.contains("skipped:") || text.contains("compute units"),
        "{text}"
    );
}

#[test]
fn bench_copy_measures_pageable_pinned_and_peer_paths() {
    let (ok, out, err) = flotilla(&[
        "bench",
        "copy",
        "--device",
        "cpu-device",
        "--mib",
        "4",
        "--reps",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let points: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let paths: Vec<(String, String)> = points
        .iter()
        .map(|p| {
            (
                p["direction"].as_str().unwrap().to_string(),
                p["memory"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("h2d", "pageable"),
        ("d2h", "pageable"),
        ("h2d", "pinned"),
        ("d2h", "pinned"),
        ("peer", "device"),
    ];
    assert_eq!(
        paths,
        want.map(|(d, m)| (d.to_string(), m.to_string())).to_vec(),
        "{out}"
    );
    for p in &points {
        assert_eq!(p["bytes"], 4 << 20);
        assert!(p["gbs"].as_f64().unwrap() > 0.0, "{p}");
    }
    let (ok, _, err) = flotilla(&["bench", "copy", "--device", "tpu"]);
    assert!(!ok);
    assert!(err.contains("tpu"), "{err}");
}

/// `--devices opencl` is the device alone: no CPU worker takes a task; `cpu,opencl` mixes.
#[test]
fn bench_devices_name_the_units_that_run_tasks() {
    let (ok, out, err) = flotilla(&[
        "bench",
        "cholesky",
        "--n",
        "256",
        "--tile",
        "64",
        "--devices",
        "opencl",
        "--reps",
        "1",
        "--json",
    ]);
    if !ok {
        let required = std::env::var("FLOTILLA_REQUIRE_OPENCL").is_ok_and(|v| v == "1");
        assert!(!required && err.contains("no opencl device"), "{err}");
        eprintln!("skipping: no OpenCL device ({err})");
        return;
    }
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["cpus"], 0, "{out}");
    assert_eq!(v["tasks_per_kind"]["opencl"], 20, "{out}");
    assert!(v["tasks_per_kind"].get("cpu").is_none(), "{out}");
    assert!(v["residual"].as_f64().unwrap() < 1e-12, "{out}");
    let (ok, out, err) = flotilla(&[
        "bench",
        "cholesky",
        "--n",
        "256",
        "--tile",
        "64",
        "--devices",
        "cpu,opencl",
        "--cpus",
        "1",
        "--reps",
        "1",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["cpus"], 1, "{out}");
}
