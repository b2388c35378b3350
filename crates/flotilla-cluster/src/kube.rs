//! The Kubernetes API from inside a pod, for the one thing the coordinator asks of it: the
//! `controller.kubernetes.io/pod-deletion-cost` of its workers' pods (`flotilla server
//! --pod-deletion-cost`).
//!
//! When an autoscaler lowers the workers' Deployment, the ReplicaSet deletes the pods of
//! lowest deletion cost first (Kubernetes 1.22 and later; 1.21 behind the `PodDeletionCost`
//! feature gate). Without it, it picks among equally ready pods by age and node, busy or
//! idle, and a busy worker's tasks are preempted. The coordinator knows which workers run
//! what, so it sets each worker pod's cost to the attempts placed on it: idle workers (0) go
//! first, then the least loaded. How often a cost changes is bounded ([`CostPolicy`]):
//! Kubernetes asks not to update the annotation often, as every change is a pod update.
//!
//! Only the pieces needed are here: the in-cluster configuration (service-account token,
//! namespace and CA, the API server's address from `KUBERNETES_SERVICE_HOST`/`_PORT`, as
//! client-go's `rest.InClusterConfig` reads them) and a merge patch of one pod's
//! annotations, over HTTP/1.1 and TLS (hyper, rustls).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

/// The annotation a ReplicaSet orders its pods by on a scale-down (lowest deleted first).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// Where a pod's service-account credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long one request may take, connection and TLS included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of an answer read (an error's message).
const MAX_ANSWER: usize = 64 << 10;

/// What can go wrong talking to the Kubernetes API.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// Not in a pod (or one without a service account).
    #[error("not in a Kubernetes pod: {0}")]
    NotInCluster(String),
    /// A credential file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA bundle holds no usable certificate.
    #[error("{}: {why}", path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The API server cannot be reached, or the exchange failed.
    #[error("the Kubernetes API at {at}: {why}")]
    Connect {
        /// Its address.
        at: String,
        /// Why.
        why: String,
    },
    /// The API server refused the request.
    #[error("the Kubernetes API answered {status} to {request}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The method and path.
        request: String,
        /// Its `Status` object's message, or the body.
        message: String,
    },
}

impl KubeError {
    /// The pod does not exist (a worker that is no pod, or one already gone).
    pub fn not_found(&self) -> bool {
        matches!(self, KubeError::Status { status: 404, .. })
    }

    /// The service account may not do it (RBAC).
    pub fn forbidden(&self) -> bool {
        matches!(
            self,
            KubeError::Status {
                status: 401 | 403,
                ..
            }
        )
    }
}

/// Where the API server is and where the pod's credentials are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InCluster {
    /// The API server's host (an IP in a pod: the `kubernetes` Service's).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The folder of `token`, `ca.crt` and `namespace`.
    pub service_account: PathBuf,
}

impl InCluster {
    /// From the pod's environment: `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`,
    /// and the service account at [`SERVICE_ACCOUNT_DIR`] (`FLOTILLA_KUBE_SERVICE_ACCOUNT`
    /// names another folder).
    pub fn from_env() -> Result<Self, KubeError> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| KubeError::NotInCluster(format!("{name} is not set")))
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let port = port.trim().parse().map_err(|_| {
            KubeError::NotInCluster(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))
        })?;
        let service_account = std::env::var_os("FLOTILLA_KUBE_SERVICE_ACCOUNT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR));
        Ok(Self {
            host: host.trim().to_string(),
            port,
            service_account,
        })
    }

    /// `host:port`, an IPv6 host in brackets.
    fn authority(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// The pods of one namespace, as this pod's service account may change them.
pub struct PodApi {
    at: InCluster,
    namespace: String,
    tls: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for PodApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodApi")
            .field("at", &self.at)
            .field("namespace", &self.namespace)
            .finish()
    }
}

