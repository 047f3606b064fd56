//! Test helpers: an in-process tollgate on 127.0.0.1:0 with a hand-driven clock, a gRPC client,
//! a tiny HTTP/1.1 client, request builders, and a guard for a `tollgate` child process.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod certs;
pub mod envoy;
pub mod prometheus;
pub mod proxy;
pub mod redis_process;
pub mod rlqs;
pub mod rng;
pub mod sliding_window;
pub mod stored;
pub mod xds;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::clock::ManualClock;
use tollgate::metrics::Metrics;
use tollgate::pb::{self, rate_limit_descriptor as desc, rate_limit_response as rls};
use tollgate::server::{self, Listeners, Options, ServerError};
use tollgate::storage::Store;
use tollgate::storage::memory::MemoryStore;
use tollgate::storage::options::{StoreOptions, StoreSpec};
use tollgate::storage::redis::{RedisSpec, RedisStore};
use tollgate::storage::stack::remote_stack;
use tonic::transport::Channel;

use redis_process::{RedisCluster, RedisSentinels, RedisServer};

/// Which store a test server counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    /// A standalone redis-server started for the test.
    Redis,
    /// The same, reached by its Unix socket.
    RedisSocket,
    /// A 3-master Redis Cluster started for the test.
    Cluster,
    /// Two standalone redis-servers: per-second limits in the second (`--store-per-second`).
    PerSecond,
    /// A master and a replica watched by three redis-sentinels, reached through them.
    Sentinel,
    /// A 3-master, 3-replica Redis Cluster (for failover).
    ReplicatedCluster,
}

/// The Redis processes behind a test server, stopped when it drops.
pub enum Backing {
    None,
    Redis(RedisServer),
    Cluster(RedisCluster),
    /// The main Redis and the per-second one.
    PerSecond(RedisServer, RedisServer),
    Sentinel(RedisSentinels),
}

/// A scenario (`async fn name(store: StoreKind)`, in tests/scenarios/) runs once per store:
/// each test target's `main.rs` defines `on_every_store!` for the stores it has (the fast
/// target the memory store, the redis target a Redis and a 3-master cluster), and the
/// scenario files invoke it with their scenarios. `memory_only!` wraps what a scenario file
/// tests outside the scenarios, once, in the fast target.
#[macro_export]
macro_rules! scenarios_on {
    ($stores:tt ; $($name:ident),* $(,)?) => {
        $($crate::scenarios_on!(@one $stores $name);)*
    };
    (@one [$($test:ident = $kind:ident),+] $name:ident) => {
        mod $name {
            use super::common::StoreKind;
            $(
                #[tokio::test]
                async fn $test() {
                    super::$name(StoreKind::$kind).await
                }
            )+
        }
    };
}

/// 2222 s after the epoch, the instant the reference's tests use: a minute window has 58 s
/// left, a second window 1 s.
pub const T2222: u64 = 2_222;

/// A running in-process server; stopped (and awaited) by `stop`, or signalled on drop.
pub struct TestServer {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub clock: ManualClock,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
    _dir: tempfile::TempDir,
    /// Dropped after the server is signalled to stop.
    pub backing: Backing,
}

pub struct Setup {
    pub options: Options,
    pub max_keys: usize,
    pub store: StoreKind,
    /// Bound on one Redis call; generous by default for a loaded machine.
    pub store_timeout: Duration,
    /// Watch the test's config directory (`Some(poll)`: poll instead of events).
    pub reload: Option<Option<Duration>>,
    /// A store of the test's own making, instead of `store`'s.
    pub own_store: Option<Store>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            options: Options::default(),
            max_keys: 100_000,
            store: StoreKind::Memory,
            store_timeout: Duration::from_secs(2),
            reload: None,
            own_store: None,
        }
    }
}

/// Server options that count every charge, denied or not, as the reference does
/// (`--count-denied`).
pub fn counting_denied() -> Options {
    let mut options = Options::default();
    options.modes.count_denied = true;
    options
}

/// Starts a server on `store` with the clock at `T2222`.
pub async fn start_on(store: StoreKind, files: &[(&str, &str)]) -> TestServer {
    start_with(
        files,
        Setup {
            store,
            ..Setup::default()
        },
    )
    .await
}

