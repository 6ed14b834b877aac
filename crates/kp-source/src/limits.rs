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
/// A scan, not a parse, that never counts less deep than libyaml: it keeps,
/// for each state libyaml's scanner could be in as far as brackets matter
/// ([`State`]), the deepest nesting that reaches it. Where a byte may or may
/// not start a scalar or comment (an apostrophe after a blank opens a quoted
/// scalar, or sits in plain text: `rock 'n roll`), both outcomes are
/// followed. So no arrangement of quotes can make a closing bracket that
/// libyaml reads as text count as a real one here. Brackets in plain text
/// and block scalars may count as real, which only errs towards too deep.
/// It costs a few operations per byte, whatever the text.
pub(crate) fn too_deep_at(text: &str) -> Option<usize> {
    let mut depths = Depths::start();
    let mut line = 1;
    for byte in text.bytes() {
        depths = depths.step(byte);
        if byte == b'\n' {
            line += 1;
        }
        if depths.deepest() > MAX_FLOW_DEPTH {
            return Some(line);
        }
    }
    None
}

/// Where libyaml's scanner may be, as far as brackets are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Where a token may start: at the start, after a blank, a line break,
    /// a flow indicator, `:` or `?`, or a quoted scalar. A quote, `#` or
    /// `!` here may start a scalar, a comment or a tag.
    TokenStart,
    /// Inside a word of plain text: a quote, `#` or `!` is text (libyaml
    /// starts none of them in the middle of a plain scalar, and an anchor or
    /// alias name must be followed by a blank or an indicator).
    InWord,
    /// In a single-quoted scalar (`''` closes and reopens).
    Single,
    /// In a double-quoted scalar.
    Double,
    /// Right after a backslash in a double-quoted scalar.
    DoubleEscaped,
    /// In a comment, up to the end of the line.
    Comment,
    /// In a tag, which may hold brackets and quotes and ends at a blank, a
    /// line break or (in a flow collection) a comma.
    Tag,
}

/// The deepest nesting reachable in each [`State`]; `None`: unreachable.
#[derive(Debug, Clone, Copy)]
struct Depths([Option<usize>; 7]);

impl State {
    const ALL: [State; 7] = [
        State::TokenStart,
        State::InWord,
        State::Single,
        State::Double,
        State::DoubleEscaped,
        State::Comment,
        State::Tag,
    ];
}

impl Depths {
    fn start() -> Self {
        let mut depths = Self([None; 7]);
        depths.reach(State::TokenStart, 0);
        depths
    }

    fn deepest(&self) -> usize {
        self.0.iter().flatten().copied().max().unwrap_or(0)
    }

    fn reach(&mut self, state: State, depth: usize) {
        let slot = &mut self.0[state as usize];
        *slot = Some(slot.map_or(depth, |known| known.max(depth)));
    }

    /// The states after `byte`.
    fn step(&self, byte: u8) -> Self {
        let mut next = Self([None; 7]);
        let line_break = matches!(byte, b'\n' | b'\r');
        for state in State::ALL {
            let Some(depth) = self.0[state as usize] else {
                continue;
            };
            match state {
                State::TokenStart | State::InWord => next.outside(state, depth, byte),
                State::Single if byte == b'\'' => next.reach(State::TokenStart, depth),
                State::Double if byte == b'"' => next.reach(State::TokenStart, depth),
                State::Double if byte == b'\\' => next.reach(State::DoubleEscaped, depth),
                State::DoubleEscaped => next.reach(State::Double, depth),
                State::Comment if line_break => next.reach(State::TokenStart, depth),
                State::Tag if line_break || matches!(byte, b' ' | b'\t' | b',') => {
                    next.reach(State::TokenStart, depth)
                }
                State::Single | State::Double | State::Comment | State::Tag => {
                    next.reach(state, depth)
                }
            }
        }
        next
    }

    /// `byte` read outside any scalar, comment or tag, from `state`.
    fn outside(&mut self, state: State, depth: usize, byte: u8) {
        match byte {
            b'[' | b'{' => self.reach(State::TokenStart, depth + 1),
            b']' | b'}' => self.reach(State::TokenStart, depth.saturating_sub(1)),
            b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' | b'?' => {
                self.reach(State::TokenStart, depth)
            }
            b'\'' | b'"' | b'#' | b'!' if state == State::TokenStart => {
                let started = match byte {
                    b'\'' => State::Single,
                    b'"' => State::Double,
                    b'#' => State::Comment,
                    _ => State::Tag,
                };
                self.reach(started, depth);
                self.reach(State::InWord, depth);
            }
            _ => self.reach(State::InWord, depth),
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
    fn an_apostrophe_in_plain_text_cannot_shift_which_quotes_are_real() {
        // libyaml: `rock 'n roll` is plain text, then every `' ]]]] '` is a
        // quoted scalar, so each group nests four levels deeper.
        let text = format!("a: rock 'n roll\nb: {}\n", "[[[[ ' ]]]] ', ".repeat(20));
        assert_eq!(too_deep_at(&text), Some(2));
        let multi_line = format!("a: rock 'n roll\nb: {}\n", "[[[[ ' ]]]] ',\n ".repeat(20));
        assert!(too_deep_at(&multi_line).is_some());
    }

    #[test]
    fn brackets_in_tags_and_comments_do_not_hide_nesting() {
        let tags = format!("a: {}\n", "[[ !x]] ".repeat(MAX_FLOW_DEPTH));
        assert!(too_deep_at(&tags).is_some());
        let comments = format!("a: {}\n", "[[ # ]]\n".repeat(MAX_FLOW_DEPTH));
        assert!(too_deep_at(&comments).is_some());
    }

    #[test]
    fn a_quoted_json_annotation_is_shallow() {
        let text = "metadata:\n  annotations:\n    last-applied: '{\"spec\":{\"ports\":[{\"port\":80,\"name\":\"it''s\"}]}}'\n"
            .repeat(200);
        assert_eq!(too_deep_at(&text), None);
    }

    #[test]
    fn closing_brackets_inside_quotes_do_not_hide_nesting() {
        let text = "[ \"]\" ".repeat(MAX_FLOW_DEPTH + 1);
        assert_eq!(too_deep_at(&text), Some(1));
    }
}
