//! Privileged node setup: the process's OOM score adjustment, and the
//! steps `--init-only` performs before exiting.
//!
//! Upstream's `--init-only` builds the proxy server up to the point where
//! the proxier would start and exits there. What it changes on the node on
//! the way is: the conntrack sysctls (`platformSetup`), and the sysctls the
//! proxy mode's constructor ensures — `route_localnet` in iptables mode
//! when localhost NodePorts are on, and IPVS's own sysctls in ipvs mode
//! (nftables mode sets none). It does not set the OOM score: upstream
//! applies that at the start of `ProxyServer.Run`, which `--init-only` never
//! reaches, and the adjustment belongs to the process that keeps running.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use kp_config::{GoDuration, KubeProxyConfiguration, ProxyMode};

/// `/proc/self`, where [`apply_oom_score`] finds `oom_score_adj`.
pub const PROC_SELF: &str = "/proc/self";
/// `/proc/sys`, under which [`ensure_sysctl`] finds kernel parameters.
pub const PROC_SYS: &str = "/proc/sys";
/// The values the kernel accepts in `oom_score_adj`.
pub const OOM_SCORE_ADJ_RANGE: RangeInclusive<i32> = -1000..=1000;

/// `net.ipv4.conf.all.route_localnet`: lets NodePorts answer on 127.0.0.1
/// (iptables mode, kubernetes issue 90259).
const ROUTE_LOCALNET: SysctlSetting = SysctlSetting {
    name: "net.ipv4.conf.all.route_localnet",
    value: 1,
    reason: "NodePorts on localhost, iptables.localhostNodePorts",
};

/// The sysctls the IPVS mode always ensures, in upstream's order. Upstream
/// also sets `net.ipv4.vs.conn_reuse_mode` to 0, but only on kernels older
/// than 5.9, and the IPVS timeouts through netlink (`ipvsadm --set`); both
/// belong with the IPVS backend, which knows the kernel.
const IPVS_SYSCTLS: [SysctlSetting; 4] = [
    SysctlSetting {
        name: "net.ipv4.vs.conntrack",
        value: 1,
        reason: "IPVS connections visible to conntrack, for masquerading",
    },
    SysctlSetting {
        name: "net.ipv4.vs.expire_nodest_conn",
        value: 1,
        reason: "IPVS drops connections to removed real servers",
    },
    SysctlSetting {
        name: "net.ipv4.vs.expire_quiescent_template",
        value: 1,
        reason: "IPVS session affinity leaves real servers of weight 0",
    },
    SysctlSetting {
        name: "net.ipv4.ip_forward",
        value: 1,
        reason: "IPVS forwards to endpoints",
    },
];

/// The sysctls of `ipvs.strictARP`: the node does not answer ARP for the
/// Service addresses on `kube-ipvs0`.
const STRICT_ARP_SYSCTLS: [SysctlSetting; 2] = [
    SysctlSetting {
        name: "net.ipv4.conf.all.arp_ignore",
        value: 1,
        reason: "ipvs.strictARP",
    },
    SysctlSetting {
        name: "net.ipv4.conf.all.arp_announce",
        value: 2,
        reason: "ipvs.strictARP",
    },
];

/// One privileged change `--init-only` makes to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitStep {
    /// The conntrack sysctls of the `conntrack` section (table size,
    /// timeouts, `tcpBeLiberal`), as `kp_conntrack::apply_conntrack_sysctls`
    /// sets them.
    ConntrackSysctls,
    /// One kernel parameter the proxy mode needs; see [`ensure_sysctl`].
    Sysctl(SysctlSetting),
}

/// A kernel parameter and the value the proxy needs in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysctlSetting {
    /// Dotted name, as `sysctl` takes it: `net.ipv4.conf.all.route_localnet`.
    pub name: &'static str,
    /// The value to ensure.
    pub value: u32,
    /// What needs it.
    pub reason: &'static str,
}

