//! Restore input on its way into `iptables-restore`, with the lines the
//! nft flavor needs added on the fly.

use std::io::{self, Write};

use super::RestoreSink;

/// A table section of restore input big enough for iptables-nft-restore
/// to spend more time on its list of named chains than on a listing of the
/// table; see [`SentInput`].
pub(super) const WHOLE_TABLE_CACHE_MIN_CHAINS: usize = 1000;

/// The nat table's built-in chains. Their policy can only be ACCEPT
/// (iptables inhibits DROP in nat), so declaring them `ACCEPT` changes
/// nothing but their policy counters.
const NAT_BUILTIN_CHAINS: [&str; 4] = ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"];

/// Passes restore input through to `out` line by line, as it arrives, and
/// with `listings` adds what iptables-nft-restore needs at scale:
///
/// - a `-S` line right after the `*table` line of each section that
///   declares at least [`WHOLE_TABLE_CACHE_MIN_CHAINS`] chains before its
///   first other line (the renderer declares every chain first).
///   iptables-nft-restore (1.8.x) notes every chain a command names in a
///   sorted linked list, to fetch only those chains from the kernel later.
///   Each insertion walks the list, so a restore declaring N chains costs
///   O(N²) string comparisons: 42 s of CPU for the nat table of 10,000
///   Services, almost all of upstream kube-proxy's full-sync time on this
///   backend. One command that names no chain makes it fetch the whole
///   table instead and stop keeping the list. `-S` (list the table's rules)
///   is the only such command without side effects; its output is
///   discarded. It costs one listing of the table (about 0.8 s at 10,000
///   Services), so small restores, e.g. partial syncs, go without it. To
///   know whether a section is that large, its declarations are held back
///   until the threshold or the section's first other line (at most
///   [`WHOLE_TABLE_CACHE_MIN_CHAINS`] lines).
/// - in a nat section that got a `-S`, the declaration of a built-in chain
///   (`:OUTPUT ACCEPT [0:0]`) right before the first rule inserted into it.
///   With the whole table fetched, iptables-nft no longer creates a missing
///   built-in chain for a rule inserted into it ("RULE_INSERT failed (No
///   such file or directory): rule in chain OUTPUT"), as on a fresh host
///   whose nat table holds only the canary chain.
///
/// The numbers of the added lines are kept, so that a line number in the
/// program's error maps back to the input ([`LineMapping`]).
pub(super) struct SentInput<W: Write> {
    out: W,
    listings: bool,
    section: Section,
    mapping: LineMapping,
}

/// Which lines of the input as sent were added.
#[derive(Debug, Default)]
pub(super) struct LineMapping {
    /// Lines written so far, added ones included.
    sent_lines: usize,
    /// The 1-based numbers, in the input as sent, of the added lines.
    added: Vec<usize>,
}

/// Where the input is, for [`SentInput`].
enum Section {
    /// Between sections.
    Outside,
    /// After a `*table` line, holding the declarations back.
    Counting {
        nat: bool,
        held: String,
        chains: usize,
    },
    /// Inside a section, past its declarations.
    Open {
        /// A nat section that got a `-S`.
        nat_listed: bool,
        /// The built-in chains declared so far.
        declared: Vec<&'static str>,
    },
}

impl<W: Write> SentInput<W> {
    /// Input for `out`; `listings` adds the lines iptables-nft needs.
    pub fn new(out: W, listings: bool) -> Self {
        Self {
            out,
            listings,
            section: Section::Outside,
            mapping: LineMapping::default(),
        }
    }

    /// Which lines were added; drops the writer.
    pub fn into_mapping(self) -> LineMapping {
        self.mapping
    }

    /// Writes what is still held back and flushes.
    pub fn finish(&mut self) -> io::Result<()> {
        if let Section::Counting { held, .. } = &mut self.section {
            let held = std::mem::take(held);
            self.out.write_all(held.as_bytes())?;
            self.section = Section::Outside;
        }
        self.out.flush()
    }

    fn pass(&mut self, line: &str) -> io::Result<()> {
        self.mapping.sent_lines += 1;
        self.out.write_all(line.as_bytes())
    }

    fn add(&mut self, line: &str) -> io::Result<()> {
        self.mapping.sent_lines += 1;
        self.mapping.added.push(self.mapping.sent_lines);
        self.out.write_all(line.as_bytes())
    }

    /// Ends the held declarations of a section: with a `-S` in front when
    /// `listed`.
    fn release(&mut self, nat: bool, held: &str, listed: bool) -> io::Result<()> {
        if listed {
            self.add("-S\n")?;
        }
        self.out.write_all(held.as_bytes())?;
        self.mapping.sent_lines += held.bytes().filter(|&b| b == b'\n').count();
        self.section = Section::Open {
            nat_listed: nat && listed,
            declared: Vec::new(),
        };
        Ok(())
    }

