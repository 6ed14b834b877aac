//! Rules: the rule shapes the renderer writes, as nf_tables expressions
//! (what `nft --debug=netlink` shows for the same text).

use std::net::IpAddr;

use ipnet::IpNet;

use super::msg::{Batch, Kind, F_APPEND, F_CREATE};
use super::objects::{
    protocol_number, udata_comment, verdict_data, DATA_VALUE, DATA_VERDICT, ELEMENTS_BYTES_MAX,
    ELEM_DATA, ELEM_FLAGS, ELEM_KEY, ELEM_LIST_ELEMENTS, ELEM_LIST_SET, ELEM_LIST_SET_ID,
    ELEM_LIST_TABLE, LIST_ELEM, SET_DATA_LEN, SET_DATA_TYPE, SET_FLAGS, SET_F_ANONYMOUS,
    SET_F_CONSTANT, SET_F_INTERVAL, SET_F_MAP, SET_ID, SET_KEY_LEN, SET_KEY_TYPE, SET_NAME,
    SET_TABLE, SET_USERDATA,
};
use super::{EncodeError, Encoder};

const RULE_TABLE: u16 = 1;
const RULE_CHAIN: u16 = 2;
const RULE_EXPRESSIONS: u16 = 4;
const RULE_USERDATA: u16 = 7;
const EXPR_NAME: u16 = 1;
const EXPR_DATA: u16 = 2;

/// `NFT_REG_VERDICT`, `NFT_REG_1`, and the 32-bit registers from
/// `NFT_REG32_00`.
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG32_00: u32 = 8;

/// One expression list being written.
struct Rule<'b> {
    batch: &'b mut Batch,
}

impl Encoder {
    /// `add rule F kube-proxy CHAIN EXPRESSIONS… [comment "C"]`.
    pub(super) fn rule(&mut self, batch: &mut Batch, rest: &str) -> Result<(), EncodeError> {
        let (chain, body) = rest.split_once(' ').ok_or(EncodeError::Unsupported)?;
        let (body, comment) = match body.split_once(" comment \"") {
            Some((body, comment)) => (body, Some(comment.trim_end_matches('"'))),
            None => (body, None),
        };
        let words: Vec<&str> = body.split_whitespace().collect();
        let tokens = tokenize(&words);
        // Anonymous sets go first: the rule refers to them by batch id.
        let anonymous = self.anonymous_sets(batch, &tokens)?;
        let seq = batch.begin(Kind::NewRule, self.family, F_CREATE | F_APPEND);
        self.note(seq);
        batch.str(RULE_TABLE, &self.table);
        batch.str(RULE_CHAIN, chain);
        batch.open(RULE_EXPRESSIONS);
        let mut rule = Rule { batch };
        self.expressions(&mut rule, &tokens, &anonymous)?;
        if self
            .refused_chains
            .as_deref()
            .is_some_and(|pattern| chain.contains(pattern))
        {
            // Tests only (`NetlinkApplier::refusing_rules_of`).
            rule.expr("kp-refused-by-test", |_| {});
        }
        rule.batch.close();
        if let Some(comment) = comment {
            rule.batch.attr(RULE_USERDATA, &udata_comment(0, comment)?);
        }
        rule.batch.end()?;
        Ok(())
    }

