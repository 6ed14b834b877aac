//! The backend over a strict recording applier: what each sync opens and
//! which portal rules it writes.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/web:http TCP | ClusterIP 10.96.0.10:80, endpoint 127.0.0.1:1 |
//! | ns1/sctp:s SCTP | ClusterIP 10.96.0.13:9 |
//!
//! Node IP 192.168.99.2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use kp_iptables::{JumpRule, SavedTable, Table};
use kp_model::{Endpoint, NamespacedName, NodeInfo, ServicePort};
use kp_sync::{ServicePortState, StaleConntrack};

use super::*;

/// What the recording applier saw.
#[derive(Debug, Default)]
struct Recorded {
    restores: Vec<String>,
    deleted_jumps: Vec<&'static str>,
    deleted_chains: Vec<String>,
    /// Restores to refuse, the next ones first.
    failing_restores: usize,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Recorded>>);

impl Applier for Recorder {
    fn restore(&mut self, _: IpFamily, text: &str) -> Result<(), ApplyError> {
        let mut recorded = self.0.lock().unwrap();
        if recorded.failing_restores > 0 {
            recorded.failing_restores -= 1;
            return Err(ApplyError::Failed {
                command: "iptables-restore".into(),
                status: "exit status: 1".into(),
                stderr: "refused".into(),
            });
        }
        recorded.restores.push(text.to_owned());
        Ok(())
    }
    fn save_table(&mut self, _: IpFamily, _: Table) -> Result<SavedTable, ApplyError> {
        panic!("the userspace backend does not read tables")
    }
    fn chain_exists(&mut self, _: IpFamily, _: Table, _: &str) -> Result<bool, ApplyError> {
        panic!("the userspace backend does not probe chains")
    }
    fn ensure_chain(&mut self, _: IpFamily, _: Table, _: &str) -> Result<(), ApplyError> {
        panic!("the userspace backend declares its chains in the restore")
    }
    fn delete_jump(&mut self, _: IpFamily, rule: &JumpRule) -> Result<bool, ApplyError> {
        self.0.lock().unwrap().deleted_jumps.push(rule.target_chain);
        Ok(false)
    }
    fn flush_and_delete_chain(
        &mut self,
        _: IpFamily,
        _: Table,
        chain: &str,
    ) -> Result<bool, ApplyError> {
        self.0.lock().unwrap().deleted_chains.push(chain.to_owned());
        Ok(true)
    }
}

fn name(service: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName::new(NamespacedName::new("ns1", service), port, protocol)
}

fn state(cluster_ip: &str, protocol: Protocol, endpoints: &[&str]) -> ServicePortState {
    let port = ServicePort {
        cluster_ip: cluster_ip.parse().unwrap(),
        port: 80,
        protocol,
        node_port: None,
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity_timeout: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
    };
    let all: Vec<Arc<Endpoint>> = endpoints
        .iter()
        .map(|text| {
            let addr: std::net::SocketAddr = text.parse().unwrap();
            Arc::new(Endpoint {
                ip: addr.ip(),
                port: addr.port(),
                ready: true,
                serving: true,
                terminating: false,
                is_local: true,
                node_name: None,
                zone: None,
                zone_hints: None,
                node_hints: None,
            })
        })
        .collect();
    kp_sync::testing::planned(port, all)
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-1".into(),
        addresses: vec!["192.168.99.2".parse().unwrap()],
        ..NodeInfo::default()
    }
}

fn sync(
    backend: &mut UserspaceBackend,
    ports: &BTreeMap<ServicePortName, ServicePortState>,
) -> Result<SyncOutcome, BackendError> {
    let changed = BTreeSet::new();
    let node = node();
    let stale = StaleConntrack::default();
    backend.sync(&SyncRequest {
        family: IpFamily::V4,
        full: false,
        service_ports: ports,
        changed_services: &changed,
        node: &node,
        stale_conntrack: &stale,
    })
}

