//! Objects as kube-rs' watcher holds them: compact JSON, typed only when the
//! source delivers them.
//!
//! The watcher lists a kind in one response and keeps every item of it
//! until it has handed out the last one. Typed, the 10,000 EndpointSlices
//! of a large cluster take some 33 MB (every optional field of every
//! endpoint and of its metadata); as JSON without `managedFields`, about a
//! sixth of that.
//!
//! Each item is copied, value by value, out of the response into JSON text
//! of its own, without `metadata.managedFields` (nothing downstream reads
//! them, and they are often the largest part of an object) and without
//! `metadata.resourceVersion`, which is kept beside the text with the
//! object's namespace and name. The text so holds exactly what the source
//! compares to tell a changed object from a rewritten one: a relist hashes
//! it, and only an object that changed is parsed into its typed form, once,
//! when it is delivered. Copying is a single pass without an allocation per
//! field; typing every item as it arrived, writing it back out and typing
//! it again took three passes, each allocating every string of the object.
//!
//! What the copy checks is the JSON's syntax and that the object is an
//! object whose namespace, name and resourceVersion are strings; an object
//! that passes and still does not type (a field of the wrong kind) is
//! refused when it is delivered, by the source, for that object alone.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use serde::Deserialize;

/// An object of kind `K` as JSON text, with the metadata the source and the
/// watcher read without typing it: namespace, name and resourceVersion.
///
/// The watcher reads an object's metadata (the resourceVersion it resumes
/// watching from) only from watched objects, never from listed ones, so the
/// `ObjectMeta` it is read through (some 360 bytes) is built on first use.
pub(super) struct Compact<K> {
    /// `namespace/name` (`/name` for a cluster-scoped object): neither part
    /// can contain a slash.
    key: Box<str>,
    resource_version: Option<Box<str>>,
    json: Box<[u8]>,
    meta: OnceCell<Box<ObjectMeta>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Compact<K> {
    /// `namespace/name`, as the object's metadata says.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    pub(super) fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// A hash of the object without its resourceVersion and managedFields.
    pub(super) fn content_hash(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hasher.write(&self.json);
        hasher.finish()
    }

    fn new_meta(&self) -> Box<ObjectMeta> {
        let (namespace, name) = self.key.split_once('/').unwrap_or(("", &self.key));
        Box::new(ObjectMeta {
            namespace: Some(namespace.to_owned()).filter(|namespace| !namespace.is_empty()),
            name: Some(name.to_owned()).filter(|name| !name.is_empty()),
            resource_version: self.resource_version.as_deref().map(str::to_owned),
            ..ObjectMeta::default()
        })
    }
}

impl<K: DeserializeOwned + Resource> Compact<K> {
    /// The typed object, with its resourceVersion.
    pub(super) fn object(&self) -> Result<K, serde_json::Error> {
        let mut object: K = serde_json::from_slice(&self.json)?;
        object.meta_mut().resource_version = self.resource_version.as_deref().map(str::to_owned);
        Ok(object)
    }
}

impl<'de, K> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut json = Vec::with_capacity(512);
        let mut found = Found::default();
        deserializer.deserialize_map(Copier {
            out: &mut json,
            place: Place::Top,
            found: &mut found,
            comma: false,
        })?;
        let namespace = found.namespace.unwrap_or_default();
        let name = found.name.unwrap_or_default();
        Ok(Self {
            key: format!("{namespace}/{name}").into_boxed_str(),
            resource_version: found.resource_version.map(String::into_boxed_str),
            json: json.into_boxed_slice(),
            meta: OnceCell::new(),
            kind: PhantomData,
        })
    }
}

/// Where a value sits in the object, as far as copying it cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The object itself.
    Top,
    /// Its `metadata`.
    Metadata,
    /// Anything else.
    Within,
}

/// What the copy keeps beside the text.
#[derive(Default)]
struct Found {
    namespace: Option<String>,
    name: Option<String>,
    resource_version: Option<String>,
}

/// Copies one JSON value to `out`, compact, dropping `metadata.managedFields`
/// and taking `metadata.resourceVersion`, `namespace` and `name` into
/// `found` (the last two are copied too).
struct Copier<'a> {
    out: &'a mut Vec<u8>,
    place: Place,
    found: &'a mut Found,
    /// Whether a comma goes before the value (an array's later elements).
    comma: bool,
}

