#!/usr/bin/env python3
"""What does the kernel validate on commit, and how much does it cost?
Kernel time (measure.py's strace sendmsg method) of small transactions
against a loaded table, in namespace kp-lay-m, as root.

  scope.py [--runs R] scale N...     gen.py sharded full N 2 for each N,
                                     then R x (grow, shrink) of Service 0:
                                     validation time against table size
  scope.py [--runs R] [--layout L] kinds N E
                                     gen.py L (default sharded) full N E,
                                     then R x each probe below (forward,
                                     then its undo)

  scope.py [--runs R] tables T N     N Services x 2 spread over T tables
                                     (gen.py sharded full N/T 2, its table
                                     renamed ip kube-proxy-0 ... -T-1; the
                                     tables' addresses overlap, no packets),
                                     then R x (grow, shrink) in table 0

Probes (chain `scope-scratch` and table `ip kp-lay-small` are added for
them; the scratch chain is referenced by no rule):
  grow            Service 0 gains an endpoint and loses it again (gen.py
                  grow / shrink; sharded: its dnat rule rewritten)
  scratch-counter a rule `counter` (no expression with a validate
                  operation) added to the scratch chain / chain flushed
  scratch-dnat    a `dnat` rule added to the unreferenced scratch chain /
                  chain flushed
  scratch-lookup  a set lookup `ip daddr @cluster-ips counter` there / flushed
  scratch-ctmark  `ct mark set numgen random mod 3` there / flushed
  vmap-goto       an element `... : goto <Service 0's chain>` added to
                  service-ips / deleted
  set-element     an element added to cluster-ips / deleted
  other-table     in a second, small table (one nat base chain, one
                  service chain), its dnat rule rewritten / back
Prints one line per probe and direction: median, min, max, n (ms); the
load average before and after.
"""
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (nft_traced, run, drop_table, gen, NS)

T = "ip kube-proxy"
SMALL = "ip kp-lay-small"


def write(tmp, name, lines):
    path = os.path.join(tmp, name + ".nft")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def stats(xs):
    return f"median {statistics.median(xs):8.2f} min {min(xs):8.2f} max {max(xs):8.2f} n {len(xs)}"


def load(path):
    measure.drop_table()
    subprocess.run(["ip", "netns", "exec", measure.NS, "nft", "delete", "table", "ip", "kp-lay-small"],
                   capture_output=True)
    return measure.nft_traced(path)[1]


def pair(tmp, fwd, back, runs):
    a, b = [], []
    for _ in range(runs):
        a.append(measure.nft_traced(fwd)[1])
        b.append(measure.nft_traced(back)[1])
    return a, b


def service0_chain(tmp, layout, n, e):
    with open(measure.gen(tmp, layout, "full", n, e)) as f:
        for line in f:
            if line.startswith(f"add chain {T} service-"):
                return line.split()[-1]
    sys.exit("gen.py full wrote no service chain")


def probes(tmp, layout, n, e):
    sc = service0_chain(tmp, layout, n, e)
    scratch = f"{T} scope-scratch"
    p = {
        "grow": (measure.gen(tmp, layout, "grow", n, e), measure.gen(tmp, layout, "shrink", n, e)),
    }
    undo = write(tmp, "scratch-flush", [f"flush chain {scratch}"])
    for kind, rule in [("scratch-counter", "counter"),
                       ("scratch-dnat", "meta l4proto tcp dnat ip to 10.244.1.2:8080"),
                       ("scratch-lookup", "ip daddr @cluster-ips counter"),
                       ("scratch-ctmark", "ct mark set numgen random mod 3")]:
        p[kind] = (write(tmp, kind, [f"flush chain {scratch}", f"add rule {scratch} {rule}"]), undo)
    el = f"10.95.0.1 . tcp . 80 : goto {sc}"
    p["vmap-goto"] = (write(tmp, "vmap-add", [f"add element {T} service-ips {{ {el} }}"]),
                      write(tmp, "vmap-del", [f"delete element {T} service-ips {{ {el} }}"]))
    p["set-element"] = (write(tmp, "set-add", [f"add element {T} cluster-ips {{ 10.95.0.1 }}"]),
                        write(tmp, "set-del", [f"delete element {T} cluster-ips {{ 10.95.0.1 }}"]))

    def small(mod):
        return [f"flush chain {SMALL} svc",
                f"add rule {SMALL} svc meta l4proto tcp dnat ip to numgen random mod {mod} map {{ 0 : 10.244.1.2 . 8080, 1 : 10.244.1.3 . 8080, 2 : 10.244.1.4 . 8080 }}"]
    p["other-table"] = (write(tmp, "small-grow", small(3)), write(tmp, "small-shrink", small(2)))
    return p


