//! Dumped nf_tables messages to the typed model: the inverse of the
//! encoder ([`crate::netlink`]), for exactly the shapes it writes.
//!
//! Everything here is pure (bytes in, [`Table`] out), so it is tested by
//! encoding rendered transactions and decoding the messages back, without
//! a kernel. The kernel dumps an expression with a few attributes the
//! encoder leaves out at their defaults (`NFTA_LOOKUP_FLAGS` 0,
//! `NFTA_BITWISE_OP` boolean, `NFTA_NUMGEN_OFFSET` 0, `NFTA_DYNSET_TIMEOUT`
//! 0, `NFTA_NAT_REG_*_MAX` equal to the minimum) and numbers registers its
//! own way (`NFT_REG32_00` comes back as `NFT_REG_1`); both are accepted.
//! So is the one shape `nft -f` writes differently for the same text (the
//! [`crate::NftApplier`]): a byte-aligned prefix loads and compares only
//! its own bytes. Any other attribute or shape is an error naming the
//! chain, the rule's handle and the expression.
//!
//! Sets declared with `typeof` (the data layout's) are read by
//! the description nft keeps in their user data, which both the encoder
//! and nft write.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use kp_model::{IpFamily, Protocol};
use kp_netlink::{nfnetlink, read_be_u32, read_be_u64, read_string, Attributes};

mod data;

use data::{declares_typeof, endpoint_of, typeof_key, typeof_spec};

use super::ReadError;
use crate::model::{
    AddrField, Address, ChainType, Expr, Hook, Key, Name, Rule, TypeofSpec, Verdict,
};
use crate::names;
use crate::tracer::{BaseChain, Table};

// NFTA_CHAIN_*, NFTA_HOOK_*
const CHAIN_TABLE: u16 = 1;
const CHAIN_NAME: u16 = 3;
const CHAIN_HOOK: u16 = 4;
const CHAIN_POLICY: u16 = 5;
const CHAIN_TYPE: u16 = 7;
const HOOK_HOOKNUM: u16 = 1;
const HOOK_PRIORITY: u16 = 2;
/// `NF_ACCEPT`, the policy of every base chain of the table.
const POLICY_ACCEPT: u32 = 1;
// NFTA_RULE_*
const RULE_TABLE: u16 = 1;
const RULE_CHAIN: u16 = 2;
const RULE_HANDLE: u16 = 3;
const RULE_EXPRESSIONS: u16 = 4;
const RULE_USERDATA: u16 = 7;
// NFTA_LIST_ELEM, NFTA_EXPR_*
const LIST_ELEM: u16 = 1;
const EXPR_NAME: u16 = 1;
const EXPR_DATA: u16 = 2;
// NFTA_SET_*
const SET_TABLE: u16 = 1;
const SET_NAME: u16 = 2;
const SET_FLAGS: u16 = 3;
const SET_KEY_TYPE: u16 = 4;
const SET_KEY_LEN: u16 = 5;
/// `NFTA_SET_TIMEOUT`: the elements' default timeout, in milliseconds.
const SET_TIMEOUT: u16 = 11;
/// `NFTA_SET_USERDATA`: nft's description of the set (typeof, comment).
const SET_USERDATA: u16 = 13;
const SET_F_ANONYMOUS: u32 = 0x1;
const SET_F_INTERVAL: u32 = 0x4;
const SET_F_MAP: u32 = 0x8;
/// `NFT_SET_EVAL`: rules add elements (`flags dynamic`).
const SET_F_EVAL: u32 = 0x20;
// NFTA_SET_ELEM_LIST_*, NFTA_SET_ELEM_*
const ELEM_LIST_TABLE: u16 = 1;
const ELEM_LIST_SET: u16 = 2;
const ELEM_LIST_ELEMENTS: u16 = 3;
const ELEM_KEY: u16 = 1;
const ELEM_DATA: u16 = 2;
const ELEM_FLAGS: u16 = 3;
const ELEM_F_INTERVAL_END: u32 = 0x1;
// NFTA_DATA_*, NFTA_VERDICT_*
const DATA_VALUE: u16 = 1;
const DATA_VERDICT: u16 = 2;
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;
// nft's data type ids of set keys.
const TYPE_INTEGER: u32 = 4;
const TYPE_IPV4: u32 = 7;
const TYPE_IPV6: u32 = 8;
const TYPE_PROTO: u32 = 12;
const TYPE_SERVICE: u32 = 13;

/// Registers in the kernel's own numbering (32-bit slots): `NFT_REG_1` and
/// `NFT_REG32_00` are both slot 4, `NFT_REG_2` slot 8.
const SLOT_VERDICT: u32 = 0;
const SLOT_1: u32 = 4;
const SLOT_2: u32 = 8;

/// `NFT_CMP_EQ`, `NFT_CMP_NEQ`.
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
/// `NFT_PAYLOAD_NETWORK_HEADER`, `NFT_PAYLOAD_TRANSPORT_HEADER`.
const BASE_NETWORK: u32 = 1;
const BASE_TRANSPORT: u32 = 2;
/// `NFT_CT_STATE`.
const CT_STATE: u32 = 0;
/// `NFT_META_MARK`, `NFT_META_IIFNAME`, `NFT_META_L4PROTO`.
const META_MARK: u32 = 3;
const META_IIFNAME: u32 = 6;
const META_L4PROTO: u32 = 16;

/// The payloads (nfgenmsg and attributes) of the messages that describe
/// one table: what `NFT_MSG_GETCHAIN`, `GETRULE`, `GETSET` and
/// `GETSETELEM` dumps answer. Messages of other tables are skipped.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    /// `NFT_MSG_NEWCHAIN` payloads.
    pub chains: Vec<Vec<u8>>,
    /// `NFT_MSG_NEWRULE` payloads, in each chain's order.
    pub rules: Vec<Vec<u8>>,
    /// `NFT_MSG_NEWSET` payloads, anonymous sets among them.
    pub sets: Vec<Vec<u8>>,
    /// `NFT_MSG_NEWSETELEM` payloads.
    pub elements: Vec<Vec<u8>>,
}

/// A set as its `NEWSET` message declares it.
#[derive(Debug, Clone)]
struct SetInfo {
    anonymous: bool,
    interval: bool,
    map: bool,
    dynamic: bool,
    /// `timeout Ns`, in seconds.
    timeout_secs: Option<u64>,
    /// The data type ids of its key's fields, first field first.
    fields: Vec<u32>,
    key_len: u32,
    /// A set declared with `typeof`, as its user data describes it.
    typeof_spec: Option<TypeofSpec>,
}

/// One expression of a rule: its name and attributes.
#[derive(Debug, Clone)]
struct Raw<'a> {
    name: String,
    attrs: BTreeMap<u16, &'a [u8]>,
}

