#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use prometheus_client::registry::Registry;

use super::*;

use kp_netlink::{messages, HEADER_LEN, NLMSG_ERROR};

const NFGENMSG_LEN: usize = nfnetlink::NFGENMSG_LEN;

/// A `NEW` answer to `seq` as the kernel sends it for `nfacct get`.
fn counts_message(seq: u32, name: &str, packets: u64, bytes: u64) -> Vec<u8> {
    let mut attributes = Vec::new();
    let mut attribute = |kind: u16, value: &[u8]| {
        attributes.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        attributes.extend_from_slice(&kind.to_ne_bytes());
        attributes.extend_from_slice(value);
        attributes.resize(padded(attributes.len()), 0);
    };
    attribute(ATTR_NAME, format!("{name}\0").as_bytes());
    attribute(ATTR_PACKETS, &packets.to_be_bytes());
    attribute(ATTR_BYTES, &bytes.to_be_bytes());
    attribute(4, &1u32.to_be_bytes()); // NFACCT_USE, ignored
    message(
        nfnetlink::message_type(nfnetlink::SUBSYS_ACCT, MSG_NEW),
        seq,
        &[&[0, 0, 0, 0], &attributes],
    )
}

fn error_message(seq: u32, errno: i32) -> Vec<u8> {
    // The error code, then the request's header.
    let mut body = (-errno).to_ne_bytes().to_vec();
    body.extend_from_slice(&[0; HEADER_LEN]);
    message(NLMSG_ERROR, seq, &[&body])
}

fn message(kind: u16, seq: u32, parts: &[&[u8]]) -> Vec<u8> {
    let len = HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(len as u32).to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(&0u16.to_ne_bytes());
    bytes.extend_from_slice(&seq.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    for part in parts {
        bytes.extend_from_slice(part);
    }
    bytes
}

fn padded(len: usize) -> usize {
    (len + 3) & !3
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    kp_netlink::read_u16(bytes.get(at..)?)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    kp_netlink::read_u32(bytes.get(at..)?)
}

#[test]
fn a_create_request_names_the_counter_with_create_and_ack() {
    let bytes = request(MSG_NEW, NLM_F_CREATE, "localhost_nps_accepted_pkts")
        .unwrap()
        .finish(7)
        .unwrap();

    assert_eq!(bytes.len() % 4, 0);
    assert_eq!(u32_at(&bytes, 0).unwrap() as usize, bytes.len());
    assert_eq!(
        u16_at(&bytes, 4),
        Some(0x700),
        "NFNL_SUBSYS_ACCT << 8 | NEW"
    );
    assert_eq!(u16_at(&bytes, 6), Some(0x1 | 0x4 | 0x400));
    assert_eq!(u32_at(&bytes, 8), Some(7));
    assert_eq!(&bytes[16..20], &[0, 0, 0, 0], "nfgenmsg");
    assert_eq!(u16_at(&bytes, 20), Some(4 + 27 + 1), "attribute length");
    assert_eq!(u16_at(&bytes, 22), Some(ATTR_NAME));
    assert_eq!(&bytes[24..52], b"localhost_nps_accepted_pkts\0");
}

#[test]
fn names_the_kernel_cannot_hold_are_refused() {
    for name in ["", "a-name-of-thirty-two-characters!", "nul\0inside"] {
        let error = request(MSG_GET, 0, name).unwrap_err();
        assert!(matches!(error, NfacctError::InvalidName { .. }), "{name:?}");
    }
    assert!(request(MSG_GET, 0, "thirty-one-characters-exactly!!").is_ok());
}

#[test]
fn a_get_answer_yields_packets_and_bytes() {
    let mut datagram = counts_message(3, "ct_state_invalid_dropped_pkts", 42, 4200);
    datagram.extend(error_message(3, 0));

    let messages: Vec<_> = messages(&datagram).collect();

    assert_eq!(messages.len(), 2);
    let counts = decode_counts(messages[0].payload).unwrap();
    assert_eq!(
        counts,
        Counts {
            packets: 42,
            bytes: 4200
        }
    );
    assert_eq!(messages[1].status(), Some(Ok(())), "the acknowledgement");
}

#[test]
fn kernel_errors_are_told_apart_from_failures_to_talk_to_the_kernel() {
    let missing = error_message(4, ENOENT);
    let answer = messages(&missing).next().unwrap();
    assert_eq!((answer.seq, answer.status()), (4, Some(Err(ENOENT))));
    let refused = kp_netlink::Error::Kernel(io::Error::from_raw_os_error(ENOENT));
    assert!(failed("reading", "x", refused).is_not_found());
    let broken = kp_netlink::Error::Receive(io::Error::from_raw_os_error(ENOENT));
    assert!(matches!(
        failed("reading", "x", broken),
        NfacctError::Io { .. }
    ));
}

#[test]
fn a_truncated_count_is_malformed_not_a_panic() {
    let mut message = counts_message(1, "x", 1, 1);
    // Cut inside the packet count's value and fix up the header length.
    message.truncate(HEADER_LEN + NFGENMSG_LEN + 8 + 6);
    let len = message.len() as u32;
    message[..4].copy_from_slice(&len.to_ne_bytes());

    assert!(decode_counts(&message[HEADER_LEN..]).is_err());
    for cut in 0..message.len() {
        let _ = decode_counts(&message[HEADER_LEN.min(cut)..cut]);
        let _ = messages(&message[..cut]).count();
    }
}

#[derive(Debug, Default)]
struct FakeCounters(HashMap<&'static str, u64>);

impl CounterReader for FakeCounters {
    fn counts(&mut self, name: &str) -> Result<Counts, NfacctError> {
        match self.0.get(name) {
            Some(packets) => Ok(Counts {
                packets: *packets,
                bytes: packets * 100,
            }),
            None => Err(NfacctError::Kernel {
                request: "reading",
                name: name.to_owned(),
                source: io::Error::from_raw_os_error(ENOENT),
            }),
        }
    }
}

#[test]
fn the_collector_publishes_packets_of_the_counters_it_can_read() {
    let reader = FakeCounters(HashMap::from([("invalid", 42)]));
    let collector = NfacctCollector::new(
        Box::new(reader),
        vec![
            CounterMetric {
                metric: "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
                help: "packets dropped by iptables to work around conntrack problems",
                counter: "invalid",
            },
            CounterMetric {
                metric: "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
                help: "Number of packets accepted on nodeports of loopback interface",
                counter: "missing",
            },
        ],
    );
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();

    assert!(
        text.contains("kubeproxy_iptables_ct_state_invalid_dropped_packets_total 42"),
        "{text}"
    );
    assert!(!text.contains("localhost_nodeports"), "{text}");
}
