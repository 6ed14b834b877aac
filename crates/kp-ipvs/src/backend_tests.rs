//! Stories of the backend against the fake kernel. Address plan as in
//! kp_testkit::plan: node 192.168.99.2, ClusterIPs 10.96.0.0/16, pods
//! 10.244.0.0/16 (this node's 10.244.1.0/24).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use kp_iptables::{ApplyError, JumpRule, SavedTable};
use kp_model::{IpFamily, Protocol};
use kp_node::MemorySysctl;
use pretty_assertions::assert_eq;

use super::*;
use crate::kernel::FakeKernel;
use crate::state::{ServiceKey, SetEntry, SetKind};
use crate::testing::{ip, service, Ports, RequestParts};

/// Records restores (and how many a test has looked at); a chain exists
/// once a restore declared it.
#[derive(Clone, Default)]
struct Restores(Arc<Mutex<(Vec<String>, usize)>>);

impl Applier for Restores {
    fn restore(&mut self, _family: IpFamily, text: &str) -> Result<(), ApplyError> {
        self.0.lock().unwrap().0.push(text.to_owned());
        Ok(())
    }
    fn save_table(&mut self, _: IpFamily, _: Table) -> Result<SavedTable, ApplyError> {
        Ok(SavedTable::default())
    }
    fn chain_exists(&mut self, _: IpFamily, _: Table, chain: &str) -> Result<bool, ApplyError> {
        let declared = format!(":{chain} ");
        Ok(self
            .0
            .lock()
            .unwrap()
            .0
            .iter()
            .any(|text| text.contains(&declared)))
    }
    fn ensure_chain(&mut self, _: IpFamily, _: Table, _: &str) -> Result<(), ApplyError> {
        Ok(())
    }
    fn delete_jump(&mut self, _: IpFamily, _: &JumpRule) -> Result<bool, ApplyError> {
        Ok(false)
    }
    fn flush_and_delete_chain(
        &mut self,
        _: IpFamily,
        _: Table,
        _: &str,
    ) -> Result<bool, ApplyError> {
        Ok(false)
    }
}

impl Restores {
    /// The restores since the last call.
    fn take(&self) -> Vec<String> {
        let mut guard = self.0.lock().unwrap();
        let (all, seen) = &mut *guard;
        let new = all[*seen..].to_vec();
        *seen = all.len();
        new
    }
}

struct World {
    kernel: FakeKernel,
    restores: Restores,
    backend: IpvsBackend,
}

fn world(options: IpvsOptions) -> World {
    let kernel = FakeKernel::new();
    let restores = Restores::default();
    let backend = IpvsBackend::new(
        IpFamily::V4,
        options,
        Box::new(kernel.clone()),
        Box::new(restores.clone()),
    )
    .with_sysctl(Box::new(MemorySysctl::new()))
    .with_local_addresses(Box::new(|| Ok(vec![ip("192.168.99.2"), ip("127.0.0.1")])));
    World {
        kernel,
        restores,
        backend,
    }
}

fn key(address: &str, port: u16) -> ServiceKey {
    ServiceKey {
        address: ip(address),
        protocol: Protocol::Tcp,
        port,
    }
}

