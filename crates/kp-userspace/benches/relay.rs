//! The relay against HAProxy in the same namespace topology.
//!
//! `cargo bench -p kp-userspace --bench relay` (root; needs the Debian
//! package `haproxy`). A client namespace talks to a proxy in the node
//! namespace (192.168.99.2), which forwards to servers in the pod `ep1`
//! (10.244.1.2): the kp-testkit topology. Three proxies take turns, each
//! started fresh for every run: our relay as a child process of this
//! binary (`relay-child`, so its RSS and CPU time are its own), the same
//! without splice (copying through buffers), and HAProxy 2.x with two
//! threads (our relay has a worker thread per CPU: two here), all with
//! their default buffer sizes. The client connects to the proxy's port directly: no
//! portal rules, the data path alone is compared. Each run widens the
//! namespaces' local port range and allows TIME_WAIT reuse, so tens of
//! thousands of connections per run do not run out of ports.
//!
//! Figures, medians of `KP_US_BENCH_RUNS` runs (5 by default):
//! - bulk throughput with 1 and 64 connections (client → sink, 2 s), and
//!   the proxy's CPU time per GiB in the 64-connection run;
//! - connections per second (16 loops of connect, read 1 byte, close),
//!   and the proxy's CPU time per connection in that run; the proxies
//!   take turns in slices of 250 ms, 8 each per run, so a slow moment of
//!   the machine falls on each alike;
//! - request/response latency p50/p99 (64 bytes over 8 connections at
//!   2,000 requests/s through each proxy, 10 s), from each request's send,
//!   and the p99 from its scheduled time (which adds the client's 1 ms
//!   timer lag), and the proxy's CPU time per request; all proxies are
//!   measured at once, their requests interleaved in time, for the same
//!   reason;
//! - the proxy's RSS growth with 10,000 idle relayed connections (9,000
//!   where the descriptor hard limit is 20,000 and cannot be raised;
//!   `scripts/ipvs-vm/run --bench-relay-idle` runs this part alone in a
//!   VM whose root can raise it), per connection.
//!
//! The table ends with the median of the per-run ratios (relay ÷ HAProxy)
//! of the connection rate and the p99, steadier on a noisy machine than
//! the ratio of the medians.
//!
//! Selecting parts, to keep a run short: `KP_US_BENCH_PARTS`, a comma
//! list of `idle`, `bulk`, `rate`, `latency` (all by default), and
//! `KP_US_BENCH_PROXIES`, a comma list of `relay`, `no-splice`, `haproxy`
//! (all three by default), `shared` (the relay with TCP on the
//! process's shared tokio runtime, `RelayOptions::workers` 0, as it was
//! before it had worker threads of its own) and `direct` (the client
//! talks to the servers with no proxy between: the floor that the
//! machine and the load generator set). Figures of parts not run are 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "relay_load.rs"]
mod load;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kp_model::{IpFamily, NamespacedName, Protocol, ServicePortName};
use kp_testkit::netns::{NsChild, Topology};
use kp_testkit::plan::NODE_IP;
use kp_userspace::{DesiredListener, Relay, RelayOptions, Route};

/// Open connections of the idle-memory figure. Each costs the relay two
/// descriptors and this process two (client and server end), so 10,000
/// needs a descriptor limit above 20,000; where the hard limit is lower
/// (and cannot be raised without CAP_SYS_RESOURCE) it is 9,000.
const IDLE_CONNECTIONS_WANTED: usize = 10_000;
/// Our relay's ports on the node: sink, greeter, echo.
const RELAY_PORTS: [u16; 3] = [15000, 15001, 15002];
/// The relay without splice (copying through buffers): sink, greeter, echo.
const RELAY_COPY_PORTS: [u16; 3] = [17000, 17001, 17002];
/// HAProxy's ports on the node: sink, greeter, echo.
const HAPROXY_PORTS: [u16; 3] = [16000, 16001, 16002];
/// The relay on the shared runtime (no worker threads): sink, greeter, echo.
const RELAY_SHARED_PORTS: [u16; 3] = [18000, 18001, 18002];
/// The relay's row name, the one the paired ratios are of.
const RELAY: &str = "kp-userspace";
/// HAProxy's row name.
const HAPROXY: &str = "haproxy";
/// The row of the client talking to the servers with no proxy between.
const DIRECT: &str = "no proxy";
/// Rounds of the connection-rate part: in each, every proxy in turn has a
/// slice of [`RATE_SLICE`], in the opposite order every other round.
const RATE_ROUNDS: u32 = 8;
/// How long one proxy is measured at a time in the connection-rate part.
const RATE_SLICE: Duration = Duration::from_millis(250);
/// Duration of the latency part of one run.
const LATENCY_DURATION: Duration = Duration::from_secs(10);
/// File descriptors the benchmark's processes may open.
const NOFILE: u64 = 100_000;
/// Descriptors kept free for everything but the idle connections.
const SPARE_DESCRIPTORS: u64 = 500;

