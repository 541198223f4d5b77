//! `completions SHELL`: print a shell completion script for `redquorum` (needs no nodes).
//!
//! The script is generated into a buffer first: the generator panics on a write error (a
//! closed pipe), and a reader that closes the pipe early is not an error.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::args::Cli;

/// Print the completion script of `shell`.
pub(crate) fn print(shell: clap_complete::Shell) -> ExitCode {
    // Into a buffer: the generator panics on a write error (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "redquorum", &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redquorum: cannot write the completion script: {e}");
            ExitCode::from(2)
        }
    }
}
