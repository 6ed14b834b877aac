//! `kube-proxy check`: holds the kernel's live rules against what the
//! model says every Service address should do, and names each difference.
//!
//! It takes the proxy's own command line (mode, `--config`, `--kubeconfig`
//! or `--manifests`, `--hostname-override`, …), so an operator runs it with
//! the DaemonSet's arguments. The state comes through the same sync loop
//! the proxy runs, into a backend that only records what one sync would
//! program; [`kp_sync::expect`] turns each service port into connections
//! and what must happen to them, and the tracer of `kube-proxy trace`
//! follows each connection through the rules the kernel holds. Exit code 0:
//! no difference; 1: differences (each printed); 2: the check could not run.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use kp_model::{IpFamily, NodeInfo, Protocol, ServicePortName};
use kp_sync::expect::{self, Expected, Probe};
use kp_sync::{Backend, BackendError, ServicePortState, SyncOutcome, SyncRequest};

use crate::trace::{Connection, Live, Masquerade, Origin, Outcome, TraceMode};

/// What one sync handed the backend: every service port and the node.
pub type Recorded = (BTreeMap<ServicePortName, ServicePortState>, NodeInfo);

/// A backend that records the state instead of programming it.
pub struct Recorder {
    seen: Arc<Mutex<Option<Recorded>>>,
}

impl Recorder {
    /// A recorder and the slot it writes into.
    pub fn new() -> (Self, Arc<Mutex<Option<Recorded>>>) {
        let seen = Arc::new(Mutex::new(None));
        (
            Self {
                seen: Arc::clone(&seen),
            },
            seen,
        )
    }
}

impl Backend for Recorder {
    fn mode(&self) -> &'static str {
        "check"
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncOutcome, BackendError> {
        let recorded = (request.service_ports.clone(), request.node.clone());
        match self.seen.lock() {
            Ok(mut seen) => *seen = Some(recorded),
            Err(poisoned) => *poisoned.into_inner() = Some(recorded),
        }
        Ok(SyncOutcome {
            full: true,
            ..SyncOutcome::default()
        })
    }
}

/// One connection whose fate differs from the model's.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// The connection and what the model says.
    pub probe: Probe,
    /// What the kernel's rules do with it.
    pub found: String,
}

/// The result of checking one family.
#[derive(Debug, Default)]
pub struct FamilyResult {
    /// Connections checked.
    pub checked: usize,
    /// Service ports they belong to.
    pub service_ports: usize,
    /// Those that differ.
    pub differences: Vec<Difference>,
}

