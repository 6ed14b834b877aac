#!/usr/bin/env python3
"""New-connection cost through the rules the kube-proxy binary itself
programs: a Service with a few endpoints (default 2) against one with many
(default 1,000), in the nftables mode's data layout and, for comparison,
its chains layout.

  bench.py [--background 10000] [--background-endpoints 2] [--small 2]
           [--big 1000] [--counts 1,3,5] [--layouts data,chains]
           [--runs 7] [--packets 20000] [--baseline] [--max-ratio 1.10]
           [--bin target/release/kube-proxy] [--keep-manifests DIR]
  bench.py --manifests-only DIR [the same Service options]

What it does (needs root, `ip`, `nft`, `conntrack`, `curl`, python3):
1. writes a folder of manifests (`kube-proxy --manifests DIR` reads it): a
   Node `node-1`; BACKGROUND ClusterIP Services with BACKGROUND_ENDPOINTS
   endpoints each; the Service `small` (10.96.0.20:80) with SMALL endpoints;
   the Service `big` (10.96.0.21:80) with BIG endpoints (EndpointSlices of
   at most 1,000 endpoints); and one Service per count in COUNTS
   (10.96.250.x), which puts more count classes in the data layout's class
   chain (classes are in order of count, so counts below BIG stand before
   the big Service's class rule);
2. for each layout, in a network namespace `kp-nc-LAYOUT` it creates (with
   a peer namespace `kp-nc-LAYOUT-sink` that drops what it receives), runs
   the binary (`--manifests DIR --proxy-mode nftables --nftables-layout
   LAYOUT --hostname-override node-1 --cluster-cidr 10.244.0.0/16
   --conntrack-max-per-core 0`), waits for its first sync on its metrics
   (`kubeproxy_sync_proxy_rules_last_timestamp_seconds` on 127.0.0.1:10249
   in the namespace), stops it with SIGTERM (its rules stay), and checks
   the rules: SYNs to each Service are DNATed to that Service's endpoints
   only, reaching all of the small Service's and most of the big one's;
3. measures as bench/nft-layout/newconn.sh does: per sample, conntrack
   flushed, then bench/nft-layout/newconn.py sends PACKETS TCP SYNs from new
   source ports to the ClusterIP through a raw socket and reports its CPU
   time (user + system) per packet. Samples alternate layout and Service
   (the Service order reversed every other run); RUNS runs;
4. prints a Markdown table (command, machine, load average before and
   after, medians (min-max) per Service, the ratio of the medians, and the
   range of the per-run ratios), and exits 1 when the data layout's ratio
   of medians is above MAX_RATIO (the goal of issue 26: within 10 %).

The namespaces are removed at exit (also on failure or Ctrl-C), and
leftovers of an interrupted run (the same names) are removed at start.
Nothing outside the namespaces is changed: no rule, route, address or
sysctl of the root namespace (`--conntrack-max-per-core 0` keeps the proxy
from writing `nf_conntrack_max`, which is global).
"""
import argparse
import ipaddress
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
NEWCONN = os.path.join(REPO, "bench", "nft-layout", "newconn.py")

SMALL_IP = "10.96.0.20"
BIG_IP = "10.96.0.21"
# no Service has this address: packets to it cross the same hooks and
# conntrack, and no DNAT (--baseline)
BASE_IP = "10.96.255.254"
PORT = 80
TARGET_PORT = 8080
# newconn.py sends from this address; it is in the cluster CIDR, so the
# Services' masquerade rules do not match (as for a pod's connection)
SOURCE = "10.244.0.1"
GATEWAY = "10.244.0.2"
GATEWAY_MAC = "02:00:00:00:00:02"
# endpoints are numbered from here on, skipping .0 and .255
FIRST_ENDPOINT = ipaddress.IPv4Address("10.244.2.1")
MAX_SLICE = 1000
METRIC = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
NS_PREFIX = "kp-nc-"


