//! Who may do what: tokens (stored hashed), tenants with quotas, roles, and the per-worker
//! credentials the coordinator mints at registration.
//!
//! | role | token | may |
//! | --- | --- | --- |
//! | admin | `STATE/token`, written on first start | everything, including shutdown and the `admin` RPCs |
//! | tenant | printed once by `flotilla admin tenant add` | submit; status, watch, logs, outputs, cancel and remove of its own jobs |
//! | worker enrolment | printed once by `flotilla admin worker-token add` | register a worker (and nothing else) |
//! | worker credential | minted by the coordinator at registration | its own session; objects for its assignments |
//!
//! The registry lives in `STATE/access.json` (mode 0600, replaced atomically): token ids,
//! roles, names, creation times, revocations and the BLAKE3 hash of each token, never the
//! token. A worker credential is not stored: it is `wc.<worker>.<enrolment id>.<mac>` with
//! the MAC keyed by the registry's secret, so it survives a coordinator restart (a worker
//! proves who it was before the restart with it) and dies with its enrolment token.
//!
//! The registry is not in the journal: it changes rarely, is read on every request (an
//! `RwLock` here, no trip through the core thread), and a journal compaction must never
//! drop a revocation.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use flotilla_core::WorkerId;
use parking_lot::RwLock;
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The registry's file name inside a server's state directory.
pub const ACCESS_FILE: &str = "access.json";

/// The name jobs submitted with the admin token are filed under.
pub const ADMIN_TENANT: &str = "admin";

/// What went wrong with the registry or a request to change it.
#[derive(Debug, Error)]
pub enum AccessError {
    /// The registry file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The registry file is not one this version reads.
    #[error("{path}: {message}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A refused request (a bad tenant name, a duplicate, an unknown token id).
    #[error("{0}")]
    Refused(String),
}

type Result<T> = std::result::Result<T, AccessError>;

/// A token's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything.
    Admin,
    /// One tenant's jobs.
    Tenant,
    /// Enrols workers.
    Worker,
    /// Enrols a provider's workers (the pool): like `Worker`, and they are that provider's.
    Provider,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Admin => "admin",
            Role::Tenant => "tenant",
            Role::Worker => "worker",
            Role::Provider => "provider",
        })
    }
}

pub use crate::state::Quota;

/// A change to a tenant's quotas (`flotilla admin tenant set`): for each, `None` keeps it,
/// `Some(None)` lifts it (no limit), `Some(Some(v))` sets it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuotaChange {
    /// The most CPUs its tasks hold at once.
    pub cpus: Option<Option<f64>>,
    /// The most GPUs its tasks hold at once.
    pub gpus: Option<Option<f64>>,
    /// The most of its jobs that run at once.
    pub running_jobs: Option<Option<u32>>,
    /// The most tasks one of its jobs may have.
    pub tasks: Option<Option<u64>>,
}

impl QuotaChange {
    /// The quota names `flotilla admin tenant set` lifts (`--cpus none`).
    pub const NAMES: [&'static str; 4] = ["cpus", "gpus", "running_jobs", "tasks"];

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none()
            && self.gpus.is_none()
            && self.running_jobs.is_none()
            && self.tasks.is_none()
    }

    /// `q` with the change made.
    pub fn applied_to(&self, q: &Quota) -> Quota {
        Quota {
            cpus: self.cpus.unwrap_or(q.cpus),
            gpus: self.gpus.unwrap_or(q.gpus),
            running_jobs: self.running_jobs.unwrap_or(q.running_jobs),
            tasks: self.tasks.unwrap_or(q.tasks),
        }
    }
}

/// A tenant as listed by `flotilla admin tenant list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    /// Its name (jobs are filed under it).
    pub name: String,
    /// Its quotas.
    #[serde(default)]
    pub quota: Quota,
    /// When it was added (Unix milliseconds).
    pub created_ms: u64,
}

