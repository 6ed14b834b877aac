//! Named packet counters of netfilter's accounting subsystem (`nfacct`),
//! as the `nfacct` tool manages them: `nfacct add NAME`, `nfacct get NAME`.
//!
//! The iptables mode counts two kinds of packets with them, as upstream
//! does: packets accepted on localhost NodePorts and packets dropped as
//! conntrack-INVALID. The counters are created at start ([`NfacctClient::ensure`]);
//! rules then name them with `-m nfacct --nfacct-name NAME`, and the metrics
//! server reads them on every scrape ([`NfacctCollector`]). Counters belong to
//! the network namespace of the socket, i.e. of the thread that opened it.
//!
//! The messages on the wire (`NETLINK_NETFILTER`, subsystem
//! `NFNL_SUBSYS_ACCT`; lengths include their header, attributes are padded
//! to 4 bytes, integers in attribute values are big endian):
//!
//! ```text
//! nlmsghdr   len u32 | type u16 = (NFNL_SUBSYS_ACCT=7) << 8 | msg
//!            | flags u16 | seq u32 | pid u32
//!            msg: NFNL_MSG_ACCT_NEW=0, NFNL_MSG_ACCT_GET=1
//! nfgenmsg   family u8 = AF_UNSPEC | version u8 = 0 | res_id u16 = 0
//! NFACCT_NAME=1    NUL-terminated, at most 32 bytes with the NUL
//! NFACCT_PKTS=2    u64
//! NFACCT_BYTES=3   u64
//! ```
//!
//! `NEW` with `NLM_F_CREATE | NLM_F_ACK` creates a counter; the kernel
//! answers `EBUSY` when it exists already. `GET` with `NLM_F_ACK` and the
//! name answers one `NEW` message carrying the counts, or `ENOENT`.

use std::io;
use std::sync::{Mutex, PoisonError};

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// `NFNL_SUBSYS_ACCT`.
const SUBSYS_ACCT: u16 = 7;
/// `NFNL_MSG_ACCT_NEW`: create a counter; also the kernel's answer to `GET`.
const MSG_NEW: u16 = 0;
/// `NFNL_MSG_ACCT_GET`.
const MSG_GET: u16 = 1;
/// `NFACCT_NAME`.
const ATTR_NAME: u16 = 1;
/// `NFACCT_PKTS`.
const ATTR_PACKETS: u16 = 2;
/// `NFACCT_BYTES`.
const ATTR_BYTES: u16 = 3;
/// `NFACCT_NAME_MAX`: the longest name, its NUL included.
pub const NAME_MAX: usize = 32;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const HEADER_LEN: usize = 16;
const NFGENMSG_LEN: usize = 4;
const ENOENT: i32 = 2;
const EBUSY: i32 = 16;

