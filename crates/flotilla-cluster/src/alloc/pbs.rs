//! PBS's side of `flotilla alloc` (OpenPBS, PBS Professional, Torque, and Slurm's PBS
//! wrappers): the batch script that starts a queue's workers, and the parsing of what
//! `qsub`, `qstat -f` and `pbsnodes -a` print. Pure text in and out, so it is tested
//! without a PBS server; the allocator runs the commands.
//!
//! The script asks in OpenPBS's terms (`-l select=N -l place=scatter` for several nodes);
//! a site that speaks Torque's (`-l nodes=N`) passes its own resources after `--`.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::slurm::{shell_word, slurm_time, worker_command, BatchQueue, BatchState, WorkerLaunch};

/// How a node's command names its job and itself under PBS: `JOBID-NODE`, from the
/// variables PBS sets (`PBS_VNODENUM` in the tasks `pbsdsh` starts, absent with one node).
/// Slurm's PBS wrappers set no `PBS_JOBID`: there the job id `qsub` printed is Slurm's.
pub const PBS_IDS: &str = "\"${PBS_JOBID:-$SLURM_JOB_ID}-${PBS_VNODENUM:-0}\"";

/// What `qsub` is given before the script: the job's output joined and thrown away (the
/// script writes its own log, named after the job id, which `-o` cannot name).
pub const QSUB_ARGS: [&str; 4] = ["-j", "oe", "-o", "/dev/null"];

/// The batch script of one allocation of `queue`, named `name` (its job name in PBS). One
/// node runs its worker itself; several start one each with `pbsdsh`. The script's output
/// goes to `WORK_DIR/NAME-JOBID.log`.
pub fn batch_script(queue: &BatchQueue, launch: &WorkerLaunch, name: &str) -> String {
    let mut s = String::from("#!/bin/sh\n");
    let _ = writeln!(s, "#PBS -N {}", shell_word(name));
    if !queue.partition.trim().is_empty() {
        let _ = writeln!(s, "#PBS -q {}", shell_word(queue.partition.trim()));
    }
    let _ = writeln!(s, "#PBS -l walltime={}", slurm_time(queue.time_limit));
    let nodes = queue.workers_per_alloc.max(1);
    if nodes > 1 {
        let _ = writeln!(s, "#PBS -l select={nodes}");
        let _ = writeln!(s, "#PBS -l place=scatter");
    }
    let _ = writeln!(
        s,
        "exec >{}/{}-\"${{PBS_JOBID:-$SLURM_JOB_ID}}\".log 2>&1",
        shell_word(&launch.work_dir),
        shell_word(name)
    );
    let _ = writeln!(s, "set -eu");
    let command = shell_word(&worker_command(queue, launch, name, PBS_IDS, None));
    if nodes > 1 {
        let _ = writeln!(s, "exec pbsdsh -- sh -c {command}");
    } else {
        let _ = writeln!(s, "exec sh -c {command}");
    }
    s
}

/// The job id `qsub` printed (`1234.server`, or `1234` from Slurm's wrapper).
pub fn parse_qsub(stdout: &str) -> Option<String> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty())?;
    let plain = line
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-[]".contains(c));
    (plain && line.starts_with(|c: char| c.is_ascii_digit())).then(|| line.to_string())
}

/// Whether `a` and `b` name one job: equal, or the same number where one of them carries
/// the server's name (`qsub` prints `12.head`, `qstat` may print `12.head.example.org`).
pub fn same_job(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let number = |s: &str| s.split('.').next().unwrap_or("").to_string();
    let (na, nb) = (number(a), number(b));
    !na.is_empty() && na == nb && na.chars().all(|c| c.is_ascii_digit())
}

/// Maps a PBS job state letter (with its exit status and the server's comment) to ours.
pub fn state_of(state: &str, exit_status: Option<i64>, comment: &str) -> BatchState {
    let comment = comment.trim();
    let why = |what: &str| {
        if comment.is_empty() {
            what.to_string()
        } else {
            comment.to_string()
        }
    };
    match state.trim() {
        "Q" => BatchState::Queued(why("queued")),
        "H" => BatchState::Queued(why("held")),
        "W" => BatchState::Queued(why("waiting for its start time")),
        "T" | "M" => BatchState::Queued(why("moving between servers")),
        "S" | "U" => BatchState::Queued(why("suspended")),
        "R" | "E" | "B" => BatchState::Running,
        "C" | "F" | "X" => match exit_status {
            None | Some(0) => BatchState::Ended,
            Some(n) => BatchState::Failed(if comment.is_empty() {
                format!("exit status {n}")
            } else {
                format!("exit status {n} ({comment})")
            }),
        },
        other => BatchState::Failed(format!("PBS state {other:?}")),
    }
}

