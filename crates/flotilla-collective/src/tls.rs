//! TLS with a pinned certificate: the client trusts exactly the certificate whose
//! fingerprint (blake3 of its DER, hex) it was given, and checks the handshake's signatures
//! with it. No CA is involved, so a party that hands out addresses (the coordinator) can
//! hand out the fingerprint with them, and a process in a sandbox needs no certificate file.
//! Used by the rendezvous (ranks joining the coordinator's service) and by the workers'
//! object servers (`flotilla_cluster::framed`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::{CommError, Result};

/// A TLS server configuration (rustls'), as [`server_config_from_pem`] makes.
pub type ServerConfig = rustls::ServerConfig;

/// The name a client asks for; the pinned verifier checks the fingerprint, not the name.
pub const PINNED_NAME: &str = "flotilla";

/// The fingerprint of a certificate (DER): its blake3 hash, hex.
pub fn fingerprint(der: &[u8]) -> String {
    blake3::hash(der).to_hex().to_string()
}

/// The crypto provider every Flotilla TLS endpoint uses (ring, as tonic's).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration from a PEM certificate chain and key (the files given to
/// `flotilla server --tls-cert/--tls-key`), with the fingerprint of the leaf certificate.
pub fn server_config_from_pem(
    cert: &Path,
    key: &Path,
) -> Result<(Arc<rustls::ServerConfig>, String)> {
    let bad = |what: &Path, e: &dyn std::fmt::Display| {
        CommError::InvalidArgument(format!("TLS {}: {e}", what.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, &e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, &e))?;
    let leaf = chain
        .first()
        .ok_or_else(|| bad(cert, &"no certificate in the file"))?;
    let print = fingerprint(leaf);
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(cert, &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(cert, &e))?;
    Ok((Arc::new(config), print))
}

/// Accepts exactly the certificate with the expected fingerprint.
#[derive(Debug)]
pub struct Pinned {
    fingerprint: String,
    provider: Arc<CryptoProvider>,
}

impl Pinned {
    /// A verifier for the certificate with `fingerprint`.
    pub fn new(fingerprint: &str) -> Pinned {
        Pinned {
            fingerprint: fingerprint.to_string(),
            provider: provider(),
        }
    }
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let got = fingerprint(end_entity);
        if same(got.as_bytes(), self.fingerprint.as_bytes()) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's certificate {got} is not the one the coordinator announced ({})",
                self.fingerprint
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client configuration that trusts only the certificate with `fingerprint`.
pub fn pinned_client_config(fingerprint: &str) -> Result<Arc<rustls::ClientConfig>> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| CommError::InvalidArgument(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned::new(fingerprint)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The server name a pinned client sends.
pub fn pinned_name() -> Result<ServerName<'static>> {
    ServerName::try_from(PINNED_NAME)
        .map_err(|e| CommError::InvalidArgument(format!("TLS server name: {e}")))
}
