//! Damage to text: the edits a hand-written file suffers (a character lost
//! or added, lines swapped, duplicated or dropped, a file cut short), and
//! random and YAML-like text from nothing.

use crate::rng::Gen;

/// Characters that mean something to YAML or JSON, and a few that mean
/// nothing but are hard to handle (NUL, a multi-byte letter, a tab).
const INTERESTING: &[char] = &[
    ':', '-', '{', '}', '[', ']', '\n', ' ', '\t', '"', '\'', '#', '&', '*', '!', '|', '>', ',',
    '0', '9', 'x', '%', '@', '?', '.', '/', '\\', '\u{0}', 'é', '\u{feff}',
];

/// YAML-ish tokens random text is made of.
const TOKENS: &[&str] = &[
    "apiVersion: v1\n",
    "kind: Service\n",
    "kind: EndpointSlice\n",
    "kind: List\n",
    "apiVersion: discovery.k8s.io/v1\n",
    "metadata:",
    " name: a",
    " namespace: b",
    "spec:",
    "ports:",
    "- ",
    "port: 80",
    "nodePort: 30000",
    "clusterIP: 10.96.0.1",
    "items:",
    "---\n",
    "{",
    "}",
    "[",
    "]",
    ", ",
    ": ",
    "\n",
    "  ",
    "&a ",
    "*a",
    "!!str ",
    "<<: ",
    "? ",
    "|\n",
    ">-\n",
    "'",
    "\"",
    "#",
    "null",
    "~",
    "1e9",
    "-1",
    "0x10",
    "true",
    "\"\\u0000\"",
    "%YAML 1.2\n",
];

/// `text` after 1 to `max` random edits.
pub fn damage(gen: &mut Gen, text: &str, max: usize) -> String {
    let edits = 1 + gen.below(max);
    (0..edits).fold(text.to_owned(), |text, _| edit(gen, &text))
}

fn edit(gen: &mut Gen, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let len = chars.len();
    match gen.below(8) {
        0 if len > 0 => {
            chars.remove(gen.below(len));
        }
        1 => chars.insert(gen.below(len + 1), *gen.pick(INTERESTING)),
        2 if len > 0 => chars[gen.below(len)] = *gen.pick(INTERESTING),
        3 => {
            let token: Vec<char> = gen.pick(TOKENS).chars().collect();
            let at = gen.below(len + 1);
            chars.splice(at..at, token);
        }
        4 => chars.truncate(gen.below(len + 1)),
        5..=7 => return edit_lines(gen, text),
        _ => {}
    }
    chars.into_iter().collect()
}

fn edit_lines(gen: &mut Gen, text: &str) -> String {
    let mut lines: Vec<&str> = text.split('\n').collect();
    let len = lines.len();
    let (a, b) = (gen.below(len), gen.below(len));
    match gen.below(3) {
        0 => lines.swap(a, b),
        1 => lines.insert(a, lines[b]),
        _ => {
            lines.remove(a);
        }
    }
    lines.join("\n")
}

/// Text from nothing: random bytes, or random YAML-ish tokens.
pub fn noise(gen: &mut Gen) -> String {
    if gen.chance(0.3) {
        let len = gen.below(512);
        String::from_utf8_lossy(&gen.bytes(len)).into_owned()
    } else {
        let count = gen.below(80);
        (0..count).map(|_| *gen.pick(TOKENS)).collect()
    }
}
