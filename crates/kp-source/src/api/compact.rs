//! Objects as kube-rs' watcher holds them: compact JSON, turned back into
//! typed objects one at a time as the source delivers them.
//!
//! The watcher lists a kind in one response and keeps every item of it
//! until it has handed out the last one. Typed, the 10,000 EndpointSlices
//! of a large cluster take some 33 MB (every optional field of every
//! endpoint and of its metadata); as JSON without `managedFields`, about
//! a sixth of that. Each item is parsed as it
//! arrives, so a malformed object fails the list as before, and written
//! back out as text; the source parses it again when delivering it, so only
//! one typed object of the list exists at a time.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::{Deserialize, Serialize};

/// An object of kind `K` as JSON text, with the one piece of metadata the
/// watcher reads (the resourceVersion it resumes watching from).
///
/// The watcher reads that metadata only from watched objects, never from
/// listed ones, so the `ObjectMeta` it is read through (some 360 bytes) is
/// built on first use: an item of a list is 40 bytes besides its text.
pub(super) struct Compact<K> {
    resource_version: Option<Box<str>>,
    json: Box<str>,
    meta: OnceCell<Box<ObjectMeta>>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Serialize + Resource> Compact<K> {
    /// Keeps `object` as text. managedFields are dropped: nothing
    /// downstream reads them, and they are often the largest part of an
    /// object.
    fn from_object(mut object: K) -> Result<Self, serde_json::Error> {
        object.meta_mut().managed_fields = None;
        let json = serde_json::to_string(&object)?.into_boxed_str();
        let resource_version = object.meta().resource_version.as_deref().map(Box::from);
        Ok(Self {
            resource_version,
            json,
            meta: OnceCell::new(),
            kind: PhantomData,
        })
    }

    fn new_meta(&self) -> Box<ObjectMeta> {
        Box::new(ObjectMeta {
            resource_version: self.resource_version.as_deref().map(str::to_owned),
            ..ObjectMeta::default()
        })
    }
}

impl<K: DeserializeOwned> Compact<K> {
    /// The typed object again.
    pub(super) fn object(&self) -> Result<K, serde_json::Error> {
        serde_json::from_str(&self.json)
    }
}

impl<'de, K: DeserializeOwned + Serialize + Resource> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let object = K::deserialize(deserializer)?;
        Self::from_object(object).map_err(D::Error::custom)
    }
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
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
            .field("resource_version", &self.resource_version)
            .field("json_bytes", &self.json.len())
            .finish()
    }
}

/// Requested exactly like `K`: the same group, version, kind and path.
impl<K: Resource<DynamicType = ()> + Serialize> Resource for Compact<K> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    #[test]
    fn keeps_the_object_but_its_managed_fields() {
        let mut slice = EndpointSlice {
            address_type: "IPv4".to_owned(),
            ..EndpointSlice::default()
        };
        slice.metadata.name = Some("web-1".to_owned());
        slice.metadata.resource_version = Some("42".to_owned());
        slice.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        let json = serde_json::to_string(&slice).unwrap();

        let compact: Compact<EndpointSlice> = serde_json::from_str(&json).unwrap();

        assert_eq!(compact.meta().resource_version.as_deref(), Some("42"));
        slice.metadata.managed_fields = None;
        assert_eq!(compact.object().unwrap(), slice);
        assert_eq!(
            Compact::<EndpointSlice>::url_path(&(), None),
            EndpointSlice::url_path(&(), None)
        );
    }

    #[test]
    fn a_malformed_object_fails_like_the_typed_one() {
        let json = r#"{"addressType": 4}"#;
        assert!(serde_json::from_str::<Compact<EndpointSlice>>(json).is_err());
    }
}