/// A proxy under test.
struct Target {
    name: &'static str,
    /// The proxy's process; none for the row without a proxy.
    process: Option<NsChild>,
    /// Where the client connects to reach the sink, the greeter and the
    /// echo server.
    addrs: [SocketAddr; 3],
    figures: Figures,
}

impl Target {
    fn behind(name: &'static str, process: NsChild, ports: [u16; 3]) -> Self {
        Self {
            name,
            process: Some(process),
            addrs: ports.map(|port| SocketAddr::new(IpAddr::V4(NODE_IP), port)),
            figures: Figures::default(),
        }
    }

    /// CPU time the proxy has used, in seconds (0 without a proxy).
    fn cpu_seconds(&self) -> f64 {
        self.process
            .as_ref()
            .map_or(0.0, |process| cpu_seconds(process.id()))
    }
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    bulk_1_mbps: f64,
    bulk_64_mbps: f64,
    /// CPU time of the proxy process per GiB moved in the 64-connection
    /// bulk run (user + system).
    bulk_64_cpu_ms_per_gib: f64,
    connections_per_s: f64,
    /// CPU time of the proxy process per connection in the
    /// connection-rate run (user + system).
    connection_cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
    /// CPU time of the proxy process per request in the latency run
    /// (user + system).
    request_cpu_us: f64,
    p99_scheduled_us: f64,
    idle_bytes_per_connection: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("relay-child") {
        relay_child(&args[2..]);
        return;
    }
    let idle = idle_connections(raise_nofile());
    let runs: usize = std::env::var("KP_US_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let topology = Topology::builder()
        .pod("ep1", |p| p)
        .client("client")
        .build()
        .unwrap();
    let pod_ip = IpAddr::V4(topology.pod("ep1").ip());
    // Each run opens tens of thousands of connections from the client and,
    // through each proxy, from the node: a wide port range and reuse of
    // TIME_WAIT ports keep both from running out (namespace-local sysctls).
    for netns in [topology.node(), topology.client().netns()] {
        netns
            .sysctl("net/ipv4/ip_local_port_range", "10000 65000")
            .unwrap();
        netns.sysctl("net/ipv4/tcp_tw_reuse", "1").unwrap();
    }
    let server = start_servers(&topology, pod_ip);
    let parts = Parts::from_env();
    let proxies = selected("KP_US_BENCH_PROXIES", &["relay", "no-splice", "haproxy"]);
    let mut results: BTreeMap<&str, Vec<Figures>> = BTreeMap::new();
    for run in 0..runs {
        // Fresh proxies per run, so the idle-memory figure starts from a
        // heap that no earlier bulk run has grown; the proxies take turns
        // scenario by scenario, so a noisy moment of the machine hits them
        // alike.
        let mut targets = Vec::new();
        for proxy in &proxies {
            targets.push(match proxy.as_str() {
                "relay" => Target::behind(
                    RELAY,
                    start_relay(&topology, pod_ip, RELAY_PORTS, &[]),
                    RELAY_PORTS,
                ),
                "no-splice" => Target::behind(
                    "kp-userspace (no splice)",
                    start_relay(&topology, pod_ip, RELAY_COPY_PORTS, &["no-splice"]),
                    RELAY_COPY_PORTS,
                ),
                "shared" => Target::behind(
                    "kp-userspace (shared runtime)",
                    start_relay(&topology, pod_ip, RELAY_SHARED_PORTS, &["workers=0"]),
                    RELAY_SHARED_PORTS,
                ),
                "haproxy" => Target::behind(
                    HAPROXY,
                    start_haproxy(&topology, pod_ip, idle + 200),
                    HAPROXY_PORTS,
                ),
                "direct" => Target {
                    name: DIRECT,
                    process: None,
                    addrs: [load::SINK_PORT, load::GREET_PORT, load::ECHO_PORT]
                        .map(|port| SocketAddr::new(pod_ip, port)),
                    figures: Figures::default(),
                },
                other => panic!("KP_US_BENCH_PROXIES: unknown proxy {other:?}"),
            });
        }
        // The order rotates from run to run, so a drift of the machine's
        // load during a run favours none.
        let turn = run % targets.len();
        targets.rotate_left(turn);
        measure(&topology, &mut targets, idle, parts);
        for target in targets {
            eprintln!("run {run} {}: {:?}", target.name, target.figures);
            results.entry(target.name).or_default().push(target.figures);
        }
    }
    drop(server);
    print_table(&results, runs, idle, parts);
}

/// The scenarios to run.
#[derive(Debug, Clone, Copy)]
struct Parts {
    idle: bool,
    bulk: bool,
    rate: bool,
    latency: bool,
}

impl Parts {
    fn from_env() -> Self {
        let parts = selected("KP_US_BENCH_PARTS", &["idle", "bulk", "rate", "latency"]);
        for part in &parts {
            assert!(
                ["idle", "bulk", "rate", "latency"].contains(&part.as_str()),
                "KP_US_BENCH_PARTS: unknown part {part:?}"
            );
        }
        let has = |name: &str| parts.iter().any(|part| part == name);
        Self {
            idle: has("idle"),
            bulk: has("bulk"),
            rate: has("rate"),
            latency: has("latency"),
        }
    }
}

/// The comma-separated entries of the environment variable `name`, or
/// `default` when it is unset or empty.
fn selected(name: &str, default: &[&str]) -> Vec<String> {
    let value = std::env::var(name).unwrap_or_default();
    let entries: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect();
    if entries.is_empty() {
        default.iter().map(|entry| (*entry).to_owned()).collect()
    } else {
        entries
    }
}

/// The relay as a process of its own (so its RSS is its own): serves
/// `port=endpoint` pairs until killed; `no-splice` among them turns
/// splicing off, `workers=N` sets the number of worker threads.
fn relay_child(args: &[String]) {
    let splice = !args.iter().any(|arg| arg == "no-splice");
    let workers = args
        .iter()
        .find_map(|arg| arg.strip_prefix("workers="))
        .map(|count| count.parse::<usize>().unwrap());
    let pairs: Vec<&String> = args
        .iter()
        .filter(|arg| *arg != "no-splice" && !arg.starts_with("workers="))
        .collect();
    raise_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut relays = Vec::new();
    for (index, pair) in pairs.iter().enumerate() {
        let (port, endpoint) = pair.split_once('=').unwrap();
        let port: u16 = port.parse().unwrap();
        let endpoint: SocketAddr = endpoint.parse().unwrap();
        let defaults = RelayOptions::default();
        let options = RelayOptions {
            port_range: Some((port, port)),
            splice,
            workers: workers.unwrap_or(defaults.workers),
            ..defaults
        };
        let mut relay = Relay::new(runtime.handle().clone(), IpFamily::V4, options);
        let name = ServicePortName::new(
            NamespacedName::new("bench", format!("s{index}")),
            "",
            Protocol::Tcp,
        );
        let desired = BTreeMap::from([(
            name,
            DesiredListener {
                protocol: Protocol::Tcp,
                route: Route::to_endpoints(&[endpoint]),
            },
        )]);
        let errors = relay.apply(&desired);
        assert!(errors.is_empty(), "{errors:?}");
        relays.push(relay);
    }
    runtime.block_on(std::future::pending::<()>());
}

fn start_servers(topology: &Topology, pod_ip: IpAddr) -> std::thread::JoinHandle<()> {
    let handle = topology.pod("ep1").netns().run(move || {
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(load::serve(pod_ip));
        })
    });
    wait_listening(topology, SocketAddr::new(pod_ip, load::ECHO_PORT), None);
    handle
}

