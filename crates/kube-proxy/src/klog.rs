//! klog's two output formats on `tracing`, so that what operators grep for
//! and what log pipelines parse stays as upstream writes it:
//!
//! ```text
//! I1124 22:35:30.595387   14551 proxier.rs:123] "Sync completed" ipFamily="IPv4" elapsed=0.031
//! {"ts":1732487730.595387,"caller":"proxier.rs:123","msg":"Sync completed","v":0,"ipFamily":"IPv4"}
//! ```
//!
//! The text header is klog's `Lmmdd hh:mm:ss.uuuuuu threadid file:line]`
//! (severity I, W or E; the process id; the time in UTC, as in a container),
//! the message and string values quoted as Go's `%q` quotes them, numbers
//! and booleans bare. JSON entries carry component-base's keys: `ts`
//! (seconds since the epoch), `caller`, `msg`, `v` (the verbosity; absent
//! on errors). A field named `error` is written as klog's `err`; a field
//! named `v` is the entry's verbosity (`tracing::info!(v = 2, …)` is
//! upstream's `klog.V(2).InfoS`), written only as JSON's `v`.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// klog's text format, or with `json` component-base's JSON format
/// (`--logging-format=json`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Klog {
    /// Write JSON entries.
    pub json: bool,
}

/// A field's value: a string (quoted when written) or a number or boolean
/// (written bare).
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Text(String),
    Bare(String),
}

/// The message and the other fields of one event, in their order.
#[derive(Debug, Default)]
struct Fields {
    message: String,
    pairs: Vec<(&'static str, Value)>,
    /// The entry's `v` field: its klog verbosity, written as JSON's `v`
    /// and not as a field of its own.
    v: Option<u64>,
}

impl Fields {
    fn of(event: &Event<'_>) -> Self {
        let mut fields = Self::default();
        event.record(&mut fields);
        fields
    }

    fn push(&mut self, field: &Field, value: Value) {
        let name = match field.name() {
            "error" => "err",
            name => name,
        };
        self.pairs.push((name, value));
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.push(field, Value::Text(value.to_owned()));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "v" {
            self.v = Some(u64::try_from(value).unwrap_or(0));
            return;
        }
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "v" {
            self.v = Some(value);
            return;
        }
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bare(value.to_string()));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, Value::Text(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
            return;
        }
        // A `?` string arrives quoted already: keep its text, not its quotes.
        let text = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) if !inner.contains('"') => inner.to_owned(),
            _ => text,
        };
        self.push(field, Value::Text(text));
    }
}

impl<S, N> FormatEvent<S, N> for Klog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.json {
            write_event(writer, event, json_line)
        } else {
            write_event(writer, event, |at, level, caller, fields| {
                text_line(at, level, std::process::id(), caller, fields)
            })
        }
    }
}

/// `event` as the line `format` makes of its time, level, caller and fields.
fn write_event(
    mut writer: Writer<'_>,
    event: &Event<'_>,
    format: impl FnOnce(SystemTime, Level, &str, &Fields) -> String,
) -> fmt::Result {
    let meta = event.metadata();
    let caller = caller(meta.file(), meta.line());
    writer.write_str(&format(
        SystemTime::now(),
        *meta.level(),
        &caller,
        &Fields::of(event),
    ))
}

/// `file:line` with the file's base name, as klog writes the caller.
fn caller(file: Option<&str>, line: Option<u32>) -> String {
    let file = file
        .map(|f| f.rsplit('/').next().unwrap_or(f))
        .unwrap_or("???");
    format!("{file}:{}", line.unwrap_or(0))
}

/// One entry in klog's text format, newline included.
fn text_line(at: SystemTime, level: Level, pid: u32, caller: &str, fields: &Fields) -> String {
    let severity = match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    };
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (_, month, day) = civil_date(seconds / 86_400);
    let of_day = seconds % 86_400;
    let mut out = format!(
        "{severity}{month:02}{day:02} {:02}:{:02}:{:02}.{:06} {pid:>7} {caller}] ",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        since.subsec_micros(),
    );
    go_quote(&mut out, &fields.message);
    for (key, value) in &fields.pairs {
        out.push(' ');
        out.push_str(key);
        out.push('=');
        match value {
            Value::Text(text) => go_quote(&mut out, text),
            Value::Bare(text) => out.push_str(text),
        }
    }
    out.push('\n');
    out
}

