//! Where Redis is: `--store` URLs (`redis://`, `rediss://`, `unix://`, `redis-cluster://`,
//! `rediss-cluster://`, `redis-sentinel://`, `rediss-sentinel://`) with an optional password
//! file, parsed into connection settings that never print their credentials.

use std::fmt;

use redis::{ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisError};

/// Where Redis is, from `--store` (and `--redis-password-file`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSpec {
    pub cluster: bool,
    /// One URL per node (`redis://` or `rediss://`), credentials included.
    nodes: Vec<String>,
    password: Option<String>,
    /// Through Redis Sentinel: `nodes` are the sentinels, and this names the master.
    pub(super) sentinel: Option<Sentinel>,
    /// A private CA and a client certificate for `rediss://` (`--redis-tls-*`).
    pub(super) certificates: Option<RedisCertificates>,
}

/// PEM files' contents for TLS to Redis: the CA that signed the server's certificate (else
/// the system's roots), and a client certificate with its key (for Redis's `tls-auth-clients`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisCertificates {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisCertificates {
    pub(super) fn to_redis(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// The master a set of sentinels watches over.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Sentinel {
    /// The name the sentinels know the master by.
    pub master: String,
    /// The master's credentials and database, as a URL whose host is a placeholder (the
    /// sentinels say where the master is).
    template: String,
    /// TLS to the master.
    pub tls: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("--store: {0}")]
pub struct SpecError(String);

