//! `ping`: PING every node and print how many answered; exit 0 if a majority of voting nodes
//! answered (no majority is an error, exit 2).

use std::process::ExitCode;

use redquorum::Client;

/// `ping`: `<answered> of <n> nodes answered (<needed> needed) in <ms> ms`.
pub(crate) async fn run(client: &Client) -> Result<ExitCode, redquorum::Error> {
    let tally = client.ping().await?;
    println!(
        "{} of {} nodes answered ({} needed) in {:.1} ms",
        tally.applied(),
        tally.majority().nodes(),
        tally.majority().needed(),
        tally.elapsed().as_secs_f64() * 1e3
    );
    Ok(ExitCode::SUCCESS)
}
