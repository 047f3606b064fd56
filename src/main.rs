//! The `tollgate` binary: parse the command line and wire the library together.

use std::process::ExitCode;

use clap::Parser;
use tollgate::cli::{
    BenchArgs, Cli, Command, HealthArgs, QueryArgs, QuotaBenchArgs, ResetArgs, ServeArgs,
};
use tollgate::runtime::Flavor;
use tollgate::storage::stack::build_store;
use tollgate::{bench, config, pb, query, reference_env, server, shutdown, telemetry};

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
    match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Check(args) => Ok(check(args.target())),
        Command::Query(args) => Ok(query(args).await.unwrap_or_else(|error| {
            eprintln!("Error: {error}");
            ExitCode::from(2)
        })),
        Command::Bench(args) => run_bench(args).await,
        Command::BenchRlqs(args) => run_bench_rlqs(args).await,
        Command::Health(args) => health(args).await,
        Command::Reset(args) => reset(args).await,
        Command::BenchCalls(args) => {
            println!(
                "{}",
                serde_json::to_string(&bench::calls::run(&args).await?)?
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Rules from a control plane arrive once serving; files are read before.
    let rules = match &args.config {
        Some(dir) => {
            for skipped in config::skipped_files(dir, args.load_options()) {
                tracing::warn!(file = %skipped.display(), "not a .yaml or .yml file: skipped");
            }
            config::load(dir, args.load_options())?
        }
        None => tollgate::rules::RuleSet::default(),
    };
    let options = args.options();
    let store = build_store(&args.store_spec()?, &args.store_options(), &options.metrics);
    let mut listeners = match &args.grpc_uds {
        Some(path) => server::Listeners::bind_unix(path, args.http_addr).await?,
        None => server::Listeners::bind(args.grpc_addr, args.http_addr).await?,
    };
    if let Some(addr) = args.metrics_addr {
        listeners = listeners
            .with_metrics(addr, args.metrics_path.clone())
            .await?;
    }
    match &args.grpc_uds {
        Some(path) => tracing::info!(grpc = %path.display(), http = %args.http_addr, "listening"),
        None => tracing::info!(grpc = %args.grpc_addr, http = %args.http_addr, "listening"),
    }
    server::run(rules, store, options, listeners, shutdown::signal()).await?;
    Ok(ExitCode::SUCCESS)
}

fn check(dir: &std::path::Path) -> ExitCode {
    for skipped in config::skipped_files(dir, config::LoadOptions::default()) {
        println!("{}: skipped: not a .yaml or .yml file", skipped.display());
    }
    match config::load_dir(dir) {
        Ok(rules) => {
            println!("{}: ok, {} domain(s)", dir.display(), rules.domains().len());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

async fn query(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let request = args.request.request(args.hits)?;
    let response = query::call(&args.server, request.clone()).await?;
    if args.json {
        println!("{}", tollgate::admin::json::encode_response(&response));
    } else {
        print!("{}", query::render(&request, &response));
    }
    // A script can tell a denial from an answer: 0 OK, 1 OVER_LIMIT (errors exit 2).
    let over = response.overall_code == pb::rate_limit_response::Code::OverLimit as i32;
    Ok(if over {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn reset(args: ResetArgs) -> anyhow::Result<ExitCode> {
    let request = args.request.request(0)?;
    println!("{}", query::reset(&args.admin_addr, &request).await?);
    Ok(ExitCode::SUCCESS)
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let report = bench::run(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_bench_rlqs(args: QuotaBenchArgs) -> anyhow::Result<ExitCode> {
    let report = bench::rlqs::run(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(ExitCode::SUCCESS)
}

async fn health(args: HealthArgs) -> anyhow::Result<ExitCode> {
    Ok(match query::serving(&args.server, args.service).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("not serving");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    })
}
