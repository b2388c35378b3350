//! Allreduce benchmark: spawns `--ranks` copies of itself as processes (default 2) that
//! rendezvous on a local server and run `flotilla_collective::bench::run`.
//!
//! `cargo run --release -p flotilla-collective --example allreduce -- --transport tcp --sizes 1MiB,64MiB,256MiB`
//!
//! Options: `--ranks N`, `--transport auto|tcp|shm`, `--algo auto|ring|rd`, `--det`,
//! `--sizes LIST` (`KiB`, `MiB`, … as the job file reads sizes), `--rounds R`.

use std::process::Command;

use flotilla_collective::{bench, Algorithm, Communicator, Options, RendezvousServer, Transport};

/// A size as the job file writes it (`1MiB`, `64MiB`; `K`/`M` are decimal).
fn parse_size(s: &str) -> anyhow::Result<usize> {
    Ok(usize::try_from(flotilla_core::size::parse_size(s)?)?)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut ranks = 2usize;
    let mut opts = Options::default();
    let mut sizes = vec![1 << 20, 64 << 20, 256 << 20];
    let mut rounds = 5;
    let mut i = 0;
    while i < args.len() {
        let val = || {
            args.get(i + 1)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("{} needs a value", args[i]))
        };
        match args[i].as_str() {
            "--ranks" => ranks = val()?.parse()?,
            "--rounds" => rounds = val()?.parse()?,
            "--transport" => {
                opts.transport = match val()?.as_str() {
                    "tcp" => Transport::Tcp,
                    "shm" => Transport::Shm,
                    _ => Transport::Auto,
                }
            }
            "--algo" => {
                opts.algorithm = match val()?.as_str() {
                    "ring" => Algorithm::Ring,
                    "rd" => Algorithm::RecursiveDoubling,
                    _ => Algorithm::Auto,
                }
            }
            "--sizes" => {
                sizes = val()?
                    .split(',')
                    .map(parse_size)
                    .collect::<anyhow::Result<_>>()?
            }
            "--det" => {
                opts.deterministic = true;
                i += 1;
                continue;
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
        i += 2;
    }
    if std::env::var_os("FLOTILLA_RANK").is_some() {
        let mut comm = Communicator::from_env_with(opts.clone())?;
        let points = bench::run(&mut comm, &sizes, rounds)?;
        if comm.rank() == 0 {
            for p in points {
                println!(
                    "RESULT transport={:?} algo={:?} det={} ranks={} bytes={} iters={} median_us={:.1} min_us={:.1} max_us={:.1} algbw={:.3} busbw={:.3}",
                    comm.transport(),
                    opts.algorithm,
                    opts.deterministic,
                    comm.size(),
                    p.bytes,
                    p.iters,
                    p.seconds * 1e6,
                    p.min_seconds * 1e6,
                    p.max_seconds * 1e6,
                    p.algbw_gbs,
                    p.busbw_gbs
                );
            }
        }
        return Ok(());
    }
    let server = RendezvousServer::bind("127.0.0.1:0")?;
    let rv = format!("{}/bench", server.local_addr());
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..ranks)
        .map(|r| {
            Command::new(&exe)
                .args(&args)
                .env("FLOTILLA_RANK", r.to_string())
                .env("FLOTILLA_WORLD_SIZE", ranks.to_string())
                .env("FLOTILLA_RENDEZVOUS", &rv)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut failed = false;
    for mut c in children {
        failed |= !c.wait()?.success();
    }
    if failed {
        anyhow::bail!("a rank failed");
    }
    Ok(())
}