/// Where an expression is, for errors.
struct Place<'a> {
    table: &'a str,
    chain: &'a str,
    handle: Option<u64>,
}

/// What rules need to know of the table's sets: the ranges of each
/// anonymous interval set.
type SetsByName<'a> = &'a BTreeMap<String, Vec<(u128, u128)>>;

/// Decodes the rules of one table.
struct RuleDecoder<'a> {
    family: IpFamily,
    place: Place<'a>,
    raws: Vec<Raw<'a>>,
    at: usize,
    /// Anonymous interval sets by name: their ranges.
    anonymous: &'a BTreeMap<String, Vec<(u128, u128)>>,
}

/// Decodes `dump` (of table `kube-proxy` of `family`) into the tracer's
/// model of the table.
pub fn decode(family: IpFamily, dump: &Dump) -> Result<Table, ReadError> {
    let table_text = super::table_text(family);
    let mut table = Table::new();
    let object_error = |object: String, reason: String| ReadError::Object {
        table: table_text.clone(),
        object,
        reason,
    };

    let mut sets: BTreeMap<String, SetInfo> = BTreeMap::new();
    for payload in &dump.sets {
        let attrs = attributes(payload);
        if !ours(&attrs, SET_TABLE) {
            continue;
        }
        let name = string(&attrs, SET_NAME)
            .ok_or_else(|| object_error("a set".to_owned(), "it has no name".to_owned()))?;
        let info = set_info(family, &name, &attrs)
            .map_err(|reason| object_error(format!("set {name}"), reason.to_owned()))?;
        if let Some(spec) = &info.typeof_spec {
            if spec.data.is_empty() {
                table.maps.entry(name.clone()).or_default();
            } else {
                table.targets.entry(name.clone()).or_default();
            }
            table.typeof_sets.insert(name.clone(), spec.clone());
        }
        if !info.anonymous {
            table.sets.insert(name.clone());
            if info.typeof_spec.is_none() {
                table.maps.entry(name.clone()).or_default();
            }
            if info.dynamic {
                table.dynamic_sets.insert(name.clone());
            }
            if let Some(timeout) = info.timeout_secs {
                table.timeouts_secs.insert(name.clone(), timeout);
            }
        }
        sets.insert(name, info);
    }

    let mut anonymous: BTreeMap<String, Vec<(u128, bool)>> = BTreeMap::new();
    for payload in &dump.elements {
        let attrs = attributes(payload);
        if !ours(&attrs, ELEM_LIST_TABLE) {
            continue;
        }
        let name = string(&attrs, ELEM_LIST_SET).ok_or_else(|| {
            object_error("an element list".to_owned(), "it names no set".to_owned())
        })?;
        let info = sets.get(&name).ok_or_else(|| {
            object_error(
                format!("elements of set {name}"),
                "the set was not listed".to_owned(),
            )
        })?;
        let Some(list) = attrs.get(&ELEM_LIST_ELEMENTS) else {
            continue;
        };
        for (kind, element) in Attributes::new(list) {
            if kind != LIST_ELEM {
                continue;
            }
            let element: BTreeMap<u16, &[u8]> = Attributes::new(element).collect();
            let key = element
                .get(&ELEM_KEY)
                .and_then(|data| data_value(data))
                .ok_or_else(|| {
                    object_error(
                        format!("an element of set {name}"),
                        "it has no key".to_owned(),
                    )
                })?;
            if info.anonymous {
                let value = key_number(family, key).ok_or_else(|| {
                    object_error(
                        format!("an element of anonymous set {name}"),
                        format!("its key is {} bytes, not an address", key.len()),
                    )
                })?;
                let flags = element
                    .get(&ELEM_FLAGS)
                    .and_then(|v| read_be_u32(v))
                    .unwrap_or(0);
                anonymous
                    .entry(name.clone())
                    .or_default()
                    .push((value, flags & ELEM_F_INTERVAL_END != 0));
                continue;
            }
            if let Some(spec) = &info.typeof_spec {
                let key = typeof_key(family, &spec.key, key).ok_or_else(|| {
                    object_error(
                        format!("an element of set {name}"),
                        format!("its key {key:02x?} does not fit the set's typeof"),
                    )
                })?;
                if spec.data.is_empty() {
                    table
                        .maps
                        .entry(name.clone())
                        .or_default()
                        .insert(key.to_string(), None);
                    continue;
                }
                let target = element
                    .get(&ELEM_DATA)
                    .and_then(|data| data_value(data))
                    .and_then(|data| endpoint_of(family, data))
                    .ok_or_else(|| {
                        object_error(
                            format!("element {key} of map {name}"),
                            "its data is not an address and port".to_owned(),
                        )
                    })?;
                table
                    .targets
                    .entry(name.clone())
                    .or_default()
                    .insert(key.to_string(), target);
                continue;
            }
            let key = decode_key(info, key).ok_or_else(|| {
                object_error(
                    format!("an element of set {name}"),
                    format!("its key {key:02x?} does not fit the set's key type"),
                )
            })?;
            let verdict = match element.get(&ELEM_DATA) {
                Some(data) if info.map => Some(verdict_of(data).map_err(|reason| {
                    object_error(format!("element {key} of map {name}"), reason)
                })?),
                None if !info.map => None,
                _ => {
                    return Err(object_error(
                        format!("element {key} of set {name}"),
                        "its data does not match the set's kind (map or set)".to_owned(),
                    ))
                }
            };
            table
                .maps
                .entry(name.clone())
                .or_default()
                .insert(key.to_string(), verdict);
        }
    }
    let last_address = match family {
        IpFamily::V4 => u128::from(u32::MAX),
        IpFamily::V6 => u128::MAX,
    };
    let anonymous: BTreeMap<String, Vec<(u128, u128)>> = anonymous
        .into_iter()
        .map(|(name, points)| (name, intervals(points, last_address)))
        .collect();

    for payload in &dump.chains {
        let attrs = attributes(payload);
        if !ours(&attrs, CHAIN_TABLE) {
            continue;
        }
        let name = string(&attrs, CHAIN_NAME)
            .ok_or_else(|| object_error("a chain".to_owned(), "it has no name".to_owned()))?;
        if let Some(hook) = attrs.get(&CHAIN_HOOK) {
            let base = base_chain(&attrs, hook)
                .map_err(|reason| object_error(format!("base chain {name}"), reason))?;
            table.base_chains.insert(name.clone(), base);
        }
        table.chains.entry(name).or_default();
    }

    for payload in &dump.rules {
        let attrs = attributes(payload);
        if !ours(&attrs, RULE_TABLE) {
            continue;
        }
        let chain = string(&attrs, RULE_CHAIN)
            .ok_or_else(|| object_error("a rule".to_owned(), "it names no chain".to_owned()))?;
        let handle = attrs.get(&RULE_HANDLE).and_then(|v| read_be_u64(v));
        let rule = decode_rule(family, &table_text, &chain, handle, &attrs, &anonymous)?;
        table
            .chains
            .get_mut(&chain)
            .ok_or_else(|| {
                object_error(
                    format!("rule {} in chain {chain}", super::handle_text(handle)),
                    "its chain was not listed".to_owned(),
                )
            })?
            .push(rule);
    }
    Ok(table)
}

