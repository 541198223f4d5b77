//! `units add | remove | replace | list | pin | unpin | gc | settings`: the work units of a
//! pool (work distribution; its members and tables are `dist`, in `dist.rs`).
//!
//! Units given with `--from-file` (`-`: stdin) are read, and every unit's name checked, before
//! any node is contacted. `replace` adds the missing units first, then removes the others.
//! `gc` collects removed units (tombstones) only when every node holds them alike, so it needs
//! every node up; a pool's leader also does it every 10 minutes.

use std::process::ExitCode;

use clap::Subcommand;
use redquorum::{Client, Units};

use crate::checks::name;
use crate::failure::Failure;

#[derive(Subcommand, Debug)]
pub(crate) enum UnitsCommand {
    /// Add units to POOL: the UNITs given, or one per line of --from-file (`-` for stdin).
    Add {
        /// The pool name.
        pool: String,
        /// The units.
        units: Vec<String>,
        /// A file with one unit per line (`-`: stdin); empty lines are skipped.
        #[arg(long)]
        from_file: Option<String>,
    },
    /// Remove units from POOL: no later table assigns them.
    Remove {
        /// The pool name.
        pool: String,
        /// The units.
        #[arg(required = true)]
        units: Vec<String>,
    },
    /// Replace POOL's units by the UNITs given (or one per line of --from-file, `-` for stdin):
    /// missing ones are added first, then the others removed.
    Replace {
        /// The pool name.
        pool: String,
        /// The units.
        units: Vec<String>,
        /// A file with one unit per line (`-`: stdin); empty lines are skipped.
        #[arg(long)]
        from_file: Option<String>,
    },
    /// Print the units of POOL, one per line, sorted.
    List {
        /// The pool name.
        pool: String,
    },
    /// Pin UNIT of POOL to the member ID: every later table gives it to that member while it
    /// is present (drained or not).
    Pin {
        /// The pool name.
        pool: String,
        /// The unit.
        unit: String,
        /// The member ID it is pinned to.
        id: String,
    },
    /// Unpin units of POOL: they are shared by weight again.
    Unpin {
        /// The pool name.
        pool: String,
        /// The units.
        #[arg(required = true)]
        units: Vec<String>,
    },
    /// Collect POOL's removed units (tombstones) held alike on every node; prints
    /// `collected <n>`. Needs every node up; a pool's leader also does it every 10 minutes.
    Gc {
        /// The pool name.
        pool: String,
    },
    /// Print POOL's pins (`pin <unit> <member>`) and drained members (`drained <member>`).
    Settings {
        /// The pool name.
        pool: String,
    },
}

/// Read the units of `--from-file` into the command's units (before any node is contacted).
pub(crate) fn read_from_file(command: &mut UnitsCommand) -> Result<(), redquorum::Error> {
    if let UnitsCommand::Add {
        units, from_file, ..
    }
    | UnitsCommand::Replace {
        units, from_file, ..
    } = command
    {
        if let Some(path) = from_file.take() {
            units.extend(read_lines(&path)?);
        }
    }
    Ok(())
}

/// The non-empty lines of `path` (`-`: stdin), without their line endings.
fn read_lines(path: &str) -> Result<Vec<String>, redquorum::Error> {
    use std::io::Read;
    let mut text = String::new();
    let read = if path == "-" {
        std::io::stdin().read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text))
    };
    read.map_err(|e| {
        redquorum::Error::InvalidArgument(format!("--from-file {path:?}: cannot read: {e}"))
    })?;
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// The pool's, the units' and the member's names, checked before any node is contacted.
pub(crate) fn precheck(command: &UnitsCommand) -> Result<(), Failure> {
    let (pool, names): (&str, &[String]) = match command {
        UnitsCommand::Add { pool, units, .. }
        | UnitsCommand::Replace { pool, units, .. }
        | UnitsCommand::Remove { pool, units }
        | UnitsCommand::Unpin { pool, units } => (pool, units),
        UnitsCommand::Pin { pool, unit, id } => {
            name("unit", unit)?;
            name("member", id)?;
            (pool, &[])
        }
        UnitsCommand::List { pool }
        | UnitsCommand::Gc { pool }
        | UnitsCommand::Settings { pool } => (pool, &[]),
    };
    name("pool", pool)?;
    for unit in names {
        name("unit", unit)?;
    }
    Ok(())
}

/// Run the `units` command.
pub(crate) async fn run(
    client: &Client,
    command: UnitsCommand,
) -> Result<ExitCode, redquorum::Error> {
    match command {
        // `read_from_file` has read --from-file into `units` already.
        UnitsCommand::Add { pool, units, .. } => {
            Units::new(client, &pool)?.add(&units).await?;
        }
        UnitsCommand::Replace { pool, units, .. } => {
            Units::new(client, &pool)?.replace_all(&units).await?;
        }
        UnitsCommand::Remove { pool, units } => {
            Units::new(client, &pool)?.remove(&units).await?;
        }
        UnitsCommand::List { pool } => {
            let mut out = String::new();
            for unit in Units::new(client, &pool)?.list().await? {
                out.push_str(&unit);
                out.push('\n');
            }
            print!("{out}");
        }
        UnitsCommand::Pin { pool, unit, id } => {
            Units::new(client, &pool)?.pin(&unit, &id).await?;
        }
        UnitsCommand::Gc { pool } => {
            let n = Units::new(client, &pool)?.collect_removed().await?;
            println!("collected {n}");
        }
        UnitsCommand::Unpin { pool, units } => {
            Units::new(client, &pool)?.unpin(&units).await?;
        }
        UnitsCommand::Settings { pool } => print_settings(client, &pool).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `units settings`: `pin <unit> <member>` and `drained <member>` lines.
async fn print_settings(client: &Client, pool: &str) -> Result<(), redquorum::Error> {
    let settings = Units::new(client, pool)?.settings().await?;
    let mut out = String::new();
    for (unit, id) in &settings.pins {
        out.push_str(&format!("pin {unit} {id}\n"));
    }
    for id in &settings.drained {
        out.push_str(&format!("drained {id}\n"));
    }
    print!("{out}");
    Ok(())
}
