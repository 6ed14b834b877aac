//! How watcher events become handler calls, without an API server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use kp_testkit::service;

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
        let key = key_of(object);
        let (namespace, name) = key.parts();
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
    delivered.handle(watcher::Event::<Service>::Init, handler);
    for object in objects {
        delivered.handle(watcher::Event::InitApply(object), handler);
    }
    delivered.handle(watcher::Event::<Service>::InitDone, handler);
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
    delivered.handle(watcher::Event::Apply(web("3", 80)), &handler);
    delivered.handle(watcher::Event::Apply(web("4", 81)), &handler);
    delivered.handle(watcher::Event::Delete(db("5")), &handler);
    delivered.handle(watcher::Event::Delete(web("6", 81)), &handler);
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
    delivered.handle(watcher::Event::Apply(touched), &handler);
    delivered.handle(watcher::Event::Apply(web("3", 81)), &handler);
    assert_eq!(handler.take(), ["apply demo/web"]);
}
