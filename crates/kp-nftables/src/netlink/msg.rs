//! nf_tables netlink messages: the framing (`nlmsghdr` + `nfgenmsg`) and a
//! builder for (nested) attributes. Integers inside nf_tables attributes
//! are big-endian, as the kernel's `NLA_BE32` policies say.

/// `NFNL_SUBSYS_NFTABLES`.
pub const SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`.
pub const BATCH_BEGIN: u16 = 0x10;
/// `NFNL_MSG_BATCH_END`.
pub const BATCH_END: u16 = 0x11;

/// `NFT_MSG_NEWGEN`, the answer to `NFT_MSG_GETGEN`.
pub const MSG_NEWGEN: u16 = 15;
/// `NFT_MSG_GETGEN`.
pub const MSG_GETGEN: u16 = 16;
/// `NFTA_GEN_ID`.
const GEN_ID: u16 = 1;
/// `NFNL_BATCH_GENID`: a batch is refused unless the generation is this.
const BATCH_GENID: u16 = 1;

/// `NLM_F_REQUEST`.
pub const F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const F_ACK: u16 = 0x4;
/// `NLM_F_CREATE`.
pub const F_CREATE: u16 = 0x400;
/// `NLM_F_APPEND`.
pub const F_APPEND: u16 = 0x800;

/// `NFT_MSG_*` message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    NewTable = 0,
    DelTable = 2,
    NewChain = 3,
    DelChain = 5,
    NewRule = 6,
    DelRule = 8,
    NewSet = 9,
    DelSet = 11,
    NewSetElem = 12,
    DelSetElem = 14,
}

const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDRLEN: usize = 16;

/// A batch of messages under construction.
#[derive(Debug, Default)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// Sequence number of the next message.
    pub next_seq: u32,
    /// Start of the message being built.
    current: usize,
    /// Open nested attributes (their start offsets).
    nests: Vec<usize>,
}

impl Batch {
    /// A batch whose first message has sequence number `seq`; with
    /// `generation`, the kernel takes it only while the ruleset generation
    /// is that one.
    pub fn new(seq: u32, generation: Option<u32>) -> Self {
        let mut batch = Self {
            next_seq: seq,
            ..Self::default()
        };
        batch.begin_raw(BATCH_BEGIN, F_REQUEST, 0);
        if let Some(generation) = generation {
            batch.u32(BATCH_GENID, generation);
        }
        batch.end();
        batch
    }

    /// `NFT_MSG_GETGEN` with sequence number `seq`, alone.
    pub fn generation_request(seq: u32) -> Vec<u8> {
        let mut batch = Self {
            next_seq: seq,
            ..Self::default()
        };
        batch.begin_raw((SUBSYS_NFTABLES << 8) | MSG_GETGEN, F_REQUEST, 0);
        batch.end();
        batch.bytes
    }

    /// Starts an nf_tables message of `kind` for `family`
    /// (`NFPROTO_IPV4`/`NFPROTO_IPV6`); returns its sequence number.
    pub fn begin(&mut self, kind: Kind, family: u8, flags: u16) -> u32 {
        self.begin_raw(
            (SUBSYS_NFTABLES << 8) | kind as u16,
            F_REQUEST | flags,
            family,
        )
    }

    fn begin_raw(&mut self, kind: u16, flags: u16, family: u8) -> u32 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.current = self.bytes.len();
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(&flags.to_ne_bytes());
        self.bytes.extend_from_slice(&seq.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, resource id (the subsystem for a
        // batch message).
        self.bytes.push(family);
        self.bytes.push(0);
        let res_id = if kind == BATCH_BEGIN || kind == BATCH_END {
            SUBSYS_NFTABLES
        } else {
            0
        };
        self.bytes.extend_from_slice(&res_id.to_be_bytes());
        seq
    }

    /// Ends the current message, filling in its length.
    pub fn end(&mut self) {
        let len = u32::try_from(self.bytes.len() - self.current).unwrap_or(u32::MAX);
        self.bytes[self.current..self.current + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Asks for an acknowledgement of the last message written.
    pub fn ask_ack_last(&mut self) {
        let at = self.current + 6;
        let flags = u16::from_ne_bytes([self.bytes[at], self.bytes[at + 1]]) | F_ACK;
        self.bytes[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
    }

    /// Ends the batch.
    pub fn finish(&mut self) {
        self.begin_raw(BATCH_END, F_REQUEST, 0);
        self.end();
    }

    /// An attribute with raw `data`.
    pub fn attr(&mut self, kind: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.bytes.extend_from_slice(&len.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, kind: u16, text: &str) {
        let mut data = Vec::with_capacity(text.len() + 1);
        data.extend_from_slice(text.as_bytes());
        data.push(0);
        self.attr(kind, &data);
    }

    /// A big-endian u32 attribute.
    pub fn u32(&mut self, kind: u16, value: u32) {
        self.attr(kind, &value.to_be_bytes());
    }

    /// A big-endian u64 attribute.
    pub fn u64(&mut self, kind: u16, value: u64) {
        self.attr(kind, &value.to_be_bytes());
    }

    /// Opens a nested attribute; close it with [`Batch::close`].
    pub fn open(&mut self, kind: u16) {
        self.nests.push(self.bytes.len());
        self.bytes.extend_from_slice(&0u16.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    /// Closes the innermost nested attribute.
    pub fn close(&mut self) {
        if let Some(start) = self.nests.pop() {
            let len = u16::try_from(self.bytes.len() - start).unwrap_or(u16::MAX);
            self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
    }

    fn pad(&mut self) {
        while self.bytes.len() % 4 != 0 {
            self.bytes.push(0);
        }
    }
}

/// What the kernel answered to [`Batch::generation_request`] `seq`: the
/// generation, an error code, or nothing yet in `buf`.
pub fn parse_generation(buf: &[u8], seq: u32) -> Option<Result<u32, i32>> {
    let mut offset = 0;
    while offset + NLMSG_HDRLEN <= buf.len() {
        let word = |at: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&buf[at..at + 4]);
            u32::from_ne_bytes(bytes)
        };
        let len = word(offset) as usize;
        if len < NLMSG_HDRLEN || offset + len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[offset + 4], buf[offset + 5]]);
        if word(offset + 8) == seq {
            if kind == 2 && len >= NLMSG_HDRLEN + 4 {
                let code =
                    i32::from_ne_bytes(buf[offset + 16..offset + 20].try_into().unwrap_or([0; 4]));
                return Some(Err(code));
            }
            if kind == (SUBSYS_NFTABLES << 8) | MSG_NEWGEN {
                // nfgenmsg, then attributes: (len, type, big-endian value).
                let mut at = offset + NLMSG_HDRLEN + 4;
                while at + 4 <= offset + len {
                    let attr_len = usize::from(u16::from_ne_bytes([buf[at], buf[at + 1]]));
                    let attr_kind = u16::from_ne_bytes([buf[at + 2], buf[at + 3]]) & 0x3fff;
                    if attr_len < 4 || at + attr_len > offset + len {
                        break;
                    }
                    if attr_kind == GEN_ID && attr_len >= 8 {
                        let value: [u8; 4] = buf[at + 4..at + 8].try_into().unwrap_or([0; 4]);
                        return Some(Ok(u32::from_be_bytes(value)));
                    }
                    at += (attr_len + 3) & !3;
                }
            }
        }
        offset += (len + 3) & !3;
    }
    None
}

/// A reply from the kernel: `(seq, errno)` of an `NLMSG_ERROR` (errno 0 is
/// an acknowledgement).
pub fn parse_replies(buf: &[u8], out: &mut Vec<(u32, i32)>) {
    let mut offset = 0;
    while offset + NLMSG_HDRLEN <= buf.len() {
        let word = |at: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&buf[at..at + 4]);
            u32::from_ne_bytes(bytes)
        };
        let len = word(offset) as usize;
        if len < NLMSG_HDRLEN || offset + len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[offset + 4], buf[offset + 5]]);
        let seq = word(offset + 8);
        // NLMSG_ERROR: an i32 error code follows the header.
        if kind == 2 && len >= NLMSG_HDRLEN + 4 {
            let code =
                i32::from_ne_bytes(buf[offset + 16..offset + 20].try_into().unwrap_or([0; 4]));
            out.push((seq, code));
        }
        offset += (len + 3) & !3;
    }
}
