//! [`Channel`]: one netlink socket of one protocol and the exchanges over
//! it: acknowledged requests in datagrams that fit, nfnetlink batches,
//! dumps, and single questions.

use std::collections::HashMap;
use std::io;

use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::message::Request;
use crate::nfnetlink;
use crate::parse::{messages, Messages, OwnedReply, Reply};
use crate::{Error, NLM_F_ACK};

/// Requests sent in one datagram at most: the kernel queues all their
/// answers at once, and 64 of them stay far below the receive buffer.
pub const DATAGRAM_MESSAGES_MAX: usize = 64;
/// Bytes of requests in one datagram at most (a longer request is sent
/// alone): well below the default send buffer, which bounds a datagram.
pub const DATAGRAM_BYTES_MAX: usize = 64 << 10;
/// How long an answer may take. The kernel answers while `send` runs, so
/// this only bounds a kernel that never answers.
pub const ANSWER_TIMEOUT_SECS: i64 = 30;
/// Receive buffer: the kernel never sends a netlink datagram larger than
/// 32 KiB to a reader that offers more (`netlink_dump`).
const RECEIVE_BUFFER_BYTES: usize = 64 << 10;
/// A datagram longer than this raises the socket's send buffer to fit it.
const SEND_BUFFER_DEFAULT_BYTES: usize = 200_000;

/// One netlink socket of one protocol, opened on first use in the network
/// namespace of the calling thread, and opened again after an exchange
/// failed (answers left unread must not answer the next request).
#[derive(Debug)]
pub struct Channel {
    protocol: isize,
    socket: Option<Socket>,
    seq: u32,
    /// Requests sent so far.
    messages: u64,
    /// Answers are read into this, kept from one exchange to the next.
    buffer: Vec<u8>,
    buffer_len: usize,
    /// Receive without blocking: see [`Channel::answers_queued`].
    queued: bool,
}

/// A request that was refused or not sent, or the point where an exchange
/// broke.
#[derive(Debug)]
pub struct BatchError {
    /// Its position among the requests.
    pub index: usize,
    /// The kernel's answer, or why the request could not be sent.
    pub error: Error,
}

