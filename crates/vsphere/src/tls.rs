//! TLS that fails closed: a CA bundle, a pinned SHA-256 certificate thumbprint, or an explicit request to skip
//! verification. A failed check ends the handshake, so no request (and no password) is ever sent.
//!
//! vSphere shows thumbprints as SHA-1 (20 hex pairs: the host's `sslThumbprint`, the vCenter UI). A SHA-1 pin
//! is refused, but only after the handshake, so that the error can show the SHA-256 to pin instead and say
//! whether the SHA-1 the user copied belongs to the certificate the server presented.

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

/// The certificate the server presented during the last handshake, for error messages and for pinning.
pub type SeenThumbprint = Arc<Mutex<Option<Presented>>>;

/// Thumbprints of a presented certificate, as colon-separated upper-case hex pairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presented {
    pub sha256: String,
    /// Only to compare with a SHA-1 pin copied from vSphere; never used to trust anything.
    pub sha1: String,
}

/// What a pinned thumbprint turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// 32 hex pairs, normalized.
    Sha256(String),
    /// 20 hex pairs, normalized: how vSphere shows thumbprints, and not what Ferry pins.
    Sha1(String),
}

impl Pin {
    /// Case and colons are ignored; anything but 32 or 20 bytes of hex is None.
    pub fn parse(text: &str) -> Option<Self> {
        let hex: String = text.trim().chars().filter(|c| *c != ':').collect();
        if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        match hex.len() {
            64 => Some(Pin::Sha256(pairs(&hex))),
            40 => Some(Pin::Sha1(pairs(&hex))),
            _ => None,
        }
    }
}

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
            let check = match Pin::parse(expected) {
                Some(Pin::Sha256(expected)) => Check::Pinned(expected),
                // Refused in the handshake, after the presented certificate was recorded for the error.
                Some(Pin::Sha1(_)) => Check::RefuseSha1,
                None => {
                    return Err(Error::TlsConfig(format!(
                        "{expected:?} is not a SHA-256 thumbprint (32 hex pairs)"
                    )));
                }
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Recording {
                    inner: check,
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
    match Pin::parse(text)? {
        Pin::Sha256(hex) => Some(hex),
        Pin::Sha1(_) => None,
    }
}

/// `abcd…` (an even number of hex digits) as `AB:CD:…`.
fn pairs(hex: &str) -> String {
    hex.to_ascii_uppercase()
        .as_bytes()
        .chunks(2)
        .map(|p| std::str::from_utf8(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(":")
}

fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The SHA-256 thumbprint of a DER certificate: what Ferry pins.
pub fn thumbprint_of(der: &[u8]) -> String {
    colon_hex(&Sha256::digest(der))
}

/// The SHA-1 thumbprint of a DER certificate, as vSphere shows it.
pub fn sha1_thumbprint_of(der: &[u8]) -> String {
    colon_hex(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, der).as_ref())
}

#[derive(Debug)]
enum Check {
    WebPki(Arc<rustls::client::WebPkiServerVerifier>),
    Pinned(String),
    RefuseSha1,
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
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Presented {
            sha256: presented.clone(),
            sha1: sha1_thumbprint_of(end_entity.as_ref()),
        });
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
            Check::RefuseSha1 => Err(rustls::Error::General(
                "a SHA-1 thumbprint is pinned; only SHA-256 pins are accepted".into(),
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
    fn a_sha1_thumbprint_as_vsphere_shows_it_is_recognized() {
        let vsphere = vec!["3f"; 20].join(":");
        assert_eq!(
            Pin::parse(&vsphere),
            Some(Pin::Sha1(vec!["3F"; 20].join(":")))
        );
        assert_eq!(Pin::parse(&"3F".repeat(20)), Pin::parse(&vsphere));
        assert!(normalize_thumbprint(&vsphere).is_none());
        assert_eq!(
            Pin::parse(&vec!["ab"; 32].join(":")),
            Some(Pin::Sha256(vec!["AB"; 32].join(":")))
        );
        for wrong in ["", "AB", &"AB".repeat(21), &"ZZ".repeat(20)] {
            assert_eq!(Pin::parse(wrong), None, "{wrong}");
        }
    }

    #[test]
    fn thumbprints_of_a_certificate() {
        // FIPS 180 test vector "abc", standing in for a certificate's DER bytes.
        assert_eq!(
            sha1_thumbprint_of(b"abc"),
            "A9:99:3E:36:47:06:81:6A:BA:3E:25:71:78:50:C2:6C:9C:D0:D8:9D"
        );
        assert!(thumbprint_of(b"abc").starts_with("BA:78:16:BF"));
    }

    #[test]
    fn a_sha1_pin_is_accepted_as_a_setting_and_refused_in_the_handshake() {
        // The refusal needs the server's certificate, to show its SHA-256 (see `session`).
        assert!(client_config(&TlsMode::Thumbprint(vec!["AB"; 20].join(":"))).is_ok());
        assert!(matches!(
            client_config(&TlsMode::Thumbprint("AB:CD".into())),
            Err(Error::TlsConfig(_))
        ));
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused() {
        assert!(matches!(
            client_config(&TlsMode::CaBundle("nothing".into())),
            Err(Error::TlsConfig(_))
        ));
    }
}
