//! The command line: `serve`, `check`, `query`, `bench` and `health`. Every flag of `serve`
//! can also be set by an environment variable named `TOLLGATE_<FLAG>`, which suits
//! containers. Groups of flags that configure one part (the service's responses, the input
//! bounds, the load generator) are declared with that part and flattened in here.

pub mod commands;
mod serve;
mod xds_args;

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};

pub use crate::bench::BenchArgs;
pub use crate::bench::calls::CallsArgs;
pub use crate::bench::rlqs::QuotaBenchArgs;
use crate::client::ClientArgs;
use crate::pb;
use crate::query::{QueryError, parse_descriptor};
use crate::telemetry::{LogFormat, TraceArgs};
pub use serve::{EnvStyle, ServeArgs};

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    // A flag given twice takes its last value: flags typed after those translated from the
    // reference's environment win.
    args_override_self = true,
    about = "A rate-limit decision service for Envoy and gRPC clients"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log filter (e.g. `info`, `tollgate=debug`); `RUST_LOG` wins when set.
    #[arg(
        long,
        env = "TOLLGATE_LOG_LEVEL",
        default_value = "info",
        global = true
    )]
    pub log_level: String,

    /// Log lines as `text` or `json`.
    #[arg(long, global = true, env = "TOLLGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Cli {
    /// How spans are exported: as `serve`'s flags say; the other commands export none.
    pub fn trace(&self) -> TraceArgs {
        match &self.command {
            Command::Serve(args) => args.trace.clone(),
            _ => TraceArgs {
                traces: crate::telemetry::Traces::Off,
                ..TraceArgs::default()
            },
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve RLS v3 over gRPC and the admin endpoints over HTTP.
    Serve(Box<ServeArgs>),
    /// Validate a config directory (or one file); print `file:line: path: reason` per problem,
    /// exit 1 if any.
    Check(CheckArgs),
    /// Send one ShouldRateLimit call and print each status and the overall code; exit 0 when
    /// OK, 1 when OVER_LIMIT, 2 on an error.
    Query(QueryArgs),
    /// Load-test any RLS v3 server, in a closed loop or (--rate) an open loop, and report
    /// decisions/s, latency percentiles and, with --server-pid, its CPU and memory.
    Bench(BenchArgs),
    /// Load-test an RLQS server with many streams reporting many buckets; report the time
    /// from a report to its assignment and, with --server-pid, its CPU and memory.
    BenchRlqs(QuotaBenchArgs),
    /// Reset the counters of a domain's descriptors on a running server (its admin
    /// listener's `POST /reset`): the store forgets them and that replica's deny cache too;
    /// other replicas' deny caches follow within --deny-cache-max-ttl.
    Reset(ResetArgs),
    /// Exit 0 when the server reports SERVING on gRPC health, else 1 (container health checks).
    Health(HealthArgs),
    /// Send calls of the Redis protocol (or the floor script) to a Redis, as tollgate sends
    /// them, and print one JSON line; what they cost Redis is read from Redis around it.
    #[command(hide = true)]
    BenchCalls(CallsArgs),
    /// Attack a gRPC port as hostile clients would (streams never finished, answers never
    /// read, silent sockets) and print what was seen as one JSON line (scripts/hostile).
    #[command(hide = true)]
    BenchHostile(crate::bench::hostile::HostileArgs),
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub server: ClientArgs,

    /// gRPC health service name.
    #[arg(long, env = "TOLLGATE_HEALTH_SERVICE", default_value = "ratelimit")]
    pub service: String,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Directory of YAML rule files, or a single file (with `--env reference`, by default
    /// the directory RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY name).
    #[arg(value_name = "PATH", env = "TOLLGATE_CONFIG")]
    pub path: Option<PathBuf>,

    /// The same, as `serve` takes it.
    #[arg(long, value_name = "PATH", conflicts_with = "path")]
    pub config: Option<PathBuf>,

    /// Check the files as envoyproxy/ratelimit's environment says to read them
    /// (`reference`: every file whatever its name, dot files unless RUNTIME_IGNOREDOTFILES,
    /// MERGE_DOMAIN_CONFIG), as `serve --env reference` reads them.
    #[arg(long, env = "TOLLGATE_ENV", value_enum, default_value_t = EnvStyle::Native)]
    pub env: EnvStyle,

    #[command(flatten)]
    pub load: crate::config::LoadOptions,

    /// Whether the directory is the one the reference's RUNTIME_* variables name (set by the
    /// binary with `--env reference` when no PATH is given), for the error that it is missing.
    #[arg(skip)]
    pub from_runtime_root: bool,
}

/// Why `check` has nothing to check.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("name the rules directory (PATH or --config)")]
    NoPath,
}

impl CheckArgs {
    /// What to check and how to read it, however it was named. With `--env reference` the
    /// binary has filled both in from the reference's variables before this runs.
    pub fn target(&self) -> Result<(PathBuf, crate::config::LoadOptions), CheckError> {
        let named = self.config.clone().or_else(|| self.path.clone());
        Ok((named.ok_or(CheckError::NoPath)?, self.load))
    }
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    #[command(flatten)]
    pub server: ClientArgs,

    #[command(flatten)]
    pub request: DescriptorArgs,

    /// Request-level hits_addend (0 means 1).
    #[arg(long, env = "TOLLGATE_HITS", default_value_t = 0)]
    pub hits: u32,

    /// Print the response as the reference's JSON (as `POST /json` answers) instead of one
    /// line per descriptor.
    #[arg(long, env = "TOLLGATE_QUERY_JSON", value_parser = BoolishValueParser::new())]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The server's admin listener (`host:port`, its --http-addr).
    #[arg(long, env = "TOLLGATE_ADMIN_ADDR", default_value = "127.0.0.1:8080")]
    pub admin_addr: String,

    /// The server's --admin-token, sent as `Authorization: Bearer <token>`; best from the
    /// environment variable, which the server reads too.
    #[arg(
        long = "admin-token",
        env = "TOLLGATE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,

    #[command(flatten)]
    pub request: DescriptorArgs,
}

/// The domain and descriptors that `query` asks about and `reset` resets.
#[derive(Debug, Args)]
pub struct DescriptorArgs {
    /// Rate-limit domain.
    #[arg(long, env = "TOLLGATE_DOMAIN")]
    pub domain: String,

    /// A descriptor as `key=value[,key=value...]`; repeat for several descriptors (in the
    /// environment, separate them with `;`).
    #[arg(
        long = "descriptor",
        env = "TOLLGATE_DESCRIPTOR",
        value_delimiter = ';',
        required = true
    )]
    pub descriptors: Vec<String>,
}

