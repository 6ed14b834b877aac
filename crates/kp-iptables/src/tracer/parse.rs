//! Parsing of rules: the shapes the renderer writes (and the jump rules),
//! and the forms `iptables-save` prints them in, for both flavors.
//!
//! In [`Strictness::Strict`] mode an option the tracer does not understand
//! is an error, so a typo in a rule we render fails a test instead of being
//! silently ignored. In [`Strictness::Lenient`] mode (rules of other
//! software read back from the kernel) the option, with its values, is kept
//! in [`Rule::unknown`] and the tracer decides at trace time whether the
//! packet's path depends on it.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// One parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The rule as written, without `-A CHAIN`.
    pub raw: String,
    pub(crate) matches: Vec<Match>,
    pub(crate) target: Target,
    /// Options of matches the tracer does not understand (lenient mode
    /// only), each with its module and values, e.g. `-m owner --uid-owner 0`.
    pub(crate) unknown: Vec<String>,
}

/// How to treat options the tracer does not understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strictness {
    /// They are errors (our own chains, rendered text).
    Strict,
    /// They are kept in [`Rule::unknown`] (other software's chains, read
    /// from the kernel).
    Lenient,
}

/// One match of a rule; `bool` fields are "negated" (`!`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Match {
    Protocol(bool, String),
    Source(bool, IpNet),
    Destination(bool, IpNet),
    InInterface(bool, String),
    /// `--dport`, `--dports` (multiport): inclusive port ranges.
    DestinationPort(bool, Vec<(u16, u16)>),
    SourceLocal(bool),
    DestinationLocal(bool),
    Mark(bool, u32, u32),
    ConntrackState(bool, Vec<String>),
    /// `-m statistic --mode random --probability P`, as the kernel holds
    /// it: P × 2³¹, rounded (xt_statistic compares a random 31-bit number
    /// against it).
    Probability(u32),
    /// `-m recent --rcheck` or `--update`: matches only when the source is
    /// on the list, which it never is for a first packet.
    RecentCheck {
        name: String,
        seconds: Option<u32>,
    },
    /// `-m set --match-set NAME FLAGS`.
    Set {
        negate: bool,
        name: String,
        flags: Vec<SetFlag>,
    },
    /// `-m physdev --physdev-is-in`: the packet came in on a bridge port.
    PhysdevIsIn(bool),
    /// `-m ipvs --vaddr A --vproto P --vport N`: IPVS took the packet for
    /// that virtual service.
    Ipvs {
        vaddr: Option<IpNet>,
        vproto: Option<String>,
        vport: Option<u16>,
    },
}

/// Which address or port of the packet a `--match-set` dimension takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetFlag {
    Src,
    Dst,
}

/// What a rule does when it matches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    None,
    Jump(String),
    Accept,
    Drop,
    Reject,
    Return,
    /// DNAT to an address, and a port unless it stays.
    Dnat(IpAddr, Option<u16>),
    Masquerade,
    /// Source NAT to a fixed address (other software's rules).
    Snat,
    OrMark(u32),
    XorMark(u32),
    SetXmark(u32, u32),
    /// A target extension the tracer does not model (lenient mode only),
    /// by name; [`Target::is_inert`] says whether it can change the path.
    Extension(String),
}

/// Modules whose options the tracer reads (or knowingly ignores).
const KNOWN_MODULES: [&str; 15] = [
    "nfacct",
    "comment",
    "tcp",
    "udp",
    "sctp",
    "addrtype",
    "mark",
    "conntrack",
    "state",
    "statistic",
    "recent",
    "multiport",
    "set",
    "physdev",
    "ipvs",
];

/// Target extensions that never end a chain, rewrite an address or change
/// the packet mark: a packet's path does not depend on them.
const INERT_TARGETS: [&str; 12] = [
    "LOG", "NFLOG", "ULOG", "TRACE", "AUDIT", "TCPMSS", "CHECKSUM", "CLASSIFY", "DSCP", "TOS",
    "TTL", "HL",
];

/// Splits a line into words, keeping `"quoted words"` together;
/// `iptables-save` writes `\"` and `\\` inside quotes.
pub(crate) fn words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut word = String::new();
        if c == '"' {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(escaped) => word.push(escaped),
                        None => return Err("unterminated quote".to_owned()),
                    },
                    Some(c) => word.push(c),
                    None => return Err("unterminated quote".to_owned()),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        words.push(word);
    }
    Ok(words)
}

