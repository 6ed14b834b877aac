//! The API server's name rules, with its own messages.
//!
//! Names reach rule text (chain comments, `iptables-restore` input), so a
//! manifest may only hold the names an API server would have accepted. The
//! rules and message texts are those of k8s.io/apimachinery
//! (`pkg/util/validation`: `IsDNS1035Label`, `IsDNS1123Label`,
//! `IsDNS1123Subdomain`; `pkg/api/validate/content`: `IsLabelValue`;
//! `MaxLenError`, `RegexError`) and of `field.Error` for the
//! `Invalid value: "…": …` form.

use std::fmt::Write as _;

/// Longest DNS label (RFC 1035 / RFC 1123).
const DNS_LABEL_MAX_LENGTH: usize = 63;
/// Longest DNS subdomain (RFC 1123).
const DNS_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Longest label value.
const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// How much of a rejected value an error message shows.
const SHOWN_VALUE_MAX_CHARS: usize = 100;

const DNS1035_LABEL_FORMAT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_MESSAGE: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const DNS1123_LABEL_FORMAT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FORMAT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FORMAT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MESSAGE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// What is wrong with `value` as a DNS-1035 label (Service names), as
/// `IsDNS1035Label` words it; empty when it is valid.
pub(crate) fn dns1035_label(value: &str) -> Vec<String> {
    let mut problems = max_length(value, DNS_LABEL_MAX_LENGTH);
    let starts_with_letter = value.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if !(starts_with_letter && is_dns_label_text(value)) {
        problems.push(regex_error(
            DNS1035_LABEL_MESSAGE,
            DNS1035_LABEL_FORMAT,
            &["my-name", "abc-123"],
        ));
    }
    problems
}

/// What is wrong with `value` as a DNS-1123 label (namespaces, port names),
/// as `IsDNS1123Label` words it.
pub(crate) fn dns1123_label(value: &str) -> Vec<String> {
    let mut problems = max_length(value, DNS_LABEL_MAX_LENGTH);
    if !is_dns_label_text(value) {
        if is_dns_subdomain_text(value) {
            // A valid subdomain that is no label can only have dots.
            problems.push("must not contain dots".to_owned());
        } else {
            problems.push(regex_error(
                DNS1123_LABEL_MESSAGE,
                DNS1123_LABEL_FORMAT,
                &["my-name", "123-abc"],
            ));
        }
    }
    problems
}

/// What is wrong with `value` as a DNS-1123 subdomain (EndpointSlice and
/// Node names), as `IsDNS1123Subdomain` words it.
pub(crate) fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut problems = max_length(value, DNS_SUBDOMAIN_MAX_LENGTH);
    if !is_dns_subdomain_text(value) {
        problems.push(regex_error(
            DNS1123_SUBDOMAIN_MESSAGE,
            DNS1123_SUBDOMAIN_FORMAT,
            &["example.com"],
        ));
    }
    problems
}

/// What is wrong with `value` as a label value, as `IsLabelValue` words it.
pub(crate) fn label_value(value: &str) -> Vec<String> {
    let mut problems = max_length(value, LABEL_VALUE_MAX_LENGTH);
    if !is_label_value_text(value) {
        problems.push(regex_error(
            LABEL_VALUE_MESSAGE,
            LABEL_VALUE_FORMAT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    problems
}

/// `Invalid value: "VALUE": DETAIL`, the body of upstream's `field.Invalid`,
/// with the value escaped (so a name cannot break a log line) and cut short.
pub(crate) fn invalid_value(value: &str, detail: &str) -> String {
    format!("Invalid value: {}: {detail}", quoted(value))
}

/// `value` quoted and escaped as in an error message, its first
/// [`SHOWN_VALUE_MAX_CHARS`] characters only.
pub(crate) fn quoted(value: &str) -> String {
    let shown: String = value.chars().take(SHOWN_VALUE_MAX_CHARS).collect();
    if shown.len() == value.len() {
        format!("{shown:?}")
    } else {
        format!("{shown:?}... ({} bytes)", value.len())
    }
}

/// Whether `value` can be shown as it is: letters, digits, `-`, `.`, `_`.
pub(crate) fn is_plain(value: &str) -> bool {
    value.len() <= SHOWN_VALUE_MAX_CHARS
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

fn max_length(value: &str, limit: usize) -> Vec<String> {
    if value.len() > limit {
        vec![format!("must be no more than {limit} characters")]
    } else {
        Vec::new()
    }
}

/// Upstream's `RegexError`: the message, the examples and the expression.
fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    let mut text = format!("{message} (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            text.push_str(" or ");
        }
        // Upstream's exact text, double space before "or" included.
        let _ = write!(text, "'{example}', ");
    }
    let _ = write!(text, "regex used for validation is '{format}')");
    text
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_dns_label_text(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alphanumeric(first)
                && alphanumeric(last)
                && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
        }
        _ => false,
    }
}

/// DNS-1123 labels joined by dots.
fn is_dns_subdomain_text(value: &str) -> bool {
    value.split('.').all(is_dns_label_text)
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`
fn is_label_value_text(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (None, _) | (_, None) => true,
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_dns1035_labels() {
        assert!(dns1035_label("web-1").is_empty());
        assert_eq!(
            dns1035_label("1web"),
            ["a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"]
        );
        assert_eq!(
            dns1035_label(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
        assert_eq!(dns1035_label("a\"b\n-A INPUT").len(), 1);
        assert_eq!(dns1035_label("").len(), 1);
    }

    #[test]
    fn dns1123_labels_allow_leading_digits_but_no_dots() {
        assert!(dns1123_label("123-abc").is_empty());
        assert_eq!(dns1123_label("a.b"), ["must not contain dots"]);
        assert_eq!(dns1123_label("a b").len(), 1);
        assert_eq!(dns1123_label("-a").len(), 1);
    }

    #[test]
    fn subdomains_are_dot_separated_labels() {
        assert!(dns1123_subdomain("node-1.example.com").is_empty());
        assert_eq!(dns1123_subdomain("a..b").len(), 1);
        assert_eq!(dns1123_subdomain("A").len(), 1);
        assert_eq!(dns1123_subdomain(&"a".repeat(254)).len(), 1);
    }

    #[test]
    fn label_values_may_be_empty_or_mixed_case() {
        assert!(label_value("").is_empty());
        assert!(label_value("My_value.1").is_empty());
        assert_eq!(label_value("web\" -j ACCEPT").len(), 1);
    }

    #[test]
    fn shown_values_are_escaped_and_cut_short() {
        assert_eq!(
            invalid_value("a\"\nb", "bad"),
            "Invalid value: \"a\\\"\\nb\": bad"
        );
        let long = "x".repeat(500);
        assert!(quoted(&long).ends_with("... (500 bytes)"));
    }
}
