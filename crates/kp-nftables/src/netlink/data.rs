//! The data layout's sets and maps: `typeof` declarations (with the user
//! data that makes `nft list` print them as `typeof …`) and elements whose
//! data is an endpoint.

use std::net::{IpAddr, SocketAddr};

use kp_model::{IpFamily, Protocol};
use kp_netlink::NLM_F_CREATE;

use super::msg::Kind;
use super::objects::{
    key_bytes, udata_comment, ElementList, DATA_VALUE, ELEM_DATA, ELEM_KEY, ELEM_USERDATA,
    LIST_ELEM, SET_DATA_LEN, SET_DATA_TYPE, SET_FLAGS, SET_F_MAP, SET_ID, SET_KEY_LEN,
    SET_KEY_TYPE, SET_NAME, SET_TABLE, SET_USERDATA, TYPE_IPV4, TYPE_IPV6, TYPE_PROTO,
    TYPE_SERVICE,
};
use super::{EncodeError, Encoder};
use crate::model::{AddrField, MapElement, Name, TypeofField, TypeofSpec};

/// nft's `integer` data type (`numgen` values).
const TYPE_INTEGER: u32 = 4;
/// The longest set user data the kernel takes (`NFT_USERDATA_MAXLEN`).
const USERDATA_MAX: usize = 256;

// NFTNL_UDATA_SET_*: the set's user data as nft 1.0.6 writes it.
const UDATA_KEY_BYTEORDER: u8 = 0;
const UDATA_DATA_BYTEORDER: u8 = 1;
const UDATA_KEY_TYPEOF: u8 = 3;
const UDATA_DATA_TYPEOF: u8 = 4;
const UDATA_DATA_INTERVAL: u8 = 6;
const UDATA_COMMENT: u8 = 7;
// NFTNL_UDATA_SET_TYPEOF_* and _KEY_CONCAT_SUB_*: an expression's type and
// its own user data.
const UDATA_TYPEOF_EXPR: u8 = 0;
const UDATA_TYPEOF_DATA: u8 = 1;
// nft's `enum expr_types`.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
// nft's `enum proto_desc_id` and header field numbers, as a payload
// expression's user data names its field.
const DESC_UDP: u32 = 6;
const DESC_TCP: u32 = 8;
const DESC_SCTP: u32 = 10;
const DESC_TH: u32 = 11;
const DESC_IP: u32 = 12;
const DESC_IP6: u32 = 13;
const IPHDR_SADDR: u32 = 11;
const IPHDR_DADDR: u32 = 12;
const IP6HDR_SADDR: u32 = 8;
const IP6HDR_DADDR: u32 = 9;
/// `dport` in the tcp, udp, sctp and th templates.
const DPORT: u32 = 2;
/// `NFT_META_L4PROTO`.
const META_L4PROTO: u32 = 16;
/// `NFT_NG_RANDOM`.
const NUMGEN_RANDOM: u32 = 1;

impl Encoder {
    /// `add set|map F kube-proxy NAME { typeof … ; [size N ;] [flags
    /// dynamic,timeout ; timeout Ns ;] [comment "C" ;] }`.
    pub(super) fn add_typeof_set(&mut self, spec: &TypeofSpec) -> Result<(), EncodeError> {
        let family = self.ip_family();
        let mut message = self.begin(Kind::NewSet, NLM_F_CREATE);
        message.put_string(SET_TABLE, &self.table);
        message.put_string(SET_NAME, spec.name.as_str());
        let map = !spec.data.is_empty();
        let mut flags = 0;
        if map {
            flags |= SET_F_MAP;
        }
        message.put_be32(SET_FLAGS, flags);
        let (key_type, key_len) = concat_type(family, &spec.key);
        message.put_be32(SET_KEY_TYPE, key_type);
        message.put_be32(SET_KEY_LEN, key_len);
        if map {
            let (data_type, data_len) = concat_type(family, &spec.data);
            message.put_be32(SET_DATA_TYPE, data_type);
            message.put_be32(SET_DATA_LEN, data_len);
        }
        let set_id = self.next_set_id();
        message.put_be32(SET_ID, set_id);
        message.put_attr(SET_USERDATA, &set_udata(family, spec)?);
        self.push(message)
    }

    /// `add element … MAP { KEY : ADDRESS . PORT[, …] }`.
    pub(super) fn add_map_elements(
        &mut self,
        map: &Name,
        elements: &[MapElement],
    ) -> Result<(), EncodeError> {
        let family = self.ip_family();
        let mut list = ElementList::new(Kind::NewSetElem, NLM_F_CREATE, map.as_str(), None);
        for element in elements {
            let target = endpoint_bytes(family, element.target)?;
            let message = list.next(self)?;
            message.open_nest(LIST_ELEM);
            message.open_nest(ELEM_KEY);
            message.put_attr(DATA_VALUE, &key_bytes(&element.key));
            message.close_nest();
            message.open_nest(ELEM_DATA);
            message.put_attr(DATA_VALUE, &target);
            message.close_nest();
            if let Some(comment) = &element.comment {
                // NFTNL_UDATA_SET_ELEM_COMMENT
                message.put_attr(ELEM_USERDATA, &udata_comment(0, comment)?);
            }
            message.close_nest();
        }
        list.finish(self)
    }
}

