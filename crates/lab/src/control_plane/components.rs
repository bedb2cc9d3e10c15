//! The command lines of the lab's real components, and how each tells that it is ready.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::control_plane::pki::{CertFiles, Pki};
use crate::control_plane::probe::{Probe, Ready};
use crate::control_plane::process::{ProcessSpec, free_port};

/// Controllers of kube-controller-manager that the lab relies on: owner-reference cascades, namespace
/// deletion, Jobs, PersistentVolume binding, and the protection controllers that release a deleted claim once no
/// pod uses it (the API server's admission adds their finalizers). Node lifecycle is left out: the lab's node has
/// no kubelet.
const KCM_CONTROLLERS: &str = "garbage-collector-controller,namespace-controller,job-controller,\
persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,\
persistentvolume-protection-controller";

/// Free loopback ports handed to one component attempt.
pub struct Ports([u16; 2]);

impl Ports {
    pub fn allocate() -> Result<Self> {
        let first = free_port()?;
        let mut second = free_port()?;
        while second == first {
            second = free_port()?;
        }
        Ok(Self([first, second]))
    }

    pub fn first(&self) -> u16 {
        self.0[0]
    }
}

/// A process to start, the ports it will own, and its readiness probe.
pub struct Component {
    pub spec: ProcessSpec,
    pub ports: Vec<u16>,
    pub probe: Probe,
}

/// Paths and credentials shared by the components of one lab.
pub struct LabFiles {
    dir: PathBuf,
    tools: PathBuf,
    ca: PathBuf,
    serving: CertFiles,
    admin: CertFiles,
    sa_key: PathBuf,
    sa_pub: PathBuf,
    audit_policy: PathBuf,
    /// A real node's pods run here: the control plane gives them what a cluster does (see [`IN_CLUSTER_CONTROLLERS`]).
    in_cluster: bool,
}

/// What a real node's pods need of the control plane beyond [`KCM_CONTROLLERS`]: a default ServiceAccount in each
/// namespace (the ServiceAccount admission plugin then mounts its token), the `kube-root-ca.crt` ConfigMap,
/// Deployments (deploy/controller.yaml) and DaemonSets (KubeVirt's virt-handler).
const IN_CLUSTER_CONTROLLERS: &str = "serviceaccount-controller,root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,daemonset-controller";

/// Metadata level (who did what to which object) for everything; request bodies only for Events and migration
/// status writes, which hold no secrets by design, so the benchmark can say what each write carried.
fn audit_policy_text() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create, patch, update]
  resources:
  - group: events.k8s.io
    resources: [events]
  - group: \"\"
    resources: [events]
  - group: {group}
    resources: [virtualmachinemigrations/status]
- level: Metadata
",
        group = ferry_api::GROUP
    )
}

