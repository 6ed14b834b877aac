//! Kernel test of the IPVS mode: a UDP client that keeps sending from one
//! source port moves to a remaining endpoint within one sync of its
//! endpoint no longer being used (issue 28). Both the conntrack entry
//! (deleted by kp_conntrack's cleaner, attached as the binary attaches it)
//! and IPVS's own connection entry (its real server deleted at once, and
//! expired at its next packet by `expire_nodest_conn`) pin the flow. Run in
//! the VM by scripts/ipvs-vm/run (see kernel_ipvs.rs).
//!
//! | object | addresses |
//! |---|---|
//! | ns1/dns, port dns 53/UDP | ClusterIP 10.96.0.20 |
//! | s1 (node-2), s2 (node-1) | UDP echo on 5353 |
//! | clients | pod `src` on node-1, the node itself, `client` outside (192.168.99.10) |
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kp_conntrack::{ConntrackCleaner, ConntrackMetrics};
use kp_iptables::{IptablesFlavor, LocalDetector, SystemApplier};
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::{IpvsBackend, IpvsOptions};
use kp_model::{IpFamily, NodeInfo, ObjectEvent, ProxyEventHandler, ResourceKind};
use kp_sync::{Proxier, ProxierConfig, RunnerConfig};
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::netns::{require_root, require_tool, Netns, Reply, Topology};
use kp_testkit::plan::{self, NODE_NAME, OTHER_NODE_NAME};

const SERVICE: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 20)), 53);
const POD_UDP_PORT: u16 = 5353;
/// How often each client sends, as in the reproduction.
const SEND_INTERVAL: Duration = Duration::from_millis(300);
/// How long after a sync every client must be answered by the remaining
/// endpoint: a few datagrams (IPVS drops the first datagram of a flow
/// whose real server is gone while it expires the connection), far less
/// than a second sync would take.
const MOVE_DEADLINE: Duration = Duration::from_secs(3);

/// One endpoint of the slice and its conditions.
#[derive(Clone, Copy)]
enum Condition {
    Ready,
    TerminatingServing,
}

/// The slice of ns1/dns with `endpoints` (address, node, condition).
fn dns_slice(endpoints: &[(Ipv4Addr, &str, Condition)]) -> EndpointSlice {
    endpoint_slice("ns1", "dns-1", "dns", |mut s| {
        s = s.port("dns", i32::from(POD_UDP_PORT), "UDP");
        for (address, node, condition) in endpoints {
            s = s.endpoint(*address, |e| match condition {
                Condition::Ready => e.ready(true).node(node),
                Condition::TerminatingServing => e.terminating_serving().node(node),
            });
        }
        s
    })
}

/// The IPv4 proxier with the IPVS backend and the real iptables rules,
/// with the conntrack cleaner attached as the binary attaches it.
fn proxier() -> Proxier {
    let options = IpvsOptions {
        local_detector: LocalDetector::ClusterCidr(vec![plan::POD_CIDR.into()]),
        ..IpvsOptions::default()
    };
    let backend = IpvsBackend::new(
        IpFamily::V4,
        options,
        Box::new(NetlinkKernel::new()),
        Box::new(SystemApplier::new(IptablesFlavor::Legacy)),
    );
    let config = ProxierConfig {
        family: IpFamily::V4,
        node: NodeInfo {
            name: NODE_NAME.to_owned(),
            addresses: vec![IpAddr::V4(plan::NODE_IP)],
            ..NodeInfo::default()
        },
        runner: RunnerConfig {
            min_interval: Duration::ZERO,
            max_interval: Duration::ZERO,
            retry_interval: Duration::from_millis(100),
        },
    };
    let cleaner = ConntrackCleaner::new(IpFamily::V4, ConntrackMetrics::new());
    let proxier = Proxier::new(config, Box::new(backend)).with_observer(Arc::new(cleaner));
    proxier.on_synced(ResourceKind::Service);
    proxier.on_synced(ResourceKind::EndpointSlice);
    proxier
}

/// Records the Service and `slice`, syncs once in the node namespace, and
/// returns when the sync ended.
fn sync(topology: &Topology, proxier: &Proxier, slice: EndpointSlice) -> Instant {
    let dns = service("ns1", "dns", |s| {
        s.cluster_ip(SERVICE.ip()).port("dns", 53, "UDP")
    });
    proxier.on_service(ObjectEvent::Apply(dns));
    proxier.on_endpoint_slice(ObjectEvent::Apply(slice));
    topology.node().run(|| proxier.sync_once()).unwrap();
    Instant::now()
}

