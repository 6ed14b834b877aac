//! Several nodes joined by a fabric, each with its own pods, as network
//! namespaces.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Deref;

use ipnet::Ipv4Net;

use super::echo::EchoServers;
use super::namespace::{validate_name, Netns};
use super::topology::{
    configure_sysctls, pod_commands, wait_for_links, Host, PodBuilder, POD_GATEWAY, POD_GATEWAY_V6,
};
use super::NetnsError;
use crate::plan;

/// Name of the client added when a test declares none.
const DEFAULT_CLIENT: &str = "client";
/// The fabric's bridge.
const BRIDGE: &str = "br0";
/// Most nodes, pods per node and clients one cluster takes: nodes take .2
/// to .9 of the node network, below the clients' .10 and up.
const MAX_NODES: usize = 8;
const MAX_PODS_PER_NODE: usize = 200;
const MAX_CLIENTS: usize = 16;

/// Describes a [`Cluster`]; see [`Cluster::builder`].
#[derive(Debug, Default)]
#[must_use]
pub struct ClusterBuilder {
    nodes: Vec<NodeSpec>,
    clients: Vec<String>,
}

/// The pods of one node, described with [`ClusterBuilder::node`].
#[derive(Debug, Default)]
#[must_use]
pub struct ClusterNodeBuilder {
    pods: Vec<(String, PodBuilder)>,
}

/// Built network namespaces: a fabric, nodes on it with their pods, and
/// outside clients. Every namespace is deleted and every echo server
/// stopped on drop, also while a test panics.
#[derive(Debug)]
pub struct Cluster {
    // Stopped first on drop, so no socket keeps a namespace alive.
    servers: EchoServers,
    nodes: Vec<ClusterNode>,
    clients: Vec<Host>,
    fabric: Netns,
}

/// One node of a [`Cluster`]: its namespace (where a proxy runs), its
/// addresses on the fabric and its pods. It dereferences to its [`Netns`].
#[derive(Debug)]
pub struct ClusterNode {
    name: String,
    netns: Netns,
    ip: Ipv4Addr,
    ip_v6: Ipv6Addr,
    pod_cidr: Ipv4Net,
    pods: Vec<Host>,
    fabric_port: String,
}

#[derive(Debug)]
struct NodeSpec {
    name: String,
    pods: ClusterNodeBuilder,
}

impl ClusterBuilder {
    /// Adds a node named `name` (e.g. `"node-a"`, also the name of its
    /// namespace's role and, in tests, of its Node object), with the pods
    /// `build` declares. Nodes get 192.168.99.2, .3, … and pod ranges
    /// 10.244.1.0/24, 10.244.2.0/24, … in the order added.
    pub fn node(
        mut self,
        name: &str,
        build: impl FnOnce(ClusterNodeBuilder) -> ClusterNodeBuilder,
    ) -> Self {
        self.nodes.push(NodeSpec {
            name: name.to_owned(),
            pods: build(ClusterNodeBuilder::default()),
        });
        self
    }

    /// Adds a client on the fabric, outside every node. Clients get
    /// 192.168.99.10, .11, … in the order added. Without any call, one
    /// client named `"client"` is added.
    pub fn client(mut self, name: &str) -> Self {
        self.clients.push(name.to_owned());
        self
    }

    /// Creates the namespaces, links, addresses and routes, and starts the
    /// echo servers. On error, whatever was created is removed again.
    pub fn build(mut self) -> Result<Cluster, NetnsError> {
        if self.clients.is_empty() {
            self.clients.push(DEFAULT_CLIENT.to_owned());
        }
        self.validate()?;
        let fabric = Netns::create("fabric")?;
        configure_fabric(&fabric)?;
        let clients = self.create_clients()?;
        let nodes = self.create_nodes()?;
        fabric.ip_batch(&fabric_commands(&nodes, &clients))?;
        let count = nodes.len();
        for (index, node) in (0u8..).zip(&nodes) {
            node.netns
                .ip_batch(&node_commands(index, count, &node.pods))?;
            for pod in &node.pods {
                pod.netns().ip_batch(&pod_commands(pod))?;
            }
        }
        for client in &clients {
            client.netns().ip_batch(&client_commands(client))?;
        }
        let ports: Vec<&str> = clients
            .iter()
            .map(Host::node_interface)
            .chain(nodes.iter().map(|node| node.fabric_port.as_str()))
            .collect();
        wait_for_links(&fabric, &ports)?;
        let mut servers = EchoServers::default();
        for (spec, node) in self.nodes.iter().zip(&nodes) {
            let links: Vec<&str> = node.pods.iter().map(Host::node_interface).collect();
            wait_for_links(&node.netns, &links)?;
            for ((name, ports), pod) in spec.pods.pods.iter().zip(&node.pods) {
                servers.start(pod, name, ports.tcp_ports(), ports.udp_ports())?;
            }
        }
        tracing::debug!(
            fabric = fabric.name(),
            nodes = nodes.len(),
            clients = clients.len(),
            "cluster built"
        );
        Ok(Cluster {
            servers,
            nodes,
            clients,
            fabric,
        })
    }

