#!/usr/bin/env python3
"""Generate nft -f text for the nftables-mode layouts compared in
docs/nft-layout-experiment.md: N Services x E endpoints, one TCP port each.

  gen.py LAYOUT full     N E   the whole table (cold load)
  gen.py LAYOUT change   N E   one Service's endpoint 0 replaced by a new one
  gen.py LAYOUT revert   N E   the inverse of change (runs alternate the two)
  gen.py data   recut    N E   the same change re-cutting every slot range
  gen.py data   recut-revert N E  its inverse
  gen.py LAYOUT proof        the small world of bench/nft-layout/proof.sh
  gen.py data move I FROM TO in that world, Service I's slot range of
                             endpoint FROM goes to endpoint TO
  gen.py LAYOUT cleanup  N E   (current only) delete the endpoint chain that
                               `change` unlinked, as the proxy does a second later

LAYOUT is `current` (the shape of `kube-proxy --dry-run --proxy-mode
nftables`: a service chain with one numgen rule per endpoint and one chain
per endpoint) or `data` (endpoints as elements of one interval map keyed by
a numgen slot; hairpin by a set of endpoint . endpoint pairs).

Addresses: ClusterIPs from 10.96.0.1 up, endpoints from 10.128.0.0 up (the
scale files carry no packets; bench/nft-layout/proof.sh uses its own plan),
pod CIDR 10.244.0.0/16 in the masquerade rule as in the examples.
"""
import base64
import hashlib
import ipaddress
import sys

TABLE = "ip kube-proxy"
POD_CIDR = "10.244.0.0/16"
# Slots per Service port in the data layout. Endpoint i of E owns the slots
# [floor(i*M/E), floor((i+1)*M/E)); with M = 65536 an endpoint's share is
# within 1/65536*E of 1/E (1.5 % relative at E = 1,000), and the 32-bit slot
# space holds 65,536 slot ranges (one per Service port, two with eTP Local).
SLOTS = 65536
CHANGED = 0  # index of the Service whose endpoints `change` edits


def h(name):
    return base64.b32encode(hashlib.sha256(name.encode()).digest())[:8].decode()


def cluster_ip(i):
    return str(ipaddress.IPv4Address("10.96.0.1") + i)


def endpoint_ip(i, j, e):
    return str(ipaddress.IPv4Address("10.128.0.0") + i * e + j)


def new_endpoint_ip(i):
    # addresses above every generated endpoint (10.200.0.0 up)
    return str(ipaddress.IPv4Address("10.200.0.0") + i)


def svc_name(i):
    return f"ns{i}/svc{i}/tcp/http"


def service_chain(i):
    return f"service-{h(svc_name(i))}-{svc_name(i)}"


def endpoint_chain(i, ip):
    n = f"{svc_name(i)}__{ip}/8080"
    return f"endpoint-{h(n)}-{n}"


