//! `Config::from_env` reads every variable the CLI reads (`ENV_VARS`, one table for both).
//! Each test runs in a process of its own under nextest, so setting variables is contained.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use redquorum::{Config, ConfigError, ATTEST_FSYNC_ENV, CLUSTER_ENV, ENV_VARS, NODES_ENV};

#[test]
fn from_env_reads_the_cluster_pin_and_the_fsync_attestation_like_the_cli() {
    for (name, _) in ENV_VARS {
        std::env::remove_var(name);
    }
    assert!(matches!(Config::from_env(), Err(ConfigError::EnvMissing)));
    std::env::set_var(
        NODES_ENV,
        "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3",
    );
    let plain = format!("{:?}", Config::from_env().expect("the node list alone"));
    std::env::set_var(CLUSTER_ENV, "00112233445566AA");
    std::env::set_var(ATTEST_FSYNC_ENV, "true");
    let pinned = format!("{:?}", Config::from_env().expect("pinned and attested"));
    assert!(
        pinned.contains("00112233445566aa") && !plain.contains("00112233445566aa"),
        "the pin is read: {pinned}"
    );
    assert!(
        pinned.contains("attest_fsync_always: true")
            && plain.contains("attest_fsync_always: false"),
        "the attestation is read: {pinned}"
    );
    std::env::set_var(ATTEST_FSYNC_ENV, "off");
    assert!(format!("{:?}", Config::from_env().unwrap()).contains("attest_fsync_always: false"));
    std::env::set_var(CLUSTER_ENV, "not-an-id");
    assert!(
        matches!(Config::from_env(), Err(ConfigError::ClusterMismatch(_))),
        "a malformed pin is an error, not ignored"
    );
}
