//! The TLS options (`--cacert`, `--cert`, `--key`, `--sni`) applied to a configuration: for the
//! global node list and for `cluster change --to`'s new list alike.

use std::path::PathBuf;

use redquorum::Config;

/// The TLS options.
pub(crate) struct TlsFiles {
    pub(crate) cacert: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) sni: Option<String>,
}

/// The TLS options applied to `config`.
pub(crate) fn with_tls(cli: &TlsFiles, mut config: Config) -> Result<Config, redquorum::Error> {
    if let Some(ca) = &cli.cacert {
        config = config.with_ca_file(ca)?;
    }
    match (&cli.cert, &cli.key) {
        (Some(cert), Some(key)) => config = config.with_client_cert(cert, key)?,
        (None, None) => {}
        (Some(_), None) => {
            return Err(redquorum::Error::InvalidArgument(
                "--cert (REDQUORUM_CERT) is given without --key (REDQUORUM_KEY): a client \
                 certificate needs its key"
                    .into(),
            ))
        }
        (None, Some(_)) => {
            return Err(redquorum::Error::InvalidArgument(
                "--key (REDQUORUM_KEY) is given without --cert (REDQUORUM_CERT): a client \
                 key needs its certificate"
                    .into(),
            ))
        }
    }
    if let Some(name) = &cli.sni {
        config = config.with_server_name(name)?;
    }
    Ok(config)
}
