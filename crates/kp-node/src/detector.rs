//! The local-traffic detector (`detectLocalMode`), upstream's
//! `proxyutil.LocalTrafficDetector`: one decision for every mode, which each
//! mode writes in its own rule language.

use ipnet::IpNet;
use kp_config::{InvalidValue, KubeProxyConfiguration, LocalMode};
use kp_model::IpFamily;

/// Longest interface name Linux accepts (IFNAMSIZ − 1).
const MAX_INTERFACE_NAME_LEN: usize = 15;

/// How traffic from this cluster's pods is told apart from other traffic
/// (`--detect-local-mode`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detection: ClusterIP traffic is never masqueraded unless
    /// `masqueradeAll`, and eTP Local gets no pod short-circuit.
    #[default]
    None,
    /// `ClusterCIDR`: the source is in the first CIDR of the family.
    ClusterCidr(Vec<IpNet>),
    /// `NodeCIDR`: the source is in the first of the node's pod CIDRs
    /// (`spec.podCIDRs`) of the family, taken from the Node of each sync,
    /// so a change of the Node's CIDRs reaches the rules with the next
    /// (full) sync.
    NodeCidr,
    /// `BridgeInterface`: traffic enters from this bridge.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: traffic enters from an interface whose name
    /// starts with this prefix.
    InterfaceNamePrefix(String),
}

/// A detector resolved for one family: what local traffic matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalMatch {
    /// The source address is in this CIDR (`-s`, `ip saddr`).
    Source(IpNet),
    /// The packet enters from this interface (`-i`, `iifname`).
    Interface(String),
    /// The packet enters from an interface whose name starts with this
    /// (`-i prefix+`, `iifname prefix*`).
    InterfacePrefix(String),
}

impl LocalDetector {
    /// The detector `config` asks for, its interface names checked. With
    /// `ClusterCIDR` and no `clusterCIDR`, there is none (logged, as
    /// upstream does).
    pub fn from_config(config: &KubeProxyConfiguration) -> Result<Self, InvalidValue> {
        let detector = match config.effective_detect_local_mode()? {
            LocalMode::ClusterCidr => {
                let cidrs = config.cluster_cidrs()?;
                if cidrs.is_empty() {
                    tracing::info!(
                        "clusterCIDR not set: traffic from pods cannot be told from other traffic"
                    );
                    Self::None
                } else {
                    Self::ClusterCidr(cidrs)
                }
            }
            LocalMode::NodeCidr => Self::NodeCidr,
            LocalMode::BridgeInterface => {
                Self::BridgeInterface(config.detect_local.bridge_interface.clone())
            }
            LocalMode::InterfaceNamePrefix => {
                Self::InterfaceNamePrefix(config.detect_local.interface_name_prefix.clone())
            }
        };
        detector.validate()?;
        Ok(detector)
    }

