//! Envoy configured as Envoy Gateway's xDS translator configures it for global rate limits
//! (its golden outputs): one `envoy.filters.http.ratelimit` filter per domain a listener's
//! routes use (the listener's own, then `envoy.filters.http.ratelimit/<policy>` per shared
//! policy, by name), each route carrying a `RateLimitPerRoute` per filter it calls, the
//! actions the translator writes for each selector, and `ratelimit_cluster` as it writes it
//! (HTTP/2 with window sizes and no stream limit, `maxRetries: 1024`, TLS 1.3 at most with
//! Envoy's client certificate, the CA checked and no server name). Served statically here
//! (the gateway serves the same resources over ADS); routes lead to a backend listener of
//! the same Envoy that answers 200 with no body.

use std::path::Path;

use serde_json::{Value, json};

use super::certs::Secret;
use crate::common::ChildGuard;
use crate::common::envoy::run_envoy_with;
use crate::common::free_port;

/// The filter of the listener's own domain.
pub const BASE_FILTER: &str = "envoy.filters.http.ratelimit";

/// One listener of a gateway, as the translator writes its HTTP connection manager.
pub struct Listener {
    /// The listener's domain (its IR name), that of its base filter.
    pub domain: String,
    /// The domains of the shared policies its routes use, each a filter of its own.
    pub shared: Vec<String>,
    /// `enableXRatelimitHeaders: DRAFT_VERSION_03` (off with a ClientTrafficPolicy's
    /// `disableRateLimitHeaders`).
    pub headers: bool,
    /// HTTP filters before the rate-limit ones (a SecurityPolicy's JWT, an extension's).
    pub before: Vec<Value>,
    /// Its virtual hosts: `(domains, routes)`.
    pub hosts: Vec<(Vec<&'static str>, Vec<Value>)>,
    /// The gateway's `rateLimit.failClosed`: a failed call is a 500, not a pass.
    pub fail_closed: bool,
}

impl Listener {
    /// A listener of one `*` virtual host.
    pub fn new(domain: &str, routes: Vec<Value>) -> Self {
        Self {
            domain: domain.to_owned(),
            shared: Vec::new(),
            headers: true,
            before: Vec::new(),
            hosts: vec![(vec!["*"], routes)],
            fail_closed: false,
        }
    }
}

/// The filter a shared policy's domain gets.
pub fn shared_filter(domain: &str) -> String {
    format!("{BASE_FILTER}/{domain}")
}

/// A route to the backend matching `matcher`, with `per_filter` as its
/// `typedPerFilterConfig`.
pub fn route(name: &str, matcher: Value, per_filter: Value) -> Value {
    json!({
        "name": name,
        "match": matcher,
        "route": {"cluster": "backend", "upgradeConfigs": [{"upgradeType": "websocket"}]},
        "typedPerFilterConfig": per_filter,
    })
}

/// A `PathPrefix` match as the translator writes it (`/` as a prefix, else path-separated).
pub fn prefix(path: &str) -> Value {
    if path == "/" {
        json!({"prefix": "/"})
    } else {
        json!({"pathSeparatedPrefix": path})
    }
}

/// The `RateLimitPerRoute` of one filter.
pub fn per_route(domain: &str, rate_limits: Vec<Value>) -> Value {
    json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "domain": domain,
        "rateLimits": rate_limits,
    })
}

/// One rate limit: the actions of one rule.
pub fn limit(actions: Vec<Value>) -> Value {
    json!({"actions": actions})
}

/// The first action of every rule: the route's (or a shared rule's) name as key and value.
pub fn generic(key: &str) -> Value {
    json!({"genericKey": {"descriptorKey": key, "descriptorValue": key}})
}

/// An `Exact` header selector (`invert`: expectMatch false).
pub fn header_is(key: &str, name: &str, value: &str, invert: bool) -> Value {
    json!({"headerValueMatch": {
        "descriptorKey": key, "descriptorValue": key, "expectMatch": !invert,
        "headers": [{"name": name, "stringMatch": {"exact": value}}],
    }})
}

