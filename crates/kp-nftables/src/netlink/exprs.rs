//! Rules: the matches and statements of [`crate::model::Expr`] as
//! nf_tables expressions (what `nft --debug=netlink` shows for the same
//! text).

use ipnet::IpNet;
use kp_model::IpFamily;

use kp_netlink::{Message, NLM_F_APPEND, NLM_F_CREATE};

use super::msg::Kind;
use super::objects::{
    protocol_number, udata_comment, verdict_data, ElementList, DATA_VALUE, ELEM_FLAGS, ELEM_KEY,
    LIST_ELEM, SET_FLAGS, SET_F_ANONYMOUS, SET_F_CONSTANT, SET_F_INTERVAL, SET_ID, SET_KEY_LEN,
    SET_KEY_TYPE, SET_NAME, SET_TABLE, TYPE_IPV4, TYPE_IPV6,
};
use super::{EncodeError, Encoder};
use crate::model::{AddrField, Address, Expr, Rule as RuleSpec, Verdict};

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
    message: &'b mut Message,
}

impl Encoder {
    /// `add rule F kube-proxy CHAIN EXPRESSIONS… [comment "C"]`.
    pub(super) fn rule(&mut self, spec: &RuleSpec) -> Result<(), EncodeError> {
        // Anonymous sets go first: the rule refers to them by batch id.
        let mut anonymous = Vec::new();
        for expr in &spec.exprs {
            if let Expr::AddrNotIn { values, .. } = expr {
                if values.len() > 1 {
                    let id = self.next_set_id();
                    self.interval_set(id, values)?;
                    anonymous.push(id);
                }
            }
        }
        let chain = spec.chain.as_str();
        let mut message = self.begin(Kind::NewRule, NLM_F_CREATE | NLM_F_APPEND);
        message.put_string(RULE_TABLE, &self.table);
        message.put_string(RULE_CHAIN, chain);
        message.open_nest(RULE_EXPRESSIONS);
        let mut rule = Rule {
            message: &mut message,
        };
        let mut anonymous = anonymous.into_iter();
        for expr in &spec.exprs {
            self.expression(&mut rule, expr, &mut anonymous)?;
        }
        if self
            .refused_chains
            .as_deref()
            .is_some_and(|pattern| chain.contains(pattern))
        {
            // Tests only (`NetlinkApplier::refusing_rules_of`).
            rule.expr("kp-refused-by-test", |_| {});
        }
        message.close_nest();
        if let Some(comment) = spec.comment {
            message.put_attr(RULE_USERDATA, &udata_comment(0, comment)?);
        }
        self.push(message)
    }

