//! The lab's throwaway certificate authority: serving certificates for the control plane and client
//! certificates for any identity (the admin, or a ServiceAccount for RBAC tests).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Paths of one key pair on disk.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The CA in `DIR/pki`. Its key stays on disk so that tests can mint more identities later.
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    pub fn ca_cert_path(dir: &Path) -> PathBuf {
        dir.join("ca.crt")
    }

    /// Creates the CA, or loads it when `dir` already holds one.
    pub fn open_or_create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (cert_path, key_path) = (Self::ca_cert_path(dir), dir.join("ca.key"));
        // Signing needs only the CA's name and key, so reloading rebuilds the same params around the saved key.
        let issuer = if key_path.exists() {
            let key = KeyPair::from_pem(&std::fs::read_to_string(&key_path)?)
                .context("loading the lab CA key")?;
            Issuer::new(ca_params()?, key)
        } else {
            let key = KeyPair::generate()?;
            let params = ca_params()?;
            let cert = params.self_signed(&key)?;
            write_private(&key_path, &key.serialize_pem())?;
            std::fs::write(&cert_path, cert.pem())?;
            Issuer::new(params, key)
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            issuer,
        })
    }

    pub fn ca_cert(&self) -> PathBuf {
        Self::ca_cert_path(&self.dir)
    }

    /// A serving certificate for loopback (`127.0.0.1`, `localhost`) and the in-cluster API names.
    pub fn issue_server(&self, name: &str) -> Result<CertFiles> {
        let mut params = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        // The `kubernetes` Service's address, where a real node's pods reach the API server.
        params.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(
            crate::real_node::API_SERVICE_IP,
        )));
        // The machine's address on a real node's bridge, where its pods reach vcsim and MinIO.
        params.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(
            crate::real_node::BRIDGE_IP.parse()?,
        )));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(name, params)
    }

    /// A client certificate: the API server reads the user from CN and the groups from O.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let file_stem = format!("client-{}", user.replace(':', "_"));
        self.issue(&file_stem, params)
    }

    /// The key pair that signs ServiceAccount tokens: (private key, public key), both PEM.
    pub fn service_account_keys(&self) -> Result<(PathBuf, PathBuf)> {
        let (private, public) = (self.dir.join("sa.key"), self.dir.join("sa.pub"));
        if !private.exists() || !public.exists() {
            let key = KeyPair::generate()?;
            write_private(&private, &key.serialize_pem())?;
            std::fs::write(&public, key.public_key_pem())?;
        }
        Ok((private, public))
    }

    fn issue(&self, stem: &str, params: CertificateParams) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        };
        write_private(&files.key, &key.serialize_pem())?;
        std::fs::write(&files.cert, cert.pem())?;
        Ok(files)
    }
}

fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "ferry-lab-ca");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::CrlSign,
    ];
    Ok(params)
}

/// Writes a file readable by its owner only: private keys never sit world-readable.
pub(crate) fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopening_keeps_the_ca_and_issues_verifiable_identities() {
        let dir = tempfile::tempdir().unwrap();
        let first = Pki::open_or_create(dir.path()).unwrap();
        let ca_before = std::fs::read_to_string(first.ca_cert()).unwrap();
        drop(first);
        let pki = Pki::open_or_create(dir.path()).unwrap();
        assert_eq!(ca_before, std::fs::read_to_string(pki.ca_cert()).unwrap());

        let client = pki
            .issue_client("system:serviceaccount:ferry-system:ferry", &["team-a"])
            .unwrap();
        let pem = std::fs::read_to_string(&client.cert).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&client.key).unwrap().permissions(),
        );
        assert_eq!(
            mode & 0o077,
            0,
            "private keys must not be group or world readable"
        );
    }
}
