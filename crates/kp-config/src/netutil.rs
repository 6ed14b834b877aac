//! Small address helpers with Go's `net` package semantics.

use std::net::IpAddr;

/// Splits `host:port` or `[host]:port` like Go's `net.SplitHostPort`.
///
/// Returns `None` when there is no port, when an unbracketed host contains a
/// colon, or when brackets are unbalanced.
pub(crate) fn split_host_port(input: &str) -> Option<(&str, &str)> {
    let colon = input.rfind(':')?;
    let (host, port) = (&input[..colon], &input[colon + 1..]);
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        if inner.contains(['[', ']']) {
            return None;
        }
        return Some((inner, port));
    }
    if host.contains([':', '[', ']']) || port.contains(['[', ']']) {
        return None;
    }
    Some((host, port))
}

/// Joins a host and port, bracketing IPv6 literals, like Go's `net.JoinHostPort`.
pub(crate) fn join_host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Appends `port` to a bare IP address; leaves `IP:port` and non-IP text alone
/// (upstream `AppendPortIfNeeded`).
pub(crate) fn append_port_if_needed(addr: &str, port: u16) -> String {
    if split_host_port(addr).is_some() {
        return addr.to_owned();
    }
    match addr.parse::<IpAddr>() {
        Ok(_) => join_host_port(addr, port),
        Err(_) => addr.to_owned(),
    }
}

/// Replaces (or adds) the port of `addr`, keeping its host.
pub(crate) fn with_port(addr: &str, port: u16) -> String {
    match split_host_port(addr) {
        Some((host, _)) => join_host_port(host, port),
        None => append_port_if_needed(addr, port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_go() {
        assert_eq!(split_host_port("0.0.0.0:10256"), Some(("0.0.0.0", "10256")));
        assert_eq!(split_host_port("[::1]:10249"), Some(("::1", "10249")));
        assert_eq!(split_host_port(":80"), Some(("", "80")));
        assert_eq!(split_host_port("::1"), None);
        assert_eq!(split_host_port("1.2.3.4"), None);
        assert_eq!(split_host_port("[::1:80"), None);
    }

    #[test]
    fn appends_or_replaces_ports() {
        assert_eq!(append_port_if_needed("1.2.3.4", 10256), "1.2.3.4:10256");
        assert_eq!(append_port_if_needed("fd00::1", 10256), "[fd00::1]:10256");
        assert_eq!(append_port_if_needed("1.2.3.4:99", 10256), "1.2.3.4:99");
        assert_eq!(append_port_if_needed("nonsense", 10256), "nonsense");
        assert_eq!(with_port("1.2.3.4:99", 8080), "1.2.3.4:8080");
        assert_eq!(with_port("[::]:99", 8080), "[::]:8080");
        assert_eq!(with_port("::", 8080), "[::]:8080");
    }
}
