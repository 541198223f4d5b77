//! Wall-clock steps for Redis nodes: an `LD_PRELOAD` shim (`shim/clockstep.c`) that adds an
//! offset, read from a small file, to `gettimeofday`, `time`, `timespec_get` and
//! `clock_gettime` on the realtime clocks (`CLOCK_REALTIME`, `CLOCK_REALTIME_COARSE`,
//! `CLOCK_REALTIME_ALARM`, `CLOCK_TAI`). The monotonic and boot clocks are untouched, as after
//! an NTP step. Redis's `TIME` and its key expiry follow the stepped clock.
//!
//! The offset file holds exactly 8 bytes: a little-endian `i64` of milliseconds. The shim maps
//! it (`MAP_SHARED`, read-only) when the process starts and reads it on every clock call, so a
//! step is rewriting those 8 bytes in place (never truncating or replacing the file), and the
//! running process sees it at its next clock read.
//!
//! libfaketime does not work with Debian's redis-server (it recurses inside jemalloc's
//! start-up); this shim takes real time from the kernel's vDSO (found through the auxiliary
//! vector, not through libc or `dlsym`), or from the raw system call, and allocates nothing.
//! Its cost per clock call is a few nanoseconds.
//!
//! [`TestNode`](crate::TestNode) containers always run under it (see
//! [`TestNode::step_clock_ms`](crate::TestNode::step_clock_ms)); [`ClockDir`] also serves a
//! local process, e.g. a `redis-server` started with `std::process::Command`. It works the same
//! under `valkey-server` (8.0; env `REDQUORUM_TEST_SERVER`, see
//! [`server_program`](crate::server_program)), which reads its clocks through the same calls.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The shim's C source.
const SHIM_SOURCE: &str = include_str!("../shim/clockstep.c");

/// The environment variable the shim reads the offset file's path from.
pub const OFFSET_FILE_ENV: &str = "REDQUORUM_CLOCK_OFFSET_FILE";

/// File name of the shim inside a [`ClockDir`].
const LIBRARY_NAME: &str = "clockstep.so";
/// File name of the offset file inside a [`ClockDir`].
const OFFSET_NAME: &str = "offset";

/// The wall-clock shim compiled for this machine: `<temp dir>/redquorum-clockstep-<hash of the
/// source>.so`, built with `cc -O2 -shared -fPIC` at the first call in a process and reused
/// by later processes. Concurrent test processes each compile in a private directory and
/// rename the result into place, so none ever loads a half-written file.
///
/// Panics when `cc` is missing or fails (with its output).
pub fn shim_library() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build_shim("clockstep", SHIM_SOURCE))
        .clone()
}

/// Compile the shim `name` from `source` (see [`shim_library`]): `<temp dir>/redquorum-<name>-
/// <hash of the source>.so`.
pub(crate) fn build_shim(name: &str, source: &str) -> PathBuf {
    let hash = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        source.hash(&mut h);
        h.finish()
    };
    let dir = std::env::temp_dir();
    let target = dir.join(format!("redquorum-{name}-{hash:016x}.so"));
    if target.exists() {
        return target;
    }
    let build = tempfile::Builder::new()
        .prefix(&format!("redquorum-{name}-build-"))
        .tempdir_in(&dir)
        .unwrap_or_else(|e| panic!("{name} shim: cannot create a build directory in {dir:?}: {e}"));
    let src = build.path().join(format!("{name}.c"));
    let out_file = build.path().join(format!("{name}.so"));
    std::fs::write(&src, source)
        .unwrap_or_else(|e| panic!("{name} shim: cannot write its source to {src:?}: {e}"));
    let out = std::process::Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out_file)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!("{name} shim: cannot run `cc` (is a C compiler installed?): {e}")
        });
    assert!(
        out.status.success(),
        "{name} shim: `cc -O2 -shared -fPIC` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Atomic on one file system: a racing process renames an identical file over it.
    std::fs::rename(&out_file, &target)
        .unwrap_or_else(|e| panic!("{name} shim: cannot move it into {target:?}: {e}"));
    target
}

/// One stepped wall clock: a private directory holding a copy of the shim (`clockstep.so`)
/// and its offset file (`offset`), for one process or one container (a node's host clock).
/// It outlives restarts of the process that uses it; dropping it deletes the directory.
///
/// A step moves the wall clock only: `gettimeofday`, `time`, `timespec_get` and
/// `clock_gettime(CLOCK_REALTIME*, CLOCK_TAI)`. `CLOCK_MONOTONIC*` and `CLOCK_BOOTTIME*` are
/// untouched. For a local process, put [`envs`](Self::envs) on its `Command`:
///
/// ```no_run
/// use redquorum_testkit::clock::ClockDir;
///
/// let clock = ClockDir::new(); // offset 0
/// let mut server = std::process::Command::new(redquorum_testkit::server_program())
///     .args(["--port", "6390", "--save", "", "--appendonly", "no"])
///     .envs(clock.envs())
///     .spawn()
///     .unwrap();
/// clock.step_ms(120_000); // its wall clock jumps 2 minutes ahead, at once
/// # server.kill().unwrap();
/// ```
#[derive(Debug)]
pub struct ClockDir {
    dir: tempfile::TempDir,
    /// Serializes read-modify-write steps from this process.
    step_lock: Mutex<()>,
}

