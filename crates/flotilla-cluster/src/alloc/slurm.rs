//! Slurm's side of `flotilla alloc`: the batch script that starts a queue's workers, and
//! the parsing of what `sbatch --parsable`, `squeue` and `sacct` print. Pure text in and
//! out, so it is tested without a Slurm; the allocator runs the commands.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

/// What an allocation queue asks of its batch system (`flotilla alloc add slurm|pbs ...`).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchQueue {
    /// The partition (Slurm's `--partition`) or the queue (PBS's `-q`; empty: the
    /// server's default).
    pub partition: String,
    /// The allocation's time limit (`--time`, `-l walltime`).
    pub time_limit: Duration,
    /// Workers per allocation: one per node (`--nodes`, `-l select`).
    pub workers_per_alloc: u32,
    /// Seconds a worker waits with nothing to run before it gives its node back.
    pub idle_timeout: Duration,
    /// CPUs each worker takes (`--cpus-per-worker`); `None`: a whole node each.
    pub cpus_per_worker: Option<f64>,
}

/// How the script starts a worker: the program and the coordinator it joins.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerLaunch {
    /// The `flotilla` program on the nodes (an absolute path).
    pub program: String,
    /// The coordinator's address(es) as workers reach them.
    pub server: String,
    /// A file holding the workers' enrolment token, readable on the nodes.
    pub token_file: String,
    /// A folder for the workers' work folders and the allocation's logs, on the nodes.
    pub work_dir: String,
    /// More arguments for `flotilla worker` (`--tls-ca FILE`, `--grace 1m`...).
    pub worker_args: Vec<String>,
}

/// The batch script of one allocation of `queue`, named `name` (its job name in Slurm).
/// Each node runs one worker (`srun`), named after the job and the node, that leaves when
/// idle for the queue's idle timeout and before the time limit (`--time-limit`, counted
/// from its start: slightly inside Slurm's own).
pub fn batch_script(queue: &BatchQueue, launch: &WorkerLaunch, name: &str) -> String {
    let mut s = String::from("#!/bin/sh\n");
    let _ = writeln!(s, "#SBATCH --job-name={}", shell_word(name));
    let _ = writeln!(s, "#SBATCH --partition={}", shell_word(&queue.partition));
    let _ = writeln!(s, "#SBATCH --time={}", slurm_time(queue.time_limit));
    let _ = writeln!(s, "#SBATCH --nodes={}", queue.workers_per_alloc.max(1));
    let _ = writeln!(s, "#SBATCH --ntasks-per-node=1");
    // What the worker offers is what Slurm gave: so many CPUs, or the whole node (a
    // worker counted every core of a node that Slurm shared with another job, and two of
    // them ran four tasks on two cores).
    match queue.cpus_per_worker {
        Some(n) => {
            let _ = writeln!(s, "#SBATCH --cpus-per-task={}", n.ceil().max(1.0) as u64);
        }
        None => {
            let _ = writeln!(s, "#SBATCH --exclusive");
        }
    }
    let _ = writeln!(
        s,
        "#SBATCH --output={}/%x-%j.log",
        shell_word(&launch.work_dir)
    );
    let _ = writeln!(s, "set -eu");
    // One worker per node; `sh -c` so that each expands its own node number.
    let _ = writeln!(
        s,
        "exec srun --kill-on-bad-exit=0 sh -c {}",
        shell_word(&worker_command(
            queue,
            launch,
            name,
            SLURM_IDS,
            Some(SLURM_CPUS)
        ))
    );
    s
}

/// How a node's command names its job and itself in Slurm: `JOBID-NODE`, from the
/// variables `srun` sets.
pub const SLURM_IDS: &str = "\"$SLURM_JOB_ID-$SLURM_NODEID\"";

/// The CPUs Slurm gave the allocation on a node (a shell word), for the worker's `--cpus`
/// when the queue does not say.
pub const SLURM_CPUS: &str = "\"$SLURM_CPUS_ON_NODE\"";

/// The command one node runs (through `sh -c`): a worker named and housed after the job
/// and the node (`ids`, a shell word that expands to `JOBID-NODE` there), leaving when idle
/// for the queue's idle timeout and before the time limit (counted from its start, a
/// quarter of it and at most 60 s inside the batch system's own, which also counts the
/// start). Its `--cpus`: the queue's `--cpus-per-worker`, else `node_cpus` (a shell word
/// the batch system expands) when given, else the node's cores; none when the worker's own
/// arguments name it.
pub fn worker_command(
    queue: &BatchQueue,
    launch: &WorkerLaunch,
    name: &str,
    ids: &str,
    node_cpus: Option<&str>,
) -> String {
    let inside = worker_time_limit(queue.time_limit);
    let mut cmd = format!(
        "exec {} worker --server {} --token-file {} --name {}-{ids} \
         --work-dir {}/{ids} --remove-work-dir --data-listen 0.0.0.0:0 \
         --idle-timeout {}s --time-limit {}s",
        shell_word(&launch.program),
        shell_word(&launch.server),
        shell_word(&launch.token_file),
        shell_word(name),
        shell_word(&launch.work_dir),
        queue.idle_timeout.as_secs().max(1),
        inside.as_secs().max(1),
    );
    let own = launch
        .worker_args
        .iter()
        .any(|a| a == "--cpus" || a.starts_with("--cpus="));
    if !own {
        match (queue.cpus_per_worker, node_cpus) {
            (Some(n), _) => {
                let _ = write!(cmd, " --cpus {n}");
            }
            (None, Some(word)) => {
                let _ = write!(cmd, " --cpus {word}");
            }
            (None, None) => {}
        }
    }
    for a in &launch.worker_args {
        cmd.push(' ');
        cmd.push_str(&shell_word(a));
    }
    cmd
}