    /// Declares the anonymous sets of `tokens` (`{ … }` groups other than
    /// `{ ip saddr }`) and returns their batch ids in order.
    fn anonymous_sets(
        &mut self,
        batch: &mut Batch,
        tokens: &[Token<'_>],
    ) -> Result<Vec<u32>, EncodeError> {
        let mut ids = Vec::new();
        for (index, token) in tokens.iter().enumerate() {
            let Token::Group(items) = token else { continue };
            let previous = index.checked_sub(1).map(|i| &tokens[i]);
            let id = self.next_set_id();
            if matches!(previous, Some(Token::Word("vmap"))) {
                self.numgen_map(batch, id, items)?;
            } else if matches!(previous, Some(Token::Word("!="))) && items.len() > 1 {
                self.interval_set(batch, id, items)?;
            } else {
                continue;
            }
            ids.push(id);
        }
        Ok(ids)
    }

    fn numgen_map(
        &mut self,
        batch: &mut Batch,
        id: u32,
        items: &[&str],
    ) -> Result<(), EncodeError> {
        // An integer key in host byte order: what numgen writes.
        self.anonymous_set_header(batch, id, SET_F_MAP, 4, 4, true)?;
        let mut elements = self.anonymous_elements(id);
        for entry in items.join(" ").split(" , ") {
            let (key, verdict) = entry.split_once(" : ").ok_or(EncodeError::Unsupported)?;
            let key: u32 = key.trim().parse().map_err(|_| EncodeError::Unsupported)?;
            elements.next(self, batch)?;
            batch.open(LIST_ELEM);
            batch.open(ELEM_KEY);
            // numgen writes a host-order u32 into its register.
            batch.attr(DATA_VALUE, &key.to_ne_bytes());
            batch.close();
            verdict_data(batch, ELEM_DATA, verdict.trim())?;
            batch.close();
        }
        elements.finish(batch)
    }

    fn interval_set(
        &mut self,
        batch: &mut Batch,
        id: u32,
        items: &[&str],
    ) -> Result<(), EncodeError> {
        let mut ranges: Vec<(u128, u128, bool)> = Vec::new();
        for item in items.join(" ").split(',') {
            let net: IpNet = match item.trim() {
                text if text.contains('/') => text.parse().map_err(|_| EncodeError::Unsupported)?,
                text => IpNet::from(
                    text.parse::<IpAddr>()
                        .map_err(|_| EncodeError::Unsupported)?,
                ),
            };
            let v4 = matches!(net, IpNet::V4(_));
            let (start, end) = match net {
                IpNet::V4(n) => (
                    u128::from(u32::from(n.network())),
                    u128::from(u32::from(n.broadcast())),
                ),
                IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
            };
            ranges.push((start, end, v4));
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u128, u128, bool)> = Vec::new();
        for range in ranges {
            match merged.last_mut() {
                Some(last) if range.0 <= last.1.saturating_add(1) => last.1 = last.1.max(range.1),
                _ => merged.push(range),
            }
        }
        let v4 = self.family == 2;
        if merged.iter().any(|(_, _, family_v4)| *family_v4 != v4) {
            // An address of the other family: nft refuses it too.
            return Err(EncodeError::Unsupported);
        }
        let (type_id, len) = if v4 { (7, 4) } else { (8, 16) };
        self.anonymous_set_header(batch, id, SET_F_INTERVAL, type_id, len, false)?;
        let mut elements = self.anonymous_elements(id);
        let bytes = |value: u128| -> Result<Vec<u8>, EncodeError> {
            if v4 {
                let value = u32::try_from(value).map_err(|_| EncodeError::Unsupported)?;
                Ok(value.to_be_bytes().to_vec())
            } else {
                Ok(value.to_be_bytes().to_vec())
            }
        };
        let max = if v4 { u128::from(u32::MAX) } else { u128::MAX };
        for (start, end, _) in merged {
            // A range's start and end stay in one message.
            elements.next(self, batch)?;
            interval_element(batch, &bytes(start)?, false);
            if end < max {
                interval_element(batch, &bytes(end + 1)?, true);
            }
        }
        elements.finish(batch)
    }

    fn anonymous_set_header(
        &mut self,
        batch: &mut Batch,
        id: u32,
        flags: u32,
        key_type: u32,
        key_len: u32,
        verdicts: bool,
    ) -> Result<(), EncodeError> {
        let seq = batch.begin(Kind::NewSet, self.family, F_CREATE);
        self.note(seq);
        batch.str(SET_TABLE, &self.table);
        batch.str(SET_NAME, &self.anonymous_name(id));
        batch.u32(SET_FLAGS, flags | SET_F_ANONYMOUS | SET_F_CONSTANT);
        batch.u32(SET_KEY_TYPE, key_type);
        batch.u32(SET_KEY_LEN, key_len);
        if verdicts {
            batch.u32(SET_DATA_TYPE, DATA_VERDICT);
            batch.u32(SET_DATA_LEN, 0);
        }
        batch.u32(SET_ID, id);
        if key_type == 4 {
            // NFTNL_UDATA_SET_KEYBYTEORDER = BYTEORDER_HOST_ENDIAN, so that
            // `nft list` prints the keys as numbers.
            let mut udata = vec![0u8, 4];
            udata.extend_from_slice(&1u32.to_ne_bytes());
            batch.attr(SET_USERDATA, &udata);
        }
        batch.end()?;
        Ok(())
    }

    /// The element messages of anonymous set `id`, each opened when an
    /// element needs it.
    fn anonymous_elements(&self, id: u32) -> AnonymousElements {
        AnonymousElements {
            name: self.anonymous_name(id),
            id,
            open: false,
        }
    }

    fn expressions(
        &self,
        rule: &mut Rule<'_>,
        tokens: &[Token<'_>],
        anonymous: &[u32],
    ) -> Result<(), EncodeError> {
        let mut rest = tokens;
        let mut anonymous = anonymous.iter();
        while !rest.is_empty() {
            rest = self.expression(rule, rest, &mut anonymous)?;
        }
        Ok(())
    }

    /// Writes the expressions of the first match or statement of `tokens`;
    /// returns the tokens after it.
    fn expression<'t>(
        &self,
        rule: &mut Rule<'_>,
        tokens: &'t [Token<'t>],
        anonymous: &mut std::slice::Iter<'_, u32>,
    ) -> Result<&'t [Token<'t>], EncodeError> {
        use Token::{Group, Word};
        match tokens {
            [Word("ct"), Word("state"), Word("new"), rest @ ..] => {
                rule.ct_state(REG_1);
                rule.bitwise(REG_1, 4, &8u32.to_ne_bytes());
                rule.cmp(REG_1, 1, &0u32.to_ne_bytes());
                Ok(rest)
            }
            [Word(ipx), Word(field), Word("."), Word("meta"), Word("l4proto"), Word("."), Word("th"), Word("dport"), Word("vmap"), Word(map), rest @ ..]
                if is_ipx(ipx) =>
            {
                let addr_len = self.addr_len();
                rule.payload(REG32_00, 1, self.addr_offset(field)?, addr_len);
                let next = REG32_00 + addr_len / 4;
                rule.meta(next, 16);
                rule.payload(next + 1, 2, 2, 2);
                rule.lookup(
                    map.strip_prefix('@').ok_or(EncodeError::Unsupported)?,
                    None,
                    REG32_00,
                    Some(REG_VERDICT),
                    false,
                );
                Ok(rest)
            }
            [Word("meta"), Word("l4proto"), Word("."), Word("th"), Word("dport"), Word("vmap"), Word(map), rest @ ..] =>
            {
                rule.meta(REG32_00, 16);
                rule.payload(REG32_00 + 1, 2, 2, 2);
                rule.lookup(
                    map.strip_prefix('@').ok_or(EncodeError::Unsupported)?,
                    None,
                    REG32_00,
                    Some(REG_VERDICT),
                    false,
                );
                Ok(rest)
            }
            // One address or range: a plain comparison, as nft writes it.
            [Word(ipx), Word(field), Word("!="), Group([value]), rest @ ..] if is_ipx(ipx) => {
                self.address_match(rule, field, value, true)?;
                Ok(rest)
            }
            [Word(ipx), Word(field), Word("!="), Group(_), rest @ ..] if is_ipx(ipx) => {
                let id = *anonymous.next().ok_or(EncodeError::Unsupported)?;
                rule.payload(REG_1, 1, self.addr_offset(field)?, self.addr_len());
                rule.lookup(&self.anonymous_name(id), Some(id), REG_1, None, true);
                Ok(rest)
            }
            [Word(ipx), Word(field), Word("!="), Word(value), rest @ ..] if is_ipx(ipx) => {
                self.address_match(rule, field, value, true)?;
                Ok(rest)
            }
            [Word(ipx), Word(field), Word(value), rest @ ..] if is_ipx(ipx) => {
                if let Some(set) = value.strip_prefix('@') {
                    rule.payload(REG_1, 1, self.addr_offset(field)?, self.addr_len());
                    rule.lookup(set, None, REG_1, None, false);
                } else {
                    self.address_match(rule, field, value, false)?;
                }
                Ok(rest)
            }
            [Word(proto), Word("dport"), Word(port), rest @ ..]
                if protocol_number(proto).is_some() =>
            {
                let number = protocol_number(proto).ok_or(EncodeError::Unsupported)?;
                let port: u16 = port.parse().map_err(|_| EncodeError::Unsupported)?;
                rule.meta(REG_1, 16);
                rule.cmp(REG_1, 0, &[number]);
                rule.payload(REG_1, 2, 2, 2);
                rule.cmp(REG_1, 0, &port.to_be_bytes());
                Ok(rest)
            }
            [Word("fib"), Word(field), Word("type"), Word("local"), rest @ ..] => {
                let flag = if *field == "saddr" { 1 } else { 2 };
                rule.fib(REG_1, flag);
                // RTN_LOCAL
                rule.cmp(REG_1, 0, &2u32.to_ne_bytes());
                Ok(rest)
            }
            [Word("meta"), Word("l4proto"), Word(proto), rest @ ..] => {
                let number = protocol_number(proto).ok_or(EncodeError::Unsupported)?;
                rule.meta(REG_1, 16);
                rule.cmp(REG_1, 0, &[number]);
                Ok(rest)
            }
            [Word("iifname"), Word("!="), Word(name), rest @ ..] => {
                rule.interface(name, true);
                Ok(rest)
            }
            [Word("iifname"), Word(name), rest @ ..] => {
                rule.interface(name, false);
                Ok(rest)
            }
            _ => self.statement(rule, tokens, anonymous),
        }
    }

    /// Writes the expressions of a statement that changes the packet or
    /// decides its fate; returns the tokens after it.
    fn statement<'t>(
        &self,
        rule: &mut Rule<'_>,
        tokens: &'t [Token<'t>],
        anonymous: &mut std::slice::Iter<'_, u32>,
    ) -> Result<&'t [Token<'t>], EncodeError> {
        use Token::{Group, Word};
        let unsupported = Err(EncodeError::Unsupported);
        match tokens {
            [Word("mark"), Word("set"), Word("mark"), Word(op @ ("or" | "xor")), Word(value), rest @ ..] =>
            {
                let value = parse_hex(value)?;
                rule.meta(REG_1, 3);
                let mask = if *op == "or" { !value } else { u32::MAX };
                rule.bitwise_xor(REG_1, 4, &mask.to_ne_bytes(), &value.to_ne_bytes());
                rule.meta_set(3, REG_1);
                Ok(rest)
            }
            [Word("mark"), Word("and"), Word(value), Word("=="), Word("0"), rest @ ..] => {
                let value = parse_hex(value)?;
                rule.meta(REG_1, 3);
                rule.bitwise(REG_1, 4, &value.to_ne_bytes());
                rule.cmp(REG_1, 0, &0u32.to_ne_bytes());
                Ok(rest)
            }
            [Word("numgen"), Word("random"), Word("mod"), Word(modulus), Word(value), rest @ ..]
                if value.parse::<u32>().is_ok() =>
            {
                let modulus: u32 = modulus.parse().map_err(|_| EncodeError::Unsupported)?;
                let value: u32 = value.parse().map_err(|_| EncodeError::Unsupported)?;
                rule.numgen(REG_1, modulus);
                // numgen writes a host-order u32.
                rule.cmp(REG_1, 0, &value.to_ne_bytes());
                Ok(rest)
            }
            [Word("numgen"), Word("random"), Word("mod"), Word(modulus), Word("vmap"), Group(_), rest @ ..] =>
            {
                let id = *anonymous.next().ok_or(EncodeError::Unsupported)?;
                let modulus: u32 = modulus.parse().map_err(|_| EncodeError::Unsupported)?;
                rule.numgen(REG_1, modulus);
                rule.lookup(
                    &self.anonymous_name(id),
                    Some(id),
                    REG_1,
                    Some(REG_VERDICT),
                    false,
                );
                Ok(rest)
            }
            [Word("update"), Word(set), Group(_), rest @ ..] => {
                rule.payload(REG_1, 1, self.addr_offset("saddr")?, self.addr_len());
                rule.dynset(
                    set.strip_prefix('@').ok_or(EncodeError::Unsupported)?,
                    REG_1,
                );
                Ok(rest)
            }
            [Word("dnat"), Word("to"), Word(target), rest @ ..] => {
                let address: std::net::SocketAddr =
                    target.parse().map_err(|_| EncodeError::Unsupported)?;
                let ip = match address.ip() {
                    IpAddr::V4(ip) => ip.octets().to_vec(),
                    IpAddr::V6(ip) => ip.octets().to_vec(),
                };
                rule.immediate_value(REG_1, &ip);
                rule.immediate_value(2, &address.port().to_be_bytes());
                rule.nat_dnat(self.family, REG_1, 2);
                Ok(rest)
            }
            [Word("masquerade"), Word("fully-random"), rest @ ..] => {
                // NF_NAT_RANGE_PROTO_RANDOM_FULLY
                rule.expr("masq", |b| b.u32(1, 0x10));
                Ok(rest)
            }
            [Word("reject"), rest @ ..] => {
                let code: u8 = if self.family == 2 { 3 } else { 4 };
                rule.expr("reject", |b| {
                    b.u32(1, 0);
                    b.attr(2, &[code]);
                });
                Ok(rest)
            }
            [Word(verb @ ("jump" | "goto")), Word(chain), rest @ ..] => {
                rule.immediate_verdict(&format!("{verb} {chain}"))?;
                Ok(rest)
            }
            [Word(verdict @ ("drop" | "accept" | "return")), rest @ ..] => {
                rule.immediate_verdict(verdict)?;
                Ok(rest)
            }
            _ => unsupported,
        }
    }

    fn address_match(
        &self,
        rule: &mut Rule<'_>,
        field: &str,
        value: &str,
        negate: bool,
    ) -> Result<(), EncodeError> {
        let net: IpNet = if value.contains('/') {
            value.parse().map_err(|_| EncodeError::Unsupported)?
        } else {
            IpNet::from(
                value
                    .parse::<IpAddr>()
                    .map_err(|_| EncodeError::Unsupported)?,
            )
        };
        let len = self.addr_len();
        rule.payload(REG_1, 1, self.addr_offset(field)?, len);
        let (network, mask) = match net {
            IpNet::V4(n) => (n.network().octets().to_vec(), n.netmask().octets().to_vec()),
            IpNet::V6(n) => (n.network().octets().to_vec(), n.netmask().octets().to_vec()),
        };
        if mask.iter().any(|b| *b != 0xff) {
            rule.bitwise(REG_1, len, &mask);
        }
        rule.cmp(REG_1, u32::from(negate), &network);
        Ok(())
    }

    fn addr_len(&self) -> u32 {
        if self.family == 2 {
            4
        } else {
            16
        }
    }

    fn addr_offset(&self, field: &str) -> Result<u32, EncodeError> {
        match (self.family == 2, field) {
            (true, "saddr") => Ok(12),
            (true, "daddr") => Ok(16),
            (false, "saddr") => Ok(8),
            (false, "daddr") => Ok(24),
            _ => Err(EncodeError::Unsupported),
        }
    }
}

