//! Reading the `kube-proxy` table the kernel holds back into the typed
//! model (`nft list table ip kube-proxy`, over netlink and typed), so a
//! packet can be traced through what the kernel actually holds rather than
//! through what was rendered.
//!
//! [`read_table`] dumps the table's chains, rules, sets and elements
//! (`NFT_MSG_GETCHAIN`, `GETRULE`, `GETSET`, `GETSETELEM` with
//! `NLM_F_DUMP`) and decodes them ([`decode`], pure) into a
//! [`Table`]. The dumps are several questions, so the ruleset
//! generation is read before and after them and the read is repeated when
//! a commit came in between.
//!
//! The kernel holds some matches in a form of their own: `ip saddr != {
//! A, B }` becomes an anonymous interval set whose ranges are merged, and
//! a one-address list a plain comparison. [`kernel_form`] writes an
//! intended table in that form, so it compares equal with a read-back of
//! a faithful commit.

use std::collections::BTreeMap;

use kp_model::IpFamily;
use kp_netlink::nfnetlink::{self, NFPROTO_IPV4, NFPROTO_IPV6, SUBSYS_NFTABLES};
use kp_netlink::{Channel, NETLINK_NETFILTER, NLM_F_DUMP, NLM_F_DUMP_INTR};

use crate::model::{Address, Expr, Rule};
use crate::names::TABLE;
use crate::tracer::Table;

pub mod decode;

pub use decode::Dump;