impl DescriptorArgs {
    /// The request they name, with `hits_addend`.
    pub fn request(&self, hits_addend: u32) -> Result<pb::RateLimitRequest, QueryError> {
        let descriptors = self
            .descriptors
            .iter()
            .map(|d| parse_descriptor(d))
            .collect::<Result<_, _>>()?;
        Ok(pb::RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::service::ServiceOptions;
    use crate::storage::options::StoreSpec;

    #[test]
    fn every_part_defaults_to_its_flags_defaults() {
        let Command::Serve(args) = Cli::try_parse_from(["tollgate", "serve", "--config", "x"])
            .unwrap()
            .command
        else {
            panic!("serve");
        };
        assert_eq!(args.service, ServiceOptions::default());
        assert_eq!(args.quota, crate::rlqs::QuotaOptions::default());
        assert_eq!(args.modes, crate::limiter::Modes::default());
        assert_eq!(args.shutdown, crate::shutdown::ShutdownOptions::default());
        assert_eq!(args.metrics, crate::metrics::MetricsOptions::default());
        assert_eq!(args.statsd, crate::statsd::StatsdOptions::default());
        assert_eq!(args.listen, crate::server::ListenOptions::default());
        assert_eq!(args.tls, crate::tls::TlsOptions::default());
        assert_eq!(args.admin, crate::admin::writes::AdminWrites::default());
        let store = crate::storage::options::StoreOptions::default();
        assert_eq!(
            (args.store.url.as_str(), args.store.timeout),
            (store.url.as_str(), store.timeout)
        );
    }

    #[test]
    fn every_subcommand_is_well_formed() {
        // Clashing names or groups panic here rather than when a user runs the command.
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_help_groups_its_flags_by_topic() {
        use clap::CommandFactory as _;
        let mut command = Cli::command();
        let serve = command.find_subcommand_mut("serve").unwrap();
        let help = serve.render_long_help().to_string();
        for heading in [
            "Rules:",
            "Listeners and TLS:",
            "Store:",
            "Responses and load shedding:",
            "Input bounds:",
            "Shutdown:",
        ] {
            assert!(help.contains(heading), "no {heading} in\n{help}");
        }
    }

    #[test]
    fn every_flag_can_be_set_from_the_environment() {
        use clap::CommandFactory as _;
        let command = Cli::command();
        let mut missing = Vec::new();
        // A hidden command is a measurement tool, not something to configure in a container.
        for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
            for arg in sub.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                // `check --config` is another spelling of its PATH, which reads
                // TOLLGATE_CONFIG (one variable cannot feed two conflicting arguments).
                let alias = sub.get_name() == "check" && arg.get_id() == "config";
                if !builtin && !alias && arg.get_env().is_none() {
                    missing.push(format!("{} --{}", sub.get_name(), arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "flags without an env var: {missing:?}");
    }

    #[test]
    fn every_serve_flag_is_documented_in_the_configuration_guide() {
        use clap::CommandFactory as _;
        let guide = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/configuration.md"
        ))
        .unwrap();
        let command = Cli::command();
        let serve = command.find_subcommand("serve").unwrap();
        let undocumented: Vec<String> = serve
            .get_arguments()
            .chain(command.get_arguments())
            .filter_map(|arg| arg.get_long())
            .filter(|long| !matches!(*long, "help" | "version"))
            .filter(|long| !guide.contains(&format!("`--{long}")))
            .map(|long| format!("--{long}"))
            .collect();
        assert!(
            undocumented.is_empty(),
            "not in docs/configuration.md: {undocumented:?}"
        );
    }

    #[test]
    fn serve_defaults_match_the_reference_ports() {
        let cli = Cli::try_parse_from(["tollgate", "serve", "--config", "cfg"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("expected serve");
        };
        assert_eq!(args.listen.grpc_addr.port(), 8081);
        assert_eq!(args.listen.http_addr.port(), 8080);
        assert_eq!(args.store.spec().unwrap(), StoreSpec::Memory);
        assert_eq!(args.store_options().memory_max_keys, 1_000_000);
        assert!(!args.options().modes.count_denied);
        assert_eq!(
            args.options().service,
            ServiceOptions::default(),
            "the flags' defaults are the options' defaults"
        );
    }

    #[test]
    fn flags_parse_and_unknown_stores_are_refused() {
        let cli = Cli::try_parse_from([
            "tollgate",
            "serve",
            "--config",
            "cfg",
            "--count-denied",
            "--shadow-mode",
            "--max-descriptors",
            "8",
            "--drain-timeout",
            "2s",
            "--store",
            "etcd://x",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("expected serve");
        };
        assert!(args.options().modes.count_denied);
        assert!(args.options().modes.global_shadow);
        assert_eq!(args.options().service.input_limits.max_descriptors, 8);
        assert_eq!(args.shutdown.drain_timeout, Duration::from_secs(2));
        assert_eq!(
            args.store.spec().unwrap_err().to_string(),
            "--store: unsupported store \"etcd\"; expected `memory`, `redis://…`, `rediss://…`, `unix:///…` (a Redis Unix socket), `redis-cluster://…`, `rediss-cluster://…` or `redis-sentinel://…`"
        );
    }

    #[test]
    fn a_zero_poll_interval_and_a_ratio_outside_0_to_1_are_refused() {
        let base = ["tollgate", "serve", "--config", "cfg"];
        let with = |flag: &str, value: &str| {
            let mut args = base.to_vec();
            args.extend([flag, value]);
            Cli::try_parse_from(args).map(drop)
        };
        assert!(with("--config-poll", "0s").is_err());
        assert!(with("--config-poll", "5s").is_ok());
        assert!(with("--near-limit-ratio", "1.5").is_err());
        assert!(with("--near-limit-ratio", "NaN").is_err());
        assert!(with("--near-limit-ratio", "0.9").is_ok());
        assert!(with("--max-hits-addend", "18446744073709551615").is_err());
        assert!(with("--max-hits-addend", "1000000000000").is_ok());
    }

    #[test]
    fn query_takes_repeated_descriptors() {
        let cli = Cli::try_parse_from([
            "tollgate",
            "query",
            "--domain",
            "api",
            "--descriptor",
            "user=alice",
            "--descriptor",
            "user=bob,path=/x",
        ])
        .unwrap();
        let Command::Query(args) = cli.command else {
            panic!("expected query");
        };
        assert_eq!(args.request.descriptors, ["user=alice", "user=bob,path=/x"]);
    }
}