impl Rule<'_> {
    fn expr(&mut self, name: &str, attrs: impl FnOnce(&mut Batch)) {
        self.batch.open(LIST_ELEM);
        self.batch.str(EXPR_NAME, name);
        self.batch.open(EXPR_DATA);
        attrs(self.batch);
        self.batch.close();
        self.batch.close();
    }

    fn payload(&mut self, dreg: u32, base: u32, offset: u32, len: u32) {
        self.expr("payload", |b| {
            b.u32(1, dreg);
            b.u32(2, base);
            b.u32(3, offset);
            b.u32(4, len);
        });
    }

    fn meta(&mut self, dreg: u32, key: u32) {
        self.expr("meta", |b| {
            b.u32(2, key);
            b.u32(1, dreg);
        });
    }

    fn meta_set(&mut self, key: u32, sreg: u32) {
        self.expr("meta", |b| {
            b.u32(2, key);
            b.u32(3, sreg);
        });
    }

    fn ct_state(&mut self, dreg: u32) {
        self.expr("ct", |b| {
            b.u32(2, 0);
            b.u32(1, dreg);
        });
    }

    fn cmp(&mut self, sreg: u32, op: u32, data: &[u8]) {
        self.expr("cmp", |b| {
            b.u32(1, sreg);
            b.u32(2, op);
            b.open(3);
            b.attr(DATA_VALUE, data);
            b.close();
        });
    }

    /// `reg &= mask` over `len` bytes (the mask's own length).
    fn bitwise(&mut self, reg: u32, len: u32, mask: &[u8]) {
        self.bitwise_xor(reg, len, mask, &vec![0; mask.len()]);
    }

    /// `reg = (reg & mask) ^ xor` over `len` bytes.
    fn bitwise_xor(&mut self, reg: u32, len: u32, mask: &[u8], xor: &[u8]) {
        self.expr("bitwise", |b| {
            b.u32(1, reg);
            b.u32(2, reg);
            b.u32(3, len);
            b.open(4);
            b.attr(DATA_VALUE, mask);
            b.close();
            b.open(5);
            b.attr(DATA_VALUE, xor);
            b.close();
        });
    }

    fn lookup(&mut self, set: &str, id: Option<u32>, sreg: u32, dreg: Option<u32>, invert: bool) {
        self.expr("lookup", |b| {
            b.str(1, set);
            b.u32(2, sreg);
            if let Some(dreg) = dreg {
                b.u32(3, dreg);
            }
            if let Some(id) = id {
                b.u32(4, id);
            }
            if invert {
                b.u32(5, 1);
            }
        });
    }

    fn fib(&mut self, dreg: u32, flag: u32) {
        self.expr("fib", |b| {
            b.u32(1, dreg);
            // NFT_FIB_RESULT_ADDRTYPE
            b.u32(2, 3);
            b.u32(3, flag);
        });
    }

    fn numgen(&mut self, dreg: u32, modulus: u32) {
        self.expr("numgen", |b| {
            b.u32(1, dreg);
            b.u32(2, modulus);
            b.u32(3, 1);
        });
    }

    fn dynset(&mut self, set: &str, sreg: u32) {
        self.expr("dynset", |b| {
            b.str(1, set);
            // NFT_DYNSET_OP_UPDATE
            b.u32(3, 1);
            b.u32(4, sreg);
        });
    }

    fn immediate_value(&mut self, dreg: u32, value: &[u8]) {
        self.expr("immediate", |b| {
            b.u32(1, dreg);
            b.open(2);
            b.attr(DATA_VALUE, value);
            b.close();
        });
    }

    fn immediate_verdict(&mut self, verdict: &str) -> Result<(), EncodeError> {
        let mut result = Ok(());
        self.expr("immediate", |b| {
            b.u32(1, REG_VERDICT);
            result = verdict_data(b, 2, verdict);
        });
        result
    }

    fn nat_dnat(&mut self, family: u8, addr_reg: u32, port_reg: u32) {
        self.expr("nat", |b| {
            b.u32(1, 1);
            b.u32(2, u32::from(family));
            b.u32(3, addr_reg);
            b.u32(5, port_reg);
            // NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED
            b.u32(7, 0x3);
        });
    }

    fn interface(&mut self, name: &str, negate: bool) {
        // A prefix compares only its own bytes; a whole name includes the
        // NUL padding to IFNAMSIZ.
        let bytes = match name.strip_suffix('*') {
            Some(prefix) => prefix.as_bytes().to_vec(),
            None => {
                let mut padded = name.as_bytes().to_vec();
                padded.resize(16, 0);
                padded
            }
        };
        self.meta(REG_1, 6);
        self.cmp(REG_1, u32::from(negate), &bytes);
    }
}

