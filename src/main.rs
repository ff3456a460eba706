//! The `kubelet-auth-proxy` command: parse flags (with `--config` and `--kubelet-config` expanded
//! into flags), set up logging, and serve, check the configuration, or run the demo.
//! Configuration errors print one line naming the flag and file, and exit with status 2.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use kubelet_auth_proxy::config::file;
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
    /// Validate the flags and every file they name (config files, certificates, keys, policies,
    /// kubeconfigs) without serving: exit status 0 if the proxy would start, 2 if not.
    CheckConfig(CheckConfigArgs),
}

#[derive(Debug, clap::Args)]
struct CheckConfigArgs {
    #[command(flatten)]
    flags: Box<ProxyFlags>,
}

/// Prints a clap error as one line (help and version go to stdout as usual) and gives the status.
fn clap_failure(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        e.exit();
    }
    eprintln!("kubelet-auth-proxy: {}", one_line(&e.to_string()));
    ExitCode::from(2)
}

/// Parses the command line, then again with the configuration files expanded into flags placed
/// before the command line's own (so flags win over `--config`, which wins over `--kubelet-config`).
fn parse_command_line() -> Result<Cli, ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let command = Cli::command();
    let matches = command
        .clone()
        .try_get_matches_from(&args)
        .map_err(clap_failure)?;
    let flags_at = match matches.subcommand() {
        None => Some((&command, &matches, 1)),
        Some(("check-config", sub)) => command
            .find_subcommand("check-config")
            .map(|cmd| (cmd, sub, 2)),
        Some(_) => None,
    };
    let expanded = match flags_at {
        Some((cmd, flags, at)) => file::expand(cmd, flags, &args, at).map_err(|e| {
            eprintln!("kubelet-auth-proxy: {e}");
            ExitCode::from(2)
        })?,
        None => None,
    };
    match expanded {
        Some(args) => Cli::try_parse_from(args).map_err(clap_failure),
        None => Cli::from_arg_matches(&matches).map_err(clap_failure),
    }
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(status) => return Ok(status),
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
        Some(Command::CheckConfig(args)) => {
            init_logging(args.flags.log_format, args.flags.verbosity);
            match runtime.block_on(Config::load(&args.flags)) {
                Ok(config) => {
                    println!(
                        "kubelet-auth-proxy: configuration is valid: serving {} for node {:?}, authorizers {}",
                        config.listen_address,
                        config.node_name,
                        config.authorizers.names()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("kubelet-auth-proxy: {e}");
                    Ok(ExitCode::from(2))
                }
            }
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