def base(out, data):
    w = out.append
    w(f"add table {TABLE}")
    w(f"delete table {TABLE}")
    w(f'add table {TABLE} {{ comment "rules for kube-proxy" ; }}')
    w(f'add set {TABLE} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}')
    w(f"add set {TABLE} nodeport-ips {{ type ipv4_addr ; }}")
    w(f"add element {TABLE} nodeport-ips {{ 192.168.99.2 }}")
    for m, t in [
        ("firewall-ips", "ipv4_addr . inet_proto . inet_service : verdict"),
        ("no-endpoint-nodeports", "inet_proto . inet_service : verdict"),
        ("no-endpoint-services", "ipv4_addr . inet_proto . inet_service : verdict"),
        ("service-ips", "ipv4_addr . inet_proto . inet_service : verdict"),
        ("service-nodeports", "inet_proto . inet_service : verdict"),
    ]:
        w(f"add map {TABLE} {m} {{ type {t} ; }}")
    if data:
        w(f'add map {TABLE} service-endpoints {{ typeof numgen random mod {SLOTS} : ip daddr . th dport ; flags interval ; comment "slot ranges of each service port: endpoint address . port" ; }}')
        w(f'add set {TABLE} hairpin-endpoints {{ typeof ip saddr . ip daddr ; comment "endpoint . endpoint: a connection an endpoint makes to itself through a Service" ; }}')
        w(f'add map {TABLE} affinity-10800 {{ typeof ip daddr . th dport . ip saddr : ip daddr . th dport ; flags dynamic,timeout ; timeout 3h ; comment "ClientIP affinity: service entry . client -> endpoint" ; }}')
        w(f"add set {TABLE} affinity-services-10800 {{ typeof ip daddr . meta l4proto . th dport ; }}")
    hooks = [
        ("filter-prerouting-pre-dnat", "type filter hook prerouting priority -110"),
        ("filter-output-pre-dnat", "type filter hook output priority -110"),
        ("filter-forward", "type filter hook forward priority 0"),
        ("filter-input", "type filter hook input priority 0"),
        ("filter-output", "type filter hook output priority 0"),
        ("nat-output", "type nat hook output priority -100"),
        ("nat-postrouting", "type nat hook postrouting priority 100"),
        ("nat-prerouting", "type nat hook prerouting priority -100"),
    ]
    if data:
        hooks += [
            ("affinity-prerouting", "type filter hook prerouting priority -99"),
            ("affinity-output", "type filter hook output priority -99"),
        ]
    for c, spec in hooks:
        w(f"add chain {TABLE} {c} {{ {spec} ; }}")
    for c in ["cluster-ips-check", "firewall-check", "mark-for-masquerade", "masquerading",
              "nodeport-endpoints-check", "reject-chain", "services", "service-endpoints-check"]:
        w(f"add chain {TABLE} {c}")
    for r in [
        "filter-prerouting-pre-dnat ct state new jump firewall-check",
        "filter-forward ct state new jump service-endpoints-check",
        "filter-forward ct state new jump cluster-ips-check",
        "filter-input ct state new jump nodeport-endpoints-check",
        "filter-input ct state new jump service-endpoints-check",
        "filter-output ct state new jump service-endpoints-check",
        "filter-output-pre-dnat ct state new jump firewall-check",
        "filter-output ct state new jump cluster-ips-check",
        "nat-output jump services",
        "nat-postrouting jump masquerading",
        "nat-prerouting jump services",
        'cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
        "firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips",
        "mark-for-masquerade mark set mark or 0x00004000",
    ]:
        w(f"add rule {TABLE} {r}")
    if data:
        # Hairpin: after DNAT the packet's source and destination are one
        # endpoint; nft cannot compare two packet fields, so the pairs are data.
        w(f"add rule {TABLE} masquerading ip saddr . ip daddr @hairpin-endpoints jump mark-for-masquerade")
        # Affinity is recorded after DNAT (priority dstnat + 1), where the
        # chosen endpoint is the packet's destination and the Service entry
        # is conntrack's original destination.
        for c in ["affinity-prerouting", "affinity-output"]:
            w(f"add rule {TABLE} {c} ct state new ct status dnat meta l4proto {{ tcp, udp, sctp }} "
              f"ct original ip daddr . meta l4proto . ct original proto-dst @affinity-services-10800 "
              f"update @affinity-10800 {{ ct original ip daddr . ct original proto-dst . ip saddr timeout 3h : ip daddr . th dport }}")
    for r in [
        "masquerading mark and 0x00004000 == 0 return",
        "masquerading mark set mark xor 0x00004000",
        "masquerading masquerade fully-random",
        "reject-chain reject",
        "services ip daddr . meta l4proto . th dport vmap @service-ips",
        "service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
        "nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
        "services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
    ]:
        w(f"add rule {TABLE} {r}")


def current_service(out, i, ips, cip, port=80):
    w = out.append
    sc = service_chain(i)
    w(f"add chain {TABLE} {sc}")
    w(f"flush chain {TABLE} {sc}")
    for ip in ips:
        ec = endpoint_chain(i, ip)
        w(f"add chain {TABLE} {ec}")
        w(f"flush chain {TABLE} {ec}")
    w(f"add rule {TABLE} {sc} ip daddr {cip} tcp dport {port} ip saddr != {POD_CIDR} jump mark-for-masquerade")
    n = len(ips)
    for k, ip in enumerate(ips):
        ec = endpoint_chain(i, ip)
        if k < n - 1:
            w(f"add rule {TABLE} {sc} numgen random mod {n - k} 0 goto {ec}")
        else:
            w(f"add rule {TABLE} {sc} goto {ec}")
    for ip in ips:
        ec = endpoint_chain(i, ip)
        w(f"add rule {TABLE} {ec} ip saddr {ip} jump mark-for-masquerade")
        w(f"add rule {TABLE} {ec} meta l4proto tcp dnat to {ip}:8080")


