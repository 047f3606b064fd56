//! The `tollgate` binary: parse the command line and wire the library together.

use std::process::ExitCode;

use clap::Parser;
use tollgate::cli::{Cli, Command};
use tollgate::runtime::Flavor;
use tollgate::{cli, reference_env, telemetry};

/// mimalloc instead of the system allocator (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<ExitCode> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, translation) = match reference_env::command_line(&args, std::env::vars()) {
        Err(error) => {
            eprintln!("Error: {error}");
            return Ok(ExitCode::from(2));
        }
        Ok(None) => (Cli::parse(), None),
        Ok(Some((line, translation))) => match Cli::try_parse_from(line) {
            Ok(cli) => (cli, Some(translation)),
            Err(error) => return Ok(reference_error(&error, &translation)),
        },
    };
    let flavor = match &cli.command {
        Command::Serve(args) => args.runtime,
        _ => Flavor::MultiThread,
    };
    flavor.build()?.block_on(run(cli, translation))
}

/// A flag translated from the reference's environment that clap refused: the message names
/// the variable it came from.
fn reference_error(error: &clap::Error, translation: &reference_env::Translation) -> ExitCode {
    use clap::error::{ContextKind, ContextValue};
    let flag = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.split(' ').next().unwrap_or_default().to_owned(),
        _ => String::new(),
    };
    match translation.source_of(&flag) {
        Some(variable) => eprintln!("Error: {variable} (as {flag}): {}", error.kind()),
        None => eprintln!("{error}"),
    }
    // A refused value is shown unless it may hold a secret.
    let secret = matches!(
        flag.as_str(),
        "--store" | "--store-per-second" | "--xds-header"
    );
    if let (Some(ContextValue::String(value)), false) =
        (error.get(ContextKind::InvalidValue), secret)
    {
        eprintln!("  value: {value:?}");
    }
    ExitCode::from(2)
}

async fn run(
    cli: Cli,
    translation: Option<reference_env::Translation>,
) -> anyhow::Result<ExitCode> {
    let _telemetry = telemetry::init(&cli.log_level, cli.log_format, &cli.trace)?;
    if let Some(translation) = &translation {
        tracing::info!(flags = %translation.shown(), "read envoyproxy/ratelimit's environment");
        for (variable, why) in &translation.ignored {
            tracing::warn!(variable = %variable, "ignored: {why}");
        }
    }
    cli::commands::run(cli.command).await
}
