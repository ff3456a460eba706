//! The Rust half of `bench/run`: what the shell script cannot do itself. It makes the throwaway
//! certificates, runs the stand-in API server, holds idle TLS connections, fires cold bursts, and
//! turns the raw measurements into `docs/BENCHMARKS.md` and the results JSON. `kubelet` and
//! `stream` are the two ends of the stream cases: a kubelet-like upstream that writes logs, exec
//! and port-forward data as a kubelet does, and the client that times one transfer. `fleet-live`,
//! run by `bench/fleet-live`, reruns issue 19's fleet situations with real proxy processes.

#[allow(dead_code)] // Shared with the end-to-end tests; the harness uses only part of it.
#[path = "../../tests/support/mod.rs"]
mod support;

mod client;
mod fleet_live;
mod frames;
mod kubelet;
mod pki;
mod report;
mod standin;
mod stream;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Helpers for the one-command benchmark (`bench/run`).
#[derive(Debug, Parser)]
#[command(name = "bench_helper")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the benchmark's certificates and keys into a directory.
    Pki {
        /// Where the PEM files go.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Run the stand-in API server (TokenReview, SubjectAccessReview) until stdin closes.
    Apiserver(standin::Args),
    /// Run a kubelet-like upstream (logs line by line, exec and port-forward in 32 KiB frames)
    /// until stdin closes.
    Kubelet(kubelet::Args),
    /// Time one kubelet-like transfer (log, followed log, exec, port-forward) and print its
    /// figures as one tab-separated line.
    Stream(stream::Args),
    /// Open TLS connections, send one request on each, and hold them idle.
    Idle(client::IdleArgs),
    /// Send concurrent requests at once on connections opened beforehand; print latencies.
    Burst(client::BurstArgs),
    /// Send requests from concurrent clients for a while, each with a bearer token never sent
    /// before (random, or a JWT forged for the cluster's issuer); print the statuses.
    Flood(client::FloodArgs),
    /// Open TLS connections that never send a request; print how soon the proxy closes them and
    /// whether other clients are served meanwhile.
    Silent(client::SilentArgs),
    /// Open HTTP/2 streams whose answers are never read (a zero window); print their statuses,
    /// the proxy's descriptors, and whether another client is served meanwhile.
    Stalled(client::StalledArgs),
    /// Rerun issue 19's five situations with real proxy processes against the stand-in API
    /// server, and print a Markdown table of the figures against their targets.
    FleetLive(fleet_live::Args),
    /// Turn the raw measurements of a run into the results JSON and docs/BENCHMARKS.md.
    Report(report::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The ring provider is the project's only one; make it the default for every config built here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Pki { dir } => pki::write_all(&dir),
        Command::Report(args) => report::run(&args),
        command => {
            // The stream client is one connection read as curl reads it: on one thread. A
            // multi-threaded runtime kept a worker waiting on the socket, woken for each of
            // the kubelet's records, and the sender paid for every wake-up (a log read direct
            // from the stand-in ran at half of what curl reads from it).
            let runtime = match command {
                Command::Stream(_) => tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?,
                _ => tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?,
            };
            runtime.block_on(async {
                match command {
                    Command::Apiserver(args) => standin::run(args).await,
                    Command::Kubelet(args) => kubelet::run(args).await,
                    Command::Stream(args) => stream::run(args).await,
                    Command::Idle(args) => client::idle(args).await,
                    Command::Burst(args) => client::burst(args).await,
                    Command::Flood(args) => client::flood(args).await,
                    Command::Silent(args) => client::silent(args).await,
                    Command::Stalled(args) => client::stalled(args).await,
                    Command::FleetLive(args) => fleet_live::run(args).await,
                    Command::Pki { .. } | Command::Report(_) => Ok(()),
                }
            })
        }
    }
}
