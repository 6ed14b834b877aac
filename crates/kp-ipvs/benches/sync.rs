//! Full sync and one-endpoint-change sync of the IPVS backend at 1k and
//! 10k Services × 2 endpoints, with the netlink requests each sends.
//!
//! On a kernel with IPVS (the VM: `scripts/ipvs-vm/run --bench`) the real
//! netlink kernel is programmed inside a fresh network namespace per run;
//! elsewhere the fake kernel stands in, and the output says so.
//!
//!   cargo bench -p kp-ipvs --bench sync [-- SIZES…]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::{Duration, Instant};

use kp_iptables::{Applier, ApplyError, JumpRule, SavedTable, Table};
use kp_ipvs::kernel::{FakeKernel, IpvsKernel};
use kp_ipvs::netlink::NetlinkKernel;
use kp_ipvs::testing::{service, Ports, RequestParts};
use kp_ipvs::{IpvsBackend, IpvsOptions};
use kp_model::IpFamily;
use kp_sync::Backend;
use kp_testkit::netns::Netns;

const RUNS: usize = 5;
/// One Service in this many moves before the last full sync.
const CHURN_DIVISOR: usize = 100;

/// iptables is not part of this measurement (its restore is measured by
/// kp-iptables' benchmarks).
struct NoIptables;