impl RedisSpec {
    /// Parses `redis://…`, `rediss://…`, `unix:///path/redis.sock[?db=N&user=U&pass=P]` (also
    /// spelled `redis+unix://`: a Unix socket, the reference's default socket type),
    /// `redis-cluster://[user:pass@]h1:p1,h2:p2` or `rediss-cluster://…`. `None`: not a Redis
    /// URL at all.
    pub fn parse(url: &str, password: Option<String>) -> Option<Result<Self, SpecError>> {
        for (scheme, tls) in [("redis-sentinel://", false), ("rediss-sentinel://", true)] {
            if let Some(rest) = url.strip_prefix(scheme) {
                return Some(Self::sentinel(rest, tls, password));
            }
        }
        let (cluster, scheme, rest) = if let Some(rest) = url.strip_prefix("redis-cluster://") {
            (true, "redis", rest)
        } else if let Some(rest) = url.strip_prefix("rediss-cluster://") {
            (true, "rediss", rest)
        } else if ["redis://", "rediss://", "unix://", "redis+unix://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Some(Self::checked(false, vec![url.to_owned()], password, None));
        } else {
            return None;
        };
        let rest = rest.trim_end_matches('/');
        let (credentials, hosts) = match rest.rsplit_once('@') {
            Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
            None => (String::new(), rest),
        };
        let nodes = hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| format!("{scheme}://{credentials}{host}"))
            .collect();
        Some(Self::checked(cluster, nodes, password, None))
    }

    /// `[user:pass@]h1:p1,h2:p2/MASTER[/DB][?sentinel_user=U&sentinel_pass=P]`: the user and
    /// password are the master's, those of the sentinels are in the query.
    fn sentinel(rest: &str, tls: bool, password: Option<String>) -> Result<Self, SpecError> {
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
            None => (String::new(), authority),
        };
        let (master, db) = path.split_once('/').unwrap_or((path, "0"));
        if master.is_empty() {
            return Err(SpecError(
                "a sentinel URL names the master after the sentinels: redis-sentinel://host:26379,host:26380/mymaster".into(),
            ));
        }
        let (mut user, mut pass) = ("", "");
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("sentinel_user", value)) => user = value,
                Some(("sentinel_pass", value)) => pass = value,
                _ => {
                    return Err(SpecError(format!(
                        "unknown sentinel URL parameter {:?} (expected sentinel_user, sentinel_pass)",
                        pair.split('=').next().unwrap_or_default()
                    )));
                }
            }
        }
        let sentinel_credentials = match (user, pass) {
            ("", "") => String::new(),
            (user, pass) => format!("{user}:{pass}@"),
        };
        let scheme = if tls { "rediss" } else { "redis" };
        let nodes = hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| format!("{scheme}://{sentinel_credentials}{host}"))
            .collect();
        let sentinel = Sentinel {
            master: master.to_owned(),
            template: format!("redis://{credentials}localhost/{db}"),
            tls,
        };
        Self::checked(false, nodes, password, Some(sentinel))
    }

    fn checked(
        cluster: bool,
        nodes: Vec<String>,
        password: Option<String>,
        sentinel: Option<Sentinel>,
    ) -> Result<Self, SpecError> {
        let spec = Self {
            cluster,
            nodes,
            password,
            sentinel,
            certificates: None,
        };
        if let Err(error) = spec.master_settings() {
            return Err(SpecError(format!("invalid Redis URL: {error}")));
        }
        if spec.nodes.is_empty() {
            return Err(SpecError(
                "a Redis cluster or sentinel URL names no node".into(),
            ));
        }
        spec.connection_infos()
            .map_err(|error| SpecError(format!("invalid Redis URL: {error}")))?;
        Ok(spec)
    }

    /// The same, over TLS with these certificates; only for `rediss://` and
    /// `rediss-cluster://` URLs.
    pub fn with_certificates(mut self, certificates: RedisCertificates) -> Result<Self, SpecError> {
        if self.sentinel.is_some() {
            return Err(SpecError(
                "--redis-tls-*: certificates behind Redis Sentinel are not supported yet".into(),
            ));
        }
        if !self.nodes.iter().all(|node| node.starts_with("rediss://")) {
            return Err(SpecError(
                "--redis-tls-*: certificates need a TLS URL (rediss:// or rediss-cluster://)"
                    .into(),
            ));
        }
        self.certificates = Some(certificates);
        Ok(self)
    }

    /// The master's user, password and database, behind sentinels (`None` otherwise).
    pub(super) fn master_settings(&self) -> Result<Option<RedisConnectionInfo>, RedisError> {
        let Some(sentinel) = &self.sentinel else {
            return Ok(None);
        };
        let settings = sentinel
            .template
            .as_str()
            .into_connection_info()?
            .redis_settings()
            .clone();
        Ok(Some(match &self.password {
            Some(password) => settings.set_password(password),
            None => settings,
        }))
    }

    /// Each node's connection settings (the sentinels', behind sentinels: the password
    /// from a file is the master's).
    pub(super) fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, RedisError> {
        let password = self.password.as_ref().filter(|_| self.sentinel.is_none());
        self.nodes
            .iter()
            .map(|node| {
                let info = node.as_str().into_connection_info()?;
                Ok(match password {
                    Some(password) => {
                        let settings = info.redis_settings().clone().set_password(password);
                        info.set_redis_settings(settings)
                    }
                    None => info,
                })
            })
            .collect()
    }
}

impl RedisSpec {
    /// The nodes' addresses, without credentials.
    fn addresses(&self) -> Vec<String> {
        match self.connection_infos() {
            Ok(infos) => infos.iter().map(|info| info.addr().to_string()).collect(),
            Err(_) => vec!["<invalid>".into()],
        }
    }
}

/// Never prints credentials: only the addresses.
impl fmt::Debug for RedisSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSpec")
            .field("cluster", &self.cluster)
            .field(
                "sentinel_master",
                &self.sentinel.as_ref().map(|sentinel| &sentinel.master),
            )
            .field("nodes", &self.addresses())
            .finish()
    }
}

