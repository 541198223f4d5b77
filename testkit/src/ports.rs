//! Host ports for test nodes (containers, local and TLS processes).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

/// Host ports are drawn from here: below Linux's ephemeral range (32768-60999), so a
/// port freed by a killed node is not taken by some outgoing connection before the
/// node restarts on it.
const HOST_PORT_RANGE: std::ops::Range<u16> = 20_000..32_000;

/// A port in [`HOST_PORT_RANGE`] that is free on 127.0.0.1 right now.
pub(crate) fn pick_host_port() -> u16 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let span = u64::from(HOST_PORT_RANGE.end - HOST_PORT_RANGE.start);
    for _ in 0..1000 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_u32(std::process::id());
        let offset = u16::try_from(hasher.finish() % span).unwrap_or(0);
        let port = HOST_PORT_RANGE.start + offset;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free host port found in {HOST_PORT_RANGE:?} on 127.0.0.1 after 1000 tries");
}