impl LabFiles {
    pub fn prepare(dir: &Path, tools: &Path, pki: &Pki, in_cluster: bool) -> Result<Self> {
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, audit_policy_text())?;
        crate::vsphere::vcsim::ensure_password(dir)?;
        let (sa_key, sa_pub) = pki.service_account_keys()?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tools: tools.to_path_buf(),
            ca: pki.ca_cert(),
            serving: pki.issue_server("ferry-lab")?,
            admin: pki.issue_client("admin", &["system:masters"])?,
            sa_key,
            sa_pub,
            audit_policy,
            in_cluster,
        })
    }

    /// Where the lab's servers that pods use (vcsim, MinIO) listen: loopback, or with a real node its bridge
    /// address, which both the machine and the pods reach.
    pub fn serving_host(&self) -> &'static str {
        if self.in_cluster {
            crate::real_node::BRIDGE_IP
        } else {
            crate::LOOPBACK
        }
    }

    /// The serving certificate every lab component presents (signed by the lab CA).
    pub fn serving(&self) -> &CertFiles {
        &self.serving
    }

    pub fn ca(&self) -> &Path {
        &self.ca
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.tools.join(name)
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    pub fn etcd(&self, ports: &Ports) -> Result<Component> {
        let [client, peer] = ports.0;
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        Ok(Component {
            spec: ProcessSpec {
                name: "etcd".into(),
                program: self.tool("etcd"),
                args: vec![
                    "--name=lab".into(),
                    format!("--data-dir={}", self.path("etcd")),
                    "--unsafe-no-fsync".into(),
                    format!("--listen-client-urls={client_url}"),
                    format!("--advertise-client-urls={client_url}"),
                    format!("--listen-peer-urls={peer_url}"),
                    format!("--initial-advertise-peer-urls={peer_url}"),
                    format!("--initial-cluster=lab={peer_url}"),
                    "--log-level=warn".into(),
                ],
                env: vec![],
            },
            ports: vec![client, peer],
            probe: Probe::EtcdHealth { port: client },
        })
    }

    pub fn kube_apiserver(&self, ports: &Ports, etcd: &Ready) -> Result<Component> {
        // With a real node, at the `kubernetes` Service's address, where its pods' in-cluster clients look.
        let (address, port) = if self.in_cluster {
            (
                crate::real_node::API_SERVICE_IP.to_string(),
                crate::real_node::API_SERVICE_PORT,
            )
        } else {
            ("127.0.0.1".to_string(), ports.0[0])
        };
        let etcd_url = etcd.url.clone().unwrap_or_default();
        let url = format!("https://{address}:{port}");
        // Without a real node nothing makes default ServiceAccounts; no node-lifecycle controller lifts the taint.
        let disabled_admission = if self.in_cluster {
            "TaintNodesByCondition"
        } else {
            "ServiceAccount,TaintNodesByCondition"
        };
        // The kubeconfig names this attempt's port, so the probe and every later client use it.
        self.write_admin_kubeconfig(&url)?;
        Ok(Component {
            spec: ProcessSpec {
                name: "kube-apiserver".into(),
                program: self.tool("kube-apiserver"),
                args: vec![
                    format!("--etcd-servers={etcd_url}"),
                    format!("--bind-address={address}"),
                    format!("--advertise-address={address}"),
                    format!("--secure-port={port}"),
                    format!("--cert-dir={}", self.path("apiserver-certs")),
                    format!("--tls-cert-file={}", self.serving.cert.display()),
                    format!("--tls-private-key-file={}", self.serving.key.display()),
                    format!("--client-ca-file={}", self.ca.display()),
                    format!("--service-account-issuer={url}"),
                    format!("--service-account-key-file={}", self.sa_pub.display()),
                    format!(
                        "--service-account-signing-key-file={}",
                        self.sa_key.display()
                    ),
                    "--service-cluster-ip-range=10.0.0.0/24".into(),
                    "--authorization-mode=RBAC".into(),
                    format!("--disable-admission-plugins={disabled_admission}"),
                    "--allow-privileged=true".into(),
                    "--endpoint-reconciler-type=none".into(),
                    format!("--audit-policy-file={}", self.audit_policy.display()),
                    format!("--audit-log-path={}", self.path("audit.log")),
                    "--audit-log-maxsize=512".into(),
                    "--v=1".into(),
                ],
                env: vec![],
            },
            // The fixed port of a real node's API server is not on loopback, nor the lab's to check at `down`.
            ports: if self.in_cluster { vec![] } else { vec![port] },
            probe: Probe::Https {
                url: url.clone(),
                path: "/readyz".into(),
                kubeconfig: self.dir.join("kubeconfig"),
            },
        })
    }

    /// Writes `DIR/kubeconfig` for the admin identity (group system:masters).
    pub fn write_admin_kubeconfig(&self, api_url: &str) -> Result<()> {
        write_kubeconfig(
            &self.dir.join("kubeconfig"),
            api_url,
            &self.ca,
            &self.admin,
            "admin",
        )
    }

    pub fn kube_controller_manager(&self, ports: &Ports) -> Result<Component> {
        let port = ports.0[0];
        let kubeconfig = self.path("kubeconfig");
        let mut controllers = KCM_CONTROLLERS.to_string();
        let mut in_cluster = vec![];
        if self.in_cluster {
            controllers = format!("{controllers},{IN_CLUSTER_CONTROLLERS}");
            in_cluster.push(format!("--root-ca-file={}", self.ca.display()));
        }
        Ok(Component {
            spec: ProcessSpec {
                name: "kube-controller-manager".into(),
                program: self.tool("kube-controller-manager"),
                args: vec![
                    format!("--kubeconfig={kubeconfig}"),
                    format!("--authentication-kubeconfig={kubeconfig}"),
                    format!("--authorization-kubeconfig={kubeconfig}"),
                    format!("--controllers={controllers}"),
                    // Volumes bind within a second, not at the default 15 s resync.
                    "--pvclaimbinder-sync-period=1s".into(),
                    "--leader-elect=false".into(),
                    "--use-service-account-credentials=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={port}"),
                    format!("--tls-cert-file={}", self.serving.cert.display()),
                    format!("--tls-private-key-file={}", self.serving.key.display()),
                    "--kube-api-qps=1000".into(),
                    "--kube-api-burst=1000".into(),
                    "--v=1".into(),
                ]
                .into_iter()
                .chain(in_cluster)
                .collect(),
                env: vec![],
            },
            ports: vec![port],
            probe: Probe::Https {
                url: format!("https://127.0.0.1:{port}"),
                path: "/healthz".into(),
                kubeconfig: self.dir.join("kubeconfig"),
            },
        })
    }

    /// The staging store, in `DIR/staging`.
    pub fn minio(&self, ports: &Ports, compress: bool) -> Result<Component> {
        crate::minio::component(
            &self.dir.join("staging"),
            &self.tools,
            self.serving_host(),
            ports.0[0],
            ports.0[1],
            compress,
            Some(crate::minio::Tls {
                serving: &self.serving,
                ca: &self.ca,
            }),
        )
    }

    /// virt-api's VM and VMI admission webhooks (`tools/kubevirt-admission`, from KubeVirt's module). It installs
    /// what virt-operator would (CRDs, the `KubeVirt` CR, virt-controller's and virt-handler's roles) and is
    /// ready once the API server has its webhook registrations.
    pub fn kubevirt_admission(&self, ports: &Ports) -> Component {
        self.admission("kubevirt-admission", ports)
    }

    /// cdi-apiserver's DataVolume admission webhooks (`tools/cdi-admission`, from CDI's module). It installs the
    /// CDI kinds they read and is ready once the API server has its webhook registrations.
    pub fn cdi_admission(&self, ports: &Ports) -> Component {
        self.admission("cdi-admission", ports)
    }

    /// A webhook server of the lab's tools: the same flags, and ready once it has registered itself.
    fn admission(&self, name: &str, ports: &Ports) -> Component {
        let port = ports.0[0];
        Component {
            spec: ProcessSpec {
                name: name.into(),
                program: self.tool(name),
                args: vec![
                    format!("--kubeconfig={}", self.path("kubeconfig")),
                    format!("--listen=127.0.0.1:{port}"),
                    format!("--tls-cert={}", self.serving.cert.display()),
                    format!("--tls-key={}", self.serving.key.display()),
                    format!("--ca-bundle={}", self.ca.display()),
                ],
                env: vec![],
            },
            ports: vec![port],
            probe: Probe::HttpsOk {
                url: format!("https://127.0.0.1:{port}/readyz"),
                ca: self.ca.clone(),
            },
        }
    }

    pub fn vcsim(&self, vms: usize) -> Component {
        crate::vsphere::vcsim::component(
            &self.dir,
            &self.tools,
            &self.serving,
            false,
            vms,
            self.serving_host(),
        )
    }
}

fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    identity: &CertFiles,
    user: &str,
) -> Result<()> {
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ferry-lab\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    \
         client-key: {key}\ncontexts:\n- name: ferry-lab\n  context:\n    cluster: ferry-lab\n    user: {user}\n\
         current-context: ferry-lab\n",
        ca = ca.display(),
        cert = identity.cert.display(),
        key = identity.key.display(),
    );
    std::fs::write(path, yaml)?;
    Ok(())
}

/// Writes a kubeconfig for another identity of the same lab (for RBAC tests).
pub fn write_identity_kubeconfig(
    lab_dir: &Path,
    api_url: &str,
    user: &str,
    groups: &[&str],
) -> Result<PathBuf> {
    let pki = Pki::open_or_create(&lab_dir.join("pki"))?;
    let identity = pki.issue_client(user, groups)?;
    let path = lab_dir.join(format!("kubeconfig-{}", user.replace(':', "_")));
    write_kubeconfig(&path, api_url, &pki.ca_cert(), &identity, user)?;
    Ok(path)
}
