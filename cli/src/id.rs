//! `id next SEQUENCE`: monotonic fencing IDs, each accepted by a majority.
//!
//! One call per process, without lookahead: spare IDs reserved ahead would only become a gap
//! when the process exits. The IDs are strictly increasing across every caller of the
//! sequence; with no quorum the command fails (exit 2) with the reason and prints no ID.

use std::process::ExitCode;

use clap::Subcommand;
use redquorum::Client;

use crate::checks::{invalid, name};
use crate::failure::Failure;
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub(crate) enum IdCommand {
    /// Print COUNT new IDs of SEQUENCE, one per line, strictly increasing, each accepted by a
    /// majority; exit non-zero with the reason when there is no quorum.
    Next {
        /// The sequence name.
        sequence: String,
        /// How many IDs (consecutive).
        #[arg(long, short = 'n', default_value_t = 1, allow_negative_numbers = true)]
        count: u64,
    },
}

/// The sequence's name and the count, checked before any node is contacted.
pub(crate) fn precheck(command: &IdCommand) -> Result<(), Failure> {
    let IdCommand::Next { sequence, count } = command;
    name("sequence", sequence)?;
    if *count == 0 || *count > redquorum::MAX_IDS_PER_CALL {
        return Err(invalid(format!(
            "--count (-n) must be between 1 and {}, got {count}",
            redquorum::MAX_IDS_PER_CALL
        )));
    }
    Ok(())
}

/// `id next`: print the IDs, one per line (or one JSON document).
pub(crate) async fn run(
    client: &Client,
    command: IdCommand,
    format: Format,
) -> Result<ExitCode, redquorum::Error> {
    let IdCommand::Next { sequence, count } = command;
    // One call per process: spare IDs would only become a gap.
    let options = redquorum::IdOptions::default().with_lookahead(0)?;
    let ids = redquorum::IdGenerator::with_options(client, &sequence, options)?
        .next_ids(count)
        .await?;
    if format == Format::Json {
        output::ids(&sequence, &ids.collect::<Vec<u64>>());
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = String::with_capacity(ids.size_hint().0 * 12);
    for id in ids {
        out.push_str(&id.to_string());
        out.push('\n');
    }
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}