/// Parses the words of a rule after `-A CHAIN`, strictly.
pub(crate) fn parse_rule(words: &[String]) -> Result<Rule, String> {
    parse_rule_with(words, Strictness::Strict)
}

/// Parses the words of a rule after `-A CHAIN`. In lenient mode a rule
/// whose values cannot be read (a DNAT range, an address type the tracer
/// does not know) is kept whole as one it cannot decide, with a target that
/// may change the path.
pub(crate) fn parse_rule_with(words: &[String], strictness: Strictness) -> Result<Rule, String> {
    match parse_words(words, strictness) {
        Err(reason) if strictness == Strictness::Lenient => Ok(Rule {
            raw: words.join(" "),
            matches: Vec::new(),
            target: Target::Extension(format!("unreadable rule ({reason})")),
            unknown: vec![format!("an unreadable rule ({reason})")],
        }),
        parsed => parsed,
    }
}

fn parse_words(words: &[String], strictness: Strictness) -> Result<Rule, String> {
    let mut rule = Rule {
        raw: words.join(" "),
        matches: Vec::new(),
        target: Target::None,
        unknown: Vec::new(),
    };
    let mut negate = false;
    let mut module = String::new();
    let mut index = 0;
    while index < words.len() {
        let word = words[index].as_str();
        index += 1;
        if word == "!" {
            negate = true;
            continue;
        }
        let mut value = || {
            let value = words
                .get(index)
                .map(String::as_str)
                .ok_or_else(|| format!("{word} needs a value"));
            index += 1;
            value
        };
        let unknown_module = !module.is_empty() && !KNOWN_MODULES.contains(&module.as_str());
        match word {
            "-m" => {
                module = value()?.to_owned();
                if !KNOWN_MODULES.contains(&module.as_str()) {
                    if strictness == Strictness::Strict {
                        return Err(format!("unknown module {module}"));
                    }
                    rule.unknown.push(format!("-m {module}"));
                }
            }
            // A match option of a module the tracer does not know: it and
            // its values (up to the next option) stay together.
            option if unknown_module && option.starts_with("--") => {
                let mut text = if negate {
                    format!("! {option}")
                } else {
                    option.to_owned()
                };
                while let Some(next) = words.get(index).filter(|w| !is_option(w)) {
                    text.push(' ');
                    text.push_str(next);
                    index += 1;
                }
                if let Some(last) = rule.unknown.last_mut() {
                    last.push(' ');
                    last.push_str(&text);
                }
            }
            "--mode" | "--nfacct-name" | "--reject-with" | "--mask" | "--to-ports" => {
                value()?;
            }
            "--reap" | "--set" | "--random-fully" | "--random" | "--rsource" | "--rdest"
            | "--persistent" => {}
            // Read by --rcheck / --update, wherever they stand.
            "--name" | "--seconds" => {
                value()?;
            }
            "--comment" => {
                value()?;
            }
            "-p" => rule
                .matches
                .push(Match::Protocol(negate, value()?.to_owned())),
            "-s" => rule.matches.push(Match::Source(negate, network(value()?)?)),
            "-d" => rule
                .matches
                .push(Match::Destination(negate, network(value()?)?)),
            "-i" => rule
                .matches
                .push(Match::InInterface(negate, value()?.to_owned())),
            "--dport" | "--dports" | "--destination-ports" => rule
                .matches
                .push(Match::DestinationPort(negate, port_ranges(value()?)?)),
            "--src-type" | "--dst-type" => {
                let text = value()?;
                match (local_type(text), strictness) {
                    (Ok(local), _) if word == "--src-type" => {
                        rule.matches.push(Match::SourceLocal(local != negate));
                    }
                    (Ok(local), _) => rule.matches.push(Match::DestinationLocal(local != negate)),
                    (Err(_), Strictness::Lenient) => {
                        let bang = if negate { "! " } else { "" };
                        rule.unknown.push(format!("{bang}{word} {text}"));
                    }
                    (Err(reason), Strictness::Strict) => return Err(reason),
                }
            }
            "--mark" => {
                let (mark, mask) = mark_mask(value()?)?;
                rule.matches.push(Match::Mark(negate, mark, mask));
            }
            "--ctstate" | "--state" => {
                let states = value()?.split(',').map(str::to_owned).collect();
                rule.matches.push(Match::ConntrackState(negate, states));
            }
            "--probability" => {
                let text = value()?;
                let p: f64 = text
                    .parse()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("bad probability {text}"))?;
                rule.matches.push(Match::Probability(kernel_probability(p)));
            }
            // The list name and --seconds may come before or after.
            "--rcheck" | "--update" => {
                let name = option_value(words, "--name")
                    .unwrap_or("DEFAULT")
                    .to_owned();
                let seconds = match option_value(words, "--seconds") {
                    Some(text) => Some(text.parse().map_err(|_| format!("bad --seconds {text}"))?),
                    None => None,
                };
                rule.matches.push(Match::RecentCheck { name, seconds });
            }
            "--match-set" => {
                let name = value()?.to_owned();
                let flags = value()?
                    .split(',')
                    .map(|flag| match flag {
                        "src" => Ok(SetFlag::Src),
                        "dst" => Ok(SetFlag::Dst),
                        other => Err(format!("bad --match-set flag {other}")),
                    })
                    .collect::<Result<_, _>>()?;
                rule.matches.push(Match::Set {
                    negate,
                    name,
                    flags,
                });
            }
            "--physdev-is-in" => rule.matches.push(Match::PhysdevIsIn(negate)),
            "--vaddr" | "--vproto" | "--vport" => {
                let text = value()?;
                if !matches!(rule.matches.last(), Some(Match::Ipvs { .. })) {
                    rule.matches.push(Match::Ipvs {
                        vaddr: None,
                        vproto: None,
                        vport: None,
                    });
                }
                if let Some(Match::Ipvs {
                    vaddr,
                    vproto,
                    vport,
                }) = rule.matches.last_mut()
                {
                    match word {
                        "--vaddr" => *vaddr = Some(network(text)?),
                        "--vproto" => *vproto = Some(text.to_owned()),
                        _ => *vport = Some(number(text)?),
                    }
                }
            }
            "-j" => {
                module.clear();
                let name = value()?;
                rule.target = target(name);
                // The options of a target the tracer does not model are
                // its own business: the whole target is one extension.
                if !is_modelled_target(name) {
                    if strictness == Strictness::Strict {
                        return Err(format!("unknown target {name}"));
                    }
                    rule.target = Target::Extension(name.to_owned());
                    break;
                }
            }
            // A goto changes the path as a jump does, without the return.
            "-g" => {
                let chain = value()?;
                if strictness == Strictness::Strict {
                    return Err(format!("goto {chain} is not modelled"));
                }
                rule.target = Target::Extension(format!("-g {chain}"));
                break;
            }
            "--to-destination" => rule.target = dnat(value()?)?,
            "--to-source" => {
                value()?;
                rule.target = Target::Snat;
            }
            "--or-mark" => rule.target = Target::OrMark(hex(value()?)?),
            "--xor-mark" => rule.target = Target::XorMark(hex(value()?)?),
            "--set-xmark" | "--set-mark" => {
                let (mark, mask) = mark_mask(value()?)?;
                rule.target = if word == "--set-mark" {
                    // --set-mark V/M clears the bits of M, then sets V.
                    Target::SetXmark(mark, mark | mask)
                } else {
                    Target::SetXmark(mark, mask)
                };
            }
            other if strictness == Strictness::Lenient => {
                let mut text = if negate {
                    format!("! {other}")
                } else {
                    other.to_owned()
                };
                while let Some(next) = words.get(index).filter(|w| !is_option(w)) {
                    text.push(' ');
                    text.push_str(next);
                    index += 1;
                }
                rule.unknown.push(text);
            }
            other => return Err(format!("unknown option {other}")),
        }
        negate = false;
    }
    Ok(rule)
}

