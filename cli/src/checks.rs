//! The small checks and parsers every command shares: durations, names, intervals, programs,
//! the default instance ID. They depend on nothing of the CLI but `Failure`, so every command
//! may use them (the argument tree in `args.rs` and the pre-node checks in `precheck.rs` sit
//! above the commands).

use std::time::Duration;

use crate::failure::Failure;

/// A duration option's value, like `500ms`, `2s` or `1m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 2s, 1m)"))
}

/// This instance's default member ID: `<hostname>-<pid>`.
pub(crate) fn default_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

/// `value` checked as the library checks a name of `what` (a lock's, a pool's, ...).
pub(crate) fn name(what: &'static str, value: &str) -> Result<(), Failure> {
    redquorum::Name::new(what, value).map_err(redquorum::Error::from)?;
    Ok(())
}

/// Invalid input, as the library reports it.
pub(crate) fn invalid(message: String) -> Failure {
    redquorum::Error::InvalidArgument(message).into()
}

/// A membership `--interval` within the library's limits (`GroupOptions::with_interval`).
pub(crate) fn interval(every: &Duration) -> Result<(), Failure> {
    let interval_range = Duration::from_millis(100)..=Duration::from_secs(3600);
    if interval_range.contains(every) {
        Ok(())
    } else {
        Err(invalid(format!(
            "--interval {} is outside 100ms..=1h",
            humantime::format_duration(*every)
        )))
    }
}

/// Whether `program` can be run: a path to an executable file, or one found on `PATH`.
pub(crate) fn find_program(program: &str) -> Result<(), Failure> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    let found = if program.contains('/') {
        executable(std::path::Path::new(program))
    } else {
        !program.is_empty()
            && std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
            })
    };
    if found {
        Ok(())
    } else {
        Err(redquorum::Error::InvalidArgument(format!(
            "cannot run {program:?}: {}",
            if program.contains('/') {
                "no such executable file"
            } else {
                "no such executable on PATH"
            }
        ))
        .into())
    }
}