fn backend(options: RelayOptions) -> (UserspaceBackend, Recorder) {
    let recorder = Recorder::default();
    let backend = UserspaceBackend::new(
        Handle::current(),
        IpFamily::V4,
        options,
        Box::new(recorder.clone()),
    )
    .with_routes_file(None);
    (backend, recorder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_first_sync_replaces_old_jumps_and_redirects_the_cluster_ip_to_the_new_listener() {
    let (mut backend, recorder) = backend(RelayOptions::default());
    let web = name("web", "http", Protocol::Tcp);
    let ports = BTreeMap::from([(
        web.clone(),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
    )]);

    let outcome = sync(&mut backend, &ports).unwrap();
    let listener = backend
        .relay()
        .listener(&web)
        .expect("a listener for ns1/web:http");
    assert!(listener.has_endpoints);
    let recorded = recorder.0.lock().unwrap();
    assert_eq!(
        recorded.deleted_jumps,
        [
            "KUBE-PORTALS-CONTAINER",
            "KUBE-PORTALS-HOST",
            "KUBE-NODEPORT-CONTAINER",
            "KUBE-NODEPORT-HOST"
        ]
    );
    let text = &recorded.restores[0];
    assert!(
        text.contains("-I PREROUTING "),
        "the jumps are inserted: {text}"
    );
    assert!(
        text.contains(&format!(
            "-d 10.96.0.10/32 -j REDIRECT --to-ports {}\n",
            listener.port
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "-j DNAT --to-destination 192.168.99.2:{}\n",
            listener.port
        )),
        "{text}"
    );
    assert!(outcome.full);
    assert_eq!(outcome.rules_per_table, [("nat".to_owned(), 2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn later_syncs_check_the_jumps_in_their_restore_and_keep_the_listener() {
    let (mut backend, recorder) = backend(RelayOptions::default());
    let web = name("web", "http", Protocol::Tcp);
    let ports = BTreeMap::from([(
        web.clone(),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
    )]);
    sync(&mut backend, &ports).unwrap();
    let port = backend.relay().listener(&web).unwrap().port;
    recorder.0.lock().unwrap().deleted_jumps.clear();

    sync(&mut backend, &ports).unwrap();
    let recorded = recorder.0.lock().unwrap();
    assert!(
        recorded.deleted_jumps.is_empty(),
        "no jump is deleted outside the restore"
    );
    let text = &recorded.restores[1];
    let jump_lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("PREROUTING") || line.contains(" OUTPUT "))
        .map(|line| line.split(" -m ").next().unwrap())
        .collect();
    assert_eq!(
        jump_lines,
        [
            "-D PREROUTING",
            "-I PREROUTING",
            "-D OUTPUT",
            "-I OUTPUT",
            "-D PREROUTING",
            "-A PREROUTING",
            "-D OUTPUT",
            "-A OUTPUT"
        ],
        "each jump is deleted and put back in one transaction, which fails if one is missing: {text}"
    );
    assert_eq!(
        backend.relay().listener(&web).unwrap().port,
        port,
        "the listener stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_restore_refused_for_a_missing_jump_is_written_again_with_fresh_jumps_in_the_same_sync() {
    let (mut backend, recorder) = backend(RelayOptions::default());
    let ports = BTreeMap::from([(
        name("web", "http", Protocol::Tcp),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
    )]);
    sync(&mut backend, &ports).unwrap();
    {
        let mut recorded = recorder.0.lock().unwrap();
        recorded.failing_restores = 1;
        recorded.deleted_jumps.clear();
    }

    sync(&mut backend, &ports).unwrap();
    let recorded = recorder.0.lock().unwrap();
    assert_eq!(recorded.deleted_jumps.len(), 4, "leftover copies deleted");
    let text = recorded.restores.last().unwrap();
    assert!(text.contains("-I PREROUTING "), "{text}");
    assert!(!text.contains("-D PREROUTING "), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_failed_restore_is_reported_and_the_next_sync_puts_the_jumps_back() {
    let (mut backend, recorder) = backend(RelayOptions::default());
    let ports = BTreeMap::from([(
        name("web", "http", Protocol::Tcp),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
    )]);
    sync(&mut backend, &ports).unwrap();
    recorder.0.lock().unwrap().failing_restores = 2;

    let error = sync(&mut backend, &ports).unwrap_err();
    assert!(
        error.to_string().contains("iptables-restore for table nat"),
        "{error}"
    );
    // Whether the failed restore got as far as the jumps is unknown, so
    // the next one puts them back (after deleting any copies).
    sync(&mut backend, &ports).unwrap();
    let recorded = recorder.0.lock().unwrap();
    let text = recorded.restores.last().unwrap();
    assert!(text.contains("-I PREROUTING "), "{text}");
    assert!(!text.contains("-D PREROUTING "), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_removed_service_loses_its_listener_and_rules() {
    let (mut backend, recorder) = backend(RelayOptions::default());
    let web = name("web", "http", Protocol::Tcp);
    let ports = BTreeMap::from([(
        web.clone(),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
    )]);
    sync(&mut backend, &ports).unwrap();

    sync(&mut backend, &BTreeMap::new()).unwrap();
    assert!(backend.relay().listener(&web).is_none());
    let recorded = recorder.0.lock().unwrap();
    assert!(
        !recorded.restores[1].contains("10.96.0.10"),
        "{}",
        recorded.restores[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn sctp_is_skipped_without_failing_the_sync() {
    let (mut backend, recorder) = backend(RelayOptions::default());
    let sctp = name("sctp", "s", Protocol::Sctp);
    let ports = BTreeMap::from([(
        sctp.clone(),
        state("10.96.0.13", Protocol::Sctp, &["127.0.0.1:1"]),
    )]);
    sync(&mut backend, &ports).unwrap();
    assert!(backend.relay().listener(&sctp).is_none());
    assert!(!recorder.0.lock().unwrap().restores[0].contains("10.96.0.13"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_service_port_that_gets_no_port_fails_the_sync_but_not_the_others() {
    // A range of one port: the second service port cannot have one.
    let holder = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    drop(holder);
    let (mut backend, recorder) = backend(RelayOptions {
        port_range: Some((port, port)),
        ..RelayOptions::default()
    });
    let ports = BTreeMap::from([
        (
            name("a", "http", Protocol::Tcp),
            state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
        ),
        (
            name("b", "http", Protocol::Tcp),
            state("10.96.0.11", Protocol::Tcp, &["127.0.0.1:1"]),
        ),
    ]);

    let error = sync(&mut backend, &ports).unwrap_err();
    let message = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(
        message.contains("ns1/b:http") && message.contains("no free tcp port"),
        "{message}"
    );
    let recorded = recorder.0.lock().unwrap();
    assert!(
        recorded.restores[0].contains(&format!("-d 10.96.0.10/32 -j REDIRECT --to-ports {port}"))
    );
    assert!(
        !recorded.restores[0].contains("10.96.0.11"),
        "no rule for the port without a listener"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_missing_iptables_program_makes_the_mode_unavailable() {
    let mut backend = UserspaceBackend::new(
        Handle::current(),
        IpFamily::V4,
        RelayOptions::default(),
        Box::new(MissingPrograms),
    );
    let error = sync(&mut backend, &BTreeMap::new()).unwrap_err();
    assert!(
        matches!(&error, BackendError::Unavailable { missing, .. } if missing.contains("iptables-missing")),
        "{error}"
    );
}

/// Fails every call as a host without the iptables programs would.
struct MissingPrograms;

impl Applier for MissingPrograms {
    fn restore(&mut self, _: IpFamily, _: &str) -> Result<(), ApplyError> {
        Err(ApplyError::Spawn {
            command: "iptables-missing-restore --noflush".into(),
            source: std::io::ErrorKind::NotFound.into(),
        })
    }
    fn save_table(&mut self, _: IpFamily, _: Table) -> Result<SavedTable, ApplyError> {
        panic!("not used")
    }
    fn chain_exists(&mut self, _: IpFamily, _: Table, _: &str) -> Result<bool, ApplyError> {
        panic!("not used")
    }
    fn ensure_chain(&mut self, _: IpFamily, _: Table, _: &str) -> Result<(), ApplyError> {
        panic!("not used")
    }
    fn delete_jump(&mut self, _: IpFamily, _: &JumpRule) -> Result<bool, ApplyError> {
        Err(ApplyError::Spawn {
            command: "iptables-missing -t nat -D PREROUTING".into(),
            source: std::io::ErrorKind::NotFound.into(),
        })
    }
    fn flush_and_delete_chain(
        &mut self,
        _: IpFamily,
        _: Table,
        _: &str,
    ) -> Result<bool, ApplyError> {
        panic!("not used")
    }
}

#[test]
fn cleanup_deletes_the_jumps_and_the_chains() {
    let mut recorder = Recorder::default();
    cleanup(&mut recorder, IpFamily::V4).unwrap();
    let recorded = recorder.0.lock().unwrap();
    assert_eq!(recorded.deleted_jumps.len(), 4);
    assert_eq!(recorded.deleted_chains, PORTAL_CHAINS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn each_sync_publishes_the_routes_that_the_portal_rules_lead_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kube-proxy").join("routes.json");
    let (backend, recorder) = backend(RelayOptions::default());
    let mut backend = backend.with_routes_file(Some(path.clone()));
    let web = name("web", "http", Protocol::Tcp);
    let mut ports = BTreeMap::from([(
        web.clone(),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1", "127.0.0.2:1"]),
    )]);
    sync(&mut backend, &ports).unwrap();
    let listener = backend.relay().listener(&web).unwrap();

    let published = crate::routes_file::RoutesFile::read(&path).unwrap();
    assert_eq!(published.family, "IPv4");
    assert_eq!(published.refusing_port, backend.relay().refusing_port());
    assert_eq!(published.ports.len(), 1);
    let entry = &published.ports[0];
    assert_eq!(
        (
            entry.name.as_str(),
            entry.protocol.as_str(),
            entry.relay_port
        ),
        ("ns1/web:http", "TCP", listener.port)
    );
    let endpoints: Vec<std::net::SocketAddr> = vec![
        "127.0.0.1:1".parse().unwrap(),
        "127.0.0.2:1".parse().unwrap(),
    ];
    assert_eq!(entry.internal, endpoints);

    // The portal rules written and the file agree: a pod's connection to
    // the ClusterIP reaches the relay and its two endpoints.
    let restore = recorder.0.lock().unwrap().restores[0].clone();
    let live = crate::trace::LiveState::from_parts(
        IpFamily::V4,
        vec!["192.168.99.2".parse().unwrap()],
        &restore,
        published,
    )
    .unwrap();
    let trace = live
        .trace(&crate::trace::Packet {
            src: "10.244.1.5".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            dport: 80,
            protocol: Protocol::Tcp,
            src_local: false,
            in_interface: None,
        })
        .unwrap();
    assert_eq!(
        trace.destinations().into_iter().collect::<Vec<_>>(),
        endpoints
    );

    // The next sync replaces the file: the Service is gone.
    ports.clear();
    sync(&mut backend, &ports).unwrap();
    let published = crate::routes_file::RoutesFile::read(&path).unwrap();
    assert!(published.ports.is_empty(), "{published:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_routing_file_that_cannot_be_written_does_not_fail_the_sync() {
    let dir = tempfile::tempdir().unwrap();
    // The file's directory would have to be inside a regular file.
    let blocker = dir.path().join("not-a-directory");
    std::fs::write(&blocker, b"").unwrap();
    let path = blocker.join("routes.json");
    let (backend, recorder) = backend(RelayOptions::default());
    let mut backend = backend.with_routes_file(Some(path.clone()));
    let web = name("web", "http", Protocol::Tcp);
    let ports = BTreeMap::from([(
        web.clone(),
        state("10.96.0.10", Protocol::Tcp, &["127.0.0.1:1"]),
    )]);

    sync(&mut backend, &ports).unwrap();
    sync(&mut backend, &ports).unwrap();
    assert!(backend.relay().listener(&web).is_some());
    assert_eq!(recorder.0.lock().unwrap().restores.len(), 2);
    assert!(!path.exists());
}