/// A token as listed by `flotilla admin token list` (never the token or its hash).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// Its id (`flotilla admin token revoke ID`).
    pub id: String,
    /// Its role.
    pub role: Role,
    /// The tenant's name, the enrolment token's `--name`, or `admin`.
    pub name: String,
    /// When it was made (Unix milliseconds).
    pub created_ms: u64,
    /// Whether it was revoked.
    pub revoked: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct TokenEntry {
    #[serde(flatten)]
    info: TokenInfo,
    /// BLAKE3 of the token, hex.
    hash: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Registry {
    version: u32,
    /// Keys the worker credentials' MACs (hex, 32 bytes).
    secret: String,
    next_token: u64,
    tokens: Vec<TokenEntry>,
    tenants: Vec<Tenant>,
    /// The pool's providers (registries written before the pool have none).
    #[serde(default)]
    providers: Vec<Provider>,
}

/// A provider of machines (the pool).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provider {
    /// Its name.
    pub name: String,
    /// When it was added (Unix milliseconds).
    pub created_ms: u64,
}

/// A provider as `flotilla provider list` starts from: its name and its token's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProviderInfo {
    /// Its name.
    pub name: String,
    /// Its token's id.
    pub token: String,
    /// Whether that token was revoked (its workers were refused from then on).
    pub revoked: bool,
}

/// Who sent a request, as its token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// The admin token.
    Admin {
        /// The token's id.
        token: String,
    },
    /// A tenant's token.
    Tenant {
        /// The token's id.
        token: String,
        /// The tenant.
        tenant: String,
    },
    /// A worker enrolment token (registers workers only).
    Enrolment {
        /// The token's id.
        token: String,
    },
    /// A registered worker's credential.
    Worker {
        /// The worker it was minted for.
        worker: WorkerId,
        /// The id of the token it enrolled with.
        token: String,
    },
}

impl Principal {
    /// The id of the token that grants it (for a worker, the token it enrolled with).
    pub fn token_id(&self) -> &str {
        match self {
            Principal::Admin { token }
            | Principal::Tenant { token, .. }
            | Principal::Enrolment { token }
            | Principal::Worker { token, .. } => token,
        }
    }

    /// Whether it is the admin.
    pub fn is_admin(&self) -> bool {
        matches!(self, Principal::Admin { .. })
    }

    /// The jobs it sees: all (admin), its tenant's, or none (workers).
    pub fn scope(&self) -> Option<Scope> {
        match self {
            Principal::Admin { .. } => Some(Scope::All),
            Principal::Tenant { tenant, .. } => Some(Scope::Tenant(tenant.clone())),
            _ => None,
        }
    }

    /// The tenant its jobs are filed under, if it may submit.
    pub fn submits_as(&self) -> Option<&str> {
        match self {
            Principal::Admin { .. } => Some(ADMIN_TENANT),
            Principal::Tenant { tenant, .. } => Some(tenant),
            _ => None,
        }
    }

    /// Its role, for messages.
    pub fn role(&self) -> &'static str {
        match self {
            Principal::Admin { .. } => "admin",
            Principal::Tenant { .. } => "tenant",
            Principal::Enrolment { .. } => "worker enrolment",
            Principal::Worker { .. } => "worker",
        }
    }
}

/// The jobs a request may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every job (admin).
    All,
    /// One tenant's jobs.
    Tenant(String),
}

impl Scope {
    /// Whether a job filed under `tenant` is visible.
    pub fn sees(&self, tenant: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenant(t) => t == tenant,
        }
    }
}

struct Inner {
    reg: Registry,
    /// Token hash → index in `reg.tokens`.
    by_hash: HashMap<[u8; 32], usize>,
    secret: [u8; 32],
}

/// The registry, shared by every listener and the core.
pub struct Access {
    path: PathBuf,
    inner: RwLock<Inner>,
    /// Bumped at every revocation: open streams check their principal again.
    revoked: tokio::sync::watch::Sender<u64>,
    /// In a group of coordinators: writes the registry on every node (see
    /// [`Access::replicate_through`]) instead of only here.
    replicator: RwLock<Option<Replicator>>,
}

