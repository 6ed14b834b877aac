//! The planned state as text an operator knows: `ip addr` for kube-ipvs0,
//! `ipvsadm -Ln` for the virtual servers, `ipset list` for the sets. Used
//! by `--dry-run` and by golden tests.

use std::fmt::Write as _;
use std::net::SocketAddr;

use kp_model::{IpFamily, Protocol};

use crate::state::{
    KernelState, ServiceKey, SetKind, VirtualServer, DUMMY_LINK, FLAG_PERSISTENT, FLAG_SOURCE_HASH,
};

/// kube-ipvs0's addresses, as `ip -o addr show dev kube-ipvs0` would list
/// them (one per line, with the host prefix length).
pub fn addresses_text(state: &KernelState) -> String {
    let mut out = String::new();
    for address in &state.addresses {
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(out, "{DUMMY_LINK} {address}/{prefix}");
    }
    out
}

/// The virtual servers as `ipvsadm -Ln` prints them (without its header
/// and connection counters).
pub fn ipvsadm_text(state: &KernelState) -> String {
    let mut out = String::from("Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight\n");
    for (key, service) in &state.services {
        let _ = writeln!(out, "{}", service_line(key, &service.server));
        for (real, weight) in &service.reals {
            let _ = writeln!(out, "  -> {:<28} Masq    {weight}", real.to_string());
        }
    }
    out
}

/// The sets of `family` as `ipset list` prints them (members sorted).
pub fn ipset_text(state: &KernelState, family: IpFamily) -> String {
    let mut out = String::new();
    for (kind, members) in &state.sets {
        let _ = writeln!(out, "Name: {}", kind.name(family));
        let _ = writeln!(out, "Type: {}", kind.set_type().as_str());
        let _ = writeln!(out, "Members:");
        for member in members {
            let _ = writeln!(out, "{member}");
        }
        out.push('\n');
    }
    out
}

/// Everything `--dry-run` shows for one sync of `family`.
pub fn dry_run_text(state: &KernelState, family: IpFamily, iptables: &str) -> String {
    format!(
        "# {DUMMY_LINK} addresses ({family})\n{}\n# ipvsadm -Ln ({family})\n{}\n# ipset list ({family})\n{}# iptables-restore ({family})\n{iptables}",
        addresses_text(state),
        ipvsadm_text(state),
        ipset_text(state, family),
    )
}

/// `TCP  10.96.0.41:80 rr persistent 10800`.
fn service_line(key: &ServiceKey, server: &VirtualServer) -> String {
    let protocol = match key.protocol {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    };
    let mut line = format!(
        "{protocol}  {} {}",
        SocketAddr::new(key.address, key.port),
        server.scheduler
    );
    if server.flags & FLAG_SOURCE_HASH != 0 {
        let _ = write!(line, " ({}-port)", server.scheduler);
    }
    if server.flags & FLAG_PERSISTENT != 0 {
        let _ = write!(line, " persistent {}", server.timeout_secs);
    }
    line
}

/// Names every set of `kind` for both families (cleanup).
pub fn set_names(kind: SetKind) -> [&'static str; 2] {
    [kind.name(IpFamily::V4), kind.name(IpFamily::V6)]
}
