//! The data layout's sets, elements and statements read back: `typeof`
//! declarations from nft's set user data, slot, pair and affinity keys,
//! endpoint data, and the draw, hairpin, affinity lookup and recording
//! expressions the encoder writes ([`crate::netlink`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kp_model::{IpFamily, Protocol};
use kp_netlink::read_string;

use super::{
    model_name, ne_u32, protocol_of, ReadError, RuleDecoder, Shape, BASE_NETWORK, BASE_TRANSPORT,
    META_L4PROTO, SLOT_1,
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
    let comment = udata_find(udata, UDATA_COMMENT).map(|text| Arc::from(read_string(text)));
    Ok(TypeofSpec {
        name: crate::model::Name::Shared(Arc::from(name)),
        key,
        data,
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

    fn dst_offset(&self) -> u32 {
        match self.family {
            IpFamily::V4 => 16,
            IpFamily::V6 => 24,
        }
    }
}