/// Where a chain with `NFTA_CHAIN_HOOK` hooks in; a policy other than
/// accept is an error (the table never sets one, and the model has none).
fn base_chain(attrs: &BTreeMap<u16, &[u8]>, hook: &[u8]) -> Result<BaseChain, String> {
    let hook_attrs: BTreeMap<u16, &[u8]> = Attributes::new(hook).collect();
    let number = hook_attrs
        .get(&HOOK_HOOKNUM)
        .and_then(|v| read_be_u32(v))
        .ok_or("its hook has no number")?;
    let hook = match number {
        0 => Hook::Prerouting,
        1 => Hook::Input,
        2 => Hook::Forward,
        3 => Hook::Output,
        4 => Hook::Postrouting,
        other => return Err(format!("hook number {other} is not one of the ip hooks")),
    };
    let priority = hook_attrs
        .get(&HOOK_PRIORITY)
        .and_then(|v| <[u8; 4]>::try_from(*v).ok())
        .map(i32::from_be_bytes)
        .ok_or("its hook has no priority")?;
    let chain_type = match attrs.get(&CHAIN_TYPE).map(|v| read_string(v)).as_deref() {
        Some("filter") => ChainType::Filter,
        Some("nat") => ChainType::Nat,
        other => return Err(format!("chain type {other:?} is not filter or nat")),
    };
    match attrs.get(&CHAIN_POLICY).and_then(|v| read_be_u32(v)) {
        None | Some(POLICY_ACCEPT) => {}
        Some(policy) => {
            return Err(format!(
                "its policy is {policy} (0 is drop), not accept, which this table always uses"
            ))
        }
    }
    Ok(BaseChain {
        chain_type,
        hook,
        priority,
    })
}

/// The names of the sets (anonymous ones among them) in `dump`'s set
/// messages of our table, whose elements are dumped next.
pub(super) fn set_names(dump: &Dump) -> Vec<String> {
    dump.sets
        .iter()
        .map(|payload| attributes(payload))
        .filter(|attrs| ours(attrs, SET_TABLE))
        .filter_map(|attrs| string(&attrs, SET_NAME))
        .collect()
}

/// The name as the model holds it: one of the table's fixed names, or a
/// Service's.
pub fn model_name(name: &str) -> Name {
    let fixed = names::FIXED_NAMES
        .iter()
        .copied()
        .chain(names::data_layout_fixed_names())
        .find(|fixed| *fixed == name);
    match fixed {
        Some(fixed) => Name::Fixed(fixed),
        None => Name::Shared(Arc::from(name)),
    }
}

/// The prefixes that cover `start..=end` exactly, smallest address first
/// (`width` is 32 or 128 bits; an `end` past the last address of the width
/// stops there).
pub(super) fn prefixes(start: u128, end: u128, width: u8) -> Vec<IpNet> {
    let last_address = if width >= 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    let end = end.min(last_address);
    let mut out = Vec::new();
    if start > end {
        return out;
    }
    let mut at = start;
    loop {
        // The largest block aligned at `at` that stays within `end`.
        let mut bits: u32 = if at == 0 {
            u32::from(width)
        } else {
            at.trailing_zeros().min(u32::from(width))
        };
        while bits > 0 && block_end(at, bits).is_none_or(|last| last > end) {
            bits -= 1;
        }
        let prefix_len = u8::try_from(u32::from(width) - bits).unwrap_or(width);
        out.push(net_of(at, prefix_len, width));
        match block_end(at, bits) {
            Some(last) if last < end => at = last + 1,
            _ => break,
        }
    }
    out
}

fn block_end(at: u128, bits: u32) -> Option<u128> {
    if bits >= 128 {
        return (at == 0).then_some(u128::MAX);
    }
    at.checked_add((1u128 << bits) - 1)
}

fn net_of(at: u128, prefix_len: u8, width: u8) -> IpNet {
    if width == 32 {
        // `at` came from an IPv4 address: it fits.
        let ip = Ipv4Addr::from(u32::try_from(at).unwrap_or(u32::MAX));
        IpNet::V4(ipnet::Ipv4Net::new(ip, prefix_len).unwrap_or_default())
    } else {
        IpNet::V6(ipnet::Ipv6Net::new(Ipv6Addr::from(at), prefix_len).unwrap_or_default())
    }
}

/// A host for a full-length prefix, the prefix otherwise.
pub(super) fn address_of(net: IpNet) -> Address {
    if net.prefix_len() == net.max_prefix_len() {
        Address::Host(net.addr())
    } else {
        Address::Prefix(net.trunc())
    }
}

/// Ranges from the start and end points of an interval set: a start
/// opens a range, an end point (one past the range's last address) closes
/// it; a range still open at the end runs to `last_address` (the encoder
/// writes no end point past the last address).
fn intervals(mut points: Vec<(u128, bool)>, last_address: u128) -> Vec<(u128, u128)> {
    // At equal keys an end comes first: it closes the range before.
    points.sort_by_key(|(value, end)| (*value, !*end));
    let mut out = Vec::new();
    let mut open: Option<u128> = None;
    for (value, end) in points {
        match (end, open) {
            (true, Some(start)) => {
                out.push((start, value.saturating_sub(1)));
                open = None;
            }
            // nft writes an end at 0 before a first range that starts
            // later; it closes nothing.
            (true, None) => {}
            (false, None) => open = Some(value),
            (false, Some(_)) => {}
        }
    }
    if let Some(start) = open {
        out.push((start, last_address));
    }
    out
}

fn attributes(payload: &[u8]) -> BTreeMap<u16, &[u8]> {
    nfnetlink::split_payload(payload)
        .map(|(_, attrs)| Attributes::new(attrs).collect())
        .unwrap_or_default()
}

/// Whether the message's table attribute names our table.
fn ours(attrs: &BTreeMap<u16, &[u8]>, table_attr: u16) -> bool {
    attrs
        .get(&table_attr)
        .is_some_and(|name| read_string(name) == names::TABLE)
}

fn string(attrs: &BTreeMap<u16, &[u8]>, kind: u16) -> Option<String> {
    attrs.get(&kind).map(|v| read_string(v))
}