/// A rule's words, with `{ … }` groups kept whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Word(&'a str),
    Group(&'a [&'a str]),
}

fn tokenize<'a>(words: &'a [&'a str]) -> Vec<Token<'a>> {
    let mut tokens = Vec::new();
    let mut index = 0;
    while index < words.len() {
        if words[index] == "{" {
            let end = words[index..]
                .iter()
                .position(|w| *w == "}")
                .map_or(words.len(), |p| index + p);
            tokens.push(Token::Group(&words[index + 1..end]));
            index = end + 1;
        } else {
            tokens.push(Token::Word(words[index]));
            index += 1;
        }
    }
    tokens
}

/// The `NEWSETELEM` messages filling one anonymous set: as many as its
/// elements need ([`ELEMENTS_BYTES_MAX`] each), all before the rule that
/// binds the set (the kernel takes no element for a bound anonymous set).
struct AnonymousElements {
    name: String,
    id: u32,
    /// A message with an open element list is being written.
    open: bool,
}

impl AnonymousElements {
    /// Makes room for the next element: ends a full message, and starts
    /// one when none is open.
    fn next(&mut self, encoder: &mut Encoder, batch: &mut Batch) -> Result<(), EncodeError> {
        if self.open && batch.nest_len() >= ELEMENTS_BYTES_MAX {
            batch.close();
            batch.end()?;
            self.open = false;
        }
        if !self.open {
            let seq = batch.begin(Kind::NewSetElem, encoder.family, F_CREATE);
            encoder.note(seq);
            batch.str(ELEM_LIST_TABLE, &encoder.table);
            batch.str(ELEM_LIST_SET, &self.name);
            batch.u32(ELEM_LIST_SET_ID, self.id);
            batch.open(ELEM_LIST_ELEMENTS);
            self.open = true;
        }
        Ok(())
    }

    /// Ends the last message.
    fn finish(self, batch: &mut Batch) -> Result<(), EncodeError> {
        if self.open {
            batch.close();
            batch.end()?;
        }
        Ok(())
    }
}

fn interval_element(batch: &mut Batch, key: &[u8], end: bool) {
    batch.open(LIST_ELEM);
    batch.open(ELEM_KEY);
    batch.attr(DATA_VALUE, key);
    batch.close();
    if end {
        // NFT_SET_ELEM_INTERVAL_END
        batch.u32(ELEM_FLAGS, 1);
    }
    batch.close();
}

fn is_ipx(word: &str) -> bool {
    word == "ip" || word == "ip6"
}

fn parse_hex(text: &str) -> Result<u32, EncodeError> {
    let digits = text.strip_prefix("0x").ok_or(EncodeError::Unsupported)?;
    u32::from_str_radix(digits, 16).map_err(|_| EncodeError::Unsupported)
}