    fn validate(&self) -> Result<(), NetnsError> {
        let mut seen = BTreeSet::new();
        let pods = self.nodes.iter().flat_map(|n| n.pods.pods.iter());
        let names = self
            .nodes
            .iter()
            .map(|n| &n.name)
            .chain(pods.map(|(name, _)| name))
            .chain(&self.clients);
        for name in names {
            validate_name(name)?;
            if name == "fabric" || !seen.insert(name) {
                return Err(NetnsError::InvalidName {
                    name: name.clone(),
                    reason: "node, pod and client names must be unique and not \"fabric\"",
                });
            }
        }
        let too_many_pods = self
            .nodes
            .iter()
            .any(|n| n.pods.pods.len() > MAX_PODS_PER_NODE);
        if self.nodes.is_empty()
            || self.nodes.len() > MAX_NODES
            || too_many_pods
            || self.clients.len() > MAX_CLIENTS
        {
            return Err(NetnsError::InvalidName {
                name: format!("{} nodes, {} clients", self.nodes.len(), self.clients.len()),
                reason: "a cluster takes 1 to 8 nodes of at most 200 pods, and at most 16 clients",
            });
        }
        Ok(())
    }

    fn create_clients(&self) -> Result<Vec<Host>, NetnsError> {
        let mut clients = Vec::with_capacity(self.clients.len());
        for (index, name) in (0u8..).zip(&self.clients) {
            let netns = Netns::create(name)?;
            configure_sysctls(&netns, false)?;
            let ips = (plan::client_ip(index), plan::client_ip_v6(index));
            clients.push(Host::new(name, netns, ips, format!("c{index}"), false));
        }
        Ok(clients)
    }

    fn create_nodes(&self) -> Result<Vec<ClusterNode>, NetnsError> {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for (index, spec) in (0u8..).zip(&self.nodes) {
            let netns = Netns::create(&spec.name)?;
            configure_sysctls(&netns, true)?;
            let mut pods = Vec::with_capacity(spec.pods.pods.len());
            for (pod_index, (name, _)) in (0u8..).zip(&spec.pods.pods) {
                let pod_netns = Netns::create(name)?;
                configure_sysctls(&pod_netns, false)?;
                let ips = (
                    plan::cluster_pod_ip(index, pod_index),
                    plan::cluster_pod_ip_v6(index, pod_index),
                );
                pods.push(Host::new(
                    name,
                    pod_netns,
                    ips,
                    format!("pod{pod_index}"),
                    false,
                ));
            }
            nodes.push(ClusterNode {
                name: spec.name.clone(),
                netns,
                ip: plan::cluster_node_ip(index),
                ip_v6: plan::cluster_node_ip_v6(index),
                pod_cidr: plan::cluster_pod_cidr(index),
                pods,
                fabric_port: format!("n{index}"),
            });
        }
        Ok(nodes)
    }
}

impl ClusterNodeBuilder {
    /// Adds a pod of this node named `name`, with echo servers on the
    /// ports `build` lists (none for a pod that only sends). The `n`-th pod
    /// of the `i`-th node gets 10.244.(i + 1).(n + 2) and
    /// fd00:10:244:(i + 1)::(n + 2).
    pub fn pod(mut self, name: &str, build: impl FnOnce(PodBuilder) -> PodBuilder) -> Self {
        self.pods
            .push((name.to_owned(), build(PodBuilder::default())));
        self
    }
}

impl Cluster {
    /// Starts describing a cluster:
    ///
    /// ```no_run
    /// use kp_testkit::netns::Cluster;
    ///
    /// let cluster = Cluster::builder()
    ///     .node("node-a", |n| n.pod("a1", |p| p.tcp(8080)).pod("pa", |p| p))
    ///     .node("node-b", |n| n.pod("b1", |p| p.tcp(8080)))
    ///     .client("client")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(cluster.pod("b1").ip().to_string(), "10.244.2.2");
    /// assert_eq!(cluster.node("node-b").ip().to_string(), "192.168.99.3");
    /// ```
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// The fabric namespace: it holds the bridge joining every node and
    /// client, with [`plan::FABRIC_IP`] on it, so a test API server started
    /// there on that address is reached by every node. It forwards nothing
    /// between networks: it is a switch, not a router.
    pub fn fabric(&self) -> &Netns {
        &self.fabric
    }