/// `ADDRESS . PORT` as a map's data holds it: the address, then the port
/// in network order padded to 4 bytes. An address of the other family is
/// refused, as nft refuses it.
pub(super) fn endpoint_bytes(family: IpFamily, target: SocketAddr) -> Result<Vec<u8>, EncodeError> {
    let mut out = match (family, target.ip()) {
        (IpFamily::V4, IpAddr::V4(ip)) => ip.octets().to_vec(),
        (IpFamily::V6, IpAddr::V6(ip)) => ip.octets().to_vec(),
        _ => return Err(EncodeError::Unsupported),
    };
    out.extend_from_slice(&target.port().to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    Ok(out)
}

/// The bytes a field takes in a register (a concatenation pads each field
/// to 4 bytes).
pub(super) fn field_len(family: IpFamily, field: TypeofField) -> u32 {
    match field {
        TypeofField::Addr(_) => addr_len(family),
        TypeofField::Number
        | TypeofField::L4Proto
        | TypeofField::Port(_)
        | TypeofField::AnyPort => 4,
    }
}

fn addr_len(family: IpFamily) -> u32 {
    match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    }
}

/// The key or data type of concatenated fields (nft's type ids, 6 bits
/// each, the first field highest) and their length.
fn concat_type(family: IpFamily, fields: &[TypeofField]) -> (u32, u32) {
    let mut type_id = 0u32;
    let mut len = 0u32;
    for field in fields {
        let id = match field {
            TypeofField::Number => TYPE_INTEGER,
            TypeofField::Addr(_) => match family {
                IpFamily::V4 => TYPE_IPV4,
                IpFamily::V6 => TYPE_IPV6,
            },
            TypeofField::L4Proto => TYPE_PROTO,
            TypeofField::Port(_) | TypeofField::AnyPort => TYPE_SERVICE,
        };
        type_id = (type_id << 6) | id;
        len += field_len(family, *field);
    }
    (type_id, len)
}

/// The set's user data as nft 1.0.6 writes it for a `typeof` declaration:
/// the byte orders (none, for a concatenation), the key's expressions, a
/// map's data expressions and whether its data is an interval, then the
/// comment. A comment that would take it past what the kernel stores is
/// refused by its length.
fn set_udata(family: IpFamily, spec: &TypeofSpec) -> Result<Vec<u8>, EncodeError> {
    let map = !spec.data.is_empty();
    let mut out = Vec::with_capacity(160);
    udata_u32(&mut out, UDATA_KEY_BYTEORDER, byteorder(&spec.key));
    if map {
        udata_u32(&mut out, UDATA_DATA_BYTEORDER, byteorder(&spec.data));
    }
    udata_nest(&mut out, UDATA_KEY_TYPEOF, &typeof_udata(family, &spec.key));
    if map {
        udata_nest(
            &mut out,
            UDATA_DATA_TYPEOF,
            &typeof_udata(family, &spec.data),
        );
        udata_u32(&mut out, UDATA_DATA_INTERVAL, 0);
    }
    if let Some(comment) = &spec.comment {
        let max = USERDATA_MAX.saturating_sub(out.len() + 3);
        if comment.len() > max {
            return Err(EncodeError::CommentTooLong {
                len: comment.len(),
                max,
            });
        }
        out.extend_from_slice(&udata_comment(UDATA_COMMENT, comment)?);
    }
    Ok(out)
}

/// nft's byte order of a key: a concatenation has none (0); a single
/// field its own (network order, 2, for addresses and ports; host order,
/// 1, for numbers and protocols).
fn byteorder(fields: &[TypeofField]) -> u32 {
    match fields {
        [TypeofField::Number | TypeofField::L4Proto] => 1,
        [_] => 2,
        _ => 0,
    }
}

