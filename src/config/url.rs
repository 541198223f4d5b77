//! Node URLs: parsing, validation, and the redacted forms (a password never leaves
//! [`NodeUrl`] in text).

use std::fmt;

use redis::IntoConnectionInfo;

use super::ConfigError;

/// A validated node URL (`redis://` or `rediss://`, optional `user:password@`, optional `/db`).
///
/// Its `Display` and `Debug` never show the password.
#[derive(Clone)]
pub struct NodeUrl {
    info: redis::ConnectionInfo,
    redacted: String,
    /// Normalized identity used to detect duplicates: scheme, lower-cased host, port, db, user.
    identity: String,
    /// The node's name in a cluster descriptor: the URL without password or fragment.
    name: String,
    secret: Option<String>,
    tls: bool,
}

impl NodeUrl {
    /// Parse and validate one URL. `index` is its position in the node list, for messages.
    pub fn parse(raw: &str, index: usize) -> Result<NodeUrl, ConfigError> {
        let raw = raw.trim();
        let redacted_raw = redact_raw(raw);
        let malformed = |reason: String| ConfigError::MalformedUrl {
            index,
            url: redacted_raw.clone(),
            reason,
        };
        if raw.is_empty() {
            return Err(malformed("empty URL".into()));
        }
        let parsed = url::Url::parse(raw).map_err(|e| malformed(e.to_string()))?;
        let tls = match parsed.scheme() {
            "redis" => false,
            "rediss" => true,
            other => {
                return Err(ConfigError::UnsupportedScheme {
                    index,
                    url: redacted_raw,
                    scheme: other.to_string(),
                })
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(malformed(
                "rediss:// needs redquorum's `tls` feature".into(),
            ));
        }
        let host = match parsed.host_str() {
            Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
            _ => return Err(malformed("no host".into())),
        };
        let port = parsed.port().unwrap_or(6379);
        if port == 0 {
            return Err(malformed("port 0".into()));
        }
        let db = parse_db(parsed.path()).map_err(malformed)?;
        if parsed.query().is_some() {
            return Err(malformed("query parameters are not supported".into()));
        }
        let user = percent_decode(parsed.username());
        let secret = parsed.password().map(percent_decode);
        let info = raw
            .into_connection_info()
            .map_err(|e| malformed(scrub(&e.to_string(), secret.as_deref())))?;
        let shown = Shown {
            scheme: parsed.scheme(),
            user: &user,
            has_password: secret.is_some(),
            host: &host,
            port,
            db,
            fragment: parsed.fragment(),
        };
        Ok(NodeUrl {
            info,
            redacted: shown.redacted(),
            name: shown.name(),
            identity: shown.identity(),
            secret,
            tls,
        })
    }

    /// Whether this is a `rediss://` (TLS) URL.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The node's name in the cluster descriptor: scheme, user, host, port and database,
    /// without password (every client should spell a node the same way).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of the node a cluster descriptor names `name`, with the password `secret` (a
    /// client following a change of the node list).
    pub(crate) fn from_name(
        name: &str,
        secret: Option<&str>,
        index: usize,
    ) -> Result<NodeUrl, ConfigError> {
        let mut url = url::Url::parse(name).map_err(|e| ConfigError::MalformedUrl {
            index,
            url: redact_raw(name),
            reason: e.to_string(),
        })?;
        if let Some(secret) = secret {
            url.set_password(Some(secret))
                .map_err(|()| ConfigError::MalformedUrl {
                    index,
                    url: redact_raw(name),
                    reason: "cannot carry a password".into(),
                })?;
        }
        NodeUrl::parse(url.as_str(), index)
    }

    /// The password, if the URL has one.
    pub(crate) fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    pub(crate) fn connection_info(&self) -> redis::ConnectionInfo {
        self.info.clone()
    }

    /// Remove this URL's password from a message (for error texts from the driver).
    pub(crate) fn scrub(&self, message: &str) -> String {
        scrub(message, self.secret.as_deref())
    }
}

impl fmt::Display for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for NodeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeUrl({})", self.redacted)
    }
}

impl PartialEq for NodeUrl {
    fn eq(&self, other: &Self) -> bool {
        self.identity == other.identity
    }
}

fn percent_decode(s: &str) -> String {
    // Minimal %XX decoding, enough to recognize the password inside driver messages.
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Replace a secret inside a message by `***`.
fn scrub(message: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if !s.is_empty() => message.replace(s, "***"),
        _ => message.to_string(),
    }
}

