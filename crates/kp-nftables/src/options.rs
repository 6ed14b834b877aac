//! Settings of the nftables renderer that come from configuration, and the
//! local-traffic detector in nft syntax.

use ipnet::IpNet;
use kp_model::IpFamily;
use kp_node::{LocalDetector, LocalMatch, MasqueradeMark};

use crate::model::{AddrField, Address, Expr};
use crate::NftablesError;

/// Renderer settings; [`NftablesOptions::default`] matches upstream's
/// defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesOptions {
    /// `nftables.masqueradeBit`: the packet mark that asks for SNAT
    /// (default bit 14 → `0x00004000`).
    pub masquerade_mark: MasqueradeMark,
    /// `nftables.masqueradeAll`: SNAT all traffic sent to ClusterIPs.
    pub masquerade_all: bool,
    /// `detectLocalMode` and its parameters (shared with the iptables mode).
    pub local_detector: LocalDetector,
}

/// How the table selects a Service's endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Upstream's layout: one `endpoint-` chain per endpoint, chosen by one
    /// `numgen` rule per endpoint in the `service-` (or `local-`) chain.
    Chains,
    /// The data layout of issue 26 (docs/nft-layout-experiment.md,
    /// docs/DESIGN.md): a service port's endpoints are slot elements
    /// `ENTRY . SLOT : address . port` of one map per pool and protocol,
    /// drawn by the class rule of the entry's endpoint count; hairpin
    /// masquerade is decided by the `hairpin-endpoints` set of `A . A`
    /// pairs. An endpoint added, removed or replaced, or a readiness flip,
    /// changes elements only. A service port with ClientIP affinity is
    /// written as in [`Layout::Chains`] (upstream's affinity: per service
    /// port, through every entry). The default.
    #[default]
    Data,
}

/// A detector resolved for one family, as nft match expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NftDetector {
    /// Matches traffic from this cluster's pods, e.g. `ip saddr 10.244.0.0/16`.
    pub if_local: Expr,
    /// Matches other traffic, e.g. `ip saddr != 10.244.0.0/16`.
    pub if_not_local: Expr,
}

impl Default for NftablesOptions {
    fn default() -> Self {
        Self {
            masquerade_mark: MasqueradeMark::default(),
            masquerade_all: false,
            local_detector: LocalDetector::None,
        }
    }
}

impl NftablesOptions {
    /// Checks values a user can get wrong.
    pub fn validate(&self) -> Result<(), NftablesError> {
        self.local_detector.validate()?;
        Ok(())
    }

    /// The detector's matches for `family`; `node_pod_cidrs` are the Node's
    /// `spec.podCIDRs` for [`LocalDetector::NodeCidr`].
    pub(crate) fn resolve_detector(
        &self,
        family: IpFamily,
        node_pod_cidrs: &[IpNet],
    ) -> Option<NftDetector> {
        let source = |cidr: IpNet, negate| Expr::AddrIs {
            field: AddrField::Source,
            negate,
            value: Address::Prefix(cidr),
        };
        let interface = |name: &str, prefix: bool, negate| Expr::InputInterface {
            negate,
            name: std::sync::Arc::from(name),
            prefix,
        };
        Some(match self.local_detector.resolve(family, node_pod_cidrs)? {
            LocalMatch::Source(cidr) => NftDetector {
                if_local: source(cidr, false),
                if_not_local: source(cidr, true),
            },
            LocalMatch::Interface(name) => NftDetector {
                if_local: interface(&name, false, false),
                if_not_local: interface(&name, false, true),
            },
            LocalMatch::InterfacePrefix(prefix) => NftDetector {
                if_local: interface(&prefix, true, false),
                if_not_local: interface(&prefix, true, true),
            },
        })
    }
}

/// `ip` or `ip6`: the table family and the address match keyword.
pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn detectors_in_nft_syntax() {
        let options = NftablesOptions {
            local_detector: LocalDetector::ClusterCidr(vec![
                "fd00:10:244::/48".parse().unwrap(),
                "10.244.0.0/16".parse().unwrap(),
            ]),
            ..NftablesOptions::default()
        };
        let v4 = options.resolve_detector(IpFamily::V4, &[]).unwrap();
        assert_eq!(
            v4.if_not_local.text(IpFamily::V4).to_string(),
            "ip saddr != 10.244.0.0/16"
        );
        let v6 = options.resolve_detector(IpFamily::V6, &[]).unwrap();
        assert_eq!(
            v6.if_local.text(IpFamily::V6).to_string(),
            "ip6 saddr fd00:10:244::/48"
        );
        let prefix = NftablesOptions {
            local_detector: LocalDetector::InterfaceNamePrefix("veth".into()),
            ..NftablesOptions::default()
        };
        let resolved = prefix.resolve_detector(IpFamily::V4, &[]).unwrap();
        assert_eq!(
            resolved.if_local.text(IpFamily::V4).to_string(),
            "iifname veth*"
        );
        let bad = NftablesOptions {
            local_detector: LocalDetector::BridgeInterface("a b".into()),
            ..NftablesOptions::default()
        };
        assert!(bad.validate().is_err());
    }
}
