//! How `serve`'s flags become the options of the parts they configure: the store to build,
//! the server's options, the config loading; and why flags cannot be used together.

use std::path::PathBuf;
use std::sync::Arc;

use super::serve::ServeArgs;
use crate::admin::writes::AdminWrites;
use crate::algorithm::Charge;
use crate::config::LoadOptions;
use crate::limiter::Modes;
use crate::metrics::Metrics;
use crate::reload::ReloadOptions;
use crate::server::Options;
use crate::statsd::StatsdOptions;
use crate::storage::StoreOptions;
use crate::storage::redis::{RedisCertificates, RedisSpec, SpecError as RedisSpecError};
use crate::storage::stack::StoreSpec;
use crate::tls::TlsFiles;

/// A Redis URL (with the password from a file, if any).
fn redis_spec(url: &str, password: Option<String>) -> Result<RedisSpec, ArgsError> {
    match RedisSpec::parse(url, password) {
        Some(spec) => Ok(spec?),
        // The URL is not echoed whole: it may carry a password.
        None => Err(ArgsError::UnsupportedStore(
            url.split("://").next().unwrap_or_default().to_owned(),
        )),
    }
}

/// Why `serve`'s flags cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "--store: unsupported store {0:?}; expected `memory`, `redis://…`, `rediss://…`, `unix:///…` (a Redis Unix socket), `redis-cluster://…`, `rediss-cluster://…` or `redis-sentinel://…`"
    )]
    UnsupportedStore(String),
    #[error("--store-per-second: needs a Redis --store (the memory store has no per-second twin)")]
    PerSecondWithoutRedis,
    #[error(transparent)]
    Redis(#[from] RedisSpecError),
    #[error("--redis-password-file {path}: {error}")]
    PasswordFile { path: String, error: std::io::Error },
    #[error("{flag} {path}: {error}")]
    File {
        flag: &'static str,
        path: String,
        error: std::io::Error,
    },
}

impl ServeArgs {
    pub fn store_spec(&self) -> Result<StoreSpec, ArgsError> {
        let main = match self.store.as_str() {
            "memory" if self.store_per_second.is_some() => {
                return Err(ArgsError::PerSecondWithoutRedis);
            }
            "memory" => return Ok(StoreSpec::Memory),
            url => self.with_certificates(redis_spec(url, self.redis_password()?)?)?,
        };
        Ok(match &self.store_per_second {
            None => StoreSpec::Redis(main),
            Some(url) => {
                let per_second = self.with_certificates(redis_spec(url, None)?)?;
                StoreSpec::RedisPerSecond(main, per_second)
            }
        })
    }

    /// `spec` with the --redis-tls-* files, if any are given.
    fn with_certificates(&self, spec: RedisSpec) -> Result<RedisSpec, ArgsError> {
        let read = |flag: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|error| ArgsError::File {
                flag,
                path: path.display().to_string(),
                error,
            })
        };
        let ca = self
            .redis_tls_ca
            .as_ref()
            .map(|path| read("--redis-tls-ca", path))
            .transpose()?;
        let client = match (&self.redis_tls_cert, &self.redis_tls_key) {
            (Some(cert), Some(key)) => Some((
                read("--redis-tls-cert", cert)?,
                read("--redis-tls-key", key)?,
            )),
            _ => None,
        };
        if ca.is_none() && client.is_none() {
            return Ok(spec);
        }
        Ok(spec.with_certificates(RedisCertificates { ca, client })?)
    }

    /// The password in --redis-password-file (for --store; a --store-per-second URL carries
    /// its own).
    fn redis_password(&self) -> Result<Option<String>, ArgsError> {
        let Some(path) = &self.redis_password_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|error| ArgsError::PasswordFile {
            path: path.display().to_string(),
            error,
        })?;
        Ok(Some(text.trim_end_matches(['\r', '\n']).to_owned()))
    }

    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            charge: self.charge(),
            timeout: self.store_timeout,
            deny_cache_size: self.deny_cache_size,
            deny_cache_max_ttl: self.deny_cache_max_ttl,
            memory_max_keys: self.memory_max_keys,
            redis_connections: usize::from(self.redis_connections),
            key_prefix: self.store_key_prefix.clone(),
            runtimes: self.runtime.grpc_runtimes(),
            ..StoreOptions::default()
        }
    }

    /// Which config files are read, and how.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            every_file: self.config_every_file,
            dotfiles: self.config_dotfiles,
            merge_domains: self.merge_domains,
        }
    }

    pub fn charge(&self) -> Charge {
        if self.count_denied {
            Charge::Always
        } else {
            Charge::IfAllowed
        }
    }

    pub fn options(&self) -> Options {
        Options {
            service: self.service.clone(),
            quota: self.quota.clone(),
            modes: Modes {
                global_shadow: self.shadow_mode,
                global_quota: self.quota_mode,
            },
            shutdown_delay: self.shutdown_delay,
            ready_needs_rules: self.ready_needs_rules,
            statsd: self.statsd.clone().map(|address| StatsdOptions {
                address,
                every: self.statsd_flush_interval,
                tags: self.statsd_tags.clone(),
            }),
            drain_timeout: self.drain_timeout,
            runtime: self.runtime,
            tls: self
                .tls_cert
                .clone()
                .zip(self.tls_key.clone())
                .map(|(cert, key)| TlsFiles {
                    cert,
                    key,
                    client_ca: self.tls_client_ca.clone(),
                    client_san: self.tls_client_san.clone(),
                }),
            reload: self.config.clone().map(|dir| ReloadOptions {
                dir,
                poll: self.config_poll,
                load: self.load_options(),
            }),
            xds: self.xds.options(self.merge_domains),
            serve_before_config: self.xds.serve_before_config,
            admin_writes: AdminWrites {
                enabled: self.admin_writes,
                token: self.admin_token.clone().filter(|token| !token.is_empty()),
            },
            metrics: Arc::new(Metrics::new(
                self.near_limit_ratio,
                self.metrics_max_detailed,
            )),
            ..Options::default()
        }
    }
}