fn sock(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// 100 Services with two endpoints each, svc42 with a third.
fn many(third_endpoint: bool) -> RequestParts {
    let mut ports = Ports::new();
    for index in 0..100u16 {
        let cluster_ip = format!("10.96.1.{}", index + 1);
        let mut svc = service("ns1", &format!("svc{index}"), &cluster_ip, 80)
            .endpoint(&format!("10.244.2.{}", index + 1), 8080, false)
            .endpoint(&format!("10.244.3.{}", index + 1), 8080, false);
        if index == 42 && third_endpoint {
            svc = svc.endpoint("10.244.4.42", 8080, false);
        }
        ports = ports.with(svc);
    }
    RequestParts::new(ports.build(), "192.168.99.2")
}

#[test]
fn the_first_sync_programs_link_sets_services_and_rules_with_their_jumps() {
    let mut w = world(IpvsOptions::default());
    let parts = RequestParts::new(
        Ports::new()
            .with(
                service("ns1", "svc1", "10.96.0.41", 80)
                    .node_port(30080)
                    .endpoint("10.244.1.2", 8080, true),
            )
            .build(),
        "192.168.99.2",
    );
    let outcome = w.backend.sync(&parts.request(true)).unwrap();
    assert!(outcome.full);
    let kernel = w.kernel.family(IpFamily::V4);
    assert!(kernel.link);
    assert_eq!(
        kernel.addresses.iter().copied().collect::<Vec<_>>(),
        [ip("10.96.0.41")]
    );
    assert_eq!(kernel.sets.len(), SetKind::ALL.len());
    assert_eq!(
        kernel.services[&key("10.96.0.41", 80)]
            .reals
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [sock("10.244.1.2:8080")]
    );
    assert!(
        kernel.services.contains_key(&key("192.168.99.2", 30080)),
        "NodePort on the node address"
    );
    assert!(
        !kernel.services.keys().any(|k| k.address.is_loopback()),
        "no NodePort on loopback"
    );
    let restores = w.restores.take();
    assert_eq!(restores.len(), 1);
    assert!(restores[0].contains("-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-I POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\nCOMMIT\n*filter"), "{}", restores[0]);
    // Later full syncs find the chains and insert no jumps again.
    w.backend.sync(&parts.request(true)).unwrap();
    assert!(!w.restores.take()[0].contains("-I "));
    assert!(restores[0].contains(
        "-I INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER"
    ));
    // The address appears after the virtual server has its real server.
    let log = w.kernel.take_log();
    let position = |wanted: &Op| log.iter().position(|op| op == wanted).unwrap();
    assert!(
        position(&Op::AddReal(
            key("10.96.0.41", 80),
            sock("10.244.1.2:8080"),
            1
        )) < position(&Op::AddAddress(ip("10.96.0.41")))
    );
}

#[test]
fn a_one_endpoint_change_sends_one_message_whatever_the_number_of_services() {
    let mut w = world(IpvsOptions::default());
    w.backend.sync(&many(false).request(true)).unwrap();
    w.kernel.take_log();
    w.restores.take();
    let before = w.kernel.messages();
    let outcome = w.backend.sync(&many(true).request(false)).unwrap();
    assert_eq!(w.kernel.messages() - before, 1);
    assert_eq!(
        w.kernel.take_log(),
        [Op::AddReal(
            key("10.96.1.43", 80),
            sock("10.244.4.42:8080"),
            1
        )]
    );
    assert_eq!(outcome.objects_written, 1);
    assert!(
        w.restores.take().is_empty(),
        "the iptables rules did not change"
    );
}

#[test]
fn a_removed_tcp_endpoint_drains_then_goes_once_its_connections_end() {
    let mut w = world(IpvsOptions::default());
    w.backend.sync(&many(true).request(true)).unwrap();
    w.kernel.take_log();
    let svc = key("10.96.1.43", 80);
    let leaving = sock("10.244.4.42:8080");
    w.kernel.set_connections(svc, leaving, 2);

    w.backend.sync(&many(false).request(false)).unwrap();
    assert_eq!(
        w.kernel.take_log(),
        [Op::UpdateReal(svc, leaving, 0)],
        "weight 0 first"
    );
    w.backend.sync(&many(false).request(false)).unwrap();
    assert_eq!(w.kernel.take_log(), [], "kept while connections are open");
    assert_eq!(
        w.kernel.family(IpFamily::V4).services[&svc].reals[&leaving],
        0
    );

    w.kernel.set_connections(svc, leaving, 0);
    w.backend.sync(&many(false).request(false)).unwrap();
    assert_eq!(w.kernel.take_log(), [Op::DeleteReal(svc, leaving)]);
}

#[test]
fn a_removed_udp_endpoint_goes_at_once() {
    let mut w = world(IpvsOptions::default());
    let dns = |third: bool| {
        let mut svc = service("kube-system", "dns", "10.96.0.10", 53)
            .protocol(Protocol::Udp)
            .endpoint("10.244.2.2", 53, false);
        if third {
            svc = svc.endpoint("10.244.2.3", 53, false);
        }
        RequestParts::new(Ports::new().with(svc).build(), "192.168.99.2")
    };
    w.backend.sync(&dns(true).request(true)).unwrap();
    w.kernel.take_log();
    w.backend.sync(&dns(false).request(false)).unwrap();
    let udp = ServiceKey {
        protocol: Protocol::Udp,
        ..key("10.96.0.10", 53)
    };
    assert_eq!(
        w.kernel.take_log(),
        [Op::DeleteReal(udp, sock("10.244.2.3:53"))]
    );
}

#[test]
fn a_full_sync_repairs_drift_and_leaves_what_is_right_alone() {
    let options = IpvsOptions {
        exclude_cidrs: vec!["198.51.100.0/24".parse().unwrap()],
        ..IpvsOptions::default()
    };
    let mut w = world(options);
    w.backend.sync(&many(false).request(true)).unwrap();
    w.kernel.take_log();
    w.backend.sync(&many(false).request(true)).unwrap();
    assert_eq!(
        w.kernel.take_log(),
        [],
        "a second full sync changes nothing"
    );

    // Someone removes an address and a set member, and adds two services.
    {
        let mut state = w.kernel.state();
        let v4 = state.families.get_mut(&IpFamily::V4).unwrap();
        v4.addresses.remove(&ip("10.96.1.7"));
        v4.sets
            .get_mut(&SetKind::ClusterIp)
            .unwrap()
            .remove(&SetEntry::IpPort(ip("10.96.1.8"), Protocol::Tcp, 80));
    }
    w.kernel.add_foreign_service(key("198.51.100.5", 80), "rr");
    w.kernel.add_foreign_service(key("10.96.9.9", 80), "rr");
    w.backend.sync(&many(false).request(true)).unwrap();
    let mut log = w.kernel.take_log();
    log.sort_by_key(|op| op.to_string());
    assert_eq!(
        log,
        [
            Op::AddAddress(ip("10.96.1.7")),
            Op::AddEntry(
                SetKind::ClusterIp,
                SetEntry::IpPort(ip("10.96.1.8"), Protocol::Tcp, 80)
            ),
            Op::DeleteService(key("10.96.9.9", 80)),
        ]
    );
    assert!(
        w.kernel
            .family(IpFamily::V4)
            .services
            .contains_key(&key("198.51.100.5", 80)),
        "excludeCIDRs protects it"
    );
}

#[test]
fn a_failed_apply_makes_the_next_sync_list_the_kernel() {
    let mut w = world(IpvsOptions::default());
    w.backend.sync(&many(false).request(true)).unwrap();
    w.kernel.state().fail_ops = 1;
    let error = w.backend.sync(&many(true).request(false)).unwrap_err();
    assert!(error.to_string().contains("ipvs backend"), "{error}");
    assert!(w.backend.applied().is_none());
    w.kernel.take_log();
    w.backend.sync(&many(true).request(false)).unwrap();
    assert_eq!(
        w.kernel.take_log(),
        [Op::AddReal(
            key("10.96.1.43", 80),
            sock("10.244.4.42:8080"),
            1
        )]
    );
}

#[test]
fn start_up_sets_upstreams_sysctls_and_timeouts() {
    let sysctl = MemorySysctl::new().with("net.ipv4.vs.conntrack", "0");
    let options = IpvsOptions {
        strict_arp: true,
        timeouts: [
            std::time::Duration::from_secs(900),
            std::time::Duration::from_secs(120),
            std::time::Duration::ZERO,
        ],
        kernel_version: Some(KernelVersion {
            major: 5,
            minor: 4,
            patch: 0,
        }),
        ..IpvsOptions::default()
    };
    let mut w = world(options);
    w.backend = w.backend.with_sysctl(Box::new(sysctl.clone()));
    w.backend.sync(&many(false).request(true)).unwrap();
    for (name, value) in [
        ("net.ipv4.vs.conntrack", "1"),
        ("net.ipv4.vs.expire_nodest_conn", "1"),
        ("net.ipv4.vs.expire_quiescent_template", "1"),
        ("net.ipv4.vs.conn_reuse_mode", "0"),
        ("net.ipv4.conf.all.arp_ignore", "1"),
        ("net.ipv4.conf.all.arp_announce", "2"),
    ] {
        assert_eq!(sysctl.get(name).unwrap(), value, "{name}");
    }
    assert_eq!(w.kernel.state().timeouts_secs, Some((900, 120, 0)));
}

#[test]
fn a_dry_run_prints_the_plan_and_touches_nothing() {
    let out = SharedBuffer::default();
    let mut backend =
        IpvsBackend::dry_run(IpFamily::V4, IpvsOptions::default(), Box::new(out.clone()))
            .with_local_addresses(Box::new(|| Ok(vec![ip("192.168.99.2")])));
    let parts = RequestParts::new(
        Ports::new()
            .with(service("ns1", "svc1", "10.96.0.41", 80).endpoint("10.244.1.2", 8080, true))
            .build(),
        "192.168.99.2",
    );
    backend.sync(&parts.request(true)).unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("# kube-ipvs0 addresses (IPv4)\nkube-ipvs0 10.96.0.41/32\n"),
        "{text}"
    );
    assert!(
        text.contains("TCP  10.96.0.41:80 rr\n  -> 10.244.1.2:8080"),
        "{text}"
    );
    assert!(
        text.contains("Name: KUBE-CLUSTER-IP\nType: hash:ip,port\nMembers:\n10.96.0.41,tcp:80\n"),
        "{text}"
    );
    assert!(text.contains("*nat\n:KUBE-SERVICES - [0:0]"), "{text}");
}

