#!/usr/bin/env python3
"""Put rule handles into a change file of gen.py's ctmark layout.

  resolve.py NS FILE    prints FILE with each `replace rule TABLE CHAIN
                        handle @HANDLE@ ...` given the handle of CHAIN's
                        draw rule (`ct mark set numgen ...`), read with
                        `nft -a list chain` in network namespace NS

The handle changes with every replacement, so it is read right before each
apply (measure.py calls resolve() untimed).
"""
import subprocess
import sys


def draw_handle(ns, table, chain):
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-a", "list", "chain", *table.split(), chain],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nft -a list chain {table} {chain} in {ns} failed: {r.stderr.strip()}")
    for line in r.stdout.splitlines():
        if "ct mark set numgen" in line and "# handle " in line:
            return line.rsplit("# handle ", 1)[1].strip()
    sys.exit(f"chain {chain} of {table} in {ns} has no draw rule (ct mark set numgen ...)")


def resolve(ns, text):
    out = []
    for line in text.splitlines():
        if "@HANDLE@" in line:
            words = line.split()
            # replace rule ip kube-proxy CHAIN handle @HANDLE@ ...
            table, chain = " ".join(words[2:4]), words[4]
            line = line.replace("@HANDLE@", draw_handle(ns, table, chain))
        out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        sys.stdout.write(resolve(sys.argv[1], f.read()))