/// What went wrong with a list of requests.
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
                error: Error::Malformed("a netlink exchange failed without an error"),
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
            buffer: Vec::new(),
            buffer_len: RECEIVE_BUFFER_BYTES,
            queued: false,
        }
    }

    /// Reads answers without blocking, for requests the kernel answers
    /// inside `send` (all of netfilter's and rtnetlink's single requests):
    /// an answer not queued by then is an error instead of a wait.
    #[must_use]
    pub fn answers_queued(mut self) -> Self {
        self.queued = true;
        self
    }

    /// Reads answers into a buffer of `bytes` (64 KiB unless set): enough
    /// for answers of one message each, where many channels are open.
    #[must_use]
    pub fn receive_buffer(mut self, bytes: usize) -> Self {
        self.buffer_len = bytes;
        self
    }

    /// Requests sent so far.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Closes the socket: the next exchange opens a fresh one.
    pub fn reset(&mut self) {
        self.socket = None;
    }

    /// Sends `requests`, in datagrams that fit, each asking for an
    /// acknowledgement, and waits for every answer. A refused request does
    /// not stop the others: every request is sent, and the refusals are
    /// returned together. A request whose lengths do not fit their fields
    /// is not sent and counts as refused.
    pub fn execute<R: Request>(
        &mut self,
        requests: impl IntoIterator<Item = R>,
    ) -> Result<(), BatchFailure> {
        let mut failure = BatchFailure::default();
        let mut datagram = Datagram::default();
        for (index, request) in requests.into_iter().enumerate() {
            let seq = self.next_seq();
            let bytes = match request.encode(seq) {
                Ok(bytes) => bytes,
                Err(error) => {
                    failure.refused.push(BatchError {
                        index,
                        error: error.into(),
                    });
                    continue;
                }
            };
            if !datagram.fits(bytes.len()) {
                self.flush(std::mem::take(&mut datagram), &mut failure);
                if failure.broken.is_some() {
                    break;
                }
            }
            datagram.push(index, seq, bytes);
        }
        if failure.broken.is_none() {
            self.flush(datagram, &mut failure);
        }
        failure.refused.sort_by_key(|refused| refused.index);
        if failure.refused.is_empty() && failure.broken.is_none() {
            Ok(())
        } else {
            Err(failure)
        }
    }

    /// Sends one request asking for an acknowledgement; its refusal is the
    /// error.
    pub fn execute_one<R: Request>(&mut self, request: R) -> Result<(), Error> {
        self.execute([request])
            .map_err(|failure| failure.into_first().error)
    }

    /// Sends `requests` as one nfnetlink batch of `subsystem`, in one
    /// datagram, each asking for an acknowledgement. The kernel applies a
    /// batch whole or not at all: a refusal of the batch as a whole
    /// (answered to its begin marker) is reported at index 0 with nothing
    /// else. An empty batch is not sent.
    pub fn execute_batch<R: Request>(
        &mut self,
        subsystem: u8,
        requests: impl IntoIterator<Item = R>,
    ) -> Result<(), BatchFailure> {
        let mut requests = requests.into_iter().peekable();
        if requests.peek().is_none() {
            return Ok(());
        }
        let mut failure = BatchFailure::default();
        let mut datagram = Datagram::default();
        let begin_seq = self.next_seq();
        let begin = nfnetlink::batch_begin(subsystem)
            .finish(begin_seq)
            .map_err(|error| refused_at(0, error.into()))?;
        datagram.marker(begin_seq, begin);
        for (index, request) in requests.enumerate() {
            let seq = self.next_seq();
            match request.encode(seq) {
                Ok(bytes) => datagram.push(index, seq, bytes),
                Err(error) => failure.refused.push(BatchError {
                    index,
                    error: error.into(),
                }),
            }
        }
        if !failure.refused.is_empty() {
            // A batch is a transaction: none of it is sent when a part of
            // it cannot be.
            return Err(failure);
        }
        let end_seq = self.next_seq();
        let end = nfnetlink::batch_end(subsystem)
            .finish(end_seq)
            .map_err(|error| refused_at(0, error.into()))?;
        datagram.marker(end_seq, end);
        self.flush(datagram, &mut failure);
        if failure.refused.is_empty() && failure.broken.is_none() {
            Ok(())
        } else {
            Err(failure)
        }
    }

    /// Sends `request` as a dump (the caller sets `NLM_F_DUMP`) and hands
    /// every answer message to `on_reply`, until `NLMSG_DONE`. A refusal,
    /// before or during the dump, is the error.
    pub fn dump<R: Request>(
        &mut self,
        request: R,
        mut on_reply: impl FnMut(Reply<'_>),
    ) -> Result<(), Error> {
        let result = self.dump_inner(request, &mut on_reply);
        if result.as_ref().is_err_and(Error::is_broken) {
            self.socket = None;
        }
        result
    }

    /// [`Channel::dump`], with the answers collected.
    pub fn dump_all<R: Request>(&mut self, request: R) -> Result<Vec<OwnedReply>, Error> {
        let mut replies = Vec::new();
        self.dump(request, |reply| replies.push(reply.to_owned()))?;
        Ok(replies)
    }

    /// Sends `request` asking for an acknowledgement and returns the
    /// message answering it, read up to the acknowledgement.
    pub fn ask<R: Request>(&mut self, request: R) -> Result<OwnedReply, Error> {
        let result = self.ask_inner(request);
        if result.as_ref().is_err_and(Error::is_broken) {
            self.socket = None;
        }
        result
    }

    fn ask_inner<R: Request>(&mut self, request: R) -> Result<OwnedReply, Error> {
        let seq = self.next_seq();
        let mut bytes = request.encode(seq)?;
        ask_ack(&mut bytes);
        self.send(&bytes, 1)?;
        let mut reader = AskReader { seq, reply: None };
        let mut buffer = std::mem::take(&mut self.buffer);
        let result = loop {
            match self.receive(&mut buffer) {
                Ok(received) => {
                    if let Some(answer) = reader.read(&buffer[..received]) {
                        break answer;
                    }
                }
                Err(error) => break Err(error),
            }
        };
        self.buffer = buffer;
        result
    }

    fn dump_inner<R: Request>(
        &mut self,
        request: R,
        on_reply: &mut impl FnMut(Reply<'_>),
    ) -> Result<(), Error> {
        let seq = self.next_seq();
        let bytes = request.encode(seq)?;
        self.send(&bytes, 1)?;
        let mut reader = DumpReader { seq };
        let mut buffer = std::mem::take(&mut self.buffer);
        let result = loop {
            match self.receive(&mut buffer) {
                Ok(received) => match reader.read(&buffer[..received], on_reply) {
                    Ok(true) => break Ok(()),
                    Ok(false) => {}
                    Err(error) => break Err(error),
                },
                Err(error) => break Err(error),
            }
        };
        self.buffer = buffer;
        result
    }

    /// Sends one datagram of acknowledged requests and collects their
    /// answers into `failure`; a broken exchange is reported at the
    /// position of its first request.
    fn flush(&mut self, mut datagram: Datagram, failure: &mut BatchFailure) {
        let Some(first) = datagram.first else {
            return;
        };
        let result = self
            .send(&datagram.bytes, datagram.acks.len() as u64)
            .and_then(|()| self.collect(&mut datagram.acks));
        failure.refused.append(&mut datagram.acks.refused);
        if let Err(error) = result {
            self.socket = None;
            failure.broken = Some(BatchError {
                index: first,
                error,
            });
        }
    }

    fn collect(&mut self, acks: &mut Acks) -> Result<(), Error> {
        let mut buffer = std::mem::take(&mut self.buffer);
        let mut result = Ok(());
        while !acks.complete() {
            match self.receive(&mut buffer) {
                Ok(received) => {
                    if let Err(error) = acks.read(&buffer[..received]) {
                        result = Err(error);
                        break;
                    }
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        self.buffer = buffer;
        result
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn socket(&mut self) -> Result<&Socket, Error> {
        let socket = match self.socket.take() {
            Some(socket) => socket,
            None => open(self.protocol)?,
        };
        Ok(self.socket.insert(socket))
    }

    fn send(&mut self, datagram: &[u8], requests: u64) -> Result<(), Error> {
        let socket = self.socket()?;
        if datagram.len() > SEND_BUFFER_DEFAULT_BYTES {
            // Past net.core.wmem_max this needs CAP_NET_ADMIN, which the
            // proxy has; the kernel takes a batch from one datagram only.
            setsockopt(socket, sockopt::SndBufForce, &(datagram.len() + 4096))
                .map_err(|errno| Error::Send(errno.into()))?;
        }
        socket.send(datagram, 0).map_err(Error::Send)?;
        self.messages += requests;
        Ok(())
    }

    /// Receives one datagram into `buffer` and returns its length. A
    /// datagram longer than the buffer, or answers the kernel dropped
    /// (`ENOBUFS`), are errors: each lost answer could have been a refusal.
    fn receive(&mut self, buffer: &mut Vec<u8>) -> Result<usize, Error> {
        buffer.resize(self.buffer_len, 0);
        let flags = if self.queued {
            nix::libc::MSG_DONTWAIT
        } else {
            0
        } | nix::libc::MSG_TRUNC;
        let queued = self.queued;
        let socket = self.socket()?;
        let received = socket
            .recv(&mut &mut buffer[..], flags)
            .map_err(|error| receive_error(error, queued))?;
        if received > buffer.len() {
            return Err(Error::Receive(io::Error::other(format!(
                "an answer of {received} bytes was cut to the {} bytes of the buffer",
                buffer.len()
            ))));
        }
        Ok(received)
    }
}

/// One datagram of requests under construction, and the answers it waits
/// for.
#[derive(Debug, Default)]
struct Datagram {
    bytes: Vec<u8>,
    acks: Acks,
    /// Position of its first request.
    first: Option<usize>,
}

impl Datagram {
    /// Whether a request of `len` bytes still fits: at most
    /// [`DATAGRAM_MESSAGES_MAX`] requests and [`DATAGRAM_BYTES_MAX`] bytes,
    /// except that a longer request goes alone.
    fn fits(&self, len: usize) -> bool {
        self.acks.is_empty()
            || (self.acks.len() < DATAGRAM_MESSAGES_MAX
                && self.bytes.len() + len <= DATAGRAM_BYTES_MAX)
    }

    /// Adds request `index`, encoded with `seq`, asking for its
    /// acknowledgement.
    fn push(&mut self, index: usize, seq: u32, mut bytes: Vec<u8>) {
        ask_ack(&mut bytes);
        self.bytes.extend_from_slice(&bytes);
        self.acks.expect(seq, index);
        self.first.get_or_insert(index);
    }

    /// Adds a batch marker: not acknowledged, but a refusal of it is the
    /// batch's.
    fn marker(&mut self, seq: u32, bytes: Vec<u8>) {
        self.bytes.extend_from_slice(&bytes);
        self.acks.whole(seq);
        self.first.get_or_insert(0);
    }
}

/// The answers a datagram of requests waits for, by sequence number.
#[derive(Debug, Default)]
struct Acks {
    /// Requests not answered yet: sequence number → position.
    pending: HashMap<u32, usize>,
    /// Batch markers: a refusal of one is a refusal of the whole batch.
    whole: Vec<u32>,
    /// The requests refused so far, in the order of their answers.
    refused: Vec<BatchError>,
    /// The batch was refused as a whole.
    refused_whole: bool,
}

impl Acks {
    fn expect(&mut self, seq: u32, index: usize) {
        self.pending.insert(seq, index);
    }

    fn whole(&mut self, seq: u32) {
        self.whole.push(seq);
    }

    fn len(&self) -> usize {
        self.pending.len()
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn complete(&self) -> bool {
        self.refused_whole || self.pending.is_empty()
    }

    /// Reads the answers in one datagram; answers to other requests (late
    /// answers of an exchange given up on) are skipped.
    fn read(&mut self, datagram: &[u8]) -> Result<(), Error> {
        let mut messages = messages(datagram);
        for message in messages.by_ref() {
            let Some(status) = message.status() else {
                continue;
            };
            if let Some(index) = self.pending.remove(&message.seq) {
                if let Err(code) = status {
                    self.refused.push(BatchError {
                        index,
                        error: Error::Kernel(io::Error::from_raw_os_error(code)),
                    });
                }
            } else if let (true, Err(code)) = (self.whole.contains(&message.seq), status) {
                self.refused_whole = true;
                self.refused.push(BatchError {
                    index: 0,
                    error: Error::Kernel(io::Error::from_raw_os_error(code)),
                });
            }
        }
        whole(&messages)
    }
}

/// Reads the answer to one question.
#[derive(Debug)]
struct AskReader {
    seq: u32,
    /// The message answering it, once read.
    reply: Option<OwnedReply>,
}

impl AskReader {
    /// Reads the messages of `datagram` answering the question; the
    /// answer once its acknowledgement or refusal was read.
    fn read(&mut self, datagram: &[u8]) -> Option<Result<OwnedReply, Error>> {
        let mut messages = messages(datagram);
        for message in messages.by_ref().filter(|m| m.seq == self.seq) {
            match message.status() {
                None => self.reply = Some(message.to_owned()),
                Some(Ok(())) => {
                    return Some(
                        self.reply
                            .take()
                            .ok_or(Error::Malformed("an acknowledgement without an answer")),
                    )
                }
                Some(Err(code)) => {
                    return Some(Err(Error::Kernel(io::Error::from_raw_os_error(code))))
                }
            }
        }
        whole(&messages).err().map(Err)
    }
}

/// Reads the answers of one dump.
#[derive(Debug)]
struct DumpReader {
    seq: u32,
}

impl DumpReader {
    /// Hands the messages of `datagram` answering the dump to `on_reply`;
    /// true once the dump is complete.
    fn read(
        &mut self,
        datagram: &[u8],
        on_reply: &mut impl FnMut(Reply<'_>),
    ) -> Result<bool, Error> {
        let mut messages = messages(datagram);
        for message in messages.by_ref().filter(|m| m.seq == self.seq) {
            match message.status() {
                None => on_reply(message),
                Some(Ok(())) => return Ok(true),
                Some(Err(code)) => return Err(Error::Kernel(io::Error::from_raw_os_error(code))),
            }
        }
        whole(&messages).map(|()| false)
    }
}

/// A socket of `protocol`, connected to the kernel, with acknowledgements
/// that carry only the refused request's header (`NETLINK_CAP_ACK`: an
/// error need not copy a request of hundreds of kilobytes back).
fn open(protocol: isize) -> Result<Socket, Error> {
    let step = |step: &'static str| move |source| Error::Open { step, source };
    let mut socket = Socket::new(protocol).map_err(step("creating the socket"))?;
    socket.bind_auto().map_err(step("binding it"))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(step("connecting it to the kernel"))?;
    socket
        .set_cap_ack(true)
        .map_err(step("asking for short acknowledgements"))?;
    setsockopt(
        &socket,
        sockopt::ReceiveTimeout,
        &TimeVal::seconds(ANSWER_TIMEOUT_SECS),
    )
    .map_err(|errno| Error::Open {
        step: "setting its receive timeout",
        source: errno.into(),
    })?;
    Ok(socket)
}

/// An error when the walk over a datagram's messages ended inside one.
fn whole(messages: &Messages<'_>) -> Result<(), Error> {
    if messages.truncated() {
        Err(Error::Malformed("a datagram ends inside a message"))
    } else {
        Ok(())
    }
}

/// Sets `NLM_F_ACK` in an encoded request: every request of an exchange is
/// answered, so that none is applied or refused unseen.
fn ask_ack(bytes: &mut [u8]) {
    if let Some(flags) = bytes.get_mut(6..8) {
        let value = u16::from_ne_bytes([flags[0], flags[1]]) | NLM_F_ACK;
        flags.copy_from_slice(&value.to_ne_bytes());
    }
}

fn refused_at(index: usize, error: Error) -> BatchFailure {
    BatchFailure {
        refused: vec![BatchError { index, error }],
        broken: None,
    }
}

/// A failed receive, said in the words of what it means.
fn receive_error(error: io::Error, queued: bool) -> Error {
    Error::Receive(match error.kind() {
        io::ErrorKind::WouldBlock if queued => io::Error::new(
            io::ErrorKind::WouldBlock,
            "the kernel's answer was not queued when the request was sent",
        ),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the kernel did not answer within {ANSWER_TIMEOUT_SECS} s"),
        ),
        _ if error.raw_os_error() == Some(nix::libc::ENOBUFS) => io::Error::new(
            error.kind(),
            format!(
                "the kernel's answers overflowed the socket's buffer ({error}); whether each request was applied is unknown"
            ),
        ),
        _ => error,
    })
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod tests;
