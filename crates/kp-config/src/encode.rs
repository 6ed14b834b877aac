//! Writing configuration as YAML in upstream's layout.
//!
//! Upstream serializes through JSON and go-yaml: keys sorted, two-space
//! indentation, sequences at their key's indentation, empty strings as `""`,
//! unset lists as `null`, durations as Go strings. This emitter produces the
//! same layout, so `--write-config-to` output diffs cleanly against
//! upstream's and loads in either implementation.

use std::cmp::Ordering;
use std::path::Path;

use serde_json::{Map, Number, Value};

use crate::error::ConfigError;
use crate::types::KubeProxyConfiguration;

/// Serializes a configuration as YAML (including apiVersion and kind).
pub fn to_yaml(cfg: &KubeProxyConfiguration) -> Result<String, ConfigError> {
    let value = serde_json::to_value(cfg).map_err(|source| ConfigError::Serialize { source })?;
    let mut out = String::new();
    match &value {
        Value::Object(map) => emit_mapping(&mut out, map, 0, false),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    Ok(out)
}

/// Writes [`to_yaml`]'s output to `path`, replacing the file.
pub fn write_file(cfg: &KubeProxyConfiguration, path: impl AsRef<Path>) -> Result<(), ConfigError> {
    let path = path.as_ref();
    let yaml = to_yaml(cfg)?;
    std::fs::write(path, yaml).map_err(|source| ConfigError::WriteFile {
        path: path.to_owned(),
        source,
    })?;
    tracing::info!(file = %path.display(), "Wrote configuration");
    Ok(())
}

/// Emits `map` at `indent`; when `inline_first` the first key continues a
/// `- ` already written.
fn emit_mapping(out: &mut String, map: &Map<String, Value>, indent: usize, inline_first: bool) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by(|a, b| go_yaml_key_order(a, b));
    for (i, key) in keys.into_iter().enumerate() {
        if !(inline_first && i == 0) {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(&string_scalar(key));
        out.push(':');
        emit_value(out, &map[key], indent);
    }
}

/// Emits what follows `key:` for a value nested at `indent`.
fn emit_value(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(child) if !child.is_empty() => {
            out.push('\n');
            emit_mapping(out, child, indent + 2, false);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            emit_sequence(out, items, indent);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn emit_sequence(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push_str("- ");
        match item {
            Value::Object(map) if !map.is_empty() => emit_mapping(out, map, indent + 2, true),
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                emit_sequence(out, inner, indent + 2);
            }
            other => {
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => number(n),
        Value::String(s) => string_scalar(s),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

/// Integers as is; floats that are whole as integers (Go's encoder writes
/// `5`, not `5.0`); other floats in their shortest single-precision form,
/// since every float in this API is a Go `float32`.
fn number(n: &Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() => {
            if f.fract() == 0.0 && f.abs() < 1e15 {
                format!("{f:.0}")
            } else if f64::from(f as f32) == f {
                (f as f32).to_string()
            } else {
                f.to_string()
            }
        }
        _ => n.to_string(),
    }
}

/// A string as a plain scalar when YAML would read it back as the same
/// string, else double-quoted with JSON escapes (valid YAML).
fn string_scalar(s: &str) -> String {
    if is_plain_safe(s) {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

fn is_plain_safe(s: &str) -> bool {
    const INDICATORS: &[char] = &[
        '-', '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@',
        '`', ' ', '.', '+', '~', '=', '<',
    ];
    let Some(first) = s.chars().next() else {
        return false;
    };
    !INDICATORS.contains(&first)
        && !s.ends_with([' ', ':'])
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.chars().any(char::is_control)
        && !resolves_to_non_string(s)
}

/// YAML 1.1 plain scalars that go-yaml would read as bool, null, number or timestamp.
fn resolves_to_non_string(s: &str) -> bool {
    const SPECIAL: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
        "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL",
    ];
    if SPECIAL.contains(&s) {
        return true;
    }
    let digits_only: String = s.chars().filter(|c| *c != '_').collect();
    if digits_only.parse::<f64>().is_ok() {
        return true;
    }
    let lower = s.to_ascii_lowercase();
    if ["0x", "0o", "0b"].iter().any(|p| lower.starts_with(p)) {
        return true;
    }
    // Timestamps start with a four-digit year and a dash.
    let bytes = s.as_bytes();
    bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'-'
}

/// go-yaml's key order: character by character, letters by code point,
/// non-letters before letters, a shorter prefix first.
fn go_yaml_key_order(a: &str, b: &str) -> Ordering {
    for (ca, cb) in a.chars().zip(b.chars()) {
        if ca == cb {
            continue;
        }
        return match (ca.is_alphabetic(), cb.is_alphabetic()) {
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => ca.cmp(&cb),
        };
    }
    a.chars().count().cmp(&b.chars().count())
}
