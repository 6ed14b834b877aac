//! The manifest source: reads `--manifests PATH`, works out what changed
//! since the last read and hands the changes to the event handler.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kp_model::{ObjectEvent, ProxyEventHandler, ResourceKind, LABEL_SERVICE_NAME};

use crate::conflicts::reject_conflicts;
use crate::discover::{discover, Discovered};
use crate::error::{ManifestError, ManifestProblem, Severity, SourceError};
use crate::files::{FileCache, ParsedFile};
use crate::object::{KubeObject, ManifestObject, ObjectKey};

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
/// reads every file again (parsing only those whose content changed) and
/// sends only the differences. Only the Node named like the proxy's node is
/// delivered.
///
/// An object disappears only when its document is removed from the files
/// (or its file is deleted). A document that no longer parses or passes the
/// checks keeps delivering the objects it last delivered, until it is
/// fixed; a whole file that cannot be read keeps all of its objects.
#[derive(Debug)]
pub struct ManifestSource {
    pub(crate) path: PathBuf,
    node_name: String,
    delivered: BTreeMap<ObjectKey, Arc<ManifestObject>>,
    files: FileCache,
    loaded: bool,
    reported: HashSet<String>,
    cycles_reported: HashSet<PathBuf>,
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
    /// Objects still delivered in their last good state because the
    /// document or file that holds them is broken.
    pub kept: usize,
    /// Problems logged by this load: those new since the last load, and
    /// those of files that changed. A problem that persists is not logged
    /// again on every periodic re-read.
    pub logged: usize,
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
            files: FileCache::default(),
            loaded: false,
            reported: HashSet::new(),
            cycles_reported: HashSet::new(),
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
    /// whose documents are gone, and after the first load reports every
    /// kind synced.
    ///
    /// Invalid documents are logged and listed in the report; an object they
    /// delivered before keeps its last good state. The only errors are fatal
    /// ones: the path does not exist on the first load, or cannot be listed.
    /// A path that disappears later counts as empty.
    pub fn load(&mut self, handler: &dyn ProxyEventHandler) -> Result<LoadReport, SourceError> {
        let discovered = self.discover()?;
        self.report_cycles(&discovered.cycles);
        self.files.retain(&discovered.files);
        let mut errors = Vec::new();
        let mut fresh = BTreeSet::new();
        let mut parsed_files = Vec::with_capacity(discovered.files.len());
        for file in &discovered.files {
            let Some(read) = self.files.read(file) else {
                continue;
            };
            if read.fresh {
                fresh.insert(file.clone());
            }
            parsed_files.push((file.clone(), read.parsed));
        }
        let mut objects = Vec::new();
        for (_, parsed) in &mut parsed_files {
            objects.append(&mut parsed.objects);
            errors.append(&mut parsed.errors);
        }
        let mut desired = self.merge(objects, &mut errors);
        let kept = self.keep_last_good(&mut desired, &parsed_files, &discovered);
        reject_conflicts(&mut desired, &mut errors);
        errors.extend(discovered.errors);
        check_service_names(&desired, &mut errors);
        let mut report = self.deliver(desired, handler);
        report.kept = kept;
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
        report.logged = self.log_new_problems(&errors, &fresh);
        report.files = discovered.files.len();
        report.errors = errors;
        tracing::debug!(
            path = %self.path.display(),
            files = report.files,
            objects = report.objects,
            applied = report.applied,
            deleted = report.deleted,
            kept = report.kept,
            problems = report.errors.len(),
            "manifests loaded"
        );
        Ok(report)
    }

    /// Puts back into `desired` the objects last delivered from documents
    /// that are broken now: every object of a file (or directory) that
    /// cannot be read far enough to tell what it holds, and each object
    /// whose document is readable but fails a check. Returns how many.
    fn keep_last_good(
        &self,
        desired: &mut BTreeMap<ObjectKey, Arc<ManifestObject>>,
        parsed_files: &[(PathBuf, ParsedFile)],
        discovered: &Discovered,
    ) -> usize {
        let unreadable: BTreeSet<&Path> = parsed_files
            .iter()
            .filter(|(_, parsed)| parsed.unreadable)
            .map(|(path, _)| path.as_path())
            .collect();
        let failed: BTreeSet<&ObjectKey> = parsed_files
            .iter()
            .flat_map(|(_, parsed)| &parsed.failed)
            .collect();
        let unlisted: Vec<&Path> = discovered
            .errors
            .iter()
            .map(|e| e.location.path.as_path())
            .collect();
        let mut kept = 0;
        for (key, object) in &self.delivered {
            let path = object.location.path.as_path();
            let broken = failed.contains(key)
                || unreadable.contains(path)
                || unlisted.iter().any(|directory| path.starts_with(directory));
            if broken && !desired.contains_key(key) {
                tracing::debug!(object = %key, location = %object.location, "keeping the last good state of a manifest object");
                desired.insert(key.clone(), Arc::clone(object));
                kept += 1;
            }
        }
        kept
    }

