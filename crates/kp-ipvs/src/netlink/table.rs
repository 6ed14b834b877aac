//! Every real server of the namespace in one read of the kernel's IPVS
//! table, `/proc/net/ip_vs` (the text `ipvsadm -Ln` shows, with hex
//! addresses).
//!
//! A netlink destination dump names one virtual server, so listing the
//! real servers of 10,000 services over netlink takes 10,000 dumps, and
//! those dumps were most of a full sync at that size. The table holds
//! every service with its real servers and reads in one pass. It lacks the
//! services' scheduler flags, so the services themselves still come from
//! the netlink service dump.
//!
//! The kernel prints one service with all its real servers as one record,
//! so a service is never cut in two even when the table changes between
//! two reads of the file.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use kp_model::Protocol;

use crate::netlink::ipvs::ListedDest;
use crate::state::ServiceKey;

/// The table of the calling thread's network namespace. `/proc/net` would
/// name the namespace of the process's main thread, and the listing
/// threads of tests and the sync loop may have entered another.
pub const TABLE_PATH: &str = "/proc/thread-self/net/ip_vs";

/// Reads [`TABLE_PATH`]: the real servers of every address:port service.
/// `NotFound` when the kernel has no IPVS table (the module is not loaded).
pub fn read() -> io::Result<HashMap<ServiceKey, Vec<ListedDest>>> {
    let text = std::fs::read_to_string(TABLE_PATH)?;
    parse(&text).map_err(|error| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{TABLE_PATH}: {error}"))
    })
}

/// Parses the table's text. Firewall-mark services and services of
/// protocols other than TCP, UDP and SCTP are skipped with their real
/// servers: the mode never creates them.
pub fn parse(text: &str) -> Result<HashMap<ServiceKey, Vec<ListedDest>>, String> {
    let mut table: HashMap<ServiceKey, Vec<ListedDest>> = HashMap::new();
    // The service the following "->" lines belong to; None while skipping.
    let mut current: Option<ServiceKey> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else {
            continue;
        };
        let bad = |why: &str| format!("line {number} {line:?}: {why}");
        if first == "->" {
            let Some(service) = current else {
                continue;
            };
            let address = fields.next().ok_or_else(|| bad("no real server"))?;
            // RemoteAddress:Port Forward Weight ActiveConn InActConn
            let numbers: Vec<&str> = fields.skip(1).collect();
            let [weight, active, inactive] = numbers[..] else {
                return Err(bad(
                    "expected forward, weight, active and inactive connections",
                ));
            };
            let count = |field: &str| -> Result<u32, String> {
                field
                    .parse::<u32>()
                    .map_err(|_| bad(&format!("{field:?} is not a count")))
            };
            let dest = ListedDest {
                address: socket_address(address).ok_or_else(|| bad("bad real server address"))?,
                weight: count(weight)?,
                connections: count(active)?.saturating_add(count(inactive)?),
            };
            table.entry(service).or_default().push(dest);
            continue;
        }
        current = None;
        let protocol = match first {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            // The header, firewall-mark services, other protocols.
            _ => continue,
        };
        let address = fields.next().ok_or_else(|| bad("no service address"))?;
        let address = socket_address(address).ok_or_else(|| bad("bad service address"))?;
        let key = ServiceKey {
            address: address.ip(),
            protocol,
            port: address.port(),
        };
        table.entry(key).or_default();
        current = Some(key);
    }
    Ok(table)
}

/// `0A600001:0050` (IPv4 and port in hex) or
/// `[fd00:0010:0096:0000:0000:0000:0000:000a]:0050`.
fn socket_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.rsplit_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match address.strip_prefix('[') {
        Some(v6) => IpAddr::V6(v6.strip_suffix(']')?.parse::<Ipv6Addr>().ok()?),
        None if address.len() == 8 => {
            IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(address, 16).ok()?))
        }
        None => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The shape the kernel prints, with a persistent service, an IPv6
    /// service, a firewall-mark service and a service without real servers.
    const TABLE: &str = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0050 rr 
  -> 0AF40102:1F90      Masq    1      2          3         
  -> 0AF40103:1F90      Masq    0      0          1         
UDP  0A600014:0035 rr persistent 10800 FFFFFFFF
  -> 0AF40103:0035      Masq    1      0          0         
FWM  00000007 rr 
  -> 0AF40109:0050      Masq    1      0          0         
TCP  0A60000E:0050 sh ops 
TCP  [fd00:0010:0096:0000:0000:0000:0000:0010]:0050 rr 
  -> [fd00:0010:0244:0001:0000:0000:0000:0002]:1F90      Masq    1      0          0         
";

    fn key(address: &str, protocol: Protocol, port: u16) -> ServiceKey {
        ServiceKey {
            address: address.parse().unwrap(),
            protocol,
            port,
        }
    }

    fn reals(dests: &[ListedDest]) -> Vec<(String, u32, u32)> {
        dests
            .iter()
            .map(|d| (d.address.to_string(), d.weight, d.connections))
            .collect()
    }

    #[test]
    fn every_address_port_service_is_read_with_its_real_servers() {
        let table = parse(TABLE).unwrap();
        assert_eq!(table.len(), 4, "{table:?}");
        assert_eq!(
            reals(&table[&key("10.96.0.10", Protocol::Tcp, 80)]),
            [
                ("10.244.1.2:8080".to_owned(), 1, 5),
                ("10.244.1.3:8080".to_owned(), 0, 1)
            ]
        );
        assert_eq!(
            reals(&table[&key("10.96.0.20", Protocol::Udp, 53)]),
            [("10.244.1.3:53".to_owned(), 1, 0)]
        );
        assert!(table[&key("10.96.0.14", Protocol::Tcp, 80)].is_empty());
        assert_eq!(
            reals(&table[&key("fd00:10:96::10", Protocol::Tcp, 80)]),
            [("[fd00:10:244:1::2]:8080".to_owned(), 1, 0)]
        );
    }

    #[test]
    fn the_real_servers_of_a_firewall_mark_service_belong_to_no_other() {
        let table = parse(TABLE).unwrap();
        let all: Vec<SocketAddr> = table.values().flatten().map(|d| d.address).collect();
        assert!(!all.contains(&"10.244.1.9:80".parse().unwrap()), "{all:?}");
    }

    #[test]
    fn an_empty_table_has_no_services() {
        let header = TABLE.lines().take(3).collect::<Vec<_>>().join("\n");
        assert!(parse(&header).unwrap().is_empty());
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn a_malformed_line_is_named() {
        for (text, bad) in [
            ("TCP  0A60000A rr\n", "0A60000A"),
            (
                "TCP  0A60000A:0050 rr\n  -> 0AF40102:1F90 Masq one 0 0\n",
                "one",
            ),
            (
                "TCP  0A60000A:0050 rr\n  -> 0AF40102:1F90 Masq 1 0\n",
                "forward",
            ),
            ("UDP  [fd00::zz]:0035 rr\n", "fd00::zz"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains("line "), "{error}");
            assert!(error.contains(bad), "{text:?}: {error}");
        }
    }
}
