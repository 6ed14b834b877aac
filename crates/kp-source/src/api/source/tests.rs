//! How watcher events become handler calls, without an API server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use kp_testkit::service;

use super::super::compact;
use super::*;

/// Records handler calls as lines such as `apply demo/web`.
#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl Lines {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }

    fn push<T: Resource>(&self, event: &ObjectEvent<T>) {
        let (verb, object) = match event {
            ObjectEvent::Apply(object) => ("apply", object),
            ObjectEvent::Delete(object) => ("delete", object),
        };
        let meta = object.meta();
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .push(format!("{verb} {namespace}/{name}"));
    }
}

impl ProxyEventHandler for Lines {
    fn on_service(&self, event: ObjectEvent<Service>) {
        self.push(&event);
    }
    fn on_endpoint_slice(&self, event: ObjectEvent<EndpointSlice>) {
        self.push(&event);
    }
    fn on_node(&self, event: ObjectEvent<Node>) {
        self.push(&event);
    }
    fn on_synced(&self, kind: ResourceKind) {
        self.0.lock().unwrap().push(format!("synced {kind:?}"));
    }
}

fn web(version: &str, port: i32) -> Service {
    let mut web = service("demo", "web", |s| {
        s.cluster_ip("10.96.0.10").port("http", port, "TCP")
    });
    web.metadata.resource_version = Some(version.to_owned());
    web
}

fn db(version: &str) -> Service {
    let mut db = service("demo", "db", |s| {
        s.cluster_ip("10.96.0.20").port("pg", 5432, "TCP")
    });
    db.metadata.resource_version = Some(version.to_owned());
    db
}

fn relist(delivered: &mut Delivered, handler: &Lines, objects: Vec<Service>) {
    relist_compact(
        delivered,
        handler,
        objects.iter().map(compact::of).collect(),
    );
}

fn relist_compact(delivered: &mut Delivered, handler: &Lines, objects: Vec<Compact<Service>>) {
    delivered.handle(watcher::Event::<Compact<Service>>::Init, handler);
    for object in objects {
        delivered.handle(watcher::Event::InitApply(object), handler);
    }
    delivered.handle(watcher::Event::<Compact<Service>>::InitDone, handler);
}

fn apply(object: &Service) -> watcher::Event<Compact<Service>> {
    watcher::Event::Apply(compact::of(object))
}

fn delete(object: &Service) -> watcher::Event<Compact<Service>> {
    watcher::Event::Delete(compact::of(object))
}

#[test]
fn the_first_list_applies_everything_then_reports_synced() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![web("1", 80), db("2")]);
    assert_eq!(
        handler.take(),
        ["apply demo/web", "apply demo/db", "synced Service"]
    );
}

#[test]
fn a_relist_of_the_same_objects_delivers_nothing() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![web("1", 80), db("2")]);
    handler.take();
    relist(&mut delivered, &handler, vec![web("1", 80), db("2")]);
    assert_eq!(handler.take(), Vec::<String>::new());
}

#[test]
fn a_relist_delivers_changes_and_deletions_made_while_away() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![web("1", 80), db("2")]);
    handler.take();
    relist(&mut delivered, &handler, vec![web("7", 8080)]);
    assert_eq!(handler.take(), ["apply demo/web", "delete demo/db"]);
}

#[test]
fn an_object_rewritten_with_the_same_content_is_not_delivered_again() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![web("1", 80)]);
    handler.take();
    relist(&mut delivered, &handler, vec![web("9", 80)]);
    assert_eq!(handler.take(), Vec::<String>::new());
}

#[test]
fn watch_events_flow_through_and_unknown_deletions_are_dropped() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![]);
    delivered.handle(apply(&web("3", 80)), &handler);
    delivered.handle(apply(&web("4", 81)), &handler);
    delivered.handle(delete(&db("5")), &handler);
    delivered.handle(delete(&web("6", 81)), &handler);
    assert_eq!(
        handler.take(),
        [
            "synced Service",
            "apply demo/web",
            "apply demo/web",
            "delete demo/web"
        ]
    );
}

#[test]
fn synced_is_reported_once() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![]);
    relist(&mut delivered, &handler, vec![]);
    assert_eq!(handler.take(), ["synced Service"]);
}

#[test]
fn a_change_of_managed_fields_alone_is_not_delivered() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist(&mut delivered, &handler, vec![web("1", 80)]);
    handler.take();
    let mut touched = web("2", 80);
    touched.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("kubectl".to_owned()),
        ..ManagedFieldsEntry::default()
    }]);
    delivered.handle(apply(&touched), &handler);
    delivered.handle(apply(&web("3", 81)), &handler);
    assert_eq!(handler.take(), ["apply demo/web"]);
}

/// `web` at `version` with a port that is not a number: it copies, but does
/// not type as a Service.
fn unreadable_web(version: &str) -> Compact<Service> {
    let mut json = serde_json::to_value(web(version, 80)).unwrap();
    json["spec"]["ports"][0]["port"] = "eighty".into();
    serde_json::from_value(json).unwrap()
}

#[test]
fn an_object_that_does_not_type_is_refused_alone_and_the_earlier_one_kept() {
    let handler = Lines::default();
    let mut delivered = Delivered::default();
    relist_compact(
        &mut delivered,
        &handler,
        vec![unreadable_web("1"), compact::of(&db("2"))],
    );
    assert_eq!(handler.take(), ["apply demo/db", "synced Service"]);

    delivered.handle(apply(&web("3", 80)), &handler);
    delivered.handle(watcher::Event::Apply(unreadable_web("4")), &handler);
    relist_compact(
        &mut delivered,
        &handler,
        vec![unreadable_web("4"), compact::of(&db("2"))],
    );
    assert_eq!(
        handler.take(),
        ["apply demo/web"],
        "neither updated nor deleted"
    );

    delivered.handle(apply(&web("5", 81)), &handler);
    assert_eq!(handler.take(), ["apply demo/web"]);
}

#[test]
fn a_delivered_object_carries_its_resource_version() {
    #[derive(Default)]
    struct Versions(Mutex<Vec<Option<String>>>);
    impl ProxyEventHandler for Versions {
        fn on_service(&self, event: ObjectEvent<Service>) {
            if let ObjectEvent::Apply(service) = event {
                self.0
                    .lock()
                    .unwrap()
                    .push(service.metadata.resource_version);
            }
        }
        fn on_endpoint_slice(&self, _: ObjectEvent<EndpointSlice>) {}
        fn on_node(&self, _: ObjectEvent<Node>) {}
        fn on_synced(&self, _: ResourceKind) {}
    }
    let handler = Versions::default();
    let mut delivered = Delivered::default();
    delivered.handle(apply(&web("17", 80)), &handler);
    assert_eq!(*handler.0.lock().unwrap(), [Some("17".to_owned())]);
}