/// What went wrong with a counter.
#[derive(Debug, thiserror::Error)]
pub enum NfacctError {
    /// The name is empty or longer than the kernel allows.
    #[error("nfacct counter name {name:?} must have 1 to {} bytes", NAME_MAX - 1)]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// The netlink socket could not be opened (no `NETLINK_NETFILTER`).
    #[error("opening a netfilter netlink socket failed")]
    OpenSocket(#[source] io::Error),
    /// Sending or receiving failed.
    #[error("{request} of nfacct counter {name}: talking to the kernel failed")]
    Io {
        /// `creating` or `reading`.
        request: &'static str,
        /// The counter.
        name: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the request (`EPERM` without `CAP_NET_ADMIN`,
    /// `ENOENT` for a counter that does not exist, `EOPNOTSUPP` without
    /// `nfnetlink_acct`).
    #[error("{request} of nfacct counter {name} failed")]
    Kernel {
        /// `creating` or `reading`.
        request: &'static str,
        /// The counter.
        name: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer could not be understood.
    #[error("{request} of nfacct counter {name}: the kernel's answer is malformed: {reason}")]
    Malformed {
        /// `creating` or `reading`.
        request: &'static str,
        /// The counter.
        name: String,
        /// What was wrong.
        reason: &'static str,
    },
}

impl NfacctError {
    /// True when the counter does not exist (`ENOENT`).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Kernel { source, .. } if source.raw_os_error() == Some(ENOENT))
    }
}

/// The counts of one counter (`nfacct get NAME`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Packets counted.
    pub packets: u64,
    /// Bytes counted.
    pub bytes: u64,
}

/// The nfacct counters of the network namespace in which the socket is
/// opened (on first use; opened again after a failure).
#[derive(Debug, Default)]
pub struct NfacctClient {
    socket: Option<Socket>,
    next_seq: u32,
}

impl NfacctClient {
    /// A client that opens its socket on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates the counter `name` unless it exists (`nfacct add NAME`).
    pub fn ensure(&mut self, name: &str) -> Result<(), NfacctError> {
        let seq = self.seq();
        let request = encode_request(MSG_NEW, NLM_F_CREATE, seq, name)?;
        match self.exchange("creating", name, &request, seq) {
            Ok(_) => Ok(()),
            Err(NfacctError::Kernel { source, .. }) if source.raw_os_error() == Some(EBUSY) => {
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// The counts of `name` (`nfacct get NAME`).
    pub fn get(&mut self, name: &str) -> Result<Counts, NfacctError> {
        let seq = self.seq();
        let request = encode_request(MSG_GET, 0, seq, name)?;
        let counts = self.exchange("reading", name, &request, seq)?;
        counts.ok_or_else(|| NfacctError::Malformed {
            request: "reading",
            name: name.to_owned(),
            reason: "no counts before the acknowledgement",
        })
    }

    fn seq(&mut self) -> u32 {
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        self.next_seq
    }

    fn socket(&mut self) -> Result<&Socket, NfacctError> {
        if self.socket.is_none() {
            let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NfacctError::OpenSocket)?;
            socket.bind_auto().map_err(NfacctError::OpenSocket)?;
            socket
                .connect(&SocketAddr::new(0, 0))
                .map_err(NfacctError::OpenSocket)?;
            self.socket = Some(socket);
        }
        self.socket
            .as_ref()
            .ok_or_else(|| NfacctError::OpenSocket(io::ErrorKind::NotConnected.into()))
    }

    /// Sends one request and reads until its acknowledgement; returns the
    /// counts of a `NEW` message answering it, if any.
    fn exchange(
        &mut self,
        request: &'static str,
        name: &str,
        bytes: &[u8],
        seq: u32,
    ) -> Result<Option<Counts>, NfacctError> {
        let result = self.try_exchange(request, name, bytes, seq);
        if matches!(
            result,
            Err(NfacctError::Io { .. } | NfacctError::Malformed { .. })
        ) {
            // Unread answers may be left in the socket: start afresh.
            self.socket = None;
        }
        result
    }

    fn try_exchange(
        &mut self,
        request: &'static str,
        name: &str,
        bytes: &[u8],
        seq: u32,
    ) -> Result<Option<Counts>, NfacctError> {
        let io_error = |source| NfacctError::Io {
            request,
            name: name.to_owned(),
            source,
        };
        let socket = self.socket()?;
        socket.send(bytes, 0).map_err(io_error)?;
        let mut counts = None;
        let mut buffer = Vec::with_capacity(8192);
        loop {
            buffer.clear();
            socket.recv(&mut buffer, 0).map_err(io_error)?;
            for message in split_messages(&buffer) {
                match decode_answer(message, seq) {
                    Ok(Answer::Counts(found)) => counts = Some(found),
                    Ok(Answer::Done(None)) => return Ok(counts),
                    Ok(Answer::Done(Some(source))) => {
                        return Err(NfacctError::Kernel {
                            request,
                            name: name.to_owned(),
                            source,
                        })
                    }
                    Ok(Answer::Other) => {}
                    Err(reason) => {
                        return Err(NfacctError::Malformed {
                            request,
                            name: name.to_owned(),
                            reason,
                        })
                    }
                }
            }
        }
    }
}

/// One decoded message of the kernel's answer to request `seq`.
#[derive(Debug)]
enum Answer {
    /// The counts of the counter asked for.
    Counts(Counts),
    /// The acknowledgement (`None`) or error ending the answer.
    Done(Option<io::Error>),
    /// A message about another request, or of another type.
    Other,
}

/// The request `msg` for counter `name`, with `flags` besides
/// `NLM_F_REQUEST | NLM_F_ACK`.
fn encode_request(msg: u16, flags: u16, seq: u32, name: &str) -> Result<Vec<u8>, NfacctError> {
    if name.is_empty() || name.len() >= NAME_MAX || name.contains('\0') {
        return Err(NfacctError::InvalidName {
            name: name.to_owned(),
        });
    }
    let name_len = name.len() + 1;
    let attribute_len = 4 + name_len;
    let total = HEADER_LEN + NFGENMSG_LEN + padded(attribute_len);
    let mut bytes = Vec::with_capacity(total);
    // Lengths are bounded by NAME_MAX, so the casts cannot truncate.
    bytes.extend_from_slice(&(total as u32).to_ne_bytes());
    bytes.extend_from_slice(&((SUBSYS_ACCT << 8) | msg).to_ne_bytes());
    bytes.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | flags).to_ne_bytes());
    bytes.extend_from_slice(&seq.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: AF_UNSPEC, NFNETLINK_V0, res_id 0.
    bytes.extend_from_slice(&[0, 0, 0, 0]);
    bytes.extend_from_slice(&(attribute_len as u16).to_ne_bytes());
    bytes.extend_from_slice(&ATTR_NAME.to_ne_bytes());
    bytes.extend_from_slice(name.as_bytes());
    bytes.resize(total, 0);
    Ok(bytes)
}

fn padded(len: usize) -> usize {
    (len + 3) & !3
}

/// The netlink messages of one datagram; a truncated tail is dropped.
fn split_messages(mut datagram: &[u8]) -> Vec<&[u8]> {
    let mut messages = Vec::new();
    while datagram.len() >= HEADER_LEN {
        let len = u32_at(datagram, 0).unwrap_or(0) as usize;
        if len < HEADER_LEN || len > datagram.len() {
            break;
        }
        messages.push(&datagram[..len]);
        datagram = &datagram[padded(len).min(datagram.len())..];
    }
    messages
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn decode_answer(message: &[u8], seq: u32) -> Result<Answer, &'static str> {
    let kind = u16_at(message, 4).ok_or("short header")?;
    if u32_at(message, 8) != Some(seq) {
        return Ok(Answer::Other);
    }
    match kind {
        NLMSG_ERROR => {
            let code = u32_at(message, HEADER_LEN).ok_or("short error message")? as i32;
            let error = (code != 0).then(|| io::Error::from_raw_os_error(-code));
            Ok(Answer::Done(error))
        }
        NLMSG_DONE => Ok(Answer::Done(None)),
        kind if kind == (SUBSYS_ACCT << 8) | MSG_NEW => {
            decode_counts(&message[HEADER_LEN.min(message.len())..]).map(Answer::Counts)
        }
        _ => Ok(Answer::Other),
    }
}

/// The packet and byte counts among the attributes after the nfgenmsg.
fn decode_counts(body: &[u8]) -> Result<Counts, &'static str> {
    let mut attributes = body.get(NFGENMSG_LEN..).ok_or("no nfgenmsg")?;
    let (mut packets, mut bytes) = (None, None);
    while attributes.len() >= 4 {
        let len = usize::from(u16_at(attributes, 0).ok_or("short attribute")?);
        // The top bits are the nested and byte-order flags.
        let kind = u16_at(attributes, 2).ok_or("short attribute")? & 0x3fff;
        let value = attributes
            .get(4..len)
            .ok_or("attribute longer than its message")?;
        let big_endian_u64 = || -> Result<u64, &'static str> {
            let array: [u8; 8] = value.try_into().map_err(|_| "a count is not 8 bytes")?;
            Ok(u64::from_be_bytes(array))
        };
        match kind {
            ATTR_PACKETS => packets = Some(big_endian_u64()?),
            ATTR_BYTES => bytes = Some(big_endian_u64()?),
            _ => {}
        }
        attributes = attributes.get(padded(len).max(4)..).unwrap_or_default();
    }
    Ok(Counts {
        packets: packets.ok_or("no packet count")?,
        bytes: bytes.ok_or("no byte count")?,
    })
}

/// Reads counters for [`NfacctCollector`]; the real one is [`NfacctClient`].
pub trait CounterReader: Send + std::fmt::Debug {
    /// The counts of counter `name`.
    fn counts(&mut self, name: &str) -> Result<Counts, NfacctError>;
}

impl CounterReader for NfacctClient {
    fn counts(&mut self, name: &str) -> Result<Counts, NfacctError> {
        self.get(name)
    }
}

/// One counter published as a Prometheus counter of its packets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterMetric {
    /// The metric's name, `_total` included.
    pub metric: &'static str,
    /// Its help text.
    pub help: &'static str,
    /// The nfacct counter whose packets it publishes.
    pub counter: &'static str,
}

/// Publishes nfacct counters' packet counts on every scrape. A counter that
/// cannot be read is left out of that scrape (and logged), as upstream does.
#[derive(Debug)]
pub struct NfacctCollector {
    reader: Mutex<Box<dyn CounterReader>>,
    metrics: Vec<CounterMetric>,
}

impl NfacctCollector {
    /// A collector publishing `metrics`, read through `reader`.
    pub fn new(reader: Box<dyn CounterReader>, metrics: Vec<CounterMetric>) -> Self {
        Self {
            reader: Mutex::new(reader),
            metrics,
        }
    }
}

impl Collector for NfacctCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A reader left mid-call by a panic holds no state worth keeping.
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        for metric in &self.metrics {
            let counts = match reader.counts(metric.counter) {
                Ok(counts) => counts,
                Err(error) => {
                    tracing::debug!(counter = metric.counter, %error, "cannot read nfacct counter");
                    continue;
                }
            };
            let counter = ConstCounter::new(counts.packets);
            // Counters are declared without `_total` and sampled with it.
            let name = metric
                .metric
                .strip_suffix("_total")
                .unwrap_or(metric.metric);
            let sample =
                encoder.encode_descriptor(name, metric.help, None, counter.metric_type())?;
            counter.encode(sample)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