/// One typeof expression: `{ type ; data }`, of the concatenation when
/// there are several fields.
fn typeof_udata(family: IpFamily, fields: &[TypeofField]) -> Vec<u8> {
    let mut out = Vec::new();
    if let [field] = fields {
        let (expr_type, data) = field_udata(family, *field);
        udata_u32(&mut out, UDATA_TYPEOF_EXPR, expr_type);
        udata_nest(&mut out, UDATA_TYPEOF_DATA, &data);
        return out;
    }
    let mut concat = Vec::new();
    for (index, field) in fields.iter().enumerate() {
        let (expr_type, data) = field_udata(family, *field);
        let mut nest = Vec::new();
        udata_u32(&mut nest, UDATA_TYPEOF_EXPR, expr_type);
        udata_nest(&mut nest, UDATA_TYPEOF_DATA, &data);
        // NFTNL_UDATA_SET_KEY_CONCAT_NEST + index; a key has at most a
        // handful of fields.
        udata_nest(&mut concat, u8::try_from(index).unwrap_or(u8::MAX), &nest);
    }
    udata_u32(&mut out, UDATA_TYPEOF_EXPR, EXPR_CONCAT);
    udata_nest(&mut out, UDATA_TYPEOF_DATA, &concat);
    out
}

/// A field's expression type and its user data.
fn field_udata(family: IpFamily, field: TypeofField) -> (u32, Vec<u8>) {
    let mut data = Vec::new();
    let payload = |data: &mut Vec<u8>, desc: u32, template: u32| {
        udata_u32(data, 0, desc);
        udata_u32(data, 1, template);
    };
    let expr_type = match field {
        TypeofField::Number => {
            // type, modulus, offset
            udata_u32(&mut data, 0, NUMGEN_RANDOM);
            udata_u32(&mut data, 1, 1);
            udata_u32(&mut data, 2, 0);
            EXPR_NUMGEN
        }
        TypeofField::Addr(field) => {
            let (desc, template) = match (family, field) {
                (IpFamily::V4, AddrField::Source) => (DESC_IP, IPHDR_SADDR),
                (IpFamily::V4, AddrField::Destination) => (DESC_IP, IPHDR_DADDR),
                (IpFamily::V6, AddrField::Source) => (DESC_IP6, IP6HDR_SADDR),
                (IpFamily::V6, AddrField::Destination) => (DESC_IP6, IP6HDR_DADDR),
            };
            payload(&mut data, desc, template);
            EXPR_PAYLOAD
        }
        TypeofField::L4Proto => {
            udata_u32(&mut data, 0, META_L4PROTO);
            EXPR_META
        }
        TypeofField::Port(protocol) => {
            let desc = match protocol {
                Protocol::Tcp => DESC_TCP,
                Protocol::Udp => DESC_UDP,
                Protocol::Sctp => DESC_SCTP,
            };
            payload(&mut data, desc, DPORT);
            EXPR_PAYLOAD
        }
        TypeofField::AnyPort => {
            payload(&mut data, DESC_TH, DPORT);
            EXPR_PAYLOAD
        }
    };
    (expr_type, data)
}

/// An nftnl user data entry holding a host-order u32.
fn udata_u32(out: &mut Vec<u8>, kind: u8, value: u32) {
    out.extend_from_slice(&[kind, 4]);
    out.extend_from_slice(&value.to_ne_bytes());
}

