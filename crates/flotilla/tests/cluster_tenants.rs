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
    // A revoked (lost, leaked) token is replaced: bob keeps his name, and with it his jobs
    // and credits (`tenant add bob` refused him for good, pointing nowhere).
    let again = c.cli(&["admin", "tenant", "add", "bob"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("`flotilla admin tenant token bob`"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let bob2 = last_line(&c.cli(&["admin", "tenant", "token", "bob"]));
    assert!(bob2.starts_with("flt_") && bob2 != bob, "{bob2}");
    let ok = c.cli_with_token(&["status", "--json"], &bob2);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(!c.cli_with_token(&["status"], &bob).status.success());
    // Only for a tenant or provider that exists; tenants cannot make tokens.
    let none = c.cli(&["admin", "tenant", "token", "carol"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("no tenant \"carol\""));
    let denied = c.cli_with_token(&["admin", "tenant", "token", "bob"], &alice);
    assert!(!denied.status.success());
    // A provider's, the same way.
    last_line(&c.cli(&["admin", "provider", "add", "acme"]));
    let acme2 = last_line(&c.cli(&["admin", "provider", "token", "acme"]));
    assert!(acme2.starts_with("flt_"), "{acme2}");
}

/// `flotilla admin tenant set`: a job held back by its tenant's `running_jobs` quota reads
/// `waiting` with the reason; lifting the quota lets it run at once while the first still
/// runs; other quotas are set and a grant is credited; bad changes are refused by name.
#[test]
fn a_quota_changed_on_a_live_coordinator_lets_held_work_start() {
    let c = Cluster::start(1, 2);
    c.wait_workers(1);
    let q = last_line(&c.cli(&["admin", "tenant", "add", "q", "--running-jobs", "1"]));
    let dir = c.job_dir();
    // The first job runs until the test lets it end: the second is held by the quota alone.
    let first = dir.join("first.toml");
    std::fs::write(
        &first,
        "[[task]]\nid = \"hold\"\ncmd = [\"sh\", \"-c\", \"while [ ! -e go ]; do sleep 0.05; done\"]\n",
    )
    .unwrap();
    let second = dir.join("second.toml");
    std::fs::write(&second, "[[task]]\nid = \"quick\"\ncmd = [\"true\"]\n").unwrap();
    let submit = |file: &std::path::Path| {
        let out = c.cli_with_token(&["submit", &file.display().to_string()], &q);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        job_id_of(&out)
    };
    let a = submit(&first);
    c.wait_status(a, "the first job to run", Duration::from_secs(60), |s| {
        s.counts.running == 1
    });
    let b = submit(&second);
    let held = c.wait_status(b, "the quota's reason", Duration::from_secs(60), |s| {
        s.waiting.is_some()
    });
    let why = held.waiting.unwrap();
    assert!(why.contains("its --running-jobs quota"), "{why}");
    let table = String::from_utf8_lossy(&c.cli(&["status"]).stdout).into_owned();
    let row = table
        .lines()
        .find(|l| l.contains("second"))
        .unwrap_or_else(|| panic!("no row for the second job:\n{table}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1..4], ["second", "q", "waiting"], "{row}");

    // `flotilla wait` on it says why it waits (it printed only "0/1 tasks done").
    let mut waiter = c
        .cli_command(&["wait", &b.0.to_string()], &q)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = waiter.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let said = lines
        .iter()
        .find(|l| l.contains("waiting: "))
        .expect("a line that says why it waits");
    assert!(said.contains("--running-jobs quota"), "{said}");

    let out = c.cli(&["admin", "tenant", "set", "q", "--running-jobs", "none"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("running jobs no limit"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_succeeded(&c.wait_job(b, Duration::from_secs(60)));
    assert!(
        waiter.wait().unwrap().success(),
        "the wait ends with the job"
    );
    let s = c.status(a).unwrap();
    assert!(s.finished_state().is_none(), "the first job still runs");
    std::fs::write(dir.join("go"), "").unwrap();
    assert_succeeded(&c.wait_job(a, Duration::from_secs(60)));

    // Other quotas and a grant; the listing shows them.
    let out = c.cli(&[
        "admin", "tenant", "set", "q", "--cpus", "3", "--tasks", "100", "--grant", "5", "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(t["quota"]["cpus"], 3.0);
    assert_eq!(t["quota"]["tasks"], 100);
    assert!(t["quota"].get("running_jobs").is_none(), "{t}");
    let ledger = c.cli(&["ledger", "--tenant", "q", "--json"]);
    assert!(
        ledger.status.success(),
        "{}",
        String::from_utf8_lossy(&ledger.stderr)
    );
    let ledger: serde_json::Value = serde_json::from_slice(&ledger.stdout).unwrap();
    assert_eq!(
        ledger["accounts"][0]["balance_micro"], 5_000_000,
        "{ledger}"
    );

    // Refused: no such tenant, nothing to change, a negative amount, a tenant's own token.
    let e = c.cli(&["admin", "tenant", "set", "nobody", "--cpus", "1"]);
    assert!(!e.status.success());
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("no tenant \"nobody\""),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let e = c.cli(&["admin", "tenant", "set", "q"]);
    assert!(!e.status.success());
    let e = c.cli(&["admin", "tenant", "set", "q", "--cpus=-1"]);
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("quota cpus = -1"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let e = c.cli_with_token(&["admin", "tenant", "set", "q", "--cpus", "64"], &q);
    assert!(!e.status.success());
    let tenants = c.cli(&["admin", "tenant", "list", "--json"]);
    let tenants: serde_json::Value = serde_json::from_slice(&tenants.stdout).unwrap();
    assert_eq!(
        tenants[0]["quota"]["cpus"], 3.0,
        "unchanged by the refused ones"
    );
}
