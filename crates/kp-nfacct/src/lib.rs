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

use kp_netlink::{nfnetlink, Attributes, Channel, Message, NETLINK_NETFILTER, NLM_F_ACK};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// `NFNL_MSG_ACCT_NEW`: create a counter; also the kernel's answer to `GET`.
const MSG_NEW: u8 = 0;
/// `NFNL_MSG_ACCT_GET`.
const MSG_GET: u8 = 1;
/// `NFACCT_NAME`.
const ATTR_NAME: u16 = 1;
/// `NFACCT_PKTS`.
const ATTR_PACKETS: u16 = 2;
/// `NFACCT_BYTES`.
const ATTR_BYTES: u16 = 3;
/// `NFACCT_NAME_MAX`: the longest name, its NUL included.
pub const NAME_MAX: usize = 32;

const NLM_F_CREATE: u16 = kp_netlink::NLM_F_CREATE;
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
#[derive(Debug)]
pub struct NfacctClient {
    channel: Channel,
}

impl Default for NfacctClient {
    fn default() -> Self {
        Self::new()
    }
}

impl NfacctClient {
    /// A client that opens its socket on first use.
    pub fn new() -> Self {
        Self {
            channel: Channel::new(NETLINK_NETFILTER),
        }
    }

    /// Creates the counter `name` unless it exists (`nfacct add NAME`).
    pub fn ensure(&mut self, name: &str) -> Result<(), NfacctError> {
        let request = request(MSG_NEW, NLM_F_CREATE, name)?;
        match self.channel.execute_one(request) {
            Ok(()) => Ok(()),
            Err(error) if error.errno() == Some(EBUSY) => Ok(()),
            Err(error) => Err(failed("creating", name, error)),
        }
    }

    /// The counts of `name` (`nfacct get NAME`).
    pub fn get(&mut self, name: &str) -> Result<Counts, NfacctError> {
        let request = request(MSG_GET, 0, name)?;
        let reply = self
            .channel
            .ask(request)
            .map_err(|error| failed("reading", name, error))?;
        let malformed = |reason| NfacctError::Malformed {
            request: "reading",
            name: name.to_owned(),
            reason,
        };
        if reply.kind != nfnetlink::message_type(nfnetlink::SUBSYS_ACCT, MSG_NEW) {
            return Err(malformed("the answer is not a counter"));
        }
        decode_counts(reply.payload()).map_err(malformed)
    }
}

/// The request `msg` for counter `name`, with `flags` besides
/// `NLM_F_REQUEST | NLM_F_ACK`.
fn request(msg: u8, flags: u16, name: &str) -> Result<Message, NfacctError> {
    if name.is_empty() || name.len() >= NAME_MAX || name.contains('\0') {
        return Err(NfacctError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(nfnetlink::request(
        nfnetlink::SUBSYS_ACCT,
        msg,
        nfnetlink::NFPROTO_UNSPEC,
        NLM_F_ACK | flags,
    )
    .string(ATTR_NAME, name))
}

/// `request` of counter `name` failed with `error`, in this crate's words.
fn failed(request: &'static str, name: &str, error: kp_netlink::Error) -> NfacctError {
    let name = name.to_owned();
    match error {
        kp_netlink::Error::Open { source, .. } => NfacctError::OpenSocket(source),
        kp_netlink::Error::Kernel(source) => NfacctError::Kernel {
            request,
            name,
            source,
        },
        kp_netlink::Error::Malformed(reason) => NfacctError::Malformed {
            request,
            name,
            reason,
        },
        other => NfacctError::Io {
            request,
            name,
            source: other.into(),
        },
    }
}

/// The packet and byte counts among the attributes after the nfgenmsg.
fn decode_counts(payload: &[u8]) -> Result<Counts, &'static str> {
    let (_, attributes) = nfnetlink::split_payload(payload).ok_or("no nfgenmsg")?;
    let (mut packets, mut bytes) = (None, None);
    let count = |value: &[u8]| kp_netlink::read_be_u64(value).ok_or("a count is not 8 bytes");
    for (kind, value) in Attributes::new(attributes) {
        match kind {
            ATTR_PACKETS => packets = Some(count(value)?),
            ATTR_BYTES => bytes = Some(count(value)?),
            _ => {}
        }
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