impl Target {
    /// Whether a rule with this target leaves the packet's path as it is
    /// when it matches (a jump is judged by the chain it jumps to).
    pub(crate) fn is_inert(&self) -> bool {
        match self {
            Target::None => true,
            Target::Extension(name) => INERT_TARGETS.contains(&name.as_str()),
            _ => false,
        }
    }
}

/// The kernel's form of a probability: `lround(0x80000000 * p)`, as
/// iptables' libxt_statistic stores it.
pub(crate) fn kernel_probability(p: f64) -> u32 {
    // p is within 0..=1, so the product is within 0..=2^31 and fits.
    (p * f64::from(1u32 << 31)).round() as u32
}

/// The value of `option` anywhere in the rule.
fn option_value<'w>(words: &'w [String], option: &str) -> Option<&'w str> {
    let at = words.iter().position(|w| w == option)?;
    words.get(at + 1).map(String::as_str)
}

fn is_option(word: &str) -> bool {
    word == "!" || (word.starts_with('-') && word.len() > 1 && !is_number(&word[1..]))
}

fn is_number(text: &str) -> bool {
    text.chars().all(|c| c.is_ascii_digit())
}

fn is_modelled_target(name: &str) -> bool {
    !matches!(target(name), Target::Jump(_)) || !is_extension_name(name)
}