    /// The node named `name`.
    ///
    /// # Panics
    /// If there is no such node; the message lists the nodes.
    #[track_caller]
    pub fn node(&self, name: &str) -> &ClusterNode {
        match self.nodes.iter().find(|node| node.name == name) {
            Some(node) => node,
            None => {
                let known: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
                panic!("no node named {name:?} in this cluster; there are {known:?}")
            }
        }
    }

    /// Every node, in the order added.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// The pod named `name`, on whichever node it is.
    ///
    /// # Panics
    /// If there is no such pod; the message lists the pods.
    #[track_caller]
    pub fn pod(&self, name: &str) -> &Host {
        let mut pods = self.nodes.iter().flat_map(|node| &node.pods);
        match pods.find(|pod| pod.name() == name) {
            Some(pod) => pod,
            None => {
                let known: Vec<&str> = self
                    .nodes
                    .iter()
                    .flat_map(|node| node.pods.iter().map(Host::name))
                    .collect();
                panic!("no pod named {name:?} in this cluster; there are {known:?}")
            }
        }
    }

    /// The first client (192.168.99.10).
    pub fn client(&self) -> &Host {
        // `build` adds a client when none is declared, so there is one.
        &self.clients[0]
    }

    /// Every client, in the order added.
    pub fn clients(&self) -> &[Host] {
        &self.clients
    }

    /// Sends `client`'s traffic for the external range (LoadBalancer and
    /// external IPs, [`plan::EXTERNAL_CIDR`]) to `node`, as a load balancer
    /// picks a node (`ip route replace 203.0.113.0/24 via NODE_IP`, in the
    /// client's namespace). Clients start with the first node.
    pub fn route_external_via(&self, client: &Host, node: &ClusterNode) -> Result<(), NetnsError> {
        let external = plan::EXTERNAL_CIDR.to_string();
        let via = node.ip.to_string();
        client
            .netns()
            .ip(&["route", "replace", &external, "via", &via])
            .map(drop)
    }

    /// Every namespace name of this cluster: fabric, nodes, pods, clients.
    pub fn namespace_names(&self) -> Vec<String> {
        let mut names = vec![self.fabric.name().to_owned()];
        for node in &self.nodes {
            names.push(node.netns.name().to_owned());
            names.extend(node.pods.iter().map(|pod| pod.netns().name().to_owned()));
        }
        names.extend(
            self.clients
                .iter()
                .map(|client| client.netns().name().to_owned()),
        );
        names
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.servers.stop();
    }
}

impl ClusterNode {
    /// The node's name, as given to [`ClusterBuilder::node`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The node's IPv4 address on the fabric (its `InternalIP`).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The node's IPv6 address on the fabric.
    pub fn ip_v6(&self) -> Ipv6Addr {
        self.ip_v6
    }

    /// `ip():port`, e.g. a NodePort or a health-check node port.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// The node's pod range (its `spec.podCIDR`).
    pub fn pod_cidr(&self) -> Ipv4Net {
        self.pod_cidr
    }

    /// The node's pods, in the order added.
    pub fn pods(&self) -> &[Host] {
        &self.pods
    }
}

impl Deref for ClusterNode {
    type Target = Netns;

    fn deref(&self) -> &Netns {
        &self.netns
    }
}