/// `qstat -f IDS` (or `qstat -x -f IDS`): job id as printed → state. Blocks start with
/// `Job Id: ID`; attributes are `key = value` lines (long values continue on lines with no
/// ` = `, which are skipped).
pub fn parse_qstat(stdout: &str) -> HashMap<String, BatchState> {
    let mut out = HashMap::new();
    let mut current: Option<(String, HashMap<String, String>)> = None;
    let finish = |job: Option<(String, HashMap<String, String>)>,
                  out: &mut HashMap<String, BatchState>| {
        if let Some((id, attrs)) = job {
            let get = |k: &str| {
                attrs
                    .iter()
                    .find(|(key, _)| key.eq_ignore_ascii_case(k))
                    .map(|(_, v)| v.as_str())
            };
            if let Some(state) = get("job_state") {
                let exit = get("exit_status").and_then(|v| v.trim().parse().ok());
                out.insert(id, state_of(state, exit, get("comment").unwrap_or("")));
            }
        }
    };
    for line in stdout.lines() {
        let t = line.trim();
        if let Some(id) = t.strip_prefix("Job Id:") {
            finish(current.take(), &mut out);
            let id = id.trim();
            if !id.is_empty() {
                current = Some((id.to_string(), HashMap::new()));
            }
        } else if let (Some((_, attrs)), Some((k, v))) = (current.as_mut(), t.split_once(" = ")) {
            attrs.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    finish(current, &mut out);
    out
}

/// Whether every line `qstat` wrote to stderr only says a job is unknown or finished (what
/// it says of jobs that ended, exiting non-zero), rather than that it could not ask.
pub fn only_unknown_jobs(stderr: &str) -> bool {
    let mut any = false;
    for line in stderr.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let l = line.to_ascii_lowercase();
        if !(l.contains("unknown job id") || l.contains("job has finished")) {
            return false;
        }
        any = true;
    }
    any
}

/// `pbsnodes -a`: the CPUs of the fewest-CPU node (`resources_available.ncpus` in
/// OpenPBS, `np` in Torque). `None` when it printed none.
pub fn parse_pbsnodes_cpus(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(" = ")?;
            matches!(k.trim(), "resources_available.ncpus" | "np")
                .then(|| v.trim().parse::<f64>().ok())
                .flatten()
        })
        .filter(|&c| c > 0.0)
        .min_by(f64::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn queue(nodes: u32) -> BatchQueue {
        BatchQueue {
            partition: "workq".into(),
            time_limit: Duration::from_secs(7200),
            workers_per_alloc: nodes,
            idle_timeout: Duration::from_secs(120),
            cpus_per_worker: None,
        }
    }

    fn launch(program: &str, work: &str) -> WorkerLaunch {
        WorkerLaunch {
            program: program.into(),
            server: "head:7070".into(),
            token_file: format!("{work}/worker.token"),
            work_dir: work.into(),
            worker_args: Vec::new(),
        }
    }

    #[test]
    fn one_node_runs_its_worker_itself_and_logs_under_the_job_id() {
        let dir = tempfile::tempdir().expect("tmp");
        let work = dir.path().display().to_string();
        let s = batch_script(&queue(1), &launch("echo", &work), "flotilla-q2");
        for line in [
            "#PBS -N flotilla-q2",
            "#PBS -q workq",
            "#PBS -l walltime=2:00:00",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} in {s}");
        }
        assert!(!s.contains("select="), "{s}");
        assert!(!s.contains("pbsdsh"), "{s}");
        // Run as PBS would (the program an echo): the log is named after the job.
        let script = dir.path().join("a.sh");
        std::fs::write(&script, &s).expect("script");
        let status = std::process::Command::new("sh")
            .arg(&script)
            .env("PBS_JOBID", "77.head")
            .env_remove("PBS_VNODENUM")
            .status()
            .expect("sh runs");
        assert!(status.success());
        let log = std::fs::read_to_string(dir.path().join("flotilla-q2-77.head.log"))
            .expect("the log named after the job");
        assert_eq!(
            log.trim(),
            format!(
                "worker --server head:7070 --token-file {work}/worker.token \
                 --name flotilla-q2-77.head-0 --work-dir {work}/77.head-0 \
                 --remove-work-dir --data-listen 0.0.0.0:0 --idle-timeout 120s --time-limit 7140s"
            )
        );
    }

    #[test]
    fn several_nodes_are_selected_scattered_and_started_by_pbsdsh() {
        let s = batch_script(&queue(3), &launch("/opt/flotilla", "/scratch/f"), "q");
        assert!(s.lines().any(|l| l == "#PBS -l select=3"), "{s}");
        assert!(s.lines().any(|l| l == "#PBS -l place=scatter"), "{s}");
        assert!(s.contains("exec pbsdsh -- sh -c '"), "{s}");
        // Run with a pbsdsh of the test's own that starts the command on "three nodes" as
        // PBS does (PBS_VNODENUM 0, 1, 2): three workers, each named after its node.
        let dir = tempfile::tempdir().expect("tmp");
        let work = dir.path().display().to_string();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let fake = bin.join("pbsdsh");
        std::fs::write(
            &fake,
            "#!/bin/sh\n[ \"$1\" = -- ] && shift\n\
             for n in 0 1 2; do PBS_VNODENUM=$n \"$@\"; done\n",
        )
        .expect("pbsdsh");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let script = dir.path().join("q.sh");
        std::fs::write(
            &script,
            batch_script(&queue(3), &launch("echo", &work), "q"),
        )
        .expect("script");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let status = std::process::Command::new("sh")
            .arg(&script)
            .env("PATH", path)
            .env("PBS_JOBID", "9.head")
            .status()
            .expect("sh runs");
        assert!(status.success());
        let log = std::fs::read_to_string(dir.path().join("q-9.head.log")).expect("the log");
        let names: Vec<&str> = log
            .lines()
            .filter_map(|l| l.split(" --name ").nth(1)?.split(' ').next())
            .collect();
        assert_eq!(names, ["q-9.head-0", "q-9.head-1", "q-9.head-2"], "{log}");
        // No queue: the server's default.
        let anywhere = BatchQueue {
            partition: String::new(),
            ..queue(1)
        };
        assert!(!batch_script(&anywhere, &launch("f", "/w"), "q").contains("#PBS -q"));
    }

    #[test]
    fn qsub_ids_and_their_server_names() {
        assert_eq!(parse_qsub("1234.head\n").as_deref(), Some("1234.head"));
        assert_eq!(parse_qsub("\n17\n").as_deref(), Some("17"));
        assert_eq!(parse_qsub("qsub: Unknown queue\n"), None);
        assert_eq!(parse_qsub(""), None);
        assert!(same_job("12.head", "12.head.example.org"));
        assert!(same_job("12", "12"));
        assert!(!same_job("12.head", "120.head"));
        assert!(!same_job("x.a", "x.b"));
    }

    #[test]
    fn qstat_full_output_of_openpbs_torque_and_slurms_wrapper() {
        // OpenPBS, with a long value continued on the next line and a finished job (-x).
        let openpbs = "Job Id: 101.head\n    Job_Name = flotilla-q1\n    job_state = Q\n    \
                       comment = Not Running: Insufficient amount of resource: ncpus\n    \
                       Variable_List = PBS_O_HOME=/root,PBS_O_LANG=C,\n\tPBS_O_PATH=/bin\n\n\
                       Job Id: 102.head.example.org\n    job_state = R\n\n\
                       Job Id: 103.head\n    job_state = F\n    Exit_status = 0\n\n\
                       Job Id: 104.head\n    job_state = F\n    Exit_status = -29\n";
        let s = parse_qstat(openpbs);
        assert_eq!(
            s["101.head"],
            BatchState::Queued("Not Running: Insufficient amount of resource: ncpus".into())
        );
        assert_eq!(s["102.head.example.org"], BatchState::Running);
        assert_eq!(s["103.head"], BatchState::Ended);
        assert_eq!(s["104.head"], BatchState::Failed("exit status -29".into()));
        // Torque keeps completed jobs as C, with exit_status.
        let torque = "Job Id: 7.srv\n    job_state = C\n    exit_status = 271\n";
        assert_eq!(
            parse_qstat(torque)["7.srv"],
            BatchState::Failed("exit status 271".into())
        );
        // Slurm's wrapper: tabs, no exit status.
        let wrapper = "Job Id:\t9\n\tJob_Name = flotilla-q1\n\tjob_state = C\n\tqueue = debug\n";
        assert_eq!(parse_qstat(wrapper)["9"], BatchState::Ended);
        assert_eq!(
            parse_qstat("Job Id: 5\n\tjob_state = H\n")["5"],
            BatchState::Queued("held".into())
        );
        assert!(parse_qstat("").is_empty());
    }

    #[test]
    fn unknown_jobs_are_told_from_a_server_that_does_not_answer() {
        assert!(only_unknown_jobs("qstat: Unknown Job Id 12.head\n"));
        assert!(only_unknown_jobs(
            "qstat: 13.head Job has finished, use -x or -H to obtain historical job information\n"
        ));
        assert!(only_unknown_jobs("qstat: Unknown Job Id Error 7.srv\n"));
        assert!(!only_unknown_jobs(
            "Connection refused\nqstat: cannot connect to server head (errno=111)\n"
        ));
        assert!(!only_unknown_jobs(""));
    }

    #[test]
    fn pbsnodes_cpus() {
        let openpbs = "n1\n     Mom = n1\n     resources_available.ncpus = 64\n\
                       n2\n     resources_available.ncpus = 32\n     resources_assigned.ncpus = 0\n";
        assert_eq!(parse_pbsnodes_cpus(openpbs), Some(32.0));
        assert_eq!(
            parse_pbsnodes_cpus("vm\n    state = free\n    np = 2\n"),
            Some(2.0)
        );
        assert_eq!(
            parse_pbsnodes_cpus("pbsnodes: Server has no node list\n"),
            None
        );
    }
}