impl Applier for NoIptables {
    fn restore(&mut self, _: IpFamily, _: &str) -> Result<(), ApplyError> {
        Ok(())
    }
    fn save_table(&mut self, _: IpFamily, _: Table) -> Result<SavedTable, ApplyError> {
        Ok(SavedTable::default())
    }
    fn chain_exists(&mut self, _: IpFamily, _: Table, _: &str) -> Result<bool, ApplyError> {
        Ok(true)
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

/// `services` Services with two remote endpoints each; with `extra`, the
/// first gets a third; the last `moved` have another ClusterIP and other
/// endpoints (as if deleted and created again).
fn parts(services: usize, extra: bool, moved: usize) -> RequestParts {
    let mut ports = Ports::new();
    for index in 0..services {
        let (hi, lo) = (index / 250, index % 250 + 1);
        let (net, ep) = if index >= services - moved {
            (97, 248)
        } else {
            (96, 245)
        };
        let mut svc = service(
            "bench",
            &format!("svc{index}"),
            &format!("10.{net}.{hi}.{lo}"),
            80,
        )
        .endpoint(&format!("10.{ep}.{hi}.{lo}"), 8080, false)
        .endpoint(&format!("10.246.{hi}.{lo}"), 8080, false);
        if extra && index == 0 {
            svc = svc.endpoint("10.247.0.1", 8080, false);
        }
        ports = ports.with(svc);
    }
    RequestParts::new(ports.build(), "192.168.99.2")
}

struct Sample {
    first_full: Duration,
    first_full_messages: u64,
    resync_full: Duration,
    resync_full_messages: u64,
    churn_full: Duration,
    churn_full_messages: u64,
    one_endpoint: Duration,
    one_endpoint_messages: u64,
}

fn measure(size: usize, real: bool) -> Sample {
    let (base, changed) = (parts(size, false, 0), parts(size, true, 0));
    let churned = parts(size, true, size / CHURN_DIVISOR);
    let kernel: Box<dyn IpvsKernel> = if real {
        Box::new(NetlinkKernel::new())
    } else {
        Box::new(FakeKernel::new())
    };
    let mut backend = IpvsBackend::new(
        IpFamily::V4,
        IpvsOptions::default(),
        kernel,
        Box::new(NoIptables),
    )
    .with_sysctl(Box::new(kp_node::MemorySysctl::new()))
    .with_local_addresses(Box::new(|| Ok(vec!["192.168.99.2".parse().unwrap()])));
    let mut step = |parts: &RequestParts, full: bool| {
        let before = backend.kernel_messages();
        let start = Instant::now();
        backend.sync(&parts.request(full)).unwrap();
        (start.elapsed(), backend.kernel_messages() - before)
    };
    let (first_full, first_full_messages) = step(&base, true);
    let (resync_full, resync_full_messages) = step(&base, true);
    let (one_endpoint, one_endpoint_messages) = step(&changed, false);
    let (churn_full, churn_full_messages) = step(&churned, true);
    Sample {
        first_full,
        first_full_messages,
        resync_full,
        resync_full_messages,
        churn_full,
        churn_full_messages,
        one_endpoint,
        one_endpoint_messages,
    }
}

/// One first full sync of `size` Services, applied subsystem by subsystem
/// (IPVS, then ipset, then addresses), to show where the time goes.
fn phases(size: usize) {
    use kp_ipvs::diff::Op;
    let base = parts(size, false, 0);
    let node = ["192.168.99.2".parse().unwrap()];
    let rules = kp_ipvs::rules::RuleOptions {
        masquerade_mark: "0x00004000".into(),
        masquerade_all: false,
        not_local: None,
        random_fully: true,
    };
    let input = kp_ipvs::PlanInput {
        family: IpFamily::V4,
        scheduler: "rr",
        node_addresses: &node,
        node_port_addresses: &node,
        rules: &rules,
    };
    let start = Instant::now();
    let planned = kp_ipvs::plan(&input, &base.ports);
    let plan_time = start.elapsed();
    let mut kernel = NetlinkKernel::new();
    let start = Instant::now();
    let current = kernel.list(IpFamily::V4).unwrap();
    let list_time = start.elapsed();
    let ops = kp_ipvs::diff(&planned.state, &current);
    let (link, rest): (Vec<Op>, Vec<Op>) = ops
        .into_iter()
        .partition(|op| matches!(op, Op::CreateLink | Op::AddAddress(_)));
    let (sets, ipvs): (Vec<Op>, Vec<Op>) = rest
        .into_iter()
        .partition(|op| matches!(op, Op::CreateSet(_) | Op::AddEntry(..)));
    println!(
        "phases of one first full sync of {size} Services: plan {:.3} s, listing {:.3} s",
        plan_time.as_secs_f64(),
        list_time.as_secs_f64()
    );
    for (name, group) in [
        ("IPVS", ipvs),
        ("ipset", sets),
        ("kube-ipvs0 addresses", link),
    ] {
        let start = Instant::now();
        kernel.apply(IpFamily::V4, &group).unwrap();
        println!(
            "  {name}: {} requests in {:.3} s",
            group.len(),
            start.elapsed().as_secs_f64()
        );
    }
    list_phases(size);
}

/// What a full sync's listing of a full kernel costs, part by part.
fn list_phases(size: usize) {
    use kp_ipvs::netlink::{ipset::IpsetNetlink, ipvs::IpvsNetlink, link::DummyLink, table};
    use kp_ipvs::SetKind;
    let timed = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    };
    let mut ipvs = IpvsNetlink::new();
    let mut link = DummyLink::default();
    let mut ipset = IpsetNetlink::default();
    let services = timed(&mut || drop(ipvs.list_services(Some(IpFamily::V4)).unwrap()));
    let reals = timed(&mut || drop(table::read().unwrap()));
    let addresses = timed(&mut || {
        let index = link.index().unwrap().unwrap();
        drop(link.addresses(index, IpFamily::V4).unwrap());
    });
    let sets = timed(&mut || {
        for kind in SetKind::ALL {
            drop(ipset.list(kind.name(IpFamily::V4), IpFamily::V4).unwrap());
        }
    });
    let whole = timed(&mut || drop(NetlinkKernel::new().list(IpFamily::V4).unwrap()));
    println!(
        "listing the full kernel of {size} Services: {whole:.3} s (virtual servers {services:.3} s, \
         real servers from the IPVS table {reals:.3} s, kube-ipvs0 addresses {addresses:.3} s, \
         sets {sets:.3} s)"
    );
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 10_000]
    } else {
        sizes
    };
    let real = Path::new("/proc/net/ip_vs").exists();
    println!(
        "kernel: {} ({} runs per size, medians)",
        if real {
            "real IPVS over netlink, one fresh network namespace per run"
        } else {
            "fake (no IPVS on this kernel)"
        },
        RUNS
    );
    println!("| services × 2 endpoints | first full sync | messages | full resync, nothing changed | messages | one-endpoint change | messages | full sync, 1 % of Services moved | messages |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &size in &sizes {
        let samples: Vec<Sample> = (0..RUNS)
            .map(|_| {
                if real {
                    let netns = Netns::create("bench").unwrap();
                    netns.run(|| measure(size, true))
                } else {
                    measure(size, false)
                }
            })
            .collect();
        let pick = |f: fn(&Sample) -> Duration| median(samples.iter().map(f).collect());
        let last = &samples[samples.len() - 1];
        println!(
            "| {size} | {:.3} s | {} | {:.3} s | {} | {:.2} ms | {} | {:.3} s | {} |",
            pick(|s| s.first_full).as_secs_f64(),
            last.first_full_messages,
            pick(|s| s.resync_full).as_secs_f64(),
            last.resync_full_messages,
            pick(|s| s.one_endpoint).as_secs_f64() * 1e3,
            last.one_endpoint_messages,
            pick(|s| s.churn_full).as_secs_f64(),
            last.churn_full_messages,
        );
    }
    if let (true, Some(&size)) = (real, sizes.iter().max()) {
        let netns = Netns::create("bench").unwrap();
        netns.run(|| phases(size));
    }
}