/// Makes a new registry (the bytes of `access.json`) durable on a group's majority and
/// written on each node; `Err`: why not.
pub type Replicator =
    std::sync::Arc<dyn Fn(&[u8]) -> std::result::Result<(), String> + Send + Sync>;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn token_hash(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

/// The ticket for object `hash` under a worker's data key: what a fetch from that worker
/// presents. Only the coordinator (which derives every worker's key) and the worker itself
/// can make one, so a worker serves an object only to whom the coordinator gave a ticket.
pub fn ticket(key: &[u8; 32], hash: &str) -> String {
    hex(blake3::keyed_hash(key, hash.as_bytes()).as_bytes())
}

/// Parses a data key sent as hex.
pub fn parse_key(s: &str) -> Option<[u8; 32]> {
    unhex32(s)
}

/// Hex of a key.
pub fn key_hex(k: &[u8; 32]) -> String {
    hex(k)
}

/// Refuses negative, NaN or infinite amounts.
fn check_quota(q: &Quota) -> Result<()> {
    // Zero jobs at once, or zero tasks per job: no job of the tenant could ever run.
    if q.running_jobs == Some(0) || q.tasks == Some(0) {
        let flag = if q.running_jobs == Some(0) {
            "--running-jobs"
        } else {
            "--tasks"
        };
        return Err(AccessError::Refused(format!(
            "quota {flag} 0: no job of the tenant could ever run (at least 1; no limit: leave \
             it out, or `none` in `tenant set`)"
        )));
    }
    for (what, v) in [("cpus", q.cpus), ("gpus", q.gpus)] {
        if let Some(v) = v {
            if !v.is_finite() || v < 0.0 {
                return Err(AccessError::Refused(format!(
                    "quota {what} = {v}: a finite amount, at least 0"
                )));
            }
        }
    }
    Ok(())
}

/// A tenant name: 1 to 64 of `a-z`, `0-9`, `_` and `-`, starting with a letter or a digit.
pub fn check_tenant_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if !ok {
        return Err(AccessError::Refused(format!(
            "tenant name {name:?}: 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or \
             a digit"
        )));
    }
    if name == ADMIN_TENANT {
        return Err(AccessError::Refused(format!(
            "tenant name {name:?} is reserved for the admin's own jobs"
        )));
    }
    Ok(())
}

