//! The crate's error type.

use std::path::PathBuf;

use crate::validation::ValidationErrors;

/// Everything that can go wrong while loading, resolving or writing configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("reading configuration file {path}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration file could not be written.
    #[error("writing configuration file {path}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not well-formed YAML or JSON.
    #[error("parsing {origin}: not valid YAML or JSON: {message}")]
    Syntax {
        /// The file (or `<input>`).
        origin: String,
        /// What the parser reported, with line and column when known.
        message: String,
    },
    /// The document is not a mapping.
    #[error("parsing {origin}: expected a {expected_kind} object (a YAML/JSON mapping) at the top level")]
    NotAnObject {
        /// The file (or `<input>`).
        origin: String,
        /// Always `KubeProxyConfiguration`.
        expected_kind: &'static str,
    },
    /// apiVersion or kind are missing or name another type.
    #[error("{origin}: apiVersion {api_version:?} and kind {kind:?} are not supported; expected apiVersion {expected_api_version:?} and kind {expected_kind:?}")]
    WrongType {
        /// The file (or `<input>`).
        origin: String,
        /// The apiVersion found (empty if missing).
        api_version: String,
        /// The kind found (empty if missing).
        kind: String,
        /// The supported apiVersion.
        expected_api_version: &'static str,
        /// The supported kind.
        expected_kind: &'static str,
    },
    /// A field has a value of the wrong type or form.
    #[error("{origin}: field {field}: {source}")]
    FieldType {
        /// The file (or `<input>`).
        origin: String,
        /// Dotted path of the field, e.g. `iptables.masqueradeBit`.
        field: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The configuration could not be serialized.
    #[error("serializing the configuration")]
    Serialize {
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A command-line flag has a value that cannot be used.
    #[error("invalid value {value:?} for flag --{flag}: {reason}")]
    InvalidFlag {
        /// The flag name, without dashes.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        reason: String,
    },
    /// The resolved configuration failed validation.
    #[error("invalid configuration:\n{0}")]
    Invalid(#[source] ValidationErrors),
}
