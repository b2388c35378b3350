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
        let rest = self
            .addr
            .strip_prefix("http://")
            .or_else(|| self.addr.strip_prefix("https://"))
            .unwrap_or(&self.addr);
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

    fn url(&self) -> String {
        if self.addr.starts_with("http://") || self.addr.starts_with("https://") {
            self.addr.clone()
        } else if self.tls_ca.is_some() {
            format!("https://{}", self.addr)
        } else {
            format!("http://{}", self.addr)
        }
    }

    /// Connects (HTTP/2, TCP_NODELAY).
    pub async fn channel(&self) -> Result<Channel> {
        let url = self.url();
        let mut ep = Endpoint::from_shared(url.clone())
            .map_err(|e| ClusterError::Config(format!("bad server address {:?}: {e}", self.addr)))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some(ca) = &self.tls_ca {
            let pem = std::fs::read(ca).map_err(|e| ClusterError::io(ca, e))?;
            let host = host_of(&self.addr);
            ep = ep
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(pem))
                        .domain_name(host),
                )
                .map_err(|e| ClusterError::Config(format!("tls: {e}")))?;
        }
        ep.connect().await.map_err(|e| ClusterError::Connect {
            addr: self.addr.clone(),
            message: error_chain(&e),
        })
    }
}

fn host_of(addr: &str) -> String {
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
