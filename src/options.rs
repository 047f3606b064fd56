//! The parts' options structs. Each part of the server declares what configures it as one
//! struct whose fields are `tollgate serve`'s flags (a `clap::Args`, flattened into `serve`),
//! so that a flag, its `TOLLGATE_*` variable, its help and its default are written once, in
//! its `#[arg]`. The struct's `Default` is those defaults: what `serve` would get from no flag
//! and no variable (`defaults`).

/// The value of every flag of `T` given neither on a command line nor in the environment: the
/// defaults its `#[arg]`s declare.
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true))
        .mut_args(|arg| arg.env(None));
    let parsed = command
        .try_get_matches_from(std::iter::empty::<&str>())
        .and_then(|matches| T::from_arg_matches(&matches));
    match parsed {
        Ok(options) => options,
        // Every flag of an options struct has a default or is optional: a missing one is a
        // mistake in the declaration, caught by each struct's test.
        Err(error) => panic!("an options struct without a default: {error}"),
    }
}

/// `key=value`, neither empty (tags, node metadata, headers).
pub fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// An absolute URL path.
pub fn url_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(char::is_whitespace) {
        Ok(text.to_owned())
    } else {
        Err(format!("{text:?} is not a path starting with /"))
    }
}

/// A duration (`50ms`, `1s`, `2m`) above zero: for timeouts, where zero would fail every
/// call.
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be above zero".into()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

/// A listen address: `HOST:PORT` (an IP or a name of this host, such as `localhost`),
/// `[IPv6]:PORT`, or `:PORT` for every address of the host (IPv6 and IPv4 where the host
/// has IPv6, else IPv4; `[::]:PORT` says the same).
pub fn listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{port:?} is not a port"))?;
        return Ok(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)));
    }
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} is not HOST:PORT or :PORT"));
    };
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a port"))?;
    text.to_socket_addrs()
        .ok()
        .and_then(|mut found| found.next())
        .ok_or_else(|| format!("{host:?} is not an address or a name of this host"))
}

/// `url` with its user information and any password parameter replaced by `<redacted>`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => format!("<redacted>{}", &rest[at..]),
        None => rest.to_owned(),
    };
    let query: Vec<String> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.contains("pass") => format!("{key}=<redacted>"),
            _ => pair.to_owned(),
        })
        .collect();
    let scheme = if scheme.is_empty() {
        String::new()
    } else {
        format!("{scheme}://")
    };
    if query.is_empty() {
        format!("{scheme}{rest}")
    } else {
        format!("{scheme}{rest}?{}", query.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_takes_a_name_a_bare_port_or_an_ip() {
        assert_eq!(listen_addr(":8081").unwrap().to_string(), "[::]:8081");
        assert_eq!(
            listen_addr("0.0.0.0:8081").unwrap().to_string(),
            "0.0.0.0:8081"
        );
        assert_eq!(listen_addr("[::1]:9").unwrap().to_string(), "[::1]:9");
        assert!(listen_addr("localhost:8081").unwrap().ip().is_loopback());
        assert_eq!(listen_addr(":http").unwrap_err(), "\"http\" is not a port");
        assert_eq!(
            listen_addr("8081").unwrap_err(),
            "\"8081\" is not HOST:PORT or :PORT"
        );
        assert_eq!(
            listen_addr("no-such-host.invalid:1").unwrap_err(),
            "\"no-such-host.invalid\" is not an address or a name of this host"
        );
    }
}
