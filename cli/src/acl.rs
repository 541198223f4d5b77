//! `acl`: print the least-privilege Redis ACL for redquorum's user as `ACL SETUSER` commands,
//! one per line, for `redis-cli` to run as they are (needs no nodes).
//!
//! The first line resets the user and grants what every client needs; each further line adds
//! one feature's commands. No line holds a password. CONFIG GET is granted only with
//! `--allow-config-get`: it cannot be limited to one parameter and reads the admin password
//! (requirepass, masterauth); without it, clients run with `--attest-fsync-always`.

use std::process::ExitCode;

use redquorum::acl::Feature;

use crate::failure::Failure;

/// Parse `--feature` values.
pub(crate) fn features(names: &[String]) -> Result<Vec<Feature>, redquorum::Error> {
    names
        .iter()
        .filter(|n| !n.trim().is_empty())
        .map(|n| Feature::parse(n))
        .collect()
}

/// `acl`: print the `ACL SETUSER` lines of `user` for the features named.
pub(crate) fn run(
    user: &str,
    feature: &[String],
    allow_config_get: bool,
) -> Result<ExitCode, Failure> {
    for line in redquorum::acl::setuser_lines(user, &features(feature)?, allow_config_get)? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
