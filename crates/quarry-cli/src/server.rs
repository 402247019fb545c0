//! `quarry server`: SQL over Arrow Flight SQL, on the embedded warehouse or on storage nodes.

use std::net::SocketAddr;

use clap::Args;
use quarry_flight::{ServeOptions, read_token_file};

use crate::CliResult;
use crate::serve::TlsArgs;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address to listen on (port 0 picks a free port; the URL is printed).
    #[arg(long, default_value = "127.0.0.1:31337")]
    listen: SocketAddr,
    #[command(flatten)]
    tls: TlsArgs,
}

/// Serves until the process ends (called on a small runtime for the calls; queries get
/// `--threads` of their own). Clients authenticate with the token of `--token-file` (as a
/// bearer token, or as the password of basic auth).
pub async fn run(target: &Target, args: ServerArgs) -> CliResult {
    let token = target.token_file.as_deref().map(read_token_file).transpose()?;
    let tls = args.tls.identity()?;
    if args.tls.insecure && tls.is_none() && !args.listen.ip().is_loopback() {
        eprintln!("quarry: warning: serving {} without TLS (--insecure): the token and the data cross the network in the clear", args.listen);
    }
    let session = target.session().await?;
    let options = ServeOptions { listen: args.listen, token, metrics_listen: None, tls, insecure: args.tls.insecure };
    let over = if target.is_remote() { format!("{} storage node(s)", target.nodes.len()) } else { target.warehouse.display().to_string() };
    quarry_flightsql::serve_sql(session, target.threads, options, |url| {
        // The first line on stdout is the URL, for scripts that asked for port 0.
        println!("{url}");
        eprintln!("quarry: Flight SQL server for {over} on {url}");
    })
    .await
}
