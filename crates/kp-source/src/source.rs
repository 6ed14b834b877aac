//! The manifest source: reads `--manifests PATH`, works out what changed
//! since the last read and hands the changes to the event handler.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind, LABEL_SERVICE_NAME};

use crate::discover::{discover, Discovered};
use crate::error::{
    DocumentLocation, ManifestError, ManifestProblem, ObjectIdentity, Severity, SourceError,
};
use crate::object::{KubeObject, ManifestObject, ObjectKey};
use crate::parse::parse_documents;

/// How long the watcher waits for a burst of file events to end.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);
/// How often the manifests are read again even without file events, in case
/// the watcher missed one.
pub const DEFAULT_RESYNC_PERIOD: Duration = Duration::from_secs(30);

/// Serves the Services, EndpointSlices and Node held in manifest files (a
/// file, or a directory of them) to a [`ProxyEventHandler`], as the
/// Kubernetes API source would.
///
/// The source remembers what it last delivered: each [`load`](Self::load)
/// reads everything again and sends only the differences. Only the Node
/// named like the proxy's node is delivered.
#[derive(Debug)]
pub struct ManifestSource {
    pub(crate) path: PathBuf,
    node_name: String,
    delivered: BTreeMap<ObjectKey, KubeObject>,
    loaded: bool,
    reported: HashSet<String>,
    pub(crate) debounce: Duration,
    pub(crate) resync_period: Duration,
}

/// The outcome of one [`ManifestSource::load`].
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Manifest files read.
    pub files: usize,
    /// Objects now delivered (after skipping invalid documents, duplicates
    /// and other nodes' Nodes).
    pub objects: usize,
    /// `Apply` events sent: objects new or changed since the last load.
    pub applied: usize,
    /// `Delete` events sent: objects gone since the last load.
    pub deleted: usize,
    /// Every problem found, errors (document skipped) and warnings (object
    /// delivered anyway), in file order.
    pub errors: Vec<ManifestError>,
}

