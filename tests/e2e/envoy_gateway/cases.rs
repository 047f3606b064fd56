//! Envoy Gateway's own global rate-limit end-to-end cases (its `ratelimit.go` family), each
//! with the RateLimitConfigs and the Envoy configuration the gateway generates for the case's
//! policies and routes, and the requests and answers its test expects. Where its test waits
//! for an answer ("eventually"), the configuration is in place before the first request
//! here, so the exact sequence is asserted; where it reads Prometheus, a real Prometheus
//! scrapes `PROMETHEUS_ADDR` and the same query is run.

use serde_json::{Value, json};

use super::envoy::*;
use super::*;
use crate::common::away_from_the_hour_boundary;
use crate::common::prometheus::Prometheus;

const OK: u16 = 200;
const LIMITED: u16 = 429;

/// The base Gateway's HTTP listener, which most cases use.
fn same_namespace() -> String {
    listener_domain("same-namespace", "http")
}

/// A route calling only the listener's own filter with `actions`.
fn limited_route(route: &str, path: &str, domain: &str, actions: Vec<Value>) -> Value {
    let key = route_key(route);
    let mut all = vec![generic(&key)];
    all.extend(actions);
    route_calling(
        &key,
        path,
        vec![(BASE_FILTER.to_owned(), per_route(domain, vec![limit(all)]))],
    )
}

/// A route with one `RateLimitPerRoute` per filter named.
fn route_calling(name: &str, path: &str, filters: Vec<(String, Value)>) -> Value {
    let per_filter: serde_json::Map<String, Value> = filters.into_iter().collect();
    route(name, prefix(path), Value::Object(per_filter))
}

fn none(count: usize) -> Vec<(u16, Option<String>)> {
    vec![(OK, None); count]
}

/// `n` admitted answers with the limit header, then one refusal with it.
fn admitted_then_limited(n: usize, per_hour: u32) -> Vec<(u16, Option<String>)> {
    let mut expected = vec![with_limit(OK, per_hour); n];
    expected.push(with_limit(LIMITED, per_hour));
    expected
}

/// One deployment and Envoy for a case: `configs` pushed, Envoy on `listeners`.
async fn case(
    configs: Vec<tollgate::pb::ratelimit::config::ratelimit::v3::RateLimitConfig>,
    listeners: &[Listener],
) -> (Deployment, Envoy) {
    let mut eg = Deployment::start().await;
    eg.push(configs).await;
    let envoy = eg.envoy(listeners).await;
    away_from_the_hour_boundary().await;
    (eg, envoy)
}

/// The CIDR chain of a `Distinct` `0.0.0.0/0` selector, `per_hour` a client.
fn every_address(per_hour: u32) -> RateLimitDescriptor {
    node(
        "masked_remote_address",
        "0.0.0.0/0",
        vec![hourly("remote_address", "", per_hour)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_cidr_match_blocks_all_ips() {
    let (l, r) = (same_namespace(), route_key("cidr-ratelimit"));
    let actions = source_cidr("0.0.0.0", 0, false, true);
    let (eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![every_address(3)])])],
        &[Listener::new(
            &l,
            vec![limited_route("cidr-ratelimit", "/", &l, actions)],
        )],
    )
    .await;
    let prometheus = Prometheus::start(&[format!("127.0.0.1:{}", eg.metrics)], &[]).await;
    assert_eq!(
        statuses(envoy.ports[0], "/", &[], 4).await,
        admitted_then_limited(3, 3)
    );
    let samples = prometheus
        .until_samples(
            r#"ratelimit_service_rate_limit_over_limit{key2="masked_remote_address_0_0_0_0/0"}"#,
        )
        .await;
    assert_eq!(samples[0]["metric"]["domain"], json!(l));
    assert_eq!(samples[0]["value"][1], json!("1"));
    // Every series Envoy Gateway's rate-limit dashboard plots.
    for series in [
        format!("ratelimit_service_rate_limit_total_hits{{domain=\"{l}\"}}"),
        format!("ratelimit_service_rate_limit_over_limit{{domain=\"{l}\"}}"),
        format!("ratelimit_service_rate_limit_near_limit{{domain=\"{l}\"}}"),
        "process_resident_memory_bytes".to_owned(),
        "process_virtual_memory_bytes".to_owned(),
        "go_memstats_gc_cpu_fraction".to_owned(),
        "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\"}"
            .to_owned(),
    ] {
        prometheus.until_samples(&series).await;
    }
}

