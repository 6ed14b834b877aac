#!/usr/bin/env python3
"""CPU cost of a new connection's first packet through the rules, without
servers or a wire: run inside a namespace that holds the rules (newconn.sh).

  newconn.py DST N     sends N TCP SYNs to DST:80 from 10.244.0.1 through
                       a raw socket, each from a new source port (so each is
                       a new conntrack entry and walks the nat chains), and
                       prints the process's CPU time (user + system) per
                       packet in microseconds.

Locally generated packets traverse the output hooks inside sendto, in this
process's context, so its CPU time holds the whole kernel path (conntrack,
the nat and filter chains, routing) and does not count time spent waiting
for a CPU: the measure holds on a loaded machine. The packets leave by a
veth into a namespace that drops them.
"""
import resource
import socket
import struct
import sys

SRC = "10.244.0.1"


def syn(src, dst, sport, dport):
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0x4000, 64, socket.IPPROTO_TCP, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    # the checksum is left 0: conntrack verifies it only in prerouting
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 64240, 0, 0)
    return bytearray(ip + tcp)


def main():
    dst, n = sys.argv[1], int(sys.argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    pkt = syn(SRC, dst, 1024, 80)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for k in range(n):
        struct.pack_into("!H", pkt, 20, 1024 + k % 64000)
        s.sendto(pkt, (dst, 0))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{cpu / n * 1e6:.2f}")


if __name__ == "__main__":
    main()
