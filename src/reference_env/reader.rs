//! Reading the reference's variables, section by section, into `serve`'s flags.

use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::path::PathBuf;

use super::translation::{EnvError, Translation, refuse};
use super::variables::VARIABLES;
use crate::config::LoadOptions;

pub struct Reader<'a> {
    pub vars: &'a HashMap<String, String>,
    pub out: Translation,
}

impl Reader<'_> {
    /// The variable's value, or the reference's default when it is unset or empty.
    pub(super) fn text(&mut self, name: &str) -> String {
        self.out.read.insert(name.to_owned());
        match self.vars.get(name).map(|value| value.trim()) {
            Some(value) if !value.is_empty() => value.to_owned(),
            _ => VARIABLES
                .iter()
                .find(|variable| variable.name == name)
                .map_or_else(String::new, |variable| variable.default.to_owned()),
        }
    }

    /// Whether the variable is set to something other than blanks.
    pub(super) fn is_set(&mut self, name: &str) -> bool {
        self.out.read.insert(name.to_owned());
        self.vars
            .get(name)
            .is_some_and(|value| !value.trim().is_empty())
    }

    /// A boolean as Go's `strconv.ParseBool` reads it.
    pub(super) fn switch(&mut self, name: &str) -> Result<bool, EnvError> {
        match self.text(name).as_str() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            other => Err(refuse(name, format!("{other:?} is not true or false"))),
        }
    }

    /// `flag value`, from `variable`.
    pub(super) fn flag(&mut self, flag: &str, value: impl Into<String>, variable: &str) {
        self.out.args.extend([flag.to_owned(), value.into()]);
        self.out
            .sources
            .push((flag.to_owned(), variable.to_owned()));
    }

    /// A boolean flag, set when `variable` is true.
    pub(super) fn flag_if(&mut self, variable: &str, flag: &str) -> Result<(), EnvError> {
        if self.switch(variable)? {
            self.out.args.push(flag.to_owned());
        }
        Ok(())
    }

    /// The listen address of `host` and `port` as `flag`.
    fn listener(&mut self, host: &str, port: &str, flag: &str) -> Result<(), EnvError> {
        let at = address(&self.text(host), &self.text(port), host, port)?;
        self.flag(flag, at, port);
        Ok(())
    }

    pub fn listeners(&mut self) -> Result<(), EnvError> {
        self.listener("HOST", "PORT", "--http-addr")?;
        self.listener("DEBUG_HOST", "DEBUG_PORT", "--debug-addr")?;
        self.listener("GRPC_HOST", "GRPC_PORT", "--grpc-addr")?;
        let age = self.text("GRPC_MAX_CONNECTION_AGE");
        self.flag("--grpc-max-connection-age", age, "GRPC_MAX_CONNECTION_AGE");
        let grace = self.text("GRPC_MAX_CONNECTION_AGE_GRACE");
        self.flag(
            "--grpc-max-connection-age-grace",
            grace,
            "GRPC_MAX_CONNECTION_AGE_GRACE",
        );
        let uds = self.text("GRPC_UDS");
        if !uds.is_empty() {
            self.flag("--grpc-uds", uds, "GRPC_UDS");
        }
        // The reference's POST /json spends quota as a decision does, open to whoever reaches
        // the port; it has no reset endpoint, so ours stays off (unless a token is given).
        self.out
            .args
            .extend(["--admin-writes".into(), "json".into()]);
        if !self.switch("GRPC_SERVER_USE_TLS")? {
            return Ok(());
        }
        for (variable, flag) in [
            ("GRPC_SERVER_TLS_CERT", "--tls-cert"),
            ("GRPC_SERVER_TLS_KEY", "--tls-key"),
        ] {
            let path = self.text(variable);
            if path.is_empty() {
                return Err(refuse(
                    variable,
                    "required when GRPC_SERVER_USE_TLS is true",
                ));
            }
            self.flag(flag, path, variable);
        }
        let client_ca = self.text("GRPC_CLIENT_TLS_CACERT");
        if !client_ca.is_empty() {
            self.flag(
                "--tls-client-ca",
                client_ca.clone(),
                "GRPC_CLIENT_TLS_CACERT",
            );
        }
        let san = self.text("GRPC_CLIENT_TLS_SAN");
        if !san.is_empty() {
            if client_ca.is_empty() {
                return Err(refuse(
                    "GRPC_CLIENT_TLS_SAN",
                    "needs GRPC_CLIENT_TLS_CACERT (client certificates are checked only with a client CA)",
                ));
            }
            self.flag("--tls-client-san", san, "GRPC_CLIENT_TLS_SAN");
        }
        Ok(())
    }

    pub fn logging(&mut self) -> Result<(), EnvError> {
        let level = match self.text("LOG_LEVEL").to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            other => {
                return Err(refuse(
                    "LOG_LEVEL",
                    format!("{other:?} is not a level (debug, info, warn, error)"),
                ));
            }
        };
        self.flag("--log-level", level, "LOG_LEVEL");
        let format = self.text("LOG_FORMAT").to_ascii_lowercase();
        if !matches!(format.as_str(), "text" | "json") {
            return Err(refuse(
                "LOG_FORMAT",
                format!("{format:?}: expected text or json"),
            ));
        }
        self.flag("--log-format", format, "LOG_FORMAT");
        Ok(())
    }

    pub fn config(&mut self) -> Result<(), EnvError> {
        let from_files = match self.text("CONFIG_TYPE").to_ascii_uppercase().as_str() {
            "FILE" => true,
            "GRPC_XDS_SOTW" => false,
            other => {
                return Err(refuse(
                    "CONFIG_TYPE",
                    format!("{other:?}: expected FILE or GRPC_XDS_SOTW"),
                ));
            }
        };
        self.flag_if("MERGE_DOMAIN_CONFIG", "--merge-domains")?;
        self.flag_if(
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
            "--ready-needs-rules",
        )?;
        // Both are read either way, so that a set variable never goes unnoticed; only the
        // source CONFIG_TYPE names gives flags.
        let files = self.files()?;
        let xds = self.xds()?;
        self.out.args.extend(if from_files { files } else { xds });
        Ok(())
    }

    /// Where the reference reads its rule files, and how: every file under the directory,
    /// whatever its name; dot entries unless RUNTIME_IGNOREDOTFILES; a directory without
    /// any accepted (the reference then serves with no domain).
    pub fn rule_files(&mut self) -> Result<(PathBuf, LoadOptions), EnvError> {
        let mut dir = PathBuf::from(self.text("RUNTIME_ROOT"));
        for part in ["RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"] {
            let part = self.text(part);
            if !part.is_empty() {
                dir.push(part);
            }
        }
        let options = LoadOptions {
            every_file: true,
            dotfiles: !self.switch("RUNTIME_IGNOREDOTFILES")?,
            merge_domains: self.switch("MERGE_DOMAIN_CONFIG")?,
            allow_empty: true,
        };
        Ok((dir, options))
    }

    /// The flags of the rule files under RUNTIME_ROOT.
    fn files(&mut self) -> Result<Vec<String>, EnvError> {
        let mut flags = Vec::new();
        let (dir, options) = self.rule_files()?;
        flags.extend(["--config".into(), dir.display().to_string()]);
        self.out.sources.push((
            "--config".into(),
            "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY".into(),
        ));
        // The reference starts with files that do not load, and heals when they are fixed.
        flags.push("--wait-for-valid-config".into());
        flags.push("--config-every-file".into());
        flags.push("--config-allow-empty".into());
        if options.dotfiles {
            flags.push("--config-dotfiles".into());
        }
        // With RUNTIME_WATCH_ROOT the reference reloads when RUNTIME_ROOT, a link, is swapped
        // to another directory: a watch on the old directory would not see that, a poll does.
        if self.switch("RUNTIME_WATCH_ROOT")? {
            flags.extend(["--config-poll".into(), "1s".into()]);
        }
        Ok(flags)
    }

    pub fn behaviour(&mut self) -> Result<(), EnvError> {
        match self.text("BACKEND_TYPE").to_ascii_lowercase().as_str() {
            "redis" => {}
            "memcache" => {
                return Err(refuse(
                    "BACKEND_TYPE",
                    "memcache is not supported: tollgate keeps counters in Redis (or in memory)",
                ));
            }
            other => return Err(refuse("BACKEND_TYPE", format!("{other:?}: expected redis"))),
        }
        let prefix = self.text("CACHE_KEY_PREFIX");
        if !prefix.is_empty() {
            self.flag("--store-key-prefix", prefix, "CACHE_KEY_PREFIX");
        }
        // Unset, tollgate's own deny cache stays on: its answers are Redis's, and the denied
        // hits it answers are still counted, where the reference's cache (off by default)
        // stops counting them.
        if self.is_set("LOCAL_CACHE_SIZE_IN_BYTES") {
            let bytes = self.text("LOCAL_CACHE_SIZE_IN_BYTES");
            let bytes: u64 = bytes.parse().map_err(|_| {
                refuse(
                    "LOCAL_CACHE_SIZE_IN_BYTES",
                    format!("{bytes:?} is not a number of bytes"),
                )
            })?;
            // An entry of the deny cache costs about 128 bytes.
            let entries = bytes.div_ceil(128);
            self.flag(
                "--deny-cache-size",
                entries.to_string(),
                "LOCAL_CACHE_SIZE_IN_BYTES",
            );
        }
        let ratio = self.text("NEAR_LIMIT_RATIO");
        self.flag("--near-limit-ratio", ratio, "NEAR_LIMIT_RATIO");
        if !self.switch("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
            self.out.args.push("--count-denied".into());
        }
        self.flag_if("SHADOW_MODE", "--shadow-mode")?;
        self.flag_if("QUOTA_MODE", "--quota-mode")?;
        self.flag_if("RESPONSE_DYNAMIC_METADATA", "--dynamic-metadata")?;
        if self.switch("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            self.flag(
                "--response-headers",
                "legacy",
                "LIMIT_RESPONSE_HEADERS_ENABLED",
            );
            let names = [
                "LIMIT_LIMIT_HEADER",
                "LIMIT_REMAINING_HEADER",
                "LIMIT_RESET_HEADER",
            ]
            .map(|name| self.text(name));
            self.flag(
                "--legacy-header-names",
                names.join(","),
                "LIMIT_LIMIT_HEADER",
            );
        }
        if self.switch("LIMIT_REQUEST_HEADERS_ENABLED")? {
            self.out.args.push("--upstream-limit-headers".into());
            let names = [
                "LIMIT_REQUEST_LIMIT_HEADER",
                "LIMIT_REQUEST_REMAINING_HEADER",
                "LIMIT_REQUEST_RESET_HEADER",
            ]
            .map(|name| self.text(name));
            self.flag(
                "--upstream-limit-header-names",
                names.join(","),
                "LIMIT_REQUEST_LIMIT_HEADER",
            );
        }
        Ok(())
    }

    pub fn stats(&mut self) -> Result<(), EnvError> {
        let (plain, dog) = (self.switch("USE_STATSD")?, self.switch("USE_DOG_STATSD")?);
        let statsd = plain || dog;
        if statsd && !self.switch("DISABLE_STATS")? {
            let host = self.text("STATSD_HOST");
            let port = self.text("STATSD_PORT");
            self.flag("--statsd", format!("{host}:{port}"), "STATSD_HOST");
            // The reference's plain statsd sink is gostats' (TCP unless STATSD_PROTOCOL says,
            // tags in the name); its DogStatsD sink sends datagrams with `|#` tags.
            let (protocol, style) = if dog {
                ("udp".to_owned(), "dogstatsd")
            } else {
                (self.text("STATSD_PROTOCOL").to_ascii_lowercase(), "name")
            };
            self.flag("--statsd-protocol", protocol, "STATSD_PROTOCOL");
            self.flag("--statsd-tag-style", style, "USE_DOG_STATSD");
            let every = self.text("STATS_FLUSH_INTERVAL");
            self.flag("--statsd-flush-interval", every, "STATS_FLUSH_INTERVAL");
            let tags = self.text("EXTRA_TAGS");
            for tag in tags.split(',').filter(|tag| !tag.is_empty()) {
                let Some((key, value)) = tag.split_once(':') else {
                    return Err(refuse("EXTRA_TAGS", format!("{tag:?} is not key:value")));
                };
                self.flag("--statsd-tag", format!("{key}={value}"), "EXTRA_TAGS");
            }
        }
        self.prometheus()
    }

    pub fn tracing(&mut self) -> Result<(), EnvError> {
        if !self.switch("TRACING_ENABLED")? {
            self.flag("--traces", "off", "TRACING_ENABLED");
            return Ok(());
        }
        self.flag("--traces", "on", "TRACING_ENABLED");
        let protocol = self.text("TRACING_EXPORTER_PROTOCOL").to_ascii_lowercase();
        if !matches!(protocol.as_str(), "http" | "grpc") {
            return Err(refuse(
                "TRACING_EXPORTER_PROTOCOL",
                format!("{protocol:?}: expected http or grpc"),
            ));
        }
        self.flag("--trace-protocol", protocol, "TRACING_EXPORTER_PROTOCOL");
        for (variable, flag) in [
            ("TRACING_SERVICE_NAME", "--trace-service-name"),
            ("TRACING_SERVICE_NAMESPACE", "--trace-service-namespace"),
            ("TRACING_SERVICE_INSTANCE_ID", "--trace-service-instance-id"),
            ("TRACING_SAMPLING_RATE", "--trace-sampling-ratio"),
        ] {
            let value = self.text(variable);
            if !value.is_empty() {
                self.flag(flag, value, variable);
            }
        }
        Ok(())
    }
}

/// `host:port` as a listen address; a name is resolved now, so that a bad one is reported
/// with its variable.
pub(super) fn address(
    host: &str,
    port: &str,
    host_variable: &str,
    port_variable: &str,
) -> Result<String, EnvError> {
    let port: u16 = port
        .parse()
        .map_err(|_| refuse(port_variable, format!("{port:?} is not a port")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let resolved = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next());
    match resolved {
        Some(address) => Ok(address.to_string()),
        None => Err(refuse(
            host_variable,
            format!("{host:?} is not an address of this host"),
        )),
    }
}
