//! Test support: a recording event handler and manifest-writing helpers.
//!
//! Address plan (the project's, see kp-testkit `plan`): services in
//! 10.96.0.0/16, pods of node-1 in 10.244.1.0/24, external IPs in
//! 203.0.113.0/24; the proxy runs on `node-1`.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, missing_docs)]

use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind};
use serde::Serialize;

pub use kp_testkit::plan::NODE_NAME;

/// Records every call as a line such as `apply Service demo/web`,
/// `delete EndpointSlice demo/web-abc`, `apply Node node-1`,
/// `synced Service`, and keeps the objects for closer looks.
#[derive(Default)]
pub struct Recorder {
    state: Mutex<Recorded>,
    changed: Condvar,
}

#[derive(Default, Clone)]
pub struct Recorded {
    pub lines: Vec<String>,
    pub services: Vec<ObjectEvent<Service>>,
    pub slices: Vec<ObjectEvent<EndpointSlice>>,
    pub nodes: Vec<ObjectEvent<Node>>,
}

impl Recorder {
    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.state.lock().unwrap().lines.clone()
    }

    /// Everything recorded so far.
    pub fn recorded(&self) -> Recorded {
        self.state.lock().unwrap().clone()
    }

    /// Takes the lines recorded so far, leaving none.
    pub fn take_lines(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().lines)
    }

    /// Waits (at most `timeout`) until `line` has been recorded; returns when
    /// it was, or `None`.
    pub fn wait_for_line(&self, line: &str, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().unwrap();
        loop {
            if state.lines.iter().any(|seen| seen == line) {
                return Some(Instant::now());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            state = self.changed.wait_timeout(state, left).unwrap().0;
        }
    }

    fn record(&self, line: String, store: impl FnOnce(&mut Recorded)) {
        let mut state = self.state.lock().unwrap();
        state.lines.push(line);
        store(&mut state);
        self.changed.notify_all();
    }
}

fn line<T>(event: &ObjectEvent<T>, kind: &str, name: String) -> String {
    let verb = match event {
        ObjectEvent::Apply(_) => "apply",
        ObjectEvent::Delete(_) => "delete",
    };
    format!("{verb} {kind} {name}")
}

fn object<T>(event: &ObjectEvent<T>) -> &T {
    match event {
        ObjectEvent::Apply(object) | ObjectEvent::Delete(object) => object,
    }
}

impl ProxyEventHandler for Recorder {
    fn on_service(&self, event: ObjectEvent<Service>) {
        let meta = &object(&event).metadata;
        let name = format!(
            "{}/{}",
            meta.namespace.clone().unwrap(),
            meta.name.clone().unwrap()
        );
        self.record(line(&event, "Service", name), |r| r.services.push(event));
    }

    fn on_endpoint_slice(&self, event: ObjectEvent<EndpointSlice>) {
        let meta = &object(&event).metadata;
        let name = format!(
            "{}/{}",
            meta.namespace.clone().unwrap(),
            meta.name.clone().unwrap()
        );
        self.record(line(&event, "EndpointSlice", name), |r| {
            r.slices.push(event)
        });
    }

    fn on_node(&self, event: ObjectEvent<Node>) {
        let name = object(&event).metadata.name.clone().unwrap();
        self.record(line(&event, "Node", name), |r| r.nodes.push(event));
    }

    fn on_synced(&self, kind: ResourceKind) {
        self.record(format!("synced {kind:?}"), |_| {});
    }
}

/// The three synced lines the first load ends with.
pub fn synced_lines() -> Vec<String> {
    ["synced Service", "synced EndpointSlice", "synced Node"]
        .map(String::from)
        .to_vec()
}

/// Writes `text` to `dir/name`, creating parent directories.
pub fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Writes `text` to a temporary file next to `dir/name` and renames it over
/// `dir/name`, as editors and ConfigMap updates do.
pub fn replace_by_rename(dir: &Path, name: &str, text: &str) {
    let temporary = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(temporary, dir.join(name)).unwrap();
}

/// A multi-document YAML manifest of `objects`.
pub fn yaml(objects: &[&dyn erased::Yaml]) -> String {
    objects
        .iter()
        .map(|object| object.to_yaml())
        .collect::<Vec<_>>()
        .join("---\n")
}

pub mod erased {
    use super::Serialize;

    /// Any object that can be written as YAML.
    pub trait Yaml {
        fn to_yaml(&self) -> String;
    }

    impl<T: Serialize> Yaml for T {
        fn to_yaml(&self) -> String {
            serde_yaml_ng::to_string(self).unwrap()
        }
    }
}