def extra(tmp):
    """The scratch chain and the small table, added after the full load."""
    return write(tmp, "extra", [
        f"add chain {T} scope-scratch",
        f"add table {SMALL}",
        f"add chain {SMALL} nat-prerouting {{ type nat hook prerouting priority -100 ; }}",
        f"add chain {SMALL} svc",
        f"add rule {SMALL} nat-prerouting ip daddr 10.97.0.1 tcp dport 80 goto svc",
        f"add rule {SMALL} svc meta l4proto tcp dnat ip to numgen random mod 2 map {{ 0 : 10.244.1.2 . 8080, 1 : 10.244.1.3 . 8080 }}",
    ])


def main(argv):
    runs, layout = 5, "sharded"
    args = argv[1:]
    while args[:1] in (["--runs"], ["--layout"]):
        if args[0] == "--runs":
            runs = int(args[1])
        else:
            layout = args[1]
        args = args[2:]
    if len(args) < 2 or args[0] not in ("scale", "kinds", "tables"):
        sys.exit(__doc__)
    subprocess.run(["ip", "netns", "del", measure.NS], capture_output=True)
    measure.run(["ip", "netns", "add", measure.NS], "ip netns add")
    print(f"# load before {open('/proc/loadavg').read().strip()}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="kp-lay-scope-") as tmp:
            if args[0] == "scale":
                for n in map(int, args[1:]):
                    cold = load(measure.gen(tmp, "sharded", "full", n, 2))
                    g = measure.gen(tmp, "sharded", "grow", n, 2)
                    s = measure.gen(tmp, "sharded", "shrink", n, 2)
                    a, b = pair(tmp, g, s, runs)
                    print(f"scale sharded {n}x2 cold-kernel {cold:8.1f} grow-kernel {stats(a)}", flush=True)
                    print(f"scale sharded {n}x2 cold-kernel {cold:8.1f} shrink-kernel {stats(b)}", flush=True)
            elif args[0] == "tables":
                t, n = int(args[1]), int(args[2])
                per = n // t
                paths = {}
                for what in ("full", "grow", "shrink"):
                    with open(measure.gen(tmp, "sharded", what, per, 2)) as f:
                        paths[what] = f.read()
                cold = 0.0
                for k in range(t):
                    cold += measure.nft_traced(write(tmp, f"full-{k}", [paths["full"].replace(T, f"{T}-{k}")]))[1]
                g = write(tmp, "grow-0", [paths["grow"].replace(T, f"{T}-0")])
                sh = write(tmp, "shrink-0", [paths["shrink"].replace(T, f"{T}-0")])
                a, b = pair(tmp, g, sh, runs)
                print(f"tables {t} x sharded {per}x2 cold-kernel (sum) {cold:8.1f}", flush=True)
                print(f"tables {t} x sharded {per}x2 grow-kernel   {stats(a)}", flush=True)
                print(f"tables {t} x sharded {per}x2 shrink-kernel {stats(b)}", flush=True)
            else:
                n, e = int(args[1]), int(args[2])
                cold = load(measure.gen(tmp, layout, "full", n, e))
                measure.nft_traced(extra(tmp))
                print(f"# {layout} {n}x{e} cold-kernel {cold:.1f}", flush=True)
                for kind, (fwd, back) in probes(tmp, layout, n, e).items():
                    a, b = pair(tmp, fwd, back, runs)
                    print(f"kinds {layout} {n}x{e} {kind:16s} forward {stats(a)}", flush=True)
                    print(f"kinds {layout} {n}x{e} {kind:16s} undo    {stats(b)}", flush=True)
    finally:
        subprocess.run(["ip", "netns", "del", measure.NS], capture_output=True)
    print(f"# load after {open('/proc/loadavg').read().strip()}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
