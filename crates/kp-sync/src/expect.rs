//! What a new connection to each address of a service port should do, read
//! from the port's plan: the oracle that `kube-proxy check` holds a mode's
//! kernel state against, whatever the mode.
//!
//! Each [`Probe`] is one connection: a frontend address of the service port
//! (its ClusterIP, a node address with its NodePort, an external IP, a load
//! balancer IP), a client, and what must happen ([`Expected`]). The clients
//! are addresses outside the cluster (TEST-NET-1, `192.0.2.1`, or
//! `2001:db8::1`), so that neither a pod nor the node itself is assumed;
//! for a load balancer IP with `loadBalancerSourceRanges`, one client inside
//! the first range and the outside client, refused by the firewall.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use kp_model::{IpFamily, Protocol, ServicePortName};

use crate::backend::ServicePortState;

/// A client outside the cluster and the node.
pub fn outside_client(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    }
}

/// Which address of the service port a probe goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Frontend {
    /// The ClusterIP and service port.
    ClusterIp,
    /// A node address and the NodePort.
    NodePort,
    /// An external IP and the service port.
    ExternalIp,
    /// A load balancer ingress IP and the service port.
    LoadBalancerIp,
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ClusterIp => "cluster IP",
            Self::NodePort => "node port",
            Self::ExternalIp => "external IP",
            Self::LoadBalancerIp => "load balancer IP",
        })
    }
}

/// What must happen to a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// DNATed to one of exactly these endpoints; masqueraded on every path
    /// (`Some(true)`), on none (`Some(false)`), or either (`None`: it
    /// depends on how the mode tells pods apart, not on the Service).
    Endpoints {
        /// Every endpoint the connection may go to.
        endpoints: BTreeSet<SocketAddr>,
        /// Whether the source is rewritten.
        masquerade: Option<bool>,
    },
    /// An endpoint on this node connecting to its own Service: DNATed to
    /// one of exactly these endpoints, and masqueraded on every path that
    /// leads back to `itself` (its reply would otherwise go straight to
    /// itself, from an address it never connected to); the other paths as
    /// for any pod.
    Hairpin {
        /// Every endpoint the connection may go to.
        endpoints: BTreeSet<SocketAddr>,
        /// The endpoint's address, the connection's source.
        itself: IpAddr,
    },
    /// Refused with an ICMP error: no endpoint anywhere.
    Reject,
    /// Dropped: a source range refuses the client.
    Drop,
    /// Refused: no endpoint anywhere, to a client outside the load balancer
    /// IP's source ranges: rejected by the iptables and nftables modes
    /// (which filter only a Service with endpoints, as upstream's), dropped
    /// by the IPVS mode (whose source-range sets hold every load balancer
    /// IP, as upstream's).
    RejectUnlessFiltered,
    /// Refused because a Local policy leaves no endpoint on this node while
    /// endpoints exist elsewhere: dropped by the iptables and nftables modes
    /// (so a load balancer's health check moves the traffic), answered with
    /// ICMP port unreachable by the IPVS mode's empty virtual server, as
    /// upstream's IPVS mode does.
    NoLocalEndpoint,
}

impl Expected {
    /// The connection reaches no endpoint.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Endpoints { .. } | Self::Hairpin { .. })
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Endpoints {
                endpoints,
                masquerade,
            } => {
                let list: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
                write!(f, "DNAT to one of {{{}}}", list.join(", "))?;
                match masquerade {
                    Some(true) => f.write_str(", masqueraded"),
                    Some(false) => f.write_str(", not masqueraded"),
                    None => Ok(()),
                }
            }
            Self::Hairpin { endpoints, itself } => {
                let list: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "DNAT to one of {{{}}}, masqueraded back to {itself}",
                    list.join(", ")
                )
            }
            Self::Reject => f.write_str("rejected"),
            Self::Drop => f.write_str("dropped"),
            Self::NoLocalEndpoint => f.write_str("refused (no local endpoint)"),
            Self::RejectUnlessFiltered => {
                f.write_str("refused (no endpoint; outside the source ranges)")
            }
        }
    }
}

/// One connection to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The service port.
    pub service: ServicePortName,
    /// Which of its addresses.
    pub frontend: Frontend,
    /// The address and port connected to.
    pub destination: SocketAddr,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The client's address: outside the cluster and the node, or (for
    /// [`Expected::Hairpin`]) an endpoint of this node.
    pub source: IpAddr,
    /// What must happen.
    pub expected: Expected,
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}/{} from {}",
            self.service,
            self.frontend,
            self.destination,
            self.protocol.as_rule_str(),
            self.source
        )
    }
}

