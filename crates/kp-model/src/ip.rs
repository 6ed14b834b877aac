//! Address parsing as the API server accepts it.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parses an IP address the way the Kubernetes API treats it: IPv4 octets may
/// carry leading zeros (read as decimal, as Go's `ParseIPSloppy` does, so
/// objects validated by older API servers keep working), and an IPv4-mapped
/// IPv6 address counts as the IPv4 address it maps.
pub(crate) fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)),
        Ok(ip) => Some(ip),
        Err(_) => parse_ipv4_leading_zeros(text).map(IpAddr::V4),
    }
}

/// Parses `address/prefix`, keeping only the network bits (`10.1.2.3/8` is
/// `10.0.0.0/8`, as Go's `ParseCIDR` returns it).
pub(crate) fn parse_cidr(text: &str) -> Option<IpNet> {
    let (address, prefix) = text.trim().split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let address = parse_ip(address)?;
    IpNet::new(address, prefix).ok().map(|net| net.trunc())
}

fn parse_ipv4_leading_zeros(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn leading_zeros_are_read_as_decimal() {
        assert_eq!(
            parse_ip("010.096.000.041").unwrap().to_string(),
            "10.96.0.41"
        );
    }

    #[test]
    fn an_ipv4_mapped_address_is_ipv4() {
        assert_eq!(
            parse_ip("::ffff:10.96.0.1").unwrap().to_string(),
            "10.96.0.1"
        );
    }

    #[test]
    fn garbage_is_not_an_address() {
        for text in [
            "",
            "10.96.0",
            "10.96.0.1.2",
            "10.96.0.256",
            "1234.1.1.1",
            "host",
        ] {
            assert_eq!(parse_ip(text), None, "{text}");
        }
    }

    #[test]
    fn a_cidr_keeps_only_network_bits() {
        assert_eq!(
            parse_cidr(" 10.1.2.3/8 ").unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(parse_cidr("fd00::1/64").unwrap().to_string(), "fd00::/64");
        for text in ["10.0.0.0", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/+8", "x/8"] {
            assert_eq!(parse_cidr(text), None, "{text}");
        }
    }
}