/// Two listeners of one Gateway on one port, by hostname: one Envoy listener, each route
/// calling with its own listener's domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_cidr_match_on_a_merged_listener_limits_each_hostname() {
    let domain = |listener| listener_domain("ratelimit-gateway", listener);
    let key = |host: &str| format!("httproute/{NS}/cidr-ratelimit/rule/0/match/0/{host}");
    let host_route = |host: &str, listener| {
        let mut actions = vec![generic(&key(host))];
        actions.extend(source_cidr("0.0.0.0", 0, false, true));
        let calls = vec![(
            BASE_FILTER.to_owned(),
            per_route(&domain(listener), vec![limit(actions)]),
        )];
        route_calling(&key(host), "/", calls)
    };
    let mut listener = Listener::new(&domain("http-1"), Vec::new());
    listener.hosts = vec![
        (
            vec!["app1.example.com"],
            vec![host_route("app1_example_com", "http-1")],
        ),
        (
            vec!["app2.example.com"],
            vec![host_route("app2_example_com", "http-2")],
        ),
    ];
    let configs = ["http-1", "http-2"]
        .into_iter()
        .zip(["app1_example_com", "app2_example_com"])
        .map(|(listener, host)| {
            config(
                &domain(listener),
                vec![node(&key(host), &key(host), vec![every_address(3)])],
            )
        })
        .collect();
    let (_eg, envoy) = case(configs, &[listener]).await;
    for host in ["app1.example.com", "app2.example.com"] {
        assert_eq!(
            statuses(envoy.ports[0], "/", &[("host", host)], 4).await,
            admitted_then_limited(3, 3),
            "{host}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_cidr_invert_match_always_enforce() {
    let (l, r) = (same_namespace(), route_key("cidr-invert-ratelimit"));
    let actions = source_cidr("192.0.2.0", 24, true, false);
    let rule = hourly("masked_remote_address", "invert:192.0.2.0/24", 2);
    let (eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![rule])])],
        &[Listener::new(
            &l,
            vec![limited_route("cidr-invert-ratelimit", "/", &l, actions)],
        )],
    )
    .await;
    let prometheus = Prometheus::start(&[format!("127.0.0.1:{}", eg.metrics)], &[]).await;
    assert_eq!(
        statuses(envoy.ports[0], "/", &[], 3).await,
        admitted_then_limited(2, 2)
    );
    prometheus
        .until_samples(r#"ratelimit_service_rate_limit_over_limit{key2="masked_remote_address_invert_192_0_2_0/24"}"#)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_cidr_invert_always_exempt() {
    let (l, r) = (same_namespace(), route_key("cidr-invert-always-exempt"));
    let actions = source_cidr("0.0.0.0", 0, true, false);
    let rule = hourly("masked_remote_address", "invert:0.0.0.0/0", 2);
    let route = limited_route("cidr-invert-always-exempt", "/never-limited", &l, actions);
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![rule])])],
        &[Listener::new(&l, vec![route])],
    )
    .await;
    assert_eq!(
        statuses(envoy.ports[0], "/never-limited", &[], 4).await,
        none(4)
    );
}