/// The fabric is a switch with an address: known sysctls, no forwarding,
/// and bridged frames kept away from its (empty) netfilter tables. Where
/// `br_netfilter` is loaded, a new namespace calls iptables for bridged
/// frames by default (per namespace since Linux 5.3), which would put the
/// fabric's conntrack between the nodes.
fn configure_fabric(fabric: &Netns) -> Result<(), NetnsError> {
    configure_sysctls(fabric, false)?;
    for key in [
        "net/bridge/bridge-nf-call-iptables",
        "net/bridge/bridge-nf-call-ip6tables",
        "net/bridge/bridge-nf-call-arptables",
    ] {
        match fabric.sysctl(key, "0") {
            Ok(()) => {}
            // Without br_netfilter the keys do not exist, and frames are
            // not filtered anyway.
            Err(NetnsError::Sysctl { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// The bridge, with the fabric's addresses, and one port per node and
/// client. Without STP (the default) and with no forward delay, a port
/// forwards as soon as its veth has carrier.
fn fabric_commands(nodes: &[ClusterNode], clients: &[Host]) -> Vec<String> {
    let mut commands = vec![
        format!("link add {BRIDGE} type bridge forward_delay 0"),
        format!("link set {BRIDGE} up"),
        format!("address add {}/24 dev {BRIDGE}", plan::FABRIC_IP),
        format!("address add {}/64 dev {BRIDGE} nodad", plan::FABRIC_IP_V6),
    ];
    let node_ports = nodes
        .iter()
        .map(|node| (node.fabric_port.as_str(), node.netns.name()));
    let client_ports = clients
        .iter()
        .map(|client| (client.node_interface(), client.netns().name()));
    for (port, peer) in node_ports.chain(client_ports) {
        commands.push(format!(
            "link add {port} type veth peer name eth0 netns {peer}"
        ));
        commands.push(format!("link set {port} master {BRIDGE}"));
        commands.push(format!("link set {port} up"));
    }
    commands
}

/// Node `index` of `count`: its fabric link with the node address, a route
/// to every other node's pod range via that node (host-gw, as flannel's
/// host-gw backend or Calico without encapsulation program it), a default
/// route via the fabric (so traffic the proxy neither DNATs nor routes
/// reaches the filter table, as on a real node), and one routed veth per
/// pod, like a CNI plugin in ptp mode.
fn node_commands(index: u8, count: usize, pods: &[Host]) -> Vec<String> {
    let (ip, ip_v6) = (
        plan::cluster_node_ip(index),
        plan::cluster_node_ip_v6(index),
    );
    let mut commands = vec![
        "link set eth0 up".to_owned(),
        format!("address add {ip}/24 dev eth0"),
        format!("address add {ip_v6}/64 dev eth0 nodad"),
    ];
    for other in (0u8..).take(count).filter(|other| *other != index) {
        commands.push(format!(
            "route add {} via {}",
            plan::cluster_pod_cidr(other),
            plan::cluster_node_ip(other)
        ));
        commands.push(format!(
            "route add {} via {}",
            plan::cluster_pod_cidr_v6(other),
            plan::cluster_node_ip_v6(other)
        ));
    }
    commands.push(format!("route add default via {}", plan::FABRIC_IP));
    commands.push(format!("route add ::/0 via {}", plan::FABRIC_IP_V6));
    for pod in pods {
        let (veth, peer) = (pod.node_interface(), pod.netns().name());
        commands.push(format!(
            "link add {veth} type veth peer name eth0 netns {peer}"
        ));
        commands.push(format!("link set {veth} up"));
        commands.push(format!("address add {POD_GATEWAY}/32 dev {veth}"));
        commands.push(format!("address add {POD_GATEWAY_V6}/64 dev {veth} nodad"));
        commands.push(format!("route add {}/32 dev {veth} src {ip}", pod.ip()));
        commands.push(format!(
            "route add {}/128 dev {veth} src {ip_v6}",
            pod.ip_v6()
        ));
    }
    commands
}

/// A client: its addresses on the node network (every node is on-link),
/// and the external range via the first node until
/// [`Cluster::route_external_via`] says otherwise.
fn client_commands(client: &Host) -> Vec<String> {
    vec![
        "link set eth0 up".to_owned(),
        format!("address add {}/24 dev eth0", client.ip()),
        format!("address add {}/64 dev eth0 nodad", client.ip_v6()),
        format!("route add {} via {}", plan::EXTERNAL_CIDR, plan::NODE_IP),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> ClusterBuilder {
        Cluster::builder()
            .node("node-a", |n| n.pod("a1", |p| p.tcp(80)))
            .node("node-b", |n| n.pod("b1", |p| p.tcp(80)))
    }

    #[test]
    fn names_are_unique_across_nodes_pods_and_clients() {
        assert!(two_nodes().client("client").validate().is_ok());
        let pod_twice = two_nodes().node("node-c", |n| n.pod("a1", |p| p));
        assert!(
            matches!(pod_twice.validate(), Err(NetnsError::InvalidName { name, .. }) if name == "a1")
        );
        let client_named_as_node = two_nodes().client("node-a");
        assert!(client_named_as_node.validate().is_err());
        let reserved = two_nodes().client("fabric");
        assert!(reserved.validate().is_err());
    }

    #[test]
    fn a_cluster_has_one_to_eight_nodes() {
        assert!(Cluster::builder().client("client").validate().is_err());
        let mut nine = Cluster::builder();
        for index in 0..9 {
            nine = nine.node(&format!("node-{index}"), |n| n);
        }
        assert!(nine.validate().is_err());
    }

    #[test]
    fn nodes_route_every_other_pod_range_via_its_node() {
        let commands = node_commands(1, 3, &[]);
        assert!(commands.contains(&"address add 192.168.99.3/24 dev eth0".to_owned()));
        assert!(commands.contains(&"route add 10.244.1.0/24 via 192.168.99.2".to_owned()));
        assert!(commands.contains(&"route add 10.244.3.0/24 via 192.168.99.4".to_owned()));
        assert!(!commands
            .iter()
            .any(|c| c.starts_with("route add 10.244.2.0/24")));
        assert!(commands.contains(&"route add default via 192.168.99.1".to_owned()));
    }
}