/// Target extensions are upper-case (`LOG`, `CT`, `CONNMARK`); our chains
/// all start with `KUBE-`. A chain of other software with an upper-case
/// name (Docker's `DOCKER`) is taken for an extension here and turned
/// back into a jump by the caller, who knows the table's chains.
fn is_extension_name(name: &str) -> bool {
    !name.starts_with("KUBE-")
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

fn target(name: &str) -> Target {
    match name {
        "ACCEPT" => Target::Accept,
        "DROP" => Target::Drop,
        "REJECT" => Target::Reject,
        "RETURN" => Target::Return,
        "MASQUERADE" => Target::Masquerade,
        // Filled in by the option that follows (--to-destination, --or-mark…).
        "DNAT" | "MARK" | "SNAT" => Target::None,
        chain => Target::Jump(chain.to_owned()),
    }
}

fn dnat(to: &str) -> Result<Target, String> {
    if let Ok(address) = to.parse::<SocketAddr>() {
        return Ok(Target::Dnat(address.ip(), Some(address.port())));
    }
    let address = to.trim_start_matches('[').trim_end_matches(']');
    address
        .parse()
        .map(|ip| Target::Dnat(ip, None))
        .map_err(|_| format!("bad DNAT destination {to}"))
}

fn network(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("bad address {text}"))
}

fn number(text: &str) -> Result<u16, String> {
    text.parse().map_err(|_| format!("bad port {text}"))
}

/// `80`, `80:90`, or multiport's `80,443,1000:2000`.
fn port_ranges(text: &str) -> Result<Vec<(u16, u16)>, String> {
    text.split(',')
        .map(|part| match part.split_once(':') {
            Some((low, high)) => Ok((number(low)?, number(high)?)),
            None => number(part).map(|port| (port, port)),
        })
        .collect()
}

fn local_type(text: &str) -> Result<bool, String> {
    match text {
        "LOCAL" => Ok(true),
        other => Err(format!("unsupported address type {other}")),
    }
}

fn hex(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    u32::from_str_radix(digits, 16).map_err(|_| format!("bad mark {text}"))
}