def slot_ranges(i, n):
    b = i * SLOTS
    return [(b + k * SLOTS // n, b + (k + 1) * SLOTS // n - 1) for k in range(n)]


def data_service(out, i, cip, port=80):
    w = out.append
    sc = service_chain(i)
    w(f"add chain {TABLE} {sc}")
    w(f"flush chain {TABLE} {sc}")
    w(f"add rule {TABLE} {sc} ip daddr {cip} tcp dport {port} ip saddr != {POD_CIDR} jump mark-for-masquerade")
    w(f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to numgen random mod {SLOTS} offset {i * SLOTS} map @service-endpoints")


def data_elements(i, ips):
    return [f"{lo}-{hi} : {ip} . 8080" for (lo, hi), ip in zip(slot_ranges(i, len(ips)), ips)]


def chunks(items, size=2000):
    for k in range(0, len(items), size):
        yield items[k:k + size]


def full(layout, n, e):
    out = []
    base(out, layout == "data")
    elems, pairs = [], []
    for i in range(n):
        ips = [endpoint_ip(i, j, e) for j in range(e)]
        if layout == "current":
            current_service(out, i, ips, cluster_ip(i))
        else:
            data_service(out, i, cluster_ip(i))
            elems += data_elements(i, ips)
            pairs += [f"{ip} . {ip}" for ip in ips]
    for i in range(n):
        out.append(f"add element {TABLE} cluster-ips {{ {cluster_ip(i)} }}")
        out.append(f"add element {TABLE} service-ips {{ {cluster_ip(i)} . tcp . 80 : goto {service_chain(i)} }}")
    for c in chunks(elems):
        out.append(f"add element {TABLE} service-endpoints {{ {', '.join(c)} }}")
    for c in chunks(pairs):
        out.append(f"add element {TABLE} hairpin-endpoints {{ {', '.join(c)} }}")
    return out


def change(layout, n, e, recut=False, revert=False):
    """Service CHANGED loses endpoint 0 and gains a new endpoint; with
    `revert`, the inverse (so that runs can alternate on one table)."""
    i = CHANGED
    old = [endpoint_ip(i, j, e) for j in range(e)]
    new = old[1:] + [new_endpoint_ip(i)]
    if revert:
        old, new = new, old
    out = []
    if layout == "current":
        # what a partial sync sends: the Service's chains rewritten, the new
        # endpoint chain added, the removed one flushed (deleted later)
        current_service(out, i, new, cluster_ip(i))
        gone = (set(old) - set(new)).pop()
        out.append(f"flush chain {TABLE} {endpoint_chain(i, gone)}")
        return out
    # elements only. A stable allocator gives the removed endpoint's range
    # to the new one (one element out, one in); `recut` re-cuts the whole
    # Service in list order (every range whose endpoint moved), the worst
    # case.
    a = [endpoint_ip(i, j, e) for j in range(e)]
    b = [new_endpoint_ip(i)] + a[1:] if not recut else a[1:] + [new_endpoint_ip(i)]
    if revert:
        a, b = b, a
    before = dict(zip(slot_ranges(i, e), a))
    after = dict(zip(slot_ranges(i, e), b))
    gone = [f"{lo}-{hi} : {ip} . 8080" for (lo, hi), ip in before.items() if after[(lo, hi)] != ip]
    come = [f"{lo}-{hi} : {ip} . 8080" for (lo, hi), ip in after.items() if before[(lo, hi)] != ip]
    out.append(f"delete element {TABLE} service-endpoints {{ {', '.join(gone)} }}")
    out.append(f"add element {TABLE} service-endpoints {{ {', '.join(come)} }}")
    (left,) = set(a) - set(b)
    (joined,) = set(b) - set(a)
    out.append(f"delete element {TABLE} hairpin-endpoints {{ {left} . {left} }}")
    out.append(f"add element {TABLE} hairpin-endpoints {{ {joined} . {joined} }}")
    return out


def cleanup(n, e):
    return [f"delete chain {TABLE} {endpoint_chain(CHANGED, endpoint_ip(CHANGED, 0, e))}"]


# The address plan of proof.sh: Service index -> (ClusterIP, endpoints).
PROOF_SERVICES = {
    0: ("10.96.0.10", ["10.244.1.2", "10.244.1.3"]),
    1: ("10.96.0.11", ["10.244.1.2", "10.244.1.3", "10.244.1.4"]),
    2: ("10.96.0.12", ["10.244.1.2", "10.244.1.3", "10.244.1.4"]),  # ClientIP affinity 3h
    3: ("10.96.0.13", ["10.244.1.2", "10.244.1.3", "10.244.1.4"]),  # ClientIP affinity 3s
    4: ("10.96.0.20", [f"10.244.10.{k}" for k in range(2)]),
    5: ("10.96.0.21", [str(ipaddress.IPv4Address("10.244.10.0") + k) for k in range(1000)]),
}
AFFINITY = {2: 10800, 3: 3}


def proof(layout):
    """The table of proof.sh: the same base, the Services of PROOF_SERVICES.
    Affinity Services are written only in the data layout (the current
    layout's per-endpoint affinity sets are proven by the crate's tests)."""
    out = []
    base(out, layout == "data")
    if layout == "data":
        out.append(f"add map {TABLE} affinity-3 {{ typeof ip daddr . th dport . ip saddr : ip daddr . th dport ; flags dynamic,timeout ; timeout 3s ; }}")
        out.append(f"add set {TABLE} affinity-services-3 {{ typeof ip daddr . meta l4proto . th dport ; }}")
        for c in ["affinity-prerouting", "affinity-output"]:
            out.append(f"add rule {TABLE} {c} ct state new ct status dnat meta l4proto {{ tcp, udp, sctp }} "
                       f"ct original ip daddr . meta l4proto . ct original proto-dst @affinity-services-3 "
                       f"update @affinity-3 {{ ct original ip daddr . ct original proto-dst . ip saddr timeout 3s : ip daddr . th dport }}")
    elems, pairs = [], set()
    for i, (cip, ips) in PROOF_SERVICES.items():
        if layout == "current":
            if i in AFFINITY:
                continue
            current_service(out, i, ips, cip)
        else:
            sc = service_chain(i)
            data_service(out, i, cip)
            if i in AFFINITY:
                t = AFFINITY[i]
                # before the draw: a client with a live affinity entry keeps its endpoint
                out.insert(len(out) - 1, f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to ip daddr . th dport . ip saddr map @affinity-{t}")
                out.append(f"add element {TABLE} affinity-services-{t} {{ {cip} . tcp . 80 }}")
            elems += data_elements(i, ips)
            pairs |= {f"{ip} . {ip}" for ip in ips}
        out.append(f"add element {TABLE} cluster-ips {{ {cip} }}")
        out.append(f"add element {TABLE} service-ips {{ {cip} . tcp . 80 : goto {service_chain(i)} }}")
    for c in chunks(elems):
        out.append(f"add element {TABLE} service-endpoints {{ {', '.join(c)} }}")
    for c in chunks(sorted(pairs)):
        out.append(f"add element {TABLE} hairpin-endpoints {{ {', '.join(c)} }}")
    return out


def move(i, frm, to):
    """Element-only transaction of proof.sh: in proof Service i, the slot
    range of endpoint FRM goes to endpoint TO (FRM leaves the Service)."""
    ips = PROOF_SERVICES[i][1]
    (lo, hi) = slot_ranges(i, len(ips))[ips.index(frm)]
    return [f"delete element {TABLE} service-endpoints {{ {lo}-{hi} : {frm} . 8080 }}",
            f"add element {TABLE} service-endpoints {{ {lo}-{hi} : {to} . 8080 }}"]


def main(argv):
    if len(argv) == 3 and argv[1] in ("current", "data") and argv[2] == "proof":
        sys.stdout.write("\n".join(proof(argv[1])) + "\n")
        return
    if len(argv) == 6 and argv[1] == "data" and argv[2] == "move":
        sys.stdout.write("\n".join(move(int(argv[3]), argv[4], argv[5])) + "\n")
        return
    whats = ("full", "change", "revert", "recut", "recut-revert", "cleanup")
    if len(argv) != 5 or argv[1] not in ("current", "data") or argv[2] not in whats:
        sys.exit(__doc__)
    layout, what, n, e = argv[1], argv[2], int(argv[3]), int(argv[4])
    if n * SLOTS > 2**32:
        sys.exit(f"{n} Services do not fit the 32-bit slot space at {SLOTS} slots each")
    lines = {
        "full": lambda: full(layout, n, e),
        "change": lambda: change(layout, n, e),
        "revert": lambda: change(layout, n, e, revert=True),
        "recut": lambda: change(layout, n, e, recut=True),
        "recut-revert": lambda: change(layout, n, e, recut=True, revert=True),
        "cleanup": lambda: cleanup(n, e),
    }[what]()
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv)
