//! `flotilla admin`: tenants, worker enrolment tokens, providers, token listing and
//! revocation; and `flotilla provider list`. Each
//! takes the admin token (`--token-file` or `FLOTILLA_TOKEN`, as every command does). A new
//! token is printed alone on the last line of stdout: the coordinator keeps only its hash.

use anyhow::Result;
use clap::{Args, Subcommand};
use flotilla::cluster::access::{Quota, QuotaChange};

use crate::cluster_cmd::RemoteArgs;
use crate::out::outln;

/// `flotilla admin ...`.
#[derive(Subcommand)]
pub(crate) enum AdminCmd {
    /// Tenants: who submits jobs, with quotas.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Worker enrolment tokens.
    #[command(subcommand, name = "worker-token")]
    WorkerToken(WorkerTokenCmd),
    /// Every token: list, revoke.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Providers of machines (the pool).
    #[command(subcommand)]
    Provider(ProviderCmd),
    /// Live workers.
    #[command(subcommand)]
    Worker(WorkerCmd),
    /// The members of a group of coordinators (`flotilla server --node-id N --peers ...`).
    #[command(subcommand)]
    Group(GroupCmd),
}

#[derive(Subcommand)]
pub(crate) enum GroupCmd {
    /// Add a node to the group: start it first with `flotilla server --node-id ID --peers
    /// LIST --join` (LIST: the group's API addresses with its own at position ID); it is
    /// sent the log or the leader's snapshot, and votes once it holds what is committed.
    /// Prints the group's members.
    Add(GroupAddArgs),
    /// Remove a node from the group (a lost machine, or one retired). Prints the members.
    Remove(GroupRemoveArgs),
}

#[derive(Args)]
pub(crate) struct GroupAddArgs {
    /// The new node's id (its `--node-id`).
    node_id: u64,
    /// Its API address, host:port (its group port is the next port).
    address: String,
    /// Print the group's status as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args)]
pub(crate) struct GroupRemoveArgs {
    /// The node's id.
    node_id: u64,
    /// Print the group's status as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Subcommand)]
pub(crate) enum WorkerCmd {
    /// Drain a worker (by name or id): nothing more is placed on it; its running tasks get
    /// SIGTERM and its grace period to write their checkpoints, which are kept off the
    /// machine; they resume on other workers (no retry counted); the outputs only it holds
    /// are copied to other workers; then it leaves.
    Drain(WorkerDrainArgs),
}

#[derive(Args)]
pub(crate) struct WorkerDrainArgs {
    /// The worker's name (`flotilla worker --name`; every live worker of that name) or id
    /// (`w3`); `name:NAME` or `id:ID` when a word is one worker's id and another's name.
    name: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Subcommand)]
pub(crate) enum ProviderCmd {
    /// Add a provider; prints its token alone on the last line (its workers enrol with
    /// `flotilla worker --provider-token FILE`).
    Add(ProviderAddArgs),
    /// One more token for a provider (a lost or leaked one: make a new one, then revoke the
    /// old with `flotilla admin token revoke ID`); prints it alone on the last line.
    Token(ProviderAddArgs),
}

#[derive(Args)]
pub(crate) struct ProviderAddArgs {
    /// The provider's name: 1 to 64 of a-z, 0-9, '_' and '-'.
    name: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Subcommand)]
pub(crate) enum TenantCmd {
    /// Add a tenant; prints its token alone on the last line.
    Add(TenantAddArgs),
    /// List the tenants and their quotas.
    List(ListArgs),
    /// Change a tenant's quotas (`none` lifts one) or hand it more credits; running jobs keep
    /// what they hold, their next tasks follow the new quotas.
    Set(TenantSetArgs),
    /// One more token for a tenant (a lost or leaked one: make a new one, then revoke the
    /// old with `flotilla admin token revoke ID`); prints it alone on the last line.
    Token(TenantTokenArgs),
}

#[derive(Args)]
pub(crate) struct TenantTokenArgs {
    /// The tenant's name.
    name: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Subcommand)]
pub(crate) enum WorkerTokenCmd {
    /// Add a worker enrolment token; prints it alone on the last line.
    Add(WorkerTokenAddArgs),
}

#[derive(Subcommand)]
pub(crate) enum TokenCmd {
    /// List every token (ids, roles, names; never a token).
    List(ListArgs),
    /// Revoke a token at once (a worker enrolment token takes its workers' credentials).
    Revoke(RevokeArgs),
}

