#!/usr/bin/env python3
"""Generate nft -f text for the nftables-mode layouts compared in
docs/nft-layout-experiment.md: N Services x E endpoints, one TCP port each.

  gen.py LAYOUT full   N E    the whole table (cold load)
  gen.py LAYOUT KIND   N E    a change to Service 0, KIND one of
      change / revert       endpoint 0 replaced by a new endpoint / back
      grow / shrink         a new endpoint added (E+1) / removed again
      flip / unflip         the last endpoint turns not ready (E-1) /
                            ready again
      recut / recut-revert  (interval only) the replacement re-cutting
                            every slot range / back
  gen.py LAYOUT proof         the small world of proof.sh and connrate.sh
  gen.py LAYOUT remove I IP   in that world, endpoint IP leaves Service I
  gen.py LAYOUT replace I IP NEW   there, NEW takes IP's slots (I's count
                              stays)
  gen.py LAYOUT add I IP      there, IP joins Service I (its count grows)
  gen.py LAYOUT unadd I IP    the inverse of add

LAYOUT:
  current   the shape of `kube-proxy --dry-run --proxy-mode nftables`: a
            service chain with one numgen rule per endpoint, one chain per
            endpoint (hairpin masquerade and DNAT there)
  data      endpoints as elements of one hash map keyed by the Service
            port's number and a slot `numgen random mod E`, valued endpoint
            address . port; the number is a constant written as `numgen
            random mod 1 offset ID` (nft 1.0.6 refuses a constant in a
            concatenation); hairpin by a set of endpoint . endpoint pairs;
            ClientIP affinity in a dynamic map. One map per protocol (only
            TCP here): nft 1.0.6 refuses a rule added in a later transaction
            that maps into a map typed `th dport` ("conflicting protocols
            specified: tcp vs. th"). A replaced endpoint is an
            element change; a change of E also rewrites the Service's
            dnat rule (the modulus)
  sharded   as data, with the slots spread over SHARDS (64, or
            $KP_LAY_SHARDS) maps, Service i in map i % SHARDS: the kernel checks every element added to a
            map against every rule bound to it, and every new binding
            against every element, so one map costs O(elements x rules)
  interval  as data, but one interval map keyed by a global slot `numgen
            random mod 65536 offset ID*65536`, each endpoint owning a range
            of its Service's 65,536 slots, so that every endpoint change
            is element-only (the kernel keeps it in an rbtree)
  ctmark    as sharded, but the draw is its own rule, `ct mark set numgen
            random mod E`, and the dnat rule looks the slot up from the
            conntrack mark (`numgen random mod 1 offset ID . ct mark`): a
            count change replaces only the draw rule (by handle: the change
            files say `handle @HANDLE@`, which measure.py resolves), and a
            rule without a nat, lookup or verdict expression does not make
            the kernel validate the table. The connection keeps the slot as
            its conntrack mark
  bycount   no service number: the slot map is keyed by the Service entry
            and the slot (`ip daddr . tcp dport . numgen random mod E`), and
            the draw is in one shared chain, endpoints-by-count, with one
            rule per endpoint count in use (a count class), each matching
            the entries of set endpoint-count-E; the service chain ends
            with `goto endpoints-by-count`. A count change moves the
            entry between two sets (elements only) as long as the new
            count's class exists; full tables hold the classes E-1, E and
            E+1 (and $KP_LAY_CLASSES, a comma list, for the data path);
            $KP_LAY_GROUP groups the classes (see GROUP below)
With $KP_LAY_NODEPORTS=1 (sharded and bycount), Service i also has NodePort
30000+i: an external-… chain (masquerade, goto the service chain) in
service-nodeports, as upstream. bycount keys a NodePort by its port alone:
its slots in map nodeport-endpoints-tcp (`tcp dport . numgen random mod E`),
its count in set nodeport-count-E (keyed `meta l4proto . th dport`), the class rules in chain
nodeports-by-count, reached from the top of endpoints-by-count by
`ip daddr @nodeport-ips goto nodeports-by-count` (not grouped).
  padded    as sharded, but the modulus is a capacity C (next power of two
            >= 4E, or $KP_LAY_CAP) and the C slots are shared out so that
            each endpoint holds floor(C/E) or ceil(C/E); a count change
            within C moves slots (elements only). The changes keep the C of
            the full table

Addresses: ClusterIPs from 10.96.0.1 up, endpoints from 10.128.0.0 up (the
scale files carry no packets), pod CIDR 10.244.0.0/16 in the masquerade
rule as in the examples. proof/remove use the plan of topo.sh.
"""
import base64
import hashlib
import ipaddress
import os
import sys