/// What [`ensure_sysctl`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlOutcome {
    /// The parameter had another value and was written.
    Written,
    /// The parameter already had the value.
    AlreadySet,
}

/// A privileged setting could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum NodeSetupError {
    /// The OOM score adjustment is outside what the kernel accepts.
    #[error("oomScoreAdj {value} is outside the valid range -1000..=1000")]
    OomScoreOutOfRange {
        /// The configured value.
        value: i32,
    },
    /// Writing the OOM score adjustment failed (lowering it needs
    /// CAP_SYS_RESOURCE).
    #[error("setting the OOM score adjustment to {value} through {} failed", path.display())]
    OomScore {
        /// The value that was to be written.
        value: i32,
        /// The file written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing a kernel parameter failed (read-only `/proc/sys`, no
    /// CAP_NET_ADMIN, or the module that provides it is not loaded).
    #[error("setting sysctl {name}={value} through {} failed", path.display())]
    Sysctl {
        /// The parameter.
        name: &'static str,
        /// The value that was to be written.
        value: u32,
        /// The file written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Sets this process's OOM score adjustment (`echo VALUE >
/// /proc/self/oom_score_adj`), `proc_self` being `/proc/self` outside
/// tests. Upstream logs a failure and carries on, and so should the caller.
pub fn apply_oom_score(value: i32, proc_self: &Path) -> Result<(), NodeSetupError> {
    if !OOM_SCORE_ADJ_RANGE.contains(&value) {
        return Err(NodeSetupError::OomScoreOutOfRange { value });
    }
    let path = proc_self.join("oom_score_adj");
    write_existing(&path, &value.to_string()).map_err(|source| NodeSetupError::OomScore {
        value,
        path,
        source,
    })
}

/// The privileged changes `--init-only` makes for `config`, in the order
/// upstream makes them. Pure: nothing is read or written.
pub fn init_only_steps(config: &KubeProxyConfiguration) -> Vec<InitStep> {
    let mut steps = Vec::new();
    if conntrack_configured(config) {
        steps.push(InitStep::ConntrackSysctls);
    }
    match config.effective_mode() {
        Ok(ProxyMode::Iptables) if localhost_node_ports(config) => {
            steps.push(InitStep::Sysctl(ROUTE_LOCALNET));
        }
        Ok(ProxyMode::Ipvs) => {
            steps.extend(IPVS_SYSCTLS.map(InitStep::Sysctl));
            if config.ipvs.strict_arp {
                steps.extend(STRICT_ARP_SYSCTLS.map(InitStep::Sysctl));
            }
        }
        _ => {}
    }
    steps
}

/// Gives the kernel parameter `setting.name` its value unless it already
/// has it (`sysctl -w name=value`); `proc_sys` is `/proc/sys` outside tests.
pub fn ensure_sysctl(
    setting: &SysctlSetting,
    proc_sys: &Path,
) -> Result<SysctlOutcome, NodeSetupError> {
    let path = proc_sys.join(setting.name.replace('.', "/"));
    let current = fs::read_to_string(&path).ok();
    if current.and_then(|text| text.trim().parse::<u32>().ok()) == Some(setting.value) {
        return Ok(SysctlOutcome::AlreadySet);
    }
    write_existing(&path, &setting.value.to_string()).map_err(|source| NodeSetupError::Sysctl {
        name: setting.name,
        value: setting.value,
        path,
        source,
    })?;
    Ok(SysctlOutcome::Written)
}

impl fmt::Display for InitStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitStep::ConntrackSysctls => f.write_str(
                "set the conntrack sysctls (net.netfilter.nf_conntrack_*) of the conntrack configuration",
            ),
            InitStep::Sysctl(setting) => write!(
                f,
                "set sysctl {}={} ({})",
                setting.name, setting.value, setting.reason
            ),
        }
    }
}

