//! Test hooks that make a worker misbehave on purpose, for the pool's tests (verification,
//! deadlines): `FLOTILLA_FAULT=corrupt-outputs` flips a byte in every output it produces
//! (before it is hashed and reported: a provider returning wrong results);
//! `FLOTILLA_FAULT=slow:4` makes each task take 4× its time (the worker waits 3× the task's
//! wall time after it ends, and reports 4×). Read once when the worker starts; an unknown
//! value stops it with an error. Never set outside tests.

use std::path::Path;
use std::time::Duration;

use crate::error::{ClusterError, Result};

/// The environment variable.
pub const FAULT_VAR: &str = "FLOTILLA_FAULT";

/// A worker's deliberate fault.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Fault {
    /// None: the worker behaves.
    #[default]
    None,
    /// Every output produced gets one byte flipped.
    CorruptOutputs,
    /// Every task takes this many times its time.
    Slow(f64),
}

impl Fault {
    /// Parses a `FLOTILLA_FAULT` value.
    pub fn parse(s: &str) -> Result<Fault> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(Fault::None);
        }
        if s == "corrupt-outputs" {
            return Ok(Fault::CorruptOutputs);
        }
        if let Some(f) = s.strip_prefix("slow:") {
            if let Ok(x) = f.parse::<f64>() {
                if x.is_finite() && x >= 1.0 {
                    return Ok(Fault::Slow(x));
                }
            }
        }
        Err(ClusterError::Config(format!(
            "{FAULT_VAR}={s:?}: expected corrupt-outputs or slow:N (N ≥ 1)"
        )))
    }

    /// The fault `FLOTILLA_FAULT` asks for.
    pub fn from_env() -> Result<Fault> {
        Fault::parse(&std::env::var(FAULT_VAR).unwrap_or_default())
    }

    /// After a task that ran `wall` seconds: waits what a slow worker adds; the wall time
    /// to report.
    pub fn after_task(self, wall: f64) -> f64 {
        match self {
            Fault::Slow(x) => {
                let extra = wall * (x - 1.0);
                if extra.is_finite() && extra > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(extra.min(3600.0)));
                }
                wall * x
            }
            _ => wall,
        }
    }

    /// Before outputs are hashed: a corrupting worker flips a byte of each declared output
    /// under `root` (plain files only; an empty one gets a byte).
    pub fn before_outputs(self, root: &Path, declared: &[String]) {
        if self != Fault::CorruptOutputs {
            return;
        }
        for pat in declared {
            if crate::objects::safe_relative(pat).is_err() {
                continue;
            }
            let full = root.join(pat).display().to_string();
            let Ok(paths) = glob::glob(&full) else {
                continue;
            };
            for p in paths.flatten() {
                let plain = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_file());
                if !plain {
                    continue;
                }
                if let Ok(mut bytes) = std::fs::read(&p) {
                    let mid = bytes.len() / 2;
                    match bytes.get_mut(mid) {
                        Some(b) => *b ^= 0xff,
                        None => bytes.push(0xff),
                    }
                    let _ = std::fs::write(&p, bytes);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_hooks_and_refuses_the_rest() {
        assert_eq!(Fault::parse("").unwrap(), Fault::None);
        assert_eq!(
            Fault::parse("corrupt-outputs").unwrap(),
            Fault::CorruptOutputs
        );
        assert_eq!(Fault::parse("slow:4").unwrap(), Fault::Slow(4.0));
        for bad in ["slow:0.5", "slow:x", "explode"] {
            assert!(Fault::parse(bad)
                .unwrap_err()
                .to_string()
                .contains(FAULT_VAR));
        }
    }

    #[test]
    fn a_corrupting_worker_flips_a_byte_of_each_output() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        std::fs::write(dir.path().join("out/a.txt"), b"abc").unwrap();
        std::fs::write(dir.path().join("b.bin"), b"").unwrap();
        Fault::CorruptOutputs.before_outputs(dir.path(), &["out/*.txt".into(), "b.bin".into()]);
        assert_eq!(
            std::fs::read(dir.path().join("out/a.txt")).unwrap(),
            b"a\x9dc"
        );
        assert_eq!(std::fs::read(dir.path().join("b.bin")).unwrap(), b"\xff");
        Fault::None.before_outputs(dir.path(), &["b.bin".into()]);
        assert_eq!(std::fs::read(dir.path().join("b.bin")).unwrap(), b"\xff");
        assert_eq!(Fault::Slow(1.0).after_task(0.5), 0.5);
    }
}