#[derive(Args)]
pub(crate) struct TenantAddArgs {
    /// The tenant's name: 1 to 64 of a-z, 0-9, '_' and '-'.
    name: String,
    /// The most CPUs its tasks hold at once.
    #[arg(long)]
    cpus: Option<f64>,
    /// The most GPUs its tasks hold at once.
    #[arg(long)]
    gpus: Option<f64>,
    /// The most of its jobs that run at once (later ones wait).
    #[arg(long)]
    running_jobs: Option<u32>,
    /// The most tasks one of its jobs may have (larger jobs are refused).
    #[arg(long)]
    tasks: Option<u64>,
    /// Credits handed to it (the pool's currency; exact to a millionth), e.g. 100.
    #[arg(long)]
    credits: Option<String>,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// A quota as `flotilla admin tenant set` takes it: an amount, or `none` to lift it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limit<T>(Option<T>);

fn limit_arg<T: std::str::FromStr>(s: &str) -> std::result::Result<Limit<T>, String>
where
    T::Err: std::fmt::Display,
{
    if matches!(s, "none" | "unlimited") {
        return Ok(Limit(None));
    }
    s.parse()
        .map(|v| Limit(Some(v)))
        .map_err(|e| format!("{e} (an amount, or `none` for no limit)"))
}

#[derive(Args)]
#[command(group(
    clap::ArgGroup::new("change")
        .required(true)
        .multiple(true)
        .args(["cpus", "gpus", "running_jobs", "tasks", "grant"])
))]
pub(crate) struct TenantSetArgs {
    /// The tenant's name.
    name: String,
    /// The most CPUs its tasks hold at once (`none`: no limit).
    #[arg(long, value_parser = limit_arg::<f64>)]
    cpus: Option<Limit<f64>>,
    /// The most GPUs its tasks hold at once (`none`: no limit).
    #[arg(long, value_parser = limit_arg::<f64>)]
    gpus: Option<Limit<f64>>,
    /// The most of its jobs that run at once (`none`: no limit).
    #[arg(long, value_parser = limit_arg::<u32>)]
    running_jobs: Option<Limit<u32>>,
    /// The most tasks one of its jobs may have (`none`: no limit).
    #[arg(long, value_parser = limit_arg::<u64>)]
    tasks: Option<Limit<u64>>,
    /// More credits handed to it (the pool's currency), e.g. 50.
    #[arg(long)]
    grant: Option<String>,
    /// The tenant as changed, as one JSON document.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args)]
pub(crate) struct WorkerTokenAddArgs {
    /// A name to recognise it by in `token list`.
    #[arg(long, default_value = "")]
    name: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args)]
pub(crate) struct ListArgs {
    /// One JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

#[derive(Args)]
pub(crate) struct RevokeArgs {
    /// The token's id (from `flotilla admin token list`).
    id: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

fn limit<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn unlimited<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "no limit".to_string(), |v| v.to_string())
}

