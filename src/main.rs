//! The `kubelet-auth-proxy` command: parse flags, set up logging, and serve (or run the demo).
//! Configuration errors print one line naming the flag and file, and exit with status 2.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kubelet_auth_proxy::config::flags::{LogFormat, ProxyFlags};
use kubelet_auth_proxy::{Config, demo};
use tracing_subscriber::EnvFilter;

/// `--version` text: the release and the commit it was built from (set by `build.rs`), so a bug
/// report or an inventory names the exact code running on a node.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KUBELET_AUTH_PROXY_COMMIT"),
    ")"
);

/// Authenticating, authorizing reverse proxy for the kubelet API.
#[derive(Debug, Parser)]
#[command(
    name = "kubelet-auth-proxy",
    version = VERSION,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    flags: ProxyFlags,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy in front of a stand-in kubelet on loopback, with throwaway certificates and a
    /// local policy, and show which requests each identity may make.
    Demo(demo::DemoArgs),
}

/// clap's multi-line error as the one line operators grep for: the message and, when clap lists
/// them, the possible values; the "try --help" hint is dropped.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
        .map(|line| line.strip_prefix("error: ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join(" ")
}

fn init_logging(format: LogFormat, verbosity: u8) {
    let default_level = match verbosity {
        0 => "info",
        1..=3 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("warn,kubelet_auth_proxy={default_level}")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("kubelet-auth-proxy: {}", one_line(&e.to_string()));
            return Ok(ExitCode::from(2));
        }
    };
    // Every rustls config here names the ring provider explicitly; installing it as the process
    // default as well keeps any library that asks for the default off other providers.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Some(Command::Demo(args)) => {
            init_logging(LogFormat::Text, cli.flags.verbosity);
            let all_held = runtime.block_on(demo::run(args))?;
            Ok(if all_held {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        None => {
            init_logging(cli.flags.log_format, cli.flags.verbosity);
            let config = match runtime.block_on(Config::load(&cli.flags)) {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("kubelet-auth-proxy: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            runtime.block_on(kubelet_auth_proxy::run(config))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