    /// The anonymous interval set of `ip saddr != { A, B, … }`: ranges
    /// merged where they touch, each as a start element and an end
    /// element (`NFT_SET_ELEM_INTERVAL_END`) one past its last address.
    fn interval_set(&mut self, id: u32, values: &[Address]) -> Result<(), EncodeError> {
        let v4 = self.ip_family() == IpFamily::V4;
        let mut ranges: Vec<(u128, u128)> = Vec::with_capacity(values.len());
        for value in values {
            let range = match value.net() {
                IpNet::V4(n) if v4 => (
                    u128::from(u32::from(n.network())),
                    u128::from(u32::from(n.broadcast())),
                ),
                IpNet::V6(n) if !v4 => (u128::from(n.network()), u128::from(n.broadcast())),
                // An address of the other family: nft refuses it too.
                _ => return Err(EncodeError::Unsupported),
            };
            ranges.push(range);
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::new();
        for range in ranges {
            match merged.last_mut() {
                Some(last) if range.0 <= last.1.saturating_add(1) => last.1 = last.1.max(range.1),
                _ => merged.push(range),
            }
        }
        let (type_id, len) = if v4 { (TYPE_IPV4, 4) } else { (TYPE_IPV6, 16) };
        let name = self.anonymous_name(id);
        let mut message = self.begin(Kind::NewSet, NLM_F_CREATE);
        message.put_string(SET_TABLE, &self.table);
        message.put_string(SET_NAME, &name);
        message.put_be32(SET_FLAGS, SET_F_INTERVAL | SET_F_ANONYMOUS | SET_F_CONSTANT);
        message.put_be32(SET_KEY_TYPE, type_id);
        message.put_be32(SET_KEY_LEN, len);
        message.put_be32(SET_ID, id);
        self.push(message)?;
        // As many element messages as the elements need, all before the
        // rule that binds the set (the kernel takes no element for a
        // bound anonymous set).
        let mut elements = ElementList::new(Kind::NewSetElem, NLM_F_CREATE, &name, Some(id));
        let bytes = |value: u128| -> Vec<u8> {
            if v4 {
                // Within u32: both ends came from IPv4 addresses.
                value.to_be_bytes()[12..].to_vec()
            } else {
                value.to_be_bytes().to_vec()
            }
        };
        let max = if v4 { u128::from(u32::MAX) } else { u128::MAX };
        for (start, end) in merged {
            // A range's start and end stay in one message.
            let message = elements.next(self)?;
            interval_element(message, &bytes(start), false);
            if end < max {
                interval_element(message, &bytes(end + 1), true);
            }
        }
        elements.finish(self)
    }

    /// Writes the expressions of one match or statement.
    fn expression(
        &self,
        rule: &mut Rule<'_>,
        expr: &Expr,
        anonymous: &mut impl Iterator<Item = u32>,
    ) -> Result<(), EncodeError> {
        match expr {
            Expr::CtStateNew => {
                rule.ct_state(REG_1);
                rule.bitwise(REG_1, 4, &8u32.to_ne_bytes());
                rule.cmp(REG_1, 1, &0u32.to_ne_bytes());
            }
            Expr::DispatchVmap { with_addr, map } => {
                self.entry_key(rule, *with_addr);
                rule.lookup(map.as_str(), None, REG32_00, Some(REG_VERDICT), false);
            }
            Expr::AddrIs {
                field,
                negate,
                value,
            } => self.address_match(rule, *field, *value, *negate)?,
            // One address or range: a plain comparison, as nft writes it.
            Expr::AddrNotIn { field, values } if values.len() == 1 => {
                self.address_match(rule, *field, values[0], true)?;
            }
            Expr::AddrNotIn { field, .. } => {
                let id = anonymous.next().ok_or(EncodeError::Unsupported)?;
                rule.payload(REG_1, 1, self.addr_offset(*field), self.addr_len());
                rule.lookup(&self.anonymous_name(id), Some(id), REG_1, None, true);
            }
            Expr::AddrInSet { field, set } => {
                rule.payload(REG_1, 1, self.addr_offset(*field), self.addr_len());
                rule.lookup(set.as_str(), None, REG_1, None, false);
            }
            Expr::DestinationPort { protocol, port } => {
                rule.meta(REG_1, 16);
                rule.cmp(REG_1, 0, &[protocol_number(*protocol)]);
                rule.payload(REG_1, 2, 2, 2);
                rule.cmp(REG_1, 0, &port.to_be_bytes());
            }
            Expr::FibLocal(field) => {
                let flag = match field {
                    AddrField::Source => 1,
                    AddrField::Destination => 2,
                };
                rule.fib(REG_1, flag);
                // RTN_LOCAL
                rule.cmp(REG_1, 0, &2u32.to_ne_bytes());
            }
            Expr::L4Proto(protocol) => {
                rule.meta(REG_1, 16);
                rule.cmp(REG_1, 0, &[protocol_number(*protocol)]);
            }
            Expr::InputInterface {
                negate,
                name,
                prefix,
            } => rule.interface(name, *prefix, *negate),
            Expr::MarkSetOr(mark) => {
                rule.meta(REG_1, 3);
                rule.bitwise_xor(REG_1, 4, &(!mark).to_ne_bytes(), &mark.to_ne_bytes());
                rule.meta_set(3, REG_1);
            }
            Expr::MarkSetXor(mark) => {
                rule.meta(REG_1, 3);
                rule.bitwise_xor(REG_1, 4, &u32::MAX.to_ne_bytes(), &mark.to_ne_bytes());
                rule.meta_set(3, REG_1);
            }
            Expr::MarkLacks(mark) => {
                rule.meta(REG_1, 3);
                rule.bitwise(REG_1, 4, &mark.to_ne_bytes());
                rule.cmp(REG_1, 0, &0u32.to_ne_bytes());
            }
            Expr::NumgenIs { modulus, value } => {
                rule.numgen(REG_1, *modulus);
                // numgen writes a host-order u32.
                rule.cmp(REG_1, 0, &value.to_ne_bytes());
            }
            Expr::UpdateSourceSet(set) => {
                rule.payload(
                    REG_1,
                    1,
                    self.addr_offset(AddrField::Source),
                    self.addr_len(),
                );
                rule.dynset(set.as_str(), REG_1);
            }
            Expr::Dnat(to) => {
                let ip = match to.ip() {
                    std::net::IpAddr::V4(ip) if self.ip_family() == IpFamily::V4 => {
                        ip.octets().to_vec()
                    }
                    std::net::IpAddr::V6(ip) if self.ip_family() == IpFamily::V6 => {
                        ip.octets().to_vec()
                    }
                    _ => return Err(EncodeError::Unsupported),
                };
                rule.immediate_value(REG_1, &ip);
                rule.immediate_value(2, &to.port().to_be_bytes());
                rule.nat_dnat(self.family, REG_1, 2);
            }
            Expr::MasqueradeFullyRandom => {
                // NF_NAT_RANGE_PROTO_RANDOM_FULLY
                rule.expr("masq", |b| b.put_be32(1, 0x10));
            }
            Expr::Reject => {
                // NFT_REJECT_ICMPX_UNREACH's code for the family: ICMP
                // port unreachable, ICMPv6 port unreachable.
                let code: u8 = if self.ip_family() == IpFamily::V4 {
                    3
                } else {
                    4
                };
                rule.expr("reject", |b| {
                    b.put_be32(1, 0);
                    b.put_attr(2, &[code]);
                });
            }
            Expr::Verdict(verdict) => rule.immediate_verdict(verdict),
            Expr::AddrPairInSet(set) => {
                let len = self.addr_len();
                rule.payload(REG_1, 1, self.addr_offset(AddrField::Source), len);
                rule.payload(
                    concat_register(len, false),
                    1,
                    self.addr_offset(AddrField::Destination),
                    len,
                );
                rule.lookup(set.as_str(), None, REG_1, None, false);
            }
            Expr::EntryInSet { with_addr, set } => {
                self.entry_key(rule, *with_addr);
                rule.lookup(set.as_str(), None, REG32_00, None, false);
            }
            Expr::DnatDraw {
                protocol,
                with_addr,
                endpoints,
                map,
            } => {
                // Key: [daddr .] dport . slot, from the first register.
                rule.meta(REG_1, 16);
                rule.cmp(REG_1, 0, &[protocol_number(*protocol)]);
                let mut at = 0;
                if *with_addr {
                    let len = self.addr_len();
                    rule.payload(REG_1, 1, self.addr_offset(AddrField::Destination), len);
                    at = len;
                }
                let port = if at == 0 {
                    REG_1
                } else {
                    concat_register(at, false)
                };
                rule.payload(port, 2, 2, 2);
                rule.numgen_offset(concat_register(at + 4, false), *endpoints, 0);
                rule.lookup(map.as_str(), None, REG_1, Some(REG_1), false);
                self.dnat_from_registers(rule);
            }
        }
        Ok(())
    }

    /// `[ip daddr .] meta l4proto . th dport` into the 32-bit registers
    /// from `NFT_REG32_00`: the key of a Service entry (or NodePort), as
    /// the dispatch maps and the count sets are keyed.
    fn entry_key(&self, rule: &mut Rule<'_>, with_addr: bool) {
        let mut next = REG32_00;
        if with_addr {
            let addr_len = self.addr_len();
            rule.payload(
                REG32_00,
                1,
                self.addr_offset(AddrField::Destination),
                addr_len,
            );
            next += addr_len / 4;
        }
        rule.meta(next, 16);
        rule.payload(next + 1, 2, 2, 2);
    }

    /// `dnat ip|ip6 to` the address and port a map lookup left in the
    /// first registers (the address, then the port).
    fn dnat_from_registers(&self, rule: &mut Rule<'_>) {
        let port = concat_register(self.addr_len(), false);
        rule.nat_dnat_map(self.family, REG_1, port);
    }

    fn address_match(
        &self,
        rule: &mut Rule<'_>,
        field: AddrField,
        value: Address,
        negate: bool,
    ) -> Result<(), EncodeError> {
        let len = self.addr_len();
        let (network, mask) = match value.net() {
            IpNet::V4(n) if self.ip_family() == IpFamily::V4 => {
                (n.network().octets().to_vec(), n.netmask().octets().to_vec())
            }
            IpNet::V6(n) if self.ip_family() == IpFamily::V6 => {
                (n.network().octets().to_vec(), n.netmask().octets().to_vec())
            }
            // An address of the other family: nft refuses it too.
            _ => return Err(EncodeError::Unsupported),
        };
        rule.payload(REG_1, 1, self.addr_offset(field), len);
        if mask.iter().any(|b| *b != 0xff) {
            rule.bitwise(REG_1, len, &mask);
        }
        rule.cmp(REG_1, u32::from(negate), &network);
        Ok(())
    }

    fn addr_len(&self) -> u32 {
        match self.ip_family() {
            IpFamily::V4 => 4,
            IpFamily::V6 => 16,
        }
    }

    /// The offset of `field` in the network header.
    fn addr_offset(&self, field: AddrField) -> u32 {
        match (self.ip_family(), field) {
            (IpFamily::V4, AddrField::Source) => 12,
            (IpFamily::V4, AddrField::Destination) => 16,
            (IpFamily::V6, AddrField::Source) => 8,
            (IpFamily::V6, AddrField::Destination) => 24,
        }
    }
}

impl Rule<'_> {
    fn expr(&mut self, name: &str, attrs: impl FnOnce(&mut Message)) {
        self.message.open_nest(LIST_ELEM);
        self.message.put_string(EXPR_NAME, name);
        self.message.open_nest(EXPR_DATA);
        attrs(self.message);
        self.message.close_nest();
        self.message.close_nest();
    }

