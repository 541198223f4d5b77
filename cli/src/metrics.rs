//! `--metrics-addr ADDR` on the long-running commands: Prometheus text over HTTP.
//!
//! The exporter is `metrics-exporter-prometheus`'s HTTP listener installed as the process's
//! global `metrics` recorder, so the library's own metrics (recorded through the `metrics`
//! facade) are served beside the CLI's. It answers every path; scrape `/metrics`.
//!
//! The CLI records `redquorum_cli_info{version,command}` (a gauge, 1) at start.

use std::net::{SocketAddr, ToSocketAddrs};

use metrics_exporter_prometheus::PrometheusBuilder;

/// The `--metrics-addr` option, flattened into each long-running command.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct MetricsArgs {
    /// Serve Prometheus metrics over HTTP on ADDR (host:port, e.g. 127.0.0.1:9464), at
    /// /metrics. Off by default.
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub(crate) metrics_addr: Option<SocketAddr>,
}

/// `host:port` (an IP address or a resolvable name, the first address it resolves to).
fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let hint = "expected host:port, e.g. 127.0.0.1:9464 or [::]:9464";
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{s:?} resolves to no address ({hint})")),
        Err(e) => Err(format!("{e} ({hint})")),
    }
}

/// Start the exporter if `--metrics-addr` was given, and record the CLI's info gauge.
///
/// # Errors
/// [`redquorum::Error::InvalidArgument`] naming `--metrics-addr` when the address cannot be
/// listened on (in use, not local, no permission).
pub(crate) fn install(args: &MetricsArgs, command: &'static str) -> Result<(), redquorum::Error> {
    let Some(addr) = args.metrics_addr else {
        return Ok(());
    };
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| {
            redquorum::Error::InvalidArgument(format!(
                "--metrics-addr {addr}: cannot serve metrics there: {e}"
            ))
        })?;
    redquorum::describe_metrics();
    metrics::describe_gauge!(
        "redquorum_cli_info",
        "The redquorum CLI's version and command; always 1."
    );
    metrics::gauge!(
        "redquorum_cli_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "command" => command
    )
    .set(1.0);
    Ok(())
}