/// A `Distinct` header selector: the value is the header's.
pub fn header_distinct(key: &str, name: &str) -> Value {
    json!({"requestHeaders": {"descriptorKey": key, "headerName": name}})
}

/// A method selector of rule `rule`.
pub fn method_is(rule: usize, method: &str) -> Value {
    let key = format!("rule-{rule}-method");
    json!({"headerValueMatch": {
        "descriptorKey": key, "descriptorValue": key, "expectMatch": true,
        "headers": [{"name": ":method", "stringMatch": {"exact": method}}],
    }})
}

/// A `PathPrefix` path selector of rule `rule`, as the path-separated prefix regex.
pub fn path_under(rule: usize, path: &str) -> Value {
    let key = format!("rule-{rule}-path");
    let regex = format!("^{}(/.*|\\?.*|#.*|;.*|$)", regex_quote(path));
    json!({"headerValueMatch": {
        "descriptorKey": key, "descriptorValue": key, "expectMatch": true,
        "headers": [{"name": ":path", "stringMatch": {"safeRegex": {"regex": regex}}}],
    }})
}

fn regex_quote(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// A `sourceCIDR` selector: the masked address (`invert:` before it when inverted), and for
/// `Distinct`, the address itself.
pub fn source_cidr(prefix: &str, length: u32, invert: bool, distinct: bool) -> Vec<Value> {
    let mut matcher = json!({"ranges": [{"addressPrefix": prefix, "prefixLen": length}]});
    if invert {
        matcher["invertMatch"] = json!(true);
    }
    let cidr = format!("{prefix}/{length}");
    let value = if invert {
        format!("invert:{cidr}")
    } else {
        cidr
    };
    let mut actions = vec![json!({"remoteAddressMatch": {
        "addressMatcher": matcher, "descriptorKey": "masked_remote_address", "descriptorValue": value,
    }})];
    if distinct {
        actions.push(json!({"remoteAddressMatch": {
            "addressMatcher": matcher, "descriptorKey": "remote_address",
            "descriptorValue": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
        }}));
    }
    actions
}

/// An `Exact` query parameter selector.
pub fn query_is(key: &str, name: &str, value: &str) -> Value {
    json!({"queryParameterValueMatch": {
        "descriptorKey": key, "descriptorValue": key, "expectMatch": true,
        "queryParameters": [{"name": name, "stringMatch": {"exact": value}}],
    }})
}

/// The rate-limit filter of `domain` named `name`.
fn rate_limit_filter(name: &str, domain: &str, listener: &Listener) -> Value {
    // The gateway's `rateLimit.timeout`, set: Envoy's default, 20 ms, is shorter than what a
    // loaded test machine may take, and a call past it is answered as the service failing
    // (open), which the gateway's tests absorb by retrying and these do not.
    let mut config = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "disableXEnvoyRatelimitedHeader": true,
        "domain": domain,
        "timeout": "10s",
        "rateLimitService": {
            "grpcService": {"envoyGrpc": {"clusterName": "ratelimit_cluster"}},
            "transportApiVersion": "V3",
        },
    });
    if listener.headers {
        config["enableXRatelimitHeaders"] = json!("DRAFT_VERSION_03");
    }
    if listener.fail_closed {
        config["failureModeDeny"] = json!(true);
    }
    json!({"name": name, "typedConfig": config})
}

fn connection_manager(stat_prefix: &str, filters: Vec<Value>, routes: Value) -> Value {
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typedConfig": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "commonHttpProtocolOptions": {"headersWithUnderscoresAction": "REJECT_REQUEST"},
            "httpFilters": filters,
            "mergeSlashes": true,
            "normalizePath": true,
            "pathWithEscapedSlashesAction": "UNESCAPE_AND_REDIRECT",
            "routeConfig": routes,
            "serverHeaderTransformation": "PASS_THROUGH",
            "statPrefix": stat_prefix,
            "useRemoteAddress": true,
        },
    })
}

fn socket(port: u16) -> Value {
    json!({"socketAddress": {"address": "127.0.0.1", "portValue": port}})
}

