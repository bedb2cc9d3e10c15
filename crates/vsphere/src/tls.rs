//! TLS that fails closed: a CA bundle, a pinned SHA-256 certificate thumbprint, or an explicit request to skip
//! verification. A failed check ends the handshake, so no request (and no password) is ever sent.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// How to trust the endpoint's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// PEM certificates of the CAs that sign the endpoint's certificate.
    CaBundle(String),
    /// SHA-256 of the endpoint's certificate, as colon-separated hex pairs (case and colons ignored).
    Thumbprint(String),
    /// Accept any certificate. Only when the caller asks for it.
    InsecureSkipVerify,
}

/// The thumbprint the server presented during the last handshake, for error messages and for pinning.
pub type SeenThumbprint = Arc<Mutex<Option<String>>>;

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration for `mode`, and the slot where the presented thumbprint is recorded.
pub fn client_config(mode: &TlsMode) -> Result<(ClientConfig, SeenThumbprint)> {
    let provider = provider();
    let seen: SeenThumbprint = Arc::default();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::TlsConfig(e.to_string()))?;
    let config = match mode {
        TlsMode::CaBundle(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| Error::TlsConfig(format!("caBundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| Error::TlsConfig(format!("caBundle: {e}")))?;
            }
            if roots.is_empty() {
                return Err(Error::TlsConfig("caBundle holds no PEM certificate".into()));
            }
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| Error::TlsConfig(e.to_string()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Recording {
                    inner: Check::WebPki(webpki),
                    seen: seen.clone(),
                    provider,
                }))
                .with_no_client_auth()
        }
        TlsMode::Thumbprint(expected) => {
            let expected = normalize_thumbprint(expected).ok_or_else(|| {
                Error::TlsConfig(format!(
                    "{expected:?} is not a SHA-256 thumbprint (32 hex pairs)"
                ))
            })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Recording {
                    inner: Check::Pinned(expected),
                    seen: seen.clone(),
                    provider,
                }))
                .with_no_client_auth()
        }
        TlsMode::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Recording {
                inner: Check::Any,
                seen: seen.clone(),
                provider,
            }))
            .with_no_client_auth(),
    };
    Ok((config, seen))
}

/// Upper-case hex pairs joined by colons, or None if it is not 32 bytes of hex.
pub fn normalize_thumbprint(text: &str) -> Option<String> {
    let hex: String = text.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let upper = hex.to_ascii_uppercase();
    Some(
        upper
            .as_bytes()
            .chunks(2)
            .map(|p| std::str::from_utf8(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(":"),
    )
}

pub fn thumbprint_of(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[derive(Debug)]
enum Check {
    WebPki(Arc<rustls::client::WebPkiServerVerifier>),
    Pinned(String),
    Any,
}

/// Records what the server presented, then applies the check.
#[derive(Debug)]
struct Recording {
    inner: Check,
    seen: SeenThumbprint,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let presented = thumbprint_of(end_entity.as_ref());
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(presented.clone());
        match &self.inner {
            Check::WebPki(verifier) => verifier.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ),
            Check::Pinned(expected) if *expected == presented => {
                Ok(ServerCertVerified::assertion())
            }
            Check::Pinned(_) => Err(rustls::Error::General(
                "certificate thumbprint does not match the pinned one".into(),
            )),
            Check::Any => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
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
        verify_tls13_signature(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprints_normalize_case_and_colons() {
        let lower = vec!["ab"; 32].join(":");
        let bare = "AB".repeat(32);
        assert_eq!(normalize_thumbprint(&lower), normalize_thumbprint(&bare));
        assert_eq!(
            normalize_thumbprint(&lower).unwrap(),
            vec!["AB"; 32].join(":")
        );
        assert!(normalize_thumbprint("AB:CD").is_none());
        assert!(normalize_thumbprint(&"ZZ".repeat(32)).is_none());
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused() {
        assert!(matches!(
            client_config(&TlsMode::CaBundle("nothing".into())),
            Err(Error::TlsConfig(_))
        ));
    }
}
