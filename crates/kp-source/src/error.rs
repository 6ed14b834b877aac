//! What can go wrong while reading manifests.
//!
//! Two levels: a [`SourceError`] stops the source (the manifest path does not
//! exist at start, the watcher cannot be set up); a [`ManifestError`] concerns
//! one file or one document, which is skipped (or, for a warning, delivered
//! anyway) while everything else keeps working.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a document sits: the file, the document's 0-based index within the
/// file (YAML documents separated by `---`, or concatenated JSON values), and
/// for an object inside a `List` its 0-based index in `items`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DocumentLocation {
    /// The file, as found under the manifest path.
    pub path: PathBuf,
    /// Index of the document within the file; `None` for a problem with the
    /// whole file (it could not be read).
    pub document: Option<usize>,
    /// Index within the `items` of a `List`.
    pub item: Option<usize>,
    /// The 1-based line of the file the problem concerns: where parsing
    /// broke, or the document's first line.
    pub line: Option<usize>,
}

/// What is known about the object a problem concerns: any of kind,
/// namespace and name, as far as the document told them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectIdentity {
    /// `kind`, e.g. `Service`.
    pub kind: Option<String>,
    /// `metadata.namespace` (after defaulting to `default`).
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: Option<String>,
}

/// The object that holds a value another object claims, and where it is
/// defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holding object.
    pub object: ObjectIdentity,
    /// Where it is defined.
    pub location: DocumentLocation,
}

/// How serious a [`ManifestError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The document was skipped.
    Error,
    /// The object was delivered anyway; the manifests look inconsistent.
    Warning,
}

/// What is wrong with a file or a document. Clonable (causes are shared) as
/// the problems of an unchanged file are reported again without parsing it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestProblem {
    /// Reading the file failed.
    #[error("could not read the file: {0}")]
    Read(#[source] Arc<io::Error>),
    /// The file is not UTF-8 text.
    #[error("the file is not valid UTF-8 text")]
    NotUtf8,
    /// Parsing a YAML document failed.
    #[error("malformed YAML: {message}")]
    Yaml {
        /// The parser's message, its line numbers counted from the top of
        /// the file.
        message: String,
    },
    /// The file is larger than the source reads.
    #[error("the file has {bytes} bytes, more than the {limit} a manifest file may have")]
    TooLarge {
        /// The file's size.
        bytes: u64,
        /// The largest size read.
        limit: u64,
    },
    /// Flow collections nest deeper than the source parses.
    #[error(
        "brackets nest more than {limit} levels deep (no manifest needs that many; not parsed)"
    )]
    TooDeep {
        /// The deepest nesting parsed.
        limit: usize,
    },
    /// Parsing a JSON document failed.
    #[error("malformed JSON: {0}")]
    Json(#[source] Arc<serde_json::Error>),
    /// The document is a scalar or a sequence, not an object.
    #[error(
        "the document is not a mapping (expected a Kubernetes object with apiVersion and kind)"
    )]
    NotAnObject,
    /// `apiVersion` or `kind` is absent or not a string.
    #[error("{field} is missing (expected a string such as {example:?})")]
    MissingTypeField {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// A valid value.
        example: &'static str,
    },
    /// The kind is not one the proxy reads.
    #[error(
        "kind {} is not supported (expected Service, EndpointSlice, Node, or a List of them)",
        shown(.kind)
    )]
    UnknownKind {
        /// The kind found.
        kind: String,
    },
    /// The apiVersion does not serve this kind.
    #[error("apiVersion {api_version} is not valid for kind {kind} (expected {expected})")]
    WrongApiVersion {
        /// The kind found.
        kind: String,
        /// The apiVersion found.
        api_version: String,
        /// The apiVersion that serves this kind.
        expected: &'static str,
    },
    /// An item of a `List` is itself a list.
    #[error("a List item cannot itself be a List (kind {kind})")]
    NestedList {
        /// The item's kind.
        kind: String,
    },
    /// The document does not match the object's schema (a field has the
    /// wrong type).
    #[error("{path}: {source}")]
    Decode {
        /// Path of the offending field, e.g. `spec.ports[0].port`.
        path: String,
        /// What the decoder expected.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A field holds a value the proxy cannot use.
    #[error("{field}: {reason}")]
    InvalidField {
        /// Path of the field, e.g. `spec.ports[0].port`.
        field: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// An EndpointSlice names a Service that no manifest defines.
    #[error("the Service {namespace}/{service} named by label kubernetes.io/service-name is not in the manifests (the EndpointSlice is used anyway)")]
    UnknownService {
        /// The slice's namespace.
        namespace: String,
        /// The label's value.
        service: String,
    },
    /// The object claims what an object earlier in path order already holds
    /// (a NodePort, a ClusterIP), which the API server would refuse.
    #[error("{field}: {reason} (held by {held_by})")]
    Conflict {
        /// The field whose value is taken, e.g. `spec.ports[0].nodePort`.
        field: String,
        /// The API server's message, e.g. `Invalid value: 30080: provided
        /// port is already allocated`.
        reason: String,
        /// The object that holds the value (boxed: rare, and large).
        held_by: Box<Holder>,
    },
    /// The same object is defined twice; this later definition wins.
    #[error("also defined at {earlier}; this later definition is used")]
    Duplicate {
        /// Where the earlier, overridden definition sits.
        earlier: DocumentLocation,
    },
}

/// A problem with one file or one document of the manifests.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{location}: {}{problem}", IdentityPrefix(object))]
pub struct ManifestError {
    /// Where the document sits.
    pub location: DocumentLocation,
    /// The object concerned, as far as known.
    pub object: ObjectIdentity,
    /// What is wrong.
    pub problem: ManifestProblem,
}

/// Why the manifest source cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The manifest path does not exist (checked at start).
    #[error(
        "manifest path {path} does not exist (expected a YAML/JSON file or a directory of them)"
    )]
    PathNotFound {
        /// The configured path.
        path: PathBuf,
    },
    /// Inspecting or listing the manifest path failed.
    #[error("could not read manifest path {path}")]
    ReadPath {
        /// The path being read.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Setting up the file watcher failed.
    #[error("could not watch manifest path {path} for changes")]
    Watch {
        /// The path being watched.
        path: PathBuf,
        /// The cause.
        #[source]
        source: notify::Error,
    },
    /// The background task that reads the manifests stopped unexpectedly.
    #[error("the task reading manifest path {path} failed")]
    Task {
        /// The configured path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// `text` as it is when plain, else quoted and escaped: names from a manifest
/// may hold newlines or quotes, which must not forge log lines.
fn shown(text: &str) -> String {
    if crate::names::is_plain(text) {
        text.to_owned()
    } else {
        crate::names::quoted(text)
    }
}

/// Displays an [`ObjectIdentity`] followed by `": "`, or nothing when
/// nothing is known.
struct IdentityPrefix<'a>(&'a ObjectIdentity);

impl DocumentLocation {
    /// The whole file at `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            document: None,
            item: None,
            line: None,
        }
    }

    /// Document `document` of the file at `path`.
    pub fn document(path: impl Into<PathBuf>, document: usize) -> Self {
        Self {
            path: path.into(),
            document: Some(document),
            item: None,
            line: None,
        }
    }

    /// The same place, at 1-based line `line` of the file.
    pub fn at_line(&self, line: usize) -> Self {
        Self {
            line: Some(line),
            ..self.clone()
        }
    }

    /// The same document, item `item` of its `List`.
    pub fn with_item(&self, item: usize) -> Self {
        Self {
            item: Some(item),
            ..self.clone()
        }
    }
}

