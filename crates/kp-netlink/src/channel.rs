//! [`Channel`]: one netlink socket of one protocol and the exchanges over
//! it: acknowledged requests in datagrams that fit, nfnetlink batches,
//! dumps, and single questions.

use std::collections::HashMap;
use std::io;

use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::message::{LengthError, Message, Request};
use crate::nfnetlink::Batch;
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
/// Receive buffer space wanted per answer asked for.
const ANSWER_BYTES: usize = 1024;
/// About the kernel's default receive buffer (`net.core.rmem_default`).
const RECEIVE_BUFFER_DEFAULT_BYTES: usize = 208 << 10;
/// The least a raised receive buffer is: room for the answers to refused
/// requests that did not ask, too.
const RECEIVE_BUFFER_MIN_RAISED_BYTES: usize = 1 << 20;
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
    /// The receive buffer size set on the socket, once raised.
    receive_buffer_set: usize,
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
    /// The kernel refused an nfnetlink batch as a whole (the answer to its
    /// begin marker: `ERESTART` for a batch bound to a generation that
    /// moved on, `EOPNOTSUPP` without the subsystem): nothing of it was
    /// applied.
    pub refused_whole: Option<Error>,
}

impl BatchFailure {
    /// `Ok` when nothing went wrong; refusals in the order of the requests.
    fn into_result(mut self) -> Result<(), Self> {
        self.refused.sort_by_key(|refused| refused.index);
        if self.refused.is_empty() && self.broken.is_none() && self.refused_whole.is_none() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// The first thing that went wrong, for callers that send one request.
    pub fn into_first(self) -> BatchError {
        if let Some(error) = self.refused_whole {
            return BatchError { index: 0, error };
        }
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
            receive_buffer_set: 0,
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
        self.close();
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
        failure.into_result()
    }

    /// Sends one request asking for an acknowledgement; its refusal is the
    /// error.
    pub fn execute_one<R: Request>(&mut self, request: R) -> Result<(), Error> {
        self.execute([request])
            .map_err(|failure| failure.into_first().error)
    }

    /// Sends `requests` as one nfnetlink `batch`, in one datagram. The
    /// kernel applies a batch whole or not at all, and answers every
    /// refused request whatever its flags, and the last one only after
    /// every other: so every request asks for an acknowledgement while
    /// there are at most [`Batch::acks_max`], otherwise the last one only.
    /// Refusals are reported by position; a refusal of the batch as a whole
    /// in [`BatchFailure::refused_whole`]. An empty batch is not sent,
    /// unless it is bound to a generation: then the kernel's answer to its
    /// begin marker says whether the generation still is that one.
    pub fn execute_batch<R: Request>(
        &mut self,
        batch: &Batch,
        requests: impl IntoIterator<Item = R>,
    ) -> Result<(), BatchFailure> {
        let mut encoded = EncodedBatch::new();
        let mut failure = BatchFailure::default();
        for (index, request) in requests.into_iter().enumerate() {
            match request.encode(0) {
                Ok(bytes) => encoded.push_encoded(&bytes),
                Err(error) => failure.refused.push(BatchError {
                    index,
                    error: error.into(),
                }),
            }
        }
        if !failure.refused.is_empty() {
            return Err(failure);
        }
        self.execute_encoded_batch(batch, encoded)
    }

    /// [`Channel::execute_batch`] of requests already written one after
    /// another into `encoded`: a batch of many requests then costs one
    /// buffer, not one per request.
    pub fn execute_encoded_batch(
        &mut self,
        batch: &Batch,
        encoded: EncodedBatch,
    ) -> Result<(), BatchFailure> {
        let begin_seq = self.next_seq();
        let begin = batch
            .begin()
            .finish(begin_seq)
            .map_err(|error| unsent_batch(error.into()))?;
        let (mut bytes, starts) = encoded.with_begin(&begin, begin_seq.wrapping_add(1))?;
        let first_seq = begin_seq.wrapping_add(1);
        if starts.is_empty() && batch.generation.is_none() {
            return Ok(());
        }
        let end_seq = first_seq.wrapping_add(starts.len() as u32);
        self.seq = end_seq;
        let end = batch
            .end()
            .finish(end_seq)
            .map_err(|error| unsent_batch(error.into()))?;
        bytes.extend_from_slice(&end);
        let mut acks = Acks {
            members: Some((first_seq, starts.len())),
            markers: vec![begin_seq, end_seq],
            ..Acks::default()
        };
        let asked: &[usize] = if starts.is_empty() {
            ask_ack(&mut bytes);
            acks.marker_awaited = Some(begin_seq);
            &[]
        } else if starts.len() <= batch.acks_max {
            &starts
        } else {
            &starts[starts.len() - 1..]
        };
        for &start in asked {
            if let Some(request) = bytes.get_mut(start..) {
                ask_ack(request);
            }
        }
        let first_asked = starts.len() - asked.len();
        for index in first_asked..starts.len() {
            acks.expect(first_seq.wrapping_add(index as u32), index);
        }
        let datagram = Datagram {
            bytes,
            acks,
            first: Some(0),
            requests: starts.len() as u64,
            unasked: first_asked > 0,
        };
        let mut failure = BatchFailure::default();
        self.flush(datagram, &mut failure);
        failure.into_result()
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
            self.close();
        }
        result
    }