    /// Warns once about each directory reached again through a link, not on
    /// every reload; returns how many warnings it gave.
    fn report_cycles(&mut self, cycles: &[PathBuf]) -> usize {
        let mut warned = 0;
        for cycle in cycles {
            if self.cycles_reported.insert(cycle.clone()) {
                tracing::warn!(path = %cycle.display(), "skipping a link to a manifest directory already read (a symbolic link loop?)");
                warned += 1;
            }
        }
        warned
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
        objects: Vec<Arc<ManifestObject>>,
        errors: &mut Vec<ManifestError>,
    ) -> BTreeMap<ObjectKey, Arc<ManifestObject>> {
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
                    earlier: earlier.location.clone(),
                };
                errors.push(ManifestError::new(location, key.identity(), problem));
            }
        }
        desired
    }

    /// Sends the differences between what was delivered and `desired`.
    fn deliver(
        &mut self,
        desired: BTreeMap<ObjectKey, Arc<ManifestObject>>,
        handler: &dyn ProxyEventHandler,
    ) -> LoadReport {
        let mut report = LoadReport::default();
        for (key, object) in &desired {
            // An object of an unchanged file is the one delivered last time.
            let unchanged = self.delivered.get(key).is_some_and(|before| {
                Arc::ptr_eq(before, object) || before.object == object.object
            });
            if !unchanged {
                tracing::debug!(object = %key, "applying manifest object");
                send(handler, object.object.clone(), false);
                report.applied += 1;
            }
        }
        let previous = std::mem::replace(&mut self.delivered, desired);
        for (key, object) in previous {
            if !self.delivered.contains_key(&key) {
                tracing::debug!(object = %key, "deleting manifest object");
                send(handler, object.object.clone(), true);
                report.deleted += 1;
            }
        }
        report.objects = self.delivered.len();
        report
    }

    /// Logs each problem once: again only when its file changed, not on
    /// every reload while it persists.
    fn log_new_problems(&mut self, errors: &[ManifestError], fresh: &BTreeSet<PathBuf>) -> usize {
        let mut logged = 0;
        let mut current = HashSet::with_capacity(errors.len());
        for error in errors {
            let message = error.to_string();
            let parsed_now = fresh.contains(&error.location.path)
                && !matches!(
                    error.problem,
                    ManifestProblem::Duplicate { .. }
                        | ManifestProblem::UnknownService { .. }
                        | ManifestProblem::Conflict { .. }
                );
            if parsed_now || !self.reported.contains(&message) {
                logged += 1;
                match error.severity() {
                    Severity::Error => {
                        tracing::warn!(error = %message, "invalid manifest: the object keeps its last good state, or is not delivered if it has none");
                    }
                    Severity::Warning => {
                        tracing::warn!(warning = %message, "manifests are inconsistent");
                    }
                }
            }
            current.insert(message);
        }
        self.reported = current;
        logged
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

/// Warns about EndpointSlices whose Service is not defined; they are still
/// delivered, as the Service may be added later.
fn check_service_names(
    desired: &BTreeMap<ObjectKey, Arc<ManifestObject>>,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_link_loop_is_warned_about_once_not_on_every_reload() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(".", dir.path().join("self")).unwrap();
        let mut source = ManifestSource::new(dir.path(), "node-1");
        let cycles = discover(dir.path()).unwrap().cycles;

        assert_eq!(source.report_cycles(&cycles), 1);
        assert_eq!(source.report_cycles(&cycles), 0);
    }

    struct Ignore;

    impl ProxyEventHandler for Ignore {
        fn on_service(&self, _: kp_model::ObjectEvent<k8s_openapi::api::core::v1::Service>) {}
        fn on_endpoint_slice(
            &self,
            _: kp_model::ObjectEvent<k8s_openapi::api::discovery::v1::EndpointSlice>,
        ) {
        }
        fn on_node(&self, _: kp_model::ObjectEvent<k8s_openapi::api::core::v1::Node>) {}
        fn on_synced(&self, _: ResourceKind) {}
    }

    fn service(name: &str, ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: {name}}}\n\
             spec:\n  clusterIP: {ip}\n  ports: [{{port: 80, protocol: TCP}}]\n"
        )
    }

    #[test]
    fn objects_of_an_unchanged_file_are_shared_not_copied_when_another_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), service("a", "10.96.0.1")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), service("b", "10.96.0.2")).unwrap();
        let mut source = ManifestSource::new(dir.path(), "node-1");
        source.load(&Ignore).unwrap();
        let key = |name: &str| ObjectKey {
            kind: ResourceKind::Service,
            namespace: "demo".to_owned(),
            name: name.to_owned(),
        };
        let a_before = Arc::clone(&source.delivered[&key("a")]);

        std::fs::write(dir.path().join("b.yaml"), service("b", "10.96.0.3")).unwrap();
        let report = source.load(&Ignore).unwrap();

        assert_eq!(report.applied, 1, "only b changed");
        assert!(
            Arc::ptr_eq(&a_before, &source.delivered[&key("a")]),
            "a is the object parsed the first time, not a copy"
        );
    }
}
