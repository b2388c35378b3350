//! Fuzzing on stable: every decoder that takes bytes from others is fed mutations of a
//! corpus kept in the repository (`tests/data/fuzz/<target>/`) and must return without
//! panicking. Each target runs `FLOTILLA_FUZZ_ITERS` inputs (500 by default, so the test
//! suite stays quick), or for `FLOTILLA_FUZZ_SECS` seconds when that is set (`.ci/run` gives
//! each 15 s). A seeded generator makes every run repeatable: `FLOTILLA_FUZZ_SEED` replays a
//! failing run, and the input that made a target panic is written under
//! `target/fuzz-crashes/` (add it to the corpus and make it a unit test).
//!
//! cargo-fuzz needs the nightly toolchain, which CI machines do not have; this harness is
//! coverage-blind but structure-aware (token insertions for the text formats, splices
//! between corpus entries, integers at their edges). The worker-facing targets go past the
//! decoders into the coordinator's state machine (`flotilla_cluster::fuzz`).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Strings worth inserting into the text formats.
const TOKENS: &[&str] = &[
    "[[task]]\n",
    "[defaults]\n",
    "[pool]\n",
    "id = \"x\"\n",
    "after = [\"x\"]\n",
    "array = \"0..4294967295\"\n",
    "array = \"5..2\"\n",
    "array = \"0..3:0\"\n",
    "cmd = []\n",
    "wasm = \"\"\n",
    "inputs = [\"../../etc/passwd\"]\n",
    "outputs = [\"/abs\"]\n",
    "resources = { cpus = -1, mem = \"99999999999TiB\" }\n",
    "timeout = \"0s\"\n",
    "retries = 4294967295\n",
    "priority = -9223372036854775808\n",
    "gang = 0\n",
    "deadline = \"1e308h\"\n",
    "budget = nan\n",
    "{{",
    "}}",
    "\"\\u0000\"",
    "\u{feff}",
    "\"tasks\": [",
    "\"parents\": [\"",
    "\"runtime\": -1e308,",
    "\"runtimeInSeconds\": 1e400,",
    "null",
    "[",
    "]",
    "{",
    "}",
    ",",
];

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/fuzz")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus {} is missing: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    assert!(!seeds.is_empty(), "empty corpus {}", dir.display());
    seeds
}

/// One mutation of `input` (a seed or an earlier mutation).
fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, seeds: &[Vec<u8>], text: bool) {
    let n = rng.gen_range(1..=4);
    for _ in 0..n {
        let len = input.len();
        match rng.gen_range(0..9) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] = *[0u8, 0xff, 0x7f, 0x80, b'"', b'\n', b'0', b'9']
                    .get(rng.gen_range(0..8))
                    .unwrap();
            }
            2 => {
                let i = rng.gen_range(0..=len);
                let k = rng.gen_range(1..16);
                let bytes: Vec<u8> = (0..k).map(|_| rng.gen::<u8>()).collect();
                input.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let a = rng.gen_range(0..len);
                let b = rng.gen_range(a..=len.min(a + 64));
                input.drain(a..b);
            }
            4 if len > 0 => {
                let a = rng.gen_range(0..len);
                let b = rng.gen_range(a..=len.min(a + 64));
                let chunk = input[a..b].to_vec();
                let at = rng.gen_range(0..=len);
                input.splice(at..at, chunk);
            }
            5 => {
                let other = &seeds[rng.gen_range(0..seeds.len())];
                if !other.is_empty() {
                    let a = rng.gen_range(0..other.len());
                    let b = rng.gen_range(a..=other.len());
                    let at = rng.gen_range(0..=len);
                    input.splice(at..at, other[a..b].iter().copied());
                }
            }
            6 if len > 0 => input.truncate(rng.gen_range(0..len)),
            7 if text => {
                let t = TOKENS[rng.gen_range(0..TOKENS.len())].as_bytes();
                let at = rng.gen_range(0..=len);
                input.splice(at..at, t.iter().copied());
            }
            _ if len >= 4 => {
                // An integer field at its edges (varints and length prefixes).
                let i = rng.gen_range(0..len - 3);
                let v: [u8; 4] = *[[0xff; 4], [0; 4], [0x80, 0x80, 0x80, 0x80], [0x7f, 0, 0, 0]]
                    .get(rng.gen_range(0..4))
                    .unwrap();
                input[i..i + 4].copy_from_slice(&v);
            }
            _ => {}
        }
        if input.len() > 1 << 20 {
            input.truncate(1 << 20);
        }
    }
}