    fn payload(&mut self, dreg: u32, base: u32, offset: u32, len: u32) {
        self.expr("payload", |b| {
            b.put_be32(1, dreg);
            b.put_be32(2, base);
            b.put_be32(3, offset);
            b.put_be32(4, len);
        });
    }

    fn meta(&mut self, dreg: u32, key: u32) {
        self.expr("meta", |b| {
            b.put_be32(2, key);
            b.put_be32(1, dreg);
        });
    }

    fn meta_set(&mut self, key: u32, sreg: u32) {
        self.expr("meta", |b| {
            b.put_be32(2, key);
            b.put_be32(3, sreg);
        });
    }

    fn ct_state(&mut self, dreg: u32) {
        self.expr("ct", |b| {
            b.put_be32(2, 0);
            b.put_be32(1, dreg);
        });
    }

    fn cmp(&mut self, sreg: u32, op: u32, data: &[u8]) {
        self.expr("cmp", |b| {
            b.put_be32(1, sreg);
            b.put_be32(2, op);
            b.open_nest(3);
            b.put_attr(DATA_VALUE, data);
            b.close_nest();
        });
    }

    /// `reg &= mask` over `len` bytes (the mask's own length).
    fn bitwise(&mut self, reg: u32, len: u32, mask: &[u8]) {
        self.bitwise_xor(reg, len, mask, &vec![0; mask.len()]);
    }