/// Runs an admin command.
pub(crate) async fn admin(cmd: AdminCmd) -> Result<()> {
    match cmd {
        AdminCmd::Tenant(TenantCmd::Add(a)) => {
            let quota = Quota {
                cpus: a.cpus,
                gpus: a.gpus,
                running_jobs: a.running_jobs,
                tasks: a.tasks,
            };
            let t = a
                .remote
                .client()
                .await?
                .tenant_add_with_credits(&a.name, &quota, a.credits.as_deref().unwrap_or(""))
                .await?;
            eprintln!("tenant {} added (token {}); its token:", a.name, t.id);
            outln!("{}", t.token);
        }
        AdminCmd::Tenant(TenantCmd::List(a)) => {
            let tenants = a.remote.client().await?.tenant_list().await?;
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&tenants)?);
            } else {
                let mut t =
                    crate::table::new(&["TENANT", ">CPUS", ">GPUS", ">RUNNING JOBS", ">TASKS/JOB"]);
                for x in tenants {
                    t.add_row([
                        x.name,
                        limit(x.quota.cpus),
                        limit(x.quota.gpus),
                        limit(x.quota.running_jobs),
                        limit(x.quota.tasks),
                    ]);
                }
                outln!("{t}");
            }
        }
        AdminCmd::Tenant(TenantCmd::Set(a)) => {
            let change = QuotaChange {
                cpus: a.cpus.map(|l| l.0),
                gpus: a.gpus.map(|l| l.0),
                running_jobs: a.running_jobs.map(|l| l.0),
                tasks: a.tasks.map(|l| l.0),
            };
            let t = a
                .remote
                .client()
                .await?
                .tenant_set(&a.name, &change, a.grant.as_deref().unwrap_or(""))
                .await?;
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                let q = &t.quota;
                outln!(
                    "tenant {}: cpus {}, gpus {}, running jobs {}, tasks/job {}",
                    t.name,
                    unlimited(q.cpus),
                    unlimited(q.gpus),
                    unlimited(q.running_jobs),
                    unlimited(q.tasks)
                );
                if let Some(g) = &a.grant {
                    outln!(
                        "granted {g} credits (`flotilla ledger --tenant {}`)",
                        t.name
                    );
                }
            }
        }
        AdminCmd::WorkerToken(WorkerTokenCmd::Add(a)) => {
            let t = a.remote.client().await?.worker_token_add(&a.name).await?;
            eprintln!("worker enrolment token {} added; the token:", t.id);
            outln!("{}", t.token);
        }
        AdminCmd::Token(TokenCmd::List(a)) => {
            let tokens = a.remote.client().await?.token_list().await?;
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&tokens)?);
            } else {
                let mut table = crate::table::new(&["ID", "ROLE", "NAME", "STATE"]);
                for t in tokens {
                    table.add_row([
                        t.id,
                        t.role.to_string(),
                        t.name,
                        (if t.revoked { "revoked" } else { "active" }).to_string(),
                    ]);
                }
                outln!("{table}");
            }
        }
        AdminCmd::Tenant(TenantCmd::Token(a)) => {
            another_token("tenant", &a.name, &a.remote).await?
        }
        AdminCmd::Provider(ProviderCmd::Token(a)) => {
            another_token("provider", &a.name, &a.remote).await?
        }
        AdminCmd::Provider(ProviderCmd::Add(a)) => {
            let t = a.remote.client().await?.provider_add(&a.name).await?;
            eprintln!("provider {} added (token {}); its token:", a.name, t.id);
            outln!("{}", t.token);
        }
        AdminCmd::Worker(WorkerCmd::Drain(a)) => {
            let ids = a.remote.client().await?.worker_drain(&a.name).await?;
            let (whose, only, leave) = if ids.len() == 1 {
                ("its", "only it holds", "it leaves")
            } else {
                ("their", "only they hold", "they leave")
            };
            outln!(
                "draining {}: {whose} tasks checkpoint and move, the outputs {only} are \
                 copied to other workers; then {leave}",
                ids.join(", ")
            );
        }
        AdminCmd::Group(GroupCmd::Add(a)) => {
            let mut c = a.remote.client().await?;
            let g = c.group_add(a.node_id, &a.address).await?;
            print_group(&g, a.json)?;
        }
        AdminCmd::Group(GroupCmd::Remove(a)) => {
            let g = a.remote.client().await?.group_remove(a.node_id).await?;
            print_group(&g, a.json)?;
        }
        AdminCmd::Token(TokenCmd::Revoke(a)) => {
            let t = a.remote.client().await?.token_revoke(&a.id).await?;
            outln!("{} ({} {}) revoked", t.id, t.role, t.name);
        }
    }
    Ok(())
}

/// The group's members after a change, as a table (or JSON).
fn print_group(g: &flotilla::cluster::ha::GroupStatus, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(g)?);
        return Ok(());
    }
    let mut t = crate::table::new(&["NODE", "ADDRESS", "ROLE", ">MATCHED"]);
    for m in &g.members {
        let role = match (m.leader, m.voter) {
            (true, _) => "leader",
            (false, true) => "voter",
            (false, false) => "learner",
        };
        t.add_row([
            m.id.to_string(),
            m.address.clone(),
            role.to_string(),
            m.matched.map_or("-".to_string(), |i| i.to_string()),
        ]);
    }
    outln!("{t}");
    if !g.journal_clock {
        outln!(
            "the journal's clock is not written: a member runs an older flotilla (jobs' times \
             replay at the last clock written until every member is upgraded)"
        );
    }
    Ok(())
}

/// `flotilla provider list`.
#[derive(Subcommand)]
pub(crate) enum ProviderTopCmd {
    /// The providers: their live workers, what those offer, their prices.
    List(ListArgs),
}

