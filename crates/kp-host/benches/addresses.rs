//! Cost of one "what are the host's addresses" call, in a network namespace
//! this program creates, fills and removes (root only): the `/proc` parse
//! kube-proxy-rs used before (`fib_trie` + `if_inet6`, reproduced below),
//! a call to the cached [`HostAddresses`] with nothing changed, and a fresh
//! rtnetlink dump ([`HostAddresses::refresh`]). Medians of 5 runs.
//!
//! The namespace holds `KP_BENCH_ADDRESSES` IPv4 addresses (each in a /24
//! of its own, so each also adds a prefix route and a broadcast route),
//! as many IPv6 addresses, and `KP_BENCH_ROUTES` further IPv4 routes.
//!
//! Run with `cargo bench -p kp-host --bench addresses`; defaults
//! `KP_BENCH_ADDRESSES=1000 KP_BENCH_ROUTES=10000`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use kp_host::HostAddresses;
use kp_testkit::netns::Netns;

const RUNS: usize = 5;

fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name).map_or(default, |value| value.parse().expect(name))
}

/// The namespace: `eth0` (a veth whose peer stays in the namespace) with
/// the addresses, and the routes.
fn namespace(addresses: u32, routes: u32) -> Netns {
    let netns = Netns::create("addr-bench").unwrap();
    let mut commands = vec![
        "link add eth0 type veth peer name peer0".to_owned(),
        "link set eth0 up".to_owned(),
        "link set peer0 up".to_owned(),
    ];
    for n in 0..addresses {
        commands.push(format!(
            "address add 10.{}.{}.1/24 dev eth0",
            n / 256,
            n % 256
        ));
        commands.push(format!("address add fd00:1:{n:x}::1/64 dev eth0 nodad"));
    }
    for n in 0..routes {
        let destination = Ipv4Addr::from(0xac10_0000 + n);
        commands.push(format!("route add {destination}/32 dev eth0"));
    }
    netns.ip_batch(&commands).unwrap();
    netns
}

/// Median over [`RUNS`] runs of the time of one call, each run making
/// `calls` calls.
fn per_call(calls: u32, mut call: impl FnMut() -> usize) -> (Duration, usize) {
    let mut times = Vec::with_capacity(RUNS);
    let mut found = 0;
    for _ in 0..RUNS {
        let start = Instant::now();
        for _ in 0..calls {
            found = std::hint::black_box(call());
        }
        times.push(start.elapsed() / calls);
    }
    times.sort();
    (times[RUNS / 2], found)
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("this benchmark creates a network namespace: run it as root");
        std::process::exit(1);
    }
    let addresses = env_number("KP_BENCH_ADDRESSES", 1000);
    let routes = env_number("KP_BENCH_ROUTES", 10000);
    let netns = namespace(addresses, routes);
    let rows = netns.run(|| {
        let fib_trie_bytes = std::fs::read("/proc/thread-self/net/fib_trie")
            .unwrap()
            .len();
        let mut cache = HostAddresses::new();
        cache.addresses().unwrap();
        let rows = [
            ("/proc parse (fib_trie + if_inet6), before", {
                per_call(20, || proc_local_addresses().len())
            }),
            ("cached rtnetlink, nothing changed", {
                per_call(10_000, || cache.addresses().unwrap().len())
            }),
            ("fresh rtnetlink dump (refresh)", {
                per_call(50, || cache.refresh().unwrap().len())
            }),
        ];
        println!("fib_trie: {fib_trie_bytes} bytes");
        rows
    });
    println!("{addresses} IPv4 + {addresses} IPv6 addresses, {routes} extra routes\n");
    println!("| call | time per call | addresses found |");
    println!("|---|---:|---:|");
    for (name, (time, found)) in rows {
        println!("| {name} | {time:.1?} | {found} |");
    }
}

/// The former reader: local /32 routes of `fib_trie`, and `if_inet6`.
fn proc_local_addresses() -> Vec<IpAddr> {
    let fib_trie = std::fs::read_to_string("/proc/thread-self/net/fib_trie").unwrap();
    let mut found = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let trimmed = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(ip) = trimmed.parse::<Ipv4Addr>() {
            last = Some(ip);
        } else if trimmed.starts_with("/32 host LOCAL") {
            found.extend(last);
        }
    }
    let mut addresses: Vec<IpAddr> = found.into_iter().map(IpAddr::V4).collect();
    let if_inet6 = std::fs::read_to_string("/proc/thread-self/net/if_inet6").unwrap();
    addresses.extend(
        if_inet6
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .filter_map(|hex| u128::from_str_radix(hex, 16).ok())
            .map(|bits| IpAddr::V6(Ipv6Addr::from(bits))),
    );
    addresses
}
