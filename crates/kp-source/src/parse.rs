//! Turning the text of one manifest file into objects and problems.
//!
//! YAML files are split into documents at `---` lines before parsing, so a
//! syntax error in one document leaves the others readable. JSON files hold
//! one or more concatenated JSON values. Each document is an object of a
//! known kind or a `List` of them; every document that fails a check is
//! reported and skipped.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kp_model::ResourceKind;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{DocumentLocation, ManifestError, ManifestProblem, ObjectIdentity};
use crate::limits;
use crate::object::{KubeObject, ManifestObject};
use crate::validate::{self, FieldProblem};

/// The namespace of a namespaced object that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// What a document's `apiVersion`/`kind` pair stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DocumentType {
    /// One object.
    Object(ResourceKind),
    /// A list whose items carry their own kind (`v1/List`), or default to
    /// the given kind (`ServiceList`, …).
    List(Option<ResourceKind>),
}

/// The results of reading one file.
#[derive(Debug, Default)]
struct Collected {
    objects: Vec<ManifestObject>,
    errors: Vec<ManifestError>,
}

/// Parses the text of the manifest file at `path` (used for error reports,
/// and its extension: `.json` is read as JSON, anything else as YAML).
/// Returns the valid objects, with `metadata.namespace` defaulted, in
/// document order, and one error per problem; a document with a problem of
/// severity error yields no object. Never panics, whatever the text.
pub fn parse_documents(path: &Path, text: &str) -> (Vec<ManifestObject>, Vec<ManifestError>) {
    let mut collected = Collected::default();
    let is_json = path
        .extension()
        .is_some_and(|extension| extension.eq_ignore_ascii_case("json"));
    if is_json {
        parse_json(path, text, &mut collected);
    } else {
        parse_yaml(path, text, &mut collected);
    }
    (collected.objects, collected.errors)
}

fn parse_json(path: &Path, text: &str, collected: &mut Collected) {
    let file = DocumentLocation::document(path, 0);
    if let Some(line) = limits::too_deep_at(text) {
        let problem = ManifestProblem::TooDeep {
            limit: limits::MAX_FLOW_DEPTH,
        };
        return collected.error(file.at_line(line), ObjectIdentity::default(), problem);
    }
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut index = 0;
    loop {
        let start = stream.byte_offset();
        let Some(document) = stream.next() else {
            return;
        };
        let location = DocumentLocation::document(path, index).at_line(line_of_value(text, start));
        index += 1;
        match document {
            Ok(Value::Null) => {}
            Ok(value) => collected.document(location, value),
            Err(error) => {
                // The stream cannot resynchronise after a syntax error.
                let location = location.at_line(error.line());
                let problem = ManifestProblem::Json(Arc::new(error));
                return collected.error(location, ObjectIdentity::default(), problem);
            }
        }
    }
}

