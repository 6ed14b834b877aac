//! Field errors as the real API server reports them: the `details.causes`
//! of a 422 `Invalid` Status and the message `Event "<name>" is invalid:
//! <field>: <type>: <value>: <detail>`, with the same wording, value
//! quoting and ordering (apimachinery's `field.Error` and `NewInvalid`), so
//! that a client sees exactly what a real server would answer.

use hyper::StatusCode;
use serde_json::{json, Value};

use super::http::status_object;

/// The kind of a field error, as `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    /// A required value is missing (`FieldValueRequired`).
    Required,
    /// A value is malformed (`FieldValueInvalid`).
    Invalid,
    /// A value is too long; the value is not shown (`FieldValueTooLong`).
    TooLong,
}

/// The offending value, printed as Go's `%q`, `%v` or `%#v` print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BadValue {
    /// A string, quoted.
    Str(String),
    /// An integer, plain.
    Int(i64),
    /// Anything else, already printed (Go's `%#v` of a struct or slice).
    Printed(String),
}

/// One field error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) kind: ErrorType,
    pub(crate) field: String,
    pub(crate) value: BadValue,
    pub(crate) detail: String,
}

impl ErrorType {
    fn cause_type(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::TooLong => "FieldValueTooLong",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::TooLong => "Too long",
        }
    }
}

impl FieldError {
    /// `field.Required(field, detail)`.
    pub(crate) fn required(field: impl Into<String>, detail: &str) -> Self {
        Self::new(
            ErrorType::Required,
            field,
            BadValue::Str(String::new()),
            detail,
        )
    }

    /// `field.Invalid(field, value, detail)` with a string value.
    pub(crate) fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        Self::new(
            ErrorType::Invalid,
            field,
            BadValue::Str(value.to_owned()),
            detail,
        )
    }

    /// `field.TooLong(field, _, max)`.
    pub(crate) fn too_long(field: impl Into<String>, max_bytes: usize) -> Self {
        let detail = format!("must have at most {max_bytes} bytes");
        Self::new(
            ErrorType::TooLong,
            field,
            BadValue::Str(String::new()),
            &detail,
        )
    }

    pub(crate) fn new(
        kind: ErrorType,
        field: impl Into<String>,
        value: BadValue,
        detail: &str,
    ) -> Self {
        Self {
            kind,
            field: field.into(),
            value,
            detail: detail.to_owned(),
        }
    }

    /// The message without the field, as `ErrorBody()`: required,
    /// and too-long errors do not show the value.
    pub(crate) fn body(&self) -> String {
        let mut body = match (self.kind, &self.value) {
            (ErrorType::Invalid, BadValue::Str(value)) => {
                format!("{}: {}", self.kind.text(), go_quote(value))
            }
            (ErrorType::Invalid, BadValue::Int(value)) => format!("{}: {value}", self.kind.text()),
            (ErrorType::Invalid, BadValue::Printed(value)) => {
                format!("{}: {value}", self.kind.text())
            }
            (kind, _) => kind.text().to_owned(),
        };
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }

    /// `<field>: <body>`.
    pub(crate) fn message(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// The 422 Status body of `NewInvalid` for an object of core `kind` named
/// `name`: the message lists the distinct errors (in brackets when more
/// than one), the causes list every error.
pub(crate) fn invalid_status(kind: &str, name: &str, errors: &[FieldError]) -> Value {
    let mut distinct: Vec<String> = Vec::new();
    for error in errors {
        let message = error.message();
        if !distinct.contains(&message) {
            distinct.push(message);
        }
    }
    let aggregate = match distinct.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let message = if aggregate.is_empty() {
        format!("{kind} {} is invalid", go_quote(name))
    } else {
        format!("{kind} {} is invalid: {aggregate}", go_quote(name))
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|error| {
            json!({
                "reason": error.kind.cause_type(),
                "message": error.body(),
                "field": error.field,
            })
        })
        .collect();
    let mut status = status_object(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &message);
    status["details"] = json!({ "name": name, "kind": kind, "causes": causes });
    status
}

/// `value` as Go's `%q` prints it.
pub(crate) fn go_quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\t' => quoted.push_str("\\t"),
            '\r' => quoted.push_str("\\r"),
            c if c.is_control() && (c as u32) < 0x100 => {
                quoted.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_error_is_the_message_and_several_are_bracketed() {
        let source = FieldError::invalid("source", "", "needs to be unset");
        let status = invalid_status("Event", "node-1.1", std::slice::from_ref(&source));
        assert_eq!(
            status["message"],
            "Event \"node-1.1\" is invalid: source: Invalid value: \"\": needs to be unset"
        );
        assert_eq!(
            status["details"]["causes"][0],
            json!({"reason": "FieldValueInvalid", "message": "Invalid value: \"\": needs to be unset", "field": "source"})
        );

        let action = FieldError::required("action", "");
        let status = invalid_status("Event", "e", &[action.clone(), source, action]);
        assert_eq!(
            status["message"],
            "Event \"e\" is invalid: [action: Required value, source: Invalid value: \"\": needs to be unset]"
        );
        assert_eq!(
            status["details"]["causes"].as_array().map(Vec::len),
            Some(3)
        );
    }

    #[test]
    fn values_are_printed_as_go_prints_them() {
        assert_eq!(go_quote("a\"b\u{1}"), "\"a\\\"b\\x01\"");
        let generation = FieldError::new(
            ErrorType::Invalid,
            "metadata.generation",
            BadValue::Int(-1),
            "must be greater than or equal to 0",
        );
        assert_eq!(
            generation.message(),
            "metadata.generation: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(
            FieldError::too_long("metadata.annotations", 262144).message(),
            "metadata.annotations: Too long: must have at most 262144 bytes"
        );
    }
}
