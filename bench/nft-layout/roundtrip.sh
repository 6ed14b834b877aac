#!/bin/bash
# Round trip of the data layout through this machine's nft: load gen.py's
# table, `nft list table`, delete the table, load the listing with
# `nft -f`, list again and compare. Run as root, in namespace kp-lay-r.
#   roundtrip.sh proof [LAYOUT]   the proof world (gen.py LAYOUT proof,
#                                 default data) after traffic filled the
#                                 affinity maps (uses topo.sh's namespaces)
#   roundtrip.sh LAYOUT N E       gen.py LAYOUT full N E
# Exit status 0 when both listings are equal (affinity timers aside).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
T="ip kube-proxy"
OUT=$(mktemp -d /tmp/kp-lay-rt.XXXXXX)

roundtrip() { # ns
    ip netns exec "$1" nft list table $T > "$OUT/list1.nft"
    ip netns exec "$1" nft delete table $T
    if ! ip netns exec "$1" nft -f "$OUT/list1.nft" 2> "$OUT/err"; then
        echo "FAIL: nft -f of the listing: $(head -c 2000 "$OUT/err")"; return 1
    fi
    ip netns exec "$1" nft list table $T > "$OUT/list2.nft"
    # remaining lifetimes of dynamic elements differ between the listings
    sed -E 's/ expires [0-9hms]+//' "$OUT/list1.nft" > "$OUT/a"
    sed -E 's/ expires [0-9hms]+//' "$OUT/list2.nft" > "$OUT/b"
    if diff -u "$OUT/a" "$OUT/b" > "$OUT/diff"; then
        echo "PASS: listing of $(wc -l < "$OUT/list1.nft") lines loads again and lists the same"
    else
        echo "FAIL: listings differ:"; head -40 "$OUT/diff"; return 1
    fi
}

if [ "${1:-}" = proof ]; then
    source "$HERE/topo.sh"
    trap 'topo_down; rm -rf "$OUT"' EXIT
    topo_up
    python3 "$HERE/gen.py" "${2:-data}" proof | ip netns exec kp-lay-n nft -f -
    ip netns exec kp-lay-c python3 "$HERE/client.py" count 10.96.0.12 80 5 > /dev/null
    grep -q 'expires' <<<"$(ip netns exec kp-lay-n nft list map $T affinity-tcp-10800)" || { echo "FAIL: no affinity element to carry over"; exit 1; }
    roundtrip kp-lay-n
    grep -E 'typeof|dnat|update|hairpin' "$OUT/list2.nft" | sort -u | head -20
else
    trap 'ip netns del kp-lay-r 2>/dev/null || true; rm -rf "$OUT"' EXIT
    ip netns del kp-lay-r 2>/dev/null || true
    ip netns add kp-lay-r
    python3 "$HERE/gen.py" "$1" full "$2" "$3" | ip netns exec kp-lay-r nft -f -
    roundtrip kp-lay-r
fi
