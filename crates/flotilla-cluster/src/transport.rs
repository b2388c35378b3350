//! Channels and listeners: plain TCP or TLS (rustls), with the token attached.

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};

use crate::error::{ClusterError, Result};

/// TLS files of a server.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

impl ServerTls {
    pub(crate) fn config(&self) -> Result<ServerTlsConfig> {
        let cert = std::fs::read(&self.cert).map_err(|e| ClusterError::io(&self.cert, e))?;
        let key = std::fs::read(&self.key).map_err(|e| ClusterError::io(&self.key, e))?;
        Ok(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
    }
}

/// How a client or worker reaches the server.
#[derive(Clone, Debug)]
pub struct Remote {
    /// `host:port` (or a full `http://` / `https://` URL).
    pub addr: String,
    /// The access token.
    pub token: String,
    /// A CA certificate (PEM) to verify the server's TLS certificate; TLS is used when set.
    pub tls_ca: Option<PathBuf>,
}

impl Remote {
    /// A remote at `addr` with `token`, plain TCP.
    pub fn new(addr: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            token: token.into(),
            tls_ca: None,
        }
    }

    /// Whether the server is reached over TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls_ca.is_some() || self.addr.starts_with("https://")
    }

    /// The host part of `addr` (`127.0.0.1`, `[::1]`, `node7`), for other services of the
    /// same server (the rendezvous of gangs).
    pub fn host(&self) -> String {
        let first = self.addrs().first().copied().unwrap_or("");
        let rest = first
            .strip_prefix("http://")
            .or_else(|| first.strip_prefix("https://"))
            .unwrap_or(first);
        let rest = rest.split('/').next().unwrap_or(rest);
        if rest.starts_with('[') {
            match rest.find(']') {
                Some(end) => rest[..=end].to_string(),
                None => rest.to_string(),
            }
        } else {
            match rest.rsplit_once(':') {
                Some((host, _)) => host.to_string(),
                None => rest.to_string(),
            }
        }
    }

    /// The addresses `addr` lists: one coordinator, or a group's (`a,b,c`).
    pub fn addrs(&self) -> Vec<&str> {
        self.addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect()
    }

    /// The addresses as they are tried: with the default port where none was given.
    pub fn shown(&self) -> String {
        self.addrs()
            .iter()
            .map(|a| {
                if a.contains("://") {
                    a.to_string()
                } else {
                    with_port(a)
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    fn url(&self, addr: &str) -> String {
        if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.to_string()
        } else if self.tls_ca.is_some() {
            format!("https://{}", with_port(addr))
        } else {
            format!("http://{}", with_port(addr))
        }
    }

    /// Connects (HTTP/2, TCP_NODELAY). Given a group's addresses, to the first that accepts
    /// and answers (only the group's leader listens on its API port; a frozen one, stopped or
    /// paused, accepts connections but answers nothing within [`GROUP_PROBE`] and is passed
    /// over). Its connections then ping every 2 s and drop after 3 s without an answer, so
    /// a session with a leader that freezes later moves on too.
    pub fn channel<'a>(&'a self) -> crate::Boxed<'a, Result<Channel>> {
        crate::boxed(async move {
            let addrs = self.addrs();
            if addrs.len() <= 1 {
                return self.channel_to(&self.addr, false).await;
            }
            let mut why = Vec::new();
            for a in addrs {
                match self.channel_to(a, true).await {
                    Ok(c) => {
                        if answers(c.clone()).await {
                            return Ok(c);
                        }
                        why.push(format!("{a}: accepts but answers nothing (frozen?)"));
                    }
                    Err(ClusterError::Connect { message, .. }) => {
                        why.push(format!("{a}: {message}"))
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(ClusterError::Connect {
                addr: self.addr.clone(),
                message: format!(
                    "no coordinator of the group accepts (none leads yet, or none runs): {}",
                    why.join("; ")
                ),
            })
        })
    }

    async fn channel_to(&self, addr: &str, in_group: bool) -> Result<Channel> {
        let url = self.url(addr);
        check_address(addr, &url)?;
        if let (Some(ca), true) = (&self.tls_ca, url.starts_with("http://")) {
            // It failed later as an HTTP/2 protocol error, naming neither.
            return Err(ClusterError::Config(format!(
                "the server address {addr} says plain TCP (http://) but --tls-ca {} asks for \
                 TLS: write https://{} or leave out the scheme",
                ca.display(),
                addr.trim_start_matches("http://")
            )));
        }
        let (ping, patience) = if in_group {
            (Duration::from_secs(2), Duration::from_secs(3))
        } else {
            (Duration::from_secs(10), Duration::from_secs(20))
        };
        let mut ep = Endpoint::from_shared(url.clone())
            .map_err(|e| ClusterError::Config(format!("bad server address {addr:?}: {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(ping)
            .keep_alive_timeout(patience)
            .keep_alive_while_idle(true);
        if let Some(ca) = &self.tls_ca {
            let pem = std::fs::read(ca).map_err(|e| ClusterError::io(ca, e))?;
            // A key or another file given for the CA was read as no CA at all, and every
            // certificate then failed as "UnknownIssuer".
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(ClusterError::Config(format!(
                    "--tls-ca {}: the file holds no certificate (PEM, -----BEGIN CERTIFICATE-----); \
                     give the CA certificate that signed the coordinator's, not a key",
                    ca.display()
                )));
            }
            let host = host_of(addr);
            ep = ep
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(pem))
                        .domain_name(host),
                )
                .map_err(|e| ClusterError::Config(format!("tls: {e}")))?;
        } else if url.starts_with("https://") {
            // An https:// address without --tls-ca: the system's trust store (and
            // SSL_CERT_FILE / SSL_CERT_DIR where they are set), as a browser would.
            ep = ep
                .tls_config(
                    ClientTlsConfig::new()
                        .with_native_roots()
                        .domain_name(host_of(addr)),
                )
                .map_err(|e| ClusterError::Config(format!("tls: {e}")))?;
        }
        ep.connect().await.map_err(|e| {
            let message = error_chain(&e);
            if message.contains("invalid peer certificate") {
                let against = if self.tls_ca.is_some() {
                    "--tls-ca must be the CA that signed it"
                } else {
                    "not against the system's trust store; pass --tls-ca with the CA that signed it"
                };
                ClusterError::Tls {
                    addr: addr.to_string(),
                    message: format!(
                        "{message} (the server answered with a TLS certificate that does not \
                         verify: {against}, and the certificate must name the host of the \
                         address)"
                    ),
                }
            } else if message.contains("InvalidContentType") {
                // What came back is no TLS record: the server speaks plain TCP (it was
                // retried for the whole --connect-timeout as if none answered).
                ClusterError::Tls {
                    addr: addr.to_string(),
                    message: format!(
                        "{message} (the server answers in plain TCP, not TLS: leave out \
                         --tls-ca and https://, or start it with --tls-cert and --tls-key)"
                    ),
                }
            } else {
                ClusterError::Connect {
                    addr: addr.to_string(),
                    message,
                }
            }
        })
    }
}

/// How long a group member that accepted a connection has to answer a first request.
pub const GROUP_PROBE: Duration = Duration::from_secs(2);

/// Whether the server on `ch` answers a request (any answer: the probe carries no token, so a
/// live coordinator refuses it at once) within [`GROUP_PROBE`].
async fn answers(ch: Channel) -> bool {
    let mut c = crate::proto::coordinator_client::CoordinatorClient::new(ch);
    let mut req = tonic::Request::new(crate::proto::StatusRequest::default());
    req.metadata_mut().insert(
        crate::auth::PROBE_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let probe = c.status(req);
    match tokio::time::timeout(GROUP_PROBE, probe).await {
        Ok(Ok(_)) => true,
        // An answer from the server, not a broken connection.
        Ok(Err(s)) => !matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown),
        Err(_) => false,
    }
}

/// The coordinator's port where an address names none.
pub const DEFAULT_PORT: u16 = 7070;

/// `addr` (`host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address) with
/// [`DEFAULT_PORT`] where it names no port (`--server 127.0.0.1` went to port 80).
/// A server address's mistakes said as such: a port out of range (it was tried, and failed
/// as "connection refused"), a path (ignored).
fn check_address(addr: &str, url: &str) -> Result<()> {
    let bad = |why: String| {
        Err(ClusterError::Config(format!(
            "bad server address {addr:?}: {why}"
        )))
    };
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.is_empty() {
        return bad(format!(
            "it has a path (/{path}); give HOST:PORT, the coordinator's API address"
        ));
    }
    // No port: an http:// or https:// address given whole (80 or 443).
    let port = match authority.rsplit_once(':') {
        Some((_, p)) if !authority.ends_with(']') => p,
        _ => return Ok(()),
    };
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return bad(format!("the port {port:?} is not a number from 1 to 65535"));
    }
    Ok(())
}

#[cfg(test)]
mod address_tests {
    use super::check_address;

    #[test]
    fn ports_out_of_range_and_paths_are_refused() {
        for (addr, url) in [
            ("127.0.0.1:7070", "http://127.0.0.1:7070"),
            ("https://coord.example", "https://coord.example"),
            ("[::1]:7070", "http://[::1]:7070"),
            ("https://[::1]", "https://[::1]"),
            ("http://h:1/", "http://h:1/"),
        ] {
            assert!(check_address(addr, url).is_ok(), "{addr}");
        }
        for (addr, url, says) in [
            (
                "127.0.0.1:99999",
                "http://127.0.0.1:99999",
                "not a number from 1 to 65535",
            ),
            ("h:0", "http://h:0", "not a number from 1 to 65535"),
            ("h:x", "http://h:x", "not a number from 1 to 65535"),
            (
                "127.0.0.1:7070/foo",
                "http://127.0.0.1:7070/foo",
                "it has a path",
            ),
        ] {
            let e = check_address(addr, url).expect_err(addr).to_string();
            assert!(e.contains(says) && e.contains(addr), "{e}");
        }
    }
}

fn with_port(addr: &str) -> String {
    match addr.matches(':').count() {
        0 => format!("{addr}:{DEFAULT_PORT}"),
        1 => addr.to_string(),
        _ if addr.starts_with('[') => {
            if addr.contains("]:") {
                addr.to_string()
            } else {
                format!("{addr}:{DEFAULT_PORT}")
            }
        }
        _ => format!("[{addr}]:{DEFAULT_PORT}"),
    }
}

pub(crate) fn host_of(addr: &str) -> String {
    let a = addr
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    match a.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']').to_string(),
        None => a.to_string(),
    }
}

/// The full chain of an error's causes on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Binds a TCP listener on `addr`; returns it with the address it got (port 0: the one
/// chosen).
pub(crate) async fn bind(
    addr: std::net::SocketAddr,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ClusterError::Bind {
            addr: addr.to_string(),
            flag: None,
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|e| ClusterError::Config(format!("listener address: {e}")))?;
    Ok((listener, local))
}

#[cfg(test)]
mod tests {
    use super::with_port;

    #[test]
    fn an_address_without_a_port_gets_the_coordinator_s() {
        assert_eq!(with_port("127.0.0.1"), "127.0.0.1:7070");
        assert_eq!(with_port("coordinator"), "coordinator:7070");
        assert_eq!(with_port("coordinator:9000"), "coordinator:9000");
        assert_eq!(with_port("[::1]"), "[::1]:7070");
        assert_eq!(with_port("[::1]:9000"), "[::1]:9000");
        assert_eq!(with_port("::1"), "[::1]:7070");
    }
}