#[derive(Clone, Default)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn after_a_restart_service_addresses_on_kube_ipvs0_are_not_taken_for_node_addresses() {
    let kernel = FakeKernel::new();
    let parts = RequestParts::new(
        Ports::new()
            .with(
                service("ns1", "ext", "10.96.0.46", 80)
                    .external_ip("203.0.113.9")
                    .node_port(30080)
                    .endpoint("10.244.1.2", 80, true),
            )
            .build(),
        "192.168.99.2",
    );
    // The host lists every address, those on kube-ipvs0 included.
    let lister = || -> AddressLister {
        let kernel = kernel.clone();
        Box::new(move || {
            let mut all = vec![ip("192.168.99.2")];
            all.extend(kernel.family(IpFamily::V4).addresses);
            Ok(all)
        })
    };
    let new_backend = || {
        IpvsBackend::new(
            IpFamily::V4,
            IpvsOptions::default(),
            Box::new(kernel.clone()),
            Box::new(Restores::default()),
        )
        .with_sysctl(Box::new(MemorySysctl::new()))
        .with_local_addresses(lister())
    };
    let mut first = new_backend();
    first.sync(&parts.request(true)).unwrap();
    kernel.take_log();
    let mut restarted = new_backend();
    restarted.sync(&parts.request(true)).unwrap();
    assert_eq!(
        kernel.take_log(),
        [],
        "the restarted proxy finds everything in place"
    );
    assert!(kernel
        .family(IpFamily::V4)
        .addresses
        .contains(&ip("203.0.113.9")));
}

