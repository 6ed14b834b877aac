//! Names made safe for rule text.
//!
//! Object names reach the kernel only inside comments (`-m comment
//! --comment "ns/svc:port"` in iptables-restore input, `comment "…"` in nft
//! scripts). The API server allows only DNS labels and subdomains there, but
//! a renderer cannot rely on every source having checked: a quote, a space
//! or a newline in a name from a hand-written manifest would end the comment
//! and let the rest of the name be read as rules. So every renderer writes
//! names through [`write_service_port_comment`], which keeps exactly the
//! characters valid names are made of and bounds the length; for any valid
//! name it writes the name unchanged.

use std::fmt::Write as _;

use crate::service::ServicePortName;

/// The longest text a valid `ns/name:port` can be: a 63-character namespace,
/// Service name and port name with their separators. Longer text can only
/// come from an invalid name and is cut here, keeping every comment within
/// the kernel's 255-byte limit (`XT_MAX_COMMENT_LEN`) with the words the
/// renderers add around it.
pub const MAX_COMMENT_NAME_LEN: usize = 63 * 3 + 2;

/// Writes `name` as `ns/svc:port` (`ns/svc` for an unnamed port) into
/// `out`, every character other than ASCII letters, digits and `-._/:`
/// replaced by `_`, and at most [`MAX_COMMENT_NAME_LEN`] bytes long.
pub fn write_service_port_comment(out: &mut String, name: &ServicePortName) {
    let start = out.len();
    // Writing into a String cannot fail.
    let _ = write!(out, "{name}");
    sanitize_from(out, start);
}

/// `text` as [`write_service_port_comment`] would write it.
pub fn comment_safe(text: &str) -> String {
    let mut out = text.to_owned();
    sanitize_from(&mut out, 0);
    out
}

/// Whether `c` may stand in rule text as it is.
fn is_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '/' | ':')
}

fn sanitize_from(out: &mut String, start: usize) {
    let tail = &out[start..];
    if tail.len() <= MAX_COMMENT_NAME_LEN && tail.chars().all(is_safe) {
        return;
    }
    let safe: String = tail
        .chars()
        .map(|c| if is_safe(c) { c } else { '_' })
        .take(MAX_COMMENT_NAME_LEN)
        .collect();
    out.truncate(start);
    out.push_str(&safe);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use super::*;
    use crate::service::{NamespacedName, Protocol};

    fn port_name(namespace: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName {
            service: NamespacedName::new(namespace, name),
            port: Arc::from(port),
            protocol: Protocol::Tcp,
        }
    }

    fn comment(name: &ServicePortName) -> String {
        let mut out = String::from("prefix ");
        write_service_port_comment(&mut out, name);
        out
    }

    #[test]
    fn a_valid_name_is_written_as_it_is() {
        let longest = "a".repeat(63);
        let name = port_name(&longest, &longest, &longest);

        assert_eq!(
            comment(&port_name("demo", "web-1", "http")),
            "prefix demo/web-1:http"
        );
        assert_eq!(comment(&port_name("demo", "web", "")), "prefix demo/web");
        assert_eq!(
            comment(&name),
            format!("prefix {longest}/{longest}:{longest}")
        );
    }

    #[test]
    fn quotes_spaces_and_newlines_cannot_end_the_comment() {
        let name = port_name("demo", "x\" -j ACCEPT\n-A INPUT -j ACCEPT\n#", "p p");

        let text = comment(&name);

        assert_eq!(text, "prefix demo/x__-j_ACCEPT_-A_INPUT_-j_ACCEPT__:p_p");
    }

    #[test]
    fn a_long_or_non_ascii_name_is_cut_to_the_limit() {
        let name = port_name("demo", &"é".repeat(300), "http");

        let text = comment(&name);

        assert_eq!(text.len(), "prefix ".len() + MAX_COMMENT_NAME_LEN);
        assert!(text["prefix ".len()..].chars().all(is_safe), "{text}");
    }
}
