//! The reference's xDS variables (`CONFIG_TYPE=GRPC_XDS_SOTW`), as `--config-xds` and its
//! flags.

use super::reader::Reader;
use super::translation::{EnvError, refuse};

impl Reader<'_> {
    /// The flags of the xDS config source.
    pub(super) fn xds(&mut self) -> Result<Vec<String>, EnvError> {
        let mut flags: Vec<String> = Vec::new();
        let mut add = |flag: &str, value: String| flags.extend([flag.to_owned(), value]);
        add("--config-xds", self.text("CONFIG_GRPC_XDS_SERVER_URL"));
        add("--xds-node-id", self.text("CONFIG_GRPC_XDS_NODE_ID"));
        // `key=value,…`; an entry without `=` is skipped, as the reference skips it.
        let metadata = self.text("CONFIG_GRPC_XDS_NODE_METADATA");
        for entry in metadata.split(',').filter(|entry| entry.contains('=')) {
            add("--xds-node-metadata", entry.to_owned());
        }
        // `name:value,…`.
        let headers = self.text("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS");
        for entry in headers.split(',').filter(|entry| !entry.is_empty()) {
            let Some((name, value)) = entry.split_once(':') else {
                return Err(refuse(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                    format!("{entry:?} is not name:value"),
                ));
            };
            add("--xds-header", format!("{name}={value}"));
        }
        let tls = self.switch("CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
        let ca = self.text("CONFIG_GRPC_XDS_SERVER_TLS_CACERT");
        let cert = self.text("CONFIG_GRPC_XDS_CLIENT_TLS_CERT");
        let key = self.text("CONFIG_GRPC_XDS_CLIENT_TLS_KEY");
        let san = self.text("CONFIG_GRPC_XDS_SERVER_TLS_SAN");
        if tls {
            if ca.is_empty() {
                return Err(refuse(
                    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                    "required with CONFIG_GRPC_XDS_SERVER_USE_TLS: tollgate trusts only the CA it is given",
                ));
            }
            add("--xds-tls-ca", ca);
            if !cert.is_empty() || !key.is_empty() {
                add("--xds-tls-cert", cert);
                add("--xds-tls-key", key);
            }
            if !san.is_empty() {
                add("--xds-tls-server-name", san);
            }
        }
        add(
            "--xds-backoff-initial",
            self.text("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"),
        );
        add(
            "--xds-backoff-max",
            self.text("XDS_CLIENT_BACKOFF_MAX_INTERVAL"),
        );
        let max = self.text("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES");
        if !max.is_empty() {
            add("--xds-max-message-bytes", max);
        }
        if self.switch("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
            flags.push("--serve-before-config".into());
        }
        Ok(flags)
    }
}