fn set_info(
    family: IpFamily,
    name: &str,
    attrs: &BTreeMap<u16, &[u8]>,
) -> Result<SetInfo, &'static str> {
    let flags = attrs
        .get(&SET_FLAGS)
        .and_then(|v| read_be_u32(v))
        .unwrap_or(0);
    let type_id = attrs
        .get(&SET_KEY_TYPE)
        .and_then(|v| read_be_u32(v))
        .ok_or("it has no key type")?;
    let key_len = attrs
        .get(&SET_KEY_LEN)
        .and_then(|v| read_be_u32(v))
        .ok_or("it has no key length")?;
    // A concatenated type is one 6-bit type id per field.
    let mut fields = Vec::new();
    let mut rest = type_id;
    while rest != 0 {
        fields.push(rest & 0x3f);
        rest >>= 6;
    }
    fields.reverse();
    let typeof_spec = match attrs.get(&SET_USERDATA) {
        // nft describes its anonymous sets too; their elements are
        // decoded as intervals of addresses, whatever the description.
        Some(udata) if flags & SET_F_ANONYMOUS == 0 && declares_typeof(udata) => {
            Some(typeof_spec(family, name, udata)?)
        }
        _ => None,
    };
    let known: &[u32] = if typeof_spec.is_some() {
        &[TYPE_INTEGER, TYPE_IPV4, TYPE_IPV6, TYPE_PROTO, TYPE_SERVICE]
    } else {
        &[TYPE_IPV4, TYPE_IPV6, TYPE_PROTO, TYPE_SERVICE]
    };
    if fields.iter().any(|f| !known.contains(f)) {
        return Err("its key type is not one this table uses");
    }
    Ok(SetInfo {
        anonymous: flags & SET_F_ANONYMOUS != 0,
        interval: flags & SET_F_INTERVAL != 0,
        map: flags & SET_F_MAP != 0,
        dynamic: flags & SET_F_EVAL != 0,
        timeout_secs: attrs
            .get(&SET_TIMEOUT)
            .and_then(|v| read_be_u64(v))
            .map(|millis| millis / 1000),
        fields,
        key_len,
        typeof_spec,
    })
}

/// `NFTA_DATA_VALUE` inside a data nest.
fn data_value(nest: &[u8]) -> Option<&[u8]> {
    Attributes::new(nest)
        .find(|(kind, _)| *kind == DATA_VALUE)
        .map(|(_, value)| value)
}

/// The address in an anonymous interval set's key.
fn key_number(family: IpFamily, key: &[u8]) -> Option<u128> {
    match family {
        IpFamily::V4 => Some(u128::from(u32::from_be_bytes(key.try_into().ok()?))),
        IpFamily::V6 => Some(u128::from_be_bytes(key.try_into().ok()?)),
    }
}

fn decode_key(info: &SetInfo, key: &[u8]) -> Option<Key> {
    if info.interval || usize::try_from(info.key_len).ok()? != key.len() {
        return None;
    }
    let mut rest = key;
    let mut take = |len: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..len)?, rest.get(len..)?);
        rest = tail;
        Some(head)
    };
    let mut ip = None;
    let mut protocol = None;
    let mut port = None;
    for field in &info.fields {
        match *field {
            TYPE_IPV4 => {
                let octets: [u8; 4] = take(4)?.try_into().ok()?;
                ip = Some(IpAddr::from(octets));
            }
            TYPE_IPV6 => {
                let octets: [u8; 16] = take(16)?.try_into().ok()?;
                ip = Some(IpAddr::from(octets));
            }
            TYPE_PROTO => {
                let bytes = take(4)?;
                protocol = Some(protocol_of(bytes[0])?);
                if bytes[1..] != [0, 0, 0] {
                    return None;
                }
            }
            TYPE_SERVICE => {
                let bytes = take(4)?;
                port = Some(u16::from_be_bytes([bytes[0], bytes[1]]));
                if bytes[2..] != [0, 0] {
                    return None;
                }
            }
            _ => return None,
        }
    }
    if !rest.is_empty() {
        return None;
    }
    match (ip, protocol, port) {
        (Some(ip), None, None) => Some(Key::Addr(ip)),
        (Some(ip), Some(protocol), Some(port)) => Some(Key::AddrProtoPort(ip, protocol, port)),
        (None, Some(protocol), Some(port)) => Some(Key::ProtoPort(protocol, port)),
        _ => None,
    }
}

fn protocol_of(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// A verdict in a data nest (`NFTA_DATA_VERDICT`).
fn verdict_of(nest: &[u8]) -> Result<Verdict, String> {
    let verdict = Attributes::new(nest)
        .find(|(kind, _)| *kind == DATA_VERDICT)
        .map(|(_, value)| value)
        .ok_or("its data is not a verdict")?;
    let attrs: BTreeMap<u16, &[u8]> = Attributes::new(verdict).collect();
    let code = attrs
        .get(&VERDICT_CODE)
        .and_then(|v| <[u8; 4]>::try_from(*v).ok())
        .map(i32::from_be_bytes)
        .ok_or("its verdict has no code")?;
    let chain = || {
        attrs
            .get(&VERDICT_CHAIN)
            .map(|v| model_name(&read_string(v)))
            .ok_or_else(|| "its jump or goto names no chain".to_owned())
    };
    // NF_DROP, NF_ACCEPT, NFT_JUMP, NFT_GOTO, NFT_RETURN as u32.
    match code {
        0 => Ok(Verdict::Drop),
        1 => Ok(Verdict::Accept),
        -3 => Ok(Verdict::Jump(chain()?)),
        -4 => Ok(Verdict::Goto(chain()?)),
        -5 => Ok(Verdict::Return),
        other => Err(format!("verdict code {other} is not one this table uses")),
    }
}

fn decode_rule<'a>(
    family: IpFamily,
    table: &'a str,
    chain: &'a str,
    handle: Option<u64>,
    attrs: &BTreeMap<u16, &'a [u8]>,
    anonymous: SetsByName<'a>,
) -> Result<Rule, ReadError> {
    let place = Place {
        table,
        chain,
        handle,
    };
    let mut raws = Vec::new();
    if let Some(list) = attrs.get(&RULE_EXPRESSIONS) {
        for (kind, expr) in Attributes::new(list) {
            if kind != LIST_ELEM {
                continue;
            }
            let fields: BTreeMap<u16, &[u8]> = Attributes::new(expr).collect();
            let name = fields.get(&EXPR_NAME).map(|v| read_string(v));
            let data = fields.get(&EXPR_DATA).copied().unwrap_or_default();
            let Some(name) = name else {
                return Err(place.error(raws.len(), "?", "an expression without a name"));
            };
            raws.push(Raw {
                name,
                attrs: Attributes::new(data).collect(),
            });
        }
    }
    let mut decoder = RuleDecoder {
        family,
        place,
        raws,
        at: 0,
        anonymous,
    };
    let mut exprs = Vec::new();
    while decoder.at < decoder.raws.len() {
        exprs.push(decoder.next_expr()?);
    }
    let comment = match attrs.get(&RULE_USERDATA) {
        None => None,
        Some(udata) => {
            let text = udata_comment(udata).ok_or_else(|| {
                decoder.place.error(
                    decoder.raws.len(),
                    "comment",
                    "user data that holds no comment",
                )
            })?;
            let known = names::RULE_COMMENTS.iter().find(|known| **known == text);
            Some(*known.ok_or_else(|| {
                decoder.place.error(
                    decoder.raws.len(),
                    "comment",
                    &format!("comment {text:?}, which this table's rules never carry"),
                )
            })?)
        }
    };
    Ok(Rule {
        chain: model_name(chain),
        exprs,
        comment,
    })
}

