//! The result of following a new connection through a mode's live kernel
//! state, in the shape the IPVS and userspace modes' tracers report it
//! (`kp_ipvs::trace`, `kp_userspace::trace`) and `kube-proxy trace` reads.
//! Each mode's tracer says, in its own documentation, what its paths'
//! steps look like; the types here hold no mode's knowledge.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kp_model::Protocol;

/// The first packet of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Sent by a process of this node (nat `OUTPUT`, IPVS at `LOCAL_OUT`)
    /// rather than received (nat `PREROUTING`).
    pub src_local: bool,
    /// The interface a received packet arrived on.
    pub in_interface: Option<String>,
}

/// How a path ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathVerdict {
    /// Delivered: to an endpoint, or to the node unchanged.
    Accept,
    /// Silently dropped.
    Drop,
    /// Refused: an ICMP error, or a TCP reset from the userspace relay.
    Reject,
}

/// Session affinity on a path: a later connection of the same client
/// within the timeout goes to the same endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affinity {
    /// What holds the affinity: an IPVS virtual server
    /// (`TCP 10.96.0.13:80`), an iptables `-m recent` list, or the relay's
    /// service port (`ns1/web:http`).
    pub name: String,
    /// The timeout in seconds (0: the rule gives none).
    pub timeout_secs: u32,
}

/// One path the packet can take.
#[derive(Debug, Clone, PartialEq)]
pub struct PathOutcome {
    /// The endpoint the packet reaches, when it reaches one.
    pub destination: Option<SocketAddr>,
    /// How it ends.
    pub verdict: PathVerdict,
    /// The endpoint sees the node's address rather than the client's.
    pub masqueraded: bool,
    /// The chance a new connection takes this path.
    pub probability: f64,
    /// What it passed, in order, as its mode's tracer names each step.
    pub matched: Vec<String>,
    /// The set members the matched rules found, as `SET: member`.
    pub elements: Vec<String>,
    /// Session affinity on the path.
    pub affinity: Vec<Affinity>,
    /// Rules of other software the tracer could not decide and that
    /// cannot change the path.
    pub not_followed: Vec<String>,
}

/// Every path of one packet.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The paths.
    pub paths: Vec<PathOutcome>,
}

impl Trace {
    /// The endpoints of the accepted paths.
    pub fn destinations(&self) -> BTreeSet<SocketAddr> {
        self.paths
            .iter()
            .filter(|path| path.verdict == PathVerdict::Accept)
            .filter_map(|path| path.destination)
            .collect()
    }

    /// Every path ends in `verdict`.
    pub fn always(&self, verdict: PathVerdict) -> bool {
        !self.paths.is_empty() && self.paths.iter().all(|path| path.verdict == verdict)
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, path) in self.paths.iter().enumerate() {
            let to = path
                .destination
                .map_or_else(|| "-".to_owned(), |to| to.to_string());
            writeln!(
                f,
                "path {}: {:?} to {to}, masqueraded: {}, probability {:.4}",
                index + 1,
                path.verdict,
                path.masqueraded,
                path.probability
            )?;
            for step in &path.matched {
                writeln!(f, "    {step}")?;
            }
            for element in &path.elements {
                writeln!(f, "    element {element}")?;
            }
            for affinity in &path.affinity {
                writeln!(
                    f,
                    "    affinity: {} for {} s",
                    affinity.name, affinity.timeout_secs
                )?;
            }
            for rule in &path.not_followed {
                writeln!(f, "    not followed: {rule}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn path(destination: Option<&str>, verdict: PathVerdict) -> PathOutcome {
        PathOutcome {
            destination: destination.map(|d| d.parse().unwrap()),
            verdict,
            masqueraded: false,
            probability: 0.5,
            matched: vec!["nat/KUBE-SERVICES rule".into()],
            elements: Vec::new(),
            affinity: Vec::new(),
            not_followed: Vec::new(),
        }
    }

    #[test]
    fn destinations_are_those_of_the_accepted_paths_only() {
        let trace = Trace {
            paths: vec![
                path(Some("10.244.1.2:80"), PathVerdict::Accept),
                path(Some("10.244.1.3:80"), PathVerdict::Drop),
                path(None, PathVerdict::Accept),
            ],
        };
        let found: Vec<String> = trace.destinations().iter().map(|d| d.to_string()).collect();
        assert_eq!(found, ["10.244.1.2:80"]);
    }

    #[test]
    fn always_needs_a_path_and_every_path_to_agree() {
        assert!(!Trace { paths: Vec::new() }.always(PathVerdict::Reject));
        let mixed = Trace {
            paths: vec![
                path(None, PathVerdict::Reject),
                path(None, PathVerdict::Drop),
            ],
        };
        assert!(!mixed.always(PathVerdict::Reject));
        let rejected = Trace {
            paths: vec![path(None, PathVerdict::Reject)],
        };
        assert!(rejected.always(PathVerdict::Reject));
    }

    #[test]
    fn the_text_names_each_path_and_its_steps() {
        let trace = Trace {
            paths: vec![path(Some("10.244.1.2:80"), PathVerdict::Accept)],
        };
        assert_eq!(
            trace.to_string(),
            "path 1: Accept to 10.244.1.2:80, masqueraded: false, probability 0.5000\n    nat/KUBE-SERVICES rule\n"
        );
    }
}