class BenchError(Exception):
    """A step failed; the message says which and why."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--background", type=int, default=10000,
                   help="background Services (default 10000)")
    p.add_argument("--background-endpoints", type=int, default=2,
                   help="endpoints of each background Service (default 2)")
    p.add_argument("--small", type=int, default=2,
                   help="endpoints of the Service 10.96.0.20 (default 2)")
    p.add_argument("--big", type=int, default=1000,
                   help="endpoints of the Service 10.96.0.21 (default 1000)")
    p.add_argument("--counts", default="",
                   help="comma list of endpoint counts, one more Service each (default none)")
    p.add_argument("--layouts", default="data,chains",
                   help="comma list of --nftables-layout values (default data,chains)")
    p.add_argument("--runs", type=int, default=7, help="runs (default 7)")
    p.add_argument("--packets", type=int, default=20000,
                   help="SYNs per sample (default 20000)")
    p.add_argument("--baseline", action="store_true",
                   help=f"also sample {BASE_IP}, an address without a Service: the cost every "
                        "packet pays before any Service's rules")
    p.add_argument("--max-ratio", type=float, default=1.10,
                   help="largest data-layout ratio big/small that passes (default 1.10)")
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release", "kube-proxy"),
                   help="the kube-proxy binary (default target/release/kube-proxy)")
    p.add_argument("--sync-timeout", type=float, default=900,
                   help="seconds to wait for the proxy's first sync (default 900)")
    p.add_argument("--keep-manifests", metavar="DIR",
                   help="write the manifests to DIR (kept) instead of a temporary folder")
    p.add_argument("--manifests-only", metavar="DIR",
                   help="only write the manifests to DIR and exit")
    args = p.parse_args(argv)
    try:
        args.count_list = [int(c) for c in args.counts.split(",") if c.strip()]
    except ValueError:
        p.error(f"--counts {args.counts!r}: expected a comma list of integers")
    args.layout_list = [l for l in args.layouts.split(",") if l]
    if not args.layout_list:
        p.error("--layouts is empty: name data, chains or both")
    for name in ("background", "runs", "packets"):
        if getattr(args, name) < 0 or (name != "background" and getattr(args, name) == 0):
            p.error(f"--{name} {getattr(args, name)}: must be positive")
    for name, value in [("background-endpoints", args.background_endpoints),
                        ("small", args.small), ("big", args.big)] + \
            [("counts", c) for c in args.count_list]:
        if value < 1:
            p.error(f"--{name} {value}: a Service needs at least 1 endpoint")
    if len(args.count_list) > 250:
        p.error(f"--counts has {len(args.count_list)} values: at most 250 (10.96.250.1-250)")
    if args.background > 50000:
        p.error(f"--background {args.background}: at most 50000 (10.96.1.1-10.96.200.250)")
    for layout in args.layout_list:
        if layout not in ("data", "chains"):
            p.error(f"--layouts: {layout!r} is not a layout (data or chains)")
    return args


# ---------------------------------------------------------------- manifests

class Addresses:
    """Hands out endpoint addresses, one per endpoint, from FIRST_ENDPOINT,
    skipping addresses ending in .0 or .255."""

    def __init__(self):
        self.next = int(FIRST_ENDPOINT)

    def take(self, n):
        out = []
        while len(out) < n:
            if self.next & 0xFF not in (0, 255):
                out.append(str(ipaddress.IPv4Address(self.next)))
            self.next += 1
        return out


def service_yaml(name, cluster_ip):
    return f"""---
apiVersion: v1
kind: Service
metadata: {{namespace: bench, name: {name}}}
spec:
  type: ClusterIP
  clusterIP: {cluster_ip}
  clusterIPs: [{cluster_ip}]
  ipFamilies: [IPv4]
  ports:
    - {{name: http, port: {PORT}, targetPort: {TARGET_PORT}, protocol: TCP}}
