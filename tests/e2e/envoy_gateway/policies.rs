//! The rest of Envoy Gateway's global rate-limit end-to-end cases: shared limits (a filter
//! and a domain of their own), a route's and a gateway's policies merged, request and
//! response costs, shadow mode and query parameters (see `cases.rs`).

use serde_json::{Value, json};

use super::envoy::*;
use super::*;
use crate::common::away_from_the_hour_boundary;

const OK: u16 = 200;
const LIMITED: u16 = 429;

/// The name of rule `index` of `policy`, and its shared domain.
fn shared_rule(policy: &str, index: usize) -> (String, String) {
    (
        format!("{NS}/{policy}/rule/{index}"),
        format!("{NS}/{policy}"),
    )
}

/// A route at `path` calling each `(filter, domain, rate limits)`.
fn route_with(name: &str, path: &str, calls: Vec<(String, &str, Vec<Value>)>) -> Value {
    let per_filter: serde_json::Map<String, Value> = calls
        .into_iter()
        .map(|(filter, domain, limits)| (filter, per_route(domain, limits)))
        .collect();
    route(name, prefix(path), Value::Object(per_filter))
}

async fn case(configs: Vec<RateLimitConfig>, listeners: &[Listener]) -> (Deployment, Envoy) {
    let mut eg = Deployment::start().await;
    eg.push(configs).await;
    let envoy = eg.envoy(listeners).await;
    away_from_the_hour_boundary().await;
    (eg, envoy)
}

/// `GET` each path in turn with `headers`: statuses and limit headers.
async fn each(port: u16, paths: &[&str], headers: &[(&str, &str)]) -> Vec<(u16, Option<String>)> {
    let mut answers = Vec::new();
    for path in paths {
        answers.extend(statuses(port, path, headers, 1).await);
    }
    answers
}

