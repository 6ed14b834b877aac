//! Kernel test: thousands of concurrent connections through one Service's
//! portal rules and listener, all open at once and all still answering.
//!
//! | object | addresses |
//! |---|---|
//! | ns1/many, echo 80/TCP | ClusterIP 10.96.0.20, endpoint ep1:9100 (a tokio echo server) |
//!
//! Every relayed connection costs this process four descriptors (client,
//! two in the relay, server): 10,000 connections need a descriptor limit
//! above 40,000. Two tests:
//! - `thousands_of_concurrent_connections_through_one_service`, on the
//!   host with iptables-nft: 10,000 where the descriptor limit allows and
//!   the largest whole thousand that fits otherwise (4,000 under a hard
//!   limit of 20,000 that the test cannot raise); it says which it used.
//! - `vm_ten_thousand_concurrent_connections_through_one_service`, with
//!   iptables-legacy in the kernel VM of `scripts/ipvs-vm/run` (ignored on
//!   the host), where the test is root with every capability and raises
//!   its limit: exactly 10,000, and it fails if the limit cannot be
//!   raised.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kernel;

use std::net::{IpAddr, SocketAddr};

use kernel::{at, require, three_pods, Proxy};
use kp_iptables::IptablesFlavor;
use kp_model::IpFamily;
use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::plan::NODE_NAME;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The echo server's port in the pod.
const ECHO_PORT: u16 = 9100;
/// What the issue asks for.
const WANTED: usize = 10_000;
/// Descriptors kept for everything else the test process holds.
const SPARE_DESCRIPTORS: u64 = 1_000;
/// The descriptor limit [`WANTED`] connections need: four each, and the
/// spare ones.
const DESCRIPTORS_WANTED: u64 = WANTED as u64 * 4 + SPARE_DESCRIPTORS;

#[test]
fn thousands_of_concurrent_connections_through_one_service() {
    require(IptablesFlavor::Nft);
    let count = connections_that_fit();
    eprintln!("opening {count} concurrent connections (wanted {WANTED})");
    concurrent_connections(IptablesFlavor::Nft, count);
}

#[test]
#[ignore = "needs a descriptor limit above 40,000: runs in the kernel VM (scripts/ipvs-vm/run)"]
fn vm_ten_thousand_concurrent_connections_through_one_service() {
    require(IptablesFlavor::Legacy);
    if let Err(error) = setrlimit(
        Resource::RLIMIT_NOFILE,
        DESCRIPTORS_WANTED,
        DESCRIPTORS_WANTED,
    ) {
        panic!("cannot raise the descriptor limit to {DESCRIPTORS_WANTED} ({error}): this test needs CAP_SYS_RESOURCE, as in the kernel VM");
    }
    concurrent_connections(IptablesFlavor::Legacy, WANTED);
}

/// Opens `count` connections through one Service's ClusterIP, each with a
/// round trip, keeps them all open, then checks that each still answers.
fn concurrent_connections(flavor: IptablesFlavor, count: usize) {
    let topology = three_pods();
    let pod_ip = IpAddr::V4(topology.pod("ep1").ip());
    let _server = topology.pod("ep1").netns().run(move || {
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(echo_server(SocketAddr::new(pod_ip, ECHO_PORT)));
        })
    });
    let proxy = Proxy::start(&topology, flavor, IpFamily::V4);
    let slice = endpoint_slice("ns1", "many-1", "many", |s| {
        s.address_type("IPv4")
            .port("echo", i32::from(ECHO_PORT), "TCP")
            .endpoint(pod_ip, |e| e.ready(true).node(NODE_NAME))
    });
    proxy.apply(
        &[service("ns1", "many", |s| {
            s.cluster_ip("10.96.0.20").port("echo", 80, "TCP")
        })],
        &[slice],
    );
    proxy.sync();

    let service = at("10.96.0.20", 80);
    let answered = topology.client().netns().block_on(|| async move {
        let mut open = Vec::with_capacity(count);
        for batch in (0..count).collect::<Vec<_>>().chunks(250) {
            let mut tasks = Vec::new();
            for &index in batch {
                tasks.push(tokio::spawn(async move {
                    let mut stream = tokio::net::TcpStream::connect(service)
                        .await
                        .unwrap_or_else(|error| panic!("connection {index} of {count}: {error}"));
                    round_trip(&mut stream, index).await;
                    stream
                }));
            }
            for task in tasks {
                open.push(task.await.unwrap());
            }
        }
        // Every connection is open now; each must still answer.
        let mut answered = 0;
        for (index, stream) in open.iter_mut().enumerate() {
            round_trip(stream, index + count).await;
            answered += 1;
        }
        answered
    });
    assert_eq!(answered, count);
}

async fn round_trip(stream: &mut tokio::net::TcpStream, token: usize) {
    let message = format!("{token:08}");
    let mut answer = [0u8; 8];
    let result: std::io::Result<()> = async {
        stream.write_all(message.as_bytes()).await?;
        stream.read_exact(&mut answer).await?;
        Ok(())
    }
    .await;
    if let Err(error) = result {
        panic!("round trip {token} failed: {error}");
    }
    assert_eq!(&answer, message.as_bytes());
}

async fn echo_server(addr: SocketAddr) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            let (mut reader, mut writer) = stream.into_split();
            let _ = tokio::io::copy(&mut reader, &mut writer).await;
        });
    }
}

/// Raises the descriptor limit as far as allowed and returns how many
/// connections fit.
fn connections_that_fit() -> usize {
    if setrlimit(
        Resource::RLIMIT_NOFILE,
        DESCRIPTORS_WANTED,
        DESCRIPTORS_WANTED,
    )
    .is_ok()
    {
        return WANTED;
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let fitting =
        usize::try_from(hard.saturating_sub(SPARE_DESCRIPTORS) / 4).unwrap() / 1000 * 1000;
    assert!(
        fitting >= 1000,
        "the descriptor hard limit {hard} leaves room for fewer than 1,000 relayed connections; raise it (ulimit -Hn)"
    );
    fitting.min(WANTED)
}