/// An nftnl user data entry holding other entries. Their length fits its
/// one byte: the largest, an IPv6 affinity key's three fields, is 74
/// bytes.
fn udata_nest(out: &mut Vec<u8>, kind: u8, inner: &[u8]) {
    out.extend_from_slice(&[kind, u8::try_from(inner.len()).unwrap_or(u8::MAX)]);
    out.extend_from_slice(inner);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::model::AddrField::{Destination, Source};

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn spec(key: Vec<TypeofField>, data: Vec<TypeofField>) -> TypeofSpec {
        TypeofSpec {
            name: Name::Fixed("s"),
            key,
            data,
            comment: None,
        }
    }

    /// The user data nft 1.0.6 (libnftnl 1.2.4, x86-64) sent for the same
    /// declarations (`nft --debug=mnl -f`), byte for byte.
    #[test]
    fn typeof_user_data_is_what_nft_sends() {
        use TypeofField::{AnyPort, Number, Port};
        let cases = [
            (
                IpFamily::V4,
                spec(vec![Number, Number], vec![TypeofField::Addr(Destination), Port(Protocol::Tcp)]),
                "000400000000010400000000034000040d0000000138001a0004170000000112000401000000010401000000020400000000011a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c000408000000010402000000060400000000",
            ),
            (
                IpFamily::V6,
                spec(vec![Number, Number], vec![TypeofField::Addr(Destination), Port(Protocol::Sctp)]),
                "000400000000010400000000034000040d0000000138001a0004170000000112000401000000010401000000020400000000011a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040d0000000104090000000114000407000000010c00040a000000010402000000060400000000",
            ),
            (
                IpFamily::V4,
                spec(vec![TypeofField::Addr(Source), TypeofField::Addr(Destination)], vec![]),
                "000400000000033400040d000000012c0014000407000000010c00040c00000001040b0000000114000407000000010c00040c00000001040c000000",
            ),
            (
                IpFamily::V6,
                spec(vec![TypeofField::Addr(Destination), TypeofField::L4Proto, AnyPort], vec![]),
                "000400000000034400040d000000013c0014000407000000010c00040d000000010409000000010e00040900000001060004100000000214000407000000010c00040b000000010402000000",
            ),
            (
                IpFamily::V4,
                spec(
                    vec![TypeofField::Addr(Destination), Port(Protocol::Tcp), TypeofField::Addr(Source)],
                    vec![TypeofField::Addr(Destination), Port(Protocol::Tcp)],
                ),
                "000400000000010400000000034a00040d00000001420014000407000000010c00040c00000001040c0000000114000407000000010c0004080000000104020000000214000407000000010c00040c00000001040b000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c000408000000010402000000060400000000",
            ),
            (
                IpFamily::V6,
                spec(
                    vec![TypeofField::Addr(Destination), Port(Protocol::Udp), TypeofField::Addr(Source)],
                    vec![TypeofField::Addr(Destination), Port(Protocol::Udp)],
                ),
                "000400000000010400000000034a00040d00000001420014000407000000010c00040d0000000104090000000114000407000000010c0004060000000104020000000214000407000000010c00040d000000010408000000043400040d000000012c0014000407000000010c00040d0000000104090000000114000407000000010c000406000000010402000000060400000000",
            ),
        ];
        for (family, spec, nft) in cases {
            let line = crate::model::Command::AddTypeofSet(spec.clone())
                .line(family)
                .to_string();
            assert_eq!(set_udata(family, &spec).unwrap(), hex(nft), "{line}");
        }
    }

    #[test]
    fn key_types_and_lengths_are_what_nft_sends() {
        use TypeofField::{AnyPort, L4Proto, Number, Port};
        let v4 = IpFamily::V4;
        let v6 = IpFamily::V6;
        assert_eq!(concat_type(v4, &[Number, Number]), (0x104, 8));
        assert_eq!(
            concat_type(v4, &[TypeofField::Addr(Destination), Port(Protocol::Tcp)]),
            (0x1cd, 8)
        );
        assert_eq!(
            concat_type(v6, &[TypeofField::Addr(Destination), Port(Protocol::Tcp)]),
            (0x20d, 20)
        );
        assert_eq!(
            concat_type(
                v4,
                &[TypeofField::Addr(Source), TypeofField::Addr(Destination)]
            ),
            (0x1c7, 8)
        );
        assert_eq!(
            concat_type(
                v6,
                &[TypeofField::Addr(Source), TypeofField::Addr(Destination)]
            ),
            (0x208, 32)
        );
        assert_eq!(
            concat_type(v4, &[TypeofField::Addr(Destination), L4Proto, AnyPort]),
            (0x730d, 12)
        );
        assert_eq!(
            concat_type(v6, &[TypeofField::Addr(Destination), L4Proto, AnyPort]),
            (0x830d, 24)
        );
        assert_eq!(
            concat_type(
                v4,
                &[
                    TypeofField::Addr(Destination),
                    Port(Protocol::Tcp),
                    TypeofField::Addr(Source)
                ]
            ),
            (0x7347, 12)
        );
        assert_eq!(
            concat_type(
                v6,
                &[
                    TypeofField::Addr(Destination),
                    Port(Protocol::Tcp),
                    TypeofField::Addr(Source)
                ]
            ),
            (0x8348, 36)
        );
    }

    #[test]
    fn an_endpoint_of_the_other_family_is_refused() {
        assert_eq!(
            endpoint_bytes(IpFamily::V4, "[fd00::2]:80".parse().unwrap()),
            Err(EncodeError::Unsupported)
        );
        assert_eq!(
            endpoint_bytes(IpFamily::V6, "10.244.1.2:80".parse().unwrap()),
            Err(EncodeError::Unsupported)
        );
        assert_eq!(
            endpoint_bytes(IpFamily::V4, "10.244.1.2:8080".parse().unwrap()).unwrap(),
            [10, 244, 1, 2, 0x1f, 0x90, 0, 0]
        );
    }

    #[test]
    fn a_comment_past_the_kernels_user_data_limit_is_refused_not_cut() {
        let mut spec = spec(
            vec![TypeofField::Number, TypeofField::Number],
            vec![
                TypeofField::Addr(Destination),
                TypeofField::Port(Protocol::Tcp),
            ],
        );
        spec.comment = Some("c".repeat(200).into());
        match set_udata(IpFamily::V4, &spec) {
            Err(EncodeError::CommentTooLong { len: 200, max }) => assert!(max < 200, "{max}"),
            other => panic!("a 200-byte comment after 138 bytes of typeof: {other:?}"),
        }
        spec.comment = Some("c".repeat(100).into());
        assert_eq!(set_udata(IpFamily::V4, &spec).unwrap().len(), 138 + 103);
    }
}
