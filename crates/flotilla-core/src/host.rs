//! Two facts about this machine that several crates name things by: the host name and
//! Flotilla's home folder. They live here, in the one crate every other depends on, so each
//! is read one way. This is the only module of `flotilla-core` that looks outside the
//! process (an environment variable, one file under `/proc`); it writes nothing.

use std::path::PathBuf;

/// This machine's host name (from `/proc/sys/kernel/hostname`), or `"localhost"` when it
/// cannot be read or is empty.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Flotilla's home folder, where learned performance models and compiled kernels are kept:
/// `$FLOTILLA_HOME`, else `$HOME/.flotilla`; `None` when neither is set (an empty value
/// counts as unset). Nothing is created.
pub fn flotilla_home() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    match set("FLOTILLA_HOME") {
        Some(h) => Some(PathBuf::from(h)),
        None => set("HOME").map(|h| PathBuf::from(h).join(".flotilla")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_name_is_never_empty() {
        assert!(!hostname().is_empty());
        assert!(!hostname().contains('\n'));
    }
}