/// Two routes, `/foo` and `/bar`, calling only the shared filter of `domain` with `limits`.
fn two_routes_sharing(domain: &str, limits: Vec<Value>) -> Vec<Value> {
    ["cidr-ratelimit-1", "cidr-ratelimit-2"]
        .into_iter()
        .zip(["/foo", "/bar"])
        .map(|(name, path)| {
            route_with(
                &route_key(name),
                path,
                vec![(shared_filter(domain), domain, limits.clone())],
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_global_shared_cidr_match() {
    let l = listener_domain("same-namespace", "http");
    let (rule, domain) = shared_rule("ratelimit-all-ips", 0);
    let mut actions = vec![generic(&rule)];
    actions.extend(source_cidr("0.0.0.0", 0, false, true));
    let mut listener = Listener::new(&l, two_routes_sharing(&domain, vec![limit(actions)]));
    listener.shared = vec![domain.clone()];
    let chain = node(
        "masked_remote_address",
        "0.0.0.0/0",
        vec![hourly("remote_address", "", 3)],
    );
    let (_eg, envoy) = case(
        vec![config(&domain, vec![node(&rule, &rule, vec![chain])])],
        &[listener],
    )
    .await;
    assert_eq!(
        each(envoy.ports[0], &["/foo", "/foo", "/bar", "/bar"], &[]).await,
        [
            with_limit(OK, 3),
            with_limit(OK, 3),
            with_limit(OK, 3),
            with_limit(LIMITED, 3)
        ],
        "one counter across both routes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_global_shared_gateway_header_match() {
    let l = listener_domain("eg-rate-limit", "http-8080");
    let (rule, domain) = shared_rule("ratelimit-header-match-gateway", 0);
    let actions = vec![
        generic(&rule),
        header_is("rule-0-match-0", "x-user-id", "one", false),
    ];
    let mut listener = Listener::new(&l, two_routes_sharing(&domain, vec![limit(actions)]));
    listener.shared = vec![domain.clone()];
    let leaf = hourly("rule-0-match-0", "rule-0-match-0", 3);
    let (_eg, envoy) = case(
        vec![config(&domain, vec![node(&rule, &rule, vec![leaf])])],
        &[listener],
    )
    .await;
    assert_eq!(
        each(
            envoy.ports[0],
            &["/foo", "/foo", "/bar", "/bar"],
            &[("x-user-id", "one")]
        )
        .await,
        [
            with_limit(OK, 3),
            with_limit(OK, 3),
            with_limit(OK, 3),
            with_limit(LIMITED, 3)
        ]
    );
}

/// A route's policy (one shared rule, one not) and its gateway's (a shared rule without
/// selector, one with, one not shared), merged on both routes: rules of one sharing counted
/// in one index across policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_global_merge() {
    let l = listener_domain("eg-rate-limit", "http-8080");
    let (route_rule, route_domain) = shared_rule("ratelimit-headers-route-policy", 0);
    let (gateway_rule_0, gateway_domain) = shared_rule("ratelimit-headers-gateway-policy", 0);
    let (gateway_rule_1, _) = shared_rule("ratelimit-headers-gateway-policy", 1);
    let routes = ["header-ratelimit-1", "header-ratelimit-2"].map(route_key);
    let user_is = |key: &str, value| header_is(key, "x-user-id", value, false);
    let listener_routes = routes
        .iter()
        .zip(["/foo", "/bar"])
        .map(|(key, path)| {
            let own = vec![
                limit(vec![generic(key), user_is("rule-0-match-0", "two")]),
                limit(vec![generic(key), user_is("rule-1-match-0", "four")]),
            ];
            let gateway = vec![
                limit(vec![generic(&gateway_rule_0), generic("rule-1-match--1")]),
                limit(vec![
                    generic(&gateway_rule_1),
                    user_is("rule-2-match-0", "three"),
                ]),
            ];
            let route_policy = vec![limit(vec![
                generic(&route_rule),
                user_is("rule-0-match-0", "one"),
            ])];
            route_with(
                key,
                path,
                vec![
                    (BASE_FILTER.to_owned(), &l, own),
                    (shared_filter(&gateway_domain), &gateway_domain, gateway),
                    (shared_filter(&route_domain), &route_domain, route_policy),
                ],
            )
        })
        .collect();
    let mut listener = Listener::new(&l, listener_routes);
    listener.shared = vec![gateway_domain.clone(), route_domain.clone()];
    let three = |key: &str| hourly(key, key, 3);
    let configs = vec![
        config(
            &l,
            routes
                .iter()
                .map(|key| {
                    node(
                        key,
                        key,
                        vec![three("rule-0-match-0"), three("rule-1-match-0")],
                    )
                })
                .collect(),
        ),
        config(
            &gateway_domain,
            vec![
                node(
                    &gateway_rule_0,
                    &gateway_rule_0,
                    vec![hourly("rule-1-match--1", "rule-1-match--1", 100)],
                ),
                node(
                    &gateway_rule_1,
                    &gateway_rule_1,
                    vec![three("rule-2-match-0")],
                ),
            ],
        ),
        config(
            &route_domain,
            vec![node(
                &route_rule,
                &route_rule,
                vec![three("rule-0-match-0")],
            )],
        ),
    ];
    let (_eg, envoy) = case(configs, &[listener]).await;
    let port = envoy.ports[0];
    let statuses_of = |answers: Vec<(u16, Option<String>)>| -> Vec<u16> {
        answers.into_iter().map(|(status, _)| status).collect()
    };

    // Shared by the route's policy: the route policy's limit is the first header value.
    let one = [("x-user-id", "one")];
    let first = send(port, "GET", "/bar", &one).await;
    assert_eq!(first.status, OK);
    assert!(
        first
            .limit
            .as_deref()
            .is_some_and(|limit| limit.starts_with("3, 3;w=3600")),
        "{first:?}"
    );
    assert_eq!(
        statuses_of(each(port, &["/bar", "/foo", "/foo"], &one).await),
        [OK, OK, LIMITED]
    );
    // Not shared, each route its own counter.
    for user in ["two", "four"] {
        let headers = [("x-user-id", user)];
        let answers = each(
            port,
            &[
                "/foo", "/foo", "/foo", "/foo", "/bar", "/bar", "/bar", "/bar",
            ],
            &headers,
        )
        .await;
        assert_eq!(
            statuses_of(answers),
            [OK, OK, OK, LIMITED, OK, OK, OK, LIMITED],
            "x-user-id {user}"
        );
    }
    // Shared by the gateway's policy.
    let three_user = [("x-user-id", "three")];
    assert_eq!(
        statuses_of(each(port, &["/bar", "/bar", "/foo", "/foo"], &three_user).await),
        [OK, OK, OK, LIMITED]
    );
    // Without selector: every request so far drew from the gateway's 100 an hour.
    let probe = send(port, "GET", "/bar", &[]).await;
    assert_eq!(
        (probe.status, probe.limit.as_deref()),
        (OK, Some("100, 100;w=3600"))
    );
    let remaining: usize = probe.remaining.as_deref().unwrap().parse().unwrap();
    // Every request that reached the gateway's filter: those the listener's own limits
    // refused (x-user-id two and four, two each) stopped before it.
    assert_eq!(remaining, 100 - (4 + 16 - 4 + 4 + 1));
    assert_eq!(
        statuses(port, "/bar", &[], remaining + 1).await,
        [
            vec![with_limit(OK, 100); remaining],
            vec![with_limit(LIMITED, 100)]
        ]
        .concat()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_global_shadow_mode() {
    let l = listener_domain("same-namespace", "http");
    let r = route_key("shadow-mode-ratelimit");
    let limits = vec![limit(vec![generic(&r), method_is(0, "GET")])];
    let route = route_with(&r, "/shadow", vec![(BASE_FILTER.to_owned(), &l, limits)]);
    let mut shadowed = hourly("rule-0-method", "rule-0-method", 3);
    shadowed.shadow_mode = true;
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![shadowed])])],
        &[Listener::new(&l, vec![route])],
    )
    .await;
    assert_eq!(
        statuses(envoy.ports[0], "/shadow", &[], 5).await,
        vec![with_limit(OK, 3); 5],
        "over the limit, still admitted, still told the limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_query_parameters() {
    let l = listener_domain("same-namespace", "http");
    let r = route_key("query-parameters-ratelimit");
    let limits = vec![limit(vec![
        generic(&r),
        query_is("rule-0-match-0", "user", "alice"),
    ])];
    let route = route_with(&r, "/get", vec![(BASE_FILTER.to_owned(), &l, limits)]);
    let leaf = hourly("rule-0-match-0", "rule-0-match-0", 3);
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![leaf])])],
        &[Listener::new(&l, vec![route])],
    )
    .await;
    let port = envoy.ports[0];
    let mut expected = vec![with_limit(OK, 3); 3];
    expected.push(with_limit(LIMITED, 3));
    assert_eq!(statuses(port, "/get?user=alice", &[], 4).await, expected);
    assert_eq!(
        statuses(port, "/get?name=bob", &[], 4).await,
        vec![(OK, None); 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_global_shared_with_cost() {
    let l = listener_domain("eg-shared-cost-ratelimit", "http-8080");
    let (rule, domain) = shared_rule("ratelimit-shared-gateway-cost", 0);
    let mut costly = limit(vec![
        generic(&rule),
        header_is("rule-0-match-0", "x-user-id", "cost-test", false),
    ]);
    costly["hitsAddend"] = json!({"number": "2"});
    let mut listener = Listener::new(&l, two_routes_sharing(&domain, vec![costly]));
    listener.shared = vec![domain.clone()];
    let leaf = hourly("rule-0-match-0", "rule-0-match-0", 4);
    let (_eg, envoy) = case(
        vec![config(&domain, vec![node(&rule, &rule, vec![leaf])])],
        &[listener],
    )
    .await;
    let port = envoy.ports[0];
    assert_eq!(
        each(
            port,
            &["/foo", "/bar", "/bar"],
            &[("x-user-id", "cost-test")]
        )
        .await,
        [with_limit(OK, 4), with_limit(OK, 4), with_limit(LIMITED, 4)],
        "two of four a request"
    );
    assert_eq!(each(port, &["/foo"], &[]).await, [(OK, None)]);
}

/// An extension (ext_proc there, a Lua filter here) that sets the cost of a response in
/// dynamic metadata once its headers are known.
fn cost_setter() -> Value {
    json!({"name": "envoy.filters.http.lua", "typedConfig": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "defaultSourceCode": {"inlineString":
            "function envoy_on_response(handle) handle:streamInfo():dynamicMetadata():set('io.envoyproxy.gateway.e2e', 'request_cost_set_by_ext_proc', 10) end"},
    }})
}

/// A request that costs nothing on the way in and 10 once its response is known: 21 an
/// hour admits three (0, 10 and 20 spent before each) and refuses the fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_rate_limit() {
    let l = listener_domain("same-namespace", "http");
    let r = route_key("usage-rate-limit");
    let actions = vec![
        generic(&r),
        header_is("rule-0-match-0", "x-user-id", "one", false),
    ];
    let mut checked = limit(actions.clone());
    checked["hitsAddend"] = json!({"number": "0"});
    let mut charged = limit(actions);
    charged["applyOnStreamDone"] = json!(true);
    charged["hitsAddend"] = json!({"format": "%DYNAMIC_METADATA(io.envoyproxy.gateway.e2e:request_cost_set_by_ext_proc)%"});
    let route = route_with(
        &r,
        "/get",
        vec![(BASE_FILTER.to_owned(), &l, vec![checked, charged])],
    );
    let mut listener = Listener::new(&l, vec![route]);
    listener.before = vec![cost_setter()];
    let leaf = hourly("rule-0-match-0", "rule-0-match-0", 21);
    let (eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![leaf])])],
        &[listener],
    )
    .await;
    let mut answers = Vec::new();
    for spent in [10, 20, 30] {
        answers.extend(statuses(envoy.ports[0], "/get", &[("x-user-id", "one")], 1).await);
        // The charge goes when the response ends, after the answer: waited for, so that the
        // next request is decided on it as a later client would be.
        eg.until_hits("usage-rate-limit", spent).await;
    }
    answers.extend(statuses(envoy.ports[0], "/get", &[("x-user-id", "one")], 1).await);
    assert_eq!(
        answers,
        [
            with_limit(OK, 21),
            with_limit(OK, 21),
            with_limit(OK, 21),
            with_limit(LIMITED, 21)
        ]
    );
}