/// ns1/good with one endpoint, and, when `with_bad`, ns1/bad whose second
/// endpoint is the directed broadcast address of the node's subnet: the
/// API accepts it, IPVS refuses it as a real server (`EINVAL`, "not
/// unicast").
fn good_and_bad(with_bad: bool) -> RequestParts {
    let mut ports = Ports::new().with(
        service("ns1", "good", "10.96.0.41", 80)
            .node_port(30080)
            .endpoint("10.244.1.2", 8080, true),
    );
    if with_bad {
        ports = ports.with(
            service("ns1", "bad", "10.96.0.42", 80)
                .external_ip("203.0.113.7")
                .endpoint("10.244.1.3", 8080, true)
                .endpoint("192.168.99.255", 8080, false),
        );
    }
    RequestParts::new(ports.build(), "192.168.99.2")
}

#[test]
fn a_service_the_kernel_refuses_is_named_and_every_other_one_is_programmed() {
    let mut w = world(IpvsOptions::default());
    w.kernel.state().broadcast.insert(ip("192.168.99.255"));
    let error = w
        .backend
        .sync(&good_and_bad(true).request(true))
        .unwrap_err();
    let BackendError::Rejected {
        services, source, ..
    } = &error
    else {
        panic!("a refused operation is a rejected rule set: {error}");
    };
    assert_eq!(
        services.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["ns1/bad"],
        "{error}"
    );
    assert!(
        source.to_string().contains("-r 192.168.99.255:8080"),
        "the refused real server is named: {source}"
    );
    // Everything else was applied: the good Service whole, the iptables
    // rules, and the bad Service's operations the kernel accepted.
    let kernel = w.kernel.family(IpFamily::V4);
    let good = &kernel.services[&key("10.96.0.41", 80)];
    assert_eq!(
        good.reals.keys().copied().collect::<Vec<_>>(),
        [sock("10.244.1.2:8080")]
    );
    assert!(kernel.services.contains_key(&key("192.168.99.2", 30080)));
    assert!(kernel.addresses.contains(&ip("10.96.0.41")));
    assert!(kernel
        .entries(SetKind::ClusterIp)
        .any(|e| *e == SetEntry::IpPort(ip("10.96.0.41"), Protocol::Tcp, 80)));
    assert_eq!(
        w.restores.take().len(),
        1,
        "the iptables rules were restored"
    );
    assert!(
        w.backend.applied().is_none(),
        "the next sync lists the kernel"
    );

    // The sync loop leaves ns1/bad out of the next sync: nothing of it is
    // left, and the good Service is untouched.
    w.kernel.take_log();
    w.backend.sync(&good_and_bad(false).request(true)).unwrap();
    let kernel = w.kernel.family(IpFamily::V4);
    assert_eq!(
        kernel.addresses.iter().copied().collect::<Vec<_>>(),
        [ip("10.96.0.41")]
    );
    let keys: Vec<ServiceKey> = kernel.services.keys().copied().collect();
    assert_eq!(keys, [key("10.96.0.41", 80), key("192.168.99.2", 30080)]);
    for kind in SetKind::ALL {
        for entry in kernel.entries(kind) {
            let text = entry.to_string();
            assert!(
                !text.contains("10.96.0.42")
                    && !text.contains("203.0.113.7")
                    && !text.contains("10.244.1.3"),
                "{kind:?} still holds {text}"
            );
        }
    }
    assert!(
        w.kernel
            .take_log()
            .iter()
            .all(|op| !op.to_string().contains("10.96.0.41")),
        "the good Service was not touched"
    );
    // And once the bad Service is fixed, it is programmed.
    w.kernel.state().broadcast.clear();
    w.backend.sync(&good_and_bad(true).request(false)).unwrap();
    assert!(w
        .kernel
        .family(IpFamily::V4)
        .services
        .contains_key(&key("10.96.0.42", 80)));
}

