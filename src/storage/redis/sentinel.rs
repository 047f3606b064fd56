//! Redis behind Sentinel: the sentinels say which server is the master, and after a failover
//! they name another. The connection follows: any failed call (the old master gone, or back
//! as a read-only replica) makes it ask the sentinels again, at most one question at a time,
//! and move to the new master once they name it. Calls in between fail fast, as any call to
//! an unreachable Redis does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{RedisError, TlsMode};

use super::url::RedisSpec;

/// The connection to the master the sentinels name.
pub struct SentinelLink {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: ArcSwap<Master>,
    asking: AtomicBool,
    config: ConnectionManagerConfig,
    /// How long the sentinels may take to name the master.
    connect_timeout: Duration,
}

struct Master {
    address: String,
    connection: ConnectionManager,
}

/// How often, at most, the sentinels are asked while calls keep failing.
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(250);

impl SentinelLink {
    /// Asks the sentinels for the master and connects to it.
    pub async fn open(
        spec: &RedisSpec,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> Result<Arc<Self>, RedisError> {
        let Some(sentinel) = &spec.sentinel else {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "not a sentinel URL",
            )));
        };
        let mut node = SentinelNodeConnectionInfo::default();
        if let Some(settings) = spec.master_settings()? {
            node = node.set_redis_connection_info(settings);
        }
        if sentinel.tls {
            node = node.set_tls_mode(TlsMode::Secure);
        }
        let mut client = SentinelClient::build(
            spec.connection_infos()?,
            sentinel.master.clone(),
            Some(node),
            SentinelServerType::Master,
        )?;
        let master = connect_master(&mut client, &config, connect_timeout).await?;
        Ok(Arc::new(Self {
            sentinels: tokio::sync::Mutex::new(client),
            master: ArcSwap::from_pointee(master),
            asking: AtomicBool::new(false),
            config,
            connect_timeout,
        }))
    }

    /// The connection to the master as last known.
    pub fn connection(&self) -> ConnectionManager {
        self.master.load().connection.clone()
    }

    /// A call failed: ask the sentinels where the master is, in the background, unless a
    /// question is already out; reconnect if they name another server.
    pub fn follow_failover(self: &Arc<Self>) {
        if self.asking.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            link.ask().await;
            tokio::time::sleep(ASK_AGAIN_AFTER).await;
            link.asking.store(false, Ordering::Release);
        });
    }

    async fn ask(&self) {
        let mut sentinels = self.sentinels.lock().await;
        let client =
            match tokio::time::timeout(self.connect_timeout, sentinels.async_get_client()).await {
                Ok(Ok(client)) => client,
                Ok(Err(error)) => {
                    tracing::warn!(%error, "the sentinels name no reachable master yet");
                    return;
                }
                Err(_) => {
                    tracing::warn!("the sentinels did not answer in time");
                    return;
                }
            };
        let address = client.get_connection_info().addr().to_string();
        if address == self.master.load().address {
            return;
        }
        match client
            .get_connection_manager_with_config(self.config.clone())
            .await
        {
            Ok(connection) => {
                tracing::warn!(master = %address, "Redis failed over; following the sentinels to the new master");
                self.master.store(Arc::new(Master {
                    address,
                    connection,
                }));
            }
            Err(error) => {
                tracing::warn!(master = %address, %error, "cannot reach the new master yet")
            }
        }
    }
}

async fn connect_master(
    sentinels: &mut SentinelClient,
    config: &ConnectionManagerConfig,
    connect_timeout: Duration,
) -> Result<Master, RedisError> {
    let client = tokio::time::timeout(connect_timeout, sentinels.async_get_client())
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    let address = client.get_connection_info().addr().to_string();
    let connection = client
        .get_connection_manager_with_config(config.clone())
        .await?;
    Ok(Master {
        address,
        connection,
    })
}
