//! The data layout's sets, elements and statements read back: `typeof`
//! declarations from nft's set user data, slot, pair and affinity keys,
//! endpoint data, and the draw, hairpin, affinity lookup and recording
//! expressions the encoder writes ([`crate::netlink`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kp_model::{IpFamily, Protocol};
use kp_netlink::{read_be_u32, read_be_u64, read_string, Attributes};

use super::{
    model_name, ne_u32, protocol_of, ReadError, RuleDecoder, Shape, BASE_NETWORK, BASE_TRANSPORT,
    CMP_NEQ, CT_DST_IP, CT_DST_IP6, CT_PROTO_DST, CT_STATUS, IPS_DST_NAT, META_L4PROTO, SET_DESC,
    SET_DESC_SIZE, SLOT_1,
};
use crate::model::{AddrField, Expr, Key, TypeofField, TypeofSpec};

/// `NFTNL_UDATA_SET_KEY_TYPEOF`, `_DATA_TYPEOF`, `_COMMENT`.
const UDATA_KEY_TYPEOF: u8 = 3;
const UDATA_DATA_TYPEOF: u8 = 4;
const UDATA_COMMENT: u8 = 7;
// nft's `enum expr_types`.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
/// `IP_CT_DIR_ORIGINAL`.
const CT_DIR_ORIGINAL: u8 = 0;

/// The value of the first nftnl user data entry of `kind` in `udata`.
fn udata_find(udata: &[u8], kind: u8) -> Option<&[u8]> {
    let mut rest = udata;
    while let [entry, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *entry == kind {
            return Some(value);
        }
        rest = tail.get(len..)?;
    }
    None
}

/// Whether a set's user data declares it with `typeof`. nft 1.0.6 writes
/// a key typeof entry for a `type a . b` declaration too, as a
/// concatenation with no fields; that one is a `type` declaration.
pub(super) fn declares_typeof(udata: &[u8]) -> bool {
    let Some(nest) = udata_find(udata, UDATA_KEY_TYPEOF) else {
        return false;
    };
    let concat = udata_find(nest, 0).and_then(ne_u32) == Some(EXPR_CONCAT);
    !concat || udata_find(nest, 1).is_some_and(|fields| !fields.is_empty())
}

/// The `typeof` declaration a set's user data holds.
pub(super) fn typeof_spec(
    family: IpFamily,
    name: &str,
    attrs: &BTreeMap<u16, &[u8]>,
    udata: &[u8],
) -> Result<TypeofSpec, &'static str> {
    let key = udata_find(udata, UDATA_KEY_TYPEOF)
        .and_then(|nest| typeof_fields(family, nest))
        .ok_or("its typeof key is not one this table declares")?;
    let data = match udata_find(udata, UDATA_DATA_TYPEOF) {
        None => Vec::new(),
        Some(nest) => {
            typeof_fields(family, nest).ok_or("its typeof data is not one this table declares")?
        }
    };
    let size = attrs
        .get(&SET_DESC)
        .and_then(|desc| Attributes::new(desc).find(|(kind, _)| *kind == SET_DESC_SIZE))
        .and_then(|(_, value)| read_be_u32(value));
    let dynamic_timeout_secs = attrs
        .get(&super::SET_TIMEOUT)
        .and_then(|v| read_be_u64(v))
        .map(|millis| millis / 1000);
    let comment = udata_find(udata, UDATA_COMMENT).map(|text| Arc::from(read_string(text)));
    Ok(TypeofSpec {
        name: crate::model::Name::Shared(Arc::from(name)),
        key,
        data,
        size,
        dynamic_timeout_secs,
        comment,
    })
}