#[test]
fn a_scheduler_the_kernel_cannot_load_is_refused_for_every_service_and_named() {
    let options = IpvsOptions {
        scheduler: "lblcr".to_owned(),
        ..IpvsOptions::default()
    };
    let mut w = world(options);
    w.kernel
        .state()
        .missing_schedulers
        .insert("lblcr".to_owned());
    let error = w
        .backend
        .sync(&good_and_bad(true).request(true))
        .unwrap_err();
    let BackendError::Rejected { services, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(
        services.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["ns1/bad", "ns1/good"]
    );
    let text = format!("{:?}", std::error::Error::source(&error));
    assert!(
        text.contains("ipvsadm -A TCP  10.96.0.41:80 -s lblcr"),
        "{text}"
    );
    assert!(w.kernel.family(IpFamily::V4).services.is_empty());
}

#[test]
fn thousands_of_refusals_are_counted_and_only_the_first_few_spelled_out() {
    let mut w = world(IpvsOptions::default());
    let mut bad = service("ns1", "bad", "10.96.0.42", 80);
    for n in 0..1_000u32 {
        let address =
            std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(224, 0, 1, 0)) + n);
        bad = bad.endpoint(&address.to_string(), 8080, false);
    }
    let parts = RequestParts::new(Ports::new().with(bad).build(), "192.168.99.2");
    let error = w.backend.sync(&parts.request(true)).unwrap_err();
    let chain = kp_sync::error_chain(&error);
    assert!(chain.contains("(and 999 more operations)"), "{chain}");
    assert!(
        chain.contains("the kernel refused 1000 operations"),
        "{chain}"
    );
    assert!(chain.contains("… (995 more)"), "{chain}");
    assert!(chain.len() < 2_000, "{} bytes: {chain:.300}", chain.len());
}