    /// `reg = (reg & mask) ^ xor` over `len` bytes.
    fn bitwise_xor(&mut self, reg: u32, len: u32, mask: &[u8], xor: &[u8]) {
        self.expr("bitwise", |b| {
            b.put_be32(1, reg);
            b.put_be32(2, reg);
            b.put_be32(3, len);
            b.open_nest(4);
            b.put_attr(DATA_VALUE, mask);
            b.close_nest();
            b.open_nest(5);
            b.put_attr(DATA_VALUE, xor);
            b.close_nest();
        });
    }

    fn lookup(&mut self, set: &str, id: Option<u32>, sreg: u32, dreg: Option<u32>, invert: bool) {
        self.expr("lookup", |b| {
            b.put_string(1, set);
            b.put_be32(2, sreg);
            if let Some(dreg) = dreg {
                b.put_be32(3, dreg);
            }
            if let Some(id) = id {
                b.put_be32(4, id);
            }
            if invert {
                b.put_be32(5, 1);
            }
        });
    }

    fn fib(&mut self, dreg: u32, flag: u32) {
        self.expr("fib", |b| {
            b.put_be32(1, dreg);
            // NFT_FIB_RESULT_ADDRTYPE
            b.put_be32(2, 3);
            b.put_be32(3, flag);
        });
    }

