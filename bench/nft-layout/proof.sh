#!/bin/bash
# Prove that a data layout (gen.py LAYOUT proof, LAYOUT data, sharded,
# ctmark, bycount or padded, default data) carries packets as the
# current layout does: spread over 2 and 3 endpoints, ClientIP affinity from
# a client and from the node itself, affinity expiry, hairpin masquerade, an
# endpoint added and taken away again, an endpoint replaced by an
# element-only transaction, an endpoint removed, and
# what affinity does when its endpoint leaves. Run as root; everything happens in namespaces
# kp-lay-* that it creates and removes.
# Exit status: 0 when every check passed, 1 otherwise.
source "$(dirname "$0")/topo.sh"
trap topo_down EXIT
FAILED=0
T="ip kube-proxy"
LAYOUT=${1:-data}
case $LAYOUT in
    data | sharded | ctmark | bycount | padded) ;;
    *) echo "proof.sh: LAYOUT is data, sharded, ctmark, bycount or padded, not $LAYOUT"; exit 1 ;;
esac

check() { # name status detail
    if [ "$2" = 0 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; FAILED=1; fi
}
count() { # ns addr n [port] -> "e1 150 e2 150 "
    nsx "$1" python3 "$HERE/client.py" count "$2" "${4:-80}" "$3" | tr '\n' ' '
}
# With KP_LAY_NODEPORTS=1 (sharded, bycount) Service 0 also has NodePort
# 30000 on the node's address 192.168.99.2, checked after each change to
# Service 0.
nodeport() { # check-name lo hi endpoints... : 300 connections to the NodePort
    [ "${KP_LAY_NODEPORTS:-}" = 1 ] || return 0
    local name=$1 lo=$2 hi=$3 ok=0 e
    shift 3
    c=$(count kp-lay-c 192.168.99.2 300 30000)
    [ "$(get "$c" FAIL)" = 0 ] || ok=1
    for e in "$@"; do within "$(get "$c" "$e")" "$lo" "$hi" || ok=1; done
    check "$name" $ok "$c"
}
get() { # "counts" key -> number (0 when absent)
    local words=($1) k
    for ((k = 0; k + 1 < ${#words[@]}; k += 2)); do
        if [ "${words[k]}" = "$2" ]; then echo "${words[k + 1]}"; return; fi
    done
    echo 0
}
within() { # value lo hi
    [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]
}
backends() { # "counts" -> number of distinct answers
    local words=($1)
    echo $((${#words[@]} / 2))
}

edit() { # gen.py arguments after LAYOUT: apply that change in the node
    python3 "$HERE/gen.py" "$LAYOUT" "$@" > /tmp/kp-lay-edit.nft || return 1
    # the ctmark layout's draw rule is replaced by its handle
    python3 "$HERE/resolve.py" kp-lay-n /tmp/kp-lay-edit.nft > /tmp/kp-lay-edit2.nft || return 1
    nsx kp-lay-n nft -f /tmp/kp-lay-edit2.nft
}

topo_up
python3 "$HERE/gen.py" "$LAYOUT" proof > /tmp/kp-lay-proof.nft
nsx kp-lay-n nft -f /tmp/kp-lay-proof.nft
# from here a failed check is reported and the script goes on; a failed
# step (loading a transaction) ends it
set +e

# 1. spread: 300 connections over 2 endpoints (mean 150, sd 8.7) and over 3
#    (mean 100, sd 8.2); the bounds are about 4.5 standard deviations.
c=$(count kp-lay-c 10.96.0.10 300)
within "$(get "$c" e1)" 110 190 && within "$(get "$c" e2)" 110 190 && [ "$(get "$c" FAIL)" = 0 ]
check spread-2 $? "$c"
nodeport nodeport-spread-2 110 190 e1 e2
c=$(count kp-lay-c 10.96.0.11 300)
within "$(get "$c" e1)" 60 140 && within "$(get "$c" e2)" 60 140 && within "$(get "$c" e3)" 60 140 && [ "$(get "$c" FAIL)" = 0 ]
check spread-3 $? "$c"

# 2. affinity (3h map): every connection of one client reaches one endpoint,
#    from outside (prerouting) and from the node itself (output).
for ns in kp-lay-c kp-lay-n; do
    c=$(count $ns 10.96.0.12 60)
    [ "$(backends "$c")" = 1 ] && [ "$(get "$c" FAIL)" = 0 ]
    check "affinity-$ns" $? "$c"
done
m=$(nsx kp-lay-n nft list map $T affinity-tcp-10800)
grep -q '10.96.0.12 . 80 . 192.168.99.10 expires' <<<"$m"
check affinity-element $? "$(grep -o '10.96.0.12 . 80 . [0-9.]* [^,}]*' <<<"$m" | tr '\n' ';')"

# 3. affinity expiry (3 s map): the element exists, and is gone after 4 s.
c=$(count kp-lay-c 10.96.0.13 20)
[ "$(backends "$c")" = 1 ] && [ "$(get "$c" FAIL)" = 0 ]
check affinity-3s-sticks $? "$c"
grep -q '192.168.99.10' <<<"$(nsx kp-lay-n nft list map $T affinity-tcp-3)"
check affinity-3s-element $? "element present after the connections"
sleep 4
! grep -q '192.168.99.10' <<<"$(nsx kp-lay-n nft list map $T affinity-tcp-3)"
check affinity-3s-expired $? "element gone 4 s later"

# 4. hairpin: e1 connects to a Service whose endpoints include e1; the
#    connections it makes to itself work only when masqueraded.
c=$(count kp-lay-e1 10.96.0.10 100)
[ "$(get "$c" FAIL)" = 0 ] && [ "$(get "$c" e1)" -gt 0 ]
check hairpin $? "$c"
#    negative control: without e1's pair the self-connections fail
nsx kp-lay-n nft delete element $T hairpin-endpoints '{ 10.244.1.2 . 10.244.1.2 }'
c=$(count kp-lay-e1 10.96.0.10 40)
[ "$(get "$c" FAIL)" -gt 0 ] && [ "$(get "$c" e1)" = 0 ]
check hairpin-control $? "without the pair: $c"
nsx kp-lay-n nft add element $T hairpin-endpoints '{ 10.244.1.2 . 10.244.1.2 }'

# 5. growth: e3 joins Service 0 (2 -> 3 endpoints: the count changes), and
#    leaves again; each transaction as the layout writes a count change.
edit add 0 10.244.1.4 || exit 1
c=$(count kp-lay-c 10.96.0.10 300)
within "$(get "$c" e1)" 60 140 && within "$(get "$c" e2)" 60 140 && within "$(get "$c" e3)" 60 140 && [ "$(get "$c" FAIL)" = 0 ]
check growth $? "$c"
nodeport nodeport-growth 60 140 e1 e2 e3
edit unadd 0 10.244.1.4 || exit 1
c=$(count kp-lay-c 10.96.0.10 300)
[ "$(get "$c" e3)" = 0 ] && [ "$(get "$c" FAIL)" = 0 ] && within "$(get "$c" e1)" 110 190 && within "$(get "$c" e2)" 110 190
check growth-undone $? "$c"
nodeport nodeport-growth-undone 110 190 e1 e2

# 6. replacement: in Service 0, e2 is replaced by e3 in an element-only
#    transaction (e3 takes e2's slots); e2 gets no new connection, e1 and e3
#    share them.
edit replace 0 10.244.1.3 10.244.1.4 || exit 1
c=$(count kp-lay-c 10.96.0.10 300)
[ "$(get "$c" e2)" = 0 ] && [ "$(get "$c" FAIL)" = 0 ] && within "$(get "$c" e1)" 110 190 && within "$(get "$c" e3)" 110 190
check replacement $? "$c"
nodeport nodeport-replacement 110 190 e1 e3

# 7. removal: e1 leaves Service 1 (3 -> 2 endpoints; data, sharded: e3
#    moves into e1's slot, the dnat rule's modulus drops to 2; the other
#    layouts as gen.py says); no new connection reaches e1.
edit remove 1 10.244.1.2 || exit 1
c=$(count kp-lay-c 10.96.0.11 300)
[ "$(get "$c" e1)" = 0 ] && [ "$(get "$c" FAIL)" = 0 ] && within "$(get "$c" e2)" 110 190 && within "$(get "$c" e3)" 110 190
check removal $? "$c"

# 8. removal under affinity: the client's affinity element outlives the
#    endpoint's slot (a limit of this design: the proxy must delete
#    the elements whose value is the removed endpoint), and deleting it
#    moves the client.
c=$(count kp-lay-c 10.96.0.12 1)
stuck=${c%% *}
ip=10.244.1.$((${stuck#e} + 1))
edit remove 2 "$ip" || exit 1
c=$(count kp-lay-c 10.96.0.12 20)
[ "$(get "$c" "$stuck")" = 20 ]
check affinity-stale-until-deleted $? "after $stuck left the Service: $c"
nsx kp-lay-n nft delete element $T affinity-tcp-10800 '{ 10.96.0.12 . 80 . 192.168.99.10 }'
c=$(count kp-lay-c 10.96.0.12 20)
[ "$(get "$c" "$stuck")" = 0 ] && [ "$(backends "$c")" = 1 ] && [ "$(get "$c" FAIL)" = 0 ]
check affinity-after-delete $? "after deleting the client's element: $c"

rm -f /tmp/kp-lay-proof.nft /tmp/kp-lay-edit.nft /tmp/kp-lay-edit2.nft
exit $FAILED