/// The probes of one service port in `family`; `node_ips` are the node's
/// addresses a NodePort is reached on.
pub fn probes(
    name: &ServicePortName,
    state: &ServicePortState,
    family: IpFamily,
    node_ips: &[IpAddr],
) -> Vec<Probe> {
    let port = &state.port;
    let plan = &state.plan;
    let outside = outside_client(family);
    let endpoint_set = |endpoints: &[std::sync::Arc<kp_model::Endpoint>]| -> BTreeSet<SocketAddr> {
        endpoints
            .iter()
            .map(|endpoint| SocketAddr::new(endpoint.ip, endpoint.port))
            .collect()
    };
    let internal = {
        let endpoints = state.endpoints.for_internal_traffic(port);
        if !plan.has_endpoints {
            Expected::Reject
        } else if endpoints.is_empty() {
            Expected::NoLocalEndpoint
        } else {
            Expected::Endpoints {
                endpoints: endpoint_set(endpoints),
                masquerade: None,
            }
        }
    };
    // From outside the cluster and the node: local endpoints only under
    // externalTrafficPolicy: Local, with the client's address kept;
    // otherwise every cluster endpoint, masqueraded so replies come back
    // through this node.
    let external = {
        let endpoints = state.endpoints.for_traffic_from_outside(port);
        if !plan.has_endpoints {
            Expected::Reject
        } else if endpoints.is_empty() {
            Expected::NoLocalEndpoint
        } else {
            Expected::Endpoints {
                endpoints: endpoint_set(endpoints),
                masquerade: Some(!plan.external_policy_local),
            }
        }
    };
    let probe = |frontend, destination: SocketAddr, source, expected: &Expected| Probe {
        service: name.clone(),
        frontend,
        destination,
        protocol: port.protocol,
        source,
        expected: expected.clone(),
    };
    let mut probes = Vec::new();
    if IpFamily::of(&port.cluster_ip) == family && !port.cluster_ip.is_unspecified() {
        let cluster_ip = SocketAddr::new(port.cluster_ip, port.port);
        probes.push(probe(Frontend::ClusterIp, cluster_ip, outside, &internal));
        // An endpoint of this node reaching its own Service (hairpin): the
        // first local one the ClusterIP may lead to.
        if let Expected::Endpoints { endpoints, .. } = &internal {
            let local = state
                .endpoints
                .for_internal_traffic(port)
                .iter()
                .find(|endpoint| endpoint.is_local);
            if let Some(local) = local {
                let hairpin = Expected::Hairpin {
                    endpoints: endpoints.clone(),
                    itself: local.ip,
                };
                probes.push(probe(Frontend::ClusterIp, cluster_ip, local.ip, &hairpin));
            }
        }
    }
    if let Some(node_port) = port.node_port {
        for ip in node_ips.iter().filter(|ip| IpFamily::of(ip) == family) {
            probes.push(probe(
                Frontend::NodePort,
                SocketAddr::new(*ip, node_port),
                outside,
                &external,
            ));
        }
    }
    for ip in port
        .external_ips
        .iter()
        .filter(|ip| IpFamily::of(ip) == family)
    {
        probes.push(probe(
            Frontend::ExternalIp,
            SocketAddr::new(*ip, port.port),
            outside,
            &external,
        ));
    }
    let ranges: Vec<_> = port
        .load_balancer_source_ranges
        .iter()
        .filter(|range| IpFamily::of(&range.addr()) == family)
        .collect();
    let filtered = plan.uses_source_ranges_filter;
    for ip in port
        .load_balancer_ips
        .iter()
        .filter(|ip| IpFamily::of(ip) == family)
    {
        let destination = SocketAddr::new(*ip, port.port);
        // Source ranges without any endpoint: the iptables and nftables
        // modes have no firewall then (upstream's `KUBE-FW-` exists only
        // with endpoints) and reject every client; the IPVS mode filters
        // first and drops a client outside the ranges.
        let unfiltered_ranges = !filtered && !plan.has_endpoints && !ranges.is_empty();
        if !filtered && !unfiltered_ranges {
            probes.push(probe(
                Frontend::LoadBalancerIp,
                destination,
                outside,
                &external,
            ));
            continue;
        }
        // The first address of the first range of the family is let in.
        if let Some(range) = ranges.first() {
            let admitted = range.trunc().hosts().next().unwrap_or(range.addr());
            probes.push(probe(
                Frontend::LoadBalancerIp,
                destination,
                admitted,
                &external,
            ));
        }
        if !ranges.iter().any(|range| range.contains(&outside)) {
            let refused = if unfiltered_ranges {
                Expected::RejectUnlessFiltered
            } else {
                Expected::Drop
            };
            probes.push(probe(
                Frontend::LoadBalancerIp,
                destination,
                outside,
                &refused,
            ));
        }
    }
    probes
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::testing::service;

    fn set(addresses: &[&str]) -> BTreeSet<SocketAddr> {
        addresses.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn cluster_ip_goes_to_every_ready_endpoint() {
        let (name, state) = service("ns", "web", "10.96.0.10", 80)
            .endpoint("10.244.1.2", 8080, true)
            .endpoint("10.244.2.2", 8080, false)
            .build();
        let probes = probes(&name, &state, IpFamily::V4, &[]);
        assert_eq!(probes.len(), 2);
        assert_eq!(probes[0].frontend, Frontend::ClusterIp);
        assert_eq!(probes[0].destination, "10.96.0.10:80".parse().unwrap());
        assert_eq!(
            probes[0].expected,
            Expected::Endpoints {
                endpoints: set(&["10.244.1.2:8080", "10.244.2.2:8080"]),
                masquerade: None
            }
        );
        // The local endpoint reaching its own Service.
        assert_eq!(probes[1].destination, probes[0].destination);
        assert_eq!(probes[1].source, "10.244.1.2".parse::<IpAddr>().unwrap());
        assert_eq!(
            probes[1].expected,
            Expected::Hairpin {
                endpoints: set(&["10.244.1.2:8080", "10.244.2.2:8080"]),
                itself: "10.244.1.2".parse().unwrap(),
            }
        );
    }

    #[test]
    fn without_a_local_endpoint_no_hairpin_probe() {
        let (name, state) = service("ns", "web", "10.96.0.10", 80)
            .endpoint("10.244.2.2", 8080, false)
            .build();
        let probes = probes(&name, &state, IpFamily::V4, &[]);
        assert_eq!(probes.len(), 1, "{probes:?}");
        assert!(!matches!(probes[0].expected, Expected::Hairpin { .. }));
    }

    #[test]
    fn external_traffic_policy_local_keeps_the_client_and_the_node() {
        let (name, state) = service("ns", "api", "10.96.0.13", 80)
            .node_port(30081)
            .etp_local()
            .endpoint("10.244.1.5", 8080, true)
            .endpoint("10.244.2.4", 8080, false)
            .build();
        let node_ips = ["192.168.99.2".parse().unwrap()];
        let probes = probes(&name, &state, IpFamily::V4, &node_ips);
        let node_port = probes
            .iter()
            .find(|p| p.frontend == Frontend::NodePort)
            .unwrap();
        assert_eq!(node_port.destination, "192.168.99.2:30081".parse().unwrap());
        assert_eq!(
            node_port.expected,
            Expected::Endpoints {
                endpoints: set(&["10.244.1.5:8080"]),
                masquerade: Some(false)
            }
        );
    }

    #[test]
    fn no_endpoints_is_rejected_and_no_local_endpoints_dropped() {
        let (name, state) = service("ns", "empty", "10.96.0.17", 80)
            .node_port(30090)
            .build();
        let node_ips = ["192.168.99.2".parse().unwrap()];
        for probe in probes(&name, &state, IpFamily::V4, &node_ips) {
            assert_eq!(probe.expected, Expected::Reject, "{probe}");
        }
        let (name, state) = service("ns", "remote", "10.96.0.18", 80)
            .node_port(30091)
            .etp_local()
            .itp_local()
            .endpoint("10.244.2.4", 8080, false)
            .build();
        let all = probes(&name, &state, IpFamily::V4, &node_ips);
        assert_eq!(all.len(), 2);
        for probe in all {
            assert_eq!(probe.expected, Expected::NoLocalEndpoint, "{probe}");
        }
    }

    #[test]
    fn source_ranges_let_the_first_range_in_and_keep_the_outside_client_out() {
        let (name, state) = service("ns", "shop", "10.96.0.12", 443)
            .lb_ip("203.0.113.10")
            .source_range("198.51.100.0/24")
            .endpoint("10.244.1.4", 8443, true)
            .build();
        let lb: Vec<Probe> = probes(&name, &state, IpFamily::V4, &[])
            .into_iter()
            .filter(|p| p.frontend == Frontend::LoadBalancerIp)
            .collect();
        assert_eq!(lb.len(), 2, "{lb:#?}");
        assert_eq!(lb[0].source, "198.51.100.1".parse::<IpAddr>().unwrap());
        assert_eq!(
            lb[0].expected,
            Expected::Endpoints {
                endpoints: set(&["10.244.1.4:8443"]),
                masquerade: Some(true)
            }
        );
        assert_eq!(lb[1].source, outside_client(IpFamily::V4));
        assert_eq!(lb[1].expected, Expected::Drop);
    }
}
