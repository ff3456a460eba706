//! The `kubelet-auth-proxy` command: parse flags (with `--config` and `--kubelet-config` expanded
//! into flags), set up logging, and serve, check the configuration, explain a decision, run the
//! demo, or print shell completions and the manual page, both generated from these definitions.
//! Configuration errors print one line naming the flag and file, and exit with status 2.

use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use clap_complete::Shell;
use kubelet_auth_proxy::Settings;
use kubelet_auth_proxy::config::file::{self, Origins};
use kubelet_auth_proxy::config::flags::{LogFormat, ProxyFlags};
use kubelet_auth_proxy::tools::{demo, explain};
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
    name = BIN_NAME,
    version = VERSION,
    args_conflicts_with_subcommands = true,
    // A single-value flag given twice takes the last value, as the kubelet's flags do; repeatable
    // flags still collect every value.
    args_override_self = true
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
    #[command(args_override_self = true)]
    Demo(demo::DemoArgs),
    /// Validate the flags and every file they name (config files, certificates, keys, policies,
    /// kubeconfigs) without serving: exit status 0 if the proxy would start, 2 if not.
    #[command(args_override_self = true)]
    CheckConfig(CheckConfigArgs),
    /// Explain how the proxy would decide one request for one identity, without serving.
    ///
    /// Shows the path check, each nodes/<subresource> attribute set tried in order, each
    /// authorizer's answer and reason, and the exact status and body the proxy would return, and
    /// warns about local policy rules that no kubelet request can match. Takes the server's
    /// configuration flags and files (--config, --kubelet-config and every server option). Exit
    /// status: 0 allowed, 1 refused (403, 301, 400), 2 bad input or an authorizer error (the proxy
    /// would answer 500).
    #[command(args_override_self = true)]
    Explain(explain::ExplainArgs),
    /// Ask one proxy process, through its --admin-socket, for /readyz (or another admin path):
    /// exit status 0 on 200, 1 otherwise. For Kubernetes exec probes: on a host-network node two
    /// proxies share the admin port during a surge rollout, the socket reaches this pod's own.
    AdminProbe(AdminProbeArgs),
    /// Print a shell completion script to stdout.
    Completions(CompletionsArgs),
    /// Print the manual page (roff) to stdout: every subcommand and option.
    Man,
}

#[derive(Debug, clap::Args)]
struct AdminProbeArgs {
    /// The proxy's --admin-socket.
    #[arg(long, value_name = "PATH")]
    admin_socket: std::path::PathBuf,
    /// The admin path to ask for.
    #[arg(value_name = "PATH", default_value = "/readyz")]
    target: String,
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum, value_name = "SHELL")]
    shell: Shell,
}

#[derive(Debug, clap::Args)]
struct CheckConfigArgs {
    /// Treat warnings (rules that can never match, a chain that can never allow, AlwaysAllow,
    /// anonymous callers allowed to run commands, …) as errors: exit 2 if there is any. For CI.
    #[arg(long)]
    strict: bool,
    /// Also connect to the kubelet with the configured address, TLS files and client
    /// certificate and send it GET /healthz, and ask the API server (SelfSubjectAccessReview)
    /// whether the proxy's identity may create the TokenReviews and SubjectAccessReviews it will
    /// send: exit 2, naming the cause, if anything cannot be reached or is not allowed. Nothing
    /// is written.
    #[arg(long)]
    probe: bool,
    #[command(flatten)]
    flags: Box<ProxyFlags>,
}