/// The two exact headers of `ratelimit-header-match`, on `route`.
fn anded_headers(route: &str, domain: &str) -> (RateLimitConfig, Value) {
    let r = route_key(route);
    let rule = node(
        "rule-0-match-0",
        "rule-0-match-0",
        vec![hourly("rule-0-match-1", "rule-0-match-1", 3)],
    );
    let actions = vec![
        header_is("rule-0-match-0", "x-user-id", "one", false),
        header_is("rule-0-match-1", "x-user-org", "acme", false),
    ];
    (
        config(domain, vec![node(&r, &r, vec![rule])]),
        limited_route(route, "/get", domain, actions),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_header_match() {
    let l = same_namespace();
    let (rules, route) = anded_headers("header-ratelimit", &l);
    let (_eg, envoy) = case(vec![rules], &[Listener::new(&l, vec![route])]).await;
    let port = envoy.ports[0];
    let both = [("x-user-id", "one"), ("x-user-org", "acme")];
    assert_eq!(
        statuses(port, "/get", &both, 4).await,
        admitted_then_limited(3, 3)
    );
    assert_eq!(
        statuses(port, "/get", &[("x-user-id", "one")], 4).await,
        none(4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_method_match() {
    let (l, r) = (same_namespace(), route_key("method-ratelimit"));
    let calls = ["POST", "DELETE"]
        .map(|method| limit(vec![generic(&r), method_is(0, method)]))
        .to_vec();
    let route = route_calling(
        &r,
        "/get",
        vec![(BASE_FILTER.to_owned(), per_route(&l, calls))],
    );
    let rule = hourly("rule-0-method", "rule-0-method", 3);
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![rule])])],
        &[Listener::new(&l, vec![route])],
    )
    .await;
    let port = envoy.ports[0];
    let mut answers = Vec::new();
    for method in ["POST", "POST", "POST", "POST", "DELETE"] {
        let answer = send(port, method, "/get", &[]).await;
        answers.push((answer.status, answer.limit));
    }
    let mut expected = admitted_then_limited(3, 3);
    expected.push(with_limit(LIMITED, 3));
    assert_eq!(answers, expected, "POST and DELETE share one counter");
    assert_eq!(statuses(port, "/get", &[], 4).await, none(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_path_match() {
    let (l, r) = (same_namespace(), route_key("path-ratelimit"));
    let actions = vec![path_under(0, "/get/specific-path")];
    let rule = hourly("rule-0-path", "rule-0-path", 3);
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![rule])])],
        &[Listener::new(
            &l,
            vec![limited_route("path-ratelimit", "/get", &l, actions)],
        )],
    )
    .await;
    let port = envoy.ports[0];
    assert_eq!(
        statuses(port, "/get/specific-path", &[], 4).await,
        admitted_then_limited(3, 3)
    );
    assert_eq!(
        statuses(port, "/get/specific-path/subpath", &[], 1).await,
        [with_limit(LIMITED, 3)],
        "a path under the prefix shares its counter"
    );
    assert_eq!(statuses(port, "/get/specific-path2", &[], 1).await, none(1));
    assert_eq!(
        statuses(port, "/get/no-specific-path", &[], 4).await,
        none(4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_rate_limit_header_invert_match() {
    let (l, r) = (same_namespace(), route_key("header-ratelimit"));
    let actions = vec![
        header_distinct("rule-0-match-0", "x-user-name"),
        header_is("rule-0-match-1", "x-user-name", "admin", true),
    ];
    let rule = node(
        "rule-0-match-0",
        "",
        vec![hourly("rule-0-match-1", "rule-0-match-1", 3)],
    );
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![rule])])],
        &[Listener::new(
            &l,
            vec![limited_route("header-ratelimit", "/get", &l, actions)],
        )],
    )
    .await;
    let port = envoy.ports[0];
    let user = [("x-user-name", "username")];
    assert_eq!(
        statuses(port, "/get", &user, 4).await,
        admitted_then_limited(3, 3)
    );
    assert_eq!(
        statuses(port, "/get", &[("x-user-name", "admin")], 4).await,
        none(4)
    );
}

/// With the ClientTrafficPolicy's `disableRateLimitHeaders`, no `x-ratelimit-*` header at
/// all, limited or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_headers_disabled() {
    let l = same_namespace();
    let (rules, route) = anded_headers("ratelimit-headers-disabled", &l);
    let mut listener = Listener::new(&l, vec![route]);
    listener.headers = false;
    let (_eg, envoy) = case(vec![rules], &[listener]).await;
    let port = envoy.ports[0];
    let both = [("x-user-id", "one"), ("x-user-org", "acme")];
    let mut expected = none(3);
    expected.push((LIMITED, None));
    assert_eq!(statuses(port, "/get", &both, 4).await, expected);
    assert_eq!(
        statuses(port, "/get", &[("x-user-id", "one")], 4).await,
        none(4)
    );
}

