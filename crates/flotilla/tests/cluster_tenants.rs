//! Tenants and roles through the command line: `flotilla admin` makes a tenant and a worker
//! enrolment token (each printed alone on the last line), a worker enrolled with that token
//! runs a tenant's transfer job whose outputs travel between workers and back to the tenant
//! with tickets (no shared token anywhere), other tenants do not see the job, and a revoked
//! token is refused.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use kit::{assert_succeeded, job_id_of, last_line, Cluster};

const JOB: &str = r#"name = "owned"
staging = "transfer"

[[task]]
id = "a"
resources = { cpus = 2 }
inputs = ["seed.txt"]
cmd = ["sh", "-c", "cat seed.txt > a.txt && echo line-a >> a.txt"]
outputs = ["a.txt"]

[[task]]
id = "b"
after = ["a"]
resources = { cpus = 1, mem = "2GiB" }
cmd = ["sh", "-c", "cat a.txt > b.txt && echo line-b >> b.txt"]
outputs = ["b.txt"]
"#;

#[test]
fn a_tenant_runs_a_transfer_job_on_enrolled_workers_and_sees_only_its_own() {
    let mut c = Cluster::start(0, 1);
    let enrol = last_line(&c.cli(&["admin", "worker-token", "add", "--name", "rack"]));
    assert!(enrol.starts_with("flt_"), "{enrol}");
    // Two workers enrolled with it: a's output crosses from w0 to w1.
    c.add_worker_as(2, &["--mem", "1GiB"], &enrol);
    c.add_worker_as(1, &["--mem", "4GiB"], &enrol);
    c.wait_workers(2);
    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice", "--cpus", "8"]));
    let bob = last_line(&c.cli(&["admin", "tenant", "add", "bob"]));
    let dir = c.job_dir();
    std::fs::write(dir.join("seed.txt"), "seed\n").unwrap();
    let file = dir.join("owned.toml");
    std::fs::write(&file, JOB).unwrap();
    let out = c.cli_with_token(&["submit", "--wait", &file.display().to_string()], &alice);
    assert!(
        out.status.success(),
        "alice's job: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = job_id_of(&out);
    let s = c.wait_job(job, Duration::from_secs(30));
    assert_succeeded(&s);
    assert_eq!(s.tenant, "alice");
    assert_eq!(
        std::fs::read_to_string(dir.join("b.txt")).unwrap(),
        "seed\nline-a\nline-b\n",
        "gathered with tickets"
    );
    // Bob is told there is no such job, as for a job that never was.
    let theirs = c.cli_with_token(&["status", &job.0.to_string()], &bob);
    let never = c.cli_with_token(&["status", "999"], &bob);
    assert!(!theirs.status.success() && !never.status.success());
    assert_eq!(
        String::from_utf8_lossy(&theirs.stderr).replace(&job.0.to_string(), "N"),
        String::from_utf8_lossy(&never.stderr).replace("999", "N"),
    );
    let list = c.cli_with_token(&["status", "--json"], &bob);
    assert!(list.status.success());
    assert!(!String::from_utf8_lossy(&list.stdout).contains("\"owned\""));
    // Tenants cannot administer, enrol workers, or stop the server.
    let e = c.cli_with_token(&["admin", "tenant", "list"], &alice);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("a tenant token may not list tenants"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    // The listings, then a revocation that takes effect at once.
    let tenants = c.cli(&["admin", "tenant", "list", "--json"]);
    let tenants: serde_json::Value = serde_json::from_slice(&tenants.stdout).unwrap();
    assert_eq!(tenants[0]["name"], "alice");
    assert_eq!(tenants[0]["quota"]["cpus"], 8.0);
    let tokens = c.cli(&["admin", "token", "list", "--json"]);
    let tokens: serde_json::Value = serde_json::from_slice(&tokens.stdout).unwrap();
    let bob_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bob")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!String::from_utf8_lossy(&serde_json::to_vec(&tokens).unwrap()).contains(&bob));
    let out = c.cli(&["admin", "token", "revoke", &bob_id]);
    assert!(out.status.success());
    let e = c.cli_with_token(&["status"], &bob);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("revoked"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
}