impl Access {
    /// Opens (or creates) `STATE/access.json`; `admin_token` (the content of `STATE/token`)
    /// is the one admin token: an admin token recorded before with another value (the file
    /// was removed to get a new one) is revoked.
    pub fn open(state_dir: &Path, admin_token: &str) -> Result<Access> {
        let path = state_dir.join(ACCESS_FILE);
        let io = |e| AccessError::Io {
            path: path.display().to_string(),
            source: e,
        };
        let mut reg = match std::fs::read(&path) {
            Ok(bytes) => {
                use std::os::unix::fs::PermissionsExt as _;
                let mode = std::fs::metadata(&path).map_err(io)?.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(AccessError::Corrupt {
                        path: path.display().to_string(),
                        message: format!(
                            "readable by users other than its owner (mode {mode:o}): it holds the key of the \
                             workers' credentials; chmod 600 it"
                        ),
                    });
                }
                let reg: Registry =
                    serde_json::from_slice(&bytes).map_err(|e| AccessError::Corrupt {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?;
                if reg.version != 1 {
                    return Err(AccessError::Corrupt {
                        path: path.display().to_string(),
                        message: format!("format version {} (this build reads 1)", reg.version),
                    });
                }
                reg
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Registry {
                version: 1,
                secret: random_hex(),
                next_token: 1,
                tokens: Vec::new(),
                tenants: Vec::new(),
                providers: Vec::new(),
            },
            Err(e) => return Err(io(e)),
        };
        let secret = unhex32(&reg.secret).ok_or_else(|| AccessError::Corrupt {
            path: path.display().to_string(),
            message: "the secret is not 64 hex digits".into(),
        })?;
        let admin_hash = hex(&token_hash(admin_token));
        let mut changed = !path.exists();
        let mut have_admin = false;
        for t in &mut reg.tokens {
            if t.info.role == Role::Admin && !t.info.revoked {
                if t.hash == admin_hash {
                    have_admin = true;
                } else {
                    t.info.revoked = true;
                    changed = true;
                }
            }
        }
        if !have_admin {
            let id = format!("tok-{}", reg.next_token);
            reg.next_token += 1;
            reg.tokens.push(TokenEntry {
                info: TokenInfo {
                    id,
                    role: Role::Admin,
                    name: ADMIN_TENANT.into(),
                    created_ms: now_ms(),
                    revoked: false,
                },
                hash: admin_hash,
            });
            changed = true;
        }
        let mut inner = Inner {
            reg,
            by_hash: HashMap::new(),
            secret,
        };
        inner.index();
        let (revoked, _) = tokio::sync::watch::channel(0);
        let access = Access {
            path,
            inner: RwLock::new(inner),
            revoked,
            replicator: RwLock::new(None),
        };
        if changed {
            access.save(&access.inner.read().reg)?;
        }
        Ok(access)
    }

    /// From now on every change is replicated by `r` (a group's leader); the registry as it
    /// is now goes first, so the group shares its secret and tokens from the start.
    pub fn replicate_through(&self, r: Replicator) -> Result<()> {
        *self.replicator.write() = Some(r);
        let reg = self.inner.read().reg.clone();
        self.save(&reg)
    }

    fn save(&self, reg: &Registry) -> Result<()> {
        let io = |e| AccessError::Io {
            path: self.path.display().to_string(),
            source: e,
        };
        let bytes = serde_json::to_vec_pretty(reg).map_err(|e| AccessError::Corrupt {
            path: self.path.display().to_string(),
            message: e.to_string(),
        })?;
        let replicator = self.replicator.read().clone();
        if let Some(r) = replicator {
            return r(&bytes).map_err(|e| io(std::io::Error::other(e)));
        }
        let tmp = self.path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// Applies `change` to a copy of the registry, writes it, and only then makes it current:
    /// nothing is granted (or reported revoked) before it is on disk.
    fn change<T>(&self, change: impl FnOnce(&mut Registry) -> Result<T>) -> Result<T> {
        let mut inner = self.inner.write();
        let mut reg = inner.reg.clone();
        let out = change(&mut reg)?;
        self.save(&reg)?;
        inner.reg = reg;
        inner.index();
        Ok(out)
    }

    /// Who `token` is, or `None` (unknown, revoked, or a credential that does not verify).
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let inner = self.inner.read();
        if let Some(rest) = token.strip_prefix("wc.") {
            let (worker, enrolment) = inner.verify_credential(rest)?;
            return Some(Principal::Worker {
                worker,
                token: enrolment,
            });
        }
        let i = *inner.by_hash.get(&token_hash(token))?;
        let t = &inner.reg.tokens[i].info;
        if t.revoked {
            return None;
        }
        Some(match t.role {
            Role::Admin => Principal::Admin {
                token: t.id.clone(),
            },
            Role::Tenant => Principal::Tenant {
                token: t.id.clone(),
                tenant: t.name.clone(),
            },
            Role::Worker | Role::Provider => Principal::Enrolment {
                token: t.id.clone(),
            },
        })
    }

    /// Whether `p` still holds (its token, or its worker's enrolment token, not revoked).
    pub fn still_valid(&self, p: &Principal) -> bool {
        let inner = self.inner.read();
        inner
            .reg
            .tokens
            .iter()
            .any(|t| t.info.id == p.token_id() && !t.info.revoked)
    }

    /// A receiver that changes at every revocation.
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revoked.subscribe()
    }

    /// The credential of `worker`, enrolled with token `enrolment` (an id).
    pub fn credential(&self, worker: WorkerId, enrolment: &str) -> String {
        let inner = self.inner.read();
        format!(
            "wc.{}.{enrolment}.{}",
            worker.0,
            inner.mac(worker, enrolment)
        )
    }

    /// The key worker `worker` checks fetch tickets with (given to it at registration).
    pub fn data_key(&self, worker: WorkerId) -> [u8; 32] {
        let inner = self.inner.read();
        let msg = format!("flotilla data key\0{}", worker.0);
        *blake3::keyed_hash(&inner.secret, msg.as_bytes()).as_bytes()
    }

    /// A ticket to fetch object `hash` from worker `holder`.
    pub fn ticket(&self, holder: WorkerId, hash: &str) -> String {
        ticket(&self.data_key(holder), hash)
    }

    /// Adds a tenant; its token (shown once).
    pub fn add_tenant(&self, name: &str, quota: Quota) -> Result<(TokenInfo, String)> {
        check_tenant_name(name)?;
        check_quota(&quota)?;
        self.change(|reg| {
            if reg.tenants.iter().any(|t| t.name == name) {
                return Err(AccessError::Refused(format!(
                    "tenant {name:?} exists already (another token for it: `flotilla admin \
                     tenant token {name}`)"
                )));
            }
            reg.tenants.push(Tenant {
                name: name.to_string(),
                quota,
                created_ms: now_ms(),
            });
            Ok(Self::new_token(reg, Role::Tenant, name))
        })
    }

    /// Changes tenant `name`'s quotas; the tenant as it is now. Jobs already running keep
    /// what they hold: a lower quota holds back their next tasks, a higher one lets waiting
    /// work start at the next placement.
    pub fn set_quota(&self, name: &str, change: &QuotaChange) -> Result<Tenant> {
        self.change(|reg| {
            let t = reg
                .tenants
                .iter_mut()
                .find(|t| t.name == name)
                .ok_or_else(|| {
                    AccessError::Refused(format!(
                        "no tenant {name:?} (`flotilla admin tenant list` lists them)"
                    ))
                })?;
            let quota = change.applied_to(&t.quota);
            check_quota(&quota)?;
            t.quota = quota;
            Ok(t.clone())
        })
    }

    /// Adds a provider of machines and its token (shown once): workers that enrol with it
    /// are that provider's.
    pub fn add_provider(&self, name: &str) -> Result<(TokenInfo, String)> {
        check_tenant_name(name).map_err(|_| {
            AccessError::Refused(format!(
                "provider name {name:?}: 1 to 64 of a-z, 0-9, '_' and '-', starting with a \
                 letter or a digit"
            ))
        })?;
        self.change(|reg| {
            if reg.providers.iter().any(|p| p.name == name) {
                return Err(AccessError::Refused(format!(
                    "provider {name:?} exists already (another token for it: `flotilla admin \
                     provider token {name}`)"
                )));
            }
            reg.providers.push(Provider {
                name: name.to_string(),
                created_ms: now_ms(),
            });
            Ok(Self::new_token(reg, Role::Provider, name))
        })
    }

    /// One more token for tenant or provider `name` (`role`), which must exist: a lost or
    /// leaked token is replaced, then revoked (`revoke`); its other tokens stay valid.
    pub fn add_token_for(&self, role: Role, name: &str) -> Result<(TokenInfo, String)> {
        self.change(|reg| {
            let (known, what, list) = match role {
                Role::Tenant => (
                    reg.tenants.iter().any(|t| t.name == name),
                    "tenant",
                    "`flotilla admin tenant list`",
                ),
                Role::Provider => (
                    reg.providers.iter().any(|p| p.name == name),
                    "provider",
                    "`flotilla provider list`",
                ),
                _ => {
                    return Err(AccessError::Refused(
                        "only a tenant or a provider gets a token by name (worker enrolment \
                         tokens: `flotilla admin worker-token add`)"
                            .into(),
                    ))
                }
            };
            if !known {
                return Err(AccessError::Refused(format!(
                    "no {what} {name:?} ({list} lists them)"
                )));
            }
            Ok(Self::new_token(reg, role, name))
        })
    }

    /// The provider whose token has id `token` (`None`: not a provider's token).
    pub fn provider_of(&self, token: &str) -> Option<String> {
        let inner = self.inner.read();
        inner
            .reg
            .tokens
            .iter()
            .find(|t| t.info.id == token && t.info.role == Role::Provider)
            .map(|t| t.info.name.clone())
    }

    /// Every provider, with its token's id and state.
    pub fn providers(&self) -> Vec<ProviderInfo> {
        let inner = self.inner.read();
        inner
            .reg
            .providers
            .iter()
            .map(|p| {
                // Its newest live token (one added to replace a revoked one), else its last.
                let mine = || {
                    inner
                        .reg
                        .tokens
                        .iter()
                        .filter(|t| t.info.role == Role::Provider && t.info.name == p.name)
                };
                let token = mine()
                    .rev()
                    .find(|t| !t.info.revoked)
                    .or_else(|| mine().next_back());
                ProviderInfo {
                    name: p.name.clone(),
                    token: token.map(|t| t.info.id.clone()).unwrap_or_default(),
                    revoked: token.is_none_or(|t| t.info.revoked),
                }
            })
            .collect()
    }

    /// Adds a worker enrolment token; the token (shown once).
    pub fn add_worker_token(&self, name: &str) -> Result<(TokenInfo, String)> {
        if name.len() > 64 || name.chars().any(|c| c.is_control()) {
            return Err(AccessError::Refused(format!(
                "worker token name {name:?}: at most 64 printable characters"
            )));
        }
        self.change(|reg| Ok(Self::new_token(reg, Role::Worker, name)))
    }

    fn new_token(reg: &mut Registry, role: Role, name: &str) -> (TokenInfo, String) {
        let token = format!("flt_{}", random_hex());
        let info = TokenInfo {
            id: format!("tok-{}", reg.next_token),
            role,
            name: name.to_string(),
            created_ms: now_ms(),
            revoked: false,
        };
        reg.next_token += 1;
        reg.tokens.push(TokenEntry {
            info: info.clone(),
            hash: hex(&token_hash(&token)),
        });
        (info, token)
    }

    /// Revokes token `id` (a worker enrolment token: the credentials of every worker enrolled
    /// with it too). Open streams of its holders end.
    pub fn revoke(&self, id: &str) -> Result<TokenInfo> {
        let info = self.change(|reg| {
            let t = reg
                .tokens
                .iter_mut()
                .find(|t| t.info.id == id)
                .ok_or_else(|| AccessError::Refused(format!("no token {id:?}")))?;
            if t.info.role == Role::Admin {
                return Err(AccessError::Refused(format!(
                    "{id} is the admin token: to replace it, stop the server, remove \
                     STATE/token and start it again"
                )));
            }
            if t.info.revoked {
                return Err(AccessError::Refused(format!("{id} is revoked already")));
            }
            t.info.revoked = true;
            Ok(t.info.clone())
        })?;
        self.revoked.send_modify(|n| *n += 1);
        Ok(info)
    }

    /// Every token (ids, roles, names; never a token or its hash).
    pub fn tokens(&self) -> Vec<TokenInfo> {
        let inner = self.inner.read();
        inner.reg.tokens.iter().map(|t| t.info.clone()).collect()
    }

    /// Every tenant.
    pub fn tenants(&self) -> Vec<Tenant> {
        self.inner.read().reg.tenants.clone()
    }

    /// One tenant's quota (`None`: no such tenant, e.g. the admin).
    pub fn quota(&self, tenant: &str) -> Option<Quota> {
        let inner = self.inner.read();
        inner
            .reg
            .tenants
            .iter()
            .find(|t| t.name == tenant)
            .map(|t| t.quota.clone())
    }
}

impl Inner {
    fn index(&mut self) {
        self.by_hash = self
            .reg
            .tokens
            .iter()
            .enumerate()
            .filter_map(|(i, t)| unhex32(&t.hash).map(|h| (h, i)))
            .collect();
    }

