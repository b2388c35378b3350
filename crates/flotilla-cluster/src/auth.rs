//! Access tokens: the server writes a random token to `STATE_DIR/token` (mode 0600) on first
//! start; workers and clients present it as `authorization: Bearer <token>` on every call.
//! Requests without a valid token are refused (`UNAUTHENTICATED`) and logged.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rand::RngCore;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::error::{ClusterError, Result};

/// The token file's name inside a server's state directory.
pub const TOKEN_FILE: &str = "token";

/// Reads the admin token a server was given in `path` (`flotilla server --admin-token-file`):
/// a Kubernetes Secret or a systemd credential, which may be readable by a group (a Secret
/// mounted with an `fsGroup` is 0440) but never by others.
pub fn read_admin_token_file(path: &Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let md = std::fs::metadata(path).map_err(|e| ClusterError::io(path, e))?;
    let mode = md.permissions().mode() & 0o777;
    if mode & 0o007 != 0 {
        return Err(ClusterError::Config(format!(
            "{}: readable by users other than its owner (mode {mode:o}): anyone who reads it controls the \
             cluster; make it private (chmod o-rwx)",
            path.display()
        )));
    }
    let t = std::fs::read_to_string(path).map_err(|e| ClusterError::io(path, e))?;
    let t = t.trim().to_string();
    if t.len() < 16 || !t.is_ascii() || t.chars().any(char::is_whitespace) {
        return Err(ClusterError::Config(format!(
            "{}: not a token (one word of at least 16 ASCII characters)",
            path.display()
        )));
    }
    Ok(t)
}

/// Reads the server's token, creating a random one (mode 0600) if there is none.
pub fn load_or_create_token(state_dir: &Path) -> Result<String> {
    let path = state_dir.join(TOKEN_FILE);
    if let Ok(md) = std::fs::metadata(&path) {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = md.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(ClusterError::Config(format!(
                "{}: readable by users other than its owner (mode {mode:o}): anyone who reads it controls the \
                 cluster; make it private (chmod 600) or remove it to get a new one",
                path.display()
            )));
        }
    }
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            let t = t.trim().to_string();
            if t.len() < 16 {
                return Err(ClusterError::Config(format!(
                    "{}: token too short (at least 16 characters)",
                    path.display()
                )));
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut bytes);
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| ClusterError::io(&path, e))?;
            f.write_all(token.as_bytes())
                .map_err(|e| ClusterError::io(&path, e))?;
            f.sync_all().map_err(|e| ClusterError::io(&path, e))?;
            Ok(token)
        }
        Err(e) => Err(ClusterError::io(&path, e)),
    }
}

/// Reads a token from a file given with `--token-file`.
pub fn read_token_file(path: &Path) -> Result<String> {
    let t = std::fs::read_to_string(path).map_err(|e| {
        // `--token-file "$FLOTILLA_TOKEN"`: the secret itself, which the message must not
        // print (it did, whole).
        let text = path.to_string_lossy();
        let secret = text.len() >= 32
            && !text.contains('/')
            && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if secret && e.kind() == std::io::ErrorKind::NotFound {
            ClusterError::Config(
                "the token file given looks like a token itself (not shown here): \
                 --token-file takes the path of a file holding it; put the token in \
                 FLOTILLA_TOKEN instead"
                    .into(),
            )
        } else {
            ClusterError::Config(format!("the token file {}: {e}", path.display()))
        }
    })?;
    let t = t.trim();
    if t.is_empty() {
        // An empty token was sent as such and refused, again and again.
        return Err(ClusterError::Config(format!(
            "{}: the token file is empty",
            path.display()
        )));
    }
    Ok(t.to_string())
}