/// For logs: `redis 127.0.0.1:6379` or `redis cluster h1:7000,h2:7001`, never credentials.
impl fmt::Display for RedisSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addresses = self.addresses().join(",");
        match &self.sentinel {
            Some(sentinel) => write!(f, "redis {:?} via sentinels {addresses}", sentinel.master),
            None if self.cluster => write!(f, "redis cluster {addresses}"),
            None => write!(f, "redis {addresses}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> RedisSpec {
        RedisSpec::parse(url, None)
            .expect("a Redis URL")
            .expect("valid")
    }

    #[test]
    fn cluster_urls_name_every_node_with_the_shared_credentials() {
        let spec = parse("redis-cluster://user:secret@127.0.0.1:7000,127.0.0.1:7001/");
        assert!(spec.cluster);
        assert_eq!(
            spec.nodes,
            [
                "redis://user:secret@127.0.0.1:7000",
                "redis://user:secret@127.0.0.1:7001"
            ]
        );
        let tls = parse("rediss-cluster://h1:7000,h2:7001");
        assert_eq!(tls.nodes, ["rediss://h1:7000", "rediss://h2:7001"]);
        assert!(!parse("rediss://h:6380").cluster);
    }

    #[test]
    fn passwords_never_appear_in_debug_output() {
        let spec = RedisSpec::parse("redis://:hunter2@127.0.0.1:6379", Some("s3cret".into()))
            .unwrap()
            .unwrap();
        let shown = format!("{spec:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cret"),
            "{shown}"
        );
        assert!(shown.contains("127.0.0.1:6379"), "{shown}");
    }

    #[test]
    fn a_unix_socket_is_a_single_redis_by_path() {
        let spec = parse("unix:///run/redis/redis.sock?db=2&pass=secret");
        assert!(!spec.cluster);
        assert_eq!(spec.to_string(), "redis /run/redis/redis.sock");
        let infos = spec.connection_infos().unwrap();
        assert_eq!(infos[0].redis_settings().password(), Some("secret"));
        assert_eq!(
            parse("redis+unix:///tmp/r.sock").to_string(),
            "redis /tmp/r.sock"
        );
    }

    #[test]
    fn logs_name_the_addresses_only() {
        let spec = parse("redis-cluster://user:secret@127.0.0.1:7000,127.0.0.1:7001");
        assert_eq!(
            spec.to_string(),
            "redis cluster 127.0.0.1:7000,127.0.0.1:7001"
        );
        assert_eq!(
            parse("redis://:pw@127.0.0.1:6379/2").to_string(),
            "redis 127.0.0.1:6379"
        );
    }

    #[test]
    fn a_password_file_overrides_the_url() {
        let spec = RedisSpec::parse("redis://:old@127.0.0.1:6379", Some("new".into()))
            .unwrap()
            .unwrap();
        let infos = spec.connection_infos().unwrap();
        assert_eq!(infos[0].redis_settings().password(), Some("new"));
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_both_sets_of_credentials() {
        let spec = parse(
            "redis-sentinel://app:secret@127.0.0.1:26379,127.0.0.1:26380/mymaster/2?sentinel_user=watch&sentinel_pass=s%40fe",
        );
        assert_eq!(
            spec.to_string(),
            "redis \"mymaster\" via sentinels 127.0.0.1:26379,127.0.0.1:26380"
        );
        let sentinels = spec.connection_infos().unwrap();
        assert_eq!(sentinels[1].redis_settings().username(), Some("watch"));
        assert_eq!(sentinels[1].redis_settings().password(), Some("s@fe"));
        let master = spec.master_settings().unwrap().unwrap();
        assert_eq!(
            (master.username(), master.password(), master.db()),
            (Some("app"), Some("secret"), 2)
        );
        let shown = format!("{spec:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("s%40fe"),
            "{shown}"
        );
        assert!(
            RedisSpec::parse("redis-sentinel://127.0.0.1:26379", None)
                .unwrap()
                .unwrap_err()
                .to_string()
                .contains("names the master")
        );
    }

    #[test]
    fn other_schemes_are_not_redis_and_empty_clusters_are_errors() {
        assert!(RedisSpec::parse("memcached://x", None).is_none());
        assert!(RedisSpec::parse("redis-cluster://", None).unwrap().is_err());
    }
}