/// Envoy Gateway's end-to-end JWKS, and tokens its keys signed for John Doe and Tom.
const JWKS: &str = r#"{"keys":[{"kty":"RSA","n":"u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw","e":"AQAB","alg":"RS256","use":"sig"},{"alg":"RS256","e":"AQAB","key_ops":["verify"],"kty":"RSA","n":"xOHb-i1WDfeAvsbXTSOtosl3hCUDHQ8fRDqX_Rt998-hZDJmAoPOu4J-wcwq5aZtSn_iWUYLcK2WmC_1n-p1eyc-Pl4CBnxF7LUjCk-WGhniaCzXC5I5RON6c5N-MdE0UfukK0PM0zD3iQonZq0fIsnOYyFdYdWvQ5XW-C2aLlq2FUKrjmhAav10jIC0KGd2dHRzauzfLMUmt_iMnpU84Xrur1zRYzBO4D90rN0ypC2HH7o_zI8Osx4o1L8BScW78545sWyVbaprhBV1I2Sa4SH3NAc25ej3RIh-f13Yu97FVfO0AIG4VfFiaMmsTqNTCiBkM20tXD2Z-cHJTKemXzFgInJoqFLAkHLzJ0lPvAkKOgAOufLHa7RA-C276OXd72IXPsL1UOLN4sjhGqTtaynVa00yuHdi3f4-aoy9F9SUJeWfPg--nZNLzuI0eyufsTFywnx1bTQ_kdYlEr0dRE5sujlMk3cZ7FmOQRvcjA9MxFzoVKMmlZc6LMCgqw-P","use":"sig","kid":"b520b3c2c4bd75a10e9cebc9576933dc"}]}"#;
const JOHN: &str = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiYWRtaW4iOnRydWUsImlhdCI6MTUxNjIzOTAyMn0.NHVaYe26MbtOYhSKkoKYdFVomg4i8ZJd8_-RU8VNbftc4TSMb4bXP3l3YlNWACwyXPGffz5aXHc6lty1Y2t4SWRqGteragsVdZufDn5BlnJl9pdR_kdVFUsra2rWKEofkZeIC4yWytE58sMIihvo9H1ScmmVwBcQP6XETqYd0aSHp1gOa9RdUPDvoXQ5oqygTqVtxaDr6wUFKrKItgBMzWIdNZ6y7O9E0DhEPTbE9rfBo6KTFsHAZnMg4k68CDp2woYIaXbmYTWcvbzIuHO7_37GT79XdIwkm95QJ7hYC9RiwrV7mesbY4PAahERJawntho0my942XheVLmGwLMBkQ";
const TOM: &str = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IlRvbSIsImFkbWluIjp0cnVlLCJpYXQiOjE1MTYyMzkwMjJ9.kyzDDSo7XpweSPU1lxoI9IHzhTBrRNlnmcW9lmCbloZELShg-8isBx4AFoM4unXZTHpS_Y24y0gmd4nDQxgUE-CgjVSnGCb0Xhy3WO1gm9iChoKDyyQ3kHp98EmKxTyxKG2X9GyKcDFNBDjH12OBD7TcJUaBEvLf6Jw1SG2A7FakUPWeK04DQ916-ROylzI6qKyaZ0OpfYIbijvyAQxlQRxxs2XHlAkLdJhfVcUqJBwsFTbwHYARC-WNgd2_etAk1GWdwwZ_NoTmRzZAMryrYJpHY9KPlbnZ93Ye3o9h2viBQ_XRb7JBkWnAGYO4_KswpJWE_7ROUVj8iOJo2jfY6w";

