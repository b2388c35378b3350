//! `flotilla-train`: data-parallel training of the digits MLP (see the library's docs).
//!
//! Every rank prints (to stdout, or to `--log`) one line per step, `step S loss L`, where
//! `L` is the mean loss over the global batch (identical on every rank), and at the end
//! `final step S loss L test_accuracy A params_crc32 C` (`L`: mean loss over the training
//! set; `C`: checksum of the final parameters). Exit status: 0 done, 3 stopped on purpose by
//! `--fail-at-step`, 1 any error (named on stderr).

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use flotilla_collective::{Communicator, Options};
use flotilla_train::{
    train_with, Dataset, Event, Gradient, Local, OnDevice, OnHost, Outcome, Reducer, TrainConfig,
    TRAIN_SAMPLES,
};

/// Data-parallel SGD on the digits data set: each rank computes the gradient of its slice of
/// every global batch, one allreduce sums them, every rank takes the same step.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The digits CSV (label, then 64 pixels 0..16 per line).
    #[arg(long)]
    data: PathBuf,
    /// Total SGD steps (a resumed run continues up to this number).
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Global batch size; must be a multiple of the world size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.5)]
    lr: f32,
    /// Seed of the initial parameters and of the sample order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Checkpoint folder: loaded at start if it holds a checkpoint, written by rank 0.
    #[arg(long, default_value = "checkpoints")]
    checkpoint_dir: PathBuf,
    /// Write a checkpoint every K steps (0: only after the last step).
    #[arg(long, default_value_t = 50)]
    checkpoint_every: u64,
    /// Write the progress lines to this file instead of stdout; "{rank}" is replaced by the
    /// rank (e.g. train-rank{rank}.log).
    #[arg(long)]
    log: Option<String>,
    /// Rendezvous address: "HOST:PORT" (rank 0 serves it) or "HOST:PORT/KEY" (a running
    /// rendezvous server). Without it, FLOTILLA_RENDEZVOUS/FLOTILLA_RANK/FLOTILLA_WORLD_SIZE
    /// are used, and without those the run has one rank.
    #[arg(long, requires_all = ["rank", "world_size"])]
    rendezvous: Option<String>,
    /// This process's rank (with --rendezvous).
    #[arg(long, requires = "rendezvous")]
    rank: Option<usize>,
    /// Number of ranks (with --rendezvous).
    #[arg(long, requires = "rendezvous")]
    world_size: Option<usize>,
    /// Seconds any single collective wait may take before the run fails.
    #[arg(long, default_value_t = 60)]
    comm_timeout_secs: u64,
    /// Testing: exit with status 3 right after step S (and its checkpoint) unless the run
    /// started from a checkpoint at or after S.
    #[arg(long)]
    fail_at_step: Option<u64>,
    /// Testing: sleep this long after every step.
    #[arg(long, default_value_t = 0)]
    step_delay_ms: u64,
    /// Where this rank computes its gradients: host (one sample at a time), or as matrix
    /// products on a Flotilla device: cpu-device, opencl (the first OpenCL device), cuda
    /// (GPU rank mod GPUs).
    #[arg(long, default_value = "host")]
    device: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flotilla-train: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The rank's reducer: a communicator for a gang, [`Local`] for a single rank.
enum Gang {
    Single(Local),
    Ranks(Box<Communicator>),
}

fn connect(args: &Args) -> anyhow::Result<Gang> {
    let options = Options {
        deterministic: true,
        timeout: Duration::from_secs(args.comm_timeout_secs),
        ..Options::default()
    };
    if let (Some(addr), Some(rank), Some(size)) = (&args.rendezvous, args.rank, args.world_size) {
        if rank >= size {
            bail!("--rank {rank} is not below --world-size {size}");
        }
        if size == 0 || !args.batch.is_multiple_of(size) {
            bail!(
                "global batch {} is not a multiple of --world-size {size}",
                args.batch
            );
        }
        if size == 1 {
            return Ok(Gang::Single(Local));
        }
        let comm = Communicator::connect_with(addr, rank, size, options)
            .with_context(|| format!("joining the gang at {addr} as rank {rank} of {size}"))?;
        return Ok(Gang::Ranks(Box::new(comm)));
    }
    let vars = [
        "FLOTILLA_RENDEZVOUS",
        "FLOTILLA_RANK",
        "FLOTILLA_WORLD_SIZE",
    ];
    if vars.iter().all(|v| std::env::var_os(v).is_none()) {
        return Ok(Gang::Single(Local));
    }
    if std::env::var("FLOTILLA_WORLD_SIZE").ok().as_deref() == Some("1") {
        return Ok(Gang::Single(Local));
    }
    let comm = Communicator::from_env_with(options)
        .context("joining the gang from FLOTILLA_* variables")?;
    Ok(Gang::Ranks(Box::new(comm)))
}

fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let data = Dataset::load(&args.data)?;
    let (train_set, test_set) = data.split(TRAIN_SAMPLES.min(data.len().saturating_sub(1)))?;
    let config = TrainConfig {
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        seed: args.seed,
        checkpoint_dir: Some(args.checkpoint_dir.clone()),
        checkpoint_every: args.checkpoint_every,
        fail_at_step: args.fail_at_step,
        step_delay: Duration::from_millis(args.step_delay_ms),
    };
    match connect(args)? {
        Gang::Single(mut local) => run_rank(args, &config, &train_set, &test_set, &mut local),
        Gang::Ranks(mut comm) => run_rank(args, &config, &train_set, &test_set, comm.as_mut()),
    }
}

/// The gradient computation `--device` names.
fn gradient_for(device: &str, rank: usize) -> anyhow::Result<Box<dyn Gradient>> {
    use flotilla_devices::{cpu::HostDevice, discover_report, DeviceKind, DiscoverOptions};
    let kind = match device {
        "host" => return Ok(Box::new(OnHost)),
        "cpu-device" => return Ok(Box::new(OnDevice::new(Arc::new(HostDevice::new(1 << 30)))?)),
        "opencl" => DeviceKind::OpenCl,
        "cuda" => DeviceKind::Cuda,
        other => bail!("--device {other:?}: expected host, cpu-device, opencl or cuda"),
    };
    let found = discover_report(&DiscoverOptions {
        opencl: kind == DeviceKind::OpenCl,
        cuda: kind == DeviceKind::Cuda,
        mem_limit: None,
    });
    let n = found.devices.len();
    if n == 0 {
        bail!(
            "--device {device}: none found ({})",
            found.skipped.join("; ")
        );
    }
    Ok(Box::new(OnDevice::new(found.devices[rank % n].clone())?))
}

fn run_rank<R: Reducer>(
    args: &Args,
    config: &TrainConfig,
    train_set: &Dataset,
    test_set: &Dataset,
    reducer: &mut R,
) -> anyhow::Result<ExitCode> {
    let rank = reducer.rank();
    let mut out: Box<dyn Write> = match &args.log {
        Some(pattern) => {
            let path = pattern.replace("{rank}", &rank.to_string());
            let file = File::create(&path).with_context(|| format!("creating log file {path}"))?;
            Box::new(LineWriter::new(file))
        }
        None => Box::new(std::io::stdout()),
    };
    let mut gradient = gradient_for(&args.device, rank)?;
    eprintln!("rank {rank}: gradients on {}", gradient.name());
    let mut write_error = None;
    let outcome = train_with(
        config,
        train_set,
        test_set,
        reducer,
        &mut gradient,
        |event| {
            let line = match event {
                Event::Step { step, loss } => format!("step {step} loss {loss:.9}"),
                Event::Resumed { step, path } => {
                    eprintln!(
                        "rank {rank}: resuming from step {step} ({})",
                        path.display()
                    );
                    return;
                }
                Event::SkippedCheckpoint(e) => {
                    eprintln!("rank {rank}: warning: skipping damaged checkpoint: {e}");
                    return;
                }
                Event::Checkpointed { step, path } => {
                    eprintln!(
                        "rank {rank}: checkpoint of step {step} in {}",
                        path.display()
                    );
                    return;
                }
            };
            if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                write_error.get_or_insert(e);
            }
        },
    )
    .with_context(|| format!("rank {rank}"))?;
    if let Some(e) = write_error {
        return Err(e).context("writing progress lines");
    }
    match outcome {
        Outcome::Finished(summary) => {
            writeln!(
                out,
                "final step {} loss {:.9} test_accuracy {:.4} params_crc32 {:08x}",
                summary.step,
                summary.train_loss,
                summary.test_accuracy,
                summary.params_crc32()
            )
            .and_then(|()| out.flush())
            .context("writing the final line")?;
            Ok(ExitCode::SUCCESS)
        }
        Outcome::FailedOnPurpose { step } => {
            eprintln!(
                "rank {rank}: stopping after step {step} as --fail-at-step asks (exit status 3)"
            );
            Ok(ExitCode::from(3))
        }
    }
}