/// A client that sends a datagram to the Service every [`SEND_INTERVAL`]
/// from one socket (one fixed source port) and records who answered.
struct Sender {
    name: &'static str,
    answers: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    fn start(name: &'static str, netns: &Netns) -> Self {
        let socket = netns
            .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
            .unwrap();
        socket.connect(SERVICE).unwrap();
        socket.set_read_timeout(Some(SEND_INTERVAL)).unwrap();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (answers, stop) = (Arc::clone(&answers), Arc::clone(&stop));
            std::thread::spawn(move || send_loop(&socket, &answers, &stop))
        };
        Self {
            name,
            answers,
            stop,
            thread: Some(thread),
        }
    }

    /// Who answered after `since`, in order.
    fn answered_since(&self, since: Instant) -> Vec<String> {
        let answers = self.answers.lock().unwrap();
        answers
            .iter()
            .filter(|(at, _)| *at > since)
            .map(|(_, backend)| backend.clone())
            .collect()
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

/// Sends `question-N` every interval and records each matching answer;
/// a datagram lost or refused is simply not answered.
fn send_loop(socket: &UdpSocket, answers: &Mutex<Vec<(Instant, String)>>, stop: &AtomicBool) {
    let mut sent = 0u64;
    let mut buffer = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        sent += 1;
        let token = format!("question-{sent}");
        let next = Instant::now() + SEND_INTERVAL;
        // An ICMP error of an earlier datagram surfaces here; go on.
        let _ = socket.send(token.as_bytes());
        while Instant::now() < next {
            match socket.recv(&mut buffer) {
                Ok(len) => {
                    let text = String::from_utf8_lossy(&buffer[..len]);
                    if let Some(reply) = Reply::parse(&text) {
                        answers
                            .lock()
                            .unwrap()
                            .push((Instant::now(), reply.backend));
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => {}
            }
        }
    }
}

/// Waits until every sender has been answered by `backend` after `since`
/// and, from its first such answer on, by nothing else.
#[track_caller]
fn wait_all_moved(senders: &[Sender], since: Instant, backend: &str, deadline: Duration) {
    let end = since + deadline;
    loop {
        let moved: BTreeMap<&str, Vec<String>> = senders
            .iter()
            .map(|s| (s.name, s.answered_since(since)))
            .collect();
        let done = moved.values().all(|answers| {
            let first = answers.iter().position(|b| b == backend);
            first.is_some_and(|at| answers[at..].iter().all(|b| b == backend))
        });
        if done {
            return;
        }
        if Instant::now() > end {
            panic!(
                "within {deadline:?} of the sync every client should be answered by {backend} only; answers since the sync: {moved:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs a kernel with IPVS: run scripts/ipvs-vm/run"]
fn vm_udp_clients_move_to_the_remaining_endpoint_within_one_sync() {
    require_root();
    assert!(
        Path::new("/proc/net/ip_vs").exists(),
        "this kernel has no IPVS: run scripts/ipvs-vm/run"
    );
    require_tool("iptables-legacy-restore");
    let topology = Topology::builder()
        .remote_pod("s1", |p| p.udp(POD_UDP_PORT))
        .pod("s2", |p| p.udp(POD_UDP_PORT))
        .pod("src", |p| p)
        .client("client")
        .build()
        .unwrap();
    let (s1, s2) = (topology.pod("s1").ip(), topology.pod("s2").ip());
    let proxier = proxier();

    // 1. s1 alone: every client's flow goes to s1.
    let start = sync(
        &topology,
        &proxier,
        dns_slice(&[(s1, OTHER_NODE_NAME, Condition::Ready)]),
    );
    let senders = [
        Sender::start("pod", topology.pod("src")),
        Sender::start("node", topology.node()),
        Sender::start("outside", topology.client()),
    ];
    wait_all_moved(&senders, start, "s1", Duration::from_secs(10));

    // 2. s2 joins, ready.
    sync(
        &topology,
        &proxier,
        dns_slice(&[
            (s1, OTHER_NODE_NAME, Condition::Ready),
            (s2, NODE_NAME, Condition::Ready),
        ]),
    );

    // 3. s1 terminates while s2 is ready: it serves, but is no longer
    //    used, so every flow moves to s2 within this one sync.
    let terminating = sync(
        &topology,
        &proxier,
        dns_slice(&[
            (s1, OTHER_NODE_NAME, Condition::TerminatingServing),
            (s2, NODE_NAME, Condition::Ready),
        ]),
    );
    wait_all_moved(&senders, terminating, "s2", MOVE_DEADLINE);

    // 4. s1 leaves the slice: the flows stay on s2.
    let removed = sync(
        &topology,
        &proxier,
        dns_slice(&[(s2, NODE_NAME, Condition::Ready)]),
    );
    wait_all_moved(&senders, removed, "s2", MOVE_DEADLINE);
}
