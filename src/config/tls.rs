//! TLS settings for `rediss://` nodes: a CA file, a client certificate and key (mutual TLS),
//! and the server name to verify. Every file is read and checked when it is set, so a bad
//! file is an error that names the setting before any connection is tried.
//!
//! Architecture invariant: certificate and key bytes never appear in `Debug`, `Display` or
//! an error message; only the file's path does.

use std::fmt;
use std::path::{Path, PathBuf};

use super::ConfigError;

/// The library's and the CLI's names of each TLS setting, for messages.
pub(crate) const CA_SETTING: &str = "ca_file (--cacert, REDQUORUM_CACERT)";
pub(crate) const CERT_SETTING: &str = "client certificate (--cert, REDQUORUM_CERT)";
pub(crate) const KEY_SETTING: &str = "client key (--key, REDQUORUM_KEY)";
pub(crate) const SNI_SETTING: &str = "server name (--sni, REDQUORUM_SNI)";

/// Largest PEM file read (a CA bundle is a few hundred KiB at most).
const MAX_PEM_BYTES: u64 = 4 << 20;

/// A PEM file read into memory, with the path it came from.
#[derive(Clone)]
pub(crate) struct PemFile {
    pub(crate) path: PathBuf,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) pem: Vec<u8>,
}

impl fmt::Debug for PemFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PemFile({})", self.path.display())
    }
}

/// The TLS settings of a [`Config`](super::Config).
#[derive(Clone, Debug, Default)]
pub(crate) struct Tls {
    pub(crate) ca: Option<PemFile>,
    pub(crate) client: Option<(PemFile, PemFile)>,
    pub(crate) server_name: Option<String>,
}

impl Tls {
    /// Whether any TLS setting was given.
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some() || self.server_name.is_some()
    }

    /// The certificates in redis-rs's form, when a CA or a client certificate was given.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.pem.clone(),
                    client_key: key.pem.clone(),
                }),
            root_cert: self.ca.as_ref().map(|ca| ca.pem.clone()),
        })
    }
}

/// A client's TLS settings and the rustls configuration they make, built on the client's
/// first TLS connect and shared by every later connect and reconnect of every node: the CA
/// file's roots (or the system's, loaded once per process) are parsed once, not on each
/// connect as redis-rs does. One per [`Client`](crate::Client).
pub(crate) struct TlsConnector {
    pub(crate) settings: Tls,
    #[cfg(feature = "tls")]
    built: std::sync::Mutex<Option<std::sync::Arc<rustls::ClientConfig>>>,
    /// How many times the configuration was built (once, unless a build failed).
    #[cfg(feature = "tls")]
    builds: std::sync::atomic::AtomicU64,
}

/// The settings (paths only) and whether the configuration was built: never its certificates.
impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TlsConnector");
        d.field("settings", &self.settings);
        #[cfg(feature = "tls")]
        d.field("builds", &self.builds);
        d.finish_non_exhaustive()
    }
}

impl TlsConnector {
    pub(crate) fn new(settings: Tls) -> TlsConnector {
        TlsConnector {
            settings,
            #[cfg(feature = "tls")]
            built: std::sync::Mutex::new(None),
            #[cfg(feature = "tls")]
            builds: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The rustls configuration, built on the first call. A failed build is not kept: the
    /// next connect tries again (as every connect did before).
    #[cfg(feature = "tls")]
    pub(crate) fn client_config(
        &self,
    ) -> Result<std::sync::Arc<rustls::ClientConfig>, redis::RedisError> {
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = &*built {
            return Ok(config.clone());
        }
        let config = std::sync::Arc::new(rustls_config::build(&self.settings)?);
        self.builds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *built = Some(config.clone());
        Ok(config)
    }

    /// How many times [`client_config`](Self::client_config) built the configuration.
    #[cfg(all(test, feature = "tls"))]
    fn builds(&self) -> u64 {
        self.builds.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The rustls configuration redis-rs 1.8 builds for a connect (its `create_rustls_config`,
/// same roots, same client certificate, same errors), built here once per client.
#[cfg(feature = "tls")]
mod rustls_config {
    use std::sync::{Arc, Mutex};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::RootCertStore;

    use super::{PemFile, Tls};

    /// The configuration: the CA file's roots when one is set (they replace the system's, as
    /// in redis-rs), else the system's; the client certificate when one is set.
    pub(super) fn build(tls: &Tls) -> Result<rustls::ClientConfig, redis::RedisError> {
        let roots = match &tls.ca {
            Some(ca) => Arc::new(ca_roots(ca)?),
            None => native_roots()?,
        };
        // The process's default provider when one is installed, else ring (this crate's only
        // rustls provider): what `ClientConfig::builder()` chooses, without its panic.
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let Some((cert, key)) = &tls.client else {
            return Ok(builder.with_no_client_auth());
        };
        let chain = CertificateDer::pem_slice_iter(&cert.pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                std::io::Error::other(format!("Unable to parse client certificate chain PEM: {e}"))
            })?;
        let key = PrivateKeyDer::from_pem_slice(&key.pem).map_err(|e| {
            std::io::Error::other(format!("Unable to extract private key from PEM file: {e}"))
        })?;
        builder.with_client_auth_cert(chain, key).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "Unable to build client with TLS parameters provided.",
                e.to_string(),
            ))
        })
    }

