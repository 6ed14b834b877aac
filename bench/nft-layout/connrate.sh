#!/bin/bash
# New-connection cost through a Service with 2 and with 1,000 endpoints, in
# the current and the data layout (gen.py LAYOUT proof: Services 10.96.0.20
# and 10.96.0.21, endpoints in kp-lay-big). Each sample: conntrack flushed,
# then client.py rate: N sequential TCP connections from kp-lay-c (connect,
# read the answer, close), in connections per second. Samples alternate
# layout and Service so that load changes spread over all four.
#   connrate.sh [RUNS [N]]     defaults 7 and 2000
source "$(dirname "$0")/topo.sh"
trap topo_down EXIT
RUNS=${1:-7}
N=${2:-2000}
topo_up
for layout in current data; do
    python3 "$HERE/gen.py" $layout proof > "/tmp/kp-lay-$layout.nft"
done
echo "# load $(cat /proc/loadavg)"
for ((r = 1; r <= RUNS; r++)); do
    for layout in current data; do
        nsx kp-lay-n nft -f "/tmp/kp-lay-$layout.nft"
        for svc in 10.96.0.20 10.96.0.21; do
            nsx kp-lay-n conntrack -F 2> /dev/null
            out=$(nsx kp-lay-c python3 "$HERE/client.py" rate $svc 80 "$N")
            echo "$layout $svc $out"
        done
    done
done
echo "# load $(cat /proc/loadavg)"
rm -f /tmp/kp-lay-current.nft /tmp/kp-lay-data.nft
