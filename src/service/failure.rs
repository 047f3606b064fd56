//! The answer when the store fails, per `--on-store-error` (docs/design.md, "Failure").

use crate::pb::{self, rate_limit_response as rls};
use crate::storage::StoreError;

use super::options::{OnStoreError, STORE_ERROR_HEADER, ServiceOptions, StoreErrorHeader};

/// The answer for a request of `descriptors` descriptors whose store call failed with
/// `error`: OK or OVER_LIMIT for every descriptor, marked, by policy; `None` under the
/// default policy, where the request fails as UNAVAILABLE.
pub fn answer(
    options: &ServiceOptions,
    error: &StoreError,
    descriptors: usize,
) -> Option<pb::RateLimitResponse> {
    let code = match options.on_store_error {
        OnStoreError::Unavailable => return None,
        OnStoreError::Allow => rls::Code::Ok,
        OnStoreError::Deny => rls::Code::OverLimit,
    };
    let policy = options.on_store_error;
    if let Some(unsaid) = super::throttle::STORE_FAILURES.may_say() {
        tracing::warn!(%error, ?policy, unsaid, "store call failed; answering by policy (said at most once a second; unsaid: the failures since the last line)");
    }
    let mut response = pb::RateLimitResponse {
        overall_code: code as i32,
        statuses: (0..descriptors)
            .map(|_| rls::DescriptorStatus {
                code: code as i32,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let marker = pb::HeaderValue {
        key: STORE_ERROR_HEADER.into(),
        value: format!("{policy:?}").to_lowercase(),
        ..Default::default()
    };
    match options.store_error_header {
        StoreErrorHeader::Upstream => response.request_headers_to_add.push(marker),
        StoreErrorHeader::Response => response.response_headers_to_add.push(marker),
        StoreErrorHeader::Off => {}
    }
    Some(response)
}