    /// The CA file's certificates as trust anchors (redis-rs's parse and its errors).
    fn ca_roots(ca: &PemFile) -> Result<RootCertStore, redis::RedisError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca.pem) {
            let cert = cert.map_err(|e| {
                std::io::Error::other(format!("Unable to parse root certificate PEM: {e}"))
            })?;
            roots
                .add(cert)
                .map_err(|_| std::io::Error::other("Unable to parse TLS trust anchors"))?;
        }
        Ok(roots)
    }

    /// The system's trusted roots (rustls-native-certs: `SSL_CERT_FILE`, `SSL_CERT_DIR` or
    /// the platform's store), loaded on the first TLS connect without a CA file and kept for
    /// the life of the process, as most TLS stacks do (a root added to the system later needs
    /// a restart). A failed load is not kept: the next connect tries again.
    pub(super) fn native_roots() -> Result<Arc<RootCertStore>, redis::RedisError> {
        static ROOTS: Mutex<Option<Arc<RootCertStore>>> = Mutex::new(None);
        let mut kept = ROOTS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(roots) = &*kept {
            return Ok(roots.clone());
        }
        let mut loaded = rustls_native_certs::load_native_certs();
        if let Some(e) = loaded.errors.pop() {
            return Err(e.into());
        }
        let mut roots = RootCertStore::empty();
        for cert in loaded.certs {
            roots.add(cert)?;
        }
        let roots = Arc::new(roots);
        *kept = Some(roots.clone());
        Ok(roots)
    }
}

fn file_error(setting: &'static str, path: &Path, reason: impl Into<String>) -> ConfigError {
    ConfigError::TlsFile {
        setting,
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Read a PEM file of at most [`MAX_PEM_BYTES`].
fn read_pem(setting: &'static str, path: &Path) -> Result<PemFile, ConfigError> {
    use std::io::Read;
    if path.as_os_str().is_empty() {
        return Err(file_error(setting, path, "empty path"));
    }
    let file = std::fs::File::open(path).map_err(|e| file_error(setting, path, e.to_string()))?;
    let meta = file
        .metadata()
        .map_err(|e| file_error(setting, path, e.to_string()))?;
    if meta.is_dir() {
        return Err(file_error(setting, path, "is a directory, not a PEM file"));
    }
    let mut pem = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| file_error(setting, path, e.to_string()))?;
    if pem.len() as u64 > MAX_PEM_BYTES {
        return Err(file_error(
            setting,
            path,
            format!("larger than {MAX_PEM_BYTES} bytes: not a PEM certificate file"),
        ));
    }
    Ok(PemFile {
        path: path.to_path_buf(),
        pem,
    })
}

#[cfg(feature = "tls")]
mod check {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use super::*;

    pub(super) fn certs(
        setting: &'static str,
        file: &PemFile,
    ) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        let certs = CertificateDer::pem_slice_iter(&file.pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_error(setting, &file.path, format!("not valid PEM: {e}")))?;
        if certs.is_empty() {
            return Err(file_error(
                setting,
                &file.path,
                "holds no certificate (expected -----BEGIN CERTIFICATE-----)",
            ));
        }
        Ok(certs)
    }

    pub(super) fn ca(file: &PemFile) -> Result<(), ConfigError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs(CA_SETTING, file)? {
            roots.add(cert).map_err(|e| {
                file_error(
                    CA_SETTING,
                    &file.path,
                    format!("not a usable CA certificate: {e}"),
                )
            })?;
        }
        Ok(())
    }

    pub(super) fn client(cert: &PemFile, key: &PemFile) -> Result<(), ConfigError> {
        let chain = certs(CERT_SETTING, cert)?;
        let key_der = PrivateKeyDer::from_pem_slice(&key.pem).map_err(|e| {
            file_error(
                KEY_SETTING,
                &key.path,
                format!("holds no private key in PEM (expected -----BEGIN PRIVATE KEY-----): {e}"),
            )
        })?;
        let provider = rustls::crypto::ring::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => file_error(
                KEY_SETTING,
                &key.path,
                format!(
                    "does not fit the client certificate {}: {e}",
                    cert.path.display()
                ),
            ),
            other => file_error(
                CERT_SETTING,
                &cert.path,
                format!("not a usable client certificate (X.509 v3 needed): {other}"),
            ),
        })?;
        Ok(())
    }

    pub(super) fn server_name(name: &str) -> Result<(), ConfigError> {
        rustls::pki_types::ServerName::try_from(name.to_string())
            .map(|_| ())
            .map_err(|e| ConfigError::TlsSetting {
                setting: SNI_SETTING,
                reason: format!("{name:?} is not a DNS name or IP address: {e}"),
            })
    }
}

