//! Operator tooling generated from the clap definitions: shell completions for bash, zsh and fish,
//! and the manual page, which must list every flag `--help` shows, for the server and for each
//! subcommand.

use crate::support::TempDir;
use crate::support::process::run;

const SUBCOMMANDS: &[&str] = &["demo", "check-config", "explain", "completions", "man"];

/// Every `--long` flag a `--help` text defines (the option lines, not flags named in prose).
fn long_flags(help: &str) -> Vec<String> {
    let mut flags: Vec<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .flat_map(|line| {
            line.split([' ', ','])
                .take_while(|word| !word.starts_with('<'))
                .filter(|word| word.starts_with("--") && word.len() > 2)
                .map(|word| word.split('[').next().unwrap_or(word).to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

#[tokio::test]
async fn completions_cover_subcommands_and_flags_for_each_shell() {
    let dir = TempDir::new("completions");
    for shell in ["bash", "zsh", "fish"] {
        let done = run(&dir, shell, &["completions".into(), shell.into()]).await;
        assert_eq!(done.status.code(), Some(0), "{shell}: {}", done.stderr);
        for word in SUBCOMMANDS.iter().chain(&[
            "authorization-mode",
            "authorization-policy-file",
            "anonymous",
        ]) {
            assert!(done.stdout.contains(word), "{shell}: {word} missing");
        }
    }
    let bash = run(&dir, "bash2", &["completions".into(), "bash".into()]).await;
    assert!(bash.stdout.contains("complete -F _kubelet__auth__proxy"));
    let zsh = run(&dir, "zsh2", &["completions".into(), "zsh".into()]).await;
    assert!(zsh.stdout.starts_with("#compdef kubelet-auth-proxy"));

    let done = run(&dir, "tcsh", &["completions".into(), "tcsh".into()]).await;
    assert_eq!(done.status.code(), Some(2));
    assert_eq!(done.stdout, "");
}

#[tokio::test]
async fn manual_page_lists_every_flag_of_every_help() {
    let dir = TempDir::new("man");
    let man = run(&dir, "man", &["man".into()]).await;
    man.assert_code(0);
    assert!(
        man.stdout.starts_with(".ie \\n(.g .ds Aq"),
        "not roff: {}",
        &man.stdout[..80]
    );
    assert!(man.stdout.contains(".TH kubelet-auth-proxy 1"));
    // roff writes `-` as `\-`.
    let text = man.stdout.replace("\\-", "-");
    for sub in SUBCOMMANDS {
        assert!(
            text.contains(&format!(".SH \"kubelet-auth-proxy {sub}\"")),
            "no section for {sub}"
        );
    }

    let main_help = run(&dir, "help", &["--help".into()]).await;
    let main_flags = long_flags(&main_help.stdout);
    assert!(main_flags.len() > 40, "{main_flags:?}");
    for flag in [
        "--authorization-mode",
        "--config",
        "--kubelet-config",
        "--upstream",
    ] {
        assert!(main_flags.iter().any(|f| f == flag), "{flag} not in --help");
    }
    let mut checked = main_flags.clone();
    for sub in ["explain", "demo", "completions"] {
        let help = run(&dir, &format!("help-{sub}"), &[sub.into(), "--help".into()]).await;
        assert_eq!(help.status.code(), Some(0), "{sub}: {}", help.stderr);
        checked.extend(long_flags(&help.stdout));
    }
    for flag in [
        "--user",
        "--group",
        "--uid",
        "--extra",
        "--anonymous",
        "--output",
    ] {
        assert!(
            checked.iter().any(|f| f == flag),
            "{flag} not in explain --help"
        );
    }
    for flag in &checked {
        let listed = text.match_indices(flag.as_str()).any(|(at, _)| {
            text[at + flag.len()..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-')
        });
        assert!(listed, "{flag} is in --help but not in the manual page");
    }
}
