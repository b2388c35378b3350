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

    // Which token is the provider's is the admin's to know (to revoke it), not a tenant's.
    assert!(list[0].get("token").is_none(), "{list}");
    let out = c.cli(&["provider", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
    // The worker stops, naming the provider's token (it pointed at --token-file).
    let said = c.wait_worker_line(0, "refused this worker's token", Duration::from_secs(60));
    assert!(said.contains("check --provider-token"), "{said}");
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
    // A tenant with no account: said in words, not an empty table.
    last_line(&c.cli(&["admin", "tenant", "add", "dave"]));
    let none = c.cli(&["ledger", "--tenant", "dave"]);
    assert!(none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr)
            .contains("no account of tenant dave to show: no credits have moved for it"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
}

/// Enrols a provider named `name` and starts one worker of its at `price`, with `env`.
fn add_provider(c: &mut Cluster, name: &str, price: &str, env: &[(&str, &str)]) {
    add_provider_with(c, name, price, env, &[]);
}

/// [`add_provider`] with more `flotilla worker` arguments.
fn add_provider_with(
    c: &mut Cluster,
    name: &str,
    price: &str,
    env: &[(&str, &str)],
    extra: &[&str],
) {
    let token = last_line(&c.cli(&["admin", "provider", "add", name]));
    assert!(token.starts_with("flt_"), "{token}");
    let file = c.root().join(format!("{name}.token"));
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let file_arg = file.display().to_string();
    let mut args = vec!["--provider-token", file_arg.as_str(), "--price", price];
    args.extend_from_slice(extra);
    c.add_worker_env(1, &args, env);
}

/// The pool end to end: three providers at different prices, the cheapest corrupting every
/// output it returns; two tenants with credits. Alice's job with `verify = 2` gets every
/// result right (the corrupted replicas outvoted), the corrupting provider's reputation
/// falls until it gets no work and it earns nothing; Bob's job with a budget too small for
/// its first task waits, paused with the reason, until `flotilla budget` raises it; the
/// ledger's total stays the credits handed out; neither tenant reaches the other's job.
#[test]
fn a_pool_verifies_pays_only_for_right_results_and_pauses_on_budget() {
    let mut c = Cluster::start(0, 1);
    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice", "--credits", "100"]));
    let bob = last_line(&c.cli(&["admin", "tenant", "add", "bob", "--credits", "5"]));
    add_provider(
        &mut c,
        "bad",
        "cpu=0.5",
        &[("FLOTILLA_FAULT", "corrupt-outputs")],
    );
    add_provider(&mut c, "cheap", "cpu=1", &[]);
    add_provider(&mut c, "dear", "cpu=2", &[]);
    c.wait_workers(3);

    let n = 6;
    let job = format!(
        "name = \"verified\"\nstaging = \"transfer\"\n[pool]\nverify = 2\nbudget = 50\n\
         [[task]]\nid = \"t\"\narray = \"0..{n}\"\ntimeout = \"1h\"\n\
         cmd = [\"sh\", \"-c\", \"i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; \
         mkdir -p out; echo result-{{i}} > out/{{i}}.txt\"]\noutputs = [\"out/{{i}}.txt\"]\n"
    );
    let file = c.job_dir().join("verified.toml");
    std::fs::write(&file, job).unwrap();
    let out = c.cli_with_token(&["submit", "--wait", &file.display().to_string()], &alice);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..n {
        let got = std::fs::read_to_string(c.job_dir().join(format!("out/{i}.txt"))).unwrap();
        assert_eq!(got, format!("result-{i}\n"), "task {i}'s accepted result");
    }
    let id = kit::job_id_of(&out);
    let s = c.status(id).unwrap();
    let pool = s.pool.as_ref().expect("a pool job");
    assert!(
        pool.rejected >= 1,
        "the corrupted results were rejected: {pool:?}"
    );
    assert!(pool.spent > 0.0 && pool.held == 0.0, "{pool:?}");
    for t in &s.tasks {
        assert!(t.cost.unwrap_or(0.0) > 0.0, "{} cost something", t.name);
        assert_ne!(
            t.provider.as_deref(),
            Some("bad"),
            "{} taken from bad",
            t.name
        );
    }

    let providers: serde_json::Value =
        serde_json::from_slice(&c.cli(&["provider", "list", "--json"]).stdout).unwrap();
    let by = |name: &str| {
        providers
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap()
    };
    let bad = by("bad");
    assert_eq!(bad["accepted"], 0, "{bad}");
    assert!(bad["rejected"].as_u64().unwrap() >= 1, "{bad}");
    assert_eq!(bad["earned"], 0.0, "{bad}");
    assert!(bad["reputation"].as_f64().unwrap() < 0.5, "{bad}");
    let paid = by("cheap")["earned"].as_f64().unwrap() + by("dear")["earned"].as_f64().unwrap();
    assert!(paid > 0.0, "{providers}");
    let table = String::from_utf8_lossy(&c.cli(&["provider", "list"]).stdout).to_string();
    assert!(
        table.contains("REPUTATION") && table.contains("EARNED"),
        "{table}"
    );

    // Bob cannot see Alice's job, its logs or its outputs: to him it does not exist.
    let alice_job = id.0.to_string();
    for args in [
        vec!["status", alice_job.as_str()],
        vec!["logs", alice_job.as_str(), "t[0]"],
        vec!["wait", alice_job.as_str()],
    ] {
        let out = c.cli_with_token(&args, &bob);
        assert!(!out.status.success(), "bob ran {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no job"), "{args:?}: {err}");
    }

    // Bob's job: each attempt holds 0.5 credits (an hour at the cheapest price), its budget
    // is 0.2: it waits, paused, saying why.
    let small = c.job_dir().join("small.toml");
    std::fs::write(
        &small,
        "name = \"small\"\n[pool]\nverify = 1\nbudget = 0.2\n[[task]]\nid = \"a\"\n\
         timeout = \"1h\"\ncmd = [\"true\"]\n",
    )
    .unwrap();
    let out = c.cli_with_token(&["submit", &small.display().to_string()], &bob);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let small_id = kit::job_id_of(&out);
    let s = c.wait_status(
        small_id,
        "bob's job to pause",
        Duration::from_secs(30),
        |s| s.pool.as_ref().is_some_and(|p| p.paused.is_some()),
    );
    let why = s.pool.unwrap().paused.unwrap();
    assert!(why.contains("flotilla budget"), "{why}");
    // Its task was never placed: said so, not "on the operator's own worker".
    let out = c.cli_with_token(&["status", &small_id.0.to_string()], &bob);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("task a: ready, not placed yet"), "{text}");
    // Alice cannot raise Bob's budget: to her his job does not exist.
    let out = c.cli_with_token(&["budget", &small_id.0.to_string(), "+5"], &alice);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job"));
    let out = c.cli_with_token(&["budget", &small_id.0.to_string(), "+0"], &bob);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a raise of 0 changes nothing"), "{err}");
    let out = c.cli_with_token(&["budget", &small_id.0.to_string(), "+5"], &bob);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = c.wait_job(small_id, Duration::from_secs(60));
    kit::assert_succeeded(&s);
    // Once it ended, a raise is refused, not journaled for nothing.
    let out = c.cli_with_token(&["budget", &small_id.0.to_string(), "+5"], &bob);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has ended (succeeded)"), "{err}");

    // Credits are only moved: the total is what was handed out.
    let ledger: serde_json::Value =
        serde_json::from_slice(&c.cli(&["ledger", "--json"]).stdout).unwrap();
    assert_eq!(ledger["total_micro"], 105_000_000, "{ledger}");
    assert!(ledger["platform"].as_f64().unwrap() > 0.0, "{ledger}");
    // ... and a restarted coordinator rebuilds the same ledger from its journal.
    c.kill_server();
    c.restart_server();
    let again = wait_until("the coordinator back", Duration::from_secs(30), || {
        let out = c.cli(&["ledger", "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap())
    });
    assert_eq!(again["accounts"], ledger["accounts"]);
}

/// Reclaim: `flotilla admin worker drain NAME` stops the provider's running task with
/// SIGTERM and its grace period; the checkpoint file the task writes then is shipped off the
/// machine (transfer staging: its sandbox goes with the attempt) and the task resumes on
/// another provider from it, with no retry counted; the drained worker leaves. Spot
/// semantics: the drained provider is paid for the work its checkpoint carried forward.
#[test]
fn a_drained_provider_s_task_resumes_elsewhere_from_its_checkpoint() {
    let mut c = Cluster::start(0, 1);
    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice", "--credits", "100"]));
    add_provider(&mut c, "first", "cpu=1", &[]);
    c.wait_workers(1);
    let progress = c.root().join("progress");
    let job = format!(
        "name = \"resumable\"\nstaging = \"transfer\"\n[pool]\nverify = 1\n\
         [[task]]\nid = \"sim\"\ntimeout = \"1h\"\ncheckpoint = [\"state/*.ckpt\"]\n\
         outputs = [\"out.txt\"]\ncmd = [\"sh\", \"-c\", \"mkdir -p state; \
         n=$(cat state/n.ckpt 2>/dev/null || echo 0); from=$n; \
         trap 'echo $n > state/n.ckpt; exit 143' TERM; \
         while [ $n -lt 60 ]; do n=$((n+1)); [ $n -eq $((from+5)) ] && touch {}; sleep 0.1; done; \
         echo resumed-from=$from > out.txt\"]\n",
        progress.display()
    );
    let file = c.job_dir().join("resumable.toml");
    std::fs::write(&file, job).unwrap();
    let out = c.cli_with_token(&["submit", &file.display().to_string()], &alice);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = kit::job_id_of(&out);
    wait_until("the task to make progress", Duration::from_secs(60), || {
        progress.exists().then_some(())
    });
    // A second provider, then the first is drained mid-task.
    add_provider(&mut c, "second", "cpu=2", &[]);
    c.wait_workers(2);
    let out = c.cli(&["admin", "worker", "drain", "w0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("its tasks checkpoint and move, the outputs only it holds are copied to other workers; then it leaves"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let s = c.wait_job(id, Duration::from_secs(120));
    kit::assert_succeeded(&s);
    let t = &s.tasks[0];
    assert_eq!(t.attempts, 2, "{t:?}");
    assert_eq!(t.failures, 0, "a preemption is no failure: {t:?}");
    assert_eq!(t.provider.as_deref(), Some("second"));
    // The drained worker left.
    c.wait_until_workers(1);
    let out = c.cli_with_token(&["wait", &id.0.to_string()], &alice);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read_to_string(c.job_dir().join("out.txt")).unwrap();
    let from: u32 = got
        .trim()
        .strip_prefix("resumed-from=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{got:?}"));
    assert!(
        from >= 5,
        "it resumed from its checkpoint, not from 0: {got:?}"
    );
    let providers: serde_json::Value =
        serde_json::from_slice(&c.cli(&["provider", "list", "--json"]).stdout).unwrap();
    let first = providers
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "first")
        .unwrap();
    assert!(
        first["earned"].as_f64().unwrap() > 0.0,
        "paid for the work carried forward: {first}"
    );
}

/// `--idle-only`: while its owner is active (here: the owner's activity file exists) a
/// provider's machine takes no work and a task running there is preempted; when the owner
/// leaves it takes work again, and the task resumes.
#[test]
fn an_idle_only_machine_gives_way_to_its_owner_and_comes_back() {
    let mut c = Cluster::start(0, 1);
    let alice = last_line(&c.cli(&["admin", "tenant", "add", "alice", "--credits", "100"]));
    let active = c.root().join("owner-here");
    let active_arg = active.display().to_string();
    add_provider_with(
        &mut c,
        "desk",
        "cpu=1",
        &[],
        &[
            "--idle-only",
            "--idle-load",
            "1000",
            "--idle-after",
            "0s",
            "--owner-active-file",
            &active_arg,
            "--grace",
            "5s",
        ],
    );
    c.wait_workers(1);
    let started = c.root().join("started");
    let job = format!(
        "name = \"desk\"\n[pool]\nverify = 1\n[[task]]\nid = \"t\"\ntimeout = \"1h\"\n\
         cmd = [\"sh\", \"-c\", \"touch {}; while [ ! -e go ]; do sleep 0.05; done\"]\n",
        started.display()
    );
    let path = c.job_dir().join("desk.toml");
    std::fs::write(&path, job).unwrap();
    let out = c.cli_with_token(&["submit", &path.display().to_string()], &alice);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = kit::job_id_of(&out);
    wait_until("the task to start", Duration::from_secs(60), || {
        started.exists().then_some(())
    });
    std::fs::remove_file(&started).unwrap();
    // The owner sits down: the task is preempted and nothing runs there.
    std::fs::write(&active, "").unwrap();
    let s = c.wait_status(
        id,
        "the task to be preempted",
        Duration::from_secs(60),
        |s| {
            s.tasks[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("preempted"))
        },
    );
    assert_eq!(s.tasks[0].failures, 0);
    let w = wait_until(
        "the worker to say it is reclaimed",
        Duration::from_secs(30),
        || {
            c.overview()
                .and_then(|o| o.workers.into_iter().next())
                .filter(|w| !w.available)
        },
    );
    assert!(w.availability.contains("idle-only"), "{w:?}");
    let list = String::from_utf8_lossy(&c.cli(&["provider", "list"]).stdout).to_string();
    assert!(list.contains("idle-only (not now)"), "{list}");
    // The owner leaves: the task runs again there, and ends.
    std::fs::write(c.job_dir().join("go"), "").unwrap();
    std::fs::remove_file(&active).unwrap();
    let s = c.wait_job(id, Duration::from_secs(60));
    kit::assert_succeeded(&s);
    assert_eq!(s.tasks[0].attempts, 2);
    assert!(started.exists(), "it ran again");
}
