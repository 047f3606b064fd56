//! Leases on Redis (`storage::CounterLease`): a lease and its return are one call each
//! (`call::Layout::Lease`, `LeaseReturn`), within the store timeout, under this replica's
//! holder name.

use super::RedisStore;
use super::call::{Op, lease, lease_return};
use crate::clock::Micros;
use crate::storage::{CounterLease, Grant, Hit, StoreError};

#[tonic::async_trait]
impl CounterLease for RedisStore {
    fn instant(&self, _: &Hit) -> Result<Micros, StoreError> {
        self.now()
    }

    async fn lease(&self, hit: &Hit, at: Micros, held: u64) -> Result<Grant, StoreError> {
        let connection = self.pool.connection()?;
        let op = Op::Lease {
            at,
            holder: &self.holder,
            held,
        };
        let call = self.call(op, std::slice::from_ref(hit), None, true);
        let sent = tokio::time::timeout(self.options.timeout, connection.send_call(&call));
        let reply = self.within_timeout(sent.await)?;
        lease::decode(&call, reply)
    }

    async fn give_back_lease(&self, hit: &Hit, at: Micros) -> Result<u64, StoreError> {
        let connection = self.pool.connection()?;
        let op = Op::LeaseReturn {
            at,
            holder: &self.holder,
        };
        let call = self.call(op, std::slice::from_ref(hit), None, true);
        let sent = tokio::time::timeout(self.options.timeout, connection.send_call(&call));
        let reply = self.within_timeout(sent.await)?;
        lease_return::decode(&call, reply)
    }
}

impl RedisStore {
    /// A call's result within the store timeout, its failure learnt from (`treat`).
    fn within_timeout<T>(
        &self,
        sent: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        let result = sent.unwrap_or(Err(StoreError::Timeout(self.options.timeout)));
        match &result {
            Ok(_) => self.doctor.succeeded(),
            Err(error) => self.treat(error),
        }
        result
    }
}