/// Where a client finds its token: `--token-file`, then `FLOTILLA_TOKEN`, then the state
/// directory of a local server.
pub fn find_token(token_file: Option<&Path>, state_dir: Option<&Path>) -> Result<String> {
    // The file named on the command line first: a flag says more than the environment.
    if let Some(f) = token_file {
        return read_token_file(f);
    }
    if let Ok(t) = std::env::var("FLOTILLA_TOKEN") {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    let candidates: Vec<PathBuf> = state_dir
        .map(|d| vec![d.join(TOKEN_FILE)])
        .unwrap_or_default();
    for c in &candidates {
        if c.exists() {
            return read_token_file(c);
        }
    }
    let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    let env = match std::env::var_os("FLOTILLA_TOKEN") {
        Some(_) => "FLOTILLA_TOKEN is empty",
        None => "FLOTILLA_TOKEN is not set",
    };
    Err(ClusterError::Config(format!(
        "no access token: {env}, no --token-file was given{}; the coordinator writes the \
         admin's token to STATE_DIR/token (`flotilla server --state STATE_DIR`), and \
         `flotilla admin tenant add` prints a tenant's token (`flotilla admin worker-token add` \
         a worker's enrolment token)",
        if looked.is_empty() {
            String::new()
        } else {
            format!(" and {} does not exist", looked.join(", "))
        }
    )))
}

/// Checks the bearer token of incoming requests (constant-time comparison).
#[derive(Clone)]
pub struct TokenCheck {
    token: std::sync::Arc<String>,
    /// What a refusal says: the group port's names the usual cause.
    refusal: &'static str,
    /// When a refusal from each address was last logged (see [`Quiet`]).
    logged: std::sync::Arc<parking_lot::Mutex<Quiet>>,
}

/// Refusals logged once a minute per peer address: a node of a group started with another
/// token asks twice a second, and each refusal was a line in every other node's log.
#[derive(Default)]
pub(crate) struct Quiet(std::collections::HashMap<String, std::time::Instant>);

/// How long refusals from one address go unlogged after one is.
const QUIET: std::time::Duration = std::time::Duration::from_secs(60);

impl Quiet {
    /// Whether a refusal from `peer` at `now` is logged (none was within [`QUIET`]).
    pub(crate) fn log(&mut self, peer: &str, now: std::time::Instant) -> bool {
        self.0
            .retain(|_, at| now.saturating_duration_since(*at) < QUIET);
        if self.0.contains_key(peer) {
            return false;
        }
        self.0.insert(peer.to_string(), now);
        true
    }
}

/// A peer's address without its port (a client's port changes with each connection).
fn host_part(peer: &str) -> &str {
    peer.rsplit_once(':').map_or(peer, |(h, _)| h)
}

impl TokenCheck {
    /// A check against `token`.
    pub fn new(token: String) -> Self {
        Self {
            token: std::sync::Arc::new(token),
            refusal: "invalid or missing access token",
            logged: Default::default(),
        }
    }

    /// The check of a group's port: the other nodes present the group's admin token.
    pub fn for_group(token: String) -> Self {
        Self {
            token: std::sync::Arc::new(token),
            refusal: "this node refuses the token presented: every node of a group must hold \
                      the same admin token (STATE/token, or --admin-token-file)",
            logged: Default::default(),
        }
    }
}

pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let ok = bearer(&req).is_some_and(|t| ct_eq(t.as_bytes(), self.token.as_bytes()));
        if ok {
            Ok(req)
        } else {
            let peer = req
                .remote_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|| "unknown peer".into());
            if self
                .logged
                .lock()
                .log(host_part(&peer), std::time::Instant::now())
            {
                tracing::warn!(
                    %peer,
                    "refused a request without a valid token: {} (further refusals from this \
                     address are not logged for a minute)",
                    self.refusal
                );
            }
            Err(Status::unauthenticated(self.refusal))
        }
    }
}