/// Runs `flotilla provider ...`.
pub(crate) async fn provider(cmd: ProviderTopCmd) -> Result<()> {
    match cmd {
        ProviderTopCmd::List(a) => {
            let list = a.remote.client().await?.provider_list().await?;
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let mut t = crate::table::new(&[
                    "PROVIDER",
                    ">WORKERS",
                    ">CPUS",
                    ">GPUS",
                    "TOKEN",
                    ">REPUTATION",
                    ">ACCEPTED",
                    ">REJECTED",
                    ">EARNED",
                    "AVAILABLE",
                    "PRICES (credits per unit-hour)",
                ]);
                for p in list {
                    let available = if p.availability.is_empty() {
                        "always".to_string()
                    } else {
                        p.availability.join("; ")
                    };
                    t.add_row([
                        p.name,
                        p.workers.len().to_string(),
                        p.cpus.to_string(),
                        p.gpus.to_string(),
                        (if p.revoked { "revoked" } else { "active" }).to_string(),
                        if p.eligible {
                            format!("{:.2}", p.reputation)
                        } else {
                            format!("{:.2} (out)", p.reputation)
                        },
                        p.accepted.to_string(),
                        p.rejected.to_string(),
                        format!("{:.6}", p.earned),
                        available,
                        p.prices.join("; "),
                    ]);
                }
                outln!("{t}");
            }
        }
    }
    Ok(())
}

/// `flotilla ledger`.
#[derive(Args)]
pub(crate) struct LedgerArgs {
    /// Only this tenant's accounts (the admin; a tenant always sees its own only).
    #[arg(long)]
    tenant: Option<String>,
    /// One JSON document: `accounts` (name, kind, balance) and, for the admin, `platform`,
    /// `issued` and `total`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args, Debug)]
pub(crate) struct BudgetArgs {
    /// The job id: `7` or `job-7`.
    #[arg(value_parser = crate::cluster_cmd::job_number)]
    job: u64,
    /// Credits more it may spend: `+50`, `12.5`.
    #[arg(allow_hyphen_values = true)]
    amount: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// Runs `flotilla budget JOB +N`: a job paused for want of budget resumes.
pub(crate) async fn budget(a: BudgetArgs) -> Result<()> {
    let job = flotilla::core::JobId::new(a.job);
    let doc = a.remote.client().await?.budget(job, &a.amount).await?;
    outln!(
        "job {}: budget {} credits (spent {}, held {})",
        job.0,
        doc["budget"],
        doc["spent"],
        doc["held"]
    );
    Ok(())
}

/// `admin tenant token NAME` / `admin provider token NAME`: one more token for `name`.
async fn another_token(role: &str, name: &str, remote: &RemoteArgs) -> Result<()> {
    let t = remote.client().await?.token_add(role, name).await?;
    eprintln!(
        "a new token {} for {role} {name} (its other tokens stay valid until revoked):",
        t.id
    );
    outln!("{}", t.token);
    Ok(())
}

/// Runs `flotilla ledger`.
pub(crate) async fn ledger(a: LedgerArgs) -> Result<()> {
    let doc = a.remote.client().await?.ledger(a.tenant.as_deref()).await?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let accounts = doc["accounts"].as_array().map_or(&[][..], Vec::as_slice);
    if accounts.is_empty() {
        // A header over nothing read as a failure to list.
        match &a.tenant {
            // The coordinator shows no one another's accounts, nor says which tenants exist.
            Some(t) => eprintln!(
                "no account of tenant {t} to show: no credits have moved for it, no tenant has \
                 that name (`flotilla admin tenant list`), or it is not yours"
            ),
            None => eprintln!("no accounts yet"),
        }
        return Ok(());
    }
    let mut t = crate::table::new(&["KIND", "ACCOUNT", ">BALANCE"]);
    for acc in accounts {
        t.add_row([
            acc["kind"].as_str().unwrap_or("?").to_string(),
            acc["name"].as_str().unwrap_or("?").to_string(),
            flotilla::pool::Credits::micro(acc["balance_micro"].as_i64().unwrap_or(0)).to_string(),
        ]);
    }
    outln!("{t}");
    if let Some(total) = doc["total_micro"].as_i64() {
        outln!(
            "total {} (credits handed out: {})",
            flotilla::pool::Credits::micro(total),
            doc["issued"]
        );
    }
    Ok(())
}