/// One entry in component-base's JSON format, newline included.
fn json_line(at: SystemTime, level: Level, caller: &str, fields: &Fields) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut out = format!(
        "{{\"ts\":{}.{:06},\"caller\":",
        since.as_secs(),
        since.subsec_micros()
    );
    json_quote(&mut out, caller);
    out.push_str(",\"msg\":");
    json_quote(&mut out, &fields.message);
    // klog's verbosity of the entry; errors have none.
    if let Some(v) = crate::logging::entry_verbosity(level, fields.v) {
        let _ = write!(out, ",\"v\":{v}");
    }
    for (key, value) in &fields.pairs {
        out.push(',');
        json_quote(&mut out, key);
        out.push(':');
        match value {
            Value::Text(text) => json_quote(&mut out, text),
            Value::Bare(text)
                if text.parse::<f64>().is_ok_and(f64::is_finite)
                    || text == "true"
                    || text == "false" =>
            {
                out.push_str(text);
            }
            // NaN and infinities are not JSON numbers.
            Value::Bare(text) => json_quote(&mut out, text),
        }
    }
    out.push_str("}\n");
    out
}

/// `text` quoted as Go's `%q` quotes a string.
fn go_quote(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let code = u32::from(c);
                if code < 0x80 {
                    let _ = write!(out, "\\x{code:02x}");
                } else {
                    let _ = write!(out, "\\u{code:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `text` as a JSON string.
fn json_quote(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The (year, month, day) of a day counted from 1970-01-01 (proleptic
/// Gregorian calendar; Howard Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> (i64, u32, u32) {
    let z = i64::try_from(days).unwrap_or(i64::MAX / 2) + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both are in range by construction (1–12, 1–31).
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn fields(message: &str, pairs: &[(&'static str, Value)]) -> Fields {
        Fields {
            message: message.to_owned(),
            pairs: pairs.to_vec(),
            v: None,
        }
    }

    /// 2024-11-24 22:35:30.595387 UTC.
    fn at() -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(1_732_487_730_595_387)
    }

    #[test]
    fn a_text_entry_has_klogs_header_and_quoting() {
        let line = text_line(
            at(),
            Level::INFO,
            14551,
            "file.rs:123",
            &fields(
                "Sync completed",
                &[
                    ("ipFamily", Value::Text("IPv4".into())),
                    ("rules", Value::Bare("12".into())),
                    ("err", Value::Text("line 3: \"-X\"\nrefused".into())),
                ],
            ),
        );
        assert_eq!(
            line,
            "I1124 22:35:30.595387   14551 file.rs:123] \"Sync completed\" ipFamily=\"IPv4\" rules=12 err=\"line 3: \\\"-X\\\"\\nrefused\"\n"
        );
        let warn = text_line(at(), Level::WARN, 7, "a.rs:1", &fields("w", &[]));
        assert!(
            warn.starts_with("W1124 22:35:30.595387       7 a.rs:1] \"w\""),
            "{warn}"
        );
        let error = text_line(at(), Level::ERROR, 7, "a.rs:1", &fields("e", &[]));
        assert!(error.starts_with('E'));
    }

    #[test]
    fn a_json_entry_has_component_bases_keys() {
        let line = json_line(
            at(),
            Level::INFO,
            "file.rs:123",
            &fields(
                "Sync completed",
                &[
                    ("ipFamily", Value::Text("IPv4".into())),
                    ("rules", Value::Bare("12".into())),
                    ("full", Value::Bare("true".into())),
                ],
            ),
        );
        assert_eq!(
            line,
            "{\"ts\":1732487730.595387,\"caller\":\"file.rs:123\",\"msg\":\"Sync completed\",\"v\":0,\"ipFamily\":\"IPv4\",\"rules\":12,\"full\":true}\n"
        );
        let error = json_line(at(), Level::ERROR, "a.rs:1", &fields("e", &[]));
        assert!(!error.contains("\"v\""), "{error}");
    }

    #[test]
    fn dates_follow_the_calendar() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(19_782), (2024, 2, 29));
        assert_eq!(civil_date(20_053), (2024, 11, 26));
        assert_eq!(civil_date(20_818), (2026, 12, 31));
    }
}
