//! Per-process port maps: an `LD_PRELOAD` shim (`shim/portmap.c`) that sends a process's
//! connections to `127.0.0.1:<from>` to `127.0.0.1:<to>`. A fault campaign gives every client
//! process the same node URLs (the cluster's identity is a list of URLs) while each reaches
//! the nodes through its own [`FaultProxy`](crate::FaultProxy)s, so one client can be cut off
//! from a node that the others still reach.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The shim's C source.
const SOURCE: &str = include_str!("../shim/portmap.c");

/// The environment variable the shim reads its map from: `from:to,from:to,...`.
pub const MAP_ENV: &str = "REDQUORUM_PORT_MAP";

/// The shim compiled for this machine (built with `cc` at the first call, then reused).
/// Panics when `cc` is missing or fails.
pub fn shim_library() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| crate::clock::build_shim("portmap", SOURCE))
        .clone()
}

/// The environment a process needs so its connections to each `from` port go to the paired
/// `to` port (both on 127.0.0.1). Replaces any `LD_PRELOAD` the process would inherit.
pub fn envs(map: &[(u16, u16)]) -> [(String, String); 2] {
    let value: Vec<String> = map.iter().map(|(f, t)| format!("{f}:{t}")).collect();
    [
        (
            "LD_PRELOAD".to_string(),
            shim_library().to_string_lossy().into_owned(),
        ),
        (MAP_ENV.to_string(), value.join(",")),
    ]
}