/// The fields of one typeof expression (`{ type ; data }`).
fn typeof_fields(family: IpFamily, nest: &[u8]) -> Option<Vec<TypeofField>> {
    let expr_type = ne_u32(udata_find(nest, 0)?)?;
    let data = udata_find(nest, 1)?;
    if expr_type != EXPR_CONCAT {
        return Some(vec![typeof_field(family, expr_type, data)?]);
    }
    let mut fields = Vec::new();
    for index in 0u8.. {
        let Some(field) = udata_find(data, index) else {
            break;
        };
        let field_type = ne_u32(udata_find(field, 0)?)?;
        fields.push(typeof_field(family, field_type, udata_find(field, 1)?)?);
    }
    (fields.len() > 1).then_some(fields)
}

/// One field from its expression type and user data.
fn typeof_field(family: IpFamily, expr_type: u32, data: &[u8]) -> Option<TypeofField> {
    let value = |kind: u8| udata_find(data, kind).and_then(ne_u32);
    match expr_type {
        // random, modulus 1, offset 0
        EXPR_NUMGEN if value(0) == Some(1) => Some(TypeofField::Number),
        EXPR_META if value(0) == Some(META_L4PROTO) => Some(TypeofField::L4Proto),
        EXPR_PAYLOAD => match (family, value(0)?, value(1)?) {
            (IpFamily::V4, 12, 11) | (IpFamily::V6, 13, 8) => {
                Some(TypeofField::Addr(AddrField::Source))
            }
            (IpFamily::V4, 12, 12) | (IpFamily::V6, 13, 9) => {
                Some(TypeofField::Addr(AddrField::Destination))
            }
            (_, 8, 2) => Some(TypeofField::Port(Protocol::Tcp)),
            (_, 6, 2) => Some(TypeofField::Port(Protocol::Udp)),
            (_, 10, 2) => Some(TypeofField::Port(Protocol::Sctp)),
            (_, 11, 2) => Some(TypeofField::AnyPort),
            _ => None,
        },
        _ => None,
    }
}

/// A key of a typeof set: the shapes the data layout writes.
pub(super) fn typeof_key(family: IpFamily, fields: &[TypeofField], key: &[u8]) -> Option<Key> {
    use TypeofField::{Addr, AnyPort, L4Proto, Number, Port};
    let mut reader = Fields { family, rest: key };
    let out = match fields {
        [Addr(AddrField::Destination), Port(_), Number] => {
            Key::EntrySlot(reader.address()?, reader.port()?, reader.number()?)
        }
        [Port(_), Number] => Key::PortSlot(reader.port()?, reader.number()?),
        [Addr(AddrField::Source), Addr(AddrField::Destination)] => {
            Key::AddrPair(reader.address()?, reader.address()?)
        }
        [Addr(AddrField::Destination), L4Proto, AnyPort] => {
            let ip = reader.address()?;
            let protocol = reader.protocol()?;
            Key::AddrProtoPort(ip, protocol, reader.port()?)
        }
        [Addr(AddrField::Destination), Port(_), Addr(AddrField::Source)] => {
            Key::AddrPortAddr(reader.address()?, reader.port()?, reader.address()?)
        }
        _ => return None,
    };
    reader.rest.is_empty().then_some(out)
}

/// An endpoint map's data: `address . port`.
pub(super) fn endpoint_of(family: IpFamily, data: &[u8]) -> Option<SocketAddr> {
    let mut reader = Fields { family, rest: data };
    let target = SocketAddr::new(reader.address()?, reader.port()?);
    reader.rest.is_empty().then_some(target)
}

/// Reads concatenated fields, each padded to 4 bytes.
struct Fields<'a> {
    family: IpFamily,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let head = self.rest.get(..len)?;
        self.rest = self.rest.get(len..)?;
        Some(head)
    }

    fn number(&mut self) -> Option<u32> {
        ne_u32(self.take(4)?)
    }

    fn address(&mut self) -> Option<IpAddr> {
        match self.family {
            IpFamily::V4 => Some(IpAddr::from(<[u8; 4]>::try_from(self.take(4)?).ok()?)),
            IpFamily::V6 => Some(IpAddr::from(<[u8; 16]>::try_from(self.take(16)?).ok()?)),
        }
    }

    fn port(&mut self) -> Option<u16> {
        match self.take(4)? {
            [high, low, 0, 0] => Some(u16::from_be_bytes([*high, *low])),
            _ => None,
        }
    }

    fn protocol(&mut self) -> Option<Protocol> {
        match self.take(4)? {
            [number, 0, 0, 0] => protocol_of(*number),
            _ => None,
        }
    }
}