/// A Redis store on `url` that takes its time from `clock`, as the contract tests need.
pub fn redis_store(url: &str, clock: &ManualClock, timeout: Duration, metrics: &Metrics) -> Store {
    let spec = RedisSpec::parse(url, None).unwrap().unwrap();
    let options = StoreOptions {
        timeout,
        deny_cache_size: 1_000,
        redis_connections: 2,
        clock: Some(Arc::new(clock.clone())),
        ..StoreOptions::default()
    };
    let store = RedisStore::start(spec, options.clone());
    remote_stack(store, &options, metrics)
}

fn build_store(setup: &Setup, clock: &ManualClock) -> (Store, Backing) {
    let metrics = &setup.options.metrics;
    match setup.store {
        StoreKind::Memory => (
            Store::in_process(
                MemoryStore::new(setup.max_keys, Arc::new(clock.clone()))
                    .with_metrics(metrics)
                    .start(),
            ),
            Backing::None,
        ),
        StoreKind::Redis | StoreKind::RedisSocket => {
            let server = RedisServer::start();
            let url = match setup.store {
                StoreKind::RedisSocket => server.socket_url(),
                _ => server.url(),
            };
            let store = redis_store(&url, clock, setup.store_timeout, metrics);
            (store, Backing::Redis(server))
        }
        StoreKind::Sentinel => {
            let sentinels = RedisSentinels::start();
            let store = redis_store(&sentinels.url(), clock, setup.store_timeout, metrics);
            (store, Backing::Sentinel(sentinels))
        }
        StoreKind::PerSecond => {
            let (main, fast) = (RedisServer::start(), RedisServer::start());
            let options = StoreOptions {
                timeout: setup.store_timeout,
                deny_cache_size: 1_000,
                clock: Some(Arc::new(clock.clone())),
                ..StoreOptions::default()
            };
            let spec = StoreSpec::RedisPerSecond(
                RedisSpec::parse(&main.url(), None).unwrap().unwrap(),
                RedisSpec::parse(&fast.url(), None).unwrap().unwrap(),
            );
            let store = tollgate::storage::stack::build_store(&spec, &options, metrics);
            (store, Backing::PerSecond(main, fast))
        }
        StoreKind::Cluster | StoreKind::ReplicatedCluster => {
            let replicas = usize::from(setup.store == StoreKind::ReplicatedCluster);
            let cluster = RedisCluster::start(3, replicas);
            let store = redis_store(&cluster.url(), clock, setup.store_timeout, metrics);
            (store, Backing::Cluster(cluster))
        }
    }
}

/// Starts a server with one config file per `(name, yaml)` and the clock at `T2222`.
pub async fn start(files: &[(&str, &str)]) -> TestServer {
    start_with(files, Setup::default()).await
}

pub async fn start_with(files: &[(&str, &str)], mut setup: Setup) -> TestServer {
    let dir = config_dir(files);
    if let Some(poll) = setup.reload {
        setup.options.reload = Some(tollgate::reload::ReloadOptions {
            load: tollgate::config::LoadOptions {
                allow_empty: files.is_empty(),
                ..Default::default()
            },
            dir: dir.path().to_owned(),
            poll,
        });
    }
    // An xDS test starts with no file: its rules come from the control plane.
    let load = tollgate::config::LoadOptions {
        allow_empty: files.is_empty(),
        ..Default::default()
    };
    let rules = tollgate::config::load(dir.path(), load).expect("test config is valid");
    let clock = ManualClock::at_seconds(T2222);
    let (store, backing) = match setup.own_store.take() {
        Some(store) => (store, Backing::None),
        None => build_store(&setup, &clock),
    };
    let server_needs_rules = setup.options.ready_needs_rules
        || (setup.options.xds.is_some() && !setup.options.serve_before_config);
    let listeners = Listeners::bind(loopback(), loopback())
        .await
        .expect("bind loopback");
    let grpc = listeners.grpc.local_addr().expect("grpc addr");
    let http = listeners.http.local_addr().expect("http addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server::run(rules, store, setup.options, listeners, async {
        let _ = stopped.await;
    }));
    let server = TestServer {
        grpc,
        http,
        clock,
        stop: Some(stop),
        task: Some(task),
        _dir: dir,
        backing,
    };
    // Not ready without a domain, or before a control plane's first rules, is the point of
    // those options: their tests wait themselves.
    if !server_needs_rules {
        server.wait_ready().await;
    }
    server
}