/// Why the table could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// A netlink question failed.
    #[error("reading {table} over netlink failed while {step}: {source}")]
    Netlink {
        /// `table ip kube-proxy` or `table ip6 kube-proxy`.
        table: String,
        /// What was being asked, e.g. `dumping its rules`.
        step: String,
        /// The error.
        #[source]
        source: kp_netlink::Error,
    },
    /// A rule holds something the encoder never writes.
    #[error("{table}: rule {} in chain {chain}: expression {index} ({kind}): {reason}", handle_text(*handle))]
    Rule {
        /// The table.
        table: String,
        /// The rule's chain.
        chain: String,
        /// The rule's handle (`nft -a list`), when the message had one.
        handle: Option<u64>,
        /// The position of the expression in the rule, from 0.
        index: usize,
        /// The expression's kind (`payload`, `cmp`, …, or `comment`).
        kind: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A chain, set or element is not one the encoder writes.
    #[error("{table}: {object}: {reason}")]
    Object {
        /// The table.
        table: String,
        /// The object, e.g. `element 10.96.0.10 . tcp . 80 of map service-ips`.
        object: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Every attempt saw another commit while it read.
    #[error("{table} changed while it was read, {attempts} times in a row")]
    Changing {
        /// The table.
        table: String,
        /// Reads attempted.
        attempts: usize,
    },
}

/// Reads tried before [`ReadError::Changing`].
const READ_ATTEMPTS: usize = 5;
/// `ENOENT`.
const ENOENT: i32 = 2;
// NFT_MSG_GET*
const MSG_GETCHAIN: u8 = 4;
const MSG_GETRULE: u8 = 7;
const MSG_GETSET: u8 = 10;
const MSG_GETSETELEM: u8 = 13;
// NFT_MSG_NEW*, the kinds of the dumps' answers.
const MSG_NEWCHAIN: u8 = 3;
const MSG_NEWRULE: u8 = 6;
const MSG_NEWSET: u8 = 9;
const MSG_NEWSETELEM: u8 = 12;
/// `NFTA_*_TABLE` of rules and sets, `NFTA_SET_ELEM_LIST_SET`.
const ATTR_TABLE: u16 = 1;
const ATTR_SET: u16 = 2;

/// What one attempt found.
enum Attempt {
    /// The table does not exist.
    Absent,
    /// A commit came in between; try again.
    Changed,
    /// The dumps of one generation.
    Read(Dump),
}

/// The `kube-proxy` table of `family` as the kernel of the calling
/// thread's network namespace holds it; `Ok(None)` when there is no such
/// table. Like `nft list table ip kube-proxy`, typed.
pub fn read_table(family: IpFamily) -> Result<Option<Table>, ReadError> {
    let mut channel = Channel::new(NETLINK_NETFILTER);
    read_table_on(&mut channel, family)
}

/// [`read_table`] over `channel` (a `NETLINK_NETFILTER` channel).
pub fn read_table_on(channel: &mut Channel, family: IpFamily) -> Result<Option<Table>, ReadError> {
    let table = table_text(family);
    for _ in 0..READ_ATTEMPTS {
        let before = generation(channel, family)?;
        let attempt = dump_table(channel, family)?;
        let after = generation(channel, family)?;
        match attempt {
            Attempt::Absent => return Ok(None),
            Attempt::Read(dump) if before == after => {
                return decode::decode(family, &dump).map(Some)
            }
            Attempt::Read(_) | Attempt::Changed => {
                tracing::debug!(table = %table, before, after, "the ruleset changed while the table was read; reading again");
            }
        }
    }
    Err(ReadError::Changing {
        table,
        attempts: READ_ATTEMPTS,
    })
}

/// `table` in the form the kernel holds it: every rule as
/// [`kernel_form_rule`] writes it. Sets and elements are unchanged.
pub fn kernel_form(table: &Table) -> Table {
    let mut out = table.clone();
    for rules in out.chains.values_mut() {
        for rule in rules.iter_mut() {
            *rule = kernel_form_rule(rule);
        }
    }
    out
}

/// `rule` as a read-back of its commit decodes it: an address list of one
/// entry becomes a plain comparison, a longer one its merged ranges as the
/// fewest prefixes, smallest first; a full-length prefix is an address.
pub fn kernel_form_rule(rule: &Rule) -> Rule {
    let exprs = rule
        .exprs
        .iter()
        .map(|expr| match expr {
            Expr::AddrIs {
                field,
                negate,
                value,
            } => Expr::AddrIs {
                field: *field,
                negate: *negate,
                value: decode::address_of(value.net()),
            },
            Expr::AddrNotIn { field, values } if values.len() == 1 => Expr::AddrIs {
                field: *field,
                negate: true,
                value: decode::address_of(values[0].net()),
            },
            Expr::AddrNotIn { field, values } => Expr::AddrNotIn {
                field: *field,
                values: merged_prefixes(values),
            },
            other => other.clone(),
        })
        .collect();
    Rule {
        chain: rule.chain.clone(),
        exprs,
        comment: rule.comment,
    }
}

/// The differences between an intended table and a read-back, one line
/// each (`chain C: rule 3 is …`, `set M: element K missing`), empty when
/// they hold the same. Both are compared as given; pass the intended one
/// through [`kernel_form`] first. Elements of dynamic sets (affinity) are
/// left out: packets add them, no transaction does.
pub fn differences(intended: &Table, read: &Table) -> Vec<String> {
    let mut out = Vec::new();
    for (name, rules) in &intended.chains {
        match read.chains.get(name) {
            None => out.push(format!("chain {name}: missing")),
            Some(found) => {
                for (index, rule) in rules.iter().enumerate() {
                    match found.get(index) {
                        Some(got) if got == rule => {}
                        Some(got) => out.push(format!(
                            "chain {name}: rule {index} is {:?}, intended {:?}",
                            got.exprs, rule.exprs
                        )),
                        None => out.push(format!("chain {name}: rule {index} missing")),
                    }
                }
                if found.len() > rules.len() {
                    out.push(format!(
                        "chain {name}: {} rules more than intended",
                        found.len() - rules.len()
                    ));
                }
            }
        }
    }
    for name in read.chains.keys() {
        if !intended.chains.contains_key(name) {
            out.push(format!("chain {name}: not intended"));
        }
    }
    for (name, base) in &intended.base_chains {
        match read.base_chains.get(name) {
            Some(got) if got == base => {}
            Some(got) => out.push(format!(
                "chain {name}: hooks in as {got:?}, intended {base:?}"
            )),
            None => out.push(format!("chain {name}: not a base chain, intended {base:?}")),
        }
    }
    for (name, got) in &read.base_chains {
        if !intended.base_chains.contains_key(name) {
            out.push(format!(
                "chain {name}: a base chain ({got:?}), intended a regular one"
            ));
        }
    }
    for name in intended.sets.symmetric_difference(&read.sets) {
        let what = if intended.sets.contains(name) {
            "missing"
        } else {
            "not intended"
        };
        out.push(format!("set {name}: {what}"));
    }
    for name in intended
        .dynamic_sets
        .symmetric_difference(&read.dynamic_sets)
    {
        out.push(format!("set {name}: dynamic in one table only"));
    }
    let empty = BTreeMap::new();
    for (name, elements) in &intended.maps {
        if intended.dynamic_sets.contains(name) {
            continue;
        }
        let found = read.maps.get(name).unwrap_or(&empty);
        for (key, verdict) in elements {
            match found.get(key) {
                Some(got) if got == verdict => {}
                Some(got) => out.push(format!(
                    "set {name}: element {key} is {got:?}, intended {verdict:?}"
                )),
                None => out.push(format!("set {name}: element {key} missing")),
            }
        }
        for key in found.keys() {
            if !elements.contains_key(key) {
                out.push(format!("set {name}: element {key} not intended"));
            }
        }
    }
    for (name, spec) in &intended.typeof_sets {
        match read.typeof_sets.get(name) {
            Some(got) if got == spec => {}
            Some(got) => out.push(format!("set {name}: declared {got:?}, intended {spec:?}")),
            None => out.push(format!(
                "set {name}: not declared with typeof, intended {spec:?}"
            )),
        }
    }
    let no_targets = BTreeMap::new();
    for (name, elements) in &intended.targets {
        if intended.dynamic_sets.contains(name) {
            continue;
        }
        let found = read.targets.get(name).unwrap_or(&no_targets);
        for (key, target) in elements {
            match found.get(key) {
                Some(got) if got == target => {}
                Some(got) => out.push(format!(
                    "map {name}: element {key} is {got}, intended {target}"
                )),
                None => out.push(format!("map {name}: element {key} missing")),
            }
        }
        for key in found.keys() {
            if !elements.contains_key(key) {
                out.push(format!("map {name}: element {key} not intended"));
            }
        }
    }
    out
}

/// The list `ip saddr != { … }` is encoded from: ranges merged where they
/// touch, then written back as prefixes.
fn merged_prefixes(values: &[Address]) -> Vec<Address> {
    let Some(first) = values.first() else {
        return Vec::new();
    };
    let v4 = first.net().addr().is_ipv4();
    let width = if v4 { 32 } else { 128 };
    let mut ranges: Vec<(u128, u128)> = values
        .iter()
        .map(|value| match value.net() {
            ipnet::IpNet::V4(n) => (
                u128::from(u32::from(n.network())),
                u128::from(u32::from(n.broadcast())),
            ),
            ipnet::IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
        })
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::new();
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.0 <= last.1.saturating_add(1) => last.1 = last.1.max(range.1),
            _ => merged.push(range),
        }
    }
    merged
        .into_iter()
        .flat_map(|(start, end)| decode::prefixes(start, end, width))
        .map(decode::address_of)
        .collect()
}