/// Whether the `conntrack` section asks for any sysctl to be set: a table
/// size (`maxPerCore` above 0), a timeout above 0, or `tcpBeLiberal`.
fn conntrack_configured(config: &KubeProxyConfiguration) -> bool {
    let conntrack = &config.conntrack;
    let positive = |duration: GoDuration| !duration.is_zero() && !duration.is_negative();
    conntrack.max_per_core.unwrap_or(0) > 0
        || conntrack.tcp_established_timeout.is_some_and(positive)
        || conntrack.tcp_close_wait_timeout.is_some_and(positive)
        || positive(conntrack.udp_timeout)
        || positive(conntrack.udp_stream_timeout)
        || conntrack.tcp_be_liberal
}

/// Whether iptables mode serves NodePorts on 127.0.0.1: localhost NodePorts
/// are on (the default) and `nodePortAddresses` covers IPv4 loopback. As
/// upstream, a list without IPv4 CIDRs means every IPv4 address; `primary`
/// means the node's own address, taken not to be loopback.
fn localhost_node_ports(config: &KubeProxyConfiguration) -> bool {
    if !config.iptables.localhost_node_ports.unwrap_or(true) {
        return false;
    }
    let addresses = config.effective_node_port_addresses();
    if addresses.iter().any(|address| address == "primary") {
        return false;
    }
    let ipv4: Vec<IpNet> = addresses
        .iter()
        .filter_map(|address| address.parse::<IpNet>().ok())
        .filter(|cidr| matches!(cidr, IpNet::V4(_)))
        .collect();
    let loopback = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0));
    ipv4.is_empty()
        || ipv4
            .iter()
            .any(|cidr| cidr.addr().is_loopback() || cidr.contains(&loopback))
}