    /// [`Channel::dump`], with the answers collected.
    pub fn dump_all<R: Request>(&mut self, request: R) -> Result<Vec<OwnedReply>, Error> {
        let mut replies = Vec::new();
        self.dump(request, |reply| replies.push(reply.to_owned()))?;
        Ok(replies)
    }

    /// Sends `request` and returns the message answering it. A request
    /// with `NLM_F_ACK` is read up to its acknowledgement (an
    /// acknowledgement without an answer is an error); one without ends
    /// at its answer, one receive for a question asked on a hot path.
    pub fn ask<R: Request>(&mut self, request: R) -> Result<OwnedReply, Error> {
        let result = self.ask_inner(request);
        if result.as_ref().is_err_and(Error::is_broken) {
            self.close();
        }
        result
    }

    fn ask_inner<R: Request>(&mut self, request: R) -> Result<OwnedReply, Error> {
        let seq = self.next_seq();
        let bytes = request.encode(seq)?;
        let acknowledged = bytes
            .get(6..8)
            .is_some_and(|flags| u16::from_ne_bytes([flags[0], flags[1]]) & NLM_F_ACK != 0);
        self.send(&bytes, 1)?;
        let mut reader = AskReader {
            seq,
            acknowledged,
            reply: None,
        };
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
            .make_room_for_answers(datagram.acks.len(), datagram.unasked)
            .and_then(|()| self.send(&datagram.bytes, datagram.requests))
            .and_then(|()| self.collect(&mut datagram.acks));
        failure.refused.append(&mut datagram.acks.refused);
        failure.refused_whole = datagram.acks.refused_whole.take();
        if let Err(error) = result {
            self.close();
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

    /// Raises the socket's receive buffer to hold `answers` answers at
    /// once: the kernel queues every answer to a datagram while `send`
    /// runs, each taking several hundred bytes of buffer with its
    /// `sk_buff`, and drops what does not fit (`ENOBUFS`). Past
    /// `net.core.rmem_max` this needs `CAP_NET_ADMIN`, which the proxy has.
    /// With requests that did not ask (`unasked`), whose refusals come
    /// anyway, the buffer is raised at least to
    /// [`RECEIVE_BUFFER_MIN_RAISED_BYTES`].
    fn make_room_for_answers(&mut self, answers: usize, unasked: bool) -> Result<(), Error> {
        let Some(size) = receive_buffer_wanted(answers, unasked, self.receive_buffer_set) else {
            return Ok(());
        };
        let socket = self.socket()?;
        setsockopt(socket, sockopt::RcvBufForce, &size)
            .map_err(|errno| Error::Send(errno.into()))?;
        self.receive_buffer_set = size;
        Ok(())
    }

    fn close(&mut self) {
        self.socket = None;
        self.receive_buffer_set = 0;
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

/// Room before the requests of an [`EncodedBatch`] for its begin marker:
/// the header (16 bytes), the nfgenmsg (4) and `NFNL_BATCH_GENID` (8).
const BEGIN_ROOM: usize = 28;

/// The requests of one nfnetlink batch, written one after another into one
/// buffer that leaves room for the batch's begin marker, for
/// [`Channel::execute_encoded_batch`]. A large batch thus lives in one
/// allocation (which the allocator maps and unmaps on its own) instead of
/// one small allocation per request.
#[derive(Debug, Clone)]
pub struct EncodedBatch {
    bytes: Vec<u8>,
    /// Where each request starts.
    starts: Vec<usize>,
}

impl Default for EncodedBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl EncodedBatch {
    /// No requests.
    pub fn new() -> Self {
        Self {
            bytes: vec![0; BEGIN_ROOM],
            starts: Vec::new(),
        }
    }

    /// Appends `message`, or says which of its lengths did not fit (then
    /// nothing is appended). Its sequence number is set when the batch is
    /// sent.
    pub fn push(&mut self, message: &Message) -> Result<(), LengthError> {
        let (bytes, len) = message.unfinished()?;
        let start = self.bytes.len();
        self.push_encoded(bytes);
        // A message is at least its 16-byte header, whose first four bytes
        // are the length.
        if let Some(field) = self.bytes.get_mut(start..start + 4) {
            field.copy_from_slice(&len.to_ne_bytes());
        }
        Ok(())
    }

    /// Appends a request already encoded (its length field set).
    fn push_encoded(&mut self, request: &[u8]) {
        self.starts.push(self.bytes.len());
        self.bytes.extend_from_slice(request);
        while self.bytes.len() % 4 != 0 {
            self.bytes.push(0);
        }
    }

    /// How many requests it holds.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether it holds no request.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Each request's bytes, in order (its sequence number not set yet).
    pub fn requests(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let ends = self
            .starts
            .iter()
            .skip(1)
            .copied()
            .chain([self.bytes.len()]);
        self.starts
            .iter()
            .zip(ends)
            .filter_map(|(&start, end)| self.bytes.get(start..end))
    }

    /// The datagram's bytes from `begin` on, the requests numbered from
    /// `first_seq`, and where each request starts in them.
    fn with_begin(
        mut self,
        begin: &[u8],
        first_seq: u32,
    ) -> Result<(Vec<u8>, Vec<usize>), BatchFailure> {
        let Some(skip) = BEGIN_ROOM.checked_sub(begin.len()) else {
            let error = LengthError::Message { len: begin.len() };
            return Err(unsent_batch(error.into()));
        };
        self.bytes[skip..BEGIN_ROOM].copy_from_slice(begin);
        self.bytes.drain(..skip);
        for (index, start) in self.starts.iter_mut().enumerate() {
            *start -= skip;
            let seq = first_seq.wrapping_add(index as u32).to_ne_bytes();
            if let Some(field) = self.bytes.get_mut(*start + 8..*start + 12) {
                field.copy_from_slice(&seq);
            }
        }
        Ok((self.bytes, self.starts))
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
    /// Requests in it (batch markers not counted).
    requests: u64,
    /// Some of its requests did not ask for an acknowledgement (a batch
    /// past [`Batch::acks_max`]).
    unasked: bool,
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
        self.requests += 1;
    }
}

/// The answers a datagram of requests waits for, by sequence number.
#[derive(Debug, Default)]
struct Acks {
    /// Requests not answered yet: sequence number → position.
    pending: HashMap<u32, usize>,
    /// The requests of a batch, `(first sequence number, count)`: a
    /// refusal of one that did not ask for an answer is still reported.
    members: Option<(u32, usize)>,
    /// A batch's markers: a refusal of one is a refusal of the batch.
    markers: Vec<u32>,
    /// The marker whose acknowledgement is awaited (an empty batch bound
    /// to a generation).
    marker_awaited: Option<u32>,
    /// The requests refused so far, in the order of their answers.
    refused: Vec<BatchError>,
    /// The batch was refused as a whole.
    refused_whole: Option<Error>,
}

impl Acks {
    fn expect(&mut self, seq: u32, index: usize) {
        self.pending.insert(seq, index);
    }

    fn len(&self) -> usize {
        self.pending.len() + usize::from(self.marker_awaited.is_some())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn complete(&self) -> bool {
        self.refused_whole.is_some() || self.is_empty()
    }

    /// The position of batch member `seq`.
    fn member(&self, seq: u32) -> Option<usize> {
        let (first, count) = self.members?;
        let index = seq.wrapping_sub(first) as usize;
        (index < count).then_some(index)
    }

    /// Reads the answers in one datagram; answers to other requests (late
    /// answers of an exchange given up on) are skipped.
    fn read(&mut self, datagram: &[u8]) -> Result<(), Error> {
        let mut messages = messages(datagram);
        for message in messages.by_ref() {
            let Some(status) = message.status() else {
                continue;
            };
            let refusal = status
                .err()
                .map(|code| Error::Kernel(io::Error::from_raw_os_error(code)));
            if let Some(index) = self
                .pending
                .remove(&message.seq)
                .or_else(|| self.member(message.seq))
            {
                if let Some(error) = refusal {
                    self.refused.push(BatchError { index, error });
                }
            } else if self.markers.contains(&message.seq) {
                if self.marker_awaited == Some(message.seq) {
                    self.marker_awaited = None;
                }
                if let Some(error) = refusal {
                    self.refused_whole.get_or_insert(error);
                }
            }
        }
        whole(&messages)
    }
}

/// Reads the answer to one question.
#[derive(Debug)]
struct AskReader {
    seq: u32,
    /// The question asked for an acknowledgement after its answer.
    acknowledged: bool,
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
                None if !self.acknowledged => return Some(Ok(message.to_owned())),
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

/// The receive buffer to set for `answers` answers, and refusals of
/// requests that did not ask when `unasked`, on a socket whose buffer was
/// raised to `set` bytes (0: never); `None` while it holds them already.
fn receive_buffer_wanted(answers: usize, unasked: bool, set: usize) -> Option<usize> {
    let mut wanted = answers.saturating_mul(ANSWER_BYTES);
    if unasked {
        wanted = wanted.max(RECEIVE_BUFFER_MIN_RAISED_BYTES);
    }
    (wanted > RECEIVE_BUFFER_DEFAULT_BYTES.max(set))
        .then(|| wanted.max(RECEIVE_BUFFER_MIN_RAISED_BYTES))
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

/// A batch none of which was sent: its begin or end marker could not be
/// encoded.
fn unsent_batch(error: Error) -> BatchFailure {
    BatchFailure {
        refused_whole: Some(error),
        ..BatchFailure::default()
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
