//! Copying bytes between the two sockets of a relayed connection.
//!
//! Each direction waits for its source to become readable *before* it
//! takes a buffer, and gives the buffer back once the source has nothing
//! more to read, so an idle connection holds no buffer at all: its cost is
//! the task and two registered sockets. `tokio::io::copy_bidirectional`
//! keeps two 8 KiB buffers for the whole life of a connection, which is
//! 16 KiB per idle connection; at tens of thousands of connections that is
//! the difference between megabytes and gigabytes.
//!
//! Both directions are polled by one small hand-written state machine
//! (about a hundred bytes) rather than two `async` loops: an idle
//! connection's task is mostly its future, and the readiness futures of
//! `async` loops would make it several times larger. Waiting uses the
//! sockets' own reader and writer wakers (`poll_read_ready`,
//! `poll_write_ready`); each (socket, direction) pair is waited on by one
//! direction only, as those wakers require.
//!
//! Small messages (up to 4 KiB, what request/response traffic mostly is)
//! pass through a buffer on the stack and are written on at once; a write
//! that would block keeps the rest in a heap buffer. Bulk data (a read that
//! fills the stack buffer) is moved by the kernel with `splice(2)` through
//! a pipe the direction holds only while the data flows, so it is never
//! copied into the process; without a pipe (no descriptors left) it goes
//! through a heap buffer instead, a `Vec` with capacity only that reads
//! fill without zeroing it first (`try_read_buf`).

use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::OwnedFd;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use nix::fcntl::{splice, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::sockets::shutdown_write;

/// Size of the stack buffer small messages pass through.
const SMALL_READ: usize = 4096;

/// Bytes moved per `splice` call: a default pipe's capacity.
const PIPE_CHUNK: usize = 64 * 1024;

/// The idle timer fires this many times per idle timeout: a connection
/// ends after at least the timeout and at most a quarter more with no
/// byte moved, and moving bytes costs no clock reading or timer update.
const IDLE_CHECKS: u32 = 4;

/// Bytes moved by a finished relay, per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// From the client to the endpoint.
    pub to_endpoint: u64,
    /// From the endpoint to the client.
    pub to_client: u64,
}

/// One direction's state.
#[derive(Debug, Default)]
struct Direction {
    /// Present only while data is in flight.
    buffer: Option<Vec<u8>>,
    /// Present only while bulk data flows: the kernel moves it from socket
    /// to socket through this pipe, without copying it into the process.
    pipe: Option<Pipe>,
    /// Bytes of `buffer` already written.
    written: usize,
    total: u64,
    /// The source ended and the end was passed on.
    done: bool,
}

/// Relays between `client` and `endpoint` until both directions have seen
/// an end of stream, or either fails. At most one buffer of `buffer_size`
/// bytes (or, with `splice`, one pipe) per direction exists, and only
/// while data is flowing.
///
/// The first end of stream is passed on as a half-close
/// (`shutdown(SHUT_WR)`); the second is left to the caller, who closes
/// both sockets once this returns: a close sends the same FIN (nothing
/// is left unread on a socket that has ended), and one system call per
/// connection is saved.
///
/// A connection that moves no byte in either direction for `idle_timeout`
/// (up to a quarter more) ends with [`io::ErrorKind::TimedOut`]: a peer
/// that vanished without a reset is found by keepalive probes, but one
/// that stays and says nothing, or a half-closed connection whose other
/// half never ends, would otherwise hold the connection for ever.
pub async fn relay(
    client: &TcpStream,
    endpoint: &TcpStream,
    buffer_size: usize,
    splice: bool,
    idle_timeout: Duration,
) -> io::Result<Copied> {
    let copying = Copying {
        buffer_size,
        splice,
    };
    let mut to_endpoint = Direction::default();
    let mut to_client = Direction::default();
    let check_every = (idle_timeout / IDLE_CHECKS).max(Duration::from_millis(1));
    let mut idle_timer = std::pin::pin!(tokio::time::sleep(check_every));
    let mut timer_polled = false;
    let mut moved_at_poll = 0u64;
    let mut moved_at_check = 0u64;
    let mut quiet_checks = 0u32;
    poll_fn(|cx| {
        let forward = to_endpoint.poll(cx, client, endpoint, copying, to_client.done)?;
        let backward = to_client.poll(cx, endpoint, client, copying, to_endpoint.done)?;
        if let (Poll::Ready(to_endpoint), Poll::Ready(to_client)) = (forward, backward) {
            return Poll::Ready(Ok(Copied {
                to_endpoint,
                to_client,
            }));
        }
        let moved = to_endpoint.total + to_client.total;
        let busy = moved != moved_at_poll;
        moved_at_poll = moved;
        // While bytes flow the timer is left alone: its waker, registered
        // by an earlier poll of this task, still wakes it, and a timer that
        // fired meanwhile is seen here. Polling it on every wake-up would
        // cost the copy loop a timer poll per message.
        if busy && timer_polled && !idle_timer.is_elapsed() {
            return Poll::Pending;
        }
        timer_polled = true;
        while idle_timer.as_mut().poll(cx).is_ready() {
            if moved == moved_at_check {
                quiet_checks += 1;
            } else {
                moved_at_check = moved;
                quiet_checks = 0;
            }
            if quiet_checks >= IDLE_CHECKS {
                return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
            }
            // From now, not from the deadline: a check that came late (a
            // busy thread) does not make the next ones come at once.
            idle_timer
                .as_mut()
                .reset(tokio::time::Instant::now() + check_every);
        }
        Poll::Pending
    })
    .await
}