/// Writes `text` to a file that must already exist, as kernel files do.
fn write_existing(path: &Path, text: &str) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?
        .write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn config(edit: impl FnOnce(&mut KubeProxyConfiguration)) -> KubeProxyConfiguration {
        let mut config = KubeProxyConfiguration::defaulted();
        edit(&mut config);
        config
    }

    fn sysctl_names(steps: &[InitStep]) -> Vec<&'static str> {
        steps
            .iter()
            .filter_map(|step| match step {
                InitStep::Sysctl(setting) => Some(setting.name),
                InitStep::ConntrackSysctls => None,
            })
            .collect()
    }

    fn with_node_ports(addresses: &[&str]) -> KubeProxyConfiguration {
        config(|c| c.node_port_addresses = Some(addresses.iter().map(|a| a.to_string()).collect()))
    }

    #[test]
    fn the_oom_score_is_written_to_oom_score_adj() {
        let proc_self = tempfile::tempdir().unwrap();
        let file = proc_self.path().join("oom_score_adj");
        fs::write(&file, "1000").unwrap();

        apply_oom_score(-999, proc_self.path()).unwrap();

        assert_eq!(fs::read_to_string(&file).unwrap(), "-999");
    }

    #[test]
    fn an_oom_score_out_of_range_is_refused_without_writing() {
        let proc_self = tempfile::tempdir().unwrap();
        let file = proc_self.path().join("oom_score_adj");
        fs::write(&file, "0").unwrap();

        let error = apply_oom_score(-1001, proc_self.path()).unwrap_err();

        assert!(matches!(
            error,
            NodeSetupError::OomScoreOutOfRange { value: -1001 }
        ));
        assert_eq!(fs::read_to_string(&file).unwrap(), "0");
    }

    #[test]
    fn a_missing_oom_score_file_is_an_error_naming_it() {
        let proc_self = tempfile::tempdir().unwrap();

        let error = apply_oom_score(-999, proc_self.path()).unwrap_err();

        assert!(error.to_string().contains("oom_score_adj"), "{error}");
        assert!(!proc_self.path().join("oom_score_adj").exists());
    }

    #[test]
    fn a_sysctl_is_written_only_when_it_differs() {
        let proc_sys = tempfile::tempdir().unwrap();
        let file = proc_sys.path().join("net/ipv4/conf/all/route_localnet");
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(&file, "0\n").unwrap();

        assert_eq!(
            ensure_sysctl(&ROUTE_LOCALNET, proc_sys.path()).unwrap(),
            SysctlOutcome::Written
        );
        assert_eq!(fs::read_to_string(&file).unwrap(), "1");
        assert_eq!(
            ensure_sysctl(&ROUTE_LOCALNET, proc_sys.path()).unwrap(),
            SysctlOutcome::AlreadySet
        );
    }

    #[test]
    fn a_missing_sysctl_is_an_error_naming_it() {
        let proc_sys = tempfile::tempdir().unwrap();

        let error = ensure_sysctl(&IPVS_SYSCTLS[0], proc_sys.path()).unwrap_err();

        assert!(
            error.to_string().contains("net.ipv4.vs.conntrack=1"),
            "{error}"
        );
    }

    #[test]
    fn by_default_init_only_sets_conntrack_and_route_localnet() {
        let steps = init_only_steps(&KubeProxyConfiguration::defaulted());

        assert_eq!(
            steps,
            [InitStep::ConntrackSysctls, InitStep::Sysctl(ROUTE_LOCALNET)]
        );
        assert!(steps[1]
            .to_string()
            .contains("net.ipv4.conf.all.route_localnet=1"));
    }

    #[test]
    fn route_localnet_only_when_nodeports_answer_on_ipv4_loopback() {
        let off = config(|c| c.iptables.localhost_node_ports = Some(false));
        assert!(sysctl_names(&init_only_steps(&off)).is_empty());
        for (addresses, expected) in [
            (&["192.168.99.0/24"][..], false),
            (&["primary"][..], false),
            (&["127.0.0.0/8"][..], true),
            (&["192.168.99.0/24", "127.0.0.1/32"][..], true),
            // No IPv4 CIDR: every IPv4 address, loopback included.
            (&["fd00:192:168:99::/64"][..], true),
            (&["all"][..], true),
        ] {
            let names = sysctl_names(&init_only_steps(&with_node_ports(addresses)));
            assert_eq!(
                !names.is_empty(),
                expected,
                "nodePortAddresses {addresses:?}"
            );
        }
    }

    #[test]
    fn nftables_mode_sets_only_conntrack() {
        let nftables = config(|c| c.mode = "nftables".to_owned());
        assert_eq!(init_only_steps(&nftables), [InitStep::ConntrackSysctls]);
    }

    #[test]
    fn ipvs_mode_sets_its_sysctls_and_strict_arp_when_asked() {
        let ipvs = config(|c| c.mode = "ipvs".to_owned());
        let names = sysctl_names(&init_only_steps(&ipvs));
        assert_eq!(names, IPVS_SYSCTLS.map(|s| s.name));
        let strict = config(|c| {
            c.mode = "ipvs".to_owned();
            c.ipvs.strict_arp = true;
        });
        let names = sysctl_names(&init_only_steps(&strict));
        assert!(names.ends_with(&[
            "net.ipv4.conf.all.arp_ignore",
            "net.ipv4.conf.all.arp_announce"
        ]));
    }

    #[test]
    fn conntrack_is_left_alone_when_nothing_is_configured() {
        let nothing = |c: &mut KubeProxyConfiguration| {
            c.conntrack.max_per_core = Some(0);
            c.conntrack.tcp_established_timeout = Some(GoDuration::from_secs(0));
            c.conntrack.tcp_close_wait_timeout = Some(GoDuration::from_secs(0));
        };
        assert!(!init_only_steps(&config(nothing)).contains(&InitStep::ConntrackSysctls));
        let liberal = config(|c| {
            nothing(c);
            c.conntrack.tcp_be_liberal = true;
        });
        assert!(init_only_steps(&liberal).contains(&InitStep::ConntrackSysctls));
        let udp_timeout = config(|c| {
            nothing(c);
            c.conntrack.udp_timeout = GoDuration::from_secs(30);
        });
        assert!(init_only_steps(&udp_timeout).contains(&InitStep::ConntrackSysctls));
    }
}
