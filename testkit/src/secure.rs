//! TLS and ACL for test nodes: certificates made by the test (rcgen), and the secure mode in
//! which every [`Cluster`](crate::Cluster) node serves TLS only, requires client
//! certificates, and has a least-privilege user for the library.
//!
//! Secure mode is on when [`ACL_FILE_ENV`] names a file of `ACL SETUSER` lines (as
//! `redquorum acl` prints them): each node then runs them as its default (admin) user after
//! every start, restart and wipe, and gives the user [`PASSWORD`]. [`TestNode::url`]
//! (crate::TestNode::url) is then `rediss://USER:PASSWORD@127.0.0.1:PORT` (the library's
//! user), while direct connections stay the admin user, over TLS with the client
//! certificate.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// Environment variable naming the file of `ACL SETUSER` lines that turns secure mode on.
pub const ACL_FILE_ENV: &str = "REDQUORUM_TEST_ACL_FILE";

/// The password secure mode gives the library's user.
pub const PASSWORD: &str = "rq-test-secret";

/// One certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A test PKI in a temporary directory: a CA with a server certificate (for `localhost`,
/// `127.0.0.1` and `node.redquorum.test`) and a client certificate, and a second, unrelated
/// CA with a client certificate of its own.
#[derive(Debug)]
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA's certificate (PEM).
    pub ca: PathBuf,
    /// The server certificate every node presents.
    pub server: CertFiles,
    /// A client certificate signed by [`ca`](Pki::ca).
    pub client: CertFiles,
    /// Another CA, which signed none of the above.
    pub other_ca: PathBuf,
    /// A client certificate signed by [`other_ca`](Pki::other_ca).
    pub other_client: CertFiles,
}

/// The DNS name in the server certificate that is no host (for server-name tests).
pub const SERVER_NAME: &str = "node.redquorum.test";

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new())
        .unwrap_or_else(|e| panic!("CA parameters: {e}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {path:?}: {e}"));
    path
}

fn leaf(dir: &Path, name: &str, sans: Vec<String>, issuer: &Issuer<'_, KeyPair>) -> CertFiles {
    let mut params =
        CertificateParams::new(sans).unwrap_or_else(|e| panic!("{name} parameters: {e}"));
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("{name} key: {e}"));
    let cert = params
        .signed_by(&key, issuer)
        .unwrap_or_else(|e| panic!("{name} certificate: {e}"));
    CertFiles {
        cert: write(dir, &format!("{name}.crt"), &cert.pem()),
        key: write(dir, &format!("{name}.key"), &key.serialize_pem()),
    }
}

impl Pki {
    /// Make a fresh PKI.
    pub fn generate() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("redquorum-pki-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a PKI directory: {e}"));
        let make_ca = |name: &str, file: &str| {
            let params = ca_params(name);
            let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
            let cert = params
                .self_signed(&key)
                .unwrap_or_else(|e| panic!("CA certificate: {e}"));
            let path = write(dir.path(), file, &cert.pem());
            (Issuer::new(params, key), path)
        };
        let (issuer, ca) = make_ca("redquorum test CA", "ca.crt");
        let (other_issuer, other_ca) = make_ca("unrelated test CA", "other-ca.crt");
        let server = leaf(
            dir.path(),
            "server",
            vec!["localhost".into(), "127.0.0.1".into(), SERVER_NAME.into()],
            &issuer,
        );
        let client = leaf(
            dir.path(),
            "client",
            vec!["redquorum-client".into()],
            &issuer,
        );
        let other_client = leaf(
            dir.path(),
            "other-client",
            vec!["redquorum-client".into()],
            &other_issuer,
        );
        Pki {
            dir,
            ca,
            server,
            client,
            other_ca,
            other_client,
        }
    }

    /// The directory holding every file (mounted read-only at `/tls` in containers).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// redis-server arguments for a TLS-only node on `port` with this PKI's server
    /// certificate, its files under `dir` (`/tls` in a container, [`dir`](Pki::dir) on the
    /// host); `clients`: `yes` (a client certificate is required), `no` or `optional`.
    pub fn server_args(&self, dir: &str, port: u16, clients: &str) -> Vec<String> {
        let file = |p: &Path| {
            format!(
                "{dir}/{}",
                p.file_name().and_then(|n| n.to_str()).unwrap_or_default()
            )
        };
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            file(&self.server.cert),
            "--tls-key-file".into(),
            file(&self.server.key),
            "--tls-ca-cert-file".into(),
            file(&self.ca),
            "--tls-auth-clients".into(),
            clients.into(),
        ]
    }

    /// redis-rs TLS certificates: this CA and its client certificate.
    pub fn certificates(&self) -> redis::TlsCertificates {
        let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("cannot read {p:?}: {e}"));
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&self.client.cert),
                client_key: read(&self.client.key),
            }),
            root_cert: Some(read(&self.ca)),
        }
    }
}