/// A SecurityPolicy's JWT provider (its JWKS inline here, fetched from a URI there) putting
/// the `name` claim in `x-claim-name`, before the rate-limit filters.
fn jwt_filter() -> Value {
    json!({"name": "envoy.filters.http.jwt_authn", "typedConfig": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
        "providers": {"example": {
            "forward": true,
            "localJwks": {"inlineString": JWKS},
            "claimToHeaders": [{"claimName": "name", "headerName": "x-claim-name"}],
        }},
        "requirementMap": {"example": {"providerName": "example"}},
    }})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_based_jwt_claims() {
    let (l, r) = (
        same_namespace(),
        route_key("http-ratelimit-based-jwt-claims"),
    );
    let actions = vec![
        generic(&r),
        header_is("rule-0-match-0", "x-claim-name", "John Doe", false),
    ];
    let jwt = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig",
        "requirementName": "example",
    });
    let limited = route_calling(
        &r,
        "/foo",
        vec![
            ("envoy.filters.http.jwt_authn".to_owned(), jwt),
            (BASE_FILTER.to_owned(), per_route(&l, vec![limit(actions)])),
        ],
    );
    let open = route(&route_key("http-no-ratelimit"), prefix("/bar"), json!({}));
    let mut listener = Listener::new(&l, vec![limited, open]);
    listener.before = vec![jwt_filter()];
    let rule = hourly("rule-0-match-0", "rule-0-match-0", 3);
    let (eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![rule])])],
        &[listener],
    )
    .await;
    let port = envoy.ports[0];
    let before = eg.over_limit_count().await;
    assert_eq!(statuses(port, "/bar", &[], 1).await, none(1));
    let bearer = |token| format!("Bearer {token}");
    let (john, tom) = (bearer(JOHN), bearer(TOM));
    assert_eq!(
        statuses(port, "/foo", &[("authorization", john.as_str())], 4).await,
        admitted_then_limited(3, 3)
    );
    assert_eq!(
        statuses(port, "/foo", &[("authorization", tom.as_str())], 4).await,
        none(4)
    );
    assert_eq!(statuses(port, "/foo", &[], 1).await, [(401, None)]);
    assert_eq!(eg.over_limit_count().await, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_multiple_listeners() {
    let r = route_key("cidr-ratelimit");
    let domains =
        ["http-80", "http-8080"].map(|listener| listener_domain("eg-rate-limit", listener));
    let listeners: Vec<Listener> = domains
        .iter()
        .map(|domain| {
            let actions = source_cidr("0.0.0.0", 0, false, true);
            Listener::new(
                domain,
                vec![limited_route("cidr-ratelimit", "/", domain, actions)],
            )
        })
        .collect();
    let configs = domains
        .iter()
        .map(|domain| config(domain, vec![node(&r, &r, vec![every_address(3)])]))
        .collect();
    let (_eg, envoy) = case(configs, &listeners).await;
    for port in &envoy.ports {
        assert_eq!(
            statuses(*port, "/", &[], 4).await,
            admitted_then_limited(3, 3)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_headers_and_cidr_match() {
    let (l, r) = (same_namespace(), route_key("header-and-cidr-ratelimit"));
    let mut actions = vec![
        header_is("rule-0-match-0", "x-user-id", "one", false),
        header_is("rule-0-match-1", "x-user-org", "acme", false),
    ];
    actions.extend(source_cidr("0.0.0.0", 0, false, true));
    let chain = node(
        "rule-0-match-0",
        "rule-0-match-0",
        vec![node(
            "rule-0-match-1",
            "rule-0-match-1",
            vec![every_address(3)],
        )],
    );
    let route = limited_route("header-and-cidr-ratelimit", "/get", &l, actions);
    let (_eg, envoy) = case(
        vec![config(&l, vec![node(&r, &r, vec![chain])])],
        &[Listener::new(&l, vec![route])],
    )
    .await;
    let port = envoy.ports[0];
    let both = [("x-user-id", "one"), ("x-user-org", "acme")];
    assert_eq!(
        statuses(port, "/get", &both, 4).await,
        admitted_then_limited(3, 3)
    );
    assert_eq!(
        statuses(port, "/get", &[("x-user-id", "one")], 4).await,
        none(4)
    );
    assert_eq!(statuses(port, "/get", &[], 4).await, none(4));
}