fn read(path: &Path) -> Result<String, KubeError> {
    std::fs::read_to_string(path).map_err(|source| KubeError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl PodApi {
    /// Reads the namespace and the CA, and checks the token can be read (it is read again
    /// at each request: Kubernetes rotates projected tokens).
    pub fn open(at: &InCluster) -> Result<Self, KubeError> {
        let dir = &at.service_account;
        let namespace = read(&dir.join("namespace"))?.trim().to_string();
        if namespace.is_empty() {
            return Err(KubeError::NotInCluster(format!(
                "{} is empty",
                dir.join("namespace").display()
            )));
        }
        read(&dir.join("token"))?;
        let ca = dir.join("ca.crt");
        let bad = |why: String| KubeError::BadCa {
            path: ca.clone(),
            why,
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&ca)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(bad("no usable certificate".into()));
        }
        let config =
            rustls::ClientConfig::builder_with_provider(flotilla_collective::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
        let name =
            ServerName::try_from(at.host.trim_matches(['[', ']']).to_string()).map_err(|e| {
                KubeError::NotInCluster(format!("KUBERNETES_SERVICE_HOST {:?}: {e}", at.host))
            })?;
        Ok(Self {
            at: at.clone(),
            namespace,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// The namespace whose pods it changes (the service account's).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Sets one annotation of pod `pod` (a JSON merge patch).
    pub async fn annotate(&self, pod: &str, key: &str, value: &str) -> Result<(), KubeError> {
        let path = format!("/api/v1/namespaces/{}/pods/{pod}", self.namespace);
        let request = format!("PATCH {path}");
        if !is_object_name(pod) {
            return Err(KubeError::Status {
                status: 404,
                request,
                message: format!("{pod:?} cannot be a pod's name"),
            });
        }
        let body = serde_json::json!({ "metadata": { "annotations": { key: value } } });
        let token = read(&self.at.service_account.join("token"))?;
        let at = self.at.authority();
        let connect = |why: String| KubeError::Connect {
            at: at.clone(),
            why,
        };
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(&at)
                .await
                .map_err(|e| connect(e.to_string()))?;
            let tls = self
                .tls
                .connect(self.name.clone(), tcp)
                .await
                .map_err(|e| connect(format!("TLS: {e}")))?;
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .map_err(|e| connect(e.to_string()))?;
            let req = hyper::Request::patch(path.as_str())
                .header(hyper::header::HOST, at.as_str())
                .header(
                    hyper::header::AUTHORIZATION,
                    format!("Bearer {}", token.trim()),
                )
                .header(hyper::header::CONTENT_TYPE, "application/merge-patch+json")
                .header(hyper::header::ACCEPT, "application/json")
                .header(hyper::header::USER_AGENT, "flotilla")
                .body(Full::new(Bytes::from(body.to_string())))
                .map_err(|e| connect(e.to_string()))?;
            // The connection's driver ends when the request's sender is dropped (here, or
            // by the timeout).
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let resp = send
                .send_request(req)
                .await
                .map_err(|e| connect(e.to_string()))?;
            let status = resp.status().as_u16();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, KubeError>((status, body))
        };
        let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| connect(format!("no answer within {REQUEST_TIMEOUT:?}")))??;
        if (200..300).contains(&status) {
            return Ok(());
        }
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
        Err(KubeError::Status {
            status,
            request,
            message,
        })
    }
}

/// A name Kubernetes accepts for a pod (a DNS-1123 subdomain): only those are asked for,
/// so a worker's name never reaches the request's path otherwise.
pub fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Which worker pods' deletion costs to send now: a cost is sent when it changed, at once
/// when an idle pod (cost 0, or none sent yet) gets work, otherwise at most once per `gap`
/// per pod. Pure: the caller sends and reports back.
#[derive(Debug)]
pub struct CostPolicy {
    gap: Duration,
    pods: HashMap<String, Sent>,
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    /// The cost the pod has (`None`: not known: never sent, or the last send failed).
    cost: Option<i64>,
    /// When it was last sent.
    at: Option<Instant>,
    /// Not a pod here (404), or a request in flight: not asked for.
    skip: bool,
}

/// The default for [`CostPolicy::new`]'s gap.
pub const DEFAULT_COST_GAP: Duration = Duration::from_secs(5);

impl CostPolicy {
    /// A policy that changes each pod's cost at most once per `gap` (but at once when an idle
    /// pod gets work).
    pub fn new(gap: Duration) -> Self {
        Self {
            gap,
            pods: HashMap::new(),
        }
    }

    /// The costs to send given each live worker's cost now; workers no longer listed are
    /// forgotten (a worker that comes back under the same name is sent its cost again). The
    /// caller reports each answer with [`CostPolicy::sent`].
    pub fn due(&mut self, now: Instant, costs: &[(String, i64)]) -> Vec<(String, i64)> {
        let live: std::collections::HashSet<&str> = costs.iter().map(|(n, _)| n.as_str()).collect();
        self.pods.retain(|name, _| live.contains(name.as_str()));
        let mut out = Vec::new();
        for (name, cost) in costs {
            if !is_object_name(name) {
                continue;
            }
            let s = self.pods.entry(name.clone()).or_insert(Sent {
                cost: None,
                at: None,
                skip: false,
            });
            if s.skip || s.cost == Some(*cost) {
                continue;
            }
            let busy_now = *cost > 0 && s.cost == Some(0);
            let waited =
                s.at.is_none_or(|at| now.saturating_duration_since(at) >= self.gap);
            if busy_now || waited {
                s.skip = true; // until its answer
                out.push((name.clone(), *cost));
            }
        }
        out
    }

    /// The answer to a cost sent: `Ok` it holds; a pod that is not found is not asked for
    /// again while its worker lives; any other failure is tried again after the gap.
    pub fn sent(&mut self, now: Instant, name: &str, cost: i64, r: &Result<(), KubeError>) {
        let Some(s) = self.pods.get_mut(name) else {
            return;
        };
        s.at = Some(now);
        match r {
            Ok(()) => {
                s.cost = Some(cost);
                s.skip = false;
            }
            Err(e) if e.not_found() => {}
            Err(_) => {
                // Not known now: tried again after the gap, not at each look.
                s.cost = None;
                s.skip = false;
            }
        }
    }
}

#[doc(hidden)]
pub mod fake {
    //! A stand-in for the Kubernetes API server in tests: TLS with a certificate for
    //! 127.0.0.1, a service-account folder that trusts it, and every request it is sent,
    //! answered 200 for the pods it knows and 404 for the others (403 for all with
    //! [`FakeApi::forbid`]).

    use std::collections::HashSet;
    use std::path::Path;
    use std::sync::Arc;

    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::InCluster;

    /// One request received.
    #[derive(Debug, Clone)]
    pub struct Received {
        /// `PATCH /api/v1/namespaces/NS/pods/NAME`.
        pub line: String,
        /// Header names (lowercase) and values.
        pub headers: Vec<(String, String)>,
        /// The body.
        pub body: String,
    }

    impl Received {
        /// A header's value.
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// The fake server: it runs on its own thread until dropped.
    pub struct FakeApi {
        /// Where it listens and its service-account folder.
        pub at: InCluster,
        rx: std::sync::mpsc::Receiver<Received>,
        state: Arc<parking_lot::Mutex<(HashSet<String>, bool)>>,
        _runtime: tokio::runtime::Runtime,
    }

    impl FakeApi {
        /// Starts it, with a service account (namespace `ns`, token `token`) in `dir`, and
        /// the pods `pods`.
        pub fn start(dir: &Path, pods: &[&str]) -> std::io::Result<FakeApi> {
            let io = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
            let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
                .map_err(|e| io(&e))?;
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join("ca.crt"), ck.cert.pem())?;
            std::fs::write(dir.join("namespace"), "ns\n")?;
            std::fs::write(dir.join("token"), "token\n")?;
            let cert = CertificateDer::from(ck.cert.der().to_vec());
            let key =
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
            let config =
                rustls::ServerConfig::builder_with_provider(flotilla_collective::tls::provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| io(&e))?
                    .with_no_client_auth()
                    .with_single_cert(vec![cert], key)
                    .map_err(|e| io(&e))?;
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))?;
            let port = listener.local_addr()?.port();
            let (tx, rx) = std::sync::mpsc::channel();
            let state = Arc::new(parking_lot::Mutex::new((
                pods.iter().map(|p| p.to_string()).collect::<HashSet<_>>(),
                false,
            )));
            let st = state.clone();
            runtime.spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, tx, st) = (acceptor.clone(), tx.clone(), st.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let Some(r) = read_request(&mut tls).await else {
                            return;
                        };
                        let pod = r.line.split_whitespace().nth(1).and_then(|p| {
                            p.strip_prefix("/api/v1/namespaces/ns/pods/")
                        });
                        let (code, msg) = {
                            let (pods, forbid) = &*st.lock();
                            if *forbid {
                                (403, "pods is forbidden: cannot patch")
                            } else if pod.is_some_and(|p| pods.contains(p)) {
                                (200, "")
                            } else {
                                (404, "pods not found")
                            }
                        };
                        let body = if code == 200 {
                            "{}".to_string()
                        } else {
                            serde_json::json!({"kind": "Status", "message": msg, "code": code})
                                .to_string()
                        };
                        let _ = tx.send(r);
                        let answer = format!(
                            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = tls.write_all(answer.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    });
                }
            });
            Ok(FakeApi {
                at: InCluster {
                    host: "127.0.0.1".into(),
                    port,
                    service_account: dir.to_path_buf(),
                },
                rx,
                state,
                _runtime: runtime,
            })
        }

        /// Answers every later request 403.
        pub fn forbid(&self) {
            self.state.lock().1 = true;
        }

        /// The next request received, waiting for it (`None`: none within `wait`).
        pub fn next(&self, wait: std::time::Duration) -> Option<Received> {
            self.rx.recv_timeout(wait).ok()
        }
    }

    async fn read_request(
        s: &mut tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    ) -> Option<Received> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 || buf.len() > 1 << 20 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let line = lines.next()?.to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        Some(Received {
            line,
            headers,
            body: String::from_utf8_lossy(&body).to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const WAIT: Duration = Duration::from_secs(60);

    #[test]
    fn a_pods_annotation_is_set_by_a_merge_patch_with_the_service_accounts_token() {
        let dir = tempfile::tempdir().unwrap();
        let api = fake::FakeApi::start(dir.path(), &["w-1"]).unwrap();
        let pods = PodApi::open(&api.at).unwrap();
        assert_eq!(pods.namespace(), "ns");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(pods.annotate("w-1", DELETION_COST, "3"))
            .unwrap();
        let r = api.next(WAIT).unwrap();
        assert_eq!(r.line, "PATCH /api/v1/namespaces/ns/pods/w-1 HTTP/1.1");
        assert_eq!(r.header("authorization"), Some("Bearer token"));
        assert_eq!(
            r.header("content-type"),
            Some("application/merge-patch+json")
        );
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"metadata": {"annotations": {DELETION_COST: "3"}}})
        );

        // A rotated token is read again.
        std::fs::write(dir.path().join("token"), "rotated").unwrap();
        rt.block_on(pods.annotate("w-1", DELETION_COST, "0"))
            .unwrap();
        assert_eq!(
            api.next(WAIT).unwrap().header("authorization"),
            Some("Bearer rotated")
        );

        let e = rt
            .block_on(pods.annotate("w-2", DELETION_COST, "0"))
            .unwrap_err();
        assert!(e.not_found(), "{e}");
        assert!(e.to_string().contains("pods not found"), "{e}");
        // A name that cannot be a pod's is not sent at all.
        let e = rt
            .block_on(pods.annotate("../../nodes/x", DELETION_COST, "0"))
            .unwrap_err();
        assert!(e.not_found(), "{e}");
        api.forbid();
        let e = rt
            .block_on(pods.annotate("w-1", DELETION_COST, "1"))
            .unwrap_err();
        assert!(e.forbidden(), "{e}");
        assert!(
            e.to_string().contains("403") && e.to_string().contains("forbidden"),
            "{e}"
        );
    }

    #[test]
    fn an_api_server_whose_certificate_is_not_the_pods_ca_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let api = fake::FakeApi::start(dir.path(), &["w-1"]).unwrap();
        let _ = fake::FakeApi::start(other.path(), &[]).unwrap();
        std::fs::copy(other.path().join("ca.crt"), dir.path().join("ca.crt")).unwrap();
        let pods = PodApi::open(&api.at).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(pods.annotate("w-1", DELETION_COST, "1"))
            .unwrap_err();
        assert!(matches!(e, KubeError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("TLS"), "{e}");
    }

    #[test]
    fn missing_credentials_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let at = InCluster {
            host: "127.0.0.1".into(),
            port: 1,
            service_account: dir.path().to_path_buf(),
        };
        let e = PodApi::open(&at).unwrap_err();
        assert!(e.to_string().contains("namespace"), "{e}");
        std::fs::write(dir.path().join("namespace"), "ns").unwrap();
        std::fs::write(dir.path().join("token"), "t").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
        let e = PodApi::open(&at).unwrap_err();
        assert!(e.to_string().contains("ca.crt"), "{e}");
    }

    #[test]
    fn object_names() {
        for ok in ["w", "flotilla-worker-5d9c7b-x2x4q", "a.b-c", "0a"] {
            assert!(is_object_name(ok), "{ok}");
        }
        for bad in [
            "",
            "W",
            "a_b",
            "-a",
            "a-",
            "a..b",
            "a/b",
            "..",
            "a b",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }

    fn ok() -> Result<(), KubeError> {
        Ok(())
    }

    #[test]
    fn costs_are_sent_when_they_change_at_most_once_per_gap_but_at_once_when_work_arrives() {
        let gap = Duration::from_secs(5);
        let mut p = CostPolicy::new(gap);
        let t0 = Instant::now();
        let s = |v: &[(&str, i64)]| -> Vec<(String, i64)> {
            v.iter().map(|(n, c)| (n.to_string(), *c)).collect()
        };
        // First sight: every pod's cost, valid names only.
        let due = p.due(t0, &s(&[("a", 0), ("b", 2), ("Not_A_Pod", 1)]));
        assert_eq!(due, s(&[("a", 0), ("b", 2)]));
        // Nothing again while the answers are awaited.
        assert!(p.due(t0, &s(&[("a", 1), ("b", 3)])).is_empty());
        p.sent(t0, "a", 0, &ok());
        p.sent(t0, "b", 2, &ok());
        // `a` gets work: at once. `b`'s load changes within the gap: later.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(p.due(t1, &s(&[("a", 1), ("b", 3)])), s(&[("a", 1)]));
        p.sent(t1, "a", 1, &ok());
        // `a` idle again within the gap: waits, as does `b`.
        let t2 = t0 + Duration::from_secs(3);
        assert!(p.due(t2, &s(&[("a", 0), ("b", 3)])).is_empty());
        let t3 = t0 + gap;
        assert_eq!(p.due(t3, &s(&[("a", 0), ("b", 3)])), s(&[("b", 3)]));
        p.sent(t3, "b", 3, &ok());
        let t4 = t1 + gap;
        assert_eq!(p.due(t4, &s(&[("a", 0), ("b", 3)])), s(&[("a", 0)]));
        p.sent(t4, "a", 0, &ok());
        // Unchanged: nothing.
        assert!(p.due(t4 + gap * 9, &s(&[("a", 0), ("b", 3)])).is_empty());
    }

    #[test]
    fn a_worker_that_is_no_pod_is_not_asked_for_again_and_failures_are_retried_after_the_gap() {
        let gap = Duration::from_secs(5);
        let mut p = CostPolicy::new(gap);
        let t0 = Instant::now();
        let one = |n: &str, c: i64| vec![(n.to_string(), c)];
        let not_found = Err(KubeError::Status {
            status: 404,
            request: "PATCH".into(),
            message: "not found".into(),
        });
        let refused = Err(KubeError::Connect {
            at: "x".into(),
            why: "refused".into(),
        });
        assert_eq!(p.due(t0, &one("laptop", 1)), one("laptop", 1));
        p.sent(t0, "laptop", 1, &not_found);
        assert!(p.due(t0 + gap * 10, &one("laptop", 2)).is_empty());
        // Gone, then back (a pod of the same name made again): asked for again.
        assert!(p.due(t0, &[]).is_empty());
        assert_eq!(p.due(t0, &one("laptop", 2)), one("laptop", 2));
        p.sent(t0, "laptop", 2, &refused);
        // A failure is tried again after the gap, not at each look.
        assert!(p
            .due(t0 + Duration::from_secs(1), &one("laptop", 2))
            .is_empty());
        assert_eq!(p.due(t0 + gap, &one("laptop", 2)), one("laptop", 2));
        let mut q = CostPolicy::new(gap);
        assert_eq!(q.due(t0, &one("w", 0)), one("w", 0));
        q.sent(t0, "w", 0, &refused);
        assert!(q.due(t0 + Duration::from_secs(1), &one("w", 0)).is_empty());
        assert_eq!(q.due(t0 + gap, &one("w", 0)), one("w", 0));
    }
}
