//! The pool's providers through the CLI and real processes: `flotilla admin provider add`
//! prints a provider token; a worker enrolled with it (`--provider-token`) is that
//! provider's, at its `--price`; `flotilla provider list` shows it to the admin and to
//! tenants; revoking the provider's token drops its workers.

#![allow(clippy::unwrap_used)]

mod kit;

use std::time::Duration;

use kit::{last_line, wait_until, Cluster};

#[test]
fn a_providers_worker_joins_at_its_price_and_leaves_with_its_token() {
    let mut c = Cluster::start(0, 1);
    let token = last_line(&c.cli(&["admin", "provider", "add", "acme"]));
    assert!(token.starts_with("flt_"), "{token}");
    let file = c.root().join("acme.token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let file_arg = file.display().to_string();
    // The kit gives workers the admin token in FLOTILLA_TOKEN: --provider-token wins.
    c.add_worker_with(
        1,
        &[
            "--provider-token",
            &file_arg,
            "--price",
            "cpu=0.02,gpu=0.5,mem_gb=0.001",
        ],
    );
    c.wait_workers(1);
    let s = c.overview().unwrap();
    assert_eq!(s.workers[0].provider.as_deref(), Some("acme"));
    assert_eq!(
        s.workers[0].price.to_string(),
        "cpu=0.02,gpu=0.5,mem_gb=0.001"
    );

    // A tenant sees the providers and their prices.
    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice"]));
    let out = c.cli_with_token(&["provider", "list", "--json"], &alice);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["name"], "acme");
    assert_eq!(list[0]["workers"].as_array().unwrap().len(), 1);
    assert_eq!(list[0]["prices"][0], "cpu=0.02,gpu=0.5,mem_gb=0.001");
    assert_eq!(list[0]["revoked"], false);
    let table = c.cli(&["provider", "list"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("acme"));

    // Its token revoked: its worker's session ends and it is refused from then on.
    let id = list[0]["token"].as_str().unwrap().to_string();
    let out = c.cli(&["admin", "token", "revoke", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        "the revoked provider's worker to be dropped",
        Duration::from_secs(60),
        || c.overview().filter(|s| s.workers.is_empty()).map(|_| ()),
    );
    let out = c.cli(&["provider", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["revoked"], true);
    assert_eq!(list[0]["workers"].as_array().unwrap().len(), 0);
}

/// The pool's test hooks: a worker with `FLOTILLA_FAULT=corrupt-outputs` returns outputs
/// with a byte flipped (what the pool's verification must catch), one with `slow:4` reports
/// (and takes) four times the task's time.
#[test]
fn fault_hooks_corrupt_outputs_and_slow_tasks() {
    let mut c = Cluster::start(0, 1);
    c.add_worker_env(1, &[], &[("FLOTILLA_FAULT", "corrupt-outputs")]);
    c.wait_workers(1);
    let id = c.submit_toml(
        "corrupt.toml",
        "name = \"corrupt\"\nstaging = \"transfer\"\n[[task]]\nid = \"t\"\n\
         cmd = [\"sh\", \"-c\", \"printf abc > out.txt\"]\noutputs = [\"out.txt\"]\n",
    );
    kit::assert_succeeded(&c.wait_job(id, Duration::from_secs(60)));
    let out = c.cli(&["wait", &id.0.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(c.job_dir().join("out.txt")).unwrap(),
        b"a\x9dc",
        "the gathered output has the corrupting worker's flipped byte"
    );
    c.kill_worker(0);
    c.wait_until_workers(0);
    c.add_worker_env(1, &[], &[("FLOTILLA_FAULT", "slow:4")]);
    c.wait_until_workers(1);
    let id = c.submit_toml(
        "slow.toml",
        "name = \"slow\"\n[[task]]\nid = \"t\"\ncmd = [\"sleep\", \"0.3\"]\n",
    );
    let s = c.wait_job(id, Duration::from_secs(60));
    kit::assert_succeeded(&s);
    let wall = s.tasks[0].usage.map(|u| u.wall_seconds).unwrap_or(0.0);
    assert!(
        wall >= 1.2,
        "a slow:4 worker reported {wall} s for a 0.3 s task"
    );
}

/// Credits: `flotilla admin tenant add NAME --credits C` hands them out through the ledger,
/// journaled (a restarted coordinator has them); `flotilla ledger` shows the admin every
/// account with the total (the credits handed out) and a tenant its own accounts only.
#[test]
fn credits_handed_to_tenants_are_in_the_ledger_and_survive_a_restart() {
    let mut c = Cluster::start(0, 1);
    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice", "--credits", "100.5"]));
    last_line(&c.cli(&["admin", "tenant", "add", "bob", "--credits", "20"]));
    let bad = c.cli(&["admin", "tenant", "add", "carol", "--credits", "lots"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--credits"));
    let ledger = |c: &Cluster, token: &str| -> serde_json::Value {
        let out = c.cli_with_token(&["ledger", "--json"], token);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let all = ledger(&c, &c.token);
    assert_eq!(all["total_micro"], 120_500_000);
    assert_eq!(all["issued"], 120.5);
    let mine = ledger(&c, &alice);
    let accounts = mine["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 1, "{mine}");
    assert_eq!(accounts[0]["name"], "alice");
    assert_eq!(accounts[0]["balance_micro"], 100_500_000);
    assert!(
        mine.get("total").is_none(),
        "a tenant sees no total: {mine}"
    );
    c.kill_server();
    c.restart_server();
    let all = ledger(&c, &c.token);
    assert_eq!(all["total_micro"], 120_500_000, "the grants are journaled");
    let table = c.cli(&["ledger"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("100.5"));
}