/// Runs `kube-proxy check`; `args` starts with the program name.
pub fn main(args: &[OsString]) -> ExitCode {
    let argv = std::iter::once(args.first().cloned().unwrap_or_default())
        .chain(args.iter().skip(2).cloned());
    let (flags, matches) = match kp_config::parse_args(argv) {
        Ok(parsed) => parsed,
        Err(error) => {
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    match crate::app::check(&flags, &matches) {
        Ok(results) => {
            let mut differences = 0;
            for (family, mode, result) in &results {
                for difference in &result.differences {
                    println!(
                        "DIFFERENT {}: the model says {}; the {} rules: {}",
                        difference.probe,
                        difference.probe.expected,
                        mode.name(),
                        difference.found
                    );
                }
                println!(
                    "{}: {} connections to {} service ports checked against the {} rules: {} different",
                    family.as_api_str(),
                    result.checked,
                    result.service_ports,
                    mode.name(),
                    result.differences.len()
                );
                differences += result.differences.len();
            }
            if differences == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("kube-proxy check: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// The connections to check for one family's recorded state. An address
/// and port that several Services claim (the API lets two Services list
/// one external IP) is left out: the kernel sends it to whichever rule
/// comes first, and no Service's expectation holds for it alone.
pub fn family_probes(family: IpFamily, recorded: &Recorded) -> Vec<Probe> {
    let (service_ports, node) = recorded;
    let node_ips: Vec<IpAddr> = node.addresses_of(family).collect();
    let probes: Vec<Probe> = service_ports
        .iter()
        .flat_map(|(name, state)| expect::probes(name, state, family, &node_ips))
        .collect();
    let mut claims: BTreeMap<(SocketAddr, Protocol), BTreeSet<&ServicePortName>> = BTreeMap::new();
    for probe in &probes {
        claims
            .entry((probe.destination, probe.protocol))
            .or_default()
            .insert(&probe.service);
    }
    let shared: BTreeSet<(SocketAddr, Protocol)> = claims
        .into_iter()
        .filter(|(_, services)| services.len() > 1)
        .map(|(frontend, _)| frontend)
        .collect();
    probes
        .into_iter()
        .filter(|probe| !shared.contains(&(probe.destination, probe.protocol)))
        .collect()
}

/// Checks one family's recorded state against `live`.
pub fn check_family(
    family: IpFamily,
    recorded: &Recorded,
    live: &Live,
    local: &[IpAddr],
) -> anyhow::Result<FamilyResult> {
    let probes = family_probes(family, recorded);
    Ok(FamilyResult {
        service_ports: recorded.0.len(),
        checked: probes.len(),
        differences: check_probes(probes, live, local)?,
    })
}

/// The probes whose connections `live` handles differently from what they
/// expect.
pub fn check_probes(
    probes: Vec<Probe>,
    live: &Live,
    local: &[IpAddr],
) -> anyhow::Result<Vec<Difference>> {
    let mut differences = Vec::new();
    for probe in probes {
        if let Some(found) = check_probe(&probe, live, local)? {
            differences.push(Difference { probe, found });
        }
    }
    Ok(differences)
}

/// What `live` does with `probe`'s connection, when that differs from what
/// it expects.
pub fn check_probe(probe: &Probe, live: &Live, local: &[IpAddr]) -> anyhow::Result<Option<String>> {
    let connection = Connection {
        source: probe.source,
        destination: probe.destination,
        protocol: probe.protocol,
        origin: Origin::Received,
        in_interface: None,
    };
    let report = live.trace(&connection, local)?;
    if live.mode() == TraceMode::Userspace && probe.protocol == Protocol::Sctp {
        // The relay serves TCP and UDP (as upstream's userspace mode did):
        // an SCTP service port gets no portal, so nothing handles it.
        return Ok((report.outcome != Outcome::NotAService).then(|| describe(&report.outcome)));
    }
    if live.mode() == TraceMode::Userspace && probe.expected.is_refusal() {
        // The relay refuses every TCP connection it cannot serve with a
        // reset and drops every such UDP datagram, whatever the reason:
        // it cannot answer with the ICMP error a kernel rule sends.
        let refused = match probe.protocol {
            Protocol::Tcp => Outcome::Reject,
            _ => Outcome::Drop,
        };
        return Ok((report.outcome != refused).then(|| describe(&report.outcome)));
    }
    Ok(differs(live.mode(), &probe.expected, &report.outcome))
}

/// How `outcome` differs from `expected` in `mode`, if it does.
fn differs(mode: TraceMode, expected: &Expected, outcome: &Outcome) -> Option<String> {
    let same = match (expected, outcome) {
        (
            Expected::Endpoints {
                endpoints,
                masquerade,
            },
            Outcome::Dnat {
                endpoints: found,
                masqueraded,
            },
        ) => {
            let found: BTreeSet<SocketAddr> = found.iter().map(|share| share.endpoint).collect();
            // The userspace relay dials every endpoint from the node: no
            // client address survives it, whatever the policy (as in
            // upstream's userspace mode).
            &found == endpoints
                && match masquerade {
                    _ if mode == TraceMode::Userspace => true,
                    Some(true) => *masqueraded == Masquerade::All,
                    Some(false) => *masqueraded == Masquerade::None,
                    None => true,
                }
        }
        (
            Expected::Hairpin { endpoints, itself },
            Outcome::Dnat {
                endpoints: found, ..
            },
        ) => {
            let reached: BTreeSet<SocketAddr> = found.iter().map(|share| share.endpoint).collect();
            &reached == endpoints
                && (mode == TraceMode::Userspace
                    || found
                        .iter()
                        .filter(|share| share.endpoint.ip() == *itself)
                        .all(|share| share.masqueraded))
        }
        (Expected::Reject, Outcome::Reject) | (Expected::Drop, Outcome::Drop) => true,
        (Expected::NoLocalEndpoint | Expected::RejectUnlessFiltered, Outcome::Reject) => {
            (*expected == Expected::RejectUnlessFiltered) != (mode == TraceMode::Ipvs)
        }
        (Expected::RejectUnlessFiltered, Outcome::Drop) => mode == TraceMode::Ipvs,
        (Expected::NoLocalEndpoint, Outcome::Drop) => mode != TraceMode::Ipvs,
        _ => false,
    };
    (!same).then(|| describe(outcome))
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Dnat {
            endpoints,
            masqueraded,
        } => {
            let list: Vec<String> = endpoints.iter().map(|s| s.endpoint.to_string()).collect();
            format!(
                "DNAT to one of {{{}}}, {}",
                list.join(", "),
                masqueraded.phrase()
            )
        }
        Outcome::Reject => "rejected".to_owned(),
        Outcome::Drop => "dropped".to_owned(),
        Outcome::NotAService => "not handled (no rule for this address and port)".to_owned(),
        Outcome::Mixed => "paths that end differently".to_owned(),
    }
}

/// The trace mode of a configured proxy mode.
pub fn trace_mode(mode: kp_config::ProxyMode) -> anyhow::Result<TraceMode> {
    Ok(match mode {
        kp_config::ProxyMode::Iptables => TraceMode::Iptables,
        kp_config::ProxyMode::Nftables => TraceMode::Nftables,
        kp_config::ProxyMode::Ipvs => TraceMode::Ipvs,
        kp_config::ProxyMode::Userspace => TraceMode::Userspace,
        other => anyhow::bail!("mode {} cannot be checked", other.as_str()),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::trace::Share;

    fn share(endpoint: &str) -> Share {
        Share {
            endpoint: endpoint.parse().unwrap(),
            probability: 0.5,
            masqueraded: false,
        }
    }

    #[test]
    fn a_hairpin_connection_must_be_masqueraded_back_to_itself() {
        let expected = Expected::Hairpin {
            endpoints: ["10.244.1.2:80", "10.244.2.2:80"]
                .iter()
                .map(|a| a.parse().unwrap())
                .collect(),
            itself: "10.244.1.2".parse().unwrap(),
        };
        let found = |to_itself_masqueraded| Outcome::Dnat {
            endpoints: vec![
                Share {
                    masqueraded: to_itself_masqueraded,
                    ..share("10.244.1.2:80")
                },
                share("10.244.2.2:80"),
            ],
            masqueraded: Masquerade::Some,
        };
        assert_eq!(differs(TraceMode::Nftables, &expected, &found(true)), None);
        let text = differs(TraceMode::Nftables, &expected, &found(false)).unwrap();
        assert!(text.contains("DNAT to one of"), "{text}");
        // The relay dials from the node: nothing to masquerade.
        assert_eq!(
            differs(TraceMode::Userspace, &expected, &found(false)),
            None
        );
        // The endpoints must match too.
        let one = Outcome::Dnat {
            endpoints: vec![Share {
                masqueraded: true,
                ..share("10.244.1.2:80")
            }],
            masqueraded: Masquerade::All,
        };
        assert!(differs(TraceMode::Nftables, &expected, &one).is_some());
        assert!(!expected.is_refusal());
    }

    #[test]
    fn an_address_two_services_claim_is_not_checked() {
        use kp_sync::testing::service;
        let mut ports = BTreeMap::new();
        for builder in [
            service("ns", "a", "10.96.0.10", 80)
                .external_ip("203.0.113.5")
                .endpoint("10.244.1.2", 8080, true),
            service("ns", "b", "10.96.0.11", 80)
                .external_ip("203.0.113.5")
                .endpoint("10.244.1.3", 8080, true),
        ] {
            let (name, state) = builder.build();
            ports.insert(name, state);
        }
        let probes = family_probes(IpFamily::V4, &(ports, NodeInfo::default()));
        let destinations: Vec<String> = probes
            .iter()
            .filter(|p| !matches!(p.expected, Expected::Hairpin { .. }))
            .map(|p| p.destination.to_string())
            .collect();
        assert_eq!(destinations, ["10.96.0.10:80", "10.96.0.11:80"]);
    }

    #[test]
    fn endpoints_and_masquerade_must_both_match() {
        let expected = Expected::Endpoints {
            endpoints: ["10.244.1.2:80", "10.244.2.2:80"]
                .iter()
                .map(|a| a.parse().unwrap())
                .collect(),
            masquerade: Some(true),
        };
        let found = |masqueraded| Outcome::Dnat {
            endpoints: vec![share("10.244.1.2:80"), share("10.244.2.2:80")],
            masqueraded,
        };
        let differs = |expected: &Expected, outcome: &Outcome| {
            differs(TraceMode::Iptables, expected, outcome)
        };
        assert_eq!(differs(&expected, &found(Masquerade::All)), None);
        assert!(differs(&expected, &found(Masquerade::Some)).is_some());
        let one = Outcome::Dnat {
            endpoints: vec![share("10.244.1.2:80")],
            masqueraded: Masquerade::All,
        };
        let text = differs(&expected, &one).unwrap();
        assert!(text.contains("{10.244.1.2:80}"), "{text}");
        assert!(differs(&Expected::Reject, &Outcome::Reject).is_none());
        assert!(differs(&Expected::Drop, &Outcome::Reject).is_some());
        assert_eq!(
            differs(&Expected::Reject, &Outcome::NotAService).as_deref(),
            Some("not handled (no rule for this address and port)")
        );
        // A Local policy without a local endpoint: dropped, except by the
        // IPVS mode's empty virtual server, which rejects.
        assert!(differs(&Expected::NoLocalEndpoint, &Outcome::Drop).is_none());
        assert!(differs(&Expected::NoLocalEndpoint, &Outcome::Reject).is_some());
        let ipvs = |outcome: &Outcome| {
            super::differs(TraceMode::Ipvs, &Expected::NoLocalEndpoint, outcome)
        };
        assert!(ipvs(&Outcome::Reject).is_none());
        assert!(ipvs(&Outcome::Drop).is_some());
        assert!(super::differs(TraceMode::Ipvs, &Expected::Drop, &Outcome::Reject).is_some());
        // No endpoint, a client outside the source ranges: rejected, but
        // dropped by the IPVS mode, which filters first.
        let outside = Expected::RejectUnlessFiltered;
        assert!(differs(&outside, &Outcome::Reject).is_none());
        assert!(differs(&outside, &Outcome::Drop).is_some());
        assert!(super::differs(TraceMode::Ipvs, &outside, &Outcome::Drop).is_none());
        assert!(super::differs(TraceMode::Ipvs, &outside, &Outcome::Reject).is_some());
        // The userspace relay keeps no client address.
        let userspace = |expected: &Expected, outcome: &Outcome| {
            super::differs(TraceMode::Userspace, expected, outcome)
        };
        let local = Expected::Endpoints {
            endpoints: ["10.244.1.2:80".parse().unwrap()].into_iter().collect(),
            masquerade: Some(false),
        };
        let relayed = Outcome::Dnat {
            endpoints: vec![share("10.244.1.2:80")],
            masqueraded: Masquerade::All,
        };
        assert!(userspace(&local, &relayed).is_none());
        assert!(differs(&local, &relayed).is_some());
    }
}
