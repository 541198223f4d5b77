//! A failure of the command, as printed: `redquorum: <message>` on stderr, exit code 2.
//!
//! A library error is printed as the library words it; a configuration error of an option
//! names the option (and its variable) first, so the operator knows which one to fix.

use redquorum::ConfigError;

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