/// The 1-based line of the first non-blank character at or after `offset`.
fn line_of_value(text: &str, offset: usize) -> usize {
    let rest = text.get(offset..).unwrap_or_default();
    let blank = rest.len() - rest.trim_start().len();
    let end = (offset + blank).min(text.len());
    1 + text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

fn parse_yaml(path: &Path, text: &str, collected: &mut Collected) {
    for (index, (first_line, chunk)) in split_yaml_documents(text).into_iter().enumerate() {
        let location = DocumentLocation::document(path, index);
        let document_line = first_line + 1 + usize::from(chunk.starts_with("---"));
        if let Some(line) = limits::too_deep_at(chunk) {
            let problem = ManifestProblem::TooDeep {
                limit: limits::MAX_FLOW_DEPTH,
            };
            let location = location.at_line(first_line + line);
            collected.error(location, ObjectIdentity::default(), problem);
            continue;
        }
        match serde_yaml_ng::from_str::<Value>(chunk) {
            Ok(Value::Null) => {}
            Ok(value) => collected.document(location.at_line(document_line), value),
            Err(error) => {
                // Lines count from the document's start; report them from
                // the file's.
                let line = error
                    .location()
                    .map_or(document_line, |at| first_line + at.line());
                let message = shift_line_numbers(&error.to_string(), first_line);
                let problem = ManifestProblem::Yaml { message };
                collected.error(location.at_line(line), ObjectIdentity::default(), problem);
            }
        }
    }
}

/// Adds `offset` to every `line N` in a parser message.
fn shift_line_numbers(message: &str, offset: usize) -> String {
    const MARKER: &str = "line ";
    let mut shifted = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(MARKER) {
        let (before, after) = rest.split_at(at + MARKER.len());
        shifted.push_str(before);
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        match after[..digits].parse::<usize>() {
            Ok(line) => shifted.push_str(&(line + offset).to_string()),
            Err(_) => shifted.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    shifted.push_str(rest);
    shifted
}

/// Splits YAML text into documents at lines starting with `---`, returning
/// each document's 0-based first line and text. Text before the first
/// separator counts as a document only if it holds more than comments.
fn split_yaml_documents(text: &str) -> Vec<(usize, &str)> {
    let mut starts = vec![(0, 0)];
    let mut offset = 0;
    for (line_number, line) in text.split_inclusive('\n').enumerate() {
        let is_separator = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if is_separator && offset > 0 {
            starts.push((line_number, offset));
        }
        offset += line.len();
    }
    let mut documents = Vec::with_capacity(starts.len());
    for (i, &(line, start)) in starts.iter().enumerate() {
        let end = starts.get(i + 1).map_or(text.len(), |&(_, end)| end);
        documents.push((line, &text[start..end]));
    }
    let preamble_is_empty = documents.first().is_some_and(|(_, preamble)| {
        preamble.lines().all(|line| {
            let line = line.trim();
            line.is_empty() || line.starts_with('#') || line.starts_with('%') || line == "---"
        })
    });
    // A stream that starts with `---` (after comments) has its first document
    // after that line; the preamble is not a document of its own.
    if preamble_is_empty && documents.len() > 1 {
        documents.remove(0);
    }
    documents
}

impl Collected {
    fn error(
        &mut self,
        location: DocumentLocation,
        object: ObjectIdentity,
        problem: ManifestProblem,
    ) {
        self.errors
            .push(ManifestError::new(location, object, problem));
    }

    /// Handles one top-level document: an object or a list of them.
    fn document(&mut self, location: DocumentLocation, value: Value) {
        match document_type(&value) {
            Ok(DocumentType::List(item_kind)) => self.list(location, value, item_kind),
            Ok(DocumentType::Object(_)) => self.object(location, value, None),
            Err(problem) => self.error(location, identity_of(&value, None), problem),
        }
    }

    fn list(
        &mut self,
        location: DocumentLocation,
        mut value: Value,
        item_kind: Option<ResourceKind>,
    ) {
        let items = match value.get_mut("items").map(Value::take) {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(_) => {
                let problem = ManifestProblem::InvalidField {
                    field: "items".to_owned(),
                    reason: "must be a list of objects".to_owned(),
                };
                return self.error(location, identity_of(&value, None), problem);
            }
        };
        for (index, item) in items.into_iter().enumerate() {
            self.object(location.with_item(index), item, item_kind);
        }
    }

    /// Handles one object; `default_kind` fills in `apiVersion`/`kind` for the
    /// items of a typed list (`ServiceList`), which usually omit them.
    fn object(
        &mut self,
        location: DocumentLocation,
        mut value: Value,
        default_kind: Option<ResourceKind>,
    ) {
        if let (Some(kind), Value::Object(map)) = (default_kind, &mut value) {
            let (api_version, kind_name) = type_of(kind);
            map.entry("apiVersion")
                .or_insert_with(|| api_version.into());
            map.entry("kind").or_insert_with(|| kind_name.into());
        }
        let kind = match document_type(&value) {
            Ok(DocumentType::Object(kind)) => kind,
            Ok(DocumentType::List(_)) => {
                let kind = kind_string(&value).unwrap_or_default().to_owned();
                let problem = ManifestProblem::NestedList { kind };
                return self.error(location, identity_of(&value, None), problem);
            }
            Err(problem) => return self.error(location, identity_of(&value, None), problem),
        };
        let identity = identity_of(&value, Some(kind));
        match decode(kind, value) {
            Ok(object) => self.objects.push(ManifestObject { location, object }),
            Err(problems) => {
                for problem in problems {
                    self.error(location.clone(), identity.clone(), problem);
                }
            }
        }
    }
}

/// Decodes and checks one object of `kind`.
fn decode(kind: ResourceKind, value: Value) -> Result<KubeObject, Vec<ManifestProblem>> {
    let required = validate::check_required_fields(kind, &value);
    if !required.is_empty() {
        return Err(required.into_iter().map(invalid_field).collect());
    }
    let (object, problems) = match kind {
        ResourceKind::Service => {
            let mut service: Service = decode_typed(value)?;
            default_namespace(&mut service.metadata);
            let problems = validate::validate_service(&service);
            (KubeObject::Service(service), problems)
        }
        ResourceKind::EndpointSlice => {
            let mut slice: EndpointSlice = decode_typed(value)?;
            default_namespace(&mut slice.metadata);
            let problems = validate::validate_endpoint_slice(&slice);
            (KubeObject::EndpointSlice(slice), problems)
        }
        ResourceKind::Node => {
            let mut node: Node = decode_typed(value)?;
            // Nodes are cluster-scoped; a namespace would only split identities.
            node.metadata.namespace = None;
            let problems = validate::validate_node(&node);
            (KubeObject::Node(node), problems)
        }
    };
    if problems.is_empty() {
        Ok(object)
    } else {
        Err(problems.into_iter().map(invalid_field).collect())
    }
}

fn decode_typed<T: DeserializeOwned>(value: Value) -> Result<T, Vec<ManifestProblem>> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let path = if path == "." {
            "(document)".to_owned()
        } else {
            path
        };
        vec![ManifestProblem::Decode {
            path,
            source: Arc::new(error.into_inner()),
        }]
    })
}

