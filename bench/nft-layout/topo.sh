# Network namespace topology shared by proof.sh and connrate.sh (sourced).
#
#   kp-lay-c (client, 192.168.99.10) --veth-- kp-lay-n (node, 192.168.99.2,
#   the rules) --routed veths-- kp-lay-e1..e3 (endpoints
#   10.244.1.2-4, server.py on :8080 answering e1/e2/e3) and kp-lay-big
#   (10.244.10.0 to 10.244.13.231: 1,000 endpoint addresses, one server
#   answering "big"). Nothing is added to the root namespace but the
#   namespaces themselves; topo_down removes them and the servers.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NSS="kp-lay-c kp-lay-n kp-lay-e1 kp-lay-e2 kp-lay-e3 kp-lay-big"
SERVER_PIDS=""

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

topo_down() {
    for p in $SERVER_PIDS; do kill "$p" 2>/dev/null || true; done
    for ns in $NSS; do ip netns del "$ns" 2>/dev/null || true; done
}

wait_listen() { # ns port
    local deadline=$((SECONDS + 10))
    until nsx "$1" ss -ltnH "sport = :$2" | grep -q LISTEN; do
        if ((SECONDS > deadline)); then echo "server in $1 never listened on $2" >&2; return 1; fi
        sleep 0.1
    done
}

topo_up() {
    topo_down # leftovers of a crashed run
    for ns in $NSS; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
    # New namespaces inherit rp_filter from the root namespace; the node
    # sends no redirects (as CNI plugins set it); bridged frames are kept out
    # of netfilter where br_netfilter is loaded (the topology has no bridge;
    # this only fixes the namespace's settings).
    for ns in $NSS; do nsx "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0; done
    nsx kp-lay-n sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.default.send_redirects=0
    if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
        nsx kp-lay-n sysctl -qw net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 net.bridge.bridge-nf-call-arptables=0
    fi
    ip link add c0 netns kp-lay-c type veth peer name n-c netns kp-lay-n
    nsx kp-lay-c ip addr add 192.168.99.10/24 dev c0
    nsx kp-lay-c ip link set c0 up
    nsx kp-lay-c ip route add 10.96.0.0/16 via 192.168.99.2
    nsx kp-lay-n ip addr add 192.168.99.2/24 dev n-c
    nsx kp-lay-n ip link set n-c up
    # routed pod links, as CNI plugins in ptp mode: the node holds
    # 10.244.0.1/32 on every pod veth and a route to each pod, so that
    # pod-to-pod traffic through a Service passes the node both ways
    local k=2
    for ns in kp-lay-e1 kp-lay-e2 kp-lay-e3 kp-lay-big; do
        local short=${ns#kp-lay-}
        ip link add eth0 netns "$ns" type veth peer name "v-$short" netns kp-lay-n
        nsx kp-lay-n ip addr add 10.244.0.1/32 dev "v-$short"
        nsx kp-lay-n ip link set "v-$short" up
        if [ "$ns" = kp-lay-big ]; then
            python3 - <<'PY' | nsx "$ns" ip -batch -
import ipaddress
for k in range(1000):
    print(f"addr add {ipaddress.IPv4Address('10.244.10.0') + k}/32 dev eth0")
PY
            nsx kp-lay-n ip route add 10.244.8.0/21 dev v-big
        else
            nsx "$ns" ip addr add "10.244.1.$k/32" dev eth0
            nsx kp-lay-n ip route add "10.244.1.$k/32" dev "v-$short"
            k=$((k + 1))
        fi
        nsx "$ns" ip link set eth0 up
        nsx "$ns" ip route add 10.244.0.1/32 dev eth0
        nsx "$ns" ip route add default via 10.244.0.1 dev eth0
        # not through nsx: $! must be the server itself (ip netns exec
        # execs it), or topo_down would leave it running
        ip netns exec "$ns" python3 "$HERE/server.py" "$short" 8080 &
        SERVER_PIDS="$SERVER_PIDS $!"
    done
    # the node's own connections to ClusterIPs need a route before DNAT
    nsx kp-lay-n ip route add 10.96.0.0/16 dev n-c src 10.244.0.1
    for ns in kp-lay-e1 kp-lay-e2 kp-lay-e3 kp-lay-big; do wait_listen "$ns" 8080; done
}