impl Copier<'_> {
    fn start(&mut self) {
        if self.comma {
            self.out.push(b',');
        }
    }

    fn write<T: serde::Serialize + ?Sized, E: de::Error>(&mut self, value: &T) -> Result<(), E> {
        self.start();
        write_json(self.out, value)
    }
}

fn write_json<T: serde::Serialize + ?Sized, E: de::Error>(
    out: &mut Vec<u8>,
    value: &T,
) -> Result<(), E> {
    serde_json::to_writer(out, value).map_err(E::custom)
}

impl<'de> DeserializeSeed<'de> for Copier<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Copier<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.place {
            Place::Top => f.write_str("an object"),
            Place::Metadata | Place::Within => f.write_str("a JSON value"),
        }
    }

    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.start();
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E: de::Error>(mut self, value: bool) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_i64<E: de::Error>(mut self, value: i64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_u64<E: de::Error>(mut self, value: u64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_f64<E: de::Error>(mut self, value: f64) -> Result<(), E> {
        self.write(&value)
    }

    fn visit_str<E: de::Error>(mut self, value: &str) -> Result<(), E> {
        self.write(value)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.start();
        self.out.push(b'[');
        let mut comma = false;
        while seq
            .next_element_seed(Copier {
                out: &mut *self.out,
                place: Place::Within,
                found: &mut *self.found,
                comma,
            })?
            .is_some()
        {
            comma = true;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.start();
        self.out.push(b'{');
        let mut first = true;
        while let Some(field) = map.next_key_seed(FieldName)? {
            let inner = match (self.place, field.as_ref()) {
                (Place::Metadata, "managedFields") => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                (Place::Metadata, "resourceVersion") => {
                    self.found.resource_version = map.next_value()?;
                    continue;
                }
                (Place::Top, "metadata") => Place::Metadata,
                _ => Place::Within,
            };
            if !first {
                self.out.push(b',');
            }
            first = false;
            write_json(self.out, field.as_ref())?;
            self.out.push(b':');
            let kept = match (self.place, field.as_ref()) {
                (Place::Metadata, "namespace") => Some(&mut self.found.namespace),
                (Place::Metadata, "name") => Some(&mut self.found.name),
                _ => None,
            };
            match kept {
                Some(kept) => {
                    let value: Option<String> = map.next_value()?;
                    write_json(self.out, &value)?;
                    *kept = value;
                }
                None => map.next_value_seed(Copier {
                    out: &mut *self.out,
                    place: inner,
                    found: &mut *self.found,
                    comma: false,
                })?,
            }
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// A field name, borrowed from the input where it has no escapes.
struct FieldName;

impl<'de> DeserializeSeed<'de> for FieldName {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldName {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(value))
    }
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            resource_version: self.resource_version.clone(),
            json: self.json.clone(),
            meta: self.meta.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compact")
            .field("key", &self.key)
            .field("resource_version", &self.resource_version)
            .field("json_bytes", &self.json.len())
            .finish()
    }
}

/// Requested exactly like `K`: the same group, version, kind and path.
impl<K: Resource<DynamicType = ()>> Resource for Compact<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn url_path(dt: &(), namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn meta(&self) -> &ObjectMeta {
        self.meta.get_or_init(|| self.new_meta())
    }

    /// Changes go to the metadata read back by [`Self::meta`], not to the
    /// JSON text (nothing changes a watched object's metadata).
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        if self.meta.get().is_none() {
            let meta = self.new_meta();
            self.meta = OnceCell::from(meta);
        }
        match self.meta.get_mut() {
            Some(meta) => meta,
            // Filled just above.
            None => unreachable!("the metadata was just built"),
        }
    }
}

/// `object` as the watcher would hold it, for tests: through its JSON.
#[cfg(test)]
#[allow(clippy::expect_used)]
pub(super) fn of<K: serde::Serialize>(object: &K) -> Compact<K> {
    let json = serde_json::to_vec(object).expect("a typed object serializes");
    serde_json::from_slice(&json).expect("a serialized object copies")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    fn slice() -> EndpointSlice {
        let mut slice = EndpointSlice {
            address_type: "IPv4".to_owned(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.0.0.1".to_owned()],
                ..Endpoint::default()
            }],
            ..EndpointSlice::default()
        };
        slice.metadata.namespace = Some("demo".to_owned());
        slice.metadata.name = Some("web-1".to_owned());
        slice.metadata.resource_version = Some("42".to_owned());
        slice
    }

    #[test]
    fn keeps_the_object_but_its_managed_fields() {
        let mut slice = slice();
        slice.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kube-controller-manager".to_owned()),
            ..ManagedFieldsEntry::default()
        }]);

        let compact = of(&slice);

        assert_eq!(compact.key(), "demo/web-1");
        assert_eq!(compact.resource_version(), Some("42"));
        assert_eq!(compact.meta().resource_version.as_deref(), Some("42"));
        assert_eq!(compact.meta().name.as_deref(), Some("web-1"));
        let text = std::str::from_utf8(&compact.json).unwrap();
        assert!(!text.contains("managedFields"), "{text}");
        assert!(!text.contains("resourceVersion"), "{text}");
        slice.metadata.managed_fields = None;
        assert_eq!(compact.object().unwrap(), slice);
        assert_eq!(
            Compact::<EndpointSlice>::url_path(&(), None),
            EndpointSlice::url_path(&(), None)
        );
    }

    #[test]
    fn every_kind_of_value_survives_the_copy() {
        let mut service = Service::default();
        service.metadata.name = Some("odd".to_owned());
        service.metadata.annotations = Some(BTreeMap::from([
            ("quote".to_owned(), "a \"b\" \\ c\n\t\u{1}".to_owned()),
            ("unicode".to_owned(), "é ✓ 😀".to_owned()),
            ("empty".to_owned(), String::new()),
        ]));
        let json = r#"{"metadata":{"name":"n\u0061me","labels":{"a\"b":"c"}},
            "spec":{"ports":[{"port":-1,"nodePort":4294967296},{"port":80}],
                    "sessionAffinityConfig":{"clientIP":{"timeoutSeconds":10800}},
                    "publishNotReadyAddresses":false,"externalIPs":[],"x":1.5e3,"y":null}}"#;

        let parsed: Compact<Service> = serde_json::from_str(json).unwrap();
        assert_eq!(parsed.key(), "/name");
        let copied: serde_json::Value = serde_json::from_slice(&parsed.json).unwrap();
        let original: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(copied, original);
        let bookkept = json.replacen(
            r#""metadata":{"#,
            r#""metadata":{"resourceVersion":"7","managedFields":[{"manager":"m"}],"#,
            1,
        );
        let again: Compact<Service> = serde_json::from_str(&bookkept).unwrap();
        assert_eq!(again.resource_version(), Some("7"));
        assert_eq!(again.json, parsed.json);
        assert_eq!(again.content_hash(), parsed.content_hash());

        let compact = of(&service);
        assert_eq!(compact.object().unwrap(), service);
    }

    #[test]
    fn the_content_hash_ignores_bookkeeping_and_sees_the_rest() {
        let base = of(&slice());
        let mut rewritten = slice();
        rewritten.metadata.resource_version = Some("43".to_owned());
        rewritten.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        assert_eq!(of(&rewritten).content_hash(), base.content_hash());
        let mut changed = slice();
        changed.endpoints[0].addresses[0] = "10.0.0.2".to_owned();
        assert_ne!(of(&changed).content_hash(), base.content_hash());
    }

    #[test]
    fn an_object_with_a_field_of_the_wrong_kind_copies_but_does_not_type() {
        let compact: Compact<EndpointSlice> =
            serde_json::from_str(r#"{"metadata":{"name":"s"},"addressType": 4}"#).unwrap();
        assert_eq!(compact.key(), "/s");
        assert!(compact.object().is_err());
    }

    #[test]
    fn what_is_not_an_object_fails_the_copy() {
        for json in [
            r#"[1]"#,
            r#""text""#,
            r#"{"metadata":{"name":5}}"#,
            r#"{"metadata":{"resourceVersion":{}}}"#,
            r#"{"a":tru}"#,
        ] {
            assert!(
                serde_json::from_str::<Compact<EndpointSlice>>(json).is_err(),
                "{json}"
            );
        }
    }
}