TABLE = "ip kube-proxy"
POD_CIDR = "10.244.0.0/16"
LAYOUTS = ("current", "data", "sharded", "interval", "ctmark", "bycount", "padded")
# layouts whose slot maps are sharded by service number
SHARDED = ("sharded", "ctmark", "padded")
# Maps of the sharded layout: Service i's slots live in map i % SHARDS
# (64, or the environment's KP_LAY_SHARDS).
SHARDS = int(os.environ.get("KP_LAY_SHARDS", "64"))
# Slots per Service port in the interval layout: endpoint i of E owns
# [floor(i*M/E), floor((i+1)*M/E)), a share within E/M of 1/E (1.5 %
# relative at E = 1,000); 32 bits hold 65,536 such ranges.
SLOTS = 65536
CHANGED = 0  # the Service whose endpoints the change files edit


def h(name):
    return base64.b32encode(hashlib.sha256(name.encode()).digest())[:8].decode()


def cluster_ip(i):
    return str(ipaddress.IPv4Address("10.96.0.1") + i)


def endpoint_ip(i, j, e):
    return str(ipaddress.IPv4Address("10.128.0.0") + i * e + j)


def new_endpoint_ip(i):
    return str(ipaddress.IPv4Address("10.200.0.0") + i)


def svc_name(i):
    return f"ns{i}/svc{i}/tcp/http"


def service_chain(i):
    return f"service-{h(svc_name(i))}-{svc_name(i)}"


def endpoint_chain(i, ip):
    n = f"{svc_name(i)}__{ip}/8080"
    return f"endpoint-{h(n)}-{n}"


def base(out, layout):
    w = out.append
    data = layout != "current"
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
    if layout == "data":
        w(f'add map {TABLE} service-endpoints-tcp {{ typeof numgen random mod 1 . numgen random mod 2 : ip daddr . tcp dport ; comment "service port number . slot: endpoint address . port" ; }}')
    elif layout in ("sharded", "padded"):
        for k in range(SHARDS):
            w(f'add map {TABLE} service-endpoints-tcp-{k} {{ typeof numgen random mod 1 . numgen random mod 2 : ip daddr . tcp dport ; }}')
    elif layout == "ctmark":
        for k in range(SHARDS):
            w(f'add map {TABLE} service-endpoints-tcp-{k} {{ typeof numgen random mod 1 . ct mark : ip daddr . tcp dport ; }}')
    elif layout == "bycount":
        w(f'add map {TABLE} service-endpoints-tcp {{ typeof ip daddr . tcp dport . numgen random mod 2 : ip daddr . tcp dport ; comment "service entry . slot: endpoint address . port" ; }}')
        if NODEPORTS:
            w(f'add map {TABLE} nodeport-endpoints-tcp {{ typeof tcp dport . numgen random mod 2 : ip daddr . tcp dport ; comment "node port . slot: endpoint address . port" ; }}')
    elif layout == "interval":
        w(f'add map {TABLE} service-endpoints-tcp {{ typeof numgen random mod {SLOTS} : ip daddr . tcp dport ; flags interval ; comment "slot ranges of each service port: endpoint address . port" ; }}')
    if data:
        w(f'add set {TABLE} hairpin-endpoints {{ typeof ip saddr . ip daddr ; comment "endpoint . endpoint: a connection an endpoint makes to itself through a Service" ; }}')
        affinity_maps(out, 10800)
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
        affinity_rules(out, 10800)
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


def affinity_maps(out, timeout_secs):
    """One dynamic map (and its set of Service entries) per affinity timeout."""
    t = timeout_secs
    out.append(f'add map {TABLE} affinity-tcp-{t} {{ typeof ip daddr . tcp dport . ip saddr : ip daddr . tcp dport ; size 1048576 ; flags dynamic,timeout ; timeout {t}s ; comment "ClientIP affinity: service entry . client -> endpoint" ; }}')
    out.append(f"add set {TABLE} affinity-services-{t} {{ typeof ip daddr . meta l4proto . th dport ; }}")


