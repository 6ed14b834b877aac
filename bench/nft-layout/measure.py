#!/usr/bin/env python3
"""Time `nft -f` of the current and the data layout (gen.py) in a network
namespace of its own (kp-lay-m), as root.

  measure.py [--runs R] [--layouts current,data] NxE...    e.g. 10000x2 5000x50

LAYOUT is one of gen.py's (default current,data).
For each size and layout, R times each:
  cold    `nft -f` of the whole table into an empty namespace's table
  noop    `nft -f` of `add table ip kube-proxy` (a commit that changes
          nothing: nft's start, its cache fetch, the batch round trip)
  change  `nft -f` of one Service's one-endpoint change (gen.py change),
          alternating with its inverse (gen.py revert), so each run is a
          real change; every apply is preceded by `nft -c -f` of the same
          file (check mode: nft parses, fetches its cache and sends the
          batch, which the kernel processes and aborts without validating
          the table or committing)
  grow    (all but interval) a new endpoint added, alternating with its
          removal (gen.py grow / shrink): in the data layouts the modulus
          changes, so the Service's chain is rewritten
  flip    (all but interval) the last endpoint turns not ready,
          alternating with its return (gen.py flip / unflip)
  recut   (interval only) the replacement re-cutting every slot range
The ctmark layout's changes name the draw rule's handle, read (untimed,
resolve.py) before each apply.

Every apply (cold and change) runs under `strace --seccomp-bpf -f -T -e
trace=sendmsg`: nft sends its transaction as one batch with sendmsg (its
cache dumps use sendto), and the kernel processes a batch inside that call
(nfnetlink: every message, then the table validation and the commit), so
the sum of the sendmsg durations is the kernel's share ("kernel"); the
seccomp filter stops only those calls, so the wall time ("apply") is hardly
changed.
Prints one line per measure (median, min, max, samples, in ms) and writes
the samples as JSON to results-<NxE>.json in the working directory.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

NS = "kp-lay-m"
HERE = os.path.dirname(os.path.abspath(__file__))


def run(args, what):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{what} failed ({' '.join(args)}): {r.stderr.strip()[:2000]}")
    return r.stdout


def nft_timed(path, check=False):
    path = resolved(path)
    args = ["ip", "netns", "exec", NS, "nft"] + (["-c"] if check else []) + ["-f", path]
    t0 = time.perf_counter()
    run(args, f"nft {'-c ' if check else ''}-f {path}")
    return (time.perf_counter() - t0) * 1000.0


def resolved(path):
    """PATH, or a copy with the ctmark layout's rule handles put in (read
    untimed with resolve.py)."""
    with open(path) as f:
        text = f.read()
    if "@HANDLE@" not in text:
        return path
    import resolve
    path = path + ".resolved"
    with open(path, "w") as f:
        f.write(resolve.resolve(NS, text))
    return path


def nft_traced(path):
    """(wall ms, kernel ms): `nft -f PATH` with its batch sends timed."""
    path = resolved(path)
    with tempfile.NamedTemporaryFile(prefix="kp-lay-strace-", mode="r") as log:
        args = ["strace", "--seccomp-bpf", "-f", "-T", "-e", "trace=sendmsg", "-o", log.name,
                "ip", "netns", "exec", NS, "nft", "-f", path]
        t0 = time.perf_counter()
        run(args, f"nft -f {path}")
        wall = (time.perf_counter() - t0) * 1000.0
        kernel = 0.0
        calls = 0
        for line in log:
            if "sendmsg(" in line and line.rstrip().endswith(">"):
                kernel += float(line.rstrip()[line.rstrip().rindex("<") + 1:-1]) * 1000.0
                calls += 1
        if calls == 0:
            sys.exit(f"no sendmsg call traced for nft -f {path}")
    return wall, kernel


def drop_table():
    subprocess.run(["ip", "netns", "exec", NS, "nft", "delete", "table", "ip", "kube-proxy"],
                   capture_output=True)


def gen(tmp, layout, what, n, e):
    path = os.path.join(tmp, f"{layout}-{what}-{n}x{e}.nft")
    with open(path, "w") as f:
        subprocess.run([sys.executable, os.path.join(HERE, "gen.py"), layout, what, str(n), str(e)],
                       stdout=f, check=True)
    return path


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def measure(layout, n, e, runs, tmp):
    res = {}
    full = gen(tmp, layout, "full", n, e)
    with open(full) as f:
        lines = f.read().count("\n")
    res["full_lines"] = lines
    res["full_bytes"] = os.path.getsize(full)
    noop = os.path.join(tmp, "noop.nft")
    with open(noop, "w") as f:
        f.write("add table ip kube-proxy\n")
    cold, cold_kernel = [], []
    for _ in range(runs):
        drop_table()
        wall, kernel = nft_traced(full)
        cold.append(wall)
        cold_kernel.append(kernel)
    res["cold"] = cold
    res["cold-kernel"] = cold_kernel
    res["noop"] = [nft_timed(noop) for _ in range(runs)]
    pairs = [("change", "revert")]
    pairs += [("recut", "recut-revert")] if layout == "interval" else [("grow", "shrink"), ("flip", "unflip")]
    for fwd, back in pairs:
        f_path, b_path = gen(tmp, layout, fwd, n, e), gen(tmp, layout, back, n, e)
        applies, checks, kernels = [], [], []
        for _ in range(runs):
            for p in (f_path, b_path):
                checks.append(nft_timed(p, check=True))
                wall, kernel = nft_traced(p)
                applies.append(wall)
                kernels.append(kernel)
        res[fwd] = {"apply": applies, "check": checks, "kernel": kernels}
    drop_table()
    return res


def main(argv):
    runs, layouts, sizes = 5, ["current", "data"], []
    k = 1
    while k < len(argv):
        if argv[k] == "--runs":
            runs, k = int(argv[k + 1]), k + 2
        elif argv[k] == "--layouts":
            layouts, k = argv[k + 1].split(","), k + 2
        else:
            n, e = argv[k].split("x")
            sizes.append((int(n), int(e)))
            k += 1
    if not sizes:
        sys.exit(__doc__)
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    run(["ip", "netns", "add", NS], "ip netns add")
    try:
        with tempfile.TemporaryDirectory(prefix="kp-lay-") as tmp:
            for n, e in sizes:
                out = {"load_before": open("/proc/loadavg").read().strip()}
                for layout in layouts:
                    r = measure(layout, n, e, runs, tmp)
                    out[layout] = r
                    print(f"# {layout} {n}x{e}: {r['full_lines']} lines, {r['full_bytes']} bytes", flush=True)
                    for key in ["cold", "cold-kernel", "noop"]:
                        s = summary(r[key])
                        print(f"{layout} {n}x{e} {key:14s} median {s['median']:9.1f} min {s['min']:9.1f} max {s['max']:9.1f} n {s['n']}", flush=True)
                    for key in ["change", "grow", "flip", "recut"]:
                        if key in r:
                            for part in ["apply", "check", "kernel"]:
                                s = summary(r[key][part])
                                print(f"{layout} {n}x{e} {key + '-' + part:14s} median {s['median']:9.1f} min {s['min']:9.1f} max {s['max']:9.1f} n {s['n']}", flush=True)
                out["load_after"] = open("/proc/loadavg").read().strip()
                print(f"# load before {out['load_before']} after {out['load_after']}", flush=True)
                with open(f"results-{n}x{e}.json", "w") as f:
                    json.dump(out, f, indent=1)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


if __name__ == "__main__":
    main(sys.argv)