    fn mac(&self, worker: WorkerId, enrolment: &str) -> String {
        let msg = format!("flotilla worker credential\0{}\0{enrolment}", worker.0);
        hex(blake3::keyed_hash(&self.secret, msg.as_bytes()).as_bytes())
    }

    /// `<worker>.<enrolment id>.<mac>` → the worker and its enrolment token, if the MAC
    /// verifies and the enrolment token is not revoked.
    fn verify_credential(&self, rest: &str) -> Option<(WorkerId, String)> {
        let mut parts = rest.splitn(3, '.');
        let worker: u32 = parts.next()?.parse().ok()?;
        let enrolment = parts.next()?;
        let mac = parts.next()?;
        let want = self.mac(WorkerId::new(worker), enrolment);
        if !crate::auth::ct_eq(mac.as_bytes(), want.as_bytes()) {
            return None;
        }
        let t = self.reg.tokens.iter().find(|t| t.info.id == enrolment)?;
        if t.info.revoked || !matches!(t.info.role, Role::Worker | Role::Provider | Role::Admin) {
            return None;
        }
        Some((WorkerId::new(worker), enrolment.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> Access {
        Access::open(dir, "the-admin-token-0123456789").expect("opened")
    }

    #[test]
    fn tokens_are_stored_hashed_and_roles_come_from_the_registry() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = open(dir.path());
        let (alice, alice_token) = a
            .add_tenant(
                "alice",
                Quota {
                    cpus: Some(4.0),
                    ..Quota::default()
                },
            )
            .expect("added");
        let (_, enrol) = a.add_worker_token("rack1").expect("added");
        let text = std::fs::read_to_string(dir.path().join(ACCESS_FILE)).expect("written");
        for secret in [&alice_token, &enrol, "the-admin-token-0123456789"] {
            assert!(!text.contains(secret), "a token in the clear");
        }
        assert_eq!(
            a.authenticate(&alice_token),
            Some(Principal::Tenant {
                token: alice.id.clone(),
                tenant: "alice".into()
            })
        );
        assert!(matches!(
            a.authenticate("the-admin-token-0123456789"),
            Some(Principal::Admin { .. })
        ));
        assert!(matches!(
            a.authenticate(&enrol),
            Some(Principal::Enrolment { .. })
        ));
        assert_eq!(a.authenticate("flt_guess"), None);
        // Reopened: the same answers.
        drop(a);
        let a = open(dir.path());
        assert_eq!(a.quota("alice").and_then(|q| q.cpus), Some(4.0));
        assert!(a.authenticate(&alice_token).is_some());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join(ACCESS_FILE))
            .expect("there")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn quotas_no_job_could_run_under_are_refused() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = open(dir.path());
        for q in [
            Quota {
                running_jobs: Some(0),
                ..Quota::default()
            },
            Quota {
                tasks: Some(0),
                ..Quota::default()
            },
        ] {
            let e = a.add_tenant("frank", q).expect_err("refused");
            assert!(
                e.to_string()
                    .contains("no job of the tenant could ever run"),
                "{e}"
            );
        }
        // No GPUs at all is a quota (CPU-only work).
        let q = Quota {
            gpus: Some(0.0),
            ..Quota::default()
        };
        a.add_tenant("frank", q).expect("added");
    }

    #[test]
    fn a_revoked_providers_token_is_replaced_and_the_live_one_listed() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = open(dir.path());
        let (old, _) = a.add_provider("acme").expect("added");
        a.revoke(&old.id).expect("revoked");
        assert!(a.providers()[0].revoked);
        let (new, token) = a
            .add_token_for(Role::Provider, "acme")
            .expect("a new token");
        assert_ne!(new.id, old.id);
        assert_eq!(a.providers()[0].token, new.id);
        assert!(!a.providers()[0].revoked);
        assert_eq!(
            a.authenticate(&token)
                .and_then(|p| a.provider_of(&new.id).map(|n| (p, n)))
                .map(|(_, n)| n),
            Some("acme".to_string())
        );
        // Only for one that exists, and only tenants' and providers'.
        assert!(a.add_token_for(Role::Provider, "nobody").is_err());
        assert!(a.add_token_for(Role::Tenant, "acme").is_err());
        assert!(a.add_token_for(Role::Worker, "acme").is_err());
    }