def affinity_rules(out, timeout_secs):
    # Recorded after DNAT (priority dstnat + 1): the chosen endpoint is the
    # packet's destination, the Service entry conntrack's original one.
    # `ct original proto-dst` needs a protocol match before it; nft 1.0.6
    # leaves `meta l4proto tcp` (and `ct original protocol tcp`) out of its
    # listing here and then cannot read the listing back, so the match is
    # written as `tcp dport != 0`, which the listing keeps (always true).
    t = timeout_secs
    for c in ["affinity-prerouting", "affinity-output"]:
        out.append(
            f"add rule {TABLE} {c} ct state new ct status dnat tcp dport != 0 "
            f"ct original ip daddr . meta l4proto . ct original proto-dst @affinity-services-{t} "
            f"update @affinity-tcp-{t} {{ ct original ip daddr . ct original proto-dst . ip saddr timeout {t}s : ip daddr . tcp dport }}")


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


def capacity(e):
    """padded: the modulus of a Service port with E endpoints."""
    cap = os.environ.get("KP_LAY_CAP")
    if cap:
        return int(cap)
    c = 1
    while c < 4 * e:
        c *= 2
    return c


def data_service(out, layout, i, n_eps, cip, affinity=None, port=80, cap=None):
    """A data layout's service chain. n_eps is the endpoint count (the
    modulus of the exact layouts); cap the padded layout's capacity."""
    w = out.append
    sc = service_chain(i)
    w(f"add chain {TABLE} {sc}")
    w(f"flush chain {TABLE} {sc}")
    w(f"add rule {TABLE} {sc} ip daddr {cip} tcp dport {port} ip saddr != {POD_CIDR} jump mark-for-masquerade")
    if NODEPORTS and layout in ("sharded", "bycount"):
        ec = external_chain(i)
        w(f"add chain {TABLE} {ec}")
        w(f"flush chain {TABLE} {ec}")
        w(f"add rule {TABLE} {ec} jump mark-for-masquerade")
        w(f"add rule {TABLE} {ec} goto {sc}")
    if affinity:
        # a client with a live affinity entry keeps its endpoint
        w(f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to ip daddr . th dport . ip saddr map @affinity-tcp-{affinity}")
    if layout in ("data", "sharded"):
        w(f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to numgen random mod 1 offset {i} . numgen random mod {n_eps} map @{slot_map(layout, i)}")
    elif layout == "padded":
        w(f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to numgen random mod 1 offset {i} . numgen random mod {cap} map @{slot_map(layout, i)}")
    elif layout == "ctmark":
        w(f"add rule {TABLE} {sc} {ctmark_draw(n_eps)}")
        w(f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to numgen random mod 1 offset {i} . ct mark map @{slot_map(layout, i)}")
    elif layout == "bycount":
        w(f"add rule {TABLE} {sc} goto endpoints-by-count")
    else:
        w(f"add rule {TABLE} {sc} meta l4proto tcp dnat ip to numgen random mod {SLOTS} offset {i * SLOTS} map @service-endpoints-tcp")


def ctmark_draw(n_eps):
    return f"ct mark set numgen random mod {n_eps}"


# bycount with $KP_LAY_GROUP = G: the count classes are grouped by value
# (counts 1..G, G+1..2G, ...); endpoints-by-count holds one rule per group,
# `ip daddr . tcp dport @endpoint-group-K goto endpoints-by-count-K`, and
# each group's chain its class rules, so that a new connection walks at
# most (groups + G) rules instead of one per class. An entry is also an
# element of its group's set.
GROUP = int(os.environ.get("KP_LAY_GROUP", "0"))
NODEPORTS = os.environ.get("KP_LAY_NODEPORTS") == "1"


def node_port(i):
    return 30000 + i


def external_chain(i):
    return "external-" + service_chain(i)[len("service-"):]


def group_of(c):
    return (c - 1) // GROUP


def count_classes(out, counts):
    """bycount: the shared chain, one rule (and set) per endpoint count."""
    out.append(f"add chain {TABLE} endpoints-by-count")
    out.append(f"flush chain {TABLE} endpoints-by-count")
    if NODEPORTS:
        out.append(f"add chain {TABLE} nodeports-by-count")
        out.append(f"add rule {TABLE} endpoints-by-count ip daddr @nodeport-ips goto nodeports-by-count")
        for c in sorted(counts):
            # keyed by protocol . port as upstream's service-nodeports: a
            # set keyed by a port alone is a kernel bitmap, whose element
            # lookup walks a list (quadratic cold loads)
            out.append(f"add set {TABLE} nodeport-count-{c} {{ typeof meta l4proto . th dport ; }}")
            out.append(f"add rule {TABLE} nodeports-by-count meta l4proto . th dport @nodeport-count-{c} "
                       f"meta l4proto tcp dnat ip to tcp dport . numgen random mod {c} map @nodeport-endpoints-tcp")
    if GROUP:
        for g in sorted({group_of(c) for c in counts}):
            out.append(f"add set {TABLE} endpoint-group-{g} {{ typeof ip daddr . tcp dport ; }}")
            out.append(f"add chain {TABLE} endpoints-by-count-{g}")
            out.append(f"add rule {TABLE} endpoints-by-count ip daddr . tcp dport @endpoint-group-{g} goto endpoints-by-count-{g}")
    for c in sorted(counts):
        chain = f"endpoints-by-count-{group_of(c)}" if GROUP else "endpoints-by-count"
        out.append(f"add set {TABLE} endpoint-count-{c} {{ typeof ip daddr . tcp dport ; }}")
        out.append(f"add rule {TABLE} {chain} ip daddr . tcp dport @endpoint-count-{c} "
                   f"meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod {c} map @service-endpoints-tcp")


def count_elements(out, counts):
    """bycount: each entry in the set of its count (and of its group)."""
    for c in sorted(counts):
        elements(out, f"endpoint-count-{c}", counts[c])
    if GROUP:
        groups = {}
        for c in counts:
            groups.setdefault(group_of(c), []).extend(counts[c])
        for g in sorted(groups):
            elements(out, f"endpoint-group-{g}", groups[g])


def extra_classes():
    return {int(c) for c in os.environ.get("KP_LAY_CLASSES", "").split(",") if c}


def slot_map(layout, i):
    return f"service-endpoints-tcp-{i % SHARDS}" if layout in SHARDED else "service-endpoints-tcp"


def assign(layout, i, cip, ips, base=None):
    """Slot key -> endpoint address of Service i (ClusterIP cip). Exact
    layouts: endpoint j holds slot j. padded: from scratch, slot s goes to
    ips[s % E]; from BASE (an earlier assignment), the fewest slots move: a
    leaving endpoint's slots go to the endpoints holding the fewest, a new
    endpoint takes slots from those holding the most."""
    if layout == "interval":
        return {f"{lo}-{hi}": ip for (lo, hi), ip in zip(slot_ranges(i, len(ips)), ips)}
    if layout == "bycount":
        return {f"{cip} . 80 . {j}": ip for j, ip in enumerate(ips)}
    if layout != "padded":
        return {f"{i} . {j}": ip for j, ip in enumerate(ips)}
    if base is None:
        c = capacity(len(ips))
        return {f"{i} . {s}": ips[s % len(ips)] for s in range(c)}
    c = len(base)
    if len(ips) > c:
        sys.exit(f"padded: {len(ips)} endpoints do not fit capacity {c}")
    slots = {ip: [] for ip in ips}
    free = []
    for s in range(c):
        ip = base[f"{i} . {s}"]
        (slots[ip] if ip in slots else free).append(s)
    while free:  # slots of leaving endpoints to the ones holding the fewest
        poorest = min(ips, key=lambda ip: (len(slots[ip]), ips.index(ip)))
        slots[poorest].append(free.pop())
    lo = c // len(ips)
    for ip in ips:  # new endpoints take from the ones holding the most
        while len(slots[ip]) < lo:
            richest = max(ips, key=lambda x: (len(slots[x]), -ips.index(x)))
            slots[ip].append(slots[richest].pop())
    return {f"{i} . {s}": ip for ip, ss in slots.items() for s in ss}


def data_elements(layout, i, ips, cip):
    return [f"{k} : {ip} . 8080" for k, ip in assign(layout, i, cip, ips).items()]


def chunks(items, size=2000):
    for k in range(0, len(items), size):
        yield items[k:k + size]


def elements(out, name, items):
    for c in chunks(items):
        out.append(f"add element {TABLE} {name} {{ {', '.join(c)} }}")


def full(layout, n, e):
    out = []
    base(out, layout)
    if layout == "bycount":
        count_classes(out, {c for c in (e - 1, e, e + 1) if c >= 1} | extra_classes())
    elems, pairs, counts, np_counts = {}, [], {}, {}
    for i in range(n):
        ips = [endpoint_ip(i, j, e) for j in range(e)]
        if layout == "current":
            current_service(out, i, ips, cluster_ip(i))
        else:
            data_service(out, layout, i, len(ips), cluster_ip(i), cap=capacity(len(ips)))
            elems.setdefault(slot_map(layout, i), []).extend(data_elements(layout, i, ips, cluster_ip(i)))
            if NODEPORTS and layout == "bycount":
                elems.setdefault("nodeport-endpoints-tcp", []).extend(
                    f"{node_port(i)} . {j} : {ip} . 8080" for j, ip in enumerate(ips))
            pairs += [f"{ip} . {ip}" for ip in ips]
            counts.setdefault(len(ips), []).append(f"{cluster_ip(i)} . 80")
            np_counts.setdefault(len(ips), []).append(f"tcp . {node_port(i)}")
    for i in range(n):
        out.append(f"add element {TABLE} cluster-ips {{ {cluster_ip(i)} }}")
        out.append(f"add element {TABLE} service-ips {{ {cluster_ip(i)} . tcp . 80 : goto {service_chain(i)} }}")
        if NODEPORTS and layout in ("sharded", "bycount"):
            out.append(f"add element {TABLE} service-nodeports {{ tcp . {node_port(i)} : goto {external_chain(i)} }}")
    for name in sorted(elems):
        elements(out, name, elems[name])
    if layout == "bycount":
        count_elements(out, counts)
        if NODEPORTS:
            for c in sorted(np_counts):
                elements(out, f"nodeport-count-{c}", np_counts[c])
    elements(out, "hairpin-endpoints", pairs)
    return out


def change(layout, n, e, kind):
    """A change to Service CHANGED; see the module doc for KIND."""
    i = CHANGED
    cip = cluster_ip(i)
    old = [endpoint_ip(i, j, e) for j in range(e)]
    new_ip = new_endpoint_ip(i)
    revert = kind in ("revert", "shrink", "recut-revert", "unflip")
    if kind in ("change", "revert", "recut", "recut-revert"):
        # replacement: the stable slot assignment puts the new endpoint in
        # the removed one's slot; recut re-assigns in list order
        a = old
        b = old[1:] + [new_ip] if kind.startswith("recut") or layout == "current" else [new_ip] + old[1:]
    elif kind in ("flip", "unflip"):  # the last endpoint turns not ready
        a, b = old, old[:-1]
    else:  # grow / shrink
        a, b = old, old + [new_ip]
    before = after = None
    if layout != "current":
        before = assign(layout, i, cip, a)
        if layout == "padded" and kind in ("change", "revert"):
            after = {k: (new_ip if ip == old[0] else ip) for k, ip in before.items()}
        else:
            after = assign(layout, i, cip, b, base=before)
    if revert:
        a, b = b, a
        before, after = after, before
    out = []
    (left,) = set(a) - set(b) or {None}
    (joined,) = set(b) - set(a) or {None}
    if layout == "current":
        # a partial sync: the Service's chains rewritten, a new endpoint's
        # chain added, a removed one's flushed (deleted a second later)
        current_service(out, i, b, cip)
        if left:
            out.append(f"flush chain {TABLE} {endpoint_chain(i, left)}")
        return out
    out += slot_edit(layout, i, cip, a, b, before, after)
    if left:
        out.append(f"delete element {TABLE} hairpin-endpoints {{ {left} . {left} }}")
    if joined:
        out.append(f"add element {TABLE} hairpin-endpoints {{ {joined} . {joined} }}")
    return out


def slot_edit(layout, i, cip, a, b, before, after, affinity=None):
    """The transaction taking Service i from endpoints A (slots BEFORE) to
    B (slots AFTER), hairpin pairs aside."""
    out = []
    gone = [f"{k} : {ip} . 8080" for k, ip in before.items() if after.get(k) != ip]
    come = [f"{k} : {ip} . 8080" for k, ip in after.items() if before.get(k) != ip]
    if len(a) != len(b):
        count_change(out, layout, i, cip, len(a), len(b), affinity=affinity)
    if gone:
        out.append(f"delete element {TABLE} {slot_map(layout, i)} {{ {', '.join(gone)} }}")
    if come:
        out.append(f"add element {TABLE} {slot_map(layout, i)} {{ {', '.join(come)} }}")
    if NODEPORTS and layout == "bycount":
        # the NodePort entry's slots are the ClusterIP entry's, keyed by port
        prefix, np = f"{cip} . 80 . ", f"{node_port(i)} . "
        for verb, items in (("delete", gone), ("add", come)):
            if items:
                out.append(f"{verb} element {TABLE} nodeport-endpoints-tcp {{ {', '.join(x.replace(prefix, np) for x in items)} }}")
    return out


def count_change(out, layout, i, cip, was, now, affinity=None):
    """What a change of the endpoint count from WAS to NOW costs in rules."""
    if layout in ("data", "sharded"):
        # the modulus is the endpoint count: the Service's chain is rewritten
        data_service(out, layout, i, now, cip, affinity=affinity)
    elif layout == "ctmark":
        # only the draw rule: measure.py / resolve.py put in its handle
        out.append(f"replace rule {TABLE} {service_chain(i)} handle @HANDLE@ {ctmark_draw(now)}")
    elif layout == "bycount":
        out.append(f"delete element {TABLE} endpoint-count-{was} {{ {cip} . 80 }}")
        out.append(f"add element {TABLE} endpoint-count-{now} {{ {cip} . 80 }}")
        if NODEPORTS:
            out.append(f"delete element {TABLE} nodeport-count-{was} {{ tcp . {node_port(i)} }}")
            out.append(f"add element {TABLE} nodeport-count-{now} {{ tcp . {node_port(i)} }}")
        if GROUP and group_of(was) != group_of(now):
            out.append(f"delete element {TABLE} endpoint-group-{group_of(was)} {{ {cip} . 80 }}")
            out.append(f"add element {TABLE} endpoint-group-{group_of(now)} {{ {cip} . 80 }}")
    # padded: the capacity stays, the slots move; interval: ranges move


# The address plan of topo.sh: Service index -> (ClusterIP, endpoints).
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
    """The table of proof.sh and connrate.sh. Affinity Services are written
    only in the data layouts (the current layout's per-endpoint affinity
    sets are proven by kp-nftables' tests)."""
    out = []
    base(out, layout)
    if layout != "current":
        affinity_maps(out, 3)
        affinity_rules(out, 3)
    if layout == "bycount":
        count_classes(out, {len(ips) for _, ips in PROOF_SERVICES.values()} | extra_classes())
    elems, pairs, counts, np_counts = {}, set(), {}, {}
    for i, (cip, ips) in PROOF_SERVICES.items():
        if layout == "current":
            if i in AFFINITY:
                continue
            current_service(out, i, ips, cip)
        else:
            data_service(out, layout, i, len(ips), cip, affinity=AFFINITY.get(i), cap=capacity(len(ips)))
            if i in AFFINITY:
                out.append(f"add element {TABLE} affinity-services-{AFFINITY[i]} {{ {cip} . tcp . 80 }}")
            elems.setdefault(slot_map(layout, i), []).extend(data_elements(layout, i, ips, cip))
            if NODEPORTS and layout == "bycount":
                elems.setdefault("nodeport-endpoints-tcp", []).extend(
                    f"{node_port(i)} . {j} : {ip} . 8080" for j, ip in enumerate(ips))
            pairs |= {f"{ip} . {ip}" for ip in ips}
            counts.setdefault(len(ips), []).append(f"{cip} . 80")
            np_counts.setdefault(len(ips), []).append(f"tcp . {node_port(i)}")
        out.append(f"add element {TABLE} cluster-ips {{ {cip} }}")
        out.append(f"add element {TABLE} service-ips {{ {cip} . tcp . 80 : goto {service_chain(i)} }}")
        if NODEPORTS and layout in ("sharded", "bycount"):
            out.append(f"add element {TABLE} service-nodeports {{ tcp . {node_port(i)} : goto {external_chain(i)} }}")
    for name in sorted(elems):
        elements(out, name, elems[name])
    if layout == "bycount":
        count_elements(out, counts)
        if NODEPORTS:
            for c in sorted(np_counts):
                elements(out, f"nodeport-count-{c}", np_counts[c])
    elements(out, "hairpin-endpoints", sorted(pairs))
    return out


def remove(layout, i, ip):
    """Endpoint IP leaves proof Service I (its hairpin pair stays: the
    address is an endpoint of other Services too). interval: its slot range
    goes to the next endpoint, elements only. data: the last endpoint moves
    into its slot and the modulus drops by one, so the chain is rewritten;
    ctmark: only the draw rule is replaced; bycount: the entry moves to the
    set of the new count; padded: its slots go to the others."""
    cip, ips = PROOF_SERVICES[i]
    k = ips.index(ip)
    out = []
    if layout == "interval":
        lo, hi = slot_ranges(i, len(ips))[k]
        nxt = ips[(k + 1) % len(ips)]
        out.append(f"delete element {TABLE} service-endpoints-tcp {{ {lo}-{hi} : {ip} . 8080 }}")
        out.append(f"add element {TABLE} service-endpoints-tcp {{ {lo}-{hi} : {nxt} . 8080 }}")
        return out
    before = assign(layout, i, cip, ips)
    if layout == "padded":
        after = assign(layout, i, cip, ips[:k] + ips[k + 1:], base=before)
    else:  # the last endpoint moves into the leaving one's slot
        rest = ips[:k] + [ips[-1]] + ips[k + 1:-1] if k != len(ips) - 1 else ips[:-1]
        after = assign(layout, i, cip, rest)
    count_change(out, layout, i, cip, len(ips), len(ips) - 1, affinity=AFFINITY.get(i))
    gone = [f"{s} : {v} . 8080" for s, v in before.items() if after.get(s) != v]
    come = [f"{s} : {v} . 8080" for s, v in after.items() if before.get(s) != v]
    out.append(f"delete element {TABLE} {slot_map(layout, i)} {{ {', '.join(gone)} }}")
    if come:
        out.append(f"add element {TABLE} {slot_map(layout, i)} {{ {', '.join(come)} }}")
    return out


def proof_edit(layout, kind, i, ip, new_ip=None):
    """In the proof world: KIND replace (IP's slots to NEW_IP), add (IP
    joins Service I as its last endpoint) or unadd (the inverse of add).
    Hairpin pairs are left alone: the proof's addresses serve several
    Services."""
    cip, ips = PROOF_SERVICES[i]
    before = assign(layout, i, cip, ips)
    if kind == "replace":
        b = [new_ip if x == ip else x for x in ips]
        after = {k: (new_ip if v == ip else v) for k, v in before.items()}
        return slot_edit(layout, i, cip, ips, b, before, after, AFFINITY.get(i))
    b = ips + [ip]
    after = assign(layout, i, cip, b, base=before)
    if kind == "add":
        return slot_edit(layout, i, cip, ips, b, before, after, AFFINITY.get(i))
    return slot_edit(layout, i, cip, b, ips, after, before, AFFINITY.get(i))


def main(argv):
    kinds = ("full", "change", "revert", "grow", "shrink", "flip", "unflip", "recut", "recut-revert")
    if len(argv) >= 3 and argv[1] in LAYOUTS and argv[2] == "proof" and len(argv) == 3:
        lines = proof(argv[1])
    elif len(argv) == 5 and argv[1] in LAYOUTS and argv[1] != "current" and argv[2] == "remove":
        lines = remove(argv[1], int(argv[3]), argv[4])
    elif len(argv) == 6 and argv[1] in LAYOUTS[1:] and argv[1] != "interval" and argv[2] == "replace":
        lines = proof_edit(argv[1], "replace", int(argv[3]), argv[4], argv[5])
    elif len(argv) == 5 and argv[1] in LAYOUTS[1:] and argv[1] != "interval" and argv[2] in ("add", "unadd"):
        lines = proof_edit(argv[1], argv[2], int(argv[3]), argv[4])
    elif len(argv) == 5 and argv[1] in LAYOUTS and argv[2] in kinds:
        layout, what, n, e = argv[1], argv[2], int(argv[3]), int(argv[4])
        if what.startswith("recut") and layout != "interval":
            sys.exit("recut applies to the interval layout only")
        if layout == "interval" and n * SLOTS > 2**32:
            sys.exit(f"{n} Services do not fit the 32-bit slot space at {SLOTS} slots each")
        lines = full(layout, n, e) if what == "full" else change(layout, n, e, what)
    else:
        sys.exit(__doc__)
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv)