/// A worker's `--time-limit` in an allocation of `limit`: a quarter of it and at most 60 s
/// inside the batch system's own (which also counts the worker's start).
pub fn worker_time_limit(limit: Duration) -> Duration {
    limit.saturating_sub((limit / 4).min(Duration::from_secs(60)))
}

/// `HH:MM:SS` (days folded into hours), as `sbatch --time` takes it.
pub fn slurm_time(d: Duration) -> String {
    let s = d.as_secs().max(60);
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Single-quotes `w` for the shell unless it is plain.
pub(crate) fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:,=@%+".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// The job id `sbatch --parsable` printed (`12345` or `12345;cluster`).
pub fn parse_sbatch(stdout: &str) -> Option<String> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty())?;
    let id = line.split(';').next()?.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit())).then(|| id.to_string())
}

/// Where an allocation stands in its batch system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchState {
    /// Waiting to start (PENDING, CONFIGURING, REQUEUED...), with Slurm's reason.
    Queued(String),
    /// Its nodes are up.
    Running,
    /// Ended as asked (COMPLETED), or by its own workers leaving.
    Ended,
    /// Ended by a failure or by Slurm (FAILED, TIMEOUT, NODE_FAIL, CANCELLED by another,
    /// OUT_OF_MEMORY, BOOT_FAIL, DEADLINE), with the state and reason.
    Failed(String),
}

/// Maps one Slurm job state (and its reason) to ours.
pub fn state_of(state: &str, reason: &str) -> BatchState {
    let state = state.trim().trim_end_matches('+');
    // sacct prints "CANCELLED by 0".
    let word = state.split_whitespace().next().unwrap_or("");
    match word {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESIZING"
        | "SUSPENDED" => BatchState::Queued(reason.trim().to_string()),
        "RUNNING" | "COMPLETING" | "STAGE_OUT" | "SIGNALING" => BatchState::Running,
        "COMPLETED" => BatchState::Ended,
        _ => {
            let reason = reason.trim();
            BatchState::Failed(if reason.is_empty() || reason == "None" {
                state.to_string()
            } else {
                format!("{state} ({reason})")
            })
        }
    }
}

/// `squeue -h -o '%i|%T|%r' -j IDS`: job id → state.
pub fn parse_squeue(stdout: &str) -> HashMap<String, BatchState> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            let id = f.next()?.trim();
            let state = f.next()?;
            let reason = f.next().unwrap_or("");
            (!id.is_empty()).then(|| (id.to_string(), state_of(state, reason)))
        })
        .collect()
}

/// `sacct -n -P -X -o JobIDRaw,State,Reason -j IDS`: job id → state (for jobs `squeue` no
/// longer shows, where Slurm keeps accounting).
pub fn parse_sacct(stdout: &str) -> HashMap<String, BatchState> {
    parse_squeue(stdout)
}

/// `scontrol show job -o ID`: its state (for a job `squeue` no longer shows; Slurm keeps
/// ended jobs there for `MinJobAge`). `None` when it printed no job.
pub fn parse_scontrol(stdout: &str) -> Option<BatchState> {
    let line = stdout.lines().find(|l| l.contains("JobState="))?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or("")
            .to_string()
    };
    Some(state_of(&field("JobState="), &field("Reason=")))
}

