//! Target `config`: the KubeProxyConfiguration decoder and validation on
//! random text and on the full default file with lines changed. A file
//! that does not load must be named in the error (with the field, when
//! one is at fault); every validation error names its field. A file that
//! loads and validates must give iptables options the renderer takes, or
//! an error naming the field it refuses.

use kp_config::{load_str, to_yaml, validate, ConfigError, KubeProxyConfiguration};
use kp_iptables::{IptablesOptions, LocalDetector, NodePortAddresses, Renderer};

use crate::mutate;
use crate::report::{Counts, Failures};
use crate::rng::Gen;

const ORIGIN: &str = "fuzz-config.yaml";

/// Values put into lines of the default file.
const VALUES: &[&str] = &[
    "-1",
    "0",
    "1",
    "31",
    "32",
    "65536",
    "99999999999",
    "1.5",
    "\"\"",
    "null",
    "~",
    "true",
    "no",
    "[a, b]",
    "[]",
    "{x: 1}",
    "{}",
    "-5m",
    "1h",
    "0s",
    "1e3",
    "0x1F",
    "'quoted'",
    "\"10.0.0.0/8\"",
    "0.0.0.0/0",
    "10.0.0.0/33",
    "[10.244.0.0/16, fd00::/48]",
    "[primary]",
    "[all]",
    "[all, primary]",
    "NodeCIDR",
    "ClusterCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
    "iptables",
    "nftables",
    "ipvs",
    "kernelspace",
    "cbr0",
    "\"veth\"",
    "127.0.0.1:10256",
    "[::]:10249",
    ":0",
    "json",
    "{AllAlpha: true}",
    "\u{0}",
    "&a 1",
    "*a",
    "!!binary aGk=",
];

/// One case: a configuration text, loaded, validated and turned into
/// renderer options.
pub fn case(gen: &mut Gen, golden: &str, counts: &mut Counts, failures: &Failures, case: u64) {
    let text = input(gen, golden);
    let outcome = std::panic::catch_unwind(|| check(&text));
    counts.cases += 1;
    match outcome {
        Err(_) => {
            counts.panics += 1;
            failures.report(
                case,
                "the config decoder panicked",
                &"(see the panic above)",
                &text,
            );
        }
        Ok(Ok(())) => counts.accepted += 1,
        Ok(Err(Problem::Rejected(None))) => counts.rejected += 1,
        Ok(Err(Problem::Rejected(Some((why, message))))) => {
            counts.rejected += 1;
            counts.unnamed += 1;
            failures.report(case, why, &message, &text);
        }
        Ok(Err(Problem::Unusable(message))) => {
            counts.other += 1;
            failures.report(
                case,
                "a valid configuration gives no renderer",
                &message,
                &text,
            );
        }
    }
}

/// Golden text every mutation starts from: every field, defaulted.
pub fn golden() -> String {
    to_yaml(&KubeProxyConfiguration::defaulted()).unwrap_or_default()
}

enum Problem {
    /// Refused; with the reason when the message does not name its subject.
    Rejected(Option<(&'static str, String)>),
    /// Valid, yet the iptables options cannot be built from it, and the
    /// error names no field.
    Unusable(String),
}

fn input(gen: &mut Gen, golden: &str) -> String {
    match gen.below(5) {
        0 => mutate::noise(gen),
        1 => mutate::damage(gen, golden, 6),
        _ => {
            let mut lines: Vec<String> = golden.lines().map(str::to_owned).collect();
            for _ in 0..1 + gen.below(3) {
                let at = gen.below(lines.len());
                if let Some((key, _)) = lines[at].split_once(':') {
                    lines[at] = format!("{key}: {}", gen.pick(VALUES));
                }
            }
            lines.join("\n")
        }
    }
}

fn check(text: &str) -> Result<(), Problem> {
    let cfg = match load_str(text, ORIGIN) {
        Ok((cfg, _warnings)) => cfg,
        Err(error) => return Err(Problem::Rejected(load_error_unnamed(&error))),
    };
    if let Err(errors) = validate(&cfg) {
        let unnamed = errors
            .0
            .iter()
            .find(|e| e.field.trim().is_empty() || e.detail.trim().is_empty())
            .map(|e| ("a validation error names no field", format!("{e:?}")));
        return Err(Problem::Rejected(unnamed));
    }
    // What validation leaves to the backend (as upstream, which checks
    // only that the bridge or prefix is not empty) must be refused when
    // the backend is built, naming the field.
    // Validation checks the mode and the CIDRs these read: no excuse here.
    let options = iptables_options(&cfg).map_err(Problem::Unusable)?;
    let built = LocalDetector::from_config(&cfg)
        .and_then(|local_detector| {
            NodePortAddresses::parse(&cfg.effective_node_port_addresses()).map(|_| {
                IptablesOptions {
                    local_detector,
                    ..options
                }
            })
        })
        .map_err(kp_iptables::IptablesError::from)
        .and_then(Renderer::new)
        .map_err(|e| e.to_string());
    match built {
        Ok(_) => Ok(()),
        Err(message) if message.contains("field ") => Err(Problem::Rejected(None)),
        Err(message) => Err(Problem::Unusable(message)),
    }
}

fn load_error_unnamed(error: &ConfigError) -> Option<(&'static str, String)> {
    let message = error.to_string();
    if !message.contains(ORIGIN) {
        return Some(("the error does not name the file", message));
    }
    match error {
        ConfigError::FieldType { field, .. } if field.trim().is_empty() || field == "." => {
            Some(("a type error names no field", message))
        }
        _ => None,
    }
}

/// The renderer's options as the binary builds them (`modes::iptables`).
fn iptables_options(cfg: &KubeProxyConfiguration) -> Result<IptablesOptions, String> {
    // Validation checks the mode and the CIDRs the detector reads.
    cfg.effective_detect_local_mode()
        .map_err(|e| e.to_string())?;
    cfg.cluster_cidrs().map_err(|e| e.to_string())?;
    let masquerade_bit = cfg.iptables.masquerade_bit.unwrap_or(14);
    Ok(IptablesOptions {
        masquerade_mark: kp_node::MasqueradeMark::from_config(
            Some(masquerade_bit),
            "iptables.masqueradeBit",
        )
        .map_err(|e| e.to_string())?,
        masquerade_all: cfg.iptables.masquerade_all,
        localhost_node_ports: cfg.iptables.localhost_node_ports.unwrap_or(true),
        conntrack_tcp_be_liberal: cfg.conntrack.tcp_be_liberal,
        ..IptablesOptions::default()
    })
}