    /// Checks the interface name of a `BridgeInterface` or
    /// `InterfaceNamePrefix` detector: 1 to 15 characters (the kernel's
    /// limit) of letters, digits, `-`, `_` and `.`. The kernel accepts more,
    /// but every mode writes the name into a rule (`-i`, `iifname`), and
    /// these are the characters every rule language takes as they are.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        let (field, name) = match self {
            Self::BridgeInterface(name) => ("detectLocal.bridgeInterface", name),
            Self::InterfaceNamePrefix(name) => ("detectLocal.interfaceNamePrefix", name),
            Self::None | Self::ClusterCidr(_) | Self::NodeCidr => return Ok(()),
        };
        let valid = !name.is_empty()
            && name.len() <= MAX_INTERFACE_NAME_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if valid {
            Ok(())
        } else {
            Err(InvalidValue {
                field,
                value: name.clone(),
                expected: "an interface name of 1 to 15 letters, digits, '-', '_' or '.'",
            })
        }
    }

    /// What local traffic of `family` matches; `node_pod_cidrs` are the
    /// Node's `spec.podCIDRs` for [`LocalDetector::NodeCidr`]. `None` when
    /// the detector has nothing for `family`.
    pub fn resolve(&self, family: IpFamily, node_pod_cidrs: &[IpNet]) -> Option<LocalMatch> {
        let of_family = |cidrs: &[IpNet]| {
            cidrs
                .iter()
                .find(|cidr| IpFamily::of(&cidr.addr()) == family)
                .map(IpNet::trunc)
        };
        match self {
            Self::None => None,
            Self::ClusterCidr(cidrs) => of_family(cidrs).map(LocalMatch::Source),
            Self::NodeCidr => of_family(node_pod_cidrs).map(LocalMatch::Source),
            Self::BridgeInterface(name) => Some(LocalMatch::Interface(name.clone())),
            Self::InterfaceNamePrefix(prefix) => Some(LocalMatch::InterfacePrefix(prefix.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn cidrs(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|c| c.parse().unwrap()).collect()
    }

    fn config(edit: impl FnOnce(&mut KubeProxyConfiguration)) -> KubeProxyConfiguration {
        let mut config = KubeProxyConfiguration::defaulted();
        edit(&mut config);
        config
    }

    #[test]
    fn cluster_cidr_resolves_to_the_first_cidr_of_the_family() {
        let detector = LocalDetector::ClusterCidr(cidrs(&["10.244.0.0/16", "fd00:10:244::1/48"]));
        assert_eq!(
            detector.resolve(IpFamily::V4, &[]),
            Some(LocalMatch::Source("10.244.0.0/16".parse().unwrap()))
        );
        assert_eq!(
            detector.resolve(IpFamily::V6, &[]),
            Some(LocalMatch::Source("fd00:10:244::/48".parse().unwrap())),
            "host bits are cleared"
        );
        let v4_only = LocalDetector::ClusterCidr(cidrs(&["10.244.0.0/16"]));
        assert_eq!(v4_only.resolve(IpFamily::V6, &[]), None);
    }

    #[test]
    fn node_cidr_takes_the_nodes_pod_cidrs_of_each_sync() {
        let pods = cidrs(&["10.244.1.0/24"]);
        assert_eq!(
            LocalDetector::NodeCidr.resolve(IpFamily::V4, &pods),
            Some(LocalMatch::Source(pods[0]))
        );
        assert_eq!(LocalDetector::NodeCidr.resolve(IpFamily::V4, &[]), None);
    }

    #[test]
    fn the_configuration_maps_to_one_detector() {
        let cluster = config(|c| c.cluster_cidr = "10.244.0.0/16".into());
        assert_eq!(
            LocalDetector::from_config(&cluster).unwrap(),
            LocalDetector::ClusterCidr(cidrs(&["10.244.0.0/16"]))
        );
        assert_eq!(
            LocalDetector::from_config(&config(|_| {})).unwrap(),
            LocalDetector::None,
            "no clusterCIDR"
        );
        let bridge = config(|c| {
            c.detect_local_mode = "BridgeInterface".into();
            c.detect_local.bridge_interface = "cbr0".into();
        });
        assert_eq!(
            LocalDetector::from_config(&bridge).unwrap(),
            LocalDetector::BridgeInterface("cbr0".into())
        );
        let node = config(|c| c.detect_local_mode = "NodeCIDR".into());
        assert_eq!(
            LocalDetector::from_config(&node).unwrap(),
            LocalDetector::NodeCidr
        );
    }

    #[test]
    fn interface_names_a_rule_cannot_carry_are_refused_naming_the_field() {
        for bad in ["", "br 0", "a/b", "veth+", "sixteen-chars-xx", "br\"0"] {
            let error = LocalDetector::BridgeInterface(bad.into())
                .validate()
                .unwrap_err();
            assert_eq!(error.field, "detectLocal.bridgeInterface", "{bad:?}");
        }
        let error = LocalDetector::InterfaceNamePrefix("veth*".into())
            .validate()
            .unwrap_err();
        assert_eq!(error.field, "detectLocal.interfaceNamePrefix");
        for good in ["cbr0", "veth", "br-0_a.b", "fifteen-chars-x"] {
            LocalDetector::BridgeInterface(good.into())
                .validate()
                .unwrap();
        }
    }
}
