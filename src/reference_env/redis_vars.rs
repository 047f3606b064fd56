//! The reference's Redis variables (`REDIS_*`, `REDIS_PERSECOND_*`), as `--store` URLs and the
//! Redis flags.

use super::reader::Reader;
use super::translation::{EnvError, refuse};

impl Reader<'_> {
    pub(super) fn stores(&mut self) -> Result<(), EnvError> {
        for (variable, flag) in [
            ("REDIS_TLS_CACERT", "--redis-tls-ca"),
            ("REDIS_TLS_CLIENT_CERT", "--redis-tls-cert"),
            ("REDIS_TLS_CLIENT_KEY", "--redis-tls-key"),
        ] {
            let path = self.text(variable);
            if !path.is_empty() {
                self.flag(flag, path, variable);
            }
        }
        let main = self.store_url("REDIS_")?;
        self.flag("--store", main, "REDIS_URL");
        if self.switch("REDIS_PERSECOND")? {
            let per_second = self.store_url("REDIS_PERSECOND_")?;
            self.flag("--store-per-second", per_second, "REDIS_PERSECOND_URL");
        }
        // The reference's dial timeout; its calls are bounded by the request alone, ours by
        // --store-timeout as well.
        let timeout = self.text("REDIS_TIMEOUT");
        self.flag("--redis-connect-timeout", timeout, "REDIS_TIMEOUT");
        // The reference marks Redis healthy at start and, unless asked to, never looks again:
        // Envoy Gateway probes liveness on /healthcheck, so an outage must not fail it.
        if !self.switch("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")? {
            self.out.args.push("--ready-without-store".into());
        }
        // Unset, tollgate reconnects on READONLY anyway (the reference does not): only an
        // explicit false turns that off.
        if self.is_set("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR") {
            let reconnect = self.switch("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR")?;
            self.flag(
                "--redis-reconnect-on-readonly",
                reconnect.to_string(),
                "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
            );
        }
        Ok(())
    }

    /// The `--store` URL the `prefix`ed variables (`REDIS_` or `REDIS_PERSECOND_`) describe.
    fn store_url(&mut self, prefix: &str) -> Result<String, EnvError> {
        let name = |suffix: &str| format!("{prefix}{suffix}");
        let socket = self.text(&name("SOCKET_TYPE")).to_ascii_lowercase();
        let kind = self.text(&name("TYPE")).to_ascii_lowercase();
        let url = self.text(&name("URL"));
        let auth = credentials(&self.text(&name("AUTH")));
        let tls = self.switch(&name("TLS"))?;
        let insecure = self.switch("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?;
        let sentinel_auth = credentials(&self.text(&name("SENTINEL_AUTH")));
        if !matches!(kind.as_str(), "single" | "sentinel" | "cluster") {
            return Err(refuse(
                &name("TYPE"),
                format!("{kind:?}: expected single, sentinel or cluster"),
            ));
        }
        if !matches!(socket.as_str(), "unix" | "tcp") {
            return Err(refuse(
                &name("SOCKET_TYPE"),
                format!("{socket:?}: expected unix or tcp"),
            ));
        }
        if socket == "unix" {
            if kind != "single" {
                return Err(refuse(
                    &name("SOCKET_TYPE"),
                    format!("unix works with {} single only", name("TYPE")),
                ));
            }
            let query = match auth.as_deref() {
                None => String::new(),
                Some(userinfo) => match userinfo.trim_end_matches('@').split_once(':') {
                    Some(("", pass)) => format!("?pass={pass}"),
                    Some((user, pass)) => format!("?user={user}&pass={pass}"),
                    None => String::new(),
                },
            };
            return Ok(format!("unix://{url}{query}"));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let userinfo = auth.unwrap_or_default();
        match kind.as_str() {
            "single" => {
                let fragment = if tls && insecure { "/#insecure" } else { "" };
                Ok(format!("{scheme}://{userinfo}{url}{fragment}"))
            }
            "sentinel" => {
                let Some((master, sentinels)) = url.split_once(',') else {
                    return Err(refuse(
                        &name("URL"),
                        "a sentinel URL is `master,host:port[,host:port…]`",
                    ));
                };
                let query = match sentinel_auth {
                    None => String::new(),
                    Some(userinfo) => match userinfo.trim_end_matches('@').split_once(':') {
                        Some(("", pass)) => format!("?sentinel_pass={pass}"),
                        Some((user, pass)) => format!("?sentinel_user={user}&sentinel_pass={pass}"),
                        None => String::new(),
                    },
                };
                Ok(format!(
                    "{scheme}-sentinel://{userinfo}{sentinels}/{master}{query}"
                ))
            }
            _ => Ok(format!("{scheme}-cluster://{userinfo}{url}")),
        }
    }
}

/// `pass` or `user:pass` as URL user information (`user:pass@`, `:pass@`), percent-encoded;
/// `None` when empty.
fn credentials(auth: &str) -> Option<String> {
    if auth.is_empty() {
        return None;
    }
    let (user, pass) = auth.split_once(':').unwrap_or(("", auth));
    let encode = |text: &str| {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    Some(format!("{}:{}@", encode(user), encode(pass)))
}
