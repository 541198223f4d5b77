//! `dist watch --record FILE` and `index watch --record FILE --tasks N`: an ownership record a
//! checker in another process can read (peer indexing records the tasks `0..N` it owns).
//!
//! Every process on one machine shares `CLOCK_MONOTONIC`, so intervals recorded by different
//! member processes (and by the test that kills and freezes them) compare. One line per event,
//! fields separated by tabs (a unit name never holds a control character), times in
//! nanoseconds of `CLOCK_MONOTONIC`:
//!
//! ```text
//! assign <at> <valid_until> <token> <prepare|active> <unit>...   an assignment observed
//! drain  <at> <unit>...                                          units stopped (drain hook)
//! stop   <at>                                                    the process stops working
//! ```
//!
//! An `assign` line's units are owned from `<at>` until the next line or `<valid_until>`,
//! whichever comes first (a frozen or killed process writes no next line: its lease bounds
//! it). A `drain` line is written inside the drain hook, before the member acknowledges, so
//! a unit's end is recorded before any other member may start it. Each line is written with
//! one `write` call on an unbuffered file (appends from one process never interleave), so a
//! process killed with -9 leaves whole lines behind.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use redquorum::{Assignment, ViewState};

/// Nanoseconds of `CLOCK_MONOTONIC` now.
fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        Err(_) => 0,
    }
}

/// The recorder of one member process.
#[derive(Clone)]
pub(crate) struct Recorder {
    file: Arc<Mutex<File>>,
    /// Peer indexing: record the tasks `0..n` an assignment covers (work distribution: its
    /// units).
    tasks: Option<u64>,
    /// An `Instant` and the `CLOCK_MONOTONIC` reading taken with it (std's `Instant` is
    /// `CLOCK_MONOTONIC` on Linux; the pair converts a deadline without trusting that).
    origin: (Instant, u64),
}

impl Recorder {
    /// Create (or truncate) `path`.
    fn create(path: &std::path::Path, tasks: Option<u64>) -> std::io::Result<Recorder> {
        let file = File::create(path)?;
        Ok(Recorder {
            file: Arc::new(Mutex::new(file)),
            tasks,
            origin: (Instant::now(), monotonic_ns()),
        })
    }

    /// [`Recorder::open`] for the hidden `--record FILE` option when it is given: the recorder
    /// and its drain hook; when the file cannot be created, the error is printed and the
    /// command's exit code (2) returned.
    pub(crate) fn open_option(
        path: Option<std::path::PathBuf>,
        tasks: Option<u64>,
    ) -> Result<Option<(Recorder, redquorum::DrainHook)>, std::process::ExitCode> {
        path.map(|p| Recorder::open(&p, tasks))
            .transpose()
            .map_err(|e| {
                eprintln!("redquorum: {e}");
                std::process::ExitCode::from(2)
            })
    }

    /// Create the record at `path` and the drain hook that records what a drain gives up
    /// before the member acknowledges (install it with the member's drain timeout).
    pub(crate) fn open(
        path: &std::path::Path,
        tasks: Option<u64>,
    ) -> Result<(Recorder, redquorum::DrainHook), String> {
        let r = Recorder::create(path, tasks)
            .map_err(|e| format!("--record {}: {e}", path.display()))?;
        let hooked = r.clone();
        let hook: redquorum::DrainHook = Arc::new(move |d| {
            hooked.drain(&hooked.given_up(&d));
            Box::pin(async {})
        });
        Ok((r, hook))
    }

    fn ns(&self, at: Instant) -> u64 {
        let (i0, n0) = self.origin;
        match at.checked_duration_since(i0) {
            Some(d) => n0.saturating_add(d.as_nanos() as u64),
            None => n0.saturating_sub(i0.duration_since(at).as_nanos() as u64),
        }
    }

    fn line(&self, fields: &[&str]) {
        let mut line = fields.join("\t");
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("redquorum: cannot write the ownership record: {e}");
        }
    }

    /// An assignment observed now (`None`: no assignment, recorded as an empty one).
    pub(crate) fn assign(&self, a: Option<&Assignment>) {
        let at = monotonic_ns().to_string();
        match a {
            Some(a) => {
                let until = self.ns(a.valid_until().into_std()).to_string();
                let token = a.token.get().to_string();
                let state = match a.state {
                    ViewState::Prepare => "prepare",
                    ViewState::Active => "active",
                };
                let mut fields = vec!["assign", &at, &until, &token, state];
                let owned: Vec<String> = match self.tasks {
                    Some(n) => (0..n)
                        .filter(|t| a.covers(*t))
                        .map(|t| t.to_string())
                        .collect(),
                    None => a.units().into_iter().flatten().cloned().collect(),
                };
                fields.extend(owned.iter().map(String::as_str));
                self.line(&fields);
            }
            None => self.line(&["assign", &at, &at, "0", "active"]),
        }
    }

    /// What a drain gives up: its units, or (peer indexing) the tasks `0..n` it gives up.
    pub(crate) fn given_up(&self, d: &redquorum::Drain) -> Vec<String> {
        match self.tasks {
            Some(n) => (0..n)
                .filter(|t| d.gives_up(*t))
                .map(|t| t.to_string())
                .collect(),
            None => d.units_given_up(),
        }
    }

    /// Units stopped now (inside the drain hook).
    pub(crate) fn drain(&self, units: &[String]) {
        let at = monotonic_ns().to_string();
        let mut fields = vec!["drain", at.as_str()];
        fields.extend(units.iter().map(|u| u.as_str()));
        self.line(&fields);
    }

    /// The process stops working now.
    pub(crate) fn stop(&self) {
        self.line(&["stop", &monotonic_ns().to_string()]);
    }
}
