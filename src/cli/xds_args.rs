//! `serve`'s flags for rules pushed by a control plane over xDS (`--config-xds`), flattened
//! into `ServeArgs`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::clock::positive_duration;
use crate::options::key_value as tag;
use crate::xds::{XdsOptions, XdsTls};

#[derive(Debug, Args)]
#[command(next_help_heading = "Rules from a control plane (xDS)")]
pub struct XdsArgs {
    /// Take the rules from this xDS control plane (`host:port` or a URL) instead of
    /// --config: `RateLimitConfig` resources over an Aggregated Discovery Service stream, as
    /// Envoy Gateway pushes them to its rate-limit service.
    #[arg(long, env = "TOLLGATE_CONFIG_XDS", conflicts_with = "config")]
    pub config_xds: Option<String>,

    /// The node id sent to the control plane (it keys its snapshots by it).
    #[arg(long, env = "TOLLGATE_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,

    /// Node metadata as `key=value` (repeat, or separate with `,`).
    #[arg(long, env = "TOLLGATE_XDS_NODE_METADATA", value_delimiter = ',', value_parser = tag)]
    pub xds_node_metadata: Vec<(String, String)>,

    /// gRPC metadata sent with the stream, as `name=value` (repeat, or separate with `,`).
    #[arg(long = "xds-header", env = "TOLLGATE_XDS_HEADERS", value_delimiter = ',', value_parser = tag)]
    pub xds_headers: Vec<(String, String)>,

    /// PEM CA certificates that sign the control plane's certificate: TLS to it.
    #[arg(long, env = "TOLLGATE_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,

    /// PEM client certificate for the control plane (with --xds-tls-key and --xds-tls-ca).
    #[arg(
        long,
        env = "TOLLGATE_XDS_TLS_CERT",
        requires_all = ["xds_tls_key", "xds_tls_ca"]
    )]
    pub xds_tls_cert: Option<PathBuf>,

    /// PEM private key for --xds-tls-cert.
    #[arg(long, env = "TOLLGATE_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,

    /// The name the control plane's certificate must carry (default: its host).
    #[arg(long, env = "TOLLGATE_XDS_TLS_SERVER_NAME", requires = "xds_tls_ca")]
    pub xds_tls_server_name: Option<String>,

    /// First wait before reconnecting to the control plane; it doubles, jittered.
    #[arg(long, env = "TOLLGATE_XDS_BACKOFF_INITIAL", default_value = "1s", value_parser = positive_duration)]
    pub xds_backoff_initial: Duration,

    /// Longest wait before reconnecting.
    #[arg(long, env = "TOLLGATE_XDS_BACKOFF_MAX", default_value = "30s", value_parser = positive_duration)]
    pub xds_backoff_max: Duration,

    /// Largest response accepted from the control plane (default: tonic's, 4 MiB).
    #[arg(long, env = "TOLLGATE_XDS_MAX_MESSAGE_BYTES")]
    pub xds_max_message_bytes: Option<usize>,

    /// With --config-xds, be ready before the first rules arrive (unknown domains are
    /// answered OK meanwhile); by default not ready until then.
    #[arg(long, env = "TOLLGATE_SERVE_BEFORE_CONFIG", value_parser = BoolishValueParser::new())]
    pub serve_before_config: bool,
}

impl XdsArgs {
    /// The client's options, when the rules come from a control plane.
    pub fn options(&self, merge_domains: bool) -> Option<XdsOptions> {
        let server = self.config_xds.clone()?;
        let tls = self.xds_tls_ca.clone().map(|ca| XdsTls {
            ca,
            identity: self.xds_tls_cert.clone().zip(self.xds_tls_key.clone()),
            server_name: self.xds_tls_server_name.clone(),
        });
        Some(XdsOptions {
            server,
            node_id: self.xds_node_id.clone(),
            node_metadata: self.xds_node_metadata.clone(),
            headers: self.xds_headers.clone(),
            tls,
            backoff: (self.xds_backoff_initial, self.xds_backoff_max),
            max_message_bytes: self.xds_max_message_bytes,
            merge_domains,
        })
    }
}