/// The comment in nftnl user data (type 0, length, NUL-terminated text).
fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while let [kind, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *kind == 0 {
            return Some(read_string(value));
        }
        rest = tail.get(len..)?;
    }
    None
}

/// A host-order `u32` of exactly four bytes.
fn ne_u32(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.try_into().ok()?))
}

/// A register attribute in the kernel's slot numbering.
fn slot(value: &[u8]) -> Option<u32> {
    let reg = read_be_u32(value)?;
    match reg {
        0..=4 => Some(reg * 4),
        8..=23 => Some(reg - 4),
        _ => None,
    }
}

impl Place<'_> {
    fn error(&self, index: usize, kind: &str, reason: &str) -> ReadError {
        ReadError::Rule {
            table: self.table.to_owned(),
            chain: self.chain.to_owned(),
            handle: self.handle,
            index,
            kind: kind.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

impl<'a> Raw<'a> {
    fn get(&self, kind: u16) -> Option<&'a [u8]> {
        self.attrs.get(&kind).copied()
    }

    fn be32(&self, kind: u16) -> Option<u32> {
        self.get(kind).and_then(read_be_u32)
    }

    fn slot(&self, kind: u16) -> Option<u32> {
        self.get(kind).and_then(slot)
    }

    /// The value in nested data attribute `kind`.
    fn data(&self, kind: u16) -> Option<&'a [u8]> {
        self.get(kind).and_then(data_value)
    }

    /// Whether the expression holds only attributes in `allowed`.
    fn only(&self, allowed: &[u16]) -> bool {
        self.attrs.keys().all(|kind| allowed.contains(kind))
    }
}

