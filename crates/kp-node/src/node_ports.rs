//! Where NodePorts answer (`nodePortAddresses`).

use std::net::IpAddr;

use ipnet::IpNet;
use kp_config::{InvalidValue, KubeProxyConfiguration};
use kp_model::{IpFamily, NodeInfo};

/// Where NodePorts answer (`nodePortAddresses`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// On every local address: no `nodePortAddresses` (or `all`), or a CIDR
    /// of length 0 for the family.
    #[default]
    All,
    /// On the host's addresses inside `cidrs`, looked up again on every
    /// sync (interfaces come and go), plus, with `primary`, the node's
    /// primary address of the family: the first address of that family in
    /// the Node's `status.addresses` (upstream's `primary` keyword, which
    /// it resolves to the node IPs it detected at start).
    Select {
        /// CIDRs of both families; those of the other family are ignored.
        cidrs: Vec<IpNet>,
        /// The `primary` keyword was given.
        primary: bool,
    },
}

impl NodePortAddresses {
    /// `nodePortAddresses` of `config`, with the mode's default (the
    /// nftables mode's is `primary`, every other mode's `all`).
    pub fn from_config(config: &KubeProxyConfiguration) -> Result<Self, InvalidValue> {
        Self::parse(&config.effective_node_port_addresses())
    }

    /// Parses `nodePortAddresses` as configured: CIDRs and the keyword
    /// `primary`; an empty list means [`NodePortAddresses::All`].
    pub fn parse(values: &[String]) -> Result<Self, InvalidValue> {
        if values.is_empty() {
            return Ok(Self::All);
        }
        let mut cidrs = Vec::new();
        let mut primary = false;
        for value in values {
            if value == "primary" {
                primary = true;
                continue;
            }
            let cidr = value.parse::<IpNet>().map_err(|_| InvalidValue {
                field: "nodePortAddresses",
                value: value.clone(),
                expected: "CIDRs such as 192.168.99.0/24, or the keyword primary",
            })?;
            cidrs.push(cidr);
        }
        Ok(Self::Select { cidrs, primary })
    }

    /// The addresses NodePorts answer on for `family`, among the host's
    /// `local` addresses; `None` means every local address. As upstream,
    /// a selection with no CIDR of the family (and no `primary`) selects
    /// everything.
    pub fn resolve(
        &self,
        family: IpFamily,
        node: &NodeInfo,
        local: &[IpAddr],
    ) -> Option<Vec<IpAddr>> {
        let Self::Select { cidrs, primary } = self else {
            return None;
        };
        let of_family: Vec<&IpNet> = cidrs
            .iter()
            .filter(|cidr| family.matches(&cidr.addr()))
            .collect();
        if (of_family.is_empty() && !primary) || of_family.iter().any(|c| c.prefix_len() == 0) {
            return None;
        }
        let mut selected: Vec<IpAddr> = local
            .iter()
            .copied()
            .filter(|ip| family.matches(ip) && of_family.iter().any(|c| c.contains(ip)))
            .collect();
        if *primary {
            selected.extend(node.addresses_of(family).next());
        }
        selected.sort_unstable();
        selected.dedup();
        Some(selected)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    fn parse(list: &[&str]) -> NodePortAddresses {
        let values: Vec<String> = list.iter().map(ToString::to_string).collect();
        NodePortAddresses::parse(&values).unwrap()
    }

    #[test]
    fn a_selection_keeps_the_local_addresses_inside_its_cidrs() {
        let local = ips(&["127.0.0.1", "192.168.99.2", "10.0.0.5", "fd00::2"]);
        let node = NodeInfo::default();
        let selected = parse(&["192.168.99.0/24", "127.0.0.0/8"]);
        assert_eq!(
            selected.resolve(IpFamily::V4, &node, &local),
            Some(ips(&["127.0.0.1", "192.168.99.2"]))
        );
        assert_eq!(
            selected.resolve(IpFamily::V6, &node, &local),
            None,
            "no CIDR of the family selects every address"
        );
        assert_eq!(
            parse(&["0.0.0.0/0"]).resolve(IpFamily::V4, &node, &local),
            None
        );
        assert_eq!(parse(&[]).resolve(IpFamily::V4, &node, &local), None);
    }

    #[test]
    fn primary_adds_the_nodes_first_address_of_the_family() {
        let node = NodeInfo {
            addresses: ips(&["fd00::2", "192.168.99.2", "192.168.99.3"]),
            ..NodeInfo::default()
        };
        assert_eq!(
            parse(&["primary"]).resolve(IpFamily::V4, &node, &[]),
            Some(ips(&["192.168.99.2"]))
        );
        assert_eq!(
            parse(&["primary"]).resolve(IpFamily::V6, &node, &[]),
            Some(ips(&["fd00::2"]))
        );
    }

    #[test]
    fn a_value_that_is_no_cidr_names_the_field() {
        let error = NodePortAddresses::parse(&["192.168.99.0/33".into()]).unwrap_err();
        assert_eq!(error.field, "nodePortAddresses");
        assert_eq!(error.value, "192.168.99.0/33");
    }
}
