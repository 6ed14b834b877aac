#!/bin/bash
# Compare gen.py's current layout with the binary's own dry run for two
# Services x two endpoints: the IPv4 part of `kube-proxy --dry-run
# --proxy-mode nftables`, and `gen.py current full 2 2`, with comments
# dropped, the chain-name hashes (which depend on the names' hashing)
# replaced, `flush map/set` lines dropped, sorted. Prints the diff; no
# privileges needed.
#   shape.sh [KUBE_PROXY_BINARY]   default target/debug/kube-proxy
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-$HERE/../../target/debug/kube-proxy}
DIR=$(mktemp -d /tmp/kp-lay-shape.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
for i in 0 1; do
    cat >> "$DIR/services.yaml" <<YAML
---
apiVersion: v1
kind: Service
metadata: {namespace: ns$i, name: svc$i}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.$((i + 1))
  clusterIPs: [10.96.0.$((i + 1))]
  ipFamilies: [IPv4]
  ports:
    - {name: http, port: 80, targetPort: 8080, protocol: TCP}
YAML
    cat >> "$DIR/endpointslices.yaml" <<YAML
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns$i, name: svc$i-abc, labels: {kubernetes.io/service-name: svc$i}}
addressType: IPv4
ports:
  - {name: http, port: 8080, protocol: TCP}
endpoints:
  - {addresses: [10.128.0.$((2 * i))], conditions: {ready: true}, nodeName: node-2}
  - {addresses: [10.128.0.$((2 * i + 1))], conditions: {ready: true}, nodeName: node-2}
YAML
done
"$BIN" --manifests "$DIR" --hostname-override node-1 --cluster-cidr 10.244.0.0/16 \
    --dry-run --proxy-mode nftables 2> /dev/null | awk '/^add table ip6/ {exit} {print}' > "$DIR/bin.nft"
python3 "$HERE/gen.py" current full 2 2 > "$DIR/gen.nft"
norm() {
    sed -E 's/ comment "[^"]*"//g; s/ ; ; / ; /; s/\{ ; \}//; s/ +$//; s/(service|endpoint)-[A-Z0-9]{8}-/\1-H-/g' "$1" |
        grep -v '^flush \(map\|set\)' | sort
}
diff <(norm "$DIR/bin.nft") <(norm "$DIR/gen.nft") && echo "same shape"