/// `sinfo -h -p PARTITION -o %c`: the CPUs of the partition's nodes (the fewest, when they
/// differ). `None` when it printed none.
pub fn parse_sinfo_cpus(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .filter_map(|l| l.trim().trim_end_matches('+').parse::<f64>().ok())
        .filter(|&c| c > 0.0)
        .min_by(f64::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> BatchQueue {
        BatchQueue {
            partition: "debug".into(),
            time_limit: Duration::from_secs(3600),
            workers_per_alloc: 2,
            idle_timeout: Duration::from_secs(300),
            cpus_per_worker: None,
        }
    }

    fn launch() -> WorkerLaunch {
        WorkerLaunch {
            program: "/usr/bin/flotilla".into(),
            server: "head:7070".into(),
            token_file: "/etc/flotilla/worker token".into(),
            work_dir: "/scratch/flotilla".into(),
            worker_args: vec!["--grace".into(), "2m".into()],
        }
    }

    #[test]
    fn the_batch_script_asks_for_the_queue_and_starts_one_worker_per_node() {
        let s = batch_script(&queue(), &launch(), "flotilla-q1-7");
        assert!(s.starts_with("#!/bin/sh\n"), "{s}");
        for line in [
            "#SBATCH --job-name=flotilla-q1-7",
            "#SBATCH --partition=debug",
            "#SBATCH --time=1:00:00",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --exclusive",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} in {s}");
        }
        assert!(s.contains("exec srun --kill-on-bad-exit=0 sh -c '"), "{s}");
        // What a node runs, with Slurm's variables (the program an echo here).
        let echo = WorkerLaunch {
            program: "echo".into(),
            ..launch()
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(worker_command(
                &queue(),
                &echo,
                "flotilla-q1-7",
                SLURM_IDS,
                Some(SLURM_CPUS),
            ))
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_NODEID", "1")
            .env("SLURM_CPUS_ON_NODE", "16")
            .output()
            .expect("sh runs");
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(
            line,
            "worker --server head:7070 --token-file /etc/flotilla/worker token \
             --name flotilla-q1-7-4242-1 --work-dir /scratch/flotilla/4242-1 \
             --remove-work-dir --data-listen 0.0.0.0:0 --idle-timeout 300s --time-limit 3540s --cpus 16 --grace 2m"
        );
        // A queue of so many CPUs per worker asks for them, and its workers offer them.
        let four = BatchQueue {
            cpus_per_worker: Some(4.0),
            ..queue()
        };
        let s = batch_script(&four, &launch(), "q");
        assert!(s.lines().any(|l| l == "#SBATCH --cpus-per-task=4"), "{s}");
        assert!(!s.contains("--exclusive"), "{s}");
        assert!(
            worker_command(&four, &echo, "q", SLURM_IDS, Some(SLURM_CPUS)).contains(" --cpus 4 ")
        );
        // The worker's own --cpus wins.
        let own = WorkerLaunch {
            worker_args: vec!["--cpus".into(), "2".into()],
            ..launch()
        };
        let c = worker_command(&four, &own, "q", SLURM_IDS, Some(SLURM_CPUS));
        assert_eq!(c.matches("--cpus").count(), 1, "{c}");
        // A short limit keeps three quarters of itself.
        let short = BatchQueue {
            time_limit: Duration::from_secs(120),
            ..queue()
        };
        assert!(worker_command(&short, &echo, "q", SLURM_IDS, None).contains("--time-limit 90s"));
    }

    #[test]
    fn slurm_times_and_sbatch_ids() {
        assert_eq!(slurm_time(Duration::from_secs(90 * 60)), "1:30:00");
        assert_eq!(slurm_time(Duration::from_secs(30 * 3600 + 5)), "30:00:05");
        assert_eq!(slurm_time(Duration::from_secs(5)), "0:01:00");
        assert_eq!(parse_sbatch("12345\n").as_deref(), Some("12345"));
        assert_eq!(parse_sbatch("678;cluster\n").as_deref(), Some("678"));
        assert_eq!(parse_sbatch("sbatch: error: invalid partition\n"), None);
        assert_eq!(parse_sbatch(""), None);
    }

    #[test]
    fn squeue_and_sacct_states() {
        let q =
            parse_squeue("101|PENDING|Priority\n102|RUNNING|None\n103|PENDING|PartitionConfig\n\n");
        assert_eq!(q["101"], BatchState::Queued("Priority".into()));
        assert_eq!(q["102"], BatchState::Running);
        assert_eq!(q["103"], BatchState::Queued("PartitionConfig".into()));
        let a = parse_sacct("104|COMPLETED|None\n105|TIMEOUT|None\n106|CANCELLED by 0|None\n107|FAILED|NonZeroExitCode\n");
        assert_eq!(a["104"], BatchState::Ended);
        assert_eq!(a["105"], BatchState::Failed("TIMEOUT".into()));
        assert_eq!(a["106"], BatchState::Failed("CANCELLED by 0".into()));
        assert_eq!(
            a["107"],
            BatchState::Failed("FAILED (NonZeroExitCode)".into())
        );
    }

    #[test]
    fn scontrol_and_sinfo() {
        let done = "JobId=7 JobName=flotilla-q1 UserId=root(0) Priority=1 JobState=COMPLETED \
                    Reason=None Dependency=(null)\n";
        assert_eq!(parse_scontrol(done), Some(BatchState::Ended));
        let pending = "JobId=8 JobName=x JobState=PENDING Reason=Resources Dependency=(null)";
        assert_eq!(
            parse_scontrol(pending),
            Some(BatchState::Queued("Resources".into()))
        );
        assert_eq!(
            parse_scontrol("JobId=9 JobState=TIMEOUT Reason=TimeLimit"),
            Some(BatchState::Failed("TIMEOUT (TimeLimit)".into()))
        );
        assert_eq!(
            parse_scontrol("slurm_load_jobs error: Invalid job id specified"),
            None
        );
        assert_eq!(parse_sinfo_cpus("48\n32+\n"), Some(32.0));
        assert_eq!(parse_sinfo_cpus(""), None);
    }
}
