//! `flotilla bench isolation`: what a sandbox costs a task. `/bin/true` run `tasks` times in
//! a row through `flotilla_exec::run_process`, as a worker runs a process task, in each
//! setting side by side in the same run (rounds interleaved, the median kept):
//!
//! - `none`: no sandbox (the spawn a worker with `--isolation none` makes),
//! - `sandbox`: bubblewrap, joining the worker's one empty network namespace,
//! - `sandbox+netns`: bubblewrap making a fresh network namespace per task,
//! - `sandbox+cgroup`: the shared namespace and a cgroup per attempt (memory, pids, cpu),
//!   what a worker running as root on a machine with cgroups does.
//!
//! The settings this machine cannot make are left out, with the reason.

use std::time::Instant;

use anyhow::{bail, Result};
use flotilla_exec::{CancelHandle, CgroupSpec, EmptyNetns, ProcessSpec, SandboxSpec};
use serde::Serialize;

/// One setting's time per task.
#[derive(Debug, Serialize)]
pub struct IsolationPoint {
    /// `"isolation"`.
    pub bench: &'static str,
    /// The setting.
    pub setting: String,
    /// Tasks per round.
    pub tasks: usize,
    /// Median milliseconds per task.
    pub ms_per_task: f64,
    /// Milliseconds per task added over `none`, same run.
    pub added_ms: f64,
    /// Every round's milliseconds per task.
    pub rounds_ms: Vec<f64>,
}

/// Runs the comparison; the settings this machine cannot make are skipped with a note on
/// stderr.
pub fn run(tasks: usize, rounds: usize) -> Result<Vec<IsolationPoint>> {
    let dir = tempfile::tempdir()?;
    let cwd = dir.path().to_path_buf();
    let base = || {
        let mut s = ProcessSpec::new(["/bin/true"], &cwd);
        s.clear_env = true;
        s.env = flotilla_exec::host_vars();
        s
    };
    let mut settings: Vec<(String, ProcessSpec)> = vec![("none".into(), base())];
    let bwrap = flotilla_exec::sandbox::find_bwrap();
    match &bwrap {
        Some(b) if flotilla_exec::sandbox::probe(b).is_ok() => {}
        Some(b) => bail!(
            "{}",
            flotilla_exec::sandbox::probe(b).err().unwrap_or_default()
        ),
        None => bail!("bwrap was not found (Debian: apt-get install bubblewrap)"),
    }
    let bwrap = bwrap.unwrap_or_default();
    let netns = EmptyNetns::new().ok();
    let etc = dir.path().join("etc");
    flotilla_exec::sandbox::prepare_etc(&etc)?;
    let sandbox = |netns: Option<i32>| SandboxSpec {
        bwrap: bwrap.clone(),
        writable: cwd.clone(),
        network: false,
        netns,
        devices: Vec::new(),
        etc: Some(etc.clone()),
        holder: None,
    };
    match &netns {
        Some(n) => {
            let mut s = base();
            s.sandbox = Some(sandbox(Some(n.fd())));
            settings.push(("sandbox".into(), s));
        }
        None => eprintln!("no shared network namespace (needs root): that setting is left out"),
    }
    let mut s = base();
    s.sandbox = Some(sandbox(None));
    settings.push(("sandbox+netns".into(), s));
    // The worker's way when it can: one holder, each task entering it.
    let holder = match crate::enter_program() {
        Some(enter) => match flotilla_exec::Holder::start(&bwrap, Some(&etc)) {
            Ok(h) => {
                let r = h.reference(&enter);
                Some((h, r))
            }
            Err(e) => {
                eprintln!("no sandbox holder ({e}): the holder settings are left out");
                None
            }
        },
        None => {
            eprintln!(
                "flotilla-enter not found beside this binary: the holder settings are left out"
            );
            None
        }
    };
    if let Some((_, r)) = &holder {
        let mut s = base();
        let mut sb = sandbox(None);
        sb.holder = Some(r.clone());
        s.sandbox = Some(sb);
        settings.push(("holder".into(), s));
    }
    let cgroup = || CgroupSpec {
        mem_max: Some(1 << 30),
        cpu_max: Some(1.0),
        pids_max: Some(1024),
        ..CgroupSpec::new(format!("flotilla-bench-{}", std::process::id()), "attempt")
    };
    if flotilla_exec::cgroup_available() {
        let mut s = base();
        s.sandbox = Some(sandbox(netns.as_ref().map(EmptyNetns::fd)));
        s.cgroup = Some(cgroup());
        settings.push(("sandbox+cgroup".into(), s));
        if let Some((_, r)) = &holder {
            let mut s = base();
            let mut sb = sandbox(None);
            sb.holder = Some(r.clone());
            s.sandbox = Some(sb);
            s.cgroup = Some(cgroup());
            settings.push(("holder+cgroup".into(), s));
        }
    } else {
        eprintln!("no writable cgroup hierarchy: sandbox+cgroup is left out");
    }
    let cancel = CancelHandle::new();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    for round in 0..rounds.max(1) {
        // Alternate the order (ABBA) so drift on a shared machine hits every setting alike.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..settings.len()).collect()
        } else {
            (0..settings.len()).rev().collect()
        };
        for i in order {
            let spec = &settings[i].1;
            let start = Instant::now();
            for _ in 0..tasks {
                let o = flotilla_exec::run_process(spec, &cancel)?;
                if !o.success() {
                    bail!("{}: /bin/true failed: {o:?}", settings[i].0);
                }
            }
            times[i].push(start.elapsed().as_secs_f64() * 1e3 / tasks as f64);
        }
    }
    if let Some(Some(cg)) = settings.last().map(|s| s.1.cgroup.as_ref()) {
        flotilla_exec::drain_cgroup_pool();
        flotilla_exec::cleanup_cgroups(&cg.parent);
        for root in ["memory", "pids", "cpu", "cpuacct", ""] {
            let _ = std::fs::remove_dir(
                std::path::Path::new(flotilla_exec::CGROUP_ROOT)
                    .join(root)
                    .join(&cg.parent),
            );
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let none = median(&times[0]);
    Ok(settings
        .iter()
        .zip(times)
        .map(|((name, _), t)| {
            let m = median(&t);
            IsolationPoint {
                bench: "isolation",
                setting: name.clone(),
                tasks,
                ms_per_task: m,
                added_ms: m - none,
                rounds_ms: t,
            }
        })
        .collect())
}
