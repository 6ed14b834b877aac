//! Bounds checked before a manifest is parsed, so that a hostile or broken
//! file costs little: its size, and how deeply its flow collections nest.
//!
//! libyaml (behind serde_yaml_ng) checks every open flow collection on every
//! token, so `[[[[…` costs time quadratic in the nesting: 200 KB of `[` took
//! 43 s of CPU. serde_yaml_ng's own recursion limit applies only after
//! libyaml has scanned the whole document.

/// Largest manifest file read. The API server takes request bodies up to
/// 3 MiB, so one object is never larger; a file may hold many objects (a
/// `List` of a whole cluster's Services), hence the room above that.
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Deepest nesting of `[`/`{` accepted in one document. A Service or an
/// EndpointSlice written entirely in flow style nests 6 levels, inside a
/// `List` 8; a `last-applied-configuration` annotation adds none (it is a
/// string). 64 leaves room for any real manifest and keeps libyaml linear.
pub(crate) const MAX_FLOW_DEPTH: usize = 64;

/// Where the text first nests deeper than [`MAX_FLOW_DEPTH`]: the 1-based
/// line, or `None` when it never does.
///
/// A scan, not a parse, that errs towards counting too deep: brackets in
/// comments and quoted scalars are text, but as the scan cannot always tell
/// a quote that opens a scalar from an apostrophe in plain text (`it 's`),
/// an opening bracket always counts, and a closing one inside a quote or a
/// comment only cancels an opening one of the same quote or comment.
pub(crate) fn too_deep_at(text: &str) -> Option<usize> {
    let mut scan = Scan::default();
    for byte in text.bytes() {
        if scan.step(byte) > MAX_FLOW_DEPTH {
            return Some(scan.line);
        }
    }
    None
}

/// The state of [`too_deep_at`].
#[derive(Debug)]
struct Scan {
    depth: usize,
    line: usize,
    quote: Option<u8>,
    escaped: bool,
    comment: bool,
    /// Opening brackets seen inside the current quote or comment.
    enclosed_opens: usize,
    previous: u8,
}

impl Default for Scan {
    fn default() -> Self {
        Self {
            depth: 0,
            line: 1,
            quote: None,
            escaped: false,
            comment: false,
            enclosed_opens: 0,
            previous: b'\n',
        }
    }
}

impl Scan {
    /// Takes one byte; returns the depth after it.
    fn step(&mut self, byte: u8) -> usize {
        if byte == b'\n' {
            self.line += 1;
            if self.comment {
                self.comment = false;
                self.enclosed_opens = 0;
            }
        }
        match self.quote {
            Some(quote) => self.in_quote(quote, byte),
            None if self.comment => self.enclosed(byte),
            None => self.outside(byte),
        }
        self.previous = byte;
        self.depth
    }

    fn in_quote(&mut self, quote: u8, byte: u8) {
        if self.escaped {
            self.escaped = false;
        } else if quote == b'"' && byte == b'\\' {
            self.escaped = true;
        } else if byte == quote {
            // `''` inside single quotes closes and reopens: the same state.
            self.quote = None;
            self.enclosed_opens = 0;
        } else {
            self.enclosed(byte);
        }
    }

    /// A byte inside a quote or a comment.
    fn enclosed(&mut self, byte: u8) {
        match byte {
            b'[' | b'{' => {
                self.depth += 1;
                self.enclosed_opens += 1;
            }
            b']' | b'}' if self.enclosed_opens > 0 => {
                self.depth -= 1;
                self.enclosed_opens -= 1;
            }
            _ => {}
        }
    }

    fn outside(&mut self, byte: u8) {
        let after_blank = matches!(self.previous, b'\n' | b'\r' | b' ' | b'\t');
        // Where a YAML or JSON token may start, and so a quoted scalar.
        let at_token_start = after_blank
            || matches!(
                self.previous,
                b'[' | b'{' | b']' | b'}' | b',' | b':' | b'-' | b'?' | b'"' | b'\''
            );
        match byte {
            b'[' | b'{' => self.depth += 1,
            b']' | b'}' => self.depth = self.depth.saturating_sub(1),
            b'"' | b'\'' if at_token_start => self.quote = Some(byte),
            b'#' if after_blank => self.comment = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_manifests_are_shallow() {
        let text = "a: {b: [1, {c: \"[[[[\"}], d: 'x]]]'}\n# [[[[[[\ne: it's [1]\n";
        assert_eq!(too_deep_at(text), None);
    }

    #[test]
    fn deep_flow_nesting_is_found_at_its_line() {
        let text = format!("a: 1\nb: {}\n", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert_eq!(too_deep_at(&text), Some(2));
        let json = "{\"a\":".repeat(MAX_FLOW_DEPTH + 1);
        assert_eq!(too_deep_at(&json), Some(1));
    }

    #[test]
    fn an_apostrophe_in_plain_text_does_not_hide_nesting() {
        let text = format!("a: rock 'n roll\nb: {}\n", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert_eq!(too_deep_at(&text), Some(2));
        let balanced = "a: it 's [1] {b: 2}\n".repeat(MAX_FLOW_DEPTH + 1);
        assert_eq!(too_deep_at(&balanced), None);
    }

    #[test]
    fn closing_brackets_inside_quotes_do_not_hide_nesting() {
        let text = "[ \"]\" ".repeat(MAX_FLOW_DEPTH + 1);
        assert_eq!(too_deep_at(&text), Some(1));
    }
}