/// Dumps the table's objects, or finds it absent.
fn dump_table(channel: &mut Channel, family: IpFamily) -> Result<Attempt, ReadError> {
    let nfproto = nfproto(family);
    let table_question = crate::netlink::table_question(nfproto);
    match channel.ask(table_question) {
        Ok(_) => {}
        Err(error) if error.errno() == Some(ENOENT) => return Ok(Attempt::Absent),
        Err(error) => return Err(netlink_error(family, "asking for it", error)),
    }
    let mut dump = Dump::default();
    let request = |message: u8| nfnetlink::request(SUBSYS_NFTABLES, message, nfproto, NLM_F_DUMP);
    // The kernel's chain dump takes no table filter: it lists every
    // chain of the family, and the decoder keeps ours.
    let whole = [
        (
            request(MSG_GETCHAIN),
            MSG_NEWCHAIN,
            &mut dump.chains,
            "dumping its chains",
        ),
        (
            request(MSG_GETRULE).string(ATTR_TABLE, TABLE),
            MSG_NEWRULE,
            &mut dump.rules,
            "dumping its rules",
        ),
        (
            request(MSG_GETSET).string(ATTR_TABLE, TABLE),
            MSG_NEWSET,
            &mut dump.sets,
            "dumping its sets",
        ),
    ];
    for (message, answer, out, step) in whole {
        if !dump_step(channel, family, message, answer, out, step)? {
            return Ok(Attempt::Changed);
        }
    }
    for set in decode::set_names(&dump) {
        let message = request(MSG_GETSETELEM)
            .string(ATTR_TABLE, TABLE)
            .string(ATTR_SET, &set);
        let step = format!("dumping the elements of set {set}");
        if !dump_step(
            channel,
            family,
            message,
            MSG_NEWSETELEM,
            &mut dump.elements,
            &step,
        )? {
            return Ok(Attempt::Changed);
        }
    }
    Ok(Attempt::Read(dump))
}