/// `check-config --probe`: prints what works, then what does not; 2 if anything does not.
async fn probe(settings: Settings) -> ExitCode {
    let findings = kubelet_auth_proxy::startup::probe::run(settings).await;
    for line in &findings.working {
        println!("kubelet-auth-proxy: {line}");
    }
    for line in &findings.failing {
        eprintln!("kubelet-auth-proxy: {line}");
    }
    if findings.failing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

/// The command's name, in completions and the manual page.
const BIN_NAME: &str = "kubelet-auth-proxy";

/// One manual page for the whole command: the server's options, then a section per subcommand
/// with its synopsis, description and own options (the server's options, which `check-config`
/// and `explain` share, are listed once). Generated from the clap definitions, so it never
/// drifts from the flags.
fn render_manual(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let command = Cli::command();
    let man = clap_mangen::Man::new(command.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    man.render_subcommands_section(out)?;
    let shared: Vec<clap::Id> = ProxyFlags::augment_args(clap::Command::new(BIN_NAME))
        .get_arguments()
        .map(|arg| arg.get_id().clone())
        .collect();
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let name = sub.get_name().to_owned();
        let own = sub
            .clone()
            .bin_name(format!("{BIN_NAME} {name}"))
            .mut_args(|arg| {
                if shared.contains(arg.get_id()) {
                    arg.hide(true)
                } else {
                    arg
                }
            });
        writeln!(out, ".SH \"{}\"", roff_text(&format!("{BIN_NAME} {name}")))?;
        let mut section = Vec::new();
        let sub_man = clap_mangen::Man::new(own);
        sub_man.render_synopsis_section(&mut section)?;
        sub_man.render_description_section(&mut section)?;
        sub_man.render_options_section(&mut section)?;
        // Nested under the subcommand's own section heading.
        let section = String::from_utf8_lossy(&section).replace("\n.SH ", "\n.SS ");
        let section = section
            .strip_prefix(".SH ")
            .map_or(section.clone(), |rest| format!(".SS {rest}"));
        out.write_all(section.as_bytes())?;
    }
    man.render_version_section(out)
}

/// Escapes `-` for roff, which otherwise may print it as a hyphen rather than a minus.
fn roff_text(s: &str) -> String {
    s.replace('-', "\\-")
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
fn parse_command_line() -> Result<(Cli, Origins), ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let command = Cli::command();
    let matches = command
        .clone()
        .try_get_matches_from(&args)
        .map_err(clap_failure)?;
    let flags_at = match matches.subcommand() {
        None => Some((&command, &matches, 1)),
        Some((name @ ("check-config" | "explain"), sub)) => {
            command.find_subcommand(name).map(|cmd| (cmd, sub, 2))
        }
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
        Some((args, origins)) => Ok((Cli::try_parse_from(args).map_err(clap_failure)?, origins)),
        None => Ok((
            Cli::from_arg_matches(&matches).map_err(clap_failure)?,
            Origins::default(),
        )),
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

/// The level cap for the file-watching library, whatever `RUST_LOG` says.
const QUIET_WATCHER: &str = "notify=info";

/// Logs to stderr at `quiet_level` without `-v` (`info` when serving; `warn` for one-shot commands
/// whose own output is the point), debug with `-v` to `-vvv`, trace beyond.
fn init_logging(format: LogFormat, verbosity: u8, quiet_level: &str) {
    let default_level = match verbosity {
        0 => quiet_level,
        1..=3 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("warn,kubelet_auth_proxy={default_level}")))
        // The file watcher's library logs every inotify event at trace: with its own log written
        // into a watched directory, that would feed itself. Its warnings still show.
        .add_directive(QUIET_WATCHER.parse().expect("a valid directive"));
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
    let (cli, origins) = match parse_command_line() {
        Ok(parsed) => parsed,
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
            init_logging(LogFormat::Text, cli.flags.verbosity, "info");
            let all_held = runtime.block_on(demo::run(args))?;
            Ok(if all_held {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Some(Command::CheckConfig(args)) => {
            init_logging(args.flags.log_format, args.flags.verbosity, "info");
            match runtime.block_on(Settings::check(&args.flags)) {
                Ok(settings) if args.strict && !settings.warnings.is_empty() => {
                    for warning in &settings.warnings {
                        eprintln!("kubelet-auth-proxy: {warning}");
                    }
                    eprintln!(
                        "kubelet-auth-proxy: {} warning(s), refused by --strict",
                        settings.warnings.len()
                    );
                    Ok(ExitCode::from(2))
                }
                Ok(settings) => {
                    for warning in &settings.warnings {
                        eprintln!("kubelet-auth-proxy: warning: {warning}");
                    }
                    for note in &settings.notes {
                        eprintln!("kubelet-auth-proxy: note: {note}");
                    }
                    println!(
                        "kubelet-auth-proxy: configuration is valid: serving {} for node {:?}, authorizers {}",
                        settings
                            .listen_addresses
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", "),
                        settings.authorization.node_name,
                        settings.authorization.names()
                    );
                    if let Some(file) = &settings.authentication_config {
                        println!(
                            "kubelet-auth-proxy: --authentication-config: {}",
                            file.current().validated
                        );
                    }
                    if args.probe {
                        return Ok(runtime.block_on(probe(settings)));
                    }
                    Ok(ExitCode::SUCCESS)
                }
                // Every problem found, one line each.
                Err(errors) => {
                    for e in &errors {
                        eprintln!("kubelet-auth-proxy: {}", origins.describe(e));
                    }
                    Ok(ExitCode::from(2))
                }
            }
        }
        Some(Command::Explain(args)) => {
            init_logging(args.flags.log_format, args.flags.verbosity, "warn");
            Ok(ExitCode::from(
                runtime.block_on(explain::run(&args, &origins)),
            ))
        }
        Some(Command::AdminProbe(args)) => {
            match runtime.block_on(kubelet_auth_proxy::admin::exec_probe::get(
                &args.admin_socket,
                &args.target,
            )) {
                Ok((status, body)) if status == http::StatusCode::OK => {
                    println!("{}", body.trim_end());
                    Ok(ExitCode::SUCCESS)
                }
                Ok((status, body)) => {
                    eprintln!("kubelet-auth-proxy: {status}: {}", body.trim_end());
                    Ok(ExitCode::FAILURE)
                }
                Err(e) => {
                    eprintln!("kubelet-auth-proxy: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Some(Command::Completions(args)) => {
            // Into memory first: the generator panics on a write error (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut Cli::command(), BIN_NAME, &mut script);
            let mut out = std::io::stdout().lock();
            out.write_all(&script)?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man) => {
            let mut out = std::io::stdout().lock();
            render_manual(&mut out)?;
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        None => {
            init_logging(cli.flags.log_format, cli.flags.verbosity, "info");
            // Inside the runtime: the API server clients start their tasks as they are built.
            let loaded = runtime.block_on(async {
                let settings = Settings::load(&cli.flags).await?;
                for warning in &settings.warnings {
                    tracing::warn!(flag = warning.flag, "{}", warning.message);
                }
                for note in &settings.notes {
                    tracing::info!(flag = note.flag, "{}", note.message);
                }
                kubelet_auth_proxy::assemble(settings)
            });
            let config = match loaded {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("kubelet-auth-proxy: {}", origins.describe(&e));
                    return Ok(ExitCode::from(2));
                }
            };
            match runtime.block_on(kubelet_auth_proxy::run(config)) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                // A listen address that cannot be bound is a configuration error: one line
                // naming the flag, status 2, as for every other.
                Err(
                    e @ (kubelet_auth_proxy::StartError::Bind { .. }
                    | kubelet_auth_proxy::StartError::AdminSocket { .. }),
                ) => {
                    eprintln!("kubelet-auth-proxy: {e}");
                    Ok(ExitCode::from(2))
                }
                Err(e @ kubelet_auth_proxy::StartError::Io(_)) => {
                    eprintln!("kubelet-auth-proxy: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