fn mark_mask(text: &str) -> Result<(u32, u32), String> {
    match text.split_once('/') {
        Some((mark, mask)) => Ok((hex(mark)?, hex(mask)?)),
        None => Ok((hex(text)?, u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn strict(line: &str) -> Result<Rule, String> {
        parse_rule(&words(line).unwrap())
    }

    fn lenient(line: &str) -> Rule {
        parse_rule_with(&words(line).unwrap(), Strictness::Lenient).unwrap()
    }

    #[test]
    fn quoted_comments_stay_one_word() {
        let got = words(r#"-m comment --comment "a b" -j X"#).unwrap();
        assert_eq!(got, ["-m", "comment", "--comment", "a b", "-j", "X"]);
    }

    #[test]
    fn escaped_quotes_inside_a_comment_as_iptables_save_writes_them() {
        let got = words(r#"--comment "say \"hi\" \\ bye" -j X"#).unwrap();
        assert_eq!(got, ["--comment", r#"say "hi" \ bye"#, "-j", "X"]);
    }

    #[test]
    fn negations_apply_to_the_next_option_only() {
        let rule = strict("! -s 10.0.0.0/8 -d 10.96.0.1 -j KUBE-MARK-MASQ").unwrap();
        assert_eq!(
            rule.matches,
            [
                Match::Source(true, "10.0.0.0/8".parse().unwrap()),
                Match::Destination(false, "10.96.0.1/32".parse().unwrap()),
            ]
        );
        assert_eq!(rule.target, Target::Jump("KUBE-MARK-MASQ".into()));
    }

    #[test]
    fn unknown_options_modules_and_targets_are_errors_when_strict() {
        assert!(strict("--bogus 1 -j ACCEPT").is_err());
        assert!(strict("-m owner --uid-owner 0 -j ACCEPT").is_err());
        assert!(strict("-j LOG --log-prefix x").is_err());
    }

    #[test]
    fn unknown_options_are_kept_with_their_values_when_lenient() {
        let rule = lenient(
            r#"-s 10.0.0.0/8 -o docker0 -m owner ! --uid-owner 0 --gid-owner 5 -j LOG --log-prefix "a b""#,
        );
        assert_eq!(
            rule.unknown,
            ["-o docker0", "-m owner ! --uid-owner 0 --gid-owner 5"]
        );
        assert_eq!(rule.target, Target::Extension("LOG".into()));
        assert!(rule.target.is_inert());
        assert_eq!(
            rule.matches,
            [Match::Source(false, "10.0.0.0/8".parse().unwrap())]
        );
    }

    #[test]
    fn a_goto_or_an_unreadable_value_is_a_rule_that_may_change_the_path() {
        let goto = lenient("-s 10.0.0.0/8 -g OTHER");
        assert_eq!(goto.target, Target::Extension("-g OTHER".into()));
        assert!(!goto.target.is_inert());
        let range = lenient("-p tcp -j DNAT --to-destination 10.0.0.1-10.0.0.9");
        assert!(range.matches.is_empty() && !range.unknown.is_empty());
        assert!(!range.target.is_inert());
        assert!(strict("-j DNAT --to-destination 10.0.0.1-10.0.0.9").is_err());
        assert!(strict("-s 10.0.0.0/8 -g KUBE-X").is_err());
    }

    #[test]
    fn saved_recent_match_keeps_its_list_and_seconds_in_any_order() {
        let rule = strict("-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-X --mask 255.255.255.255 --rsource -j KUBE-SEP-X").unwrap();
        assert_eq!(
            rule.matches,
            [Match::RecentCheck {
                name: "KUBE-SEP-X".into(),
                seconds: Some(10800),
            }]
        );
    }

    #[test]
    fn probabilities_are_held_as_the_kernel_holds_them() {
        // The renderer writes ten decimals, iptables-save eleven: both are
        // the same kernel value.
        let rendered =
            strict("-m statistic --mode random --probability 0.3333333333 -j KUBE-X").unwrap();
        let saved =
            strict("-m statistic --mode random --probability 0.33333333349 -j KUBE-X").unwrap();
        assert_eq!(rendered.matches, saved.matches);
        assert_eq!(rendered.matches, [Match::Probability(715_827_883)]);
    }

    #[test]
    fn saved_mark_targets() {
        // --or-mark 0x4000 and --xor-mark 0x4000, as iptables-save prints them.
        let or = strict("-j MARK --set-xmark 0x4000/0x4000").unwrap();
        assert_eq!(or.target, Target::SetXmark(0x4000, 0x4000));
        let xor = strict("-j MARK --set-xmark 0x4000/0x0").unwrap();
        assert_eq!(xor.target, Target::SetXmark(0x4000, 0));
    }

    #[test]
    fn multiport_and_port_ranges() {
        let rule = strict("-p tcp -m multiport --dports 80,443,8000:8080 -j ACCEPT").unwrap();
        assert_eq!(
            rule.matches[1],
            Match::DestinationPort(false, vec![(80, 80), (443, 443), (8000, 8080)])
        );
    }

    #[test]
    fn match_set_flags() {
        let rule = strict("-m set ! --match-set KUBE-CLUSTER-IP src,dst -j ACCEPT").unwrap();
        assert_eq!(
            rule.matches,
            [Match::Set {
                negate: true,
                name: "KUBE-CLUSTER-IP".into(),
                flags: vec![SetFlag::Src, SetFlag::Dst],
            }]
        );
    }
}