/// Runs one dump (`step`, for errors) and appends the payloads of its
/// `answer` messages to `out`; `false` when a commit came in between: the
/// kernel marked the dump interrupted, or an object it names is gone
/// (`ENOENT`).
fn dump_step(
    channel: &mut Channel,
    family: IpFamily,
    request: kp_netlink::Message,
    answer: u8,
    out: &mut Vec<Vec<u8>>,
    step: &str,
) -> Result<bool, ReadError> {
    match collect(channel, request, answer, out) {
        Ok(complete) => Ok(complete),
        Err(error) if error.errno() == Some(ENOENT) => Ok(false),
        Err(error) => Err(netlink_error(family, step, error)),
    }
}

/// Runs one dump and appends the payloads of its `answer` messages to
/// `out`; `false` when the kernel marked it interrupted by a commit.
fn collect(
    channel: &mut Channel,
    request: kp_netlink::Message,
    answer: u8,
    out: &mut Vec<Vec<u8>>,
) -> Result<bool, kp_netlink::Error> {
    let kind = nfnetlink::message_type(SUBSYS_NFTABLES, answer);
    let mut complete = true;
    channel.dump(request, |reply| {
        if reply.flags & NLM_F_DUMP_INTR != 0 {
            complete = false;
        }
        if reply.kind == kind {
            out.push(reply.payload.to_vec());
        }
    })?;
    Ok(complete)
}

fn generation(channel: &mut Channel, family: IpFamily) -> Result<u32, ReadError> {
    crate::netlink::ask_generation(channel)
        .map_err(|error| netlink_error(family, "asking for the ruleset generation", error))
}

fn netlink_error(family: IpFamily, step: &str, source: kp_netlink::Error) -> ReadError {
    ReadError::Netlink {
        table: table_text(family),
        step: step.to_owned(),
        source,
    }
}

/// `table ip kube-proxy` or `table ip6 kube-proxy`.
fn table_text(family: IpFamily) -> String {
    format!("table {} {}", crate::options::family_keyword(family), TABLE)
}

/// `handle N`, or `without a handle` for a message that had none.
fn handle_text(handle: Option<u64>) -> String {
    match handle {
        Some(handle) => format!("handle {handle}"),
        None => "without a handle".to_owned(),
    }
}

fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

#[cfg(test)]
mod data_tests;
#[cfg(test)]
mod tests;
