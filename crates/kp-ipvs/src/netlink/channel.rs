//! A netlink socket of one protocol in the network namespace of the thread
//! that first uses it: batches of acknowledged requests, dumps, and single
//! questions. Opened on first use, and again after a failure.

use std::io;

use netlink_sys::{Socket, SocketAddr};

use crate::netlink::wire::{self, Message, NLMSG_DONE, NLMSG_ERROR};

/// Requests sent in one datagram.
const BATCH: usize = 64;
/// Receive buffer; the kernel's dump datagrams stay below 32 KiB.
const RECEIVE_BUFFER: usize = 64 * 1024;

/// One netlink socket.
#[derive(Debug)]
pub struct Channel {
    protocol: isize,
    socket: Option<Socket>,
    seq: u32,
    /// Requests sent so far.
    pub messages: u64,
}

/// A request of a batch failed.
#[derive(Debug)]
pub struct BatchError {
    /// Its position in the batch.
    pub index: usize,
    /// The kernel's answer, or why the request could not be sent.
    pub error: io::Error,
}

/// What went wrong with a batch of requests.
#[derive(Debug, Default)]
pub struct BatchFailure {
    /// Requests the kernel refused (or that could not be encoded), in
    /// order; every other request before [`BatchFailure::broken`] was
    /// applied.
    pub refused: Vec<BatchError>,
    /// The exchange itself failed at this position (a send or receive
    /// error): whether the requests from here on were applied is unknown.
    pub broken: Option<BatchError>,
}

impl BatchFailure {
    /// The first thing that went wrong, for callers that send one request.
    pub fn into_first(self) -> BatchError {
        let refused = self.refused.into_iter().next();
        match (refused, self.broken) {
            (Some(refused), Some(broken)) if broken.index < refused.index => broken,
            (Some(refused), _) => refused,
            (None, Some(broken)) => broken,
            (None, None) => BatchError {
                index: 0,
                error: io::Error::other("a netlink batch failed without an error"),
            },
        }
    }
}

impl Channel {
    /// A channel for `protocol` (`NETLINK_GENERIC`, …), opened on first use.
    pub fn new(protocol: isize) -> Self {
        Self {
            protocol,
            socket: None,
            seq: 0,
            messages: 0,
        }
    }

    fn socket(&mut self) -> io::Result<&Socket> {
        if self.socket.is_none() {
            let mut socket = Socket::new(self.protocol)?;
            socket.bind_auto()?;
            socket.connect(&SocketAddr::new(0, 0))?;
            socket.set_cap_ack(true)?;
            self.socket = Some(socket);
        }
        self.socket
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// Sends `requests` (acknowledged), in batches, and waits for every
    /// acknowledgement. A refused request does not stop the others: every
    /// request is sent, and the refusals are returned together. A request
    /// whose lengths do not fit their fields is not sent and counts as
    /// refused.
    pub fn execute(&mut self, requests: Vec<Message>) -> Result<(), BatchFailure> {
        let mut failure = BatchFailure::default();
        let mut requests = requests.into_iter().enumerate().peekable();
        while requests.peek().is_some() {
            let mut datagram = Vec::new();
            // (sequence number, position in `requests`)
            let mut sent = Vec::new();
            for (index, request) in requests.by_ref().take(BATCH) {
                let seq = self.next_seq();
                match request.finish(seq) {
                    Ok(bytes) => {
                        datagram.extend_from_slice(&bytes);
                        sent.push((seq, index));
                    }
                    Err(error) => failure.refused.push(BatchError {
                        index,
                        error: io::Error::new(io::ErrorKind::InvalidInput, error),
                    }),
                }
            }
            if sent.is_empty() {
                continue;
            }
            self.messages += sent.len() as u64;
            let seqs: Vec<u32> = sent.iter().map(|(seq, _)| *seq).collect();
            match self.send_batch(&datagram, &seqs) {
                Ok(errors) => failure
                    .refused
                    .extend(errors.into_iter().map(|(at, error)| BatchError {
                        index: sent[at].1,
                        error,
                    })),
                Err(error) => {
                    self.socket = None;
                    failure.broken = Some(BatchError {
                        // `sent` is not empty (checked above).
                        index: sent[0].1,
                        error,
                    });
                    break;
                }
            }
        }
        failure.refused.sort_by_key(|refused| refused.index);
        if failure.refused.is_empty() && failure.broken.is_none() {
            Ok(())
        } else {
            Err(failure)
        }
    }

    /// Sends one datagram of requests and collects their answers: the
    /// refusals, by position.
    fn send_batch(&mut self, datagram: &[u8], seqs: &[u32]) -> io::Result<Vec<(usize, io::Error)>> {
        self.socket()?.send(datagram, 0)?;
        let mut pending = seqs.len();
        let mut errors = Vec::new();
        let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
        while pending > 0 {
            buffer.clear();
            self.socket()?.recv(&mut buffer, 0)?;
            for answer in wire::split(&buffer) {
                if answer.kind != NLMSG_ERROR {
                    continue;
                }
                let Some(at) = seqs.iter().position(|s| *s == answer.seq) else {
                    continue;
                };
                pending -= 1;
                if let Some(code) = wire::error_code(answer.payload) {
                    errors.push((at, io::Error::from_raw_os_error(code)));
                }
            }
        }
        errors.sort_by_key(|(at, _)| *at);
        Ok(errors)
    }

    /// Sends `request` as a dump and returns the payload (and type) of every
    /// answer message.
    pub fn dump(&mut self, request: Message) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let result = self.dump_inner(request);
        if result.is_err() {
            self.socket = None;
        }
        result
    }

    fn dump_inner(&mut self, request: Message) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let seq = self.next_seq();
        self.messages += 1;
        let bytes = request
            .finish(seq)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        self.socket()?.send(&bytes, 0)?;
        let mut answers = Vec::new();
        let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
        loop {
            buffer.clear();
            self.socket()?.recv(&mut buffer, 0)?;
            for answer in wire::split(&buffer) {
                if answer.seq != seq {
                    continue;
                }
                match answer.kind {
                    NLMSG_DONE => return Ok(answers),
                    NLMSG_ERROR => {
                        return match wire::error_code(answer.payload) {
                            Some(code) => Err(io::Error::from_raw_os_error(code)),
                            None => Ok(answers),
                        }
                    }
                    kind => answers.push((kind, answer.payload.to_vec())),
                }
            }
        }
    }

    /// Sends `request` (with `NLM_F_ACK`) and returns the payload of its
    /// answer message, waiting for the acknowledgement after it.
    pub fn ask(&mut self, request: Message) -> io::Result<Vec<u8>> {
        let seq = self.next_seq();
        self.messages += 1;
        let bytes = request
            .finish(seq)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        self.socket()?.send(&bytes, 0)?;
        let mut reply = None;
        let mut buffer = Vec::with_capacity(RECEIVE_BUFFER);
        loop {
            buffer.clear();
            self.socket()?.recv(&mut buffer, 0)?;
            for answer in wire::split(&buffer) {
                if answer.seq != seq {
                    continue;
                }
                if answer.kind != NLMSG_ERROR {
                    reply = Some(answer.payload.to_vec());
                    continue;
                }
                if let Some(code) = wire::error_code(answer.payload) {
                    return Err(io::Error::from_raw_os_error(code));
                }
                return reply.ok_or_else(|| wire::malformed("acknowledgement without an answer"));
            }
        }
    }
}
