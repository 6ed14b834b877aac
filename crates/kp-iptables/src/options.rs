//! Settings of the iptables renderer that come from configuration or from
//! what the host supports, and the local-traffic detector in iptables
//! arguments.

use ipnet::IpNet;
use kp_model::IpFamily;
use kp_node::{LocalDetector, LocalMatch, MasqueradeMark};

use crate::IptablesError;

/// Renderer settings. See [`IptablesOptions::default`] for the defaults,
/// which match upstream's on a current iptables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesOptions {
    /// `iptables.masqueradeBit`: the packet mark that asks for SNAT
    /// (default bit 14 → `0x00004000`).
    pub masquerade_mark: MasqueradeMark,
    /// `iptables.masqueradeAll`: SNAT all traffic sent to ClusterIPs.
    pub masquerade_all: bool,
    /// `detectLocalMode` and its parameters.
    pub local_detector: LocalDetector,
    /// `iptables.localhostNodePorts`: NodePorts answer on 127.0.0.0/8 (IPv4
    /// only; also off when the node port addresses exclude loopback).
    pub localhost_node_ports: bool,
    /// iptables supports `MASQUERADE --random-fully` (iptables ≥ 1.6.2).
    pub random_fully: bool,
    /// `net.netfilter.nf_conntrack_tcp_be_liberal` is set: no DROP rule for
    /// INVALID packets in KUBE-FORWARD (upstream issue 117924).
    pub conntrack_tcp_be_liberal: bool,
    /// The nfacct counter `localhost_nps_accepted_pkts` exists, so localhost
    /// NodePort traffic gets its own counting rule.
    pub nfacct_localhost_node_ports: bool,
    /// The nfacct counter `ct_state_invalid_dropped_pkts` exists, so the
    /// INVALID DROP rule counts its packets.
    pub nfacct_invalid_dropped: bool,
}

/// `-s`/`-i` arguments of a detector resolved for one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDetector {
    /// Arguments matching local traffic, e.g. `-s 10.244.0.0/16`.
    pub if_local: String,
    /// Arguments matching other traffic, e.g. `! -s 10.244.0.0/16`.
    pub if_not_local: String,
}

impl Default for IptablesOptions {
    fn default() -> Self {
        IptablesOptions {
            masquerade_mark: MasqueradeMark::default(),
            masquerade_all: false,
            local_detector: LocalDetector::None,
            localhost_node_ports: true,
            random_fully: true,
            conntrack_tcp_be_liberal: false,
            nfacct_localhost_node_ports: false,
            nfacct_invalid_dropped: false,
        }
    }
}

impl IptablesOptions {
    /// Checks values a user can get wrong.
    pub fn validate(&self) -> Result<(), IptablesError> {
        self.local_detector.validate()?;
        Ok(())
    }

    /// The detector's matches for `family`; `node_pod_cidrs` are the Node's
    /// `spec.podCIDRs` for [`LocalDetector::NodeCidr`].
    pub(crate) fn resolve_detector(
        &self,
        family: IpFamily,
        node_pod_cidrs: &[IpNet],
    ) -> Option<ResolvedDetector> {
        ResolvedDetector::resolve(&self.local_detector, family, node_pod_cidrs)
    }
}

impl ResolvedDetector {
    /// The `iptables` arguments that tell local traffic from other traffic
    /// for `family` (the IPVS mode's iptables rules use them too);
    /// `node_pod_cidrs` are the Node's `spec.podCIDRs` for
    /// [`LocalDetector::NodeCidr`]. `None` when the detector has nothing
    /// for `family`.
    pub fn resolve(
        detector: &LocalDetector,
        family: IpFamily,
        node_pod_cidrs: &[IpNet],
    ) -> Option<Self> {
        let (flag, value) = match detector.resolve(family, node_pod_cidrs)? {
            LocalMatch::Source(cidr) => ("-s", cidr.to_string()),
            LocalMatch::Interface(name) => ("-i", name),
            LocalMatch::InterfacePrefix(prefix) => ("-i", format!("{prefix}+")),
        };
        Some(Self {
            if_local: format!("{flag} {value}"),
            if_not_local: format!("! {flag} {value}"),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn detector_uses_first_cidr_of_the_family() {
        let options = IptablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![
                "fd00:10:244::/48".parse().unwrap(),
                "10.244.0.0/16".parse().unwrap(),
                "10.245.0.0/16".parse().unwrap(),
            ]),
            ..IptablesOptions::default()
        };
        let v4 = options.resolve_detector(IpFamily::V4, &[]).unwrap();
        assert_eq!(v4.if_local, "-s 10.244.0.0/16");
        assert_eq!(v4.if_not_local, "! -s 10.244.0.0/16");
        let v6 = options.resolve_detector(IpFamily::V6, &[]).unwrap();
        assert_eq!(v6.if_local, "-s fd00:10:244::/48");
    }

    #[test]
    fn interface_detectors() {
        let prefix = IptablesOptions {
            local_detector: LocalDetector::InterfaceNamePrefix("veth".into()),
            ..IptablesOptions::default()
        };
        assert_eq!(
            prefix
                .resolve_detector(IpFamily::V4, &[])
                .unwrap()
                .if_not_local,
            "! -i veth+"
        );
        let bad = IptablesOptions {
            local_detector: LocalDetector::BridgeInterface(String::new()),
            ..IptablesOptions::default()
        };
        assert!(bad.validate().is_err());
    }
}
