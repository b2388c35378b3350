//! Puts the git commit the binary is built from into `FLOTILLA_GIT_COMMIT` (for
//! `flotilla --version`): its short hash, or `unknown` outside a git checkout (a source
//! tarball).

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=FLOTILLA_GIT_COMMIT={commit}");
    // Rebuilt when HEAD moves: HEAD itself (a checkout) and the branch it names (a commit).
    let git = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
    let head = git.join("HEAD");
    if head.is_file() {
        println!("cargo:rerun-if-changed={}", head.display());
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let Some(branch) = text.trim().strip_prefix("ref: ") {
                println!("cargo:rerun-if-changed={}", git.join(branch).display());
            }
        }
    } else {
        println!("cargo:rerun-if-changed=build.rs");
    }
}