fn invalid_field(problem: FieldProblem) -> ManifestProblem {
    ManifestProblem::InvalidField {
        field: problem.field,
        reason: problem.reason,
    }
}

fn default_namespace(metadata: &mut ObjectMeta) {
    if metadata.namespace.as_deref().is_none_or(str::is_empty) {
        metadata.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
}

/// Reads `apiVersion` and `kind` and checks that they go together.
fn document_type(value: &Value) -> Result<DocumentType, ManifestProblem> {
    if !value.is_object() {
        return Err(ManifestProblem::NotAnObject);
    }
    let kind = kind_string(value).ok_or(ManifestProblem::MissingTypeField {
        field: "kind",
        example: "Service",
    })?;
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
        .ok_or(ManifestProblem::MissingTypeField {
            field: "apiVersion",
            example: "v1",
        })?;
    let (expected, document_type) = match kind {
        "Service" => ("v1", DocumentType::Object(ResourceKind::Service)),
        "EndpointSlice" => (
            "discovery.k8s.io/v1",
            DocumentType::Object(ResourceKind::EndpointSlice),
        ),
        "Node" => ("v1", DocumentType::Object(ResourceKind::Node)),
        "List" => ("v1", DocumentType::List(None)),
        "ServiceList" => ("v1", DocumentType::List(Some(ResourceKind::Service))),
        "EndpointSliceList" => (
            "discovery.k8s.io/v1",
            DocumentType::List(Some(ResourceKind::EndpointSlice)),
        ),
        "NodeList" => ("v1", DocumentType::List(Some(ResourceKind::Node))),
        other => {
            return Err(ManifestProblem::UnknownKind {
                kind: other.to_owned(),
            })
        }
    };
    if api_version != expected {
        return Err(ManifestProblem::WrongApiVersion {
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
            expected,
        });
    }
    Ok(document_type)
}

/// `kind`, unless absent or empty (`kind: ""`, or a block scalar with no
/// lines), which is no kind at all.
fn kind_string(value: &Value) -> Option<&str> {
    value
        .get("kind")
        .and_then(Value::as_str)
        .filter(|kind| !kind.is_empty())
}

/// `apiVersion` and `kind` of `kind`.
fn type_of(kind: ResourceKind) -> (&'static str, &'static str) {
    match kind {
        ResourceKind::Service => ("v1", "Service"),
        ResourceKind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
        ResourceKind::Node => ("v1", "Node"),
    }
}

/// What the raw document tells about the object, for error reports. Once
/// the kind is known to be namespaced, the namespace is shown defaulted.
fn identity_of(value: &Value, kind: Option<ResourceKind>) -> ObjectIdentity {
    let metadata_string = |field: &str| {
        value
            .get("metadata")
            .and_then(|metadata| metadata.get(field))
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .map(str::to_owned)
    };
    let namespace = match kind {
        Some(ResourceKind::Node) => None,
        Some(_) => metadata_string("namespace").or_else(|| Some(DEFAULT_NAMESPACE.to_owned())),
        None => metadata_string("namespace"),
    };
    ObjectIdentity {
        kind: kind_string(value).map(str::to_owned),
        namespace,
        name: metadata_string("name"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(text: &str) -> Vec<usize> {
        split_yaml_documents(text)
            .into_iter()
            .map(|(line, _)| line)
            .collect()
    }

    #[test]
    fn documents_are_split_at_separator_lines_only() {
        assert_eq!(starts("a: 1\n---\nb: 2\n"), vec![0, 1]);
        assert_eq!(starts("---\na: 1\n--- \nb: 2\n"), vec![0, 2]);
        assert_eq!(starts("# header\n---\na: 1\n"), vec![1]);
        assert_eq!(starts("a: '---'\nb: |\n  ---\n---x: 1\n"), vec![0]);
        assert_eq!(starts(""), vec![0]);
    }

    #[test]
    fn parser_line_numbers_count_from_the_top_of_the_file() {
        assert_eq!(
            shift_line_numbers("bad at line 2 column 1, while x at line 1 column 3", 10),
            "bad at line 12 column 1, while x at line 11 column 3"
        );
        assert_eq!(
            shift_line_numbers("no numbers; line x", 3),
            "no numbers; line x"
        );
    }
}