/// How a direction copies.
#[derive(Debug, Clone, Copy)]
struct Copying {
    buffer_size: usize,
    splice: bool,
}

/// A pipe for `splice`, with the bytes it holds.
#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
}

impl Direction {
    /// Moves what `from` has to `to`; ready with the byte count once
    /// `from` has ended, pending while waiting for either socket. The end
    /// is passed on with a half-close unless `last` (the other direction
    /// has ended already, and the close that follows passes it on).
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        from: &TcpStream,
        to: &TcpStream,
        copying: Copying,
        last: bool,
    ) -> Poll<io::Result<u64>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(self.total));
            }
            if let Some(buffer) = &self.buffer {
                if self.written < buffer.len() {
                    ready!(to.poll_write_ready(cx))?;
                    match to.try_write(&buffer[self.written..]) {
                        Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                        Ok(n) => {
                            self.written += n;
                            self.total += n as u64;
                        }
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                        Err(error) => return Poll::Ready(Err(error)),
                    }
                    continue;
                }
            }
            if self.pipe.is_some() {
                self.buffer = None;
                ready!(self.poll_splice(cx, from, to, last))?;
                continue;
            }
            ready!(from.poll_read_ready(cx))?;
            let read = match self.buffer.as_mut() {
                Some(buffer) => {
                    buffer.clear();
                    self.written = 0;
                    from.try_read_buf(buffer)
                }
                None => self.pass_small(from, to, copying),
            };
            match read {
                Ok(0) => {
                    self.buffer = None;
                    self.end(to, last)?;
                }
                Ok(_) => {}
                // Nothing more to read for now: the buffer goes back.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.buffer = None,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    /// `from` has ended: passes the end on to `to` with a half-close, or,
    /// when this is the `last` direction to end, leaves it to the close
    /// that follows.
    fn end(&mut self, to: &TcpStream, last: bool) -> io::Result<()> {
        if !last {
            shutdown_write(to)?;
        }
        self.done = true;
        Ok(())
    }

    /// Reads into a buffer on the stack and writes it on at once: a
    /// request or an answer of a few kilobytes never touches the heap. What
    /// cannot be written at once, and the reads after one that filled the
    /// stack buffer (bulk data), go through a heap buffer of
    /// `buffer_size`, or a pipe with `splice`.
    fn pass_small(
        &mut self,
        from: &TcpStream,
        to: &TcpStream,
        copying: Copying,
    ) -> io::Result<usize> {
        let mut small = [0u8; SMALL_READ];
        let mut read = 0;
        // A read that returns less than asked has emptied the socket's
        // receive queue, so its readiness is cleared with it (tokio's own
        // `poll_read` does the same; epoll is edge triggered, and data that
        // arrives later sets the readiness again): the task then sleeps
        // without a further read that could only say `WouldBlock`, one
        // system call less per message.
        let result = from.try_io(Interest::READABLE, || {
            read = nix::unistd::read(from, &mut small).map_err(io::Error::from)?;
            if read > 0 && read < SMALL_READ {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(read)
            }
        });
        match result {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock && read > 0 => {}
            Err(error) => return Err(error),
        }
        if read == 0 {
            return Ok(0);
        }
        let written = match to.try_write(&small[..read]) {
            Ok(written) => written,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => 0,
            Err(error) => return Err(error),
        };
        self.total += written as u64;
        // A full stack buffer means bulk data: splice it, or failing a
        // pipe (no descriptors left), copy it through a heap buffer.
        if read == SMALL_READ && copying.splice {
            self.pipe = Pipe::new();
        }
        if written < read || (read == SMALL_READ && self.pipe.is_none()) {
            let mut buffer = Vec::with_capacity(copying.buffer_size.max(SMALL_READ));
            buffer.extend_from_slice(&small[written..read]);
            self.written = 0;
            self.buffer = Some(buffer);
        }
        Ok(read)
    }

    /// One step of bulk mode: empties the pipe into `to`, or refills it
    /// from `from`. Ready when a step was made; the pipe is given back when
    /// `from` has nothing more for now, and at the end of the stream.
    fn poll_splice(
        &mut self,
        cx: &mut Context<'_>,
        from: &TcpStream,
        to: &TcpStream,
        last: bool,
    ) -> Poll<io::Result<()>> {
        let Some(pipe) = self.pipe.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
        if pipe.held > 0 {
            ready!(to.poll_write_ready(cx))?;
            let moved = to.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, to, None, pipe.held, flags).map_err(io::Error::from)
            });
            match moved {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    pipe.held -= n;
                    self.total += n as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
            return Poll::Ready(Ok(()));
        }
        ready!(from.poll_read_ready(cx))?;
        let moved = from.try_io(Interest::READABLE, || {
            splice(from, None, &pipe.write, None, PIPE_CHUNK, flags).map_err(io::Error::from)
        });
        match moved {
            Ok(0) => {
                self.pipe = None;
                self.end(to, last)?;
            }
            Ok(n) => pipe.held = n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.pipe = None,
            Err(error) => return Poll::Ready(Err(error)),
        }
        Poll::Ready(Ok(()))
    }
}

impl Pipe {
    /// A non-blocking pipe, or `None` when none can be made.
    fn new() -> Option<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        Some(Self {
            read,
            write,
            held: 0,
        })
    }
}