impl fmt::Display for DocumentLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        match (self.document, self.item) {
            (Some(document), Some(item)) => write!(f, " (document {document}, item {item})"),
            (Some(document), None) => write!(f, " (document {document})"),
            (None, _) => Ok(()),
        }
    }
}

impl fmt::Display for ObjectIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = shown(self.kind.as_deref().unwrap_or("object"));
        let namespace = self.namespace.as_deref().map(shown);
        let name = self.name.as_deref().map(shown);
        match (namespace, name) {
            (Some(namespace), Some(name)) => write!(f, "{kind} {namespace}/{name}"),
            (None, Some(name)) => write!(f, "{kind} {name}"),
            (Some(namespace), None) => write!(f, "{kind} in namespace {namespace} (no name)"),
            (None, None) => write!(f, "{kind}"),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.object, self.location)
    }
}

impl fmt::Display for IdentityPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self.0 == ObjectIdentity::default() {
            Ok(())
        } else {
            write!(f, "{}: ", self.0)
        }
    }
}

impl ManifestProblem {
    /// Whether the document was skipped ([`Severity::Error`]) or delivered
    /// anyway ([`Severity::Warning`]).
    pub fn severity(&self) -> Severity {
        match self {
            Self::UnknownService { .. } | Self::Duplicate { .. } => Severity::Warning,
            _ => Severity::Error,
        }
    }
}

impl ManifestError {
    /// A problem with the document at `location`.
    pub fn new(
        location: DocumentLocation,
        object: ObjectIdentity,
        problem: ManifestProblem,
    ) -> Self {
        Self {
            location,
            object,
            problem,
        }
    }

    /// Whether the document was skipped or delivered anyway.
    pub fn severity(&self) -> Severity {
        self.problem.severity()
    }
}