pub fn config_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, yaml) in files {
        std::fs::write(dir.path().join(name), yaml).expect("write config");
    }
    dir
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl TestServer {
    /// The config directory the server was started with.
    pub fn config_dir(&self) -> &Path {
        self._dir.path()
    }

    pub async fn client(&self) -> pb::RateLimitServiceClient<Channel> {
        pb::RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
    }

    pub async fn call(
        &self,
        request: pb::RateLimitRequest,
    ) -> Result<pb::RateLimitResponse, tonic::Status> {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Calls and expects success.
    pub async fn ok(&self, request: pb::RateLimitRequest) -> pb::RateLimitResponse {
        self.call(request).await.expect("call succeeds")
    }

    pub async fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http(self.http, method, path, body).await
    }

    /// Waits until /readyz says ready (the store probe runs right after start).
    /// Until ready with its store answering (with `--on-store-error allow|deny` it is ready
    /// before that).
    async fn wait_ready(&self) {
        for _ in 0..500 {
            if self.http("GET", "/readyz", "").await == (200, "OK\nstore: up\n".to_owned()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("server never became ready");
    }

    /// Triggers shutdown and waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        self.trigger_stop();
        let task = self.task.take().expect("stopped once");
        task.await.expect("server task")
    }

    pub fn trigger_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub fn take_task(&mut self) -> JoinHandle<Result<(), ServerError>> {
        self.task.take().expect("task present")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.trigger_stop();
    }
}

/// An HTTP response: status, headers (names lower-cased) and body.
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// A GET with extra request headers (`Connection: close`).
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    exchange(addr, request).await
}

/// A minimal HTTP/1.1 exchange (`Connection: close`): returns the status and the body.
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(addr, method, path, body, &[]).await
}

/// `http` with extra request headers.
pub async fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let response = exchange(addr, request).await;
    (response.status, response.body)
}

/// Sends `request` and reads the whole response.
pub async fn exchange(addr: SocketAddr, request: String) -> HttpResponse {
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).expect("connect http");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream.write_all(request.as_bytes()).expect("write http");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read http");
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
            .collect();
        let chunked = headers
            .iter()
            .any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        };
        HttpResponse {
            status,
            headers,
            body,
        }
    })
    .await
    .expect("http task")
}

/// A chunked body's content: each chunk's size in hex, its bytes, until a chunk of 0.
fn dechunk(mut body: &str) -> String {
    let mut content = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .expect("a chunk size");
        if size == 0 {
            break;
        }
        content.push_str(&rest[..size]);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    content
}

// === request builders ===

pub fn descriptor(pairs: &[(&str, &str)]) -> pb::RateLimitDescriptor {
    pb::RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(key, value)| desc::Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|pairs| descriptor(pairs)).collect(),
        hits_addend: 0,
    }
}

// === response readers ===

pub const OK: i32 = rls::Code::Ok as i32;
pub const OVER: i32 = rls::Code::OverLimit as i32;

/// A status as `(code, requests_per_unit/unit or "-", remaining, reset seconds or -1)`.
pub fn shape(status: &rls::DescriptorStatus) -> (i32, String, u32, i64) {
    let limit = status
        .current_limit
        .as_ref()
        .map_or("-".to_owned(), |limit| {
            let unit = rls::rate_limit::Unit::try_from(limit.unit).map_or("?", |u| u.as_str_name());
            format!("{}/{}", limit.requests_per_unit, unit)
        });
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(-1, |d| d.seconds);
    (status.code, limit, status.limit_remaining, reset)
}

pub fn shapes(response: &pb::RateLimitResponse) -> Vec<(i32, String, u32, i64)> {
    response.statuses.iter().map(shape).collect()
}

pub fn limited(code: i32, limit: &str, remaining: u32, reset: i64) -> (i32, String, u32, i64) {
    (code, limit.to_owned(), remaining, reset)
}

// === child processes ===

/// A `tollgate` child process, killed on drop.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn tollgate_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// Fails the test, saying what to install, when `binary` (from Debian's `package`) does not run.
pub fn require(binary: &str, package: &str) {
    // `--version`, or `version` for the tools that take a command (openssl).
    let found = ["--version", "version"].iter().any(|asked| {
        Command::new(binary)
            .arg(asked)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    });
    assert!(
        found,
        "{binary} not found: this test needs Debian's {package} package; run scripts/test, which installs it"
    );
}

/// The status of `GET /readyz` on `addr`, or `None` when the exchange fails (not listening
/// yet, refused, reset).
pub async fn readyz_status(addr: SocketAddr) -> Option<u16> {
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let request = format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        response.split(' ').nth(1)?.parse().ok()
    })
    .await
    .ok()
    .flatten()
}

/// A port free a moment ago on 127.0.0.1, for a process the test starts to bind.
pub fn free_port() -> u16 {
    free_ports_at(&[0])
}