    #[test]
    fn revocation_holds_across_a_restart_and_takes_the_workers_credentials() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = open(dir.path());
        let (t, tenant) = a.add_tenant("bob", Quota::default()).expect("added");
        let (w, enrol) = a.add_worker_token("").expect("added");
        let cred = a.credential(WorkerId::new(7), &w.id);
        let p = a.authenticate(&cred).expect("a valid credential");
        assert_eq!(
            p,
            Principal::Worker {
                worker: WorkerId::new(7),
                token: w.id.clone()
            }
        );
        // A credential for another worker cannot be made from this one.
        let forged = cred.replacen("wc.7.", "wc.8.", 1);
        assert_eq!(a.authenticate(&forged), None);
        let rx = a.revocations();
        a.revoke(&w.id).expect("revoked");
        assert!(rx.has_changed().expect("open"));
        assert_eq!(a.authenticate(&enrol), None);
        assert_eq!(a.authenticate(&cred), None, "the credential dies with it");
        assert!(!a.still_valid(&p));
        a.revoke(&t.id).expect("revoked");
        // Again: said (it printed "revoked" as if it had just been).
        let again = a.revoke(&t.id).expect_err("revoked twice");
        assert!(again.to_string().contains("revoked already"), "{again}");
        drop(a);
        let a = open(dir.path());
        assert_eq!(a.authenticate(&tenant), None);
        assert_eq!(a.authenticate(&cred), None);
        let e = a.revoke("tok-1").expect_err("the admin token");
        assert!(e.to_string().contains("admin token"), "{e}");
        let e = a.revoke("tok-99").expect_err("unknown");
        assert!(e.to_string().contains("no token \"tok-99\""), "{e}");
    }

