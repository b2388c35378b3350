//! `flotilla trace JOB`: the job's attempts as a Chrome/Perfetto trace, one span per
//! attempt (retries included), on one process per worker and one track per slot; and
//! `flotilla run JOB --trace FILE`.

#![allow(clippy::unwrap_used)]

mod kit;

use std::collections::HashMap;
use std::time::Duration;

use kit::Cluster;

fn spans(doc: &serde_json::Value) -> Vec<&serde_json::Value> {
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

#[test]
fn a_trace_has_one_span_per_attempt_on_its_workers_tracks() {
    let c = Cluster::start(2, 2);
    let job = c.submit_toml(
        "traced.toml",
        r#"
name = "traced"
[defaults]
retries = 1
[[task]]
id = "t"
array = "0..6"
cmd = ["sh", "-c", "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done"]
[[task]]
id = "flaky"
after = ["t"]
cmd = ["sh", "-c", "test -f flaky.once || { touch flaky.once; exit 1; }"]
"#,
    );
    let s = c.wait_job(job, Duration::from_secs(60));
    kit::assert_succeeded(&s);

    let file = c.job_dir().join("trace.json");
    let out = c.cli(&[
        "trace",
        &job.0.to_string(),
        "-o",
        &file.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let xs = spans(&doc);
    // Each t[i] ran once, the flaky one twice: one span per attempt that ran. (An attempt
    // taken back before it started, when an idle worker steals it, has no span: the one
    // that ran is then attempt 2.)
    let mut names: Vec<String> = xs
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..6)
        .map(|i| {
            let t = kit::task(&s, &format!("t[{i}]"));
            assert_eq!(t.failures, 0, "{} failed", t.name);
            format!("t[{i}] #{}", t.attempts)
        })
        .collect();
    want.extend(["flaky #1".to_string(), "flaky #2".to_string()]);
    want.sort();
    assert_eq!(names, want, "{doc}");
    let outcome = |n: &str| {
        xs.iter()
            .find(|e| e["name"] == n)
            .map(|e| e["args"]["outcome"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(outcome("flaky #1"), "failed");
    assert_eq!(outcome("flaky #2"), "succeeded");
    // Spans sit on named worker processes; no two spans overlap on one track.
    let named: Vec<u64> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    let mut tracks: HashMap<(u64, u64), Vec<(u64, u64)>> = HashMap::new();
    for e in &xs {
        let pid = e["pid"].as_u64().unwrap();
        assert!(named.contains(&pid), "span on an unnamed worker: {e}");
        let (ts, dur) = (e["ts"].as_u64().unwrap(), e["dur"].as_u64().unwrap());
        tracks
            .entry((pid, e["tid"].as_u64().unwrap()))
            .or_default()
            .push((ts, ts + dur));
    }
    for (track, mut v) in tracks {
        v.sort();
        for w in v.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlapping spans on {track:?}: {v:?}");
        }
    }
    // The flaky task ran after every t[i] had ended.
    let end_of_t = xs
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("t["))
        .map(|e| e["ts"].as_u64().unwrap() + e["dur"].as_u64().unwrap())
        .max()
        .unwrap();
    let flaky_start = xs
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("flaky"))
        .map(|e| e["ts"].as_u64().unwrap())
        .min()
        .unwrap();
    assert!(
        flaky_start + 50_000 >= end_of_t,
        "{flaky_start} < {end_of_t}"
    );
    assert_eq!(doc["otherData"]["partial"], false);

    // Unknown job: a clear error.
    let out = c.cli(&["trace", "999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job"));
}

#[test]
fn run_writes_the_trace_it_is_asked_for() {
    let (dir, out) = kit::run_local(
        "name = \"local\"\n[[task]]\nid = \"a\"\narray = \"0..4\"\ncmd = [\"true\"]\n",
        &["--trace", "t.json"],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("t.json")).unwrap()).unwrap();
    assert_eq!(spans(&doc).len(), 4, "{doc}");
}

#[test]
fn transfer_staging_shows_each_attempts_inputs_as_a_transfer_span() {
    let c = Cluster::start(2, 1);
    let job = c.submit_toml(
        "moved.toml",
        r#"
name = "moved"
staging = "transfer"
[[task]]
id = "make"
cmd = ["sh", "-c", "mkdir -p out && head -c 1048576 /dev/zero > out/data.bin"]
outputs = ["out/data.bin"]
[[task]]
id = "use"
after = ["make"]
inputs = ["out/data.bin"]
cmd = ["sh", "-c", "test $(wc -c < out/data.bin) -eq 1048576"]
"#,
    );
    let s = c.wait_job(job, Duration::from_secs(60));
    kit::assert_succeeded(&s);
    let out = c.cli(&["trace", &job.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let xs = spans(&doc);
    let fetch = xs
        .iter()
        .find(|e| e["cat"] == "transfer" && e["name"] == "use #1 inputs")
        .unwrap_or_else(|| panic!("no transfer span for use: {doc}"));
    assert_eq!(fetch["args"]["bytes"], 1_048_576, "{fetch}");
    let run = xs.iter().find(|e| e["name"] == "use #1").unwrap();
    // The fetch ends where the run starts, on the same track.
    assert_eq!(fetch["pid"], run["pid"]);
    assert_eq!(fetch["tid"], run["tid"]);
    assert_eq!(
        fetch["ts"].as_u64().unwrap() + fetch["dur"].as_u64().unwrap(),
        run["ts"].as_u64().unwrap()
    );
}
