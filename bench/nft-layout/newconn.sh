#!/bin/bash
# CPU time per new connection through a Service with 2 endpoints
# (10.96.0.20) and with 1,000 (10.96.0.21), in the current and the data
# layouts (gen.py LAYOUT proof), in namespace kp-lay-k. Each sample:
# conntrack flushed, newconn.py sends N SYNs from new source ports. Samples
# alternate layout and Service.
#   newconn.sh [RUNS [N [LAYOUTS]]]   defaults 7, 20000, "current data"
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUNS=${1:-7}
N=${2:-20000}
LAYOUTS=${3:-current data}
NS=kp-lay-k
SINK=kp-lay-k2
trap 'ip netns del $NS 2>/dev/null || true; ip netns del $SINK 2>/dev/null || true; rm -f /tmp/kp-lay-k-*.nft' EXIT
for ns in $NS $SINK; do ip netns del $ns 2>/dev/null || true; ip netns add $ns; done
nsx() { ip netns exec $NS "$@"; }
nsx ip link set lo up
# the packets leave by a veth whose peer, in a namespace without addresses
# or rules, drops them (this kernel has no dummy interface)
ip link add out0 netns $NS type veth peer name in0 netns $SINK
ip netns exec $SINK ip link set in0 up
nsx ip addr add 10.244.0.1/32 dev out0
nsx ip link set out0 up
# one gateway with a permanent neighbour entry: no ARP for the endpoints
# (unresolved packets would wait in the neighbour queue and block sendto)
nsx ip neigh add 10.244.0.2 lladdr 02:00:00:00:00:02 dev out0 nud permanent
nsx ip route add 10.96.0.0/16 via 10.244.0.2 dev out0 onlink
nsx ip route add 10.244.0.0/16 via 10.244.0.2 dev out0 onlink
for l in $LAYOUTS; do python3 "$HERE/gen.py" "$l" proof > "/tmp/kp-lay-k-$l.nft"; done

echo "# load $(cat /proc/loadavg)"
for ((r = 1; r <= RUNS; r++)); do
    for l in $LAYOUTS; do
        nsx nft -f "/tmp/kp-lay-k-$l.nft"
        for svc in 10.96.0.20 10.96.0.21; do
            nsx conntrack -F 2> /dev/null || true
            echo "$l $svc $(nsx python3 "$HERE/newconn.py" $svc "$N") us/packet"
        done
    done
done
echo "# load $(cat /proc/loadavg)"