    #[test]
    fn a_new_admin_token_revokes_the_old_one() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        drop(open(dir.path()));
        let a = Access::open(dir.path(), "another-admin-token-abcdef").expect("opened");
        assert_eq!(a.authenticate("the-admin-token-0123456789"), None);
        assert!(a.authenticate("another-admin-token-abcdef").is_some());
    }

    #[test]
    fn bad_names_and_quotas_are_refused() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = open(dir.path());
        for bad in ["", "Alice", "a b", "admin", "-x", &"x".repeat(65), "a/b"] {
            assert!(a.add_tenant(bad, Quota::default()).is_err(), "{bad:?}");
        }
        a.add_tenant("ok-1", Quota::default()).expect("added");
        let e = a.add_tenant("ok-1", Quota::default()).expect_err("twice");
        assert!(e.to_string().contains("exists already"), "{e}");
        let q = Quota {
            cpus: Some(f64::NAN),
            ..Quota::default()
        };
        assert!(a.add_tenant("nan", q).is_err());
        assert!(a.tenants().iter().all(|t| t.name == "ok-1"));
    }

    #[test]
    fn a_readable_registry_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("a temporary folder");
        drop(open(dir.path()));
        let path = dir.path().join(ACCESS_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = Access::open(dir.path(), "the-admin-token-0123456789")
            .err()
            .expect("refused");
        assert!(
            e.to_string()
                .contains("readable by users other than its owner"),
            "{e}"
        );
    }

    #[test]
    fn a_quota_change_sets_lifts_and_keeps_and_is_saved() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = open(dir.path());
        let q = Quota {
            cpus: Some(4.0),
            running_jobs: Some(1),
            tasks: Some(10),
            ..Quota::default()
        };
        a.add_tenant("alice", q).expect("added");
        let change = QuotaChange {
            cpus: Some(Some(8.0)),
            running_jobs: Some(None),
            gpus: Some(Some(1.0)),
            ..QuotaChange::default()
        };
        let t = a.set_quota("alice", &change).expect("changed");
        let want = Quota {
            cpus: Some(8.0),
            gpus: Some(1.0),
            running_jobs: None,
            tasks: Some(10),
        };
        assert_eq!(t.quota, want);
        drop(a);
        let a = open(dir.path());
        assert_eq!(a.quota("alice"), Some(want.clone()));
        // Refused changes leave it as it was.
        let e = a.set_quota("bob", &change).expect_err("no bob");
        assert!(e.to_string().contains("no tenant \"bob\""), "{e}");
        let bad = QuotaChange {
            cpus: Some(Some(-1.0)),
            tasks: Some(Some(3)),
            ..QuotaChange::default()
        };
        let e = a.set_quota("alice", &bad).expect_err("negative");
        assert!(e.to_string().contains("quota cpus = -1"), "{e}");
        assert_eq!(a.quota("alice"), Some(want));
    }
}
