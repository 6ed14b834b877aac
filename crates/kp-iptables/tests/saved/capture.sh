#!/bin/sh
# Captures the iptables-save output that tests/tracer_saved.rs reads: some
# golden texts applied by the real iptables-restore of each flavor, with our
# jump rules and, in docker.txt, rules of other software (Docker, kubelet, a
# LOG rule), in a scratch network namespace that is deleted afterwards.
# Run as root from this directory: ./capture.sh
set -eu
golden=../golden
ns="kp-capture-$$"
ip netns add "$ns"
trap 'ip netns del "$ns"' EXIT
run() { ip netns exec "$ns" "$@"; }

# JUMP_RULES, prepended in reverse order as on a clean host (see jumps.rs).
jumps() {
    ipt=$1
    $ipt -t filter -I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
    $ipt -t filter -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
    $ipt -t filter -I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
    $ipt -t filter -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    $ipt -t filter -I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    $ipt -t filter -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
    $ipt -t filter -I INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
    $ipt -t filter -I OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
    $ipt -t filter -I FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
    $ipt -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    $ipt -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    $ipt -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
    # kubelet's chain, created empty when the text has none (IPv6).
    $ipt -t filter -S KUBE-FIREWALL >/dev/null 2>&1 || $ipt -t filter -N KUBE-FIREWALL
    $ipt -t filter -I INPUT -j KUBE-FIREWALL
    $ipt -t filter -I OUTPUT -j KUBE-FIREWALL
}

# What Docker (27.x), kubelet and an administrator add on a node.
others() {
    ipt=$1
    $ipt -t nat -N DOCKER
    $ipt -t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
    $ipt -t nat -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
    $ipt -t nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
    $ipt -t nat -A DOCKER -i docker0 -j RETURN
    $ipt -t nat -A DOCKER ! -i docker0 -p tcp -m tcp --dport 8081 -j DNAT --to-destination 172.17.0.2:80
    $ipt -t filter -P FORWARD DROP
    $ipt -t filter -N DOCKER
    $ipt -t filter -N DOCKER-USER
    $ipt -t filter -N DOCKER-ISOLATION-STAGE-1
    $ipt -t filter -A FORWARD -j DOCKER-USER
    $ipt -t filter -A FORWARD -j DOCKER-ISOLATION-STAGE-1
    $ipt -t filter -A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    $ipt -t filter -A FORWARD -o docker0 -j DOCKER
    $ipt -t filter -A FORWARD -i docker0 ! -o docker0 -j ACCEPT
    $ipt -t filter -A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT
    $ipt -t filter -A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j RETURN
    $ipt -t filter -A DOCKER-USER -j RETURN
    $ipt -t filter -A INPUT -p tcp -m tcp --dport 22 -m limit --limit 3/min -j LOG --log-prefix "ssh \"new\" "
    $ipt -t filter -A OUTPUT -m owner --uid-owner 0 -p udp -m udp --dport 9 -j DROP
    $ipt -t mangle -N KUBE-IPTABLES-HINT
    $ipt -t mangle -N KUBE-KUBELET-CANARY
}

for flavor in legacy nft; do
    mkdir -p "$flavor"
    # Every golden text of one family that applies alone: partial_sync is
    # a partial restore, and node_port_addresses needs nfacct objects.
    for out in cluster_ip detector_bridge detector_interface_prefix detector_node_cidr \
        detector_none etp_local etp_local_no_local_endpoints external_ips itp_local \
        load_balancer_source_ranges masquerade_all no_endpoints node_port session_affinity \
        terminating_fallback udp_sctp docker; do
        name=$out
        [ "$out" = docker ] && name=cluster_ip
        run iptables-$flavor-restore --noflush <"$golden/$name.txt"
        jumps "run iptables-$flavor"
        [ "$out" = docker ] && others "run iptables-$flavor"
        run iptables-$flavor-save | sed -e 's/ on [A-Z][a-z][a-z] [A-Z][a-z][a-z] .*//' >"$flavor/$out.txt"
        for table in nat filter mangle; do
            run iptables-$flavor -t "$table" -F
            run iptables-$flavor -t "$table" -X
        done
        run iptables-$flavor -t filter -P FORWARD ACCEPT
    done
    run ip6tables-$flavor-restore --noflush <"$golden/ipv6.txt"
    jumps "run ip6tables-$flavor"
    run ip6tables-$flavor-save | sed -e 's/ on [A-Z][a-z][a-z] [A-Z][a-z][a-z] .*//' >"$flavor/ipv6.txt"
    for table in nat filter; do
        run ip6tables-$flavor -t "$table" -F
        run ip6tables-$flavor -t "$table" -X
    done
done