/// What one expression of the list is, for matching.
enum Shape<'a> {
    /// `payload load LEN @ BASE + OFFSET => SLOT`.
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        slot: u32,
    },
    /// `meta load KEY => SLOT`.
    Meta { key: u32, slot: u32 },
    /// `meta set KEY with SLOT`.
    MetaSet { key: u32, slot: u32 },
    /// `cmp OP SLOT DATA`.
    Cmp { slot: u32, op: u32, data: &'a [u8] },
    /// `bitwise SLOT = (SLOT & MASK) ^ XOR`.
    Bitwise {
        slot: u32,
        mask: &'a [u8],
        xor: &'a [u8],
    },
    /// `lookup SLOT in SET [=> DSLOT] [inverted]`.
    Lookup {
        set: String,
        slot: u32,
        dslot: Option<u32>,
        invert: bool,
    },
    /// `immediate DATA => SLOT`.
    Value { slot: u32, data: &'a [u8] },
    /// `immediate VERDICT`.
    Verdict(Verdict),
    /// Anything else: matched by name in place.
    Other,
}

impl RuleDecoder<'_> {
    fn error_at(&self, index: usize, reason: &str) -> ReadError {
        let kind = self
            .raws
            .get(index)
            .map_or("end of rule", |raw| raw.name.as_str());
        self.place.error(index, kind, reason)
    }

    fn addr_len(&self) -> u32 {
        match self.family {
            IpFamily::V4 => 4,
            IpFamily::V6 => 16,
        }
    }

    fn addr_field(&self, offset: u32) -> Option<AddrField> {
        match (self.family, offset) {
            (IpFamily::V4, 12) | (IpFamily::V6, 8) => Some(AddrField::Source),
            (IpFamily::V4, 16) | (IpFamily::V6, 24) => Some(AddrField::Destination),
            _ => None,
        }
    }

    /// The shape of expression `index`, checking that it holds no
    /// attribute the encoder does not write (beyond the kernel's defaults).
    fn shape(&self, index: usize) -> Result<Shape<'_>, ReadError> {
        let Some(raw) = self.raws.get(index) else {
            return Err(self.error_at(index, "the rule ends inside a match"));
        };
        let bad = |reason: &str| self.error_at(index, reason);
        let shape = match raw.name.as_str() {
            "payload" => {
                if !raw.only(&[1, 2, 3, 4]) {
                    return Err(bad("a payload expression with attributes beyond a load"));
                }
                Shape::Payload {
                    base: raw.be32(2).ok_or_else(|| bad("no base"))?,
                    offset: raw.be32(3).ok_or_else(|| bad("no offset"))?,
                    len: raw.be32(4).ok_or_else(|| bad("no length"))?,
                    slot: raw.slot(1).ok_or_else(|| bad("no destination register"))?,
                }
            }
            "meta" => {
                if !raw.only(&[1, 2, 3]) {
                    return Err(bad("a meta expression with unknown attributes"));
                }
                let key = raw.be32(2).ok_or_else(|| bad("no key"))?;
                match (raw.slot(1), raw.slot(3)) {
                    (Some(slot), None) => Shape::Meta { key, slot },
                    (None, Some(slot)) => Shape::MetaSet { key, slot },
                    _ => return Err(bad("neither a load nor a set")),
                }
            }
            "cmp" => {
                if !raw.only(&[1, 2, 3]) {
                    return Err(bad("a cmp expression with unknown attributes"));
                }
                Shape::Cmp {
                    slot: raw.slot(1).ok_or_else(|| bad("no source register"))?,
                    op: raw.be32(2).ok_or_else(|| bad("no operator"))?,
                    data: raw.data(3).ok_or_else(|| bad("no data"))?,
                }
            }
            "bitwise" => {
                if !raw.only(&[1, 2, 3, 4, 5, 6]) || raw.be32(6).is_some_and(|op| op != 0) {
                    return Err(bad("a bitwise expression other than mask-and-xor"));
                }
                let (sreg, dreg) = (raw.slot(1), raw.slot(2));
                let (Some(slot), true) = (sreg, sreg == dreg) else {
                    return Err(bad("a bitwise expression between two registers"));
                };
                let mask = raw.data(4).ok_or_else(|| bad("no mask"))?;
                let xor = raw.data(5).ok_or_else(|| bad("no xor"))?;
                let len = raw.be32(3).ok_or_else(|| bad("no length"))?;
                if usize::try_from(len).ok() != Some(mask.len()) || mask.len() != xor.len() {
                    return Err(bad("mask, xor and length differ in size"));
                }
                Shape::Bitwise { slot, mask, xor }
            }
            "lookup" => {
                if !raw.only(&[1, 2, 3, 4, 5]) {
                    return Err(bad("a lookup expression with unknown attributes"));
                }
                let flags = raw.be32(5).unwrap_or(0);
                if flags > 1 {
                    return Err(bad("lookup flags other than NFT_LOOKUP_F_INV"));
                }
                Shape::Lookup {
                    set: raw
                        .get(1)
                        .map(read_string)
                        .ok_or_else(|| bad("no set name"))?,
                    slot: raw.slot(2).ok_or_else(|| bad("no source register"))?,
                    dslot: raw.slot(3),
                    invert: flags == 1,
                }
            }
            "immediate" => {
                if !raw.only(&[1, 2]) {
                    return Err(bad("an immediate expression with unknown attributes"));
                }
                let slot = raw.slot(1).ok_or_else(|| bad("no destination register"))?;
                let data = raw.get(2).ok_or_else(|| bad("no data"))?;
                if slot == SLOT_VERDICT {
                    Shape::Verdict(verdict_of(data).map_err(|reason| bad(&reason))?)
                } else {
                    Shape::Value {
                        slot,
                        data: data_value(data).ok_or_else(|| bad("no value"))?,
                    }
                }
            }
            _ => Shape::Other,
        };
        Ok(shape)
    }

    /// Decodes the expressions from `self.at` that make one model
    /// expression, and moves past them.
    fn next_expr(&mut self) -> Result<Expr, ReadError> {
        let start = self.at;
        let (expr, used) = self.match_at(start)?;
        self.at = start + used;
        Ok(expr)
    }

    fn match_at(&self, i: usize) -> Result<(Expr, usize), ReadError> {
        let raw = &self.raws[i];
        let bad = |reason: &str| Err(self.error_at(i, reason));
        match self.shape(i)? {
            Shape::Verdict(verdict) => Ok((Expr::Verdict(verdict), 1)),
            Shape::Payload {
                base: BASE_NETWORK,
                offset,
                len,
                slot,
            } => self.after_network_payload(i, offset, len, slot),
            Shape::Meta {
                key: META_L4PROTO,
                slot,
            } => self.after_l4proto(i, slot),
            Shape::Meta {
                key: META_IIFNAME,
                slot: SLOT_1,
            } => match self.shape(i + 1)? {
                Shape::Cmp {
                    slot: SLOT_1,
                    op: op @ (CMP_EQ | CMP_NEQ),
                    data,
                } => {
                    let (name, prefix) = match data.iter().position(|b| *b == 0) {
                        Some(end) if data.len() == 16 && data[end..].iter().all(|b| *b == 0) => {
                            (&data[..end], false)
                        }
                        None => (data, true),
                        Some(_) => return bad("an interface name with bytes after its NUL"),
                    };
                    let name = std::str::from_utf8(name)
                        .map_err(|_| self.error_at(i + 1, "an interface name not in UTF-8"))?;
                    Ok((
                        Expr::InputInterface {
                            negate: op == CMP_NEQ,
                            name: Arc::from(name),
                            prefix,
                        },
                        2,
                    ))
                }
                _ => Err(self.error_at(i + 1, "iifname followed by something other than cmp")),
            },
            Shape::Meta {
                key: META_MARK,
                slot: SLOT_1,
            } => self.after_mark(i),
            Shape::Value { .. } => self.dnat_at(i)?.ok_or_else(|| {
                self.error_at(i, "a loaded value other than a dnat's address and port")
            }),
            Shape::Other => self.other(i, raw),
            _ => bad("an expression this table's rules do not start a match with"),
        }
    }

    /// `ct state new`, `fib … type local`, `numgen`, `dnat`, `masquerade`,
    /// `reject`.
    fn other(&self, i: usize, raw: &Raw<'_>) -> Result<(Expr, usize), ReadError> {
        let bad = |reason: &str| Err(self.error_at(i, reason));
        match raw.name.as_str() {
            "ct" => {
                // ct state (key 0) & new (8) != 0
                if !raw.only(&[1, 2])
                    || raw.slot(1) != Some(SLOT_1)
                    || raw.be32(2) != Some(CT_STATE)
                {
                    return bad("a ct expression other than ct state");
                }
                match (self.shape(i + 1)?, self.shape(i + 2)?) {
                    (
                        Shape::Bitwise {
                            slot: SLOT_1,
                            mask,
                            xor,
                        },
                        Shape::Cmp {
                            slot: SLOT_1,
                            op: CMP_NEQ,
                            data,
                        },
                    ) if ne_u32(mask) == Some(8)
                        && ne_u32(xor) == Some(0)
                        && ne_u32(data) == Some(0) =>
                    {
                        Ok((Expr::CtStateNew, 3))
                    }
                    _ => bad("ct state compared with something other than new"),
                }
            }
            "fib" => {
                if !raw.only(&[1, 2, 3]) || raw.be32(2) != Some(3) || raw.slot(1) != Some(SLOT_1) {
                    return bad("a fib expression other than an address type lookup");
                }
                let field = match raw.be32(3) {
                    Some(1) => AddrField::Source,
                    Some(2) => AddrField::Destination,
                    _ => return bad("fib flags other than saddr or daddr"),
                };
                match self.shape(i + 1)? {
                    Shape::Cmp {
                        slot: SLOT_1,
                        op: CMP_EQ,
                        data,
                    } if ne_u32(data) == Some(2) => Ok((Expr::FibLocal(field), 2)),
                    _ => Err(self.error_at(i + 1, "fib compared with something other than local")),
                }
            }
            "numgen" => {
                let random = raw.be32(3) == Some(1);
                let offset = raw.be32(4).unwrap_or(0);
                if !raw.only(&[1, 2, 3, 4]) || !random || offset != 0 {
                    return bad("a numgen expression other than random without offset");
                }
                let modulus = raw.be32(2).ok_or_else(|| self.error_at(i, "no modulus"))?;
                if raw.slot(1) != Some(SLOT_1) {
                    return bad("numgen into another register");
                }
                match self.shape(i + 1)? {
                    Shape::Cmp {
                        slot: SLOT_1,
                        op: CMP_EQ,
                        data,
                    } => {
                        let value = ne_u32(data)
                            .ok_or_else(|| self.error_at(i + 1, "a value of another size"))?;
                        Ok((Expr::NumgenIs { modulus, value }, 2))
                    }
                    _ => Err(self.error_at(i + 1, "numgen followed by something other than cmp")),
                }
            }
            "masq" => {
                if raw.only(&[1]) && raw.be32(1) == Some(0x10) {
                    Ok((Expr::MasqueradeFullyRandom, 1))
                } else {
                    bad("masquerade other than fully-random")
                }
            }
            "reject" => {
                let code: u8 = match self.family {
                    IpFamily::V4 => 3,
                    IpFamily::V6 => 4,
                };
                if raw.only(&[1, 2]) && raw.be32(1) == Some(0) && raw.get(2) == Some(&[code][..]) {
                    Ok((Expr::Reject, 1))
                } else {
                    bad("reject other than with port unreachable")
                }
            }
            _ => bad("an expression this table's rules never hold"),
        }
    }

    /// After `payload load` of the network header: an address match, a
    /// set lookup, a dispatch through a verdict map, an affinity update.
    fn after_network_payload(
        &self,
        i: usize,
        offset: u32,
        len: u32,
        slot: u32,
    ) -> Result<(Expr, usize), ReadError> {
        let bad = |reason: &str| Err(self.error_at(i, reason));
        let Some(field) = self.addr_field(offset) else {
            return bad("a load of a network header field other than an address");
        };
        // `nft -f` loads only the bytes a byte-aligned prefix covers
        // (`ip saddr 10.244.0.0/16` loads two); the encoder loads the
        // whole address.
        let full = len == self.addr_len();
        if len == 0 || len > self.addr_len() || slot != SLOT_1 {
            return bad("an address load of another length or into another register");
        }
        if full && field == AddrField::Source {
            if let Some(pair) = self.addr_pair_at(i) {
                return Ok(pair);
            }
        }
        let next = self.shape(i + 1)?;
        match next {
            Shape::Meta {
                key: META_L4PROTO,
                slot: meta_slot,
            } if full && field == AddrField::Destination && meta_slot == SLOT_1 + len / 4 => {
                Ok((self.dispatch_tail(i + 1, meta_slot, true)?, 4))
            }
            Shape::Cmp {
                slot: SLOT_1,
                op,
                data,
            } if op == CMP_EQ || op == CMP_NEQ => {
                let value = self.address(i + 1, data, None)?;
                Ok((address_is(field, op, value), 2))
            }
            Shape::Bitwise {
                slot: SLOT_1,
                mask,
                xor,
            } if xor.iter().all(|b| *b == 0) => match self.shape(i + 2)? {
                Shape::Cmp {
                    slot: SLOT_1,
                    op,
                    data,
                } if op == CMP_EQ || op == CMP_NEQ => {
                    let value = self.address(i + 2, data, Some(mask))?;
                    Ok((address_is(field, op, value), 3))
                }
                _ => Err(self.error_at(i + 2, "a masked address not compared")),
            },
            Shape::Lookup {
                set,
                slot: SLOT_1,
                dslot: None,
                invert,
            } if full => {
                if !invert {
                    return Ok((
                        Expr::AddrInSet {
                            field,
                            set: model_name(&set),
                        },
                        2,
                    ));
                }
                let ranges = self.anonymous.get(&set).ok_or_else(|| {
                    self.error_at(i + 1, &format!("a negated lookup in set {set}, which is not an anonymous interval set of this table"))
                })?;
                let width = if self.family == IpFamily::V4 { 32 } else { 128 };
                let values = ranges
                    .iter()
                    .flat_map(|(start, end)| prefixes(*start, *end, width))
                    .map(address_of)
                    .collect();
                Ok((Expr::AddrNotIn { field, values }, 2))
            }
            Shape::Other
                if full
                    && field == AddrField::Source
                    && self.raws.get(i + 1).is_some_and(|r| r.name == "dynset") =>
            {
                let raw = &self.raws[i + 1];
                let timeout = raw.get(6).and_then(read_be_u64).unwrap_or(0);
                // NFTA_DYNSET_FLAGS is 9 (8 is padding).
                let flags = raw.be32(9).unwrap_or(0);
                if !raw.only(&[1, 2, 3, 4, 6, 8, 9])
                    || raw.be32(3) != Some(1)
                    || raw.slot(4) != Some(SLOT_1)
                    || timeout != 0
                    || flags != 0
                {
                    return Err(self.error_at(
                        i + 1,
                        &format!(
                            "a dynset other than update of the source address (attributes {:?})",
                            raw.attrs
                        ),
                    ));
                }
                let set = raw
                    .get(1)
                    .map(read_string)
                    .ok_or_else(|| self.error_at(i + 1, "no set name"))?;
                Ok((Expr::UpdateSourceSet(model_name(&set)), 2))
            }
            _ => Err(self.error_at(
                i + 1,
                "an address load followed by an expression that does not use it",
            )),
        }
    }

    /// `meta l4proto => S; payload th dport => S+1; lookup S… [vmap] @SET`
    /// from `i`: the dispatch through a verdict map, or the Service entry's
    /// lookup in a set.
    fn dispatch_tail(&self, i: usize, meta_slot: u32, with_addr: bool) -> Result<Expr, ReadError> {
        match (self.shape(i + 1)?, self.shape(i + 2)?) {
            (
                Shape::Payload {
                    base: BASE_TRANSPORT,
                    offset: 2,
                    len: 2,
                    slot,
                },
                Shape::Lookup {
                    set,
                    slot: SLOT_1,
                    dslot,
                    invert: false,
                },
            ) if slot == meta_slot + 1 => match dslot {
                Some(SLOT_VERDICT) => Ok(Expr::DispatchVmap {
                    with_addr,
                    map: model_name(&set),
                }),
                None => Ok(Expr::EntryInSet {
                    with_addr,
                    set: model_name(&set),
                }),
                Some(_) => Err(self.error_at(i + 2, "a protocol and port lookup into a register")),
            },
            _ => Err(self.error_at(
                i + 1,
                "a dispatch other than protocol and port through a verdict map or set",
            )),
        }
    }

    /// After `meta l4proto`: a dispatch without address, `PROTO dport N`,
    /// `meta l4proto PROTO`, or `meta l4proto PROTO dnat to A:P` begins.
    fn after_l4proto(&self, i: usize, slot: u32) -> Result<(Expr, usize), ReadError> {
        if slot != SLOT_1 {
            return Err(self.error_at(i, "meta l4proto into another register"));
        }
        match self.shape(i + 1)? {
            Shape::Payload {
                base: BASE_TRANSPORT,
                ..
            } => Ok((self.dispatch_tail(i, slot, false)?, 3)),
            Shape::Cmp {
                slot: SLOT_1,
                op: CMP_EQ,
                data: [number],
            } => {
                let protocol = protocol_of(*number)
                    .ok_or_else(|| self.error_at(i + 1, "a protocol this table never matches"))?;
                let port_follows = self.raws.get(i + 2).is_some_and(|r| r.name == "payload");
                if !port_follows {
                    return Ok((Expr::L4Proto(protocol), 2));
                }
                let numgen_at =
                    |index: usize| self.raws.get(index).is_some_and(|r| r.name == "numgen");
                if let Shape::Payload {
                    base: BASE_NETWORK, ..
                } = self.shape(i + 2)?
                {
                    if numgen_at(i + 4) {
                        return self.draw_at(i, protocol, true);
                    }
                    return Err(self.error_at(
                        i + 2,
                        "a network load after a protocol match other than a draw",
                    ));
                }
                if numgen_at(i + 3) {
                    return self.draw_at(i, protocol, false);
                }
                match (self.shape(i + 2)?, self.shape(i + 3)?) {
                    (
                        Shape::Payload {
                            base: BASE_TRANSPORT,
                            offset: 2,
                            len: 2,
                            slot: SLOT_1,
                        },
                        Shape::Cmp {
                            slot: SLOT_1,
                            op,
                            data: [high, low],
                        },
                    ) if op == CMP_EQ => {
                        let port = u16::from_be_bytes([*high, *low]);
                        Ok((Expr::DestinationPort { protocol, port }, 4))
                    }
                    _ => {
                        Err(self
                            .error_at(i + 2, "a transport load other than the destination port"))
                    }
                }
            }
            _ => Err(self.error_at(i + 1, "meta l4proto not compared with one protocol")),
        }
    }

    /// After `meta mark => reg 1`: `mark set mark or|xor M` or `mark and
    /// M == 0`.
    fn after_mark(&self, i: usize) -> Result<(Expr, usize), ReadError> {
        let Shape::Bitwise {
            slot: SLOT_1,
            mask,
            xor,
        } = self.shape(i + 1)?
        else {
            return Err(self.error_at(i + 1, "a mark load not followed by bitwise"));
        };
        let (Some(mask), Some(xor)) = (ne_u32(mask), ne_u32(xor)) else {
            return Err(self.error_at(i + 1, "a mark operation of another size"));
        };
        match self.shape(i + 2)? {
            Shape::MetaSet {
                key: META_MARK,
                slot: SLOT_1,
            } => {
                if mask == !xor {
                    Ok((Expr::MarkSetOr(xor), 3))
                } else if mask == u32::MAX {
                    Ok((Expr::MarkSetXor(xor), 3))
                } else {
                    Err(self.error_at(i + 1, "a mark change other than or and xor"))
                }
            }
            Shape::Cmp {
                slot: SLOT_1,
                op: CMP_EQ,
                data,
            } if xor == 0 && ne_u32(data) == Some(0) => Ok((Expr::MarkLacks(mask), 3)),
            _ => Err(self.error_at(i + 2, "a masked mark neither set nor compared with 0")),
        }
    }

    /// The address or prefix a comparison (after `mask`) matches.
    /// The address or prefix a comparison with `data` (after `mask`, of
    /// the same length) matches. A value shorter than an address is the
    /// leading bytes of a prefix that covers them (what `nft -f` loads).
    fn address(
        &self,
        index: usize,
        data: &[u8],
        mask: Option<&[u8]>,
    ) -> Result<Address, ReadError> {
        let bad = |reason: &str| self.error_at(index, reason);
        let full = usize::try_from(self.addr_len()).unwrap_or(16);
        if data.is_empty() || data.len() > full || mask.is_some_and(|m| m.len() != data.len()) {
            return Err(bad(
                "a comparison with a value of another length than the load",
            ));
        }
        let mut bytes = data.to_vec();
        bytes.resize(full, 0);
        let ip = match self.family {
            IpFamily::V4 => IpAddr::from(<[u8; 4]>::try_from(&bytes[..]).unwrap_or_default()),
            IpFamily::V6 => IpAddr::from(<[u8; 16]>::try_from(&bytes[..]).unwrap_or_default()),
        };
        let Some(mask) = mask else {
            if data.len() == full {
                return Ok(Address::Host(ip));
            }
            let len = u8::try_from(data.len() * 8).unwrap_or(0);
            let net = IpNet::new(ip, len).map_err(|_| bad("a prefix longer than the address"))?;
            return Ok(address_of(net));
        };
        // The mask must be a prefix: ones, then zeros.
        let bits: u32 = mask.iter().map(|b| b.count_ones()).sum();
        let ones = mask
            .iter()
            .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1));
        let contiguous = ones
            .enumerate()
            .all(|(n, bit)| (bit == 1) == (n < usize::try_from(bits).unwrap_or(0)));
        if !contiguous {
            return Err(self.error_at(index - 1, "a mask that is not a prefix"));
        }
        let len = u8::try_from(bits).unwrap_or(0);
        let net = IpNet::new(ip, len).map_err(|_| bad("a prefix longer than the address"))?;
        if net.trunc().addr() != ip {
            return Err(bad("an address with bits outside its mask"));
        }
        Ok(address_of(net))
    }
}