#[test]
fn a_drained_udp_real_server_found_in_the_kernel_is_deleted_once() {
    let mut w = world(IpvsOptions::default());
    let dns = RequestParts::new(
        Ports::new()
            .with(
                service("kube-system", "dns", "10.96.0.10", 53)
                    .protocol(Protocol::Udp)
                    .endpoint("10.244.2.2", 53, false),
            )
            .build(),
        "192.168.99.2",
    );
    w.backend.sync(&dns.request(true)).unwrap();
    let udp = ServiceKey {
        protocol: Protocol::Udp,
        ..key("10.96.0.10", 53)
    };
    // Left at weight 0 by an earlier proxy.
    w.kernel
        .state()
        .families
        .get_mut(&IpFamily::V4)
        .unwrap()
        .services
        .get_mut(&udp)
        .unwrap()
        .reals
        .insert(sock("10.244.2.9:53"), 0);
    w.kernel.take_log();
    w.backend.sync(&dns.request(true)).unwrap();
    assert_eq!(
        w.kernel.take_log(),
        [Op::DeleteReal(udp, sock("10.244.2.9:53"))]
    );
}

#[test]
fn an_object_changed_behind_the_proxys_back_fails_the_sync_without_naming_a_service() {
    let mut w = world(IpvsOptions::default());
    let dns = |two: bool| {
        let mut svc = service("kube-system", "dns", "10.96.0.10", 53)
            .protocol(Protocol::Udp)
            .endpoint("10.244.2.2", 53, false);
        if two {
            svc = svc.endpoint("10.244.2.3", 53, false);
        }
        RequestParts::new(Ports::new().with(svc).build(), "192.168.99.2")
    };
    w.backend.sync(&dns(true).request(true)).unwrap();
    let udp = ServiceKey {
        protocol: Protocol::Udp,
        ..key("10.96.0.10", 53)
    };
    // Someone runs `ipvsadm -d` for the real server the next sync removes.
    w.kernel
        .state()
        .families
        .get_mut(&IpFamily::V4)
        .unwrap()
        .services
        .get_mut(&udp)
        .unwrap()
        .reals
        .remove(&sock("10.244.2.3:53"));
    let error = w.backend.sync(&dns(false).request(false)).unwrap_err();
    let BackendError::Rejected { services, .. } = &error else {
        panic!("{error}");
    };
    assert!(
        services.is_empty(),
        "the Service is not at fault: {services:?}"
    );
    // The next sync lists the kernel and finds it as planned.
    w.kernel.take_log();
    w.backend.sync(&dns(false).request(false)).unwrap();
    assert_eq!(w.kernel.take_log(), []);
}
