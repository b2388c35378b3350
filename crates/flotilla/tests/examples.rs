//! Every shipped example runs as a user would run it (`flotilla run examples/NAME/job.toml`),
//! on a copy of its folder, and its outputs are checked: what the README promises works.

#![allow(clippy::unwrap_used)]

mod kit;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kit::BIN;

/// The examples folder of the repository.
fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Copies `examples/NAME` (its committed files: no outputs or state of earlier runs) into a
/// fresh temporary folder and returns the copy's path.
fn copy_example(name: &str, skip: &[&str]) -> (tempfile::TempDir, PathBuf) {
    fn copy(from: &Path, to: &Path, skip: &[&str]) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name == ".flotilla" || skip.contains(&name.as_ref()) {
                continue;
            }
            let (src, dst) = (e.path(), to.join(&*name));
            if e.file_type().unwrap().is_dir() {
                copy(&src, &dst, skip);
            } else {
                std::fs::copy(&src, &dst).unwrap();
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    copy(&examples().join(name), &dir, skip);
    (tmp, dir)
}

/// `flotilla run job.toml` in `dir`, two CPUs, no GPU; panics with its output unless it
/// succeeded.
fn run(dir: &Path) -> Output {
    run_with(dir, &[])
}

/// [`run`] with more arguments.
fn run_with(dir: &Path, more: &[&str]) -> Output {
    let out = Command::new(BIN)
        .args(["run", "job.toml", "--cpus", "2", "--gpus", "none"])
        .args(more)
        .current_dir(dir)
        .env("FLOTILLA_HOME", dir.join(".home"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "flotilla run {}/job.toml failed\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
}

#[test]
fn mandelbrot_renders_a_png() {
    let (_tmp, dir) = copy_example("mandelbrot", &["tiles", "mandel.png", "mandel.pgm"]);
    run(&dir);
    let png = std::fs::read(dir.join("mandel.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (512, 512));
    // Decoded by another implementation (Python's zlib): every row is there, and the
    // picture is the set (black inside, light outside), not a blank.
    let check = r#"
import struct, sys, zlib
b = open(sys.argv[1], "rb").read()
pos, idat = 8, b""
while pos < len(b):
    n, kind = struct.unpack(">I4s", b[pos:pos + 8])
    body = b[pos + 4:pos + 8 + n]
    assert zlib.crc32(body) & 0xFFFFFFFF == struct.unpack(">I", b[pos + 8 + n:pos + 12 + n])[0], kind
    if kind == b"IDAT":
        idat += b[pos + 8:pos + 8 + n]
    pos += 12 + n
raw = zlib.decompress(idat)
assert len(raw) == 512 * 513, len(raw)
px = bytes(raw[y * 513 + 1 + x] for y in range(512) for x in range(512))
black = sum(1 for p in px if p == 0) / len(px)
light = sum(1 for p in px if p > 200) / len(px)
print(f"{black:.3f} {light:.3f}")
assert 0.1 < black < 0.6 and light > 0.3, (black, light)
"#;
    let out = Command::new("python3")
        .args(["-c", check])
        .arg(dir.join("mandel.png"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn wordcount_counts_the_licences() {
    let (_tmp, dir) = copy_example("wordcount", &["counts", "top.txt"]);
    run(&dir);
    let top = read(&dir, "top.txt");
    let mut lines = top.lines();
    let head = lines.next().unwrap();
    assert!(head.starts_with("# ") && head.contains("files"), "{top}");
    // English licence texts: "the" is the commonest word.
    let first: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(first[1], "the", "{top}");
    assert!(first[0].parse::<u64>().unwrap() > 100, "{top}");
}

/// `flotilla run --json` into a pipe: standard output is the job's status document alone
/// (the progress lines, printed there when it is not a terminal, broke it).
#[test]
fn run_json_prints_the_status_document_alone() {
    let (_tmp, dir) = copy_example("wordcount", &["counts", "top.txt"]);
    let out = run_with(&dir, &["--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let doc: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    assert_eq!(doc["state"], "succeeded", "{doc}");
    assert_eq!(doc["counts"]["done"], doc["total"], "{doc}");
    // The progress went to standard error.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tasks done"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sweep_collects_every_point() {
    let (_tmp, dir) = copy_example("sweep", &["results", "sweep.csv"]);
    run(&dir);
    let csv = read(&dir, "sweep.csv");
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "point,omega,energy,device");
    assert_eq!(rows.len(), 25, "{csv}");
    for (i, row) in rows[1..].iter().enumerate() {
        let f: Vec<&str> = row.split(',').collect();
        assert_eq!(f[0], i.to_string(), "{row}");
        assert!(f[2].parse::<f64>().unwrap().is_finite(), "{row}");
        assert_eq!(f[3], "cpu", "no GPU here: {row}");
    }
}

#[test]
fn pool_estimates_pi() {
    let (_tmp, dir) = copy_example("pool", &["hits", "state", "pi.txt"]);
    let out = run(&dir);
    let pi: f64 = read(&dir, "pi.txt").trim().parse().unwrap();
    assert!((pi - std::f64::consts::PI).abs() < 0.01, "pi = {pi}");
    // On one's own machine a pool job runs on the operator's worker, free of charge.
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("operator's own worker"), "{summary}");
}

#[test]
fn train_runs_as_a_gang_and_both_ranks_agree() {
    // The trainer is the workspace's `flotilla-train` binary, built beside this one by
    // `cargo test --workspace`; the job file names the release build, as its README says.
    let trainer = Path::new(BIN).with_file_name("flotilla-train");
    assert!(
        trainer.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` (or `cargo build -p \
         flotilla-train` first)",
        trainer.display()
    );
    let (_tmp, dir) = copy_example("train", &["checkpoints", "target", "src", "tests"]);
    let job = read(&dir, "job.toml");
    assert!(job.contains("../../target/release/flotilla-train"), "{job}");
    let job = job.replace(
        "../../target/release/flotilla-train",
        &trainer.display().to_string(),
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
    run(&dir);
    assert!(dir.join("checkpoints/step-000000000300.ckpt").is_file());
    // `flotilla logs --state` reads the finished run's logs: both ranks end on the same
    // parameters, having learnt the digits.
    let mut finals = Vec::new();
    for rank in 0..2 {
        let out = Command::new(BIN)
            .args([
                "logs",
                "--state",
                ".flotilla",
                "1",
                &format!("train[{rank}]"),
            ])
            .current_dir(&dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let last = text
            .lines()
            .rfind(|l| l.starts_with("final step 300 "))
            .unwrap_or_else(|| panic!("rank {rank}: no final line in\n{text}"))
            .to_string();
        let accuracy: f64 = last
            .split_whitespace()
            .skip_while(|w| *w != "test_accuracy")
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(accuracy > 0.8, "{last}");
        finals.push(last);
    }
    assert_eq!(finals[0], finals[1]);
}

#[test]
fn every_example_is_tested_here() {
    let tested = ["mandelbrot", "pool", "sweep", "train", "wordcount"];
    let mut found: Vec<String> = std::fs::read_dir(examples())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("job.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, tested, "a new example needs its test in this file");
}