/// Secure mode's settings.
#[derive(Debug)]
pub struct Secure {
    /// The certificates.
    pub pki: Pki,
    /// The library's user.
    pub user: String,
    /// The `ACL SETUSER` lines that make it, split into arguments.
    pub acl: Vec<Vec<String>>,
}

/// Secure mode's settings when [`ACL_FILE_ENV`] is set (read once per process).
pub fn secure() -> Option<&'static Secure> {
    static SECURE: OnceLock<Option<Secure>> = OnceLock::new();
    SECURE
        .get_or_init(|| {
            let path = std::env::var(ACL_FILE_ENV).ok()?;
            if path.trim().is_empty() {
                return None;
            }
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{ACL_FILE_ENV}={path}: cannot read: {e}"));
            let acl: Vec<Vec<String>> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| l.split_whitespace().map(String::from).collect())
                .collect();
            let user = acl
                .first()
                .and_then(|words| {
                    (words.len() > 2
                        && words[0].eq_ignore_ascii_case("ACL")
                        && words[1].eq_ignore_ascii_case("SETUSER"))
                    .then(|| words[2].clone())
                })
                .unwrap_or_else(|| {
                    panic!("{ACL_FILE_ENV}={path}: expected ACL SETUSER lines, got {text:?}")
                });
            Some(Secure {
                pki: Pki::generate(),
                user,
                acl,
            })
        })
        .as_ref()
}

/// A local server process ([`server_program`](crate::server_program)) serving TLS only (safe
/// settings, AOF with fsync always), with this PKI's server certificate: for TLS tests that
/// need no container. Killed and its directory deleted when dropped.
#[derive(Debug)]
pub struct TlsNode {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TlsNode {
    /// Start a node; `clients`: `yes` (client certificates required), `no` or `optional`;
    /// `extra`: more redis-server arguments (e.g. `--user ...`). Waits until it answers a
    /// PING over TLS (with the PKI's client certificate), for at most 20 s.
    pub async fn start(pki: &Pki, clients: &str, extra: &[&str]) -> TlsNode {
        let dir = tempfile::Builder::new()
            .prefix("redquorum-tls-node-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a node directory: {e}"));
        let port = crate::ports::pick_host_port();
        let pki_dir = pki.dir().to_string_lossy().into_owned();
        let program = crate::server_program();
        let mut command = std::process::Command::new(&program);
        command
            .args(crate::SAFE_ARGS)
            .arg("--dir")
            .arg(dir.path())
            .args(["--bind", "127.0.0.1", "--daemonize", "no"])
            .args(pki.server_args(&pki_dir, port, clients))
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} (is it installed?): {e}"));
        let node = TlsNode {
            child,
            port,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let ping = async {
                let client = redis::Client::build_with_tls(
                    format!("rediss://127.0.0.1:{port}").as_str(),
                    pki.certificates(),
                )?;
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut con).await
            };
            match tokio::time::timeout(std::time::Duration::from_secs(1), ping).await {
                Ok(Ok(_)) => return node,
                other => {
                    if tokio::time::Instant::now() > deadline {
                        panic!("TLS node on port {port} did not answer PING: {other:?}");
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Its TLS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// An admin connection (the default user) over TLS with the PKI's client certificate.
    pub async fn admin(&self, pki: &Pki) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::build_with_tls(
            format!("rediss://127.0.0.1:{}", self.port).as_str(),
            pki.certificates(),
        )
        .unwrap_or_else(|e| panic!("TLS client: {e}"));
        client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("admin connection to TLS node {}: {e}", self.port))
    }
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
