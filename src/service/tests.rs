//! The RLS service on the memory store and on stores that fail or never answer: its answers,
//! the failure mode, and the client's deadline.

use super::*;
use crate::algorithm::Outcome;
use crate::clock::ManualClock;
use crate::limiter::Modes;
use crate::pb::RateLimitService as _;
use crate::pb::rate_limit_response as rls;
use crate::storage::memory::MemoryStore;
use crate::storage::{CounterReset, CounterStore, Hit, Store};
use arc_swap::ArcSwap;
use std::path::Path;
use std::time::Duration;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

struct DownStore;

#[tonic::async_trait]
impl CounterStore for DownStore {
    async fn apply(&self, _: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
}

#[tonic::async_trait]
impl CounterReset for DownStore {
    async fn forget(&self, _: &[Hit]) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
}

fn service<S: CounterStore + CounterReset>(store: Arc<S>) -> RlsService {
    service_with(store, ServiceOptions::default())
}

fn service_with<S: CounterStore + CounterReset>(
    store: Arc<S>,
    options: ServiceOptions,
) -> RlsService {
    let rules = crate::config::file::parse(Path::new("d.yaml"), RULES).unwrap();
    let rules = Arc::new(ArcSwap::from_pointee(crate::rules::RuleSet::new([rules])));
    RlsService::new(
        Arc::new(RateLimiter::new(
            rules,
            &Store::local(store),
            Modes::default(),
        )),
        options,
        Arc::new(Metrics::default()),
    )
}

fn request(value: &str) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![pb::RateLimitDescriptor {
            entries: vec![pb::rate_limit_descriptor::Entry {
                key: "k".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn the_handler_answers_with_the_limited_shape() {
    let clock = ManualClock::at_seconds(2222);
    let store = Arc::new(MemoryStore::new(100, Arc::new(clock)));
    let svc = service(store);
    let response = svc
        .should_rate_limit(Request::new(request("v")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, rls::Code::Ok as i32);
    let status = &response.statuses[0];
    assert_eq!(status.limit_remaining, 1);
    assert_eq!(
        status.duration_until_reset,
        Some(prost_types::Duration {
            seconds: 58,
            nanos: 0
        })
    );
    assert_eq!(
        status
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit)),
        Some((2, 2))
    );
}

#[tokio::test]
async fn the_store_error_marker_goes_upstream_unless_asked_for_on_the_response() {
    let marked = |place: StoreErrorHeader| async move {
        let options = ServiceOptions {
            on_store_error: OnStoreError::Allow,
            store_error_header: place,
            ..ServiceOptions::default()
        };
        let svc = service_with(Arc::new(DownStore), options);
        let response = svc.answer(request("v"), None).await.unwrap();
        let names = |headers: &[pb::HeaderValue]| -> Vec<String> {
            headers
                .iter()
                .map(|h| format!("{}: {}", h.key, h.value))
                .collect()
        };
        (
            names(&response.request_headers_to_add),
            names(&response.response_headers_to_add),
        )
    };
    let marker = vec![format!("{STORE_ERROR_HEADER}: allow")];
    assert_eq!(
        marked(StoreErrorHeader::Upstream).await,
        (marker.clone(), vec![])
    );
    assert_eq!(marked(StoreErrorHeader::Response).await, (vec![], marker));
    assert_eq!(marked(StoreErrorHeader::Off).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_failing_store_is_unavailable_so_envoy_failure_mode_decides() {
    let svc = service(Arc::new(DownStore));
    let status = svc
        .should_rate_limit(Request::new(request("v")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "rate limit store unavailable");
    // A descriptor that matches nothing never reaches the store.
    let mut unmatched = request("v");
    unmatched.descriptors[0].entries[0].key = "other".into();
    let response = svc
        .should_rate_limit(Request::new(unmatched))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, rls::Code::Ok as i32);
}

/// A store whose calls never answer.
struct SilentStore;

#[tonic::async_trait]
impl CounterStore for SilentStore {
    async fn apply(&self, _: &[Hit]) -> Result<Vec<Outcome>, StoreError> {
        std::future::pending().await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[tonic::async_trait]
impl CounterReset for SilentStore {
    async fn forget(&self, _: &[Hit]) -> Result<(), StoreError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_request_whose_deadline_passed_is_not_decided() {
    let clock = ManualClock::at_seconds(2222);
    let store = Arc::new(MemoryStore::new(100, Arc::new(clock)));
    let svc = service(store);
    let passed = Deadline {
        at: tokio::time::Instant::now(),
    };
    let error = svc.answer(request("v"), Some(passed)).await.unwrap_err();
    let status = Status::from(error);
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(
        status.message(),
        "the client's deadline passed before the request was decided"
    );
    // Nothing was counted: the next request finds the whole limit of 2.
    let response = svc.answer(request("v"), None).await.unwrap();
    assert_eq!(response.statuses[0].limit_remaining, 1);
}

#[tokio::test(start_paused = true)]
async fn the_store_call_is_given_what_remains_of_the_deadline() {
    let svc = service(Arc::new(SilentStore));
    let arrived = tokio::time::Instant::now();
    let deadline = Deadline {
        at: arrived + Duration::from_millis(100),
    };
    // Time the call spent before it was decided (in the runtime's queue, being read).
    tokio::time::sleep(Duration::from_millis(60)).await;
    let error = svc.answer(request("v"), Some(deadline)).await.unwrap_err();
    assert_eq!(arrived.elapsed(), Duration::from_millis(100));
    assert!(
        matches!(error, Error::Store(StoreError::Timeout(given)) if given == Duration::from_millis(40)),
        "{error:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_s_grpc_timeout_bounds_its_store_call() {
    let svc = service(Arc::new(SilentStore));
    let mut call = Request::new(request("v"));
    call.metadata_mut()
        .insert("grpc-timeout", "40m".parse().unwrap());
    let arrived = tokio::time::Instant::now();
    // Were the timeout not read, the call would wait on the store for ever.
    let status = tokio::time::timeout(Duration::from_secs(1), svc.should_rate_limit(call))
        .await
        .expect("the call's deadline bounds it")
        .unwrap_err();
    assert_eq!(arrived.elapsed(), Duration::from_millis(40));
    assert_eq!(status.code(), tonic::Code::Unavailable);
}
