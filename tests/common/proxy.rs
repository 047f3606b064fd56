//! A TCP proxy whose target can be changed while it runs: new connections go to the new
//! target, the open ones stay where they were, as a DNS name, a Kubernetes Service or a
//! managed Redis endpoint repointed at a failover behaves. Given several targets, it deals
//! new connections to them in turn, as a Kubernetes Service spreads them over its pods. It can also stall the connections
//! open at a moment (kept open, nothing forwarded), as a wedged connection or a half-dead
//! peer behaves, while new ones work.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    targets: Arc<Mutex<Vec<SocketAddr>>>,
    /// Bumped by `stall_open`: connections accepted before stop forwarding.
    stalls: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let targets = Arc::new(Mutex::new(vec![target]));
        let (stalls, watching) = watch::channel(0);
        let current = Arc::clone(&targets);
        let accept = tokio::spawn(async move {
            let mut open = tokio::task::JoinSet::new();
            let mut dealt = 0;
            while let Ok((client, _)) = listener.accept().await {
                let to = {
                    let targets = current.lock().unwrap();
                    targets[dealt % targets.len()]
                };
                dealt += 1;
                let mut stalled = watching.clone();
                stalled.mark_unchanged();
                open.spawn(forward(client, to, stalled));
            }
        });
        Self {
            addr,
            targets,
            stalls,
            accept,
        }
    }

    /// Sends new connections to `target`.
    pub fn point_at(&self, target: SocketAddr) {
        *self.targets.lock().unwrap() = vec![target];
    }

    /// Deals new connections to `target` too, in turn with the others.
    pub fn add_target(&self, target: SocketAddr) {
        self.targets.lock().unwrap().push(target);
    }

    /// Stops forwarding on every connection open now, without closing them.
    pub fn stall_open(&self) {
        self.stalls.send_modify(|stalls| *stalls += 1);
    }
}

/// Forwards until either side closes, or, once `stalled` changes, holds both sockets open
/// and silent until the proxy drops.
async fn forward(mut client: TcpStream, to: SocketAddr, mut stalled: watch::Receiver<u64>) {
    let Ok(mut server) = TcpStream::connect(to).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
        _ = stalled.changed() => {}
    }
    std::future::pending::<()>().await;
    drop((client, server));
}

/// Closes the listener and every connection it carries.
impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
