//! Real scientific workflows (WfCommons traces of Pegasus runs, in tests/data/workflows)
//! as scaled sleeps through a coordinator and two one-CPU workers: each must succeed (every
//! task checks its parents' markers, so order is proven), and its makespan is compared with
//! the lower bound max(critical path, total work / 2).

#![allow(clippy::unwrap_used)]

mod kit;

use std::path::PathBuf;
use std::time::Duration;

use flotilla::bench::wfcommons::job_from_trace;
use kit::{assert_succeeded, Cluster};

/// Each trace is scaled so that its critical path takes this long.
const CRITICAL_PATH_S: f64 = 1.5;
/// Makespan over the lower bound allowed: process spawns on a loaded two-core machine.
const MAX_RATIO: f64 = 3.0;

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/workflows")
}

fn run_trace(file: &str) {
    let path = traces_dir().join(file);
    let json =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("trace {}: {e}", path.display()));
    let name = file.split('-').next().unwrap();
    let unscaled = job_from_trace(&json, file, name, 1.0, 0.0).unwrap();
    assert!(unscaled.critical_path > 0.0, "{file}: no runtimes");
    let scale = CRITICAL_PATH_S / unscaled.critical_path;
    let job = job_from_trace(&json, file, name, scale, 0.0).unwrap();
    assert!((job.critical_path - CRITICAL_PATH_S).abs() < 1e-6);
    let bound = job.lower_bound(2.0);

    let c = Cluster::start(2, 1);
    let id = c.submit_toml(&format!("{name}.toml"), &job.toml);
    let s = c.wait_job(id, Duration::from_secs(60 + (bound * 10.0) as u64));
    assert_succeeded(&s);
    assert_eq!(s.total as usize, job.tasks);
    // Every task left its marker.
    let markers = std::fs::read_dir(c.job_dir().join("done")).unwrap().count();
    assert_eq!(markers, job.tasks);
    let ratio = s.makespan_s / bound;
    eprintln!(
        "workflow {file}: {} tasks, scale {scale:.5}, critical path {:.2} s, work {:.2} s, \
         makespan {:.2} s, lower_bound(2.0) {bound:.2} s, ratio {ratio:.2}",
        job.tasks, job.critical_path, job.total_work, s.makespan_s
    );
    assert!(
        s.makespan_s >= bound * 0.95,
        "{file}: makespan {:.2} s beats the lower bound {bound:.2} s: the sleeps did not run",
        s.makespan_s
    );
    assert!(
        ratio <= MAX_RATIO,
        "{file}: makespan {:.2} s is {ratio:.2}× the lower bound {bound:.2} s",
        s.makespan_s
    );
}

macro_rules! trace_tests {
    ($($test:ident => $file:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run_trace($file);
            }
        )*
    };
}

trace_tests! {
    genome_1000 => "1000genome-chameleon-2ch-100k-001.json",
    cycles => "cycles-chameleon-1l-1c-9p-001.json",
    epigenomics => "epigenomics-chameleon-hep-1seq-100k-001.json",
    montage_2mass => "montage-chameleon-2mass-01d-001.json",
    montage_dss => "montage-chameleon-dss-05d-001.json",
    seismology => "seismology-chameleon-100p-001.json",
    soykb => "soykb-chameleon-10fastq-10ch-001.json",
    srasearch => "srasearch-chameleon-10a-001.json",
}
