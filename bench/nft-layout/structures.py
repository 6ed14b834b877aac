#!/usr/bin/env python3
"""Which kernel set type can hold the endpoint slots? One table `ip x` with
only the slot map, N Services x E endpoints, in namespace kp-lay-s, as root.

  structures.py KIND N E [RUNS]

KIND:
  pipapo      one interval map keyed `numgen mod 1 offset ID . numgen mod
              65536` (a concatenation with ranges: the kernel's pipapo set)
  hash        one map keyed `numgen mod 1 offset ID . numgen mod E`, exact
              slots (a hash set), as gen.py's data layout
  rbtree      one interval map keyed `numgen mod 65536 offset ID*65536`
              (a single-field interval set: rbtree), as gen.py's interval
  perservice  one interval map per Service (N named sets)

Prints the kernel time (sum of nft's sendmsg durations, see measure.py) of
the cold load, then RUNS (default 1) kernel times of replacing one
endpoint's element of Service 0 and of putting it back (one element
deleted, one added).
"""
import subprocess
import sys
import tempfile

NS = "kp-lay-s"
T = "ip x"
M = 65536


def ip(i, j, e):
    v = (10 << 24) + (128 << 16) + i * e + j
    return f"{v >> 24}.{(v >> 16) & 255}.{(v >> 8) & 255}.{v & 255}"


def ranges(n):
    return [(k * M // n, (k + 1) * M // n - 1) for k in range(n)]


def key(kind, i, j, e):
    lo, hi = ranges(e)[j]
    return {"pipapo": f"{i} . {lo}-{hi}", "hash": f"{i} . {j}",
            "rbtree": f"{i * M + lo}-{i * M + hi}", "perservice": f"{lo}-{hi}"}[kind]


def table(kind, n, e):
    out = [f"add table {T}", f"delete table {T}", f"add table {T}", f"add chain {T} s"]
    typ = {"pipapo": "typeof numgen random mod 1 . numgen random mod 2 : ip daddr . tcp dport ; flags interval",
           "hash": "typeof numgen random mod 1 . numgen random mod 2 : ip daddr . tcp dport",
           "rbtree": "typeof numgen random mod 2 : ip daddr . tcp dport ; flags interval",
           "perservice": "typeof numgen random mod 2 : ip daddr . tcp dport ; flags interval"}[kind]
    if kind == "perservice":
        for i in range(n):
            out.append(f"add map {T} eps{i} {{ {typ} ; }}")
            out.append(f"add element {T} eps{i} {{ {', '.join(f'{key(kind, i, j, e)} : {ip(i, j, e)} . 8080' for j in range(e))} }}")
        return out
    out.append(f"add map {T} eps {{ {typ} ; }}")
    el = [f"{key(kind, i, j, e)} : {ip(i, j, e)} . 8080" for i in range(n) for j in range(e)]
    for k in range(0, len(el), 2000):
        out.append(f"add element {T} eps {{ {', '.join(el[k:k + 2000])} }}")
    return out


def change(kind, e, back):
    m = "eps0" if kind == "perservice" else "eps"
    a, b = ip(0, 0, e), "10.200.0.0"
    if back:
        a, b = b, a
    k = key(kind, 0, 0, e)
    return [f"delete element {T} {m} {{ {k} : {a} . 8080 }}", f"add element {T} {m} {{ {k} : {b} . 8080 }}"]


def kernel_ms(lines):
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as f, \
            tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        f.write("\n".join(lines) + "\n")
        f.flush()
        r = subprocess.run(["strace", "--seccomp-bpf", "-f", "-T", "-e", "trace=sendmsg", "-o", log.name,
                            "ip", "netns", "exec", NS, "nft", "-f", f.name], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"nft -f failed: {r.stderr[:2000]}")
        return sum(float(l.rstrip()[l.rstrip().rindex("<") + 1:-1]) * 1000.0
                   for l in log if "sendmsg(" in l and l.rstrip().endswith(">"))


def main(argv):
    if len(argv) not in (4, 5) or argv[1] not in ("pipapo", "hash", "rbtree", "perservice"):
        sys.exit(__doc__)
    kind, n, e = argv[1], int(argv[2]), int(argv[3])
    runs = int(argv[4]) if len(argv) == 5 else 1
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        print(f"{kind} {n}x{e} cold-kernel {kernel_ms(table(kind, n, e)):.1f} ms", flush=True)
        xs = []
        for _ in range(runs):
            xs += [kernel_ms(change(kind, e, False)), kernel_ms(change(kind, e, True))]
        print(f"{kind} {n}x{e} change-kernel " + " ".join(f"{x:.1f}" for x in xs) + " ms", flush=True)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


if __name__ == "__main__":
    main(sys.argv)