fn start_relay(topology: &Topology, pod_ip: IpAddr, ports: [u16; 3], flags: &[&str]) -> NsChild {
    let exe = std::env::current_exe().unwrap();
    let pairs: Vec<String> = ports
        .iter()
        .zip([load::SINK_PORT, load::GREET_PORT, load::ECHO_PORT])
        .map(|(port, target)| format!("{port}={}", SocketAddr::new(pod_ip, target)))
        .collect();
    let mut args = vec!["relay-child"];
    args.extend(pairs.iter().map(String::as_str));
    args.extend(flags);
    let mut child = topology.node().spawn(exe.to_str().unwrap(), &args);
    wait_listening(
        topology,
        SocketAddr::new(IpAddr::V4(NODE_IP), ports[2]),
        Some(&mut child),
    );
    child
}

/// HAProxy with room for `maxconn` connections (it needs two descriptors
/// per connection and refuses to start when the limit is lower).
fn start_haproxy(topology: &Topology, pod_ip: IpAddr, maxconn: usize) -> NsChild {
    let mut config = format!(
        "global\n  nbthread 2\n  maxconn {maxconn}\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n  maxconn {maxconn}\n\n",
    );
    for (index, (port, target)) in HAPROXY_PORTS
        .iter()
        .zip([load::SINK_PORT, load::GREET_PORT, load::ECHO_PORT])
        .enumerate()
    {
        config.push_str(&format!(
            "listen l{index}\n  bind {NODE_IP}:{port}\n  server s1 {pod_ip}:{target}\n\n"
        ));
    }
    let path = std::env::temp_dir().join(format!("kp-userspace-bench-{}.cfg", std::process::id()));
    std::fs::write(&path, config).unwrap();
    let mut child = topology
        .node()
        .spawn("haproxy", &["-db", "-f", path.to_str().unwrap()]);
    wait_listening(
        topology,
        SocketAddr::new(IpAddr::V4(NODE_IP), HAPROXY_PORTS[2]),
        Some(&mut child),
    );
    child
}

