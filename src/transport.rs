//! How a node is reached: the driver's client for its URL (plain, or TLS with the server name
//! verified in place of the URL's host), and the TLS connect with the client's rustls
//! configuration, built once per client ([`TlsConnector`](crate::config::TlsConnector)),
//! where redis-rs builds one, parsing the system's roots, on every connect.

#[cfg(feature = "tls")]
use redis::aio::MultiplexedConnection;

use crate::config::NodeUrl;
#[cfg(feature = "tls")]
use crate::config::TlsConnector;

/// The driver's client for `url`: with the TLS certificates when given, and with the TLS
/// server name in place of the URL's host (the connection then goes to the URL's host
/// through [`FixedAddr`]).
pub(crate) fn driver_client(
    url: &NodeUrl,
    tls: &crate::config::Tls,
) -> redis::RedisResult<(redis::Client, Option<FixedAddr>)> {
    let info = url.connection_info();
    if !url.is_tls() {
        return Ok((redis::Client::open(info)?, None));
    }
    #[cfg(feature = "tls")]
    {
        let mut info = info;
        let mut resolver = None;
        if let (
            Some(name),
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params,
            },
        ) = (&tls.server_name, info.addr().clone())
        {
            resolver = Some(FixedAddr { host, port });
            info = info.set_addr(redis::ConnectionAddr::TcpTls {
                host: name.clone(),
                port,
                insecure,
                tls_params,
            });
        }
        let client = match tls.certificates() {
            Some(certs) => redis::Client::build_with_tls(info, certs)?,
            None => redis::Client::open(info)?,
        };
        Ok((client, resolver))
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = tls;
        Ok((redis::Client::open(info)?, None))
    }
}

/// A TLS connection to `url`'s node with the client's rustls configuration, built once per
/// client ([`TlsConnector`](crate::config::TlsConnector)). The steps and errors of redis-rs's
/// own TLS connect: resolve the URL's host, race its addresses, the handshake verifying the
/// server name (else the URL's host), then the connection's set-up (AUTH, SELECT); but
/// redis-rs builds the configuration anew on every connect, parsing the system's roots each
/// time (even with a CA file).
///
/// Returns the connection and its driver task, which the caller stops when the last clone of
/// the connection is dropped.
#[cfg(feature = "tls")]
pub(crate) async fn tls_connect(
    url: &NodeUrl,
    tls: &TlsConnector,
    config: redis::AsyncConnectionConfig,
) -> redis::RedisResult<(MultiplexedConnection, tokio::task::AbortHandle)> {
    let info = url.connection_info();
    let redis::ConnectionAddr::TcpTls {
        host,
        port,
        insecure,
        ..
    } = info.addr()
    else {
        return Err((
            redis::ErrorKind::InvalidClientConfig,
            "Constructing a TLS client requires a URL with the `rediss://` scheme",
        )
            .into());
    };
    if *insecure {
        return Err((
            redis::ErrorKind::InvalidClientConfig,
            "a rediss:// URL with #insecure is refused: redquorum always verifies the node's certificate",
        )
            .into());
    }
    let connector = tokio_rustls::TlsConnector::from(tls.client_config()?);
    let name = tls.settings.server_name.as_deref().unwrap_or(host);
    let name = rustls::pki_types::ServerName::try_from(name)?.to_owned();
    let addrs: Vec<_> = tokio::net::lookup_host((host.as_str(), *port))
        .await?
        .collect();
    if addrs.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{host} resolves to no address"),
        )
        .into());
    }
    let settings = info.tcp_settings();
    let attempts = addrs.into_iter().map(|addr| {
        let (connector, name) = (connector.clone(), name.clone());
        Box::pin(async move {
            let tcp = tcp_connect(addr, settings).await?;
            connector.connect(name, tcp).await
        })
    });
    let (stream, _) = futures::future::select_ok(attempts).await?;
    let (conn, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    Ok((conn, tokio::spawn(driver).abort_handle()))
}

/// A TCP connection to `addr` with the URL's TCP settings, as redis-rs sets them (a node URL
/// sets none: they are the driver's defaults; the linger time, which has no getter, too).
#[cfg(feature = "tls")]
async fn tcp_connect(
    addr: std::net::SocketAddr,
    settings: &redis::io::tcp::TcpSettings,
) -> std::io::Result<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(settings.nodelay())?;
    let socket = redis::io::tcp::socket2::SockRef::from(&tcp);
    if let Some(keepalive) = settings.keepalive() {
        socket.set_tcp_keepalive(keepalive)?;
    }
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    socket.set_tcp_user_timeout(settings.user_timeout())?;
    Ok(tcp)
}

/// A resolver that ignores the host it is asked for (the TLS server name) and resolves the
/// node URL's own host and port.
#[derive(Clone)]
pub(crate) struct FixedAddr {
    host: String,
    port: u16,
}

impl redis::io::AsyncDNSResolver for FixedAddr {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        _host: &'b str,
        _port: u16,
    ) -> redis::RedisFuture<'a, Box<dyn Iterator<Item = std::net::SocketAddr> + Send + 'a>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((self.host.as_str(), self.port)).await?;
            Ok(Box::new(addrs) as Box<dyn Iterator<Item = std::net::SocketAddr> + Send>)
        })
    }
}
