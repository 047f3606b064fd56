//! Where the server listens: the listeners' flags (`ListenOptions`), and the sockets bound
//! before serving (`Listeners`), each failure naming the flag that chose it.

use std::net::SocketAddr;
use std::path::Path;

use tokio::net::{TcpListener, UnixListener};

use super::grpc::GrpcListener;

/// Where the server listens: flags of `tollgate serve`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = "Listeners and TLS")]
pub struct ListenOptions {
    /// gRPC listen address (RLS v3 and gRPC health): `HOST:PORT`, or `:PORT` for every
    /// address of the host, IPv6 and IPv4.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = ":8081", value_parser = crate::options::listen_addr)]
    pub grpc_addr: SocketAddr,

    /// Serve gRPC on this Unix socket instead of --grpc-addr (plaintext; for a sidecar on the
    /// same host; the reference's GRPC_UDS).
    #[arg(long, env = "TOLLGATE_GRPC_UDS")]
    pub grpc_uds: Option<std::path::PathBuf>,

    /// HTTP admin listen address (/healthcheck, /healthz, /readyz, /json, /config), as
    /// --grpc-addr.
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = ":8080", value_parser = crate::options::listen_addr)]
    pub http_addr: SocketAddr,

    /// Also serve the reference's debug listener on this address (/rlconfig, the rules in the
    /// reference's form, which `egctl config ratelimit` reads; /stats; the reference's
    /// DEBUG_HOST:DEBUG_PORT, 6070), as --grpc-addr. Off by default.
    #[arg(long, env = "TOLLGATE_DEBUG_ADDR", value_parser = crate::options::listen_addr)]
    pub debug_addr: Option<SocketAddr>,
}

impl Default for ListenOptions {
    fn default() -> Self {
        crate::options::defaults()
    }
}

impl ListenOptions {
    /// Refuses two listeners on one address (port 0, "any free port", excepted), which would
    /// otherwise fail as if another process held it.
    pub fn check_distinct(&self, metrics: Option<SocketAddr>) -> Result<(), SameAddress> {
        let grpc = self
            .grpc_uds
            .is_none()
            .then_some(("--grpc-addr", self.grpc_addr));
        let named: Vec<(&'static str, SocketAddr)> = grpc
            .into_iter()
            .chain([("--http-addr", self.http_addr)])
            .chain(metrics.map(|addr| ("--metrics-addr", addr)))
            .chain(self.debug_addr.map(|addr| ("--debug-addr", addr)))
            .collect();
        for (index, (first, addr)) in named.iter().enumerate() {
            let clash = named[index + 1..]
                .iter()
                .find(|(_, other)| addr.port() != 0 && overlap(*addr, *other));
            if let Some((second, _)) = clash {
                return Err(SameAddress {
                    first,
                    second,
                    addr: *addr,
                });
            }
        }
        Ok(())
    }
}

/// Whether two listen addresses would take the same port: equal, or one of them every
/// address of the host.
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Two listeners named for one address.
#[derive(Debug, thiserror::Error)]
#[error("{first} and {second} both name {addr}: each listener needs a port of its own")]
pub struct SameAddress {
    first: &'static str,
    second: &'static str,
    addr: SocketAddr,
}

/// The two bound listeners.
pub struct Listeners {
    pub grpc: GrpcListener,
    pub http: TcpListener,
    /// The metrics alone, with the path they are served at (`--metrics-addr`).
    pub metrics: Option<(TcpListener, String)>,
    /// The reference's debug listener (`--debug-addr`).
    pub debug: Option<TcpListener>,
}

impl Listeners {
    /// Binds both; an address already in use, or not this host's, names its flag.
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> Result<Self, BindError> {
        Ok(Self {
            grpc: GrpcListener::Tcp(listen("--grpc-addr", grpc).await?),
            http: listen("--http-addr", http).await?,
            metrics: None,
            debug: None,
        })
    }

    /// gRPC on the Unix socket at `path` (a socket left there by an earlier run is replaced),
    /// HTTP on `http`.
    pub fn bind_unix(
        path: &Path,
        http: SocketAddr,
    ) -> impl Future<Output = Result<Self, BindError>> {
        let grpc = listen_unix(path);
        async move {
            Ok(Self {
                grpc: GrpcListener::Unix(grpc?),
                http: listen("--http-addr", http).await?,
                metrics: None,
                debug: None,
            })
        }
    }

    /// Also a listener serving only the metrics, at `path`.
    pub async fn with_metrics(mut self, addr: SocketAddr, path: String) -> Result<Self, BindError> {
        self.metrics = Some((listen("--metrics-addr", addr).await?, path));
        Ok(self)
    }

    /// Also the reference's debug listener.
    pub async fn with_debug(mut self, addr: SocketAddr) -> Result<Self, BindError> {
        self.debug = Some(listen("--debug-addr", addr).await?);
        Ok(self)
    }
}

fn listen_unix(path: &Path) -> Result<UnixListener, BindError> {
    use std::os::unix::fs::FileTypeExt as _;
    let stale = std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket());
    if stale {
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(|error| BindError {
        flag: "--grpc-uds",
        addr: path.display().to_string(),
        hint: match error.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; something else is there: remove it or choose another path"
            }
            std::io::ErrorKind::NotFound => "; its directory does not exist",
            std::io::ErrorKind::PermissionDenied => "; no permission to create it there",
            _ => "",
        },
        error,
    })
}

/// Binds `addr`. Every address of the host (`[::]`) is both IPv6 and IPv4 (whatever the
/// host's `bindv6only`), or IPv4 alone on a host without IPv6.
async fn listen(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    let bound = if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED {
        match dual_stack(addr) {
            Err(error) if is_ipv6_missing(&error) => {
                let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
                tracing::info!(flag, %v4, "no IPv6 on this host: listening on IPv4 alone");
                TcpListener::bind(v4).await
            }
            bound => bound,
        }
    } else {
        TcpListener::bind(addr).await
    };
    bound.map_err(|error| BindError {
        flag,
        addr: addr.to_string(),
        hint: match error.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; another process listens there: stop it or choose another port"
            }
            std::io::ErrorKind::AddrNotAvailable => "; the address is not one of this host's",
            std::io::ErrorKind::PermissionDenied => "; ports below 1024 need privileges",
            _ => "",
        },
        error,
    })
}

/// `[::]:port` for IPv6 and IPv4 connections alike.
fn dual_stack(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, None)?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Whether binding an IPv6 socket failed because the host has no IPv6.
fn is_ipv6_missing(error: &std::io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    error.raw_os_error() == Some(EAFNOSUPPORT)
        || error.kind() == std::io::ErrorKind::AddrNotAvailable
}

/// A listener that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {addr}: cannot listen: {error}{hint}")]
pub struct BindError {
    pub flag: &'static str,
    pub addr: String,
    hint: &'static str,
    // In the message, not a `source`: the one line says it all.
    error: std::io::Error,
}
