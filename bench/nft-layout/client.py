#!/usr/bin/env python3
"""Client for proof.sh.

  client.py count ADDR PORT N   N connections, one line per answer key
                                ("NAME count"), failures as "FAIL count"
  client.py rate ADDR PORT N    N sequential connections (connect, read the
                                answer, close); prints connections per second
"""
import collections
import socket
import sys
import time


def one(addr, port):
    with socket.create_connection((addr, port), timeout=1.0) as s:
        data = b""
        while True:
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
    return data.decode().split()[0]


def main():
    what, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if what == "count":
        counts = collections.Counter()
        for _ in range(n):
            try:
                counts[one(addr, port)] += 1
            except OSError:
                counts["FAIL"] += 1
        for k, v in sorted(counts.items()):
            print(k, v)
    elif what == "rate":
        fails = 0
        t0 = time.perf_counter()
        for _ in range(n):
            try:
                one(addr, port)
            except OSError:
                fails += 1
        dt = time.perf_counter() - t0
        print(f"{n / dt:.1f} {fails}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