/// Runs `target` on its seeds, then on mutations of them, until the budget is spent.
fn fuzz(name: &str, text: bool, target: fn(&[u8])) {
    let seeds = corpus(name);
    let seed: u64 = std::env::var("FLOTILLA_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let secs: Option<f64> = std::env::var("FLOTILLA_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok());
    let iters: u64 = std::env::var("FLOTILLA_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let run = |input: &[u8], i: u64| {
        let r = std::panic::catch_unwind(|| target(input));
        if r.is_err() {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-crashes");
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{name}-{seed}-{i}"));
            let _ = std::fs::write(&file, input);
            panic!(
                "fuzz target {name} panicked on input {i} (FLOTILLA_FUZZ_SEED={seed}); the input is in {}",
                file.display()
            );
        }
    };
    for (i, s) in seeds.iter().enumerate() {
        run(s, i as u64);
    }
    let mut done = 0u64;
    loop {
        let over = match secs {
            Some(s) => started.elapsed() >= Duration::from_secs_f64(s),
            None => done >= iters,
        };
        if over {
            break;
        }
        let mut input = seeds[rng.gen_range(0..seeds.len())].clone();
        // Stack a few rounds: deep mutations reach past the first check.
        for _ in 0..rng.gen_range(1..4) {
            mutate(&mut rng, &mut input, &seeds, text);
        }
        run(&input, done);
        done += 1;
    }
    eprintln!(
        "fuzz {name}: {} inputs in {:.1} s (seed {seed})",
        done + seeds.len() as u64,
        started.elapsed().as_secs_f64()
    );
}

fn job_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(spec) = flotilla::core::parse_job(&text, "fuzz.toml") {
        if let Ok(graph) = spec.expand() {
            let _ = graph.len();
        }
        let _ = flotilla::core::parse_job(&spec.to_toml(), "again.toml");
    }
}

fn wfcommons(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = flotilla::bench::wfcommons::job_from_trace(&text, "fuzz.json", "fuzz", 0.001, 0.0);
}

fn dag(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = flotilla::sched::parse_dag(&text);
}

#[test]
fn fuzz_the_job_file_parser() {
    fuzz("job", true, job_file);
}

#[test]
fn fuzz_the_worker_messages_the_coordinator_decodes() {
    fuzz(
        "worker_message",
        false,
        flotilla::cluster::fuzz::worker_message,
    );
}

#[test]
fn fuzz_the_registrations_the_coordinator_decodes() {
    fuzz("register", false, flotilla::cluster::fuzz::register);
}

#[test]
fn fuzz_the_commands_a_worker_decodes() {
    fuzz(
        "coordinator_message",
        false,
        flotilla::cluster::fuzz::coordinator_message,
    );
}

#[test]
fn fuzz_the_journal_reader() {
    fuzz("journal", false, flotilla::cluster::fuzz::journal);
}

#[test]
fn fuzz_the_framed_object_codec() {
    fuzz("framed", false, flotilla::cluster::fuzz::framed);
}

#[test]
fn fuzz_the_workflow_trace_reader() {
    fuzz("wfcommons", true, wfcommons);
}

#[test]
fn fuzz_the_simulator_dag_reader() {
    fuzz("dag", true, dag);
}

/// Writes the seeds of the binary corpora (real messages and a real journal, made by the
/// code that makes them) into `tests/data/fuzz/`: run again after a protocol change.
#[test]
#[ignore = "writes the corpus into the repository"]
fn write_the_binary_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    for (target, name, bytes) in flotilla::cluster::fuzz::seeds() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