    fn line(&mut self, line: &str) -> io::Result<()> {
        let content = line.trim_end();
        match &mut self.section {
            Section::Outside => {
                if let Some(table) = content.strip_prefix('*') {
                    self.section = Section::Counting {
                        nat: table == "nat",
                        held: String::new(),
                        chains: 0,
                    };
                }
                self.pass(line)
            }
            Section::Counting { nat, held, chains } => {
                let nat = *nat;
                if content.starts_with(':') {
                    held.push_str(line);
                    if !line.ends_with('\n') {
                        held.push('\n');
                    }
                    *chains += 1;
                    if *chains >= WHOLE_TABLE_CACHE_MIN_CHAINS {
                        let held = std::mem::take(held);
                        self.release(nat, &held, true)?;
                    }
                    return Ok(());
                }
                let held = std::mem::take(held);
                self.release(nat, &held, false)?;
                self.line(line)
            }
            Section::Open {
                nat_listed,
                declared,
            } => {
                if content == "COMMIT" {
                    self.section = Section::Outside;
                } else if let Some(rule) = content.strip_prefix("-I ").filter(|_| *nat_listed) {
                    let chain = rule.split_whitespace().next().unwrap_or_default();
                    let builtin = NAT_BUILTIN_CHAINS.iter().find(|c| **c == chain);
                    if let Some(&builtin) = builtin.filter(|c| !declared.contains(c)) {
                        declared.push(builtin);
                        self.add(&format!(":{builtin} ACCEPT [0:0]\n"))?;
                    }
                }
                self.pass(line)
            }
        }
    }
}

impl LineMapping {
    /// The 1-based line of the input as given that line `sent` of the input
    /// as sent came from; `None` for an added line.
    pub fn original_line(&self, sent: usize) -> Option<usize> {
        match self.added.binary_search(&sent) {
            Ok(_) => None,
            Err(added_before) => Some(sent - added_before),
        }
    }
}

impl<W: Write> RestoreSink for SentInput<W> {
    fn write_lines(&mut self, lines: &str) -> io::Result<()> {
        if !self.listings {
            return self.out.write_all(lines.as_bytes());
        }
        lines
            .split_inclusive('\n')
            .try_for_each(|line| self.line(line))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn section(table: &str, chains: usize) -> String {
        let mut text = format!("*{table}\n");
        for n in 0..chains {
            text.push_str(&format!(":KUBE-C{n} - [0:0]\n"));
        }
        text.push_str("-A KUBE-C0 -j RETURN\nCOMMIT\n");
        text
    }

    /// `text` sent in pieces of `piece` lines.
    fn sent(text: &str, piece: usize) -> (String, SentInput<Vec<u8>>) {
        let mut input = SentInput::new(Vec::new(), true);
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        for chunk in lines.chunks(piece) {
            input.write_lines(&chunk.concat()).unwrap();
        }
        input.finish().unwrap();
        let out = String::from_utf8(std::mem::take(&mut input.out)).unwrap();
        (out, input)
    }

    #[test]
    fn only_sections_with_many_chains_get_a_listing() {
        let text = section("filter", 3) + &section("nat", WHOLE_TABLE_CACHE_MIN_CHAINS);
        for piece in [1, 7, 100_000] {
            let (out, _) = sent(&text, piece);
            assert!(out.starts_with(&section("filter", 3)));
            assert!(out[section("filter", 3).len()..].starts_with("*nat\n-S\n:KUBE-C0 - [0:0]\n"));
            assert_eq!(out.len(), text.len() + 3, "pieces of {piece} lines");
        }
    }

    #[test]
    fn small_input_is_sent_as_it_is() {
        let text = section("nat", WHOLE_TABLE_CACHE_MIN_CHAINS - 1);
        assert_eq!(sent(&text, 3).0, text);
        let unterminated = "*nat\n:KUBE-A - [0:0]";
        assert_eq!(sent(unterminated, 1).0, "*nat\n:KUBE-A - [0:0]\n");
    }

    #[test]
    fn without_listings_the_input_passes_untouched() {
        let text = section("nat", WHOLE_TABLE_CACHE_MIN_CHAINS + 5);
        let mut input = SentInput::new(Vec::new(), false);
        input.write_lines(&text).unwrap();
        input.finish().unwrap();
        assert_eq!(String::from_utf8(input.out.clone()).unwrap(), text);
        assert_eq!(input.mapping.original_line(7), Some(7));
    }

    #[test]
    fn a_large_nat_section_inserting_jumps_declares_their_builtin_chains() {
        let mut nat = section("nat", WHOLE_TABLE_CACHE_MIN_CHAINS);
        let jumps = "-I OUTPUT -j KUBE-C0\n-I PREROUTING -j KUBE-C0\n-I OUTPUT -j KUBE-C1\n";
        nat.insert_str(nat.len() - "COMMIT\n".len(), jumps);
        let filter = "*filter\n:KUBE-F - [0:0]\n-I INPUT -j KUBE-F\nCOMMIT\n";
        let text = format!("{filter}{nat}");

        let (out, input) = sent(&text, 10);

        assert!(out.starts_with(filter), "filter's INPUT is left alone");
        assert!(out[filter.len()..].starts_with("*nat\n-S\n:KUBE-C0 - [0:0]\n"));
        assert!(out.ends_with(
            "-A KUBE-C0 -j RETURN\n:OUTPUT ACCEPT [0:0]\n-I OUTPUT -j KUBE-C0\n\
             :PREROUTING ACCEPT [0:0]\n-I PREROUTING -j KUBE-C0\n-I OUTPUT -j KUBE-C1\nCOMMIT\n"
        ));
        // Every line of the input as sent maps back to its original line,
        // and the added ones to none.
        let original: Vec<&str> = text.lines().collect();
        let mut added = 0;
        for (index, line) in out.lines().enumerate() {
            match input.mapping.original_line(index + 1) {
                Some(n) => assert_eq!(original[n - 1], line, "sent line {}", index + 1),
                None => {
                    added += 1;
                    assert!(line == "-S" || line.ends_with(" ACCEPT [0:0]"), "{line}");
                }
            }
        }
        assert_eq!(added, 3);
    }
}