"""


def slices_yaml(name, endpoints):
    out = []
    for k in range(0, len(endpoints), MAX_SLICE):
        lines = [f"""---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{namespace: bench, name: {name}-{k // MAX_SLICE}, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports:
  - {{name: http, port: {TARGET_PORT}, protocol: TCP}}
endpoints:
"""]
        for address in endpoints[k:k + MAX_SLICE]:
            lines.append(f"  - {{addresses: [{address}], conditions: {{ready: true}}, nodeName: node-2}}\n")
        out.append("".join(lines))
    return "".join(out)


NODE_YAML = """apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {kubernetes.io/hostname: node-1}
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24]
status:
  addresses:
    - {type: InternalIP, address: 192.168.99.2}
    - {type: Hostname, address: node-1}
"""


def write_manifests(args, folder):
    """Writes node.yaml, services.yaml and endpointslices.yaml to `folder`;
    returns {ClusterIP: set of endpoint addresses} of the measured
    Services."""
    os.makedirs(folder, exist_ok=True)
    addresses = Addresses()
    services, slices = [], []
    measured = {}

    def add(name, cluster_ip, count):
        endpoints = addresses.take(count)
        services.append(service_yaml(name, cluster_ip))
        slices.append(slices_yaml(name, endpoints))
        return set(endpoints)

    measured[SMALL_IP] = add("small", SMALL_IP, args.small)
    measured[BIG_IP] = add("big", BIG_IP, args.big)
    for k, count in enumerate(args.count_list):
        add(f"count-{k}-{count}", f"10.96.250.{k + 1}", count)
    for i in range(args.background):
        add(f"bg-{i}", f"10.96.{1 + i // 250}.{1 + i % 250}", args.background_endpoints)
    if int(ipaddress.IPv4Address(addresses.next)) > int(ipaddress.IPv4Address("10.255.255.254")):
        raise BenchError(f"the Services need more endpoint addresses than 10.244.2.1-10.255.255.254 hold "
                         f"(reached {ipaddress.IPv4Address(addresses.next)})")
    with open(os.path.join(folder, "node.yaml"), "w") as f:
        f.write(NODE_YAML)
    with open(os.path.join(folder, "services.yaml"), "w") as f:
        f.write("".join(services))
    with open(os.path.join(folder, "endpointslices.yaml"), "w") as f:
        f.write("".join(slices))
    return measured


# ---------------------------------------------------------------- namespaces

def run(cmd, check=True, capture=True, timeout=None):
    r = subprocess.run(cmd, text=True, capture_output=capture, timeout=timeout)
    if check and r.returncode != 0:
        err = (r.stderr or "").strip() if capture else ""
        raise BenchError(f"`{shlex.join(cmd)}` exited {r.returncode}: {err}")
    return r


def nsx(ns, *cmd, **kw):
    return run(["ip", "netns", "exec", ns, *cmd], **kw)


def ns_names(layout):
    return NS_PREFIX + layout, NS_PREFIX + layout + "-sink"


def existing_namespaces():
    out = run(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def remove_namespaces(layouts):
    present = existing_namespaces()
    for layout in layouts:
        for ns in ns_names(layout):
            if ns in present:
                run(["ip", "netns", "del", ns], check=False)


def make_namespace(layout):
    """The node namespace: lo up, and a veth `out0` (10.244.0.1/32) whose
    peer sits in a namespace without addresses or rules, which drops the
    packets (this kernel has no dummy interface). One gateway with a
    permanent neighbour entry, so nothing waits for ARP; 10.0.0.0/8
    (ClusterIPs and endpoints) is routed through it."""
    ns, sink = ns_names(layout)
    run(["ip", "netns", "add", ns])
    run(["ip", "netns", "add", sink])
    nsx(ns, "ip", "link", "set", "lo", "up")
    run(["ip", "link", "add", "out0", "netns", ns, "type", "veth", "peer", "name", "in0", "netns", sink])
    nsx(sink, "ip", "link", "set", "in0", "up")
    nsx(ns, "ip", "addr", "add", f"{SOURCE}/32", "dev", "out0")
    nsx(ns, "ip", "link", "set", "out0", "up")
    nsx(ns, "ip", "neigh", "add", GATEWAY, "lladdr", GATEWAY_MAC, "dev", "out0", "nud", "permanent")
    nsx(ns, "ip", "route", "add", "10.0.0.0/8", "via", GATEWAY, "dev", "out0", "onlink")
    return ns


# ---------------------------------------------------------------- the proxy

def sync_timestamp(ns):
    r = nsx(ns, "curl", "-s", "--max-time", "2", "http://127.0.0.1:10249/metrics", check=False)
    if r.returncode != 0:
        return None
    for line in r.stdout.splitlines():
        if line.startswith(METRIC):
            try:
                return float(line.split()[-1])
            except ValueError:
                return None
    return None


def program(args, layout, manifests, logdir):
    """Runs the proxy in the layout's namespace until its first sync, then
    stops it; returns the seconds from start to the first sync."""
    ns = make_namespace(layout)
    log_path = os.path.join(logdir, f"kube-proxy-{layout}.log")
    cmd = [args.bin, "--manifests", manifests, "--proxy-mode", "nftables",
           "--nftables-layout", layout, "--hostname-override", "node-1",
           "--cluster-cidr", "10.244.0.0/16", "--conntrack-max-per-core", "0"]
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            stamp = sync_timestamp(ns)
            if stamp is not None and stamp > 0:
                break
            if proc.poll() is not None:
                raise BenchError(f"kube-proxy ({layout} layout) exited {proc.returncode} before its "
                                 f"first sync; last lines of {log_path}:\n{tail(log_path)}")
            if time.monotonic() - start > args.sync_timeout:
                raise BenchError(f"kube-proxy ({layout} layout) did not report a sync within "
                                 f"{args.sync_timeout:.0f} s; last lines of {log_path}:\n{tail(log_path)}")
            time.sleep(0.5)
        synced = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    tables = nsx(ns, "nft", "list", "tables").stdout
    if "table ip kube-proxy" not in tables:
        raise BenchError(f"after kube-proxy ({layout} layout) stopped, namespace {ns} holds no table "
                         f"ip kube-proxy (tables: {tables.strip() or 'none'})")
    # every Service of the manifests has its service chain (both layouts),
    # so the first sync held the whole background
    chains = nsx(ns, "nft", "list", "chains", "ip").stdout
    services = len(re.findall(r"^\s*chain service-[A-Z0-9]{8}-", chains, re.M))
    expected = args.background + 2 + len(args.count_list)
    if services != expected:
        raise BenchError(f"after the first sync of kube-proxy ({layout} layout), table ip kube-proxy "
                         f"holds {services} service chains, expected {expected}")
    return synced


def tail(path, n=15):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def class_positions(ns, ips_counts):
    """For the data layout: the number of class rules, and for each count
    in `ips_counts` how many rules a new connection to an entry of that
    count walks to its class rule (1-based). With grouped classes
    (`endpoints-by-count-tcp` goes to `endpoints-by-count-tcp-9-16`, …)
    the walk is the group rules up to the entry's group and the class
    rules up to its own in the group chain; without, the class rules up to
    its own."""
    text = nsx(ns, "nft", "list", "table", "ip", "kube-proxy").stdout
    chains, chain = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*chain (\S+) \{", line)
        if m:
            chain = chains.setdefault(m.group(1), [])
        elif line.strip() == "}":
            chain = None
        elif chain is not None and line.strip():
            chain.append(line.strip())
    top = [r for r in chains.get("endpoints-by-count-tcp", []) if "@endpoint-" in r]
    total = sum(1 for rules in chains.values() for r in rules if "@endpoint-count-" in r)
    positions = {}
    for count in ips_counts:
        for i, rule in enumerate(top):
            if re.search(rf"@endpoint-count-{count}\b", rule):
                positions[count] = i + 1
                break
            m = re.search(r"@endpoint-group-\S+ goto (\S+)", rule)
            if not m:
                continue
            inner = [r for r in chains.get(m.group(1), []) if "@endpoint-count-" in r]
            found = [j for j, r in enumerate(inner) if re.search(rf"@endpoint-count-{count}\b", r)]
            if found:
                positions[count] = i + 1 + found[0] + 1
                break
    return total, positions


# ---------------------------------------------------------------- measuring

def flush_conntrack(ns):
    # conntrack -F exits 1 on an empty table on some versions
    nsx(ns, "conntrack", "-F", check=False)


def sample(ns, ip, packets):
    flush_conntrack(ns)
    out = nsx(ns, sys.executable, NEWCONN, ip, str(packets)).stdout
    return float(out.strip())


def check_draws(ns, layout, ip, endpoints, packets=3000):
    """Sends `packets` SYNs to `ip` and reads conntrack: every connection
    must be DNATed to one of `endpoints` on TARGET_PORT, and the draws must
    reach all endpoints of a Service of at most 8, and for a larger one at
    least 90 % of the share that `packets` uniform draws reach on average.
    Returns the number of endpoints reached."""
    flush_conntrack(ns)
    nsx(ns, sys.executable, NEWCONN, ip, str(packets))
    text = nsx(ns, "conntrack", "-L", "-p", "tcp", "--orig-dst", ip).stdout
    reached, entries = set(), 0
    for line in text.splitlines():
        m = re.search(r"\[UNREPLIED\] src=(\S+) dst=\S+ sport=(\d+)", line) or \
            re.search(r"dport=\d+ src=(\S+) dst=\S+ sport=(\d+)", line)
        if not m:
            continue
        entries += 1
        address, port = m.group(1), int(m.group(2))
        if address not in endpoints or port != TARGET_PORT:
            raise BenchError(f"{layout} layout: a SYN to {ip}:{PORT} went to {address}:{port}, "
                             f"not to one of the Service's endpoints on port {TARGET_PORT}")
        reached.add(address)
    if entries < packets * 0.99:
        raise BenchError(f"{layout} layout: {packets} SYNs to {ip}:{PORT} left {entries} conntrack "
                         f"entries DNATed to the Service's endpoints (expected {packets})")
    n = len(endpoints)
    expected = n if n <= 8 else n * (1 - (1 - 1 / n) ** packets)
    if len(reached) < (n if n <= 8 else 0.9 * expected):
        raise BenchError(f"{layout} layout: {packets} SYNs to {ip}:{PORT} reached {len(reached)} of "
                         f"its {n} endpoints (expected about {expected:.0f})")
    return len(reached)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fmt(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main(argv):
    args = parse_args(argv)
    if args.manifests_only:
        write_manifests(args, args.manifests_only)
        print(f"manifests written to {args.manifests_only}")
        return 0
    if os.geteuid() != 0:
        raise BenchError("needs root: it creates network namespaces and loads nftables rules in them")
    for tool in ("ip", "nft", "conntrack", "curl"):
        if run(["sh", "-c", f"command -v {tool}"], check=False).returncode != 0:
            raise BenchError(f"needs `{tool}` (Debian: apt-get install iproute2 nftables conntrack curl)")
    if not os.access(args.bin, os.X_OK):
        raise BenchError(f"{args.bin}: no such executable; build it with "
                         f"`cargo build --release -p kube-proxy`, or name one with --bin")

    command = "bench/newconn/bench.py " + shlex.join(argv) if argv else "bench/newconn/bench.py"
    tmp = tempfile.mkdtemp(prefix="kp-newconn.")
    manifests = args.keep_manifests or os.path.join(tmp, "manifests")
    remove_namespaces(args.layout_list)
    try:
        measured = write_manifests(args, manifests)
        setup = {}
        for layout in args.layout_list:
            print(f"# programming the {layout} layout ...", file=sys.stderr, flush=True)
            synced = program(args, layout, manifests, tmp)
            ns = ns_names(layout)[0]
            reached = {ip: check_draws(ns, layout, ip, measured[ip]) for ip in (SMALL_IP, BIG_IP)}
            info = {"synced": synced, "reached": reached}
            if layout == "data":
                info["classes"] = class_positions(ns, (args.small, args.big))
            setup[layout] = info
            print(f"# {layout}: first sync after {synced:.1f} s; draws reached "
                  f"{reached[SMALL_IP]} of {args.small} and {reached[BIG_IP]} of {args.big} endpoints",
                  file=sys.stderr, flush=True)

        load_before = loadavg()
        targets = (SMALL_IP, BIG_IP) + ((BASE_IP,) if args.baseline else ())
        samples = {(l, ip): [] for l in args.layout_list for ip in targets}
        for r in range(args.runs):
            for layout in args.layout_list:
                order = targets if r % 2 == 0 else targets[::-1]
                for ip in order:
                    value = sample(ns_names(layout)[0], ip, args.packets)
                    samples[(layout, ip)].append(value)
                    print(f"# run {r + 1} {layout} {ip} {value:.2f} us/packet", file=sys.stderr, flush=True)
        load_after = loadavg()
    except BaseException:
        print(f"bench.py: the proxy's logs and the manifests are kept in {tmp}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp)
    finally:
        remove_namespaces(args.layout_list)

    print(f"Command: `{command}`\n")
    print(f"Machine: {os.cpu_count()} CPUs (nproc), kernel {platform.release()}, "
          f"load average {load_before} before, {load_after} after.\n")
    print(f"Services: {args.background} × {args.background_endpoints} endpoints in the background, "
          f"small {SMALL_IP} with {args.small}, big {BIG_IP} with {args.big}"
          + (f", and one Service per count {args.counts}" if args.count_list else "") + ".")
    if "data" in setup:
        total, pos = setup["data"]["classes"]
        print(f"Data layout: {total} address class rules; a new connection to the small Service "
              f"walks {pos.get(args.small, '?')} rules of the class (and group) chains to its class "
              f"rule, to the big one {pos.get(args.big, '?')}.")
    print(f"Per sample: conntrack flushed, {args.packets} SYNs from new source ports; {args.runs} runs; "
          f"µs of CPU per new connection, median (min–max).\n")
    print(f"| layout | {args.small} endpoints | {args.big} endpoints | ratio of medians | "
          f"per-run ratios | within {100 * (args.max_ratio - 1):.0f} % |")
    print("|---|---|---|---|---|---|")
    failed = False
    for layout in args.layout_list:
        small, big = samples[(layout, SMALL_IP)], samples[(layout, BIG_IP)]
        ratio = statistics.median(big) / statistics.median(small)
        per_run = [b / s for s, b in zip(small, big)]
        ok = ratio <= args.max_ratio
        if layout == "data" and not ok:
            failed = True
        print(f"| {layout} | {fmt(small)} | {fmt(big)} | {ratio:.3f} | "
              f"{min(per_run):.2f}–{max(per_run):.2f} | {'yes' if ok else 'no'} |")
    if args.baseline:
        print(f"\nAn address without a Service ({BASE_IP}): " + ", ".join(
            f"{layout} {fmt(samples[(layout, BASE_IP)])}" for layout in args.layout_list) + ".")
    if failed:
        print(f"\nFAIL: the data layout's ratio is above {args.max_ratio:.2f}.")
        return 1
    return 0


def on_sigterm(signum, frame):
    # run the `finally` that removes the namespaces
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        print(f"bench.py: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