fn bearer<T>(req: &Request<T>) -> Option<&str> {
    req.metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The coordinator's check: the bearer token must be one the registry knows and has not
/// revoked; the [`Principal`](crate::access::Principal) it names rides in the request's
/// extensions for the handler to authorize.
#[derive(Clone)]
pub struct Authn {
    access: std::sync::Arc<crate::access::Access>,
}

impl Authn {
    /// A check against `access`.
    pub fn new(access: std::sync::Arc<crate::access::Access>) -> Self {
        Self { access }
    }
}

impl tonic::service::Interceptor for Authn {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        match bearer(&req).and_then(|t| self.access.authenticate(t)) {
            Some(p) => {
                req.extensions_mut().insert(p);
                Ok(req)
            }
            None => {
                // A client given a group's addresses asks, without a token, whether this
                // node answers at all (see `Remote::channel`): refused, not logged.
                if bearer(&req).is_none() && req.metadata().get(PROBE_HEADER).is_some() {
                    return Err(Status::unauthenticated("a probe: this coordinator answers"));
                }
                let peer = req
                    .remote_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "unknown peer".into());
                tracing::warn!(%peer, "refused a request without a valid token");
                Err(Status::unauthenticated(
                    "invalid, revoked or missing access token",
                ))
            }
        }
    }
}

/// The header of a liveness probe (a request without a token that only asks for an answer).
pub const PROBE_HEADER: &str = "flotilla-probe";

/// The principal [`Authn`] found for a request.
pub fn principal<T>(req: &Request<T>) -> std::result::Result<crate::access::Principal, Status> {
    req.extensions()
        .get::<crate::access::Principal>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no principal (the request was not checked)"))
}

/// Adds the bearer token to outgoing requests.
#[derive(Clone)]
pub struct TokenAdd {
    header: MetadataValue<tonic::metadata::Ascii>,
}

impl TokenAdd {
    /// Presents `token`.
    pub fn new(token: &str) -> Result<Self> {
        let header = format!("Bearer {token}").parse().map_err(|_| {
            ClusterError::Config("the access token has characters not allowed in a header".into())
        })?;
        Ok(Self { header })
    }
}

impl tonic::service::Interceptor for TokenAdd {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        req.metadata_mut()
            .insert("authorization", self.header.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn refusals_from_one_address_are_logged_once_a_minute() {
        let mut q = Quiet::default();
        let t = std::time::Instant::now();
        assert!(q.log(host_part("127.0.0.1:40001"), t));
        // Another connection from the same node: its port differs.
        assert!(!q.log(
            host_part("127.0.0.1:40002"),
            t + std::time::Duration::from_secs(1)
        ));
        assert!(q.log(
            host_part("10.0.0.2:40001"),
            t + std::time::Duration::from_secs(1)
        ));
        assert!(q.log(host_part("127.0.0.1:40003"), t + QUIET));
    }

    #[test]
    fn a_token_given_for_a_token_file_is_not_printed() {
        let token = format!("flt_{}", "ab12".repeat(16));
        let e = read_token_file(Path::new(&token)).unwrap_err().to_string();
        assert!(e.contains("looks like a token itself"), "{e}");
        assert!(!e.contains(&token), "{e}");
        let e = read_token_file(Path::new("/nonexistent/token"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/token"), "{e}");
    }

    #[test]
    fn an_admin_token_file_may_be_group_readable_but_not_world_readable() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("token");
        let set = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        std::fs::write(&path, "a-secret-token-0123456789\n").expect("written");
        set(0o440);
        assert_eq!(
            read_admin_token_file(&path).expect("read"),
            "a-secret-token-0123456789"
        );
        set(0o444);
        let e = read_admin_token_file(&path).expect_err("world-readable");
        assert!(
            e.to_string()
                .contains("readable by users other than its owner"),
            "{e}"
        );
        set(0o400);
        std::fs::write(&path, "short").expect("written");
        assert!(read_admin_token_file(&path).is_err());
        assert!(read_admin_token_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn the_token_is_private_and_a_readable_one_is_refused() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let token = load_or_create_token(dir.path()).expect("created");
        let path = dir.path().join(TOKEN_FILE);
        let mode = std::fs::metadata(&path)
            .expect("written")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_or_create_token(dir.path()).expect("read back"), token);
        for loose in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).expect("chmod");
            let e = load_or_create_token(dir.path()).expect_err("a readable token");
            assert!(
                e.to_string()
                    .contains("readable by users other than its owner"),
                "{e}"
            );
            assert!(e.to_string().contains(&format!("{loose:o}")), "{e}");
        }
    }
}