fn gateway_listener(listener: &Listener, port: u16) -> Value {
    let mut filters = listener.before.clone();
    filters.push(rate_limit_filter(BASE_FILTER, &listener.domain, listener));
    let mut shared = listener.shared.clone();
    shared.sort();
    for domain in &shared {
        filters.push(rate_limit_filter(&shared_filter(domain), domain, listener));
    }
    filters.push(json!({"name": "envoy.filters.http.router", "typedConfig": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "suppressEnvoyHeaders": true,
    }}));
    let hosts: Vec<Value> = listener
        .hosts
        .iter()
        .map(|(domains, routes)| json!({"name": domains.join(","), "domains": domains, "routes": routes}))
        .collect();
    let routes =
        json!({"name": listener.domain, "ignorePortInHostMatching": true, "virtualHosts": hosts});
    json!({
        "name": listener.domain,
        "address": socket(port),
        "filterChains": [{"filters": [connection_manager(&format!("http-{port}"), filters, routes)]}],
        "perConnectionBufferLimitBytes": 32768,
    })
}

fn backend_listener(port: u16) -> Value {
    let routes = json!({"virtualHosts": [{"name": "backend", "domains": ["*"], "routes": [
        {"match": {"prefix": "/"}, "directResponse": {"status": 200}},
    ]}]});
    json!({
        "name": "backend",
        "address": socket(port),
        "filterChains": [{"filters": [connection_manager("backend", vec![json!({
            "name": "envoy.filters.http.router",
            "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        })], routes)]}],
    })
}

fn ratelimit_cluster(tollgate: u16, envoy: &Secret) -> Value {
    json!({
        "name": "ratelimit_cluster",
        "type": "STATIC",
        "circuitBreakers": {"thresholds": [{"maxRetries": 1024}]},
        "connectTimeout": "10s",
        "loadAssignment": {"clusterName": "ratelimit_cluster", "endpoints": [{"lbEndpoints": [{"endpoint": {"address": socket(tollgate)}}]}]},
        "perConnectionBufferLimitBytes": 32768,
        "transportSocket": {"name": "envoy.transport_sockets.tls", "typedConfig": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "commonTlsContext": {
                "tlsCertificates": [{
                    "certificateChain": {"filename": envoy.cert()},
                    "privateKey": {"filename": envoy.key()},
                }],
                "tlsParams": {"tlsMaximumProtocolVersion": "TLSv1_3"},
                "validationContext": {"trustedCa": {"filename": envoy.ca()}},
            },
        }},
        "typedExtensionProtocolOptions": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicitHttpConfig": {"http2ProtocolOptions": {
                "initialConnectionWindowSize": 1048576,
                "initialStreamWindowSize": 65536,
            }},
        }},
    })
}

/// A running Envoy and the port of each of its gateway listeners, in order.
pub struct Envoy {
    pub ports: Vec<u16>,
    pub admin: u16,
    _process: ChildGuard,
}

impl Envoy {
    /// Envoy with `listeners`, calling tollgate on `tollgate` with `envoy`'s certificate;
    /// `flags` go on its command line.
    pub async fn start(
        dir: &Path,
        listeners: &[Listener],
        tollgate: u16,
        envoy: &Secret,
        flags: &[&str],
    ) -> Self {
        let ports: Vec<u16> = listeners.iter().map(|_| free_port()).collect();
        let (admin, backend) = (free_port(), free_port());
        let mut all: Vec<Value> = listeners
            .iter()
            .zip(&ports)
            .map(|(listener, port)| gateway_listener(listener, *port))
            .collect();
        all.push(backend_listener(backend));
        let config = json!({
            "admin": {"address": socket(admin)},
            "staticResources": {
                "listeners": all,
                "clusters": [
                    ratelimit_cluster(tollgate, envoy),
                    {"name": "backend", "type": "STATIC", "loadAssignment": {"clusterName": "backend",
                        "endpoints": [{"lbEndpoints": [{"endpoint": {"address": socket(backend)}}]}]}},
                ],
            },
        });
        let file = dir.join("envoy.json");
        std::fs::write(&file, serde_json::to_string_pretty(&config).unwrap()).unwrap();
        let process = run_envoy_with(&file, admin, flags).await;
        Self {
            ports,
            admin,
            _process: process,
        }
    }
}