/// Ports this test process has handed out: none is handed out twice.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A port `p` such that `p + offset` is free for every offset (a Redis Cluster node binds its
/// port and its bus, 10,000 above). Taken below the kernel's ephemeral range, where no outgoing
/// connection can take it between this choice and its server's bind (a port from the range,
/// as binding port 0 gives, was now and then taken by a connection of a test running beside,
/// and the server then failed to start), and never twice in one test process.
pub fn free_ports_at(offsets: &[u16]) -> u16 {
    const LOWEST: u16 = 10_000;
    let span = offsets.iter().copied().max().unwrap_or(0);
    let top = ephemeral_start().saturating_sub(span);
    let Some(width) = top.checked_sub(LOWEST).filter(|width| *width >= 1_000) else {
        panic!("no room for test ports below the ephemeral range (it starts at {top})");
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos())
        ^ std::process::id();
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let start = u32::from(LOWEST) + seed % u32::from(width);
    for step in 0..u32::from(width) {
        let base = u32::from(LOWEST) + (start - u32::from(LOWEST) + step) % u32::from(width);
        let base = u16::try_from(base).expect("below the ephemeral range");
        let ports: Vec<u16> = offsets.iter().map(|offset| base + offset).collect();
        let free = ports.iter().all(|port| {
            !handed_out.contains(port) && std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok()
        });
        if free {
            handed_out.extend(ports);
            return base;
        }
    }
    panic!("no free port between {LOWEST} and {top}")
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

pub fn spawn_serve(config: &Path, grpc: u16, http: u16) -> ChildGuard {
    spawn_serve_with(config, grpc, http, &[])
}

/// `tollgate serve` with extra flags.
pub fn spawn_serve_with(config: &Path, grpc: u16, http: u16, extra: &[&str]) -> ChildGuard {
    spawn_serve_logged(config, grpc, http, extra, Stdio::null())
}

/// `tollgate serve` with extra flags, its log to `log`.
pub fn spawn_serve_logged(
    config: &Path,
    grpc: u16,
    http: u16,
    extra: &[&str],
    log: impl Into<Stdio>,
) -> ChildGuard {
    let child = tollgate_bin()
        .args(["serve", "--config"])
        .arg(config)
        .args(extra)
        .args([
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--http-addr",
            &format!("127.0.0.1:{http}"),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn tollgate serve");
    ChildGuard(child)
}

/// A spawned `tollgate serve` and its ports.
pub struct Replica {
    pub grpc: u16,
    pub http: u16,
    pub process: ChildGuard,
}

impl Replica {
    /// Starts `tollgate serve` on free ports with `extra` flags; does not wait.
    pub fn spawn(config: &Path, extra: &[&str]) -> Self {
        Self::spawn_on(config, free_port(), extra)
    }

    /// Starts `tollgate serve` on free ports with `extra` flags, its log in `log`; does not
    /// wait.
    pub fn spawn_logged(config: &Path, extra: &[&str], log: &Path) -> Self {
        let (grpc, http) = (free_port(), free_port());
        let log = std::fs::File::create(log).expect("log file");
        Self {
            grpc,
            http,
            process: spawn_serve_logged(config, grpc, http, extra, log),
        }
    }

    /// Starts `tollgate serve` with its gRPC listener on `grpc`.
    pub fn spawn_on(config: &Path, grpc: u16, extra: &[&str]) -> Self {
        let http = free_port();
        Self {
            grpc,
            http,
            process: spawn_serve_with(config, grpc, http, extra),
        }
    }

    /// Sends SIGTERM, as a rolling restart does, and waits (up to 60 s) for the process to
    /// exit after draining its in-flight calls.
    pub async fn terminate(mut self) {
        let pid = self.process.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(
            sent.is_ok_and(|status| status.success()),
            "kill -TERM {pid}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while self
            .process
            .0
            .try_wait()
            .expect("wait for tollgate")
            .is_none()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "tollgate {pid} ignored SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http))
    }

    /// Whether `/readyz` says ready.
    /// A listener still starting (or one that refuses or resets the connection) is not ready;
    /// it is never a test failure by itself.
    pub async fn ready(&self) -> bool {
        readyz_status(self.http_addr()).await == Some(200)
    }

    /// Whether the process still runs: a server that exited (a port it could not bind, a
    /// flag refused) is told apart from one that is slow to be ready.
    fn liveness(&self) -> &'static str {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.process.0.id()));
        match stat
            .as_deref()
            .map(|stat| stat.rsplit(')').next().unwrap_or("").trim_start())
        {
            Ok(state) if state.starts_with('Z') => "the process has exited",
            Ok(_) => "the process still runs",
            Err(_) => "the process is gone",
        }
    }

    /// Waits (up to 60 s, for a loaded machine) until `/readyz` says ready.
    pub async fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.ready().await {
            assert!(
                std::time::Instant::now() < deadline,
                "tollgate on {} never became ready ({})",
                self.grpc,
                self.liveness()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn client(&self) -> pb::RateLimitServiceClient<Channel> {
        pb::RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .expect("connect")
    }
}

/// Seconds until the end of the current hour, as tollgate rounds them (up).
pub fn hour_left() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = now.as_micros() % 3_600_000_000;
    (3_600_000_000 - into).div_ceil(1_000_000) as u64
}

/// The limits are per hour: a scenario must not straddle an hour boundary.
pub async fn away_from_the_hour_boundary() {
    let left = hour_left();
    if left < 30 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// statsd counters received on a UDP socket, summed by name, until `expected` all match or
/// 20 s pass.
pub async fn receive_statsd(
    socket: &tokio::net::UdpSocket,
    expected: &[(&str, u64)],
) -> std::collections::BTreeMap<String, u64> {
    let mut totals = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut buffer = vec![0u8; 65_536];
    while !expected
        .iter()
        .all(|(name, count)| totals.get(*name) == Some(count))
    {
        let Ok(Ok(length)) = tokio::time::timeout_at(deadline, socket.recv(&mut buffer)).await
        else {
            break;
        };
        for line in String::from_utf8_lossy(&buffer[..length]).lines() {
            // name:count|c
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let count: u64 = rest.split('|').next().unwrap_or("").parse().unwrap();
            assert!(rest.ends_with("|c"), "a counter: {line}");
            *totals.entry(name.to_owned()).or_insert(0) += count;
        }
    }
    totals
}

/// statsd counters received over TCP (the reference's plain statsd), summed by name, until
/// `expected` all match or 20 s pass.
pub async fn receive_statsd_tcp(
    listener: &tokio::net::TcpListener,
    expected: &[(&str, u64)],
) -> std::collections::BTreeMap<String, u64> {
    use tokio::io::AsyncBufReadExt;
    let mut totals = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let Ok(Ok((stream, _))) = tokio::time::timeout_at(deadline, listener.accept()).await else {
        return totals;
    };
    let mut lines = tokio::io::BufReader::new(stream).lines();
    while !expected
        .iter()
        .all(|(name, count)| totals.get(*name) == Some(count))
    {
        let Ok(Ok(Some(line))) = tokio::time::timeout_at(deadline, lines.next_line()).await else {
            break;
        };
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        assert!(rest.ends_with("|c"), "a counter: {line}");
        let count: u64 = rest.trim_end_matches("|c").parse().unwrap();
        *totals.entry(name.to_owned()).or_insert(0) += count;
    }
    totals
}

/// `tollgate serve --env reference --store memory` with only the reference's variables: the
/// listeners on loopback `grpc` and `http`, the rules under `root/ratelimit/config` (as
/// RUNTIME_ROOT and RUNTIME_SUBDIRECTORY say), and `env`. Does not wait.
pub fn spawn_reference(root: &Path, grpc: u16, http: u16, env: &[(&str, String)]) -> ChildGuard {
    spawn_reference_with(root, grpc, http, env, &["--store", "memory"])
}

/// `spawn_reference` with `flags` after `serve --env reference` instead of the memory store.
pub fn spawn_reference_with(
    root: &Path,
    grpc: u16,
    http: u16,
    env: &[(&str, String)],
    flags: &[&str],
) -> ChildGuard {
    let child = tollgate_bin()
        .args(["serve", "--env", "reference"])
        .args(flags)
        .env_clear()
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        // The reference's debug listener (6070 by default) on any free port.
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .env("RUNTIME_ROOT", root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tollgate serve --env reference");
    ChildGuard(child)
}

/// A protobuf Value as JSON, to compare dynamic metadata with `json!`.
pub fn to_json(value: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match value.kind.as_ref() {
        Some(Kind::StringValue(s)) => serde_json::json!(s),
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::BoolValue(b)) => serde_json::json!(b),
        Some(Kind::ListValue(list)) => list.values.iter().map(to_json).collect(),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
    }
}

/// A protobuf Struct as a JSON object.
pub fn struct_json(s: &prost_types::Struct) -> serde_json::Value {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), to_json(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}
