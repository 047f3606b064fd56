//! Where Redis is: `--store` URLs (`redis://`, `rediss://`, `redis-cluster://`,
//! `rediss-cluster://`) with an optional password file, parsed into connection settings that
//! never print their credentials.

use std::fmt;

use redis::{ConnectionInfo, IntoConnectionInfo, RedisError};

/// Where Redis is, from `--store` (and `--redis-password-file`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSpec {
    pub cluster: bool,
    /// One URL per node (`redis://` or `rediss://`), credentials included.
    nodes: Vec<String>,
    password: Option<String>,
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
        let (cluster, scheme, rest) = if let Some(rest) = url.strip_prefix("redis-cluster://") {
            (true, "redis", rest)
        } else if let Some(rest) = url.strip_prefix("rediss-cluster://") {
            (true, "rediss", rest)
        } else if ["redis://", "rediss://", "unix://", "redis+unix://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Some(Self::checked(false, vec![url.to_owned()], password));
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
        Some(Self::checked(cluster, nodes, password))
    }

    fn checked(
        cluster: bool,
        nodes: Vec<String>,
        password: Option<String>,
    ) -> Result<Self, SpecError> {
        let spec = Self {
            cluster,
            nodes,
            password,
        };
        if spec.nodes.is_empty() {
            return Err(SpecError("a Redis cluster URL names no node".into()));
        }
        spec.connection_infos()
            .map_err(|error| SpecError(format!("invalid Redis URL: {error}")))?;
        Ok(spec)
    }

    pub(super) fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, RedisError> {
        self.nodes
            .iter()
            .map(|node| {
                let info = node.as_str().into_connection_info()?;
                Ok(match &self.password {
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
            .field("nodes", &self.addresses())
            .finish()
    }
}

/// For logs: `redis 127.0.0.1:6379` or `redis cluster h1:7000,h2:7001`, never credentials.
impl fmt::Display for RedisSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.cluster {
            "redis cluster"
        } else {
            "redis"
        };
        write!(f, "{kind} {}", self.addresses().join(","))
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
    fn other_schemes_are_not_redis_and_empty_clusters_are_errors() {
        assert!(RedisSpec::parse("memcached://x", None).is_none());
        assert!(RedisSpec::parse("redis-cluster://", None).unwrap().is_err());
    }
}