    fn numgen(&mut self, dreg: u32, modulus: u32) {
        self.expr("numgen", |b| {
            b.put_be32(1, dreg);
            b.put_be32(2, modulus);
            b.put_be32(3, 1);
        });
    }

    /// `numgen random mod MODULUS offset OFFSET` (nft writes the offset
    /// even when it is 0).
    fn numgen_offset(&mut self, dreg: u32, modulus: u32, offset: u32) {
        self.expr("numgen", |b| {
            b.put_be32(1, dreg);
            b.put_be32(2, modulus);
            b.put_be32(3, 1);
            b.put_be32(4, offset);
        });
    }

    /// `dnat … map`: address and port from registers, with no flags (the
    /// kernel derives them from the registers given), as nft sends it.
    fn nat_dnat_map(&mut self, family: u8, addr_reg: u32, port_reg: u32) {
        self.expr("nat", |b| {
            b.put_be32(1, 1);
            b.put_be32(2, u32::from(family));
            b.put_be32(3, addr_reg);
            b.put_be32(5, port_reg);
        });
    }

    fn dynset(&mut self, set: &str, sreg: u32) {
        self.expr("dynset", |b| {
            b.put_string(1, set);
            // NFT_DYNSET_OP_UPDATE
            b.put_be32(3, 1);
            b.put_be32(4, sreg);
        });
    }

    fn immediate_value(&mut self, dreg: u32, value: &[u8]) {
        self.expr("immediate", |b| {
            b.put_be32(1, dreg);
            b.open_nest(2);
            b.put_attr(DATA_VALUE, value);
            b.close_nest();
        });
    }

    fn immediate_verdict(&mut self, verdict: &Verdict) {
        self.expr("immediate", |b| {
            b.put_be32(1, REG_VERDICT);
            verdict_data(b, 2, verdict);
        });
    }

    fn nat_dnat(&mut self, family: u8, addr_reg: u32, port_reg: u32) {
        self.expr("nat", |b| {
            b.put_be32(1, 1);
            b.put_be32(2, u32::from(family));
            b.put_be32(3, addr_reg);
            b.put_be32(5, port_reg);
            // NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED
            b.put_be32(7, 0x3);
        });
    }

    fn interface(&mut self, name: &str, prefix: bool, negate: bool) {
        // A prefix compares only its own bytes; a whole name includes the
        // NUL padding to IFNAMSIZ.
        let mut bytes = name.as_bytes().to_vec();
        if !prefix {
            bytes.resize(16, 0);
        }
        self.meta(REG_1, 6);
        self.cmp(REG_1, u32::from(negate), &bytes);
    }
}

/// The register of a value `offset` bytes into a concatenation: a value
/// starting a whole 16-byte register is named by that register, as nft
/// names it (`NFT_REG_1` …); the rest by their 4-byte register
/// (`NFT_REG32_00` …). The kernel reads both names alike.
fn concat_register(offset: u32, first: bool) -> u32 {
    if first && offset % 16 == 0 {
        REG_1 + offset / 16
    } else {
        REG32_00 + offset / 4
    }
}

fn interval_element(message: &mut Message, key: &[u8], end: bool) {
    message.open_nest(LIST_ELEM);
    message.open_nest(ELEM_KEY);
    message.put_attr(DATA_VALUE, key);
    message.close_nest();
    if end {
        // NFT_SET_ELEM_INTERVAL_END
        message.put_be32(ELEM_FLAGS, 1);
    }
    message.close_nest();
}
