//! Where `serve` listens, and who may call it: a TCP address (loopback unless a bearer token
//! guards it), a Unix socket, TLS over TCP; the bearer token check.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A listen address as given to `--listen`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Bind {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Bind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bind::Tcp(a) => write!(f, "{a}"),
            Bind::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `host:port` (an IP address; `localhost` is 127.0.0.1) or `unix:PATH`.
pub(crate) fn parse_bind(s: &str) -> Result<Bind, String> {
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("unix: needs a socket path, e.g. unix:/run/redquorum.sock".into());
        }
        return Ok(Bind::Unix(PathBuf::from(path)));
    }
    let s2 = s.replacen("localhost:", "127.0.0.1:", 1);
    s2.parse::<SocketAddr>().map(Bind::Tcp).map_err(|_| {
        format!(
            "{s:?} is not an address to listen on: use IP:PORT (127.0.0.1:7380, [::1]:7380, \
             0.0.0.0:7380 with --token-file) or unix:PATH"
        )
    })
}

impl Bind {
    /// Whether callers from other hosts could reach it (so a bearer token is required).
    pub(crate) fn is_exposed(&self) -> bool {
        match self {
            Bind::Tcp(a) => !a.ip().is_loopback(),
            Bind::Unix(_) => false,
        }
    }
}

/// The bearer token in `path`: its first line, at least 16 bytes, printable ASCII.
pub(crate) fn read_token(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--token-file {}: cannot read it: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.len() < 16 {
        return Err(format!(
            "--token-file {}: the token (its first line) must be at least 16 characters",
            path.display()
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "--token-file {}: the token must be printable ASCII without spaces",
            path.display()
        ));
    }
    Ok(token.as_bytes().to_vec())
}

/// Whether the `Authorization` header carries `token` (the scheme's name in any case, the
/// token compared in constant time).
pub(crate) fn authorized(header: Option<&[u8]>, token: &[u8]) -> bool {
    let Some(header) = header else { return false };
    let Some(given) = header
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .and_then(|_| header.get(7..))
    else {
        return false;
    };
    given.len() == token.len()
        && given
            .iter()
            .zip(token)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// A caller's TCP connection tuned for sessions: no Nagle delay; keep-alive probes after 10 s
/// of silence (every 5 s, 3 of them) and a 20 s bound on unacknowledged data, so a caller
/// whose host vanished without closing its connection ends its sessions within about 25 s
/// instead of the kernel's default of minutes to hours.
pub(crate) fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    let _ = socket.set_tcp_keepalive(&keepalive);
    let _ = socket.set_tcp_user_timeout(Some(Duration::from_secs(20)));
}

/// The server's TLS settings from `--tls-cert` and `--tls-key` (PEM).
pub(crate) fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert {}: no certificate in it",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A Unix socket listener at `path`. A socket file left by a server that is gone is replaced;
/// one a live server answers on, or any other file, is refused.
pub(crate) fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    let shown = path.display();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("--listen unix:{shown}: exists and is not a socket"));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!(
                "--listen unix:{shown}: another server is listening on it"
            ));
        }
        let _ = std::fs::remove_file(path);
    }
    tokio::net::UnixListener::bind(path).map_err(|e| format!("--listen unix:{shown}: {e}"))
}

/// The file's device and inode (to remove only our own socket file at exit).
pub(crate) fn inode(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Most TLS handshakes in progress at once; more connections wait for a slot.
const MAX_HANDSHAKES: usize = 256;

/// A TLS listener: handshakes run in tasks of their own (a slow client cannot hold up
/// others), at most [`MAX_HANDSHAKES`] at once, each bounded by 10 s; failed ones are logged
/// and dropped.
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub(crate) fn new(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, rx) = mpsc::channel(64);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (socket, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("serve: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                tune(&socket);
                let (acceptor, sender) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(socket));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::info!("serve: TLS handshake with {peer} failed: {e}")
                        }
                        Err(_) => tracing::info!("serve: TLS handshake with {peer} timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { rx, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept loop ended (it never does while the listener lives).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_and_exposed_ones_are_told_apart() {
        assert!(!parse_bind("127.0.0.1:7380").unwrap().is_exposed());
        assert!(!parse_bind("localhost:7380").unwrap().is_exposed());
        assert!(!parse_bind("[::1]:7380").unwrap().is_exposed());
        assert!(parse_bind("0.0.0.0:7380").unwrap().is_exposed());
        assert!(!parse_bind("unix:/tmp/x.sock").unwrap().is_exposed());
        assert!(parse_bind("unix:").is_err());
        assert!(parse_bind("example.com:80").is_err());
        assert!(parse_bind("7380").is_err());
    }

    #[test]
    fn only_the_exact_bearer_token_is_authorized() {
        let token = b"0123456789abcdef";
        assert!(authorized(Some(b"Bearer 0123456789abcdef"), token));
        assert!(!authorized(Some(b"Bearer 0123456789abcdeF"), token));
        assert!(!authorized(Some(b"Bearer 0123456789abcde"), token));
        assert!(!authorized(Some(b"Basic 0123456789abcdef"), token));
        assert!(authorized(Some(b"bearer 0123456789abcdef"), token));
        assert!(!authorized(Some(b"Bearer"), token));
        assert!(!authorized(None, token));
    }
}