impl ManifestSource {
    /// A source reading `path` (a file or a directory) for the proxy running
    /// on node `node_name`. Nothing is read until [`load`](Self::load) or
    /// [`run`](Self::run).
    pub fn new(path: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            node_name: node_name.into(),
            delivered: BTreeMap::new(),
            loaded: false,
            reported: HashSet::new(),
            debounce: DEFAULT_DEBOUNCE,
            resync_period: DEFAULT_RESYNC_PERIOD,
        }
    }

    /// Sets how long [`run`](Self::run) waits for a burst of file events to
    /// end before reading again (default [`DEFAULT_DEBOUNCE`]).
    pub fn with_debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }

    /// Sets how often [`run`](Self::run) reads again without any file event
    /// (default [`DEFAULT_RESYNC_PERIOD`]).
    pub fn with_resync_period(mut self, resync_period: Duration) -> Self {
        self.resync_period = resync_period;
        self
    }

    /// The manifest path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads every manifest, sends `Apply` for objects new or changed since
    /// the last load and `Delete` (with the last known object) for objects
    /// gone, and after the first load reports every kind synced.
    ///
    /// Invalid documents are logged, listed in the report and skipped. The
    /// only errors are fatal ones: the path does not exist on the first load,
    /// or cannot be listed. A path that disappears later counts as empty.
    pub fn load(&mut self, handler: &dyn ProxyEventHandler) -> Result<LoadReport, SourceError> {
        let discovered = self.discover()?;
        let mut errors = discovered.errors;
        let mut objects = Vec::new();
        for file in &discovered.files {
            read_file(file, &mut objects, &mut errors);
        }
        let desired = self.merge(objects, &mut errors);
        check_service_names(&desired, &mut errors);
        let mut report = self.deliver(desired, handler);
        if !self.loaded {
            self.loaded = true;
            for kind in [
                ResourceKind::Service,
                ResourceKind::EndpointSlice,
                ResourceKind::Node,
            ] {
                handler.on_synced(kind);
            }
        }
        self.log_new_problems(&errors);
        report.files = discovered.files.len();
        report.errors = errors;
        tracing::debug!(
            path = %self.path.display(),
            files = report.files,
            objects = report.objects,
            applied = report.applied,
            deleted = report.deleted,
            problems = report.errors.len(),
            "manifests loaded"
        );
        Ok(report)
    }

    fn discover(&self) -> Result<Discovered, SourceError> {
        match discover(&self.path) {
            Ok(discovered) => Ok(discovered),
            Err(error) if error.kind() == io::ErrorKind::NotFound && self.loaded => {
                tracing::warn!(path = %self.path.display(), "manifest path disappeared; its objects are deleted");
                Ok(Discovered::default())
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                Err(SourceError::PathNotFound {
                    path: self.path.clone(),
                })
            }
            Err(source) => Err(SourceError::ReadPath {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Keeps this node's Node among the Nodes and, of two definitions of one
    /// object, the later.
    fn merge(
        &self,
        objects: Vec<ManifestObject>,
        errors: &mut Vec<ManifestError>,
    ) -> BTreeMap<ObjectKey, ManifestObject> {
        let mut desired = BTreeMap::new();
        for object in objects {
            let key = object.object.key();
            if key.kind == ResourceKind::Node && key.name != self.node_name {
                tracing::debug!(node = %key.name, location = %object.location, "ignoring the manifest of another node");
                continue;
            }
            let location = object.location.clone();
            if let Some(earlier) = desired.insert(key.clone(), object) {
                let problem = ManifestProblem::Duplicate {
                    earlier: earlier.location,
                };
                errors.push(ManifestError::new(location, key.identity(), problem));
            }
        }
        desired
    }

    /// Sends the differences between what was delivered and `desired`.
    fn deliver(
        &mut self,
        desired: BTreeMap<ObjectKey, ManifestObject>,
        handler: &dyn ProxyEventHandler,
    ) -> LoadReport {
        let mut report = LoadReport::default();
        let mut delivered = BTreeMap::new();
        for (key, ManifestObject { object, .. }) in desired {
            if self.delivered.get(&key) != Some(&object) {
                tracing::debug!(object = %key, "applying manifest object");
                send(handler, object.clone(), false);
                report.applied += 1;
            }
            delivered.insert(key, object);
        }
        let previous = std::mem::replace(&mut self.delivered, delivered);
        for (key, object) in previous {
            if !self.delivered.contains_key(&key) {
                tracing::debug!(object = %key, "deleting manifest object");
                send(handler, object, true);
                report.deleted += 1;
            }
        }
        report.objects = self.delivered.len();
        report
    }

    /// Logs each problem once, not again on every reload while it persists.
    fn log_new_problems(&mut self, errors: &[ManifestError]) {
        let mut current = HashSet::with_capacity(errors.len());
        for error in errors {
            let message = error.to_string();
            if !self.reported.contains(&message) {
                match error.severity() {
                    Severity::Error => {
                        tracing::warn!(error = %message, "skipping an invalid manifest document");
                    }
                    Severity::Warning => {
                        tracing::warn!(warning = %message, "manifests are inconsistent");
                    }
                }
            }
            current.insert(message);
        }
        self.reported = current;
    }
}

impl LoadReport {
    /// The problems that made a document be skipped.
    pub fn rejected(&self) -> impl Iterator<Item = &ManifestError> {
        self.errors
            .iter()
            .filter(|error| error.severity() == Severity::Error)
    }

    /// The problems with objects that were delivered anyway.
    pub fn warnings(&self) -> impl Iterator<Item = &ManifestError> {
        self.errors
            .iter()
            .filter(|error| error.severity() == Severity::Warning)
    }
}

/// Reads and parses one file; a file that vanished since it was listed is
/// simply gone.
fn read_file(path: &Path, objects: &mut Vec<ManifestObject>, errors: &mut Vec<ManifestError>) {
    let file_problem = |problem| {
        ManifestError::new(
            DocumentLocation::file(path),
            ObjectIdentity::default(),
            problem,
        )
    };
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "manifest file vanished while reading");
            return;
        }
        Err(error) => return errors.push(file_problem(ManifestProblem::Read(error))),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return errors.push(file_problem(ManifestProblem::NotUtf8));
    };
    let (parsed, problems) = parse_documents(path, &text);
    objects.extend(parsed);
    errors.extend(problems);
}

/// Warns about EndpointSlices whose Service is not defined; they are still
/// delivered, as the Service may be added later.
fn check_service_names(
    desired: &BTreeMap<ObjectKey, ManifestObject>,
    errors: &mut Vec<ManifestError>,
) {
    let services: BTreeSet<(&str, &str)> = desired
        .keys()
        .filter(|key| key.kind == ResourceKind::Service)
        .map(|key| (key.namespace.as_str(), key.name.as_str()))
        .collect();
    for (key, object) in desired {
        let KubeObject::EndpointSlice(slice) = &object.object else {
            continue;
        };
        let labels = slice.metadata.labels.as_ref();
        let Some(service) = labels.and_then(|labels| labels.get(LABEL_SERVICE_NAME)) else {
            continue;
        };
        if !services.contains(&(key.namespace.as_str(), service.as_str())) {
            let problem = ManifestProblem::UnknownService {
                namespace: key.namespace.clone(),
                service: service.clone(),
            };
            errors.push(ManifestError::new(
                object.location.clone(),
                key.identity(),
                problem,
            ));
        }
    }
}

/// Hands `object` to the handler method of its kind, as an `Apply` or,
/// when `deleted`, a `Delete`.
fn send(handler: &dyn ProxyEventHandler, object: KubeObject, deleted: bool) {
    match object {
        KubeObject::Service(service) => handler.on_service(event(service, deleted)),
        KubeObject::EndpointSlice(slice) => handler.on_endpoint_slice(event(slice, deleted)),
        KubeObject::Node(node) => handler.on_node(event(node, deleted)),
    }
}

fn event<T>(object: T, deleted: bool) -> ObjectEvent<T> {
    if deleted {
        ObjectEvent::Delete(object)
    } else {
        ObjectEvent::Apply(object)
    }
}
