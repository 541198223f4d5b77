//! The command's own arguments (names, counts, durations, the program to run), checked before
//! any node is contacted: bad input fails with nothing sent, not even the set-up of a cluster
//! on blank nodes. The library checks them again; the messages here name the options.
//!
//! Each command's own checks are in its module; this one dispatches and holds what they share.

use crate::args::Command;
use crate::checks::find_program;
use crate::failure::Failure;
use crate::{acl, dist, election, id, index, job, lock, serve, units};

/// Check the command's own arguments before any node is contacted.
pub(crate) fn precheck(command: &Command) -> Result<(), Failure> {
    match command {
        Command::Check { feature, .. } | Command::Acl { feature, .. } => {
            acl::features(feature)?;
        }
        Command::Id(command) => id::precheck(command)?,
        Command::Lock(command) => lock::precheck(command)?,
        Command::Index(command) => index::precheck(command)?,
        Command::Dist(command) => dist::precheck(command)?,
        Command::Units(command) => units::precheck(command)?,
        Command::Election(e) => {
            if let Some(program) = election::precheck(e)? {
                find_program(program)?;
            }
        }
        Command::Job(j) => job::precheck(j)?,
        Command::Serve(args) => serve::precheck(args).map_err(Failure)?,
        Command::Ping | Command::Cluster(_) | Command::Completions { .. } => {}
    }
    Ok(())
}
