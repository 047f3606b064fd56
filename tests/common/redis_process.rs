//! Real Redis for tests: redis-server processes on free loopback ports, standalone or formed
//! into a cluster, each stopped when its guard drops. `scripts/test` installs Debian's
//! redis-server when it is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::{free_port, free_ports_at, require};

/// One redis-server process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    cluster: bool,
    /// More `redis-server` arguments (TLS).
    extra: Vec<String>,
    /// The password the test's own queries give, once `set_password` set one.
    password: Option<String>,
    _tmp: std::sync::Arc<tempfile::TempDir>,
}

/// A port free for a client and, for a cluster node, for its bus (port + 10000).
fn free_node_port() -> u16 {
    free_ports_at(&[0, 10_000])
}

impl RedisServer {
    /// A standalone server with no persistence.
    pub fn start() -> Self {
        Self::start_on(free_node_port())
    }

    /// A standalone server on `port`.
    pub fn start_on(port: u16) -> Self {
        let tmp = std::sync::Arc::new(tempfile::tempdir().expect("temp dir"));
        Self::spawn(port, tmp, false, Vec::new())
    }

    fn spawn(
        port: u16,
        tmp: std::sync::Arc<tempfile::TempDir>,
        cluster: bool,
        extra: Vec<String>,
    ) -> Self {
        require("redis-server", "redis-server");
        let dir = tmp.path().join(port.to_string());
        std::fs::create_dir_all(&dir).expect("node dir");
        let mut server = Self {
            port,
            child: None,
            dir,
            cluster,
            extra,
            password: None,
            _tmp: tmp,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if !self.cluster {
            // Also on a Unix socket, the reference's default way to reach Redis.
            command
                .arg("--unixsocket")
                .arg(self.dir.join("redis.sock"))
                .args(["--unixsocketperm", "700"]);
        }
        command.args(&self.extra);
        if self.cluster {
            command.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                // Replicas sync at once instead of waiting 5 s for company; a replica that
                // never synced cannot be promoted.
                "--repl-diskless-sync-delay",
                "0",
            ]);
        }
        self.child = Some(command.spawn().expect("spawn redis-server"));
        self.wait_for(
            |server| server.try_query(&["PING"]).is_some(),
            "to answer PING",
        );
    }

    /// A standalone server that also serves TLS on the returned port, with `cert`/`key`, and
    /// requires client certificates signed by `client_ca` (Redis's `tls-auth-clients`). Its
    /// plain port stays open for the test's own queries.
    pub fn start_tls(cert: &Path, key: &Path, client_ca: &Path) -> (Self, u16) {
        let tls_port = free_port();
        let tmp = std::sync::Arc::new(tempfile::tempdir().expect("temp dir"));
        let extra = [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &cert.display().to_string(),
            "--tls-key-file",
            &key.display().to_string(),
            "--tls-ca-cert-file",
            &client_ca.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        (Self::spawn(free_node_port(), tmp, false, extra), tls_port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The same server by its Unix socket.
    pub fn socket_url(&self) -> String {
        format!("unix://{}", self.dir.join("redis.sock").display())
    }

    /// Kills the process (its data is gone: no persistence).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process without closing its connections (SIGSTOP): a Redis that stops
    /// answering, as one stalled by its host or a long fork does.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Pauses the process now and lets it run again after `how_long`, from a thread the
    /// caller joins.
    pub fn pause_for(&self, how_long: Duration) -> std::thread::JoinHandle<()> {
        self.pause();
        let pid = self.child.as_ref().expect("running").id();
        std::thread::spawn(move || {
            sleep(how_long);
            signal_pid("-CONT", pid);
        })
    }

    fn signal(&self, signal: &str) {
        signal_pid(signal, self.child.as_ref().expect("running").id());
    }
}

fn signal_pid(signal: &str, pid: u32) {
    let pid = pid.to_string();
    let sent = Command::new("kill").args([signal, &pid]).status();
    assert!(
        sent.is_ok_and(|status| status.success()),
        "kill {signal} {pid}"
    );
}

impl RedisServer {
    /// Makes this server a replica of `master` and waits until it holds the master's data.
    pub fn replicate(&self, master: &RedisServer) {
        self.query(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]);
        self.wait_for(
            |replica| {
                replica
                    .try_query(&["INFO", "replication"])
                    .and_then(|info| redis::from_redis_value::<String>(info).ok())
                    .is_some_and(|info| info.contains("master_link_status:up"))
            },
            "in sync with its master",
        );
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Starts it again on the same port, empty (a cluster node keeps its nodes.conf, so it
    /// rejoins its cluster).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Runs one command; `None` if the server does not answer.
    pub fn try_query(&self, args: &[&str]) -> Option<redis::Value> {
        query_port_as(self.port, self.password.as_deref(), args)
    }

    /// Requires `password` of every client from now on (`requirepass`); the test's own
    /// queries give it.
    pub fn set_password(&mut self, password: &str) {
        self.query(&["CONFIG", "SET", "requirepass", password]);
        self.password = Some(password.to_owned());
    }

    /// Runs one command and returns its reply as text.
    pub fn query(&self, args: &[&str]) -> String {
        let value = self
            .try_query(args)
            .unwrap_or_else(|| panic!("redis {} did not answer {args:?}", self.port));
        redis::from_redis_value::<String>(value).unwrap_or_default()
    }

    /// Number of keys held.
    pub fn dbsize(&self) -> u64 {
        self.try_query(&["DBSIZE"])
            .and_then(|value| redis::from_redis_value::<u64>(value).ok())
            .expect("DBSIZE")
    }

    /// Clients connected now, from INFO clients (the connection asking counts too).
    pub fn connected_clients(&self) -> u64 {
        self.query(&["INFO", "clients"])
            .lines()
            .find_map(|line| line.strip_prefix("connected_clients:"))
            .and_then(|count| count.trim().parse().ok())
            .expect("INFO clients")
    }

    /// Calls of tollgate's counter code so far: by function or by script.
    pub fn script_calls(&self) -> u64 {
        ["fcall", "evalsha", "eval"]
            .iter()
            .map(|command| self.calls(command))
            .sum()
    }

    /// Calls of a command so far, from INFO commandstats (`evalsha`, `eval`, `get`…).
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.query(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }

    fn wait_for(&self, ready: impl Fn(&Self) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if ready(self) {
                return;
            }
            sleep(Duration::from_millis(20));
        }
        panic!("redis {} never came {what}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of `masters` masters with `replicas` replicas each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> Self {
        require("redis-cli", "redis-tools");
        let tmp = std::sync::Arc::new(tempfile::tempdir().expect("temp dir"));
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::spawn(
                    free_node_port(),
                    std::sync::Arc::clone(&tmp),
                    true,
                    Vec::new(),
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_until_formed();
        cluster
    }

    /// Until every node reports the cluster ok and knows every other node, and every replica
    /// is in sync with its master.
    pub fn wait_until_formed(&self) {
        let total = self.nodes.len();
        for node in self.nodes.iter().filter(|node| node.child.is_some()) {
            node.wait_for(
                |node| {
                    let info = node
                        .try_query(&["CLUSTER", "INFO"])
                        .and_then(|v| redis::from_redis_value::<String>(v).ok())
                        .unwrap_or_default();
                    info.contains("cluster_state:ok")
                        && info.contains(&format!("cluster_known_nodes:{total}"))
                },
                "into the formed cluster",
            );
            node.wait_for(
                |node| {
                    let info = node.query(&["INFO", "replication"]);
                    info.contains("role:master") || info.contains("master_link_status:up")
                },
                "in sync with its master",
            );
        }
    }

    pub fn url(&self) -> String {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis-cluster://{}", addresses.join(","))
    }

    /// The running nodes that are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|node| node.child.is_some())
            .filter(|node| is_master(node))
            .collect()
    }

    /// The running master that serves `slot`.
    pub fn owner_of(&self, slot: u16) -> &RedisServer {
        let ranges = match self.masters()[0].try_query(&["CLUSTER", "SLOTS"]) {
            Some(redis::Value::Array(ranges)) => ranges,
            other => panic!("CLUSTER SLOTS answered {other:?}"),
        };
        let port = ranges
            .iter()
            .find_map(|range| match range {
                redis::Value::Array(fields) => match fields.as_slice() {
                    [
                        redis::Value::Int(start),
                        redis::Value::Int(end),
                        redis::Value::Array(master),
                        ..,
                    ] if (*start..=*end).contains(&i64::from(slot)) => match master.get(1) {
                        Some(redis::Value::Int(port)) => Some(*port),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            })
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        self.nodes
            .iter()
            .find(|node| i64::from(node.port) == port)
            .expect("the owner is one of our nodes")
    }

    /// Moves `slot`, and the keys in it, to master `to`, the way a resharding does: importing
    /// and migrating, MIGRATE of each key, then the new owner announced to every master.
    pub fn move_slot(&self, slot: u16, to: &RedisServer) {
        let from = self.owner_of(slot);
        let (slot, to_port) = (slot.to_string(), to.port.to_string());
        let (from_id, to_id) = (
            from.query(&["CLUSTER", "MYID"]),
            to.query(&["CLUSTER", "MYID"]),
        );
        to.query(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        from.query(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        let keys: Vec<String> = from
            .try_query(&["CLUSTER", "GETKEYSINSLOT", &slot, "100000"])
            .and_then(|keys| redis::from_redis_value(keys).ok())
            .expect("CLUSTER GETKEYSINSLOT");
        for key in &keys {
            from.query(&["MIGRATE", "127.0.0.1", &to_port, key, "0", "5000"]);
        }
        for master in self.masters() {
            master.query(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
    }

    /// Calls of tollgate's counter code over every running node: by function or by script.
    pub fn script_calls(&self) -> u64 {
        ["fcall", "evalsha", "eval"]
            .iter()
            .map(|command| self.calls(command))
            .sum()
    }

    /// Sum of a command's calls over every running node.
    pub fn calls(&self, command: &str) -> u64 {
        self.nodes
            .iter()
            .filter(|node| node.child.is_some())
            .map(|node| node.calls(command))
            .sum()
    }
}

fn is_master(node: &RedisServer) -> bool {
    node.try_query(&["ROLE"])
        .and_then(|value| match value {
            redis::Value::Array(items) => items.into_iter().next(),
            _ => None,
        })
        .and_then(|role| redis::from_redis_value::<String>(role).ok())
        .is_some_and(|role| role == "master")
}

/// A master, one replica and three redis-sentinel processes watching them as `mymaster`
/// (quorum 2, a master down after 1 s), each stopped when this drops.
pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<(u16, Child)>,
    _tmp: tempfile::TempDir,
}

/// The master's name the sentinels know.
pub const SENTINEL_MASTER: &str = "mymaster";

impl RedisSentinels {
    pub fn start() -> Self {
        require("redis-sentinel", "redis-sentinel");
        let master = RedisServer::start();
        let replica = RedisServer::start();
        replica.replicate(&master);
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut watched = Self {
            master,
            replica,
            sentinels: Vec::new(),
            _tmp: tmp,
        };
        for _ in 0..3 {
            let port = free_port();
            let conf = watched._tmp.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 4000\n",
                    watched.master.port
                ),
            )
            .expect("sentinel config");
            let child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-sentinel");
            watched.sentinels.push((port, child));
        }
        // A failover needs every sentinel to know the replica and the other sentinels.
        watched.wait_until(
            |sentinels| {
                sentinels.ports().iter().all(|&port| {
                    let state = sentinel_query(port, &["SENTINEL", "MASTER", SENTINEL_MASTER]);
                    state.contains("num-slaves 1") && state.contains("num-other-sentinels 2")
                })
            },
            "to know the replica and each other",
        );
        watched
    }

    fn ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(port, _)| *port).collect()
    }

    /// `redis-sentinel://…/mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis-sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// The master's port as the first sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        let port = self.ports()[0];
        let named = sentinel_query(
            port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
        );
        named.split_whitespace().last()?.parse().ok()
    }

    pub fn wait_until(&self, done: impl Fn(&Self) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if done(self) {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        panic!("the sentinels never came {what}");
    }
}

/// One command to whatever Redis (or sentinel) listens on `port`; `None` if it does not
/// answer.
fn query_port(port: u16, args: &[&str]) -> Option<redis::Value> {
    query_port_as(port, None, args)
}

fn query_port_as(port: u16, password: Option<&str>, args: &[&str]) -> Option<redis::Value> {
    let auth = password.map_or_else(String::new, |password| format!(":{password}@"));
    let client = redis::Client::open(format!("redis://{auth}127.0.0.1:{port}")).ok()?;
    let mut connection = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command.query(&mut connection).ok()
}

/// A sentinel's reply, flattened to words (`key value key value …`); empty if it does not
/// answer.
fn sentinel_query(port: u16, args: &[&str]) -> String {
    query_port(port, args)
        .and_then(|value| redis::from_redis_value::<Vec<String>>(value).ok())
        .map(|words| words.join(" "))
        .unwrap_or_default()
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