fn wait_listening(topology: &Topology, addr: SocketAddr, process: Option<&mut NsChild>) {
    let ready = topology.client().netns().run(|| {
        kp_testkit::netns::wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        })
    });
    if !ready {
        let sockets = topology.node().exec("ss", &["-ltnp"]);
        let status = process.map(|child| child.try_wait());
        panic!(
            "nothing listens on {addr} (proxy process status: {status:?}); listening in the node namespace:\n{}",
            String::from_utf8_lossy(&sockets.stdout)
        );
    }
}

fn measure(topology: &Topology, targets: &mut [Target], idle_count: usize, parts: Parts) {
    topology.client().netns().block_on(|| async move {
        for target in targets.iter_mut().filter(|_| parts.idle) {
            // Idle memory first, on the fresh process, after a few
            // connections have warmed up what the first ones initialise.
            let Some(pid) = target.process.as_ref().map(|process| process.id()) else {
                continue;
            };
            let echo = target.addrs[2];
            drop(load::open_idle(echo, 100).await);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let before = rss_bytes(pid);
            let idle = load::open_idle(echo, idle_count).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let after = rss_bytes(pid);
            drop(idle);
            target.figures.idle_bytes_per_connection =
                after.saturating_sub(before) as f64 / idle_count as f64;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for target in targets.iter_mut().filter(|_| parts.bulk) {
            let bulk = load::bulk(target.addrs[0], 1, Duration::from_secs(2)).await;
            target.figures.bulk_1_mbps = bulk * 8.0 / 1e6;
        }
        for target in targets.iter_mut().filter(|_| parts.bulk) {
            let cpu_before = target.cpu_seconds();
            let bulk = load::bulk(target.addrs[0], 64, Duration::from_secs(2)).await;
            let cpu = target.cpu_seconds() - cpu_before;
            target.figures.bulk_64_mbps = bulk * 8.0 / 1e6;
            // The run lasts 2 s (a little more while the last writes drain).
            let gib = bulk * 2.0 / f64::from(1u32 << 30);
            target.figures.bulk_64_cpu_ms_per_gib = cpu * 1e3 / gib;
        }
        if parts.rate {
            // The proxies take turns in short slices, so a slow moment of
            // the machine (these are shared virtual CPUs) falls on each
            // alike, not on one proxy's whole measurement.
            let mut totals = vec![(0u64, Duration::ZERO, 0.0); targets.len()];
            for round in 0..RATE_ROUNDS {
                let mut order: Vec<usize> = (0..targets.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for index in order {
                    let target = &targets[index];
                    let cpu_before = target.cpu_seconds();
                    let (done, took) = load::connections(target.addrs[1], 16, RATE_SLICE).await;
                    let total = &mut totals[index];
                    total.0 += done;
                    total.1 += took;
                    total.2 += target.cpu_seconds() - cpu_before;
                }
            }
            for (target, (done, took, cpu)) in targets.iter_mut().zip(totals) {
                target.figures.connections_per_s = done as f64 / took.as_secs_f64();
                target.figures.connection_cpu_us = cpu * 1e6 / done as f64;
            }
            // Let the connection-rate runs' sockets go before measuring latency.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if parts.latency {
            // Every proxy at once, their requests interleaved in time.
            let echoes: Vec<SocketAddr> = targets.iter().map(|target| target.addrs[2]).collect();
            let cpu_before: Vec<f64> = targets.iter().map(Target::cpu_seconds).collect();
            let latencies = load::latency(&echoes, 8, 2000, LATENCY_DURATION).await;
            for ((target, (from_send, from_schedule)), cpu_before) in
                targets.iter_mut().zip(latencies).zip(cpu_before)
            {
                let cpu = target.cpu_seconds() - cpu_before;
                target.figures.request_cpu_us = cpu * 1e6 / from_send.len() as f64;
                target.figures.p50_us = load::quantile(&from_send, 0.50) as f64;
                target.figures.p99_us = load::quantile(&from_send, 0.99) as f64;
                target.figures.p99_scheduled_us = load::quantile(&from_schedule, 0.99) as f64;
            }
        }
    });
}

/// CPU time (user + system) `pid` has used, in seconds: the sum over its
/// threads of the scheduler's run time, in nanoseconds (the tick counts
/// of `/proc/<pid>/stat` are too coarse for the short slices measured).
fn cpu_seconds(pid: u32) -> f64 {
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("schedstat");
        // A thread that has just ended has no file left: its time is lost,
        // but the proxies measured keep their threads.
        let Ok(stat) = std::fs::read_to_string(path) else {
            continue;
        };
        nanos += stat
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    nanos as f64 / 1e9
}

/// Resident memory of `pid` and its threads (VmRSS).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Raises the descriptor limit to [`NOFILE`], or to the hard limit where
/// that is lower and cannot be raised; returns the limit in force.
fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if setrlimit(Resource::RLIMIT_NOFILE, NOFILE, NOFILE).is_ok() {
        return NOFILE;
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    hard
}

/// How many idle connections fit the descriptor limit `nofile` (in whole
/// thousands, at most [`IDLE_CONNECTIONS_WANTED`]).
fn idle_connections(nofile: u64) -> usize {
    let fitting =
        usize::try_from(nofile.saturating_sub(SPARE_DESCRIPTORS) / 2).unwrap_or(usize::MAX);
    IDLE_CONNECTIONS_WANTED.min(fitting / 1000 * 1000)
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn print_table(results: &BTreeMap<&str, Vec<Figures>>, runs: usize, idle: usize, parts: Parts) {
    println!("medians of {runs} runs; idle memory over {idle} connections");
    println!("| proxy | bulk 1 conn (Mbit/s) | bulk 64 conns (Mbit/s) | CPU ms per GiB (64 conns) | connections/s | CPU µs per connection | p50 (µs) | p99 (µs) | p99 from schedule (µs) | CPU µs per request | RSS per idle conn (bytes) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, figures) in results {
        let m = |f: fn(&Figures) -> f64| median(figures.iter().map(f));
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} |",
            m(|f| f.bulk_1_mbps),
            m(|f| f.bulk_64_mbps),
            m(|f| f.bulk_64_cpu_ms_per_gib),
            m(|f| f.connections_per_s),
            m(|f| f.connection_cpu_us),
            m(|f| f.p50_us),
            m(|f| f.p99_us),
            m(|f| f.p99_scheduled_us),
            m(|f| f.request_cpu_us),
            m(|f| f.idle_bytes_per_connection),
        );
    }
    let (Some(relay), Some(haproxy)) = (results.get(RELAY), results.get(HAPROXY)) else {
        return;
    };
    let paired = |f: fn(&Figures) -> f64| {
        let ratios: Vec<f64> = relay
            .iter()
            .zip(haproxy)
            .map(|(ours, theirs)| f(ours) / f(theirs))
            .collect();
        let text: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        (median(ratios.iter().copied()), text.join(" "))
    };
    if parts.rate {
        let (rate, rates) = paired(|f| f.connections_per_s);
        println!("paired ratio {RELAY} ÷ {HAPROXY} of connections/s, median (per run): {rate:.2} ({rates})");
    }
    if parts.latency {
        let (p99, p99s) = paired(|f| f.p99_us);
        let lower = relay
            .iter()
            .zip(haproxy)
            .filter(|(ours, theirs)| ours.p99_us < theirs.p99_us)
            .count();
        println!(
            "paired ratio {RELAY} ÷ {HAPROXY} of the p99, median (per run): {p99:.2} ({p99s}); {RELAY}'s the lower in {lower} of {} runs",
            relay.len()
        );
    }
}
