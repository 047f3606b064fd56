//! Leases on Redis (`storage::CounterLease`): a lease and its return are one call each
//! (`call::Layout::Lease`; a fixed window's return `LeaseReturn`, a bucket's `GiveBack`),
//! within the store timeout, under this replica's holder name.

use super::RedisStore;
use super::call::{Op, lease, lease_return};
use crate::algorithm::{State, given_back};
use crate::clock::Micros;
use crate::storage::{CounterLease, Grant, Hit, StoreError};

#[tonic::async_trait]
impl CounterLease for RedisStore {
    async fn lease(
        &self,
        hit: &Hit,
        at: Micros,
        held: u64,
        life: Micros,
    ) -> Result<Grant, StoreError> {
        let connection = self.pool.connection()?;
        let op = Op::Lease {
            at,
            holder: &self.holder,
            held,
            life,
        };
        let call = self.call(op, std::slice::from_ref(hit), None, true);
        let sent = tokio::time::timeout(self.options.timeout, connection.send_call(&call));
        let reply = self.within_timeout(sent.await)?;
        lease::decode(&call, reply)
    }

    async fn give_back_lease(
        &self,
        hit: &Hit,
        at: Micros,
        after: Option<&State>,
    ) -> Result<u64, StoreError> {
        let connection = self.pool.connection()?;
        let Some(after) = after else {
            let op = Op::LeaseReturn {
                at,
                holder: &self.holder,
            };
            let call = self.call(op, std::slice::from_ref(hit), None, true);
            let sent = tokio::time::timeout(self.options.timeout, connection.send_call(&call));
            let reply = self.within_timeout(sent.await)?;
            return lease_return::decode(&call, reply);
        };
        // A bucket's hits go back as a vetoed request's do: only while the bucket is as the
        // lease left it, and never creating it.
        let expected = [Some(after.clone())];
        let op = Op::GiveBack {
            at,
            expected: &expected,
        };
        let call = self.call(op, std::slice::from_ref(hit), None, false);
        let sent = tokio::time::timeout(self.options.timeout, connection.call(&call));
        let reply = self.within_timeout(sent.await)?;
        // Given back if the bucket is now as the lease left it with the hits back.
        let returned = given_back::give_back(&hit.params, Some(after), Some(after), at, hit.hits);
        let now = reply.after.first().and_then(Option::as_ref);
        Ok(if returned.is_some() && now == returned.as_ref() {
            hit.hits
        } else {
            0
        })
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