fn address_is(field: AddrField, op: u32, value: Address) -> Expr {
    Expr::AddrIs {
        field,
        negate: op == CMP_NEQ,
        value,
    }
}

impl RuleDecoder<'_> {
    /// `immediate ADDR => reg 1; immediate PORT => reg 2; nat dnat` from
    /// `i`, if the first two are those loads.
    fn dnat_at(&self, i: usize) -> Result<Option<(Expr, usize)>, ReadError> {
        let (
            Shape::Value {
                slot: SLOT_1,
                data: addr,
            },
            Shape::Value {
                slot: SLOT_2,
                data: port,
            },
        ) = (self.shape(i)?, self.shape(i + 1)?)
        else {
            return Ok(None);
        };
        let Some(nat) = self.raws.get(i + 2).filter(|r| r.name == "nat") else {
            return Err(self.error_at(i + 2, "loaded values not used by a nat statement"));
        };
        let family = match self.family {
            IpFamily::V4 => 2,
            IpFamily::V6 => 10,
        };
        let shape_ok = nat.only(&[1, 2, 3, 4, 5, 6, 7])
            && nat.be32(1) == Some(1)
            && nat.be32(2) == Some(family)
            && nat.slot(3) == Some(SLOT_1)
            && nat.slot(4).is_none_or(|s| s == SLOT_1)
            && nat.slot(5) == Some(SLOT_2)
            && nat.slot(6).is_none_or(|s| s == SLOT_2)
            && nat.be32(7) == Some(0x3);
        if !shape_ok {
            return Err(self.error_at(
                i + 2,
                "a nat statement other than dnat to one address and port",
            ));
        }
        let ip = match (self.family, addr.len()) {
            (IpFamily::V4, 4) => IpAddr::from(<[u8; 4]>::try_from(addr).unwrap_or_default()),
            (IpFamily::V6, 16) => IpAddr::from(<[u8; 16]>::try_from(addr).unwrap_or_default()),
            _ => return Err(self.error_at(i, "a dnat address of another length")),
        };
        let [high, low] = port else {
            return Err(self.error_at(i + 1, "a dnat port of another length"));
        };
        Ok(Some((
            Expr::Dnat(SocketAddr::new(ip, u16::from_be_bytes([*high, *low]))),
            3,
        )))
    }
}
