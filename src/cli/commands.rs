//! What each command does: `serve` wires the server together from its flags; the others are
//! clients of a server, or the config checker. `main.rs` parses and calls `run`.

use std::path::Path;
use std::process::ExitCode;

use super::{CheckArgs, Command, HealthArgs, QueryArgs, ResetArgs, ServeArgs};
use crate::bench::BenchArgs;
use crate::bench::rlqs::QuotaBenchArgs;
use crate::reload::RulesOptions;
use crate::rules::RuleSet;
use crate::storage::options::LeaseMode;
use crate::storage::stack::build_store;
use crate::{bench, config, pb, query, server, shutdown};

/// Runs `command`; the exit code it ends with.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => serve(*args).await,
        Command::Check(args) => Ok(check(&args)),
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
        Command::BenchHostile(args) => {
            println!(
                "{}",
                serde_json::to_string(&bench::hostile::attack::run(&args).await?)?
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Rules from a control plane arrive once serving; files are read before.
    let rules = match &args.rules.config {
        Some(dir) => initial_rules(dir, &args.rules)?,
        None => RuleSet::default(),
    };
    args.listen.check_distinct(args.metrics.metrics_addr)?;
    let options = args.options();
    if args.store.lease == LeaseMode::Auto && args.store.deny_cache_max_ttl.is_zero() {
        anyhow::bail!(
            "--lease auto (TOLLGATE_LEASE) needs --deny-cache-max-ttl above 0s: a leased slice lives that long"
        );
    }
    let store = build_store(&args.store.spec()?, &args.store_options(), &options.metrics);
    let listen = &args.listen;
    let mut listeners = match &listen.grpc_uds {
        Some(path) => server::Listeners::bind_unix(path, listen.http_addr).await?,
        None => server::Listeners::bind(listen.grpc_addr, listen.http_addr).await?,
    };
    if let Some(addr) = args.metrics.metrics_addr {
        listeners = listeners
            .with_metrics(addr, args.metrics.metrics_path.clone())
            .await?;
    }
    if let Some(addr) = listen.debug_addr {
        listeners = listeners.with_debug(addr).await?;
    }
    let grpc = match &listen.grpc_uds {
        Some(path) => path.display().to_string(),
        None => listen.grpc_addr.to_string(),
    };
    let config = match (&args.rules.config, &args.xds.config_xds) {
        (Some(dir), _) => dir.display().to_string(),
        (None, Some(xds)) => format!("xds {xds}"),
        (None, None) => "none".to_owned(),
    };
    tracing::info!(
        target: crate::telemetry::STARTUP,
        version = %env!("CARGO_PKG_VERSION"),
        config = %config,
        grpc = %grpc,
        http = %listen.http_addr,
        metrics = %args
            .metrics
            .metrics_addr
            .map_or_else(|| "with http".to_owned(), |addr| addr.to_string()),
        store = %crate::options::redact_url(&args.store.url),
        "tollgate listening"
    );
    server::run(rules, store, options, listeners, shutdown::signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// The rules in the files at start; with --wait-for-valid-config, rules that do not load
/// leave the server without rules until a reload loads them. A missing directory stops
/// start-up either way: nothing would ever be loaded from it.
fn initial_rules(dir: &Path, options: &RulesOptions) -> Result<RuleSet, ServeError> {
    if !dir.is_dir() {
        return Err(ServeError::NoConfigDir(dir.to_owned()));
    }
    for skipped in config::skipped_files(dir, options.load) {
        tracing::warn!(file = %skipped.display(), "not a .yaml or .yml file: skipped");
    }
    match config::load(dir, options.load) {
        Ok(rules) => Ok(rules),
        Err(errors) if options.wait_for_valid_config => {
            tracing::error!(dir = %dir.display(), errors = %errors, "the rules do not load; serving without rules, not ready, until they are fixed (--wait-for-valid-config)");
            Ok(RuleSet::not_loaded())
        }
        Err(errors) => Err(ServeError::Config(errors)),
    }
}

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--config {}: no such directory", .0.display())]
    NoConfigDir(std::path::PathBuf),
    #[error("{0}")]
    Config(config::ConfigErrors),
}

/// Exit 0 when the rules load, 1 when they do not, 2 when there is nothing to check.
fn check(args: &CheckArgs) -> ExitCode {
    let (dir, load) = match args.target() {
        Ok(target) => target,
        Err(error) => {
            eprintln!("Error: {error}");
            return ExitCode::from(2);
        }
    };
    if !dir.exists() {
        let from = match args.from_runtime_root {
            true => " (from RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY)",
            false => "",
        };
        eprintln!("Error: {}{from}: no such file or directory", dir.display());
        return ExitCode::from(2);
    }
    let dir = dir.as_path();
    for skipped in config::skipped_files(dir, load) {
        println!("{}: skipped: not a .yaml or .yml file", skipped.display());
    }
    match config::load(dir, load) {
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
        println!("{}", crate::admin::json::encode_response(&response));
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
    let token = args
        .admin_token
        .as_deref()
        .filter(|token| !token.is_empty());
    println!("{}", query::reset(&args.admin_addr, token, &request).await?);
    Ok(ExitCode::SUCCESS)
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.write_body {
        bench::write_body(&args.requests, path)?;
        return Ok(ExitCode::SUCCESS);
    }
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
            eprintln!("Error: {error}");
            ExitCode::from(2)
        }
    })
}