impl RuleDecoder<'_> {
    /// `payload saddr; payload daddr; lookup` from `i` (the source load):
    /// `ip saddr . ip daddr @SET`.
    pub(super) fn addr_pair_at(&self, i: usize) -> Option<(Expr, usize)> {
        let len = self.addr_len();
        let destination = self.dst_offset();
        match (self.shape(i + 1).ok()?, self.shape(i + 2).ok()?) {
            (
                Shape::Payload {
                    base: BASE_NETWORK,
                    offset,
                    len: loaded,
                    slot,
                },
                Shape::Lookup {
                    set,
                    slot: SLOT_1,
                    dslot: None,
                    invert: false,
                },
            ) if offset == destination && loaded == len && slot == SLOT_1 + len / 4 => {
                Some((Expr::AddrPairInSet(model_name(&set)), 3))
            }
            _ => None,
        }
    }

    /// After `meta l4proto == P` at `i`: `payload daddr; payload dport;
    /// payload saddr; lookup => reg 1; nat`, the affinity lookup.
    pub(super) fn dnat_affinity_at(
        &self,
        i: usize,
        protocol: Protocol,
    ) -> Result<(Expr, usize), ReadError> {
        let len = self.addr_len();
        let port_slot = SLOT_1 + len / 4;
        let shapes = (
            self.shape(i + 2)?,
            self.shape(i + 3)?,
            self.shape(i + 4)?,
            self.shape(i + 5)?,
        );
        let map = match shapes {
            (
                Shape::Payload {
                    base: BASE_NETWORK,
                    offset: daddr,
                    len: l1,
                    slot: SLOT_1,
                },
                Shape::Payload {
                    base: BASE_TRANSPORT,
                    offset: 2,
                    len: 2,
                    slot: s2,
                },
                Shape::Payload {
                    base: BASE_NETWORK,
                    offset: saddr,
                    len: l3,
                    slot: s3,
                },
                Shape::Lookup {
                    set,
                    slot: SLOT_1,
                    dslot: Some(SLOT_1),
                    invert: false,
                },
            ) if daddr == self.dst_offset()
                && saddr == self.src_offset()
                && l1 == len
                && l3 == len
                && s2 == port_slot
                && s3 == port_slot + 1 =>
            {
                set
            }
            _ => {
                return Err(self.error_at(
                    i + 2,
                    "a network load after a protocol match other than an affinity lookup",
                ))
            }
        };
        self.nat_map_at(i + 6)?;
        Ok((
            Expr::DnatAffinity {
                protocol,
                map: model_name(&map),
            },
            7,
        ))
    }

    /// After `meta l4proto == P` at `i`: `[payload daddr;] payload dport;
    /// numgen mod E; lookup => reg 1; nat`, the draw.
    pub(super) fn draw_at(
        &self,
        i: usize,
        protocol: Protocol,
        with_addr: bool,
    ) -> Result<(Expr, usize), ReadError> {
        let bad = |index: usize, reason: &str| Err(self.error_at(index, reason));
        let mut at = i + 2;
        let mut slot = SLOT_1;
        if with_addr {
            let len = self.addr_len();
            match self.shape(at)? {
                Shape::Payload {
                    base: BASE_NETWORK,
                    offset,
                    len: loaded,
                    slot: SLOT_1,
                } if offset == self.dst_offset() && loaded == len => {}
                _ => return bad(at, "a draw whose key does not start with the destination"),
            }
            at += 1;
            slot += len / 4;
        }
        match self.shape(at)? {
            Shape::Payload {
                base: BASE_TRANSPORT,
                offset: 2,
                len: 2,
                slot: loaded,
            } if loaded == slot => {}
            _ => return bad(at, "a draw whose key has no destination port"),
        }
        let numgen = self
            .raws
            .get(at + 1)
            .filter(|raw| raw.name == "numgen")
            .ok_or_else(|| self.error_at(at + 1, "a draw without numgen"))?;
        let random = numgen.be32(3) == Some(1) && numgen.only(&[1, 2, 3, 4]);
        if !random || numgen.be32(4).unwrap_or(0) != 0 || numgen.slot(1) != Some(slot + 1) {
            return bad(at + 1, "a draw whose numgen is not the slot");
        }
        let endpoints = numgen
            .be32(2)
            .ok_or_else(|| self.error_at(at + 1, "no modulus"))?;
        let Shape::Lookup {
            set,
            slot: SLOT_1,
            dslot: Some(SLOT_1),
            invert: false,
        } = self.shape(at + 2)?
        else {
            return bad(at + 2, "a draw not looked up in a map of endpoints");
        };
        self.nat_map_at(at + 3)?;
        Ok((
            Expr::DnatDraw {
                protocol,
                with_addr,
                endpoints,
                map: model_name(&set),
            },
            at + 4 - i,
        ))
    }

    /// `nat dnat` to the address in reg 1 and the port after it. nft sends
    /// no flags here; the kernel derives them from the registers and dumps
    /// them (`NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED`).
    fn nat_map_at(&self, i: usize) -> Result<(), ReadError> {
        let Some(nat) = self.raws.get(i).filter(|r| r.name == "nat") else {
            return Err(self.error_at(i, "a map lookup not used by a nat statement"));
        };
        let family = match self.family {
            IpFamily::V4 => 2,
            IpFamily::V6 => 10,
        };
        let port = SLOT_1 + self.addr_len() / 4;
        let shape_ok = nat.only(&[1, 2, 3, 4, 5, 6, 7])
            && nat.be32(1) == Some(1)
            && nat.be32(2) == Some(family)
            && nat.slot(3) == Some(SLOT_1)
            && nat.slot(4).is_none_or(|s| s == SLOT_1)
            && nat.slot(5) == Some(port)
            && nat.slot(6).is_none_or(|s| s == port)
            && nat.be32(7).is_none_or(|flags| flags == 0x3);
        if shape_ok {
            Ok(())
        } else {
            Err(self.error_at(i, "a nat statement other than dnat to a map's endpoint"))
        }
    }

    /// A `ct` load at `i` other than `ct state`: `ct status dnat`, the
    /// Service entry's lookup, or the affinity record.
    pub(super) fn ct_at(&self, i: usize) -> Result<(Expr, usize), ReadError> {
        let raw = &self.raws[i];
        let bad = |index: usize, reason: &str| Err(self.error_at(index, reason));
        let key = raw.be32(2);
        if key == Some(CT_STATUS) && raw.only(&[1, 2]) && raw.slot(1) == Some(SLOT_1) {
            return match (self.shape(i + 1)?, self.shape(i + 2)?) {
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
                ) if ne_u32(mask) == Some(IPS_DST_NAT)
                    && ne_u32(xor) == Some(0)
                    && ne_u32(data) == Some(0) =>
                {
                    Ok((Expr::CtStatusDnat, 3))
                }
                _ => bad(i + 1, "ct status compared with something other than dnat"),
            };
        }
        let daddr_key = match self.family {
            IpFamily::V4 => CT_DST_IP,
            IpFamily::V6 => CT_DST_IP6,
        };
        if !self.ct_original(i, daddr_key, SLOT_1) {
            return bad(i, "a ct expression this table's rules never hold");
        }
        let after = SLOT_1 + self.addr_len() / 4;
        match self.shape(i + 1)? {
            Shape::Meta {
                key: META_L4PROTO,
                slot,
            } if slot == after && self.ct_original(i + 2, CT_PROTO_DST, after + 1) => {
                match self.shape(i + 3)? {
                    Shape::Lookup {
                        set,
                        slot: SLOT_1,
                        dslot: None,
                        invert: false,
                    } => Ok((Expr::OriginalEntryInSet(model_name(&set)), 4)),
                    _ => bad(i + 3, "a Service entry not looked up in a set"),
                }
            }
            _ if self.ct_original(i + 1, CT_PROTO_DST, after) => self.record_at(i, after),
            _ => bad(i + 1, "ct original daddr followed by neither entry form"),
        }
    }

    /// Whether expression `i` is `ct original KEY => SLOT`.
    fn ct_original(&self, i: usize, key: u32, slot: u32) -> bool {
        self.raws.get(i).is_some_and(|raw| {
            raw.name == "ct"
                && raw.only(&[1, 2, 3])
                && raw.be32(2) == Some(key)
                && raw.slot(1) == Some(slot)
                && raw.get(3) == Some(&[CT_DIR_ORIGINAL][..])
        })
    }

    /// The affinity record from `i` (its `ct original daddr`; the
    /// original port is in slot `after`): `payload saddr; payload daddr;
    /// payload dport; dynset update`.
    fn record_at(&self, i: usize, after: u32) -> Result<(Expr, usize), ReadError> {
        let len = self.addr_len();
        let (saddr, daddr, dport) = (self.shape(i + 2)?, self.shape(i + 3)?, self.shape(i + 4)?);
        let data = match (saddr, daddr, dport) {
            (
                Shape::Payload {
                    base: BASE_NETWORK,
                    offset: o1,
                    len: l1,
                    slot: s1,
                },
                Shape::Payload {
                    base: BASE_NETWORK,
                    offset: o2,
                    len: l2,
                    slot: data,
                },
                Shape::Payload {
                    base: BASE_TRANSPORT,
                    offset: 2,
                    len: 2,
                    slot: s3,
                },
            ) if o1 == self.src_offset()
                && o2 == self.dst_offset()
                && l1 == len
                && l2 == len
                && s1 == after + 1
                && s3 == data + len / 4 =>
            {
                data
            }
            _ => {
                return Err(self.error_at(
                    i + 2,
                    "an affinity key or data other than client, endpoint address and port",
                ))
            }
        };
        let raw = self
            .raws
            .get(i + 5)
            .filter(|raw| raw.name == "dynset")
            .ok_or_else(|| self.error_at(i + 5, "an affinity key not used by a dynset"))?;
        // NFTA_DYNSET_FLAGS is 9 (8 is padding).
        if !raw.only(&[1, 2, 3, 4, 5, 6, 8, 9])
            || raw.be32(3) != Some(1)
            || raw.slot(4) != Some(SLOT_1)
            || raw.slot(5) != Some(data)
            || raw.be32(9).unwrap_or(0) != 0
        {
            return Err(self.error_at(i + 5, "a dynset other than update of an affinity map"));
        }
        let map = raw
            .get(1)
            .map(read_string)
            .ok_or_else(|| self.error_at(i + 5, "no set name"))?;
        let protocol = *self.data_protocols.get(&map).ok_or_else(|| {
            self.error_at(
                i + 5,
                &format!("an update of {map}, which is not a map of endpoints"),
            )
        })?;
        let timeout_secs = raw.get(6).and_then(read_be_u64).unwrap_or(0) / 1000;
        Ok((
            Expr::RecordAffinity {
                protocol,
                map: model_name(&map),
                timeout_secs,
            },
            6,
        ))
    }

    fn src_offset(&self) -> u32 {
        match self.family {
            IpFamily::V4 => 12,
            IpFamily::V6 => 8,
        }
    }

    fn dst_offset(&self) -> u32 {
        match self.family {
            IpFamily::V4 => 16,
            IpFamily::V6 => 24,
        }
    }
}