impl ClockDir {
    /// A new directory with the shim and a wall-clock offset of 0. Panics if the shim cannot be
    /// built (see [`shim_library`]) or the directory cannot be written.
    pub fn new() -> ClockDir {
        let dir = tempfile::Builder::new()
            .prefix("redquorum-clock-")
            .tempdir()
            .unwrap_or_else(|e| panic!("clock: cannot create a clock directory: {e}"));
        let library = dir.path().join(LIBRARY_NAME);
        std::fs::copy(shim_library(), &library)
            .unwrap_or_else(|e| panic!("clock: cannot copy the shim to {library:?}: {e}"));
        // Created at its final size before any process maps it; only rewritten in place later.
        let offset = dir.path().join(OFFSET_NAME);
        std::fs::write(&offset, 0i64.to_le_bytes())
            .unwrap_or_else(|e| panic!("clock: cannot create the offset file {offset:?}: {e}"));
        ClockDir {
            dir,
            step_lock: Mutex::new(()),
        }
    }

    /// The directory (mount it where the process can read it; containers see it at `/clock`).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The shim inside the directory (the value for `LD_PRELOAD`).
    pub fn library(&self) -> PathBuf {
        self.dir.path().join(LIBRARY_NAME)
    }

    /// The offset file inside the directory (the value for `REDQUORUM_CLOCK_OFFSET_FILE`):
    /// 8 bytes, a little-endian `i64` of milliseconds.
    pub fn offset_file(&self) -> PathBuf {
        self.dir.path().join(OFFSET_NAME)
    }

    /// The current offset of the wall clock from real time, in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        let path = self.offset_file();
        let mut bytes = [0u8; 8];
        File::open(&path)
            .and_then(|f| f.read_exact_at(&mut bytes, 0))
            .unwrap_or_else(|e| panic!("clock: cannot read 8 bytes of {path:?}: {e}"));
        i64::from_le_bytes(bytes)
    }

    /// Set the wall clock's offset from real time to `offset_ms` (an NTP-like step to real
    /// time + `offset_ms`; monotonic clocks untouched). The 8 bytes are rewritten in place, so
    /// a running process sees the new offset at its next clock read.
    pub fn set_offset_ms(&self, offset_ms: i64) {
        let path = self.offset_file();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.write_all_at(&offset_ms.to_le_bytes(), 0))
            .unwrap_or_else(|e| panic!("clock: cannot write {path:?}: {e}"));
    }

    /// Step the wall clock by `delta_ms` milliseconds (positive: forward; negative: back),
    /// adding to the current offset. Monotonic clocks are untouched.
    pub fn step_ms(&self, delta_ms: i64) {
        let _guard = self.step_lock.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.offset_ms();
        let next = now.checked_add(delta_ms).unwrap_or_else(|| {
            panic!("clock: stepping offset {now} ms by {delta_ms} ms overflows i64")
        });
        self.set_offset_ms(next);
    }

    /// The environment a local process (e.g. a `redis-server` started with
    /// `std::process::Command` or `tokio::process::Command`) needs to run under this wall
    /// clock: `LD_PRELOAD` = [`library`](Self::library) and `REDQUORUM_CLOCK_OFFSET_FILE` =
    /// [`offset_file`](Self::offset_file). Replaces any `LD_PRELOAD` the process would inherit.
    pub fn envs(&self) -> [(String, String); 2] {
        [
            (
                "LD_PRELOAD".to_string(),
                self.library().to_string_lossy().into_owned(),
            ),
            (
                OFFSET_FILE_ENV.to_string(),
                self.offset_file().to_string_lossy().into_owned(),
            ),
        ]
    }
}

