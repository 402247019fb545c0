//! `quarry serve`: a storage node serving the warehouse over Arrow Flight, within a device
//! profile.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use quarry_flight::{ServeOptions, TlsIdentity, read_token_file, serve};
use quarry_graph_jobs::GraphJobs;
use quarry_storage::{DeviceProfile, LocalStorageNode, parse_size};
use quarry_table::Warehouse;

use crate::target::Target;
use crate::{CliResult, with_runtime};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Serve Prometheus metrics on this address.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Internal read bandwidth, MB/s (overrides the profile).
    #[arg(long)]
    read_mbps: Option<f64>,
    /// Link bandwidth to the host, MB/s (overrides the profile; 125 = 1 Gbit/s).
    #[arg(long)]
    link_mbps: Option<f64>,
    /// Device worker threads (overrides the profile).
    #[arg(long)]
    device_threads: Option<usize>,
    /// Device memory, e.g. 512MB (overrides the profile).
    #[arg(long)]
    device_memory: Option<String>,
    /// Device CPU slowdown factor, at least 1 (overrides the profile).
    #[arg(long)]
    compute_slowdown: Option<f64>,
    /// Fragments admitted at once (overrides the profile).
    #[arg(long)]
    max_sessions: Option<usize>,
    /// Scrub the warehouse in the background, reading at most this many MB/s: every segment
    /// and graph file checked against its checksums, pass after pass (damage goes to stderr and
    /// the metrics).
    #[arg(long)]
    scrub_mbps: Option<f64>,
    #[command(flatten)]
    tls: TlsArgs,
    /// Record every read of segment files into this file (`SECONDS R FILE OFFSET BYTES` per
    /// line), the trace `quarry model emos` simulates.
    #[arg(long)]
    io_trace: Option<PathBuf>,
    /// Seconds a load through this node may go without sending a segment before it is
    /// aborted (its host died or went away), releasing the table.
    #[arg(long, default_value_t = 60.0)]
    write_lease: f64,
    /// Seconds between background scrub passes.
    #[arg(long, default_value_t = 3600.0)]
    scrub_pause: f64,
}

pub fn run(target: &Target, args: ServeArgs, threads: usize) -> CliResult {
    let mut profile = match &target.profile {
        Some(name) => DeviceProfile::load(name)?,
        None => DeviceProfile::load("native")?,
    };
    profile.read_mbps = args.read_mbps.or(profile.read_mbps);
    profile.link_mbps = args.link_mbps.or(profile.link_mbps);
    profile.device_threads = args.device_threads.or(profile.device_threads);
    profile.device_memory = args.device_memory.as_deref().map(parse_size).transpose()?.or(profile.device_memory);
    profile.compute_slowdown = args.compute_slowdown.unwrap_or(profile.compute_slowdown);
    profile.max_sessions = args.max_sessions.or(profile.max_sessions);
    profile.validate()?;
    let token = target.token_file.as_deref().map(read_token_file).transpose()?;
    let tls = args.tls.identity()?;
    let warehouse_dir: &Path = &target.warehouse;
    let warehouse = Warehouse::open(warehouse_dir).map_err(|e| e.to_string())?;
    let profile_name = profile.name.clone();
    with_runtime(threads, async move {
        let node = LocalStorageNode::with_profile(warehouse, profile).map_err(|e| quarry_engine::user_message(&e))?;
        if args.tls.insecure && tls.is_none() && !args.listen.ip().is_loopback() {
            eprintln!("quarry: warning: serving {} without TLS (--insecure): the token and the data cross the network in the clear", args.listen);
        }
        if !(args.write_lease > 0.0 && args.write_lease.is_finite()) {
            return Err("--write-lease must be a positive number of seconds".into());
        }
        let write_lease = Duration::from_secs_f64(args.write_lease);
        let options = ServeOptions { listen: args.listen, token, metrics_listen: args.metrics_listen, tls, insecure: args.tls.insecure };
        let node = Arc::new(node.with_name(format!("grpc://{}", args.listen)).with_write_lease(write_lease).with_jobs(Arc::new(GraphJobs)));
        if let Some(path) = &args.io_trace {
            node.record_io_trace(path)?;
        }
        if let Some(mbps) = args.scrub_mbps {
            if mbps <= 0.0 || mbps.is_nan() || args.scrub_pause.is_nan() || args.scrub_pause < 0.0 {
                return Err("--scrub-mbps must be positive and --scrub-pause not negative".into());
            }
            // Detached: the task ends when the node is dropped.
            let _scrub = node.start_background_scrub(mbps, Duration::from_secs_f64(args.scrub_pause));
        }
        serve(node, options, |url, metrics| {
            // The first line on stdout is the URL, for scripts that asked for port 0.
            println!("{url}");
            eprintln!("quarry: storage node for {} on {url}, profile {profile_name}", warehouse_dir.display());
            if let Some(metrics) = metrics {
                eprintln!("quarry: metrics on http://{metrics}/metrics");
            }
        })
        .await
    })
}

/// How a Flight server (`quarry serve`, `quarry server`) secures its transport.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// The server's TLS certificate chain (PEM): it serves grpc+tls:// (with --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plaintext beyond loopback (refused otherwise): the token and the data cross the
    /// network in the clear.
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    /// The TLS identity in the certificate chain and key files, if both are given.
    pub fn identity(&self) -> CliResult<Option<TlsIdentity>> {
        let read = |path: &Path, what: &str| std::fs::read(path).map_err(|e| format!("reading the TLS {what} {}: {e}", path.display()));
        Ok(match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsIdentity { cert_pem: read(cert, "certificate")?, key_pem: read(key, "key")? }),
            _ => None,
        })
    }
}