/// Redact the user-info part of a URL that may not even parse: everything after the first
/// `:` of the user info (or all of it, if it has no `:`) becomes `***`.
pub(crate) fn redact_raw(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        // Not URL-shaped: it could be a bare password pasted by mistake. Show only its length.
        return if raw.contains('@') || raw.contains(':') {
            format!("<{} characters, not shown>", raw.chars().count())
        } else {
            raw.to_string()
        };
    };
    let rest = &raw[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        None => raw.to_string(),
        Some(at) => {
            let userinfo = &authority[..at];
            let shown = match userinfo.find(':') {
                Some(colon) => format!("{}:***", &userinfo[..colon]),
                None => "***".to_string(),
            };
            format!("{}{}{}", &raw[..scheme_end + 3], shown, &rest[at..])
        }
    }
}

/// The database of a URL path (`/3`): 0 when absent, at most 15999.
fn parse_db(path: &str) -> Result<i64, String> {
    let db_path = path.trim_start_matches('/');
    if db_path.is_empty() {
        return Ok(0);
    }
    db_path
        .parse()
        .ok()
        .filter(|d| (0..=15_999).contains(d))
        .ok_or_else(|| format!("database must be a number, got {db_path:?}"))
}

/// The parts of a node URL as shown: in logs (redacted), in a cluster descriptor (name),
/// and to compare two URLs (identity).
struct Shown<'a> {
    scheme: &'a str,
    user: &'a str,
    has_password: bool,
    host: &'a str,
    port: u16,
    db: i64,
    fragment: Option<&'a str>,
}

impl Shown<'_> {
    fn host(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.to_string()
        }
    }

    fn db(&self) -> String {
        if self.db == 0 {
            String::new()
        } else {
            format!("/{}", self.db)
        }
    }

    /// `scheme://user:***@host:port/db#fragment`: the password replaced.
    fn redacted(&self) -> String {
        let auth = match (self.has_password, self.user.is_empty()) {
            (true, true) => ":***@".to_string(),
            (true, false) => format!("{}:***@", self.user),
            (false, false) => format!("{}@", self.user),
            (false, true) => String::new(),
        };
        let fragment = self.fragment.map(|f| format!("#{f}")).unwrap_or_default();
        format!(
            "{}://{auth}{}:{}{}{fragment}",
            self.scheme,
            self.host(),
            self.port,
            self.db()
        )
    }

    /// `scheme://user@host:port/db`: no password, no fragment.
    fn name(&self) -> String {
        let user = if self.user.is_empty() {
            String::new()
        } else {
            format!("{}@", self.user)
        };
        format!(
            "{}://{user}{}:{}{}",
            self.scheme,
            self.host(),
            self.port,
            self.db()
        )
    }

    fn identity(&self) -> String {
        format!(
            "{}://{}@{}:{}/{}",
            self.scheme,
            self.user,
            self.host(),
            self.port,
            self.db
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn password_never_shows_in_display_or_debug() {
        let cfg = Config::from_urls([
            "redis://alice:s3cr3t-pw@127.0.0.1:7001/2",
            "rediss://:hunter22@h:7002",
        ])
        .expect("valid urls");
        let text = format!("{cfg:?} {} {}", cfg.nodes()[0], cfg.nodes()[1]);
        assert!(
            !text.contains("s3cr3t-pw") && !text.contains("hunter22"),
            "password leaked: {text}"
        );
        assert_eq!(
            cfg.nodes()[0].to_string(),
            "redis://alice:***@127.0.0.1:7001/2"
        );
        assert_eq!(cfg.nodes()[1].to_string(), "rediss://:***@h:7002");
    }

    #[test]
    fn malformed_url_errors_redact_the_password() {
        let err = Config::from_urls(["redis://bob:topsecret@host:notaport"]).expect_err("bad port");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("topsecret"), "password leaked: {text}");
        assert!(text.contains("node 0"), "error must name the node: {text}");
    }

    #[test]
    fn raw_redaction_handles_unparseable_urls() {
        assert_eq!(redact_raw("redis://u:p@ss@h:1"), "redis://u:***@h:1");
        assert_eq!(redact_raw("redis://justpassword@h"), "redis://***@h");
        assert_eq!(redact_raw("redis://h:1"), "redis://h:1");
        assert!(!redact_raw("user:pw@host").contains("pw"));
    }
}