impl Default for ClockDir {
    fn default() -> Self {
        ClockDir::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints, for each clock, (what libc answers) - (what the raw system call answers), in ms.
    /// Under the shim, the realtime ones show the offset and the monotonic ones 0.
    const PROBE: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static long long raw_ms(clockid_t id) {
    struct timespec ts; syscall(SYS_clock_gettime, id, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}
static long long libc_ms(clockid_t id) {
    struct timespec ts; clock_gettime(id, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}
int main(void) {
    struct timeval tv; struct timespec ts;
    printf("realtime %lld\n", libc_ms(CLOCK_REALTIME) - raw_ms(CLOCK_REALTIME));
    printf("realtime_coarse %lld\n", libc_ms(CLOCK_REALTIME_COARSE) - raw_ms(CLOCK_REALTIME_COARSE));
    printf("tai %lld\n", libc_ms(CLOCK_TAI) - raw_ms(CLOCK_TAI));
    gettimeofday(&tv, 0);
    printf("gettimeofday %lld\n", tv.tv_sec * 1000LL + tv.tv_usec / 1000 - raw_ms(CLOCK_REALTIME));
    printf("time %lld\n", time(0) * 1000LL - raw_ms(CLOCK_REALTIME));
    timespec_get(&ts, TIME_UTC);
    printf("timespec_get %lld\n", ts.tv_sec * 1000LL + ts.tv_nsec / 1000000 - raw_ms(CLOCK_REALTIME));
    printf("monotonic %lld\n", libc_ms(CLOCK_MONOTONIC) - raw_ms(CLOCK_MONOTONIC));
    printf("monotonic_raw %lld\n", libc_ms(CLOCK_MONOTONIC_RAW) - raw_ms(CLOCK_MONOTONIC_RAW));
    printf("monotonic_coarse %lld\n", libc_ms(CLOCK_MONOTONIC_COARSE) - raw_ms(CLOCK_MONOTONIC_COARSE));
    printf("boottime %lld\n", libc_ms(CLOCK_BOOTTIME) - raw_ms(CLOCK_BOOTTIME));
    return 0;
}
"#;

    const REALTIME: &[&str] = &[
        "realtime",
        "realtime_coarse",
        "tai",
        "gettimeofday",
        "time",
        "timespec_get",
    ];
    const MONOTONIC: &[&str] = &["monotonic", "monotonic_raw", "monotonic_coarse", "boottime"];

    fn build_probe(dir: &Path) -> PathBuf {
        let src = dir.join("probe.c");
        let exe = dir.join("probe");
        std::fs::write(&src, PROBE).expect("write probe.c");
        let out = std::process::Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc failed on the probe: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }

    /// (clock, libc minus raw in ms) as the probe printed them.
    fn run_probe(exe: &Path, envs: &[(String, String)]) -> Vec<(String, i64)> {
        let out = std::process::Command::new(exe)
            .env_remove("LD_PRELOAD")
            .env_remove(OFFSET_FILE_ENV)
            .envs(envs.iter().cloned())
            .output()
            .expect("run the probe");
        assert!(out.status.success(), "the probe failed: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let (name, ms) = l.split_once(' ').expect("probe line: name ms");
                (name.to_string(), ms.parse().expect("probe: ms"))
            })
            .collect()
    }

    /// Asserts every realtime clock is `offset` ahead (time() has 1 s resolution, coarse
    /// clocks a few ms) and every monotonic clock is unmoved.
    fn assert_offset(seen: &[(String, i64)], offset: i64, what: &str) {
        assert_eq!(
            seen.len(),
            REALTIME.len() + MONOTONIC.len(),
            "{what}: {seen:?}"
        );
        for (name, ms) in seen {
            let (want, slack) = match name.as_str() {
                n if MONOTONIC.contains(&n) => (0, 20),
                "time" => (offset, 1_020),
                n if REALTIME.contains(&n) => (offset, 20),
                other => panic!("{what}: unknown probe clock {other}"),
            };
            assert!(
                (ms - want).abs() <= slack,
                "{what}: {name} is off by {ms} ms from the raw clock, expected {want} ms \
                 (all: {seen:?})"
            );
        }
    }

    #[test]
    fn the_shim_steps_every_wall_clock_and_no_monotonic_clock() {
        let clock = ClockDir::new();
        let exe = build_probe(clock.path());
        assert_eq!(clock.offset_ms(), 0);
        assert_offset(&run_probe(&exe, &[]), 0, "without the shim");
        assert_offset(&run_probe(&exe, &clock.envs()), 0, "shim at offset 0");
        clock.step_ms(3_600_000);
        assert_eq!(clock.offset_ms(), 3_600_000);
        assert_offset(&run_probe(&exe, &clock.envs()), 3_600_000, "shim at +1 h");
        clock.step_ms(-3_690_500);
        assert_eq!(clock.offset_ms(), -90_500);
        assert_offset(&run_probe(&exe, &clock.envs()), -90_500, "shim at -90.5 s");
        clock.set_offset_ms(1_250);
        assert_eq!(clock.offset_ms(), 1_250);
        assert_offset(&run_probe(&exe, &clock.envs()), 1_250, "shim at +1.25 s");
    }

    #[test]
    fn without_an_offset_file_the_shim_passes_real_time_through() {
        let clock = ClockDir::new();
        clock.set_offset_ms(60_000);
        let exe = build_probe(clock.path());
        let library = clock.library().to_string_lossy().into_owned();
        let preload = ("LD_PRELOAD".to_string(), library);
        assert_offset(
            &run_probe(&exe, std::slice::from_ref(&preload)),
            0,
            "no variable",
        );
        let missing = (
            OFFSET_FILE_ENV.to_string(),
            clock.path().join("missing").to_string_lossy().into_owned(),
        );
        assert_offset(&run_probe(&exe, &[preload, missing]), 0, "missing file");
    }
}
