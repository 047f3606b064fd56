//! The `tollgate` binary: parse the command line and wire the library together.
//!
//! Exit codes, for every command: 0 when it did its job and the answer is yes; 1 when it did
//! and the answer is no (`check`: the config has problems; `query`: OVER_LIMIT; `health`: not
//! serving); 2 when it could not do its job (a bad flag or variable, a file that cannot be
//! read, a listener that cannot bind, a server that cannot be reached). Errors are one
//! `Error: …` line each, never a backtrace.

use std::process::ExitCode;

use clap::Parser;
use tollgate::cli::{Cli, Command};
use tollgate::reference_env::Translation;
use tollgate::runtime::Flavor;
use tollgate::{cli, reference_env, telemetry};

/// mimalloc instead of the system allocator (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code of a command that could not do its job.
const FAILED: u8 = 2;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, translation) = match reference_env::command_line(&args, std::env::vars()) {
        Err(error) => {
            eprintln!("Error: {error}");
            return ExitCode::from(FAILED);
        }
        Ok(None) => match Cli::try_parse_from(&args) {
            Ok(cli) => (cli, None),
            Err(error) => return usage_error(&error),
        },
        Ok(Some((line, translation))) => match Cli::try_parse_from(line) {
            Ok(cli) => (cli, Some(translation)),
            Err(error) => return reference_error(&error, &translation),
        },
    };
    let cli = match reference_check(cli) {
        Ok(cli) => cli,
        Err(error) => {
            eprintln!("Error: {error}");
            return ExitCode::from(FAILED);
        }
    };
    let flavor = match &cli.command {
        Command::Serve(args) => args.runtime,
        _ => Flavor::MultiThread,
    };
    let ran = flavor
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(cli, translation.as_ref())));
    match ran {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error:#}");
            for hint in translation
                .iter()
                .flat_map(|t| hints(&error.to_string(), t))
            {
                eprintln!("  {hint}");
            }
            ExitCode::from(FAILED)
        }
    }
}

/// `check --env reference` checks the files the reference's variables name (unless a path is
/// given), read as the reference reads them.
fn reference_check(mut cli: Cli) -> Result<Cli, reference_env::EnvError> {
    if let Command::Check(args) = &mut cli.command
        && args.env == cli::EnvStyle::Reference
    {
        let vars = std::env::vars().collect();
        let (dir, load) = reference_env::rule_files(&vars)?;
        args.config = args.config.take().or(args.path.take());
        if args.config.is_none() {
            args.config = Some(dir);
            args.from_runtime_root = true;
        }
        args.load = load;
    }
    Ok(cli)
}

/// clap's own message (help and version are not errors: printed to stdout, exit 0).
fn usage_error(error: &clap::Error) -> ExitCode {
    let _ = error.print();
    if error.use_stderr() {
        ExitCode::from(FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Where each flag an error names came from, when it came from a reference variable.
fn hints(message: &str, translation: &Translation) -> Vec<String> {
    translation
        .sources
        .iter()
        .filter(|(flag, _)| message.contains(&format!("{flag} ")))
        .map(|(flag, variable)| format!("{flag} is from {variable}"))
        .collect()
}

/// A flag translated from the reference's environment that clap refused: the message names
/// the variable it came from.
fn reference_error(error: &clap::Error, translation: &Translation) -> ExitCode {
    use clap::error::{ContextKind, ContextValue};
    let flag = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.split(' ').next().unwrap_or_default().to_owned(),
        _ => String::new(),
    };
    match translation.source_of(&flag) {
        Some(variable) => eprintln!("Error: {variable} (as {flag}): {}", error.kind()),
        None => return usage_error(error),
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
    ExitCode::from(FAILED)
}

async fn run(cli: Cli, translation: Option<&Translation>) -> anyhow::Result<ExitCode> {
    let _telemetry = telemetry::init(&cli.log_level, cli.log_format, &cli.trace())?;
    if let Some(translation) = translation {
        tracing::info!(target: telemetry::STARTUP, flags = %translation.shown(), "read envoyproxy/ratelimit's environment");
        for (variable, why) in &translation.ignored {
            tracing::warn!(variable = %variable, "ignored: {why}");
        }
        if !translation.ignored_args.is_empty() {
            tracing::warn!(arguments = ?translation.ignored_args, "ignored: started as ratelimit, which reads only its environment");
        }
    }
    cli::commands::run(cli.command).await
}