#[cfg(not(feature = "tls"))]
mod check {
    use super::*;

    fn no_tls(setting: &'static str) -> ConfigError {
        ConfigError::TlsSetting {
            setting,
            reason: "this build of redquorum has no TLS (its `tls` feature is off)".into(),
        }
    }

    pub(super) fn ca(_: &PemFile) -> Result<(), ConfigError> {
        Err(no_tls(CA_SETTING))
    }

    pub(super) fn client(_: &PemFile, _: &PemFile) -> Result<(), ConfigError> {
        Err(no_tls(CERT_SETTING))
    }

    pub(super) fn server_name(_: &str) -> Result<(), ConfigError> {
        Err(no_tls(SNI_SETTING))
    }
}

/// Read and check a CA file.
pub(crate) fn ca_file(path: &Path) -> Result<PemFile, ConfigError> {
    let file = read_pem(CA_SETTING, path)?;
    check::ca(&file)?;
    Ok(file)
}

/// Read and check a client certificate and its key.
pub(crate) fn client_cert(cert: &Path, key: &Path) -> Result<(PemFile, PemFile), ConfigError> {
    let cert = read_pem(CERT_SETTING, cert)?;
    let key = read_pem(KEY_SETTING, key)?;
    check::client(&cert, &key)?;
    Ok((cert, key))
}

/// Check a server name.
pub(crate) fn server_name(name: &str) -> Result<String, ConfigError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(ConfigError::TlsSetting {
            setting: SNI_SETTING,
            reason: "empty".into(),
        });
    }
    check::server_name(name)?;
    Ok(name.to_ascii_lowercase())
}

/// A hint for a TLS handshake failure, from the driver's message: which setting to check.
pub(crate) fn hint(message: &str) -> Option<&'static str> {
    let m = message.to_ascii_lowercase();
    if m.contains("unknownissuer") || m.contains("unknown issuer") || m.contains("badsignature") {
        Some("the node's certificate is not signed by a trusted CA: check ca_file (--cacert, REDQUORUM_CACERT)")
    } else if m.contains("notvalidforname") || m.contains("not valid for name") {
        Some("the node's certificate does not name the host in its URL: use the name it was issued for in the URL, or set the server name (--sni, REDQUORUM_SNI)")
    } else if m.contains("expired") || m.contains("notvalidyet") {
        Some("the node's certificate is expired or not yet valid")
    } else if m.contains("certificaterequired")
        || m.contains("certificate required")
        || m.contains("handshakefailure")
        || m.contains("bad certificate")
        || m.contains("badcertificate")
        || m.contains("unknownca")
        || m.contains("unknown ca")
    {
        Some("the node refused the client: it may require a client certificate signed by its CA (--cert and --key, REDQUORUM_CERT and REDQUORUM_KEY)")
    } else if m.contains("corrupt message")
        || m.contains("invalidcontenttype")
        || m.contains("wrong version number")
    {
        Some("TLS and plain text mixed: is the node's port a TLS port (rediss://) or a plain one (redis://)?")
    } else {
        None
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn every_connect_of_a_client_reuses_the_tls_configuration_built_once() {
        let pki = redquorum_testkit::secure::Pki::generate();
        let connector = TlsConnector::new(Tls {
            ca: Some(ca_file(&pki.ca).expect("a CA file")),
            client: Some(client_cert(&pki.client.cert, &pki.client.key).expect("a certificate")),
            server_name: None,
        });
        assert_eq!(
            connector.builds(),
            0,
            "built on the first connect, not before"
        );
        let first = connector.client_config().expect("built");
        for _ in 0..10 {
            let again = connector.client_config().expect("kept");
            assert!(
                Arc::ptr_eq(&first, &again),
                "a reconnect reuses the configuration"
            );
        }
        assert_eq!(connector.builds(), 1, "the CA file was parsed once");
        let shown = format!("{connector:?}");
        assert!(
            shown.contains("ca.crt") && !shown.contains("CertificateDer"),
            "Debug names the files, never a certificate: {shown}"
        );
    }

    #[test]
    fn the_systems_roots_are_loaded_once_per_process() {
        let a = rustls_config::native_roots().expect("the system's roots load");
        let b = rustls_config::native_roots().expect("kept");
        assert!(Arc::ptr_eq(&a, &b));
        let one = TlsConnector::new(Tls::default())
            .client_config()
            .expect("built");
        let two = TlsConnector::new(Tls::default())
            .client_config()
            .expect("built");
        assert!(
            !Arc::ptr_eq(&one, &two),
            "each client builds its own configuration, over the process's roots"
        );
    }
}
