//! Parsing of the rule shapes the renderer writes (and the jump rules).
//! Unknown options are errors, so a typo in a rule fails a test instead of
//! being silently ignored.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// One parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The rule as written, without `-A CHAIN`.
    pub raw: String,
    pub(crate) matches: Vec<Match>,
    pub(crate) target: Target,
}

/// One match of a rule; `bool` fields are "negated" (`!`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Match {
    Protocol(bool, String),
    Source(bool, IpNet),
    Destination(bool, IpNet),
    InInterface(bool, String),
    DestinationPort(bool, u16),
    SourceLocal(bool),
    DestinationLocal(bool),
    Mark(bool, u32, u32),
    ConntrackState(bool, Vec<String>),
    Probability(f64),
    RecentCheck,
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
    Dnat(SocketAddr),
    Masquerade,
    OrMark(u32),
    XorMark(u32),
    SetXmark(u32, u32),
}

/// Splits a line into words, keeping `"quoted words"` together.
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

/// Parses the words of a rule after `-A CHAIN`.
pub(crate) fn parse_rule(words: &[String]) -> Result<Rule, String> {
    let mut rule = Rule {
        raw: words.join(" "),
        matches: Vec::new(),
        target: Target::None,
    };
    let mut negate = false;
    let mut iter = words.iter().map(String::as_str);
    while let Some(word) = iter.next() {
        if word == "!" {
            negate = true;
            continue;
        }
        let mut value = || iter.next().ok_or_else(|| format!("{word} needs a value"));
        match word {
            "-m" | "--mode" | "--name" | "--seconds" | "--nfacct-name" | "--reject-with" => {
                value()?;
            }
            "--reap" | "--set" | "--random-fully" => {}
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
            "--dport" => rule
                .matches
                .push(Match::DestinationPort(negate, number(value()?)?)),
            "--src-type" => rule
                .matches
                .push(Match::SourceLocal(local_type(value()?)? != negate)),
            "--dst-type" => {
                rule.matches
                    .push(Match::DestinationLocal(local_type(value()?)? != negate));
            }
            "--mark" => {
                let (mark, mask) = mark_mask(value()?)?;
                rule.matches.push(Match::Mark(negate, mark, mask));
            }
            "--ctstate" => {
                let states = value()?.split(',').map(str::to_owned).collect();
                rule.matches.push(Match::ConntrackState(negate, states));
            }
            "--probability" => {
                let p = value()?.parse().map_err(|_| "bad probability".to_owned())?;
                rule.matches.push(Match::Probability(p));
            }
            "--rcheck" => rule.matches.push(Match::RecentCheck),
            "-j" => rule.target = target(value()?),
            "--to-destination" => {
                let to = value()?;
                let address = to
                    .parse()
                    .map_err(|_| format!("bad DNAT destination {to}"))?;
                rule.target = Target::Dnat(address);
            }
            "--or-mark" => rule.target = Target::OrMark(hex(value()?)?),
            "--xor-mark" => rule.target = Target::XorMark(hex(value()?)?),
            "--set-xmark" => {
                let (mark, mask) = mark_mask(value()?)?;
                rule.target = Target::SetXmark(mark, mask);
            }
            other => return Err(format!("unknown option {other}")),
        }
        negate = false;
    }
    Ok(rule)
}

fn target(name: &str) -> Target {
    match name {
        "ACCEPT" => Target::Accept,
        "DROP" => Target::Drop,
        "REJECT" => Target::Reject,
        "RETURN" => Target::Return,
        "MASQUERADE" => Target::Masquerade,
        // Filled in by the option that follows (--to-destination, --or-mark…).
        "DNAT" | "MARK" => Target::None,
        chain => Target::Jump(chain.to_owned()),
    }
}

fn network(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("bad address {text}"))
}

fn number(text: &str) -> Result<u16, String> {
    text.parse().map_err(|_| format!("bad port {text}"))
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

    #[test]
    fn quoted_comments_stay_one_word() {
        let got = words(r#"-m comment --comment "a b" -j X"#).unwrap();
        assert_eq!(got, ["-m", "comment", "--comment", "a b", "-j", "X"]);
    }

    #[test]
    fn negations_apply_to_the_next_option_only() {
        let rule =
            parse_rule(&words("! -s 10.0.0.0/8 -d 10.96.0.1 -j KUBE-MARK-MASQ").unwrap()).unwrap();
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
    fn unknown_options_are_errors() {
        assert!(parse_rule(&words("--bogus 1 -j ACCEPT").unwrap()).is_err());
    }
}
