//! Leases' metrics (storage/lease.rs): leases taken and budget leased, budget returned,
//! decisions answered from slices, decisions of leasable counters that went to the store
//! while a lease was in flight, failed lease calls, counters followed.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Default)]
pub struct LeaseMetrics {
    pub leases: Counter,
    pub leased_hits: Counter,
    pub returned_hits: Counter,
    pub from_slice: Counter,
    /// Requests on leasable counters only, decided by the store while a lease or return of
    /// one of them was in flight: mostly, the slice ran out before the next one came.
    pub while_leasing: Counter,
    pub failed: Counter,
    pub followed: Gauge,
}

impl LeaseMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "lease_calls",
            "Leases taken from the store (calls that granted budget to this replica)",
            self.leases.clone(),
        );
        registry.register(
            "lease_leased_hits",
            "Hits of budget leased to this replica",
            self.leased_hits.clone(),
        );
        registry.register(
            "lease_returned_hits",
            "Hits of leased budget this replica gave back unused",
            self.returned_hits.clone(),
        );
        registry.register(
            "lease_slice_decisions",
            "Requests answered from this replica's leased slices, without a store call",
            self.from_slice.clone(),
        );
        registry.register(
            "lease_waited_decisions",
            "Requests on leased counters sent to the store while a lease or return of one was in flight (mostly: its slice ran out first)",
            self.while_leasing.clone(),
        );
        registry.register(
            "lease_errors",
            "Lease and return calls that failed",
            self.failed.clone(),
        );
        registry.register(
            "lease_followed_counters",
            "Leasable counters whose demand this replica follows",
            self.followed.clone(),
        );
    }

    /// A lease answered: budget granted (none when the window had none left).
    pub fn taken(&self, granted: u64) {
        if granted > 0 {
            self.leases.inc();
            self.leased_hits.inc_by(granted);
        }
    }

    /// A return answered: `back` hits went back.
    pub fn returned(&self, back: u64) {
        self.returned_hits.inc_by(back);
    }

    pub fn followed(&self, counters: usize) {
        self.followed
            .set(i64::try_from(counters).unwrap_or(i64::MAX));
    }
}
