//! A failure of the command, as printed: `redquorum: <message>` on stderr, exit code 2.
//!
//! A library error is printed as the library words it; a configuration error of an option
//! names the option (and its variable) first, so the operator knows which one to fix.

use redquorum::ConfigError;

/// The exit code of `lock run`, `job run` and `election run`/`campaign` when the wait ended
/// before the takeover of a lease that looks abandoned (`Error::LockLooksAbandoned`: its
/// holder is probably gone; the message says when it can be taken over). Not 3: nobody was
/// seen alive holding it.
pub(crate) const LOOKS_ABANDONED: u8 = 5;

/// A failure of the command, as printed (`redquorum: ...`, exit 2).
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<redquorum::Error> for Failure {
    fn from(e: redquorum::Error) -> Self {
        Failure(e.to_string())
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        redquorum::Error::from(e).into()
    }
}

/// A configuration error of the option (and variable) `setting`, named first.
pub(crate) fn setting_error(setting: &str, e: impl std::fmt::Display) -> Failure {
    Failure(format!("invalid configuration: {setting}: {e}"))
}
