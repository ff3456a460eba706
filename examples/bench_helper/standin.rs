//! The API server stand-in of the end-to-end tests, run as a process for the token setup and the
//! cold bursts: it knows the benchmark's tokens, allows every SubjectAccessReview, answers each
//! review after a fixed delay, and reports on stdin request how many reviews it received.

use std::time::Duration;

use std::io::BufRead as _;

use tokio::sync::mpsc;

use crate::support::apiserver::{ApiServer, Fault, Flavour, Kind, Target, TokenUser};

/// The token of the warm-cache load (case b).
pub const WARM_TOKEN: &str = "bench-warm-token";
/// The one token of the single-token cold burst.
pub const BURST_ONE_TOKEN: &str = "burst-one";
/// Prefix of the distinct tokens of the distinct-token cold burst: `burst-<i>`.
pub const BURST_TOKEN_PREFIX: &str = "burst-";

/// Options of `bench_helper apiserver`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Delay before each TokenReview and SubjectAccessReview answer, in milliseconds.
    #[arg(long, default_value_t = 5)]
    delay_ms: u64,
    /// How many distinct burst tokens (`burst-0` …) the stand-in knows, each for its own user.
    #[arg(long, default_value_t = 500)]
    distinct_tokens: usize,
}

/// Starts the stand-in, prints `kubeconfig <path>` and `warm-token <token>`, then answers each `counts` line on stdin with
/// `{"tokenReviews":N,"subjectAccessReviews":M}` (reviews received so far) until stdin closes.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let api = ApiServer::start_allowing().await;
    api.inject(
        Target::Both,
        Fault::Slow(Duration::from_millis(args.delay_ms)),
        usize::MAX,
    );
    api.add_token(WARM_TOKEN, TokenUser::new("bench-token-user"));
    api.add_token(BURST_ONE_TOKEN, TokenUser::new("burst-one-user"));
    for i in 0..args.distinct_tokens {
        api.add_token(
            &format!("{BURST_TOKEN_PREFIX}{i}"),
            TokenUser::new(&format!("burst-user-{i}")),
        );
    }
    let kubeconfig = api.kubeconfig(Flavour::ClientCertificate);
    println!("kubeconfig {}", kubeconfig.display());
    println!("warm-token {WARM_TOKEN}");
    // Commands are read on a thread of their own (stdin blocks); the channel closes with stdin.
    let (commands, mut received) = mpsc::channel::<String>(8);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if commands.blocking_send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = received.recv().await {
        match line.trim() {
            "counts" => println!(
                "{{\"tokenReviews\":{},\"subjectAccessReviews\":{}}}",
                api.arrivals(Kind::TokenReview),
                api.arrivals(Kind::SubjectAccessReview)
            ),
            "" => {}
            other => println!("error: unknown command {other:?}"),
        }
    }
    Ok(())
}
