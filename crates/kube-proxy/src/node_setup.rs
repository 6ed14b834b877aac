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
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use kp_config::{GoDuration, KubeProxyConfiguration};
use kp_node::{ProcSysctl, SysctlOutcome, SysctlSetting};

/// `/proc/self`, where [`apply_oom_score`] finds `oom_score_adj`.
pub const PROC_SELF: &str = "/proc/self";
/// `/proc/sys`, under which [`ensure_sysctl`] finds kernel parameters.
pub const PROC_SYS: &str = ProcSysctl::ROOT;
/// The values the kernel accepts in `oom_score_adj`.
pub const OOM_SCORE_ADJ_RANGE: RangeInclusive<i32> = -1000..=1000;

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
/// upstream makes them: the conntrack sysctls, then the sysctls the
/// configured mode lists for itself ([`crate::modes::node_sysctls`]).
/// Pure: nothing is read or written.
pub fn init_only_steps(config: &KubeProxyConfiguration) -> anyhow::Result<Vec<InitStep>> {
    let mut steps = Vec::new();
    if conntrack_configured(config) {
        steps.push(InitStep::ConntrackSysctls);
    }
    let mode = config.effective_mode()?;
    steps.extend(
        crate::modes::node_sysctls(mode, config)?
            .into_iter()
            .map(InitStep::Sysctl),
    );
    Ok(steps)
}

/// Gives the kernel parameter `setting.name` its value unless it already
/// has it (`sysctl -w name=value`); `proc_sys` is `/proc/sys` outside tests.
pub fn ensure_sysctl(
    setting: &SysctlSetting,
    proc_sys: &Path,
) -> Result<SysctlOutcome, NodeSetupError> {
    let mut sysctl = ProcSysctl::under(proc_sys);
    kp_node::ensure_sysctl(&mut sysctl, setting).map_err(|source| NodeSetupError::Sysctl {
        name: setting.name,
        value: setting.value,
        path: sysctl.path(setting.name),
        source,
    })
}

impl fmt::Display for InitStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitStep::ConntrackSysctls => f.write_str(
                "set the conntrack sysctls (net.netfilter.nf_conntrack_*) of the conntrack configuration",
            ),
            InitStep::Sysctl(setting) => write!(f, "set sysctl {setting}"),
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

    use std::fs;

    use super::*;

    fn config(edit: impl FnOnce(&mut KubeProxyConfiguration)) -> KubeProxyConfiguration {
        let mut config = KubeProxyConfiguration::defaulted();
        edit(&mut config);
        config
    }

    /// `route_localnet` as the iptables mode lists it.
    fn route_localnet() -> SysctlSetting {
        let options = kp_iptables::IptablesOptions::default();
        kp_iptables::node_sysctls(&options, &kp_node::NodePortAddresses::All)[0]
    }

    /// The IPVS mode's first sysctl.
    fn ipvs_conntrack() -> SysctlSetting {
        kp_ipvs::node_sysctls(&kp_ipvs::IpvsOptions::default())[0]
    }

    fn init_only_steps(config: &KubeProxyConfiguration) -> Vec<InitStep> {
        super::init_only_steps(config).unwrap()
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
            ensure_sysctl(&route_localnet(), proc_sys.path()).unwrap(),
            SysctlOutcome::Written
        );
        assert_eq!(fs::read_to_string(&file).unwrap(), "1");
        assert_eq!(
            ensure_sysctl(&route_localnet(), proc_sys.path()).unwrap(),
            SysctlOutcome::AlreadySet
        );
    }

    #[test]
    fn a_missing_sysctl_is_an_error_naming_it() {
        let proc_sys = tempfile::tempdir().unwrap();

        let error = ensure_sysctl(&ipvs_conntrack(), proc_sys.path()).unwrap_err();

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
            [
                InitStep::ConntrackSysctls,
                InitStep::Sysctl(route_localnet())
            ]
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
        assert_eq!(
            names,
            [
                "net.ipv4.vs.conntrack",
                "net.ipv4.vs.expire_nodest_conn",
                "net.ipv4.vs.expire_quiescent_template",
                "net.ipv4.ip_forward"
            ]
        );
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
