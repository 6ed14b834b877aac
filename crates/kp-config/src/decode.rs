//! Loading configuration files: strict first, lenient with a warning.
//!
//! Upstream decodes strictly (unknown and duplicate fields are errors) and,
//! when that fails only because of such fields, decodes again leniently and
//! logs a warning. This module does the same in one pass: the document is
//! read into a tree while duplicate keys are noted, unknown keys are found by
//! comparing the tree with the schema, and any other problem (syntax, wrong
//! apiVersion/kind, a value of the wrong type) is an error.

use std::cell::RefCell;
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Value};

use crate::duration::GoDuration;
use crate::error::ConfigError;
use crate::types::{KubeProxyConfiguration, VModuleItem, API_VERSION, KIND};

/// A loaded, defaulted configuration and the warnings decoding produced.
pub type Loaded = (KubeProxyConfiguration, Vec<String>);

/// Reads and decodes a YAML or JSON configuration file, then applies defaults.
///
/// Unknown or duplicate fields do not fail the load; they are named in the
/// returned warnings. The result is not validated; call [`crate::validate`].
pub fn load_file(path: impl AsRef<Path>) -> Result<Loaded, ConfigError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    load_str(&text, &path.display().to_string())
}

/// Decodes configuration text; `origin` names it in errors and warnings.
pub fn load_str(text: &str, origin: &str) -> Result<Loaded, ConfigError> {
    let duplicates = RefCell::new(Vec::new());
    let tree = parse_tree(text, origin, &duplicates)?;
    let Value::Object(object) = &tree else {
        if tree.is_null() {
            return Err(wrong_type(origin, "", ""));
        }
        return Err(ConfigError::NotAnObject {
            origin: origin.to_owned(),
            expected_kind: KIND,
        });
    };
    check_type_meta(object, origin)?;

    let mut unknown = Vec::new();
    find_unknown_fields(&tree, &schema_tree(), "", &mut unknown);
    let mut cfg: KubeProxyConfiguration =
        serde_path_to_error::deserialize(tree).map_err(|err| ConfigError::FieldType {
            origin: origin.to_owned(),
            field: err.path().to_string(),
            source: err.into_inner(),
        })?;
    cfg.apply_defaults();

    let mut problems: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    problems.extend(
        duplicates
            .into_inner()
            .iter()
            .map(|f| format!("duplicate field {f:?}")),
    );
    let warnings = if problems.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "{origin}: strict decoding failed, loaded leniently: {}",
            problems.join(", ")
        )]
    };
    Ok((cfg, warnings))
}

fn wrong_type(origin: &str, api_version: &str, kind: &str) -> ConfigError {
    ConfigError::WrongType {
        origin: origin.to_owned(),
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        expected_api_version: API_VERSION,
        expected_kind: KIND,
    }
}

fn check_type_meta(object: &Map<String, Value>, origin: &str) -> Result<(), ConfigError> {
    let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    if api_version == API_VERSION && kind == KIND {
        Ok(())
    } else {
        Err(wrong_type(origin, api_version, kind))
    }
}

/// Parses JSON (text starting with `{`) or YAML into a tree, noting duplicate keys.
fn parse_tree(
    text: &str,
    origin: &str,
    duplicates: &RefCell<Vec<String>>,
) -> Result<Value, ConfigError> {
    let seed = TreeSeed {
        path: String::new(),
        duplicates,
    };
    let syntax = |message: String| ConfigError::Syntax {
        origin: origin.to_owned(),
        message,
    };
    if text.trim_start().starts_with('{') {
        let mut de = serde_json::Deserializer::from_str(text);
        let tree = seed
            .deserialize(&mut de)
            .map_err(|e| syntax(e.to_string()))?;
        de.end().map_err(|e| syntax(e.to_string()))?;
        Ok(tree)
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        seed.deserialize(de).map_err(|e| syntax(e.to_string()))
    }
}

/// Builds a `serde_json::Value` from any self-describing format, recording
/// the path of every key that appears twice in one mapping (the last wins,
/// as in Go's decoder).
struct TreeSeed<'a> {
    path: String,
    duplicates: &'a RefCell<Vec<String>>,
}

impl TreeSeed<'_> {
    fn child(&self, segment: &str) -> Self {
        let path = if self.path.is_empty() {
            segment.to_owned()
        } else if segment.starts_with('[') {
            format!("{}{segment}", self.path)
        } else {
            format!("{}.{segment}", self.path)
        };
        TreeSeed {
            path,
            duplicates: self.duplicates,
        }
    }
}

impl<'de> DeserializeSeed<'de> for TreeSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TreeSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("{}: {v} is not a finite number", self.path)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.child(&format!("[{}]", items.len())))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(&key);
            let value = map.next_value_seed(TreeSeed {
                path: child.path.clone(),
                duplicates: self.duplicates,
            })?;
            if object.insert(key, value).is_some() {
                self.duplicates.borrow_mut().push(child.path);
            }
        }
        Ok(Value::Object(object))
    }
}

/// The serialized form of a configuration with every optional field present:
/// the set of field names a file may use.
fn schema_tree() -> Value {
    let mut cfg = KubeProxyConfiguration::defaulted();
    cfg.feature_gates.insert("Any".to_owned(), true);
    cfg.windows_run_as_service = true;
    // Written only when not the default.
    cfg.udp_idle_timeout = GoDuration::from_secs(1);
    cfg.iptables.snat_node_internal_ip = Some(true);
    cfg.ipvs.exclude_cidrs = Some(Vec::new());
    cfg.node_port_addresses = Some(Vec::new());
    cfg.logging.vmodule.push(VModuleItem::default());
    cfg.logging.options.text.split_stream = true;
    cfg.logging.options.json.split_stream = true;
    serde_json::to_value(&cfg).unwrap_or(Value::Null)
}

/// Paths whose keys are data (names), not field names.
const FREE_FORM_PATHS: [&str; 1] = ["featureGates"];

fn find_unknown_fields(input: &Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    if FREE_FORM_PATHS.contains(&path) {
        return;
    }
    match (input, schema) {
        (Value::Object(fields), Value::Object(known)) => {
            for (key, value) in fields {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match known.get(key) {
                    Some(field_schema) => find_unknown_fields(value, field_schema, &child, unknown),
                    None => unknown.push(child),
                }
            }
        }
        (Value::Array(items), Value::Array(known)) => {
            if let Some(item_schema) = known.first() {
                for (i, item) in items.iter().enumerate() {
                    find_unknown_fields(item, item_schema, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}
