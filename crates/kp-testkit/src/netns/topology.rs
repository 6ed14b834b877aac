//! A node, its pods and outside clients, as network namespaces.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Deref;
use std::time::Duration;

use super::echo::EchoServers;
use super::env::wait_until;
use super::namespace::{validate_name, Netns};
use super::NetnsError;
use crate::plan;

/// The pods' IPv4 gateway: configured on every pod veth of the node, like
/// Calico's link-local gateway, so every pod uses the same default route.
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pods' IPv6 gateway, a link-local address on every pod veth of the
/// node.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Name of the client added when a test declares none.
const DEFAULT_CLIENT: &str = "client";
/// Most pods (local plus remote) and clients one topology takes.
const MAX_PODS: usize = 200;
const MAX_CLIENTS: usize = 16;
/// How long the node's links may take to report carrier.
const LINK_UP_TIMEOUT: Duration = Duration::from_secs(5);
/// The role (namespace name suffix) of the second node.
const SECOND_NODE_ROLE: &str = "node2";

/// The node's end of the veth pair to the second node (see
/// [`TopologyBuilder::with_second_node`]); the second node's end is its
/// `eth0`.
pub const SECOND_NODE_LINK: &str = "node2";
/// The second node's nftables table and counter of
/// [`Topology::count_second_node_forwarding`].
const PROBE_TABLE: &str = "kpt_probe";
const PROBE_COUNTER: &str = "forwarded";

/// Describes a [`Topology`]; see [`Topology::builder`].
#[derive(Debug, Default)]
#[must_use]
pub struct TopologyBuilder {
    pods: Vec<PodSpec>,
    clients: Vec<String>,
    second_node: bool,
}

/// The echo ports of one pod, described with [`TopologyBuilder::pod`].
#[derive(Debug, Default)]
#[must_use]
pub struct PodBuilder {
    tcp_ports: Vec<u16>,
    udp_ports: Vec<u16>,
}

/// Built network namespaces: one node, its pods, outside clients. Every
/// namespace is deleted and every echo server stopped on drop, also while
/// a test panics.
#[derive(Debug)]
pub struct Topology {
    // Stopped first on drop, so no socket keeps a namespace alive.
    servers: EchoServers,
    pods: Vec<Host>,
    clients: Vec<Host>,
    second_node: Option<Netns>,
    node: Netns,
}

/// A pod or client namespace with its addresses. It dereferences to its
/// [`Netns`], so it can be passed wherever a probe wants a namespace:
/// `connect(topology.client(), addr)`.
#[derive(Debug)]
pub struct Host {
    name: String,
    netns: Netns,
    ip: Ipv4Addr,
    ip_v6: Ipv6Addr,
    node_interface: String,
    remote: bool,
}

#[derive(Debug)]
struct PodSpec {
    name: String,
    remote: bool,
    ports: PodBuilder,
}

impl TopologyBuilder {
    /// Adds a pod of this node named `name` (e.g. `"ep1"`), with echo
    /// servers on the ports `build` lists. Pods of this node get
    /// 10.244.1.2, 10.244.1.3, … (and fd00:10:244:1::2, …) in the order
    /// they are added.
    pub fn pod(self, name: &str, build: impl FnOnce(PodBuilder) -> PodBuilder) -> Self {
        self.add_pod(name, false, build)
    }

    /// Adds a pod "on another node": addresses 10.244.2.2, … (and
    /// fd00:10:244:2::2, …) in the order added. Without
    /// [`with_second_node`](Self::with_second_node) it is wired to the node
    /// namespace like the local pods, since the data plane only sees its
    /// address; with it, the pod sits behind the second node.
    pub fn remote_pod(self, name: &str, build: impl FnOnce(PodBuilder) -> PodBuilder) -> Self {
        self.add_pod(name, true, build)
    }

    /// Adds a client outside the node. Clients get 192.168.99.10, .11, …
    /// (and fd00:192:168:99::10, …) in the order added. Without any call,
    /// one client named `"client"` is added.
    pub fn client(mut self, name: &str) -> Self {
        self.clients.push(name.to_owned());
        self
    }

    /// Adds a second node namespace, `node-2` at 192.168.99.3
    /// (fd00:192:168:99::3), and wires every [`remote_pod`](Self::remote_pod)
    /// behind it instead of behind the proxy's node. The proxy's node
    /// routes 10.244.2.0/24 (fd00:10:244:2::/64) via the second node; the
    /// second node routes only to the proxy's node and its pods, not to
    /// the clients, so a pod there can answer a client only if the proxy
    /// masqueraded the connection to the node's address. See the module
    /// documentation of [`crate::netns`] for the layout.
    ///
    /// ```no_run
    /// use kp_testkit::netns::Topology;
    ///
    /// let topology = Topology::builder()
    ///     .with_second_node()
    ///     .pod("ep1", |p| p.tcp(8080))
    ///     .remote_pod("ep3", |p| p.tcp(8080))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(topology.pod("ep3").ip().to_string(), "10.244.2.2");
    /// let _node2 = topology.second_node();
    /// ```
    pub fn with_second_node(mut self) -> Self {
        self.second_node = true;
        self
    }

    /// Creates the namespaces, links, addresses and routes, and starts the
    /// echo servers. On error, whatever was created is removed again.
    pub fn build(mut self) -> Result<Topology, NetnsError> {
        if self.clients.is_empty() {
            self.clients.push(DEFAULT_CLIENT.to_owned());
        }
        self.validate()?;
        let node = Netns::create("node")?;
        configure_sysctls(&node, true)?;
        let second_node = if self.second_node {
            let netns = Netns::create(SECOND_NODE_ROLE)?;
            configure_sysctls(&netns, true)?;
            Some(netns)
        } else {
            None
        };
        let clients = self.create_clients()?;
        let pods = self.create_pods()?;
        // Without a second node, remote pods hang off the proxy's node.
        let (behind_node, behind_second): (Vec<&Host>, Vec<&Host>) = pods
            .iter()
            .partition(|pod| !(pod.remote && second_node.is_some()));
        let mut commands = node_commands(&clients, &behind_node);
        if let Some(second) = &second_node {
            commands.extend(node_to_second_node_commands(second));
        }
        node.ip_batch(&commands)?;
        for client in &clients {
            client.netns.ip_batch(&client_commands(client))?;
        }
        if let Some(second) = &second_node {
            second.ip_batch(&second_node_commands(&behind_second))?;
        }
        for pod in &pods {
            pod.netns.ip_batch(&pod_commands(pod))?;
        }
        let mut links: Vec<&str> = clients
            .iter()
            .chain(behind_node.iter().copied())
            .map(Host::node_interface)
            .collect();
        if let Some(second) = &second_node {
            links.push(SECOND_NODE_LINK);
            let mut second_links: Vec<&str> = behind_second
                .iter()
                .map(|pod| pod.node_interface())
                .collect();
            second_links.push("eth0");
            wait_for_links(second, &second_links)?;
        }
        wait_for_links(&node, &links)?;
        let mut servers = EchoServers::default();
        for (spec, pod) in self.pods.iter().zip(&pods) {
            servers.start(
                &pod.netns,
                &spec.name,
                &spec.ports.tcp_ports,
                &spec.ports.udp_ports,
            )?;
        }
        tracing::debug!(
            node = node.name(),
            pods = pods.len(),
            clients = clients.len(),
            "topology built"
        );
        Ok(Topology {
            servers,
            pods,
            clients,
            second_node,
            node,
        })
    }

    fn add_pod(
        mut self,
        name: &str,
        remote: bool,
        build: impl FnOnce(PodBuilder) -> PodBuilder,
    ) -> Self {
        self.pods.push(PodSpec {
            name: name.to_owned(),
            remote,
            ports: build(PodBuilder::default()),
        });
        self
    }

    fn validate(&self) -> Result<(), NetnsError> {
        let mut seen = BTreeSet::new();
        let names = self.pods.iter().map(|p| &p.name).chain(&self.clients);
        for name in names {
            validate_name(name)?;
            if name == "node" || !seen.insert(name) {
                return Err(NetnsError::InvalidName {
                    name: name.clone(),
                    reason: "pod and client names must be unique and not \"node\"",
                });
            }
        }
        if self.pods.len() > MAX_PODS || self.clients.len() > MAX_CLIENTS {
            return Err(NetnsError::InvalidName {
                name: format!("{} pods, {} clients", self.pods.len(), self.clients.len()),
                reason: "a topology takes at most 200 pods and 16 clients",
            });
        }
        Ok(())
    }

    fn create_clients(&self) -> Result<Vec<Host>, NetnsError> {
        let mut clients = Vec::with_capacity(self.clients.len());
        for (index, name) in (0u8..).zip(&self.clients) {
            let netns = Netns::create(name)?;
            configure_sysctls(&netns, false)?;
            clients.push(Host {
                name: name.clone(),
                netns,
                ip: plan::client_ip(index),
                ip_v6: plan::client_ip_v6(index),
                node_interface: format!("cl{index}"),
                remote: false,
            });
        }
        Ok(clients)
    }

    fn create_pods(&self) -> Result<Vec<Host>, NetnsError> {
        let mut pods = Vec::with_capacity(self.pods.len());
        let (mut local, mut remote) = (0u8, 0u8);
        for (index, spec) in self.pods.iter().enumerate() {
            let counter = if spec.remote { &mut remote } else { &mut local };
            let (ip, ip_v6) = if spec.remote {
                (
                    plan::other_node_pod_ip(*counter),
                    plan::other_node_pod_ip_v6(*counter),
                )
            } else {
                (plan::node_pod_ip(*counter), plan::node_pod_ip_v6(*counter))
            };
            *counter += 1;
            let netns = Netns::create(&spec.name)?;
            configure_sysctls(&netns, false)?;
            pods.push(Host {
                name: spec.name.clone(),
                netns,
                ip,
                ip_v6,
                node_interface: format!("pod{index}"),
                remote: spec.remote,
            });
        }
        Ok(pods)
    }
}

impl PodBuilder {
    /// Serves TCP on `port` (IPv4 and IPv6).
    pub fn tcp(mut self, port: u16) -> Self {
        self.tcp_ports.push(port);
        self
    }

    /// Serves UDP on `port` (IPv4 and IPv6).
    pub fn udp(mut self, port: u16) -> Self {
        self.udp_ports.push(port);
        self
    }

    pub(super) fn tcp_ports(&self) -> &[u16] {
        &self.tcp_ports
    }

    pub(super) fn udp_ports(&self) -> &[u16] {
        &self.udp_ports
    }
}

impl Topology {
    /// Starts describing a topology:
    ///
    /// ```no_run
    /// use kp_testkit::netns::Topology;
    ///
    /// let topology = Topology::builder()
    ///     .pod("ep1", |p| p.tcp(80).udp(53))
    ///     .pod("ep2", |p| p.tcp(80))
    ///     .remote_pod("ep3", |p| p.tcp(80))
    ///     .client("client")
    ///     .client("client2")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(topology.pod("ep1").ip().to_string(), "10.244.1.2");
    /// ```
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder::default()
    }

    /// The node namespace, where the proxy runs.
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// The second node's namespace, `node-2` (192.168.99.3), where the
    /// remote pods live when the topology was built
    /// [`with_second_node`](TopologyBuilder::with_second_node).
    ///
    /// # Panics
    /// If the topology has no second node.
    #[track_caller]
    pub fn second_node(&self) -> &Netns {
        match &self.second_node {
            Some(netns) => netns,
            None => panic!("this topology has no second node; build it with_second_node()"),
        }
    }

    /// Starts counting the packets the second node forwards from `source`
    /// (an nftables counter in table `inet kpt_probe` of the second node:
    /// `nft add rule inet kpt_probe forward ip saddr SOURCE counter name
    /// forwarded`); read it with [`second_node_forwarded`](Self::second_node_forwarded).
    /// A client sees a dropped connection and one forwarded to node-2
    /// without SNAT alike (no answer); the count tells them apart. Call it
    /// once per topology.
    ///
    /// # Panics
    /// If the topology has no second node, or `nft` fails.
    #[track_caller]
    pub fn count_second_node_forwarding(&self, source: IpAddr) {
        let second = self.second_node();
        let family = if source.is_ipv6() { "ip6" } else { "ip" };
        second.exec_ok("nft", &["add", "table", "inet", PROBE_TABLE]);
        second.exec_ok(
            "nft",
            &["add", "counter", "inet", PROBE_TABLE, PROBE_COUNTER],
        );
        second.exec_ok(
            "nft",
            &[
                "add chain inet",
                PROBE_TABLE,
                "forward { type filter hook forward priority 0; }",
            ],
        );
        let rule = format!("{family} saddr {source} counter name {PROBE_COUNTER}");
        second.exec_ok("nft", &["add rule inet", PROBE_TABLE, "forward", &rule]);
    }

    /// How many packets the second node forwarded from the source given to
    /// [`count_second_node_forwarding`](Self::count_second_node_forwarding).
    ///
    /// # Panics
    /// If the topology has no second node, counting was not started, or
    /// `nft`'s output has no packet count.
    #[track_caller]
    pub fn second_node_forwarded(&self) -> u64 {
        let listing = self.second_node().exec_ok(
            "nft",
            &["list", "counter", "inet", PROBE_TABLE, PROBE_COUNTER],
        );
        let mut words = listing.split_whitespace();
        let count = words
            .by_ref()
            .find(|word| *word == "packets")
            .and_then(|_| words.next())
            .and_then(|count| count.parse().ok());
        match count {
            Some(count) => count,
            None => panic!("no packet count in `nft list counter`: {listing}"),
        }
    }

    /// The pod named `name`.
    ///
    /// # Panics
    /// If there is no such pod; the message lists the pods.
    #[track_caller]
    pub fn pod(&self, name: &str) -> &Host {
        find(&self.pods, name, "pod")
    }

    /// Every pod, in the order added.
    pub fn pods(&self) -> &[Host] {
        &self.pods
    }

    /// The first client (192.168.99.10).
    pub fn client(&self) -> &Host {
        // `build` adds a client when none is declared, so there is one.
        &self.clients[0]
    }

    /// The client named `name`.
    ///
    /// # Panics
    /// If there is no such client; the message lists the clients.
    #[track_caller]
    pub fn client_named(&self, name: &str) -> &Host {
        find(&self.clients, name, "client")
    }

    /// Every client, in the order added.
    pub fn clients(&self) -> &[Host] {
        &self.clients
    }

    /// Gives the node a default route (IPv4 and IPv6) out of its last
    /// client's link, as real nodes have one: packets the proxy does not
    /// DNAT then reach the filter table (where a Service without endpoints
    /// is REJECTed) instead of failing the route lookup with "network
    /// unreachable". Everything stays inside the topology's namespaces.
    pub fn add_node_default_route(&self) -> Result<(), NetnsError> {
        // `build` adds a client when none is declared, so there is one.
        let link = self.clients[self.clients.len() - 1].node_interface();
        self.node.ip(&["route", "add", "default", "dev", link])?;
        self.node
            .ip(&["-6", "route", "add", "default", "dev", link])?;
        Ok(())
    }

    /// Makes pod `pod` answer on every address of `range` (an IPv4 or IPv6
    /// CIDR), for tests of many endpoints without as many pods: inside the
    /// pod the range is local (its echo servers listen on the wildcard
    /// address), and the node routes the range through the pod's own
    /// address of that family (a pod answers neighbour solicitations only
    /// for the addresses of its interface).
    ///
    /// A pod behind the second node gets the route on the second node, and
    /// the proxy's node routes the range via the second node.
    pub fn route_range_to_pod(&self, pod: &str, range: &str) -> Result<(), NetnsError> {
        let host = self.pod(pod);
        host.netns
            .ip(&["route", "add", "local", range, "dev", "lo"])?;
        let v6 = range.contains(':');
        let via = if v6 {
            IpAddr::V6(host.ip_v6)
        } else {
            IpAddr::V4(host.ip)
        };
        let second_node = self.second_node_of(host);
        second_node.unwrap_or(&self.node).ip(&[
            "route",
            "add",
            range,
            "via",
            &via.to_string(),
            "dev",
            host.node_interface(),
        ])?;
        if second_node.is_some() {
            let second = if v6 {
                IpAddr::V6(plan::OTHER_NODE_IP_V6)
            } else {
                IpAddr::V4(plan::OTHER_NODE_IP)
            };
            self.node.ip(&[
                "route",
                "add",
                range,
                "via",
                &second.to_string(),
                "dev",
                SECOND_NODE_LINK,
            ])?;
        }
        Ok(())
    }

    /// Every namespace name of this topology: node, second node (if any),
    /// clients, pods.
    pub fn namespace_names(&self) -> Vec<String> {
        let hosts = self.clients.iter().chain(&self.pods);
        std::iter::once(&self.node)
            .chain(&self.second_node)
            .map(|netns| netns.name().to_owned())
            .chain(hosts.map(|host| host.netns.name().to_owned()))
            .collect()
    }

    /// The second node, if `pod` sits behind it (a remote pod of a
    /// topology with a second node); `None` when the proxy's node holds
    /// the other end of its veth.
    fn second_node_of(&self, pod: &Host) -> Option<&Netns> {
        self.second_node.as_ref().filter(|_| pod.remote)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.servers.stop();
    }
}

impl Host {
    /// A host of `netns` with these addresses, whose end on its node (or
    /// fabric) is the link `node_interface`.
    pub(super) fn new(
        name: &str,
        netns: Netns,
        (ip, ip_v6): (Ipv4Addr, Ipv6Addr),
        node_interface: String,
        remote: bool,
    ) -> Self {
        Self {
            name: name.to_owned(),
            netns,
            ip,
            ip_v6,
            node_interface,
            remote,
        }
    }

    /// The name the test gave (`"ep1"`, `"client"`); pods answer with it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The IPv6 address.
    pub fn ip_v6(&self) -> Ipv6Addr {
        self.ip_v6
    }

    /// The address of one family: IPv6 with `ipv6`.
    pub fn ip_of(&self, ipv6: bool) -> std::net::IpAddr {
        if ipv6 {
            self.ip_v6.into()
        } else {
            self.ip.into()
        }
    }

    /// `ip():port`.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), port)
    }

    /// `[ip_v6()]:port`.
    pub fn addr_v6(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V6(self.ip_v6), port)
    }

    /// The node's end of this host's veth pair (`podN` or `clN`); for a
    /// remote pod of a topology with a second node, the second node's end.
    pub fn node_interface(&self) -> &str {
        &self.node_interface
    }

    /// Whether this pod stands for a pod on another node.
    pub fn is_remote(&self) -> bool {
        self.remote
    }
}

impl Deref for Host {
    type Target = Netns;

    fn deref(&self) -> &Netns {
        &self.netns
    }
}

#[track_caller]
fn find<'a>(hosts: &'a [Host], name: &str, kind: &str) -> &'a Host {
    match hosts.iter().find(|host| host.name == name) {
        Some(host) => host,
        None => {
            let known: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
            panic!("no {kind} named {name:?} in this topology; there are {known:?}")
        }
    }
}

/// Sysctls of every namespace, plus forwarding on the node. New
/// namespaces inherit IPv4 settings such as `rp_filter` from the root
/// namespace (`net.core.devconf_inherit_init_net`), so they are set here
/// to known values; DAD is off so IPv6 addresses are usable at once. The
/// node sends no ICMP redirects, as CNI plugins with routed pod links
/// configure it: a redirect (for instance to a pod whose Service
/// connection hairpins back to itself) spends the per-peer ICMP rate
/// limit that the "port unreachable" of a REJECT needs, so a Service
/// without endpoints would seem to time out instead of refusing.
pub(super) fn configure_sysctls(netns: &Netns, node: bool) -> Result<(), NetnsError> {
    let mut settings = vec![
        ("net/ipv4/conf/all/rp_filter", "0"),
        ("net/ipv4/conf/default/rp_filter", "0"),
        ("net/ipv6/conf/all/accept_dad", "0"),
        ("net/ipv6/conf/default/accept_dad", "0"),
        ("net/ipv6/bindv6only", "0"),
    ];
    if node {
        settings.push(("net/ipv4/ip_forward", "1"));
        settings.push(("net/ipv6/conf/all/forwarding", "1"));
        settings.push(("net/ipv4/conf/all/send_redirects", "0"));
        settings.push(("net/ipv4/conf/default/send_redirects", "0"));
    }
    settings
        .into_iter()
        .try_for_each(|(key, value)| netns.sysctl(key, value))
}

/// The node's links: one routed veth per client, holding the node IP as
/// /32 (/128) with a host route to the client, and one routed veth per pod.
///
/// No bridge joins the clients: a bridge reports carrier only after the
/// kernel's rate-limited link watcher runs (up to a second), and until then
/// its IPv6 addresses are not usable. veth carrier changes are handled at
/// once. Sharing one address across several links is what CNI plugins in
/// ptp mode do with their gateway address too.
fn node_commands(clients: &[Host], pods: &[&Host]) -> Vec<String> {
    let mut commands = Vec::new();
    for client in clients {
        let (veth, peer) = (&client.node_interface, client.netns.name());
        commands.push(format!(
            "link add {veth} type veth peer name eth0 netns {peer}"
        ));
        commands.push(format!("link set {veth} up"));
        commands.push(format!("address add {}/32 dev {veth}", plan::NODE_IP));
        commands.push(format!(
            "address add {}/128 dev {veth} nodad",
            plan::NODE_IP_V6
        ));
        commands.extend(host_routes(client, veth));
    }
    for pod in pods {
        commands.extend(pod_link_commands(pod, (plan::NODE_IP, plan::NODE_IP_V6)));
    }
    commands
}

/// A gateway's (node's or second node's) end of `pod`'s veth: the pods'
/// gateway addresses and host routes answered from `source`.
fn pod_link_commands(pod: &Host, source: (Ipv4Addr, Ipv6Addr)) -> Vec<String> {
    let (veth, peer) = (&pod.node_interface, pod.netns.name());
    let mut commands = vec![
        format!("link add {veth} type veth peer name eth0 netns {peer}"),
        format!("link set {veth} up"),
        format!("address add {POD_GATEWAY}/32 dev {veth}"),
        format!("address add {POD_GATEWAY_V6}/64 dev {veth} nodad"),
    ];
    commands.extend(routes_from(pod, veth, source));
    commands
}

/// The node's routes to `host` through `veth`, answered from the node IP.
fn host_routes(host: &Host, veth: &str) -> [String; 2] {
    routes_from(host, veth, (plan::NODE_IP, plan::NODE_IP_V6))
}

/// Host routes to `host` through `veth` with source addresses `source`.
fn routes_from(host: &Host, veth: &str, (source, source_v6): (Ipv4Addr, Ipv6Addr)) -> [String; 2] {
    [
        format!("route add {}/32 dev {veth} src {source}", host.ip),
        format!("route add {}/128 dev {veth} src {source_v6}", host.ip_v6),
    ]
}

/// The proxy's node's end of the link to the second node: the node IP as
/// /32 (/128) as on the client links, a host route to the second node, and
/// the second node's pod range via the second node (host-gw routing).
fn node_to_second_node_commands(second: &Netns) -> Vec<String> {
    let link = SECOND_NODE_LINK;
    let (peer, other, other_v6) = (second.name(), plan::OTHER_NODE_IP, plan::OTHER_NODE_IP_V6);
    vec![
        format!("link add {link} type veth peer name eth0 netns {peer}"),
        format!("link set {link} up"),
        format!("address add {}/32 dev {link}", plan::NODE_IP),
        format!("address add {}/128 dev {link} nodad", plan::NODE_IP_V6),
        format!("route add {other}/32 dev {link} src {}", plan::NODE_IP),
        format!(
            "route add {other_v6}/128 dev {link} src {}",
            plan::NODE_IP_V6
        ),
        format!(
            "route add {} via {other} dev {link}",
            plan::OTHER_NODE_POD_CIDR
        ),
        format!(
            "route add {} via {other_v6} dev {link}",
            plan::OTHER_NODE_POD_CIDR_V6
        ),
    ]
}

/// The second node: its address on `eth0`, a host route to the proxy's
/// node, the proxy's node's pod range via the proxy's node, and one routed
/// veth per pod. Deliberately no default route and no route to the node
/// network's clients: a pod reply to a client address is dropped here.
fn second_node_commands(pods: &[&Host]) -> Vec<String> {
    let (node, node_v6) = (plan::NODE_IP, plan::NODE_IP_V6);
    let (own, own_v6) = (plan::OTHER_NODE_IP, plan::OTHER_NODE_IP_V6);
    let mut commands = vec![
        "link set eth0 up".to_owned(),
        format!("address add {own}/32 dev eth0"),
        format!("address add {own_v6}/128 dev eth0 nodad"),
        format!("route add {node}/32 dev eth0 src {own}"),
        format!("route add {node_v6}/128 dev eth0 src {own_v6}"),
        format!("route add {} via {node} dev eth0", plan::NODE_POD_CIDR),
        format!(
            "route add {} via {node_v6} dev eth0",
            plan::NODE_POD_CIDR_V6
        ),
    ];
    for pod in pods {
        commands.extend(pod_link_commands(pod, (own, own_v6)));
    }
    commands
}

/// A client: addresses on the node network, routes to services, pods and
/// external IPs via the node.
fn client_commands(client: &Host) -> Vec<String> {
    let via_node = [
        plan::SERVICE_CIDR.to_string(),
        plan::POD_CIDR.to_string(),
        plan::EXTERNAL_CIDR.to_string(),
    ];
    let via_node_v6 = [
        plan::SERVICE_CIDR_V6.to_string(),
        plan::POD_CIDR_V6.to_string(),
        plan::EXTERNAL_CIDR_V6.to_string(),
    ];
    let mut commands = vec![
        "link set eth0 up".to_owned(),
        format!("address add {}/24 dev eth0", client.ip),
        format!("address add {}/64 dev eth0 nodad", client.ip_v6),
    ];
    commands.extend(
        via_node
            .iter()
            .map(|net| format!("route add {net} via {}", plan::NODE_IP)),
    );
    commands.extend(
        via_node_v6
            .iter()
            .map(|net| format!("route add {net} via {}", plan::NODE_IP_V6)),
    );
    commands
}

/// A pod: its addresses and a default route via the node's gateway.
pub(super) fn pod_commands(pod: &Host) -> Vec<String> {
    vec![
        "link set eth0 up".to_owned(),
        format!("address add {}/32 dev eth0", pod.ip),
        format!("address add {}/128 dev eth0 nodad", pod.ip_v6),
        format!("route add {POD_GATEWAY}/32 dev eth0 scope link"),
        format!("route add default via {POD_GATEWAY} dev eth0"),
        format!("route add ::/0 via {POD_GATEWAY_V6} dev eth0"),
    ]
}

/// Waits until every link of `links` in `netns` reports `UP` (carrier
/// from the other end), so the first probe does not race the link state.
pub(super) fn wait_for_links(netns: &Netns, links: &[&str]) -> Result<(), NetnsError> {
    let mut last = Ok(String::new());
    let all_up = wait_until(LINK_UP_TIMEOUT, || {
        last = netns.ip(&["-brief", "link", "show"]);
        last.as_ref()
            .is_ok_and(|listing| links.iter().all(|link| link_is_up(listing, link)))
    });
    match last {
        Err(error) => Err(error),
        Ok(_) if all_up => Ok(()),
        Ok(listing) => Err(NetnsError::Command {
            command: format!("ip -n {} -brief link show", netns.name()),
            status: std::process::ExitStatus::default(),
            stderr: format!("links not UP within {LINK_UP_TIMEOUT:?}:\n{listing}"),
        }),
    }
}

/// Whether `ip -brief link` output shows `link` (possibly `link@peer`) as
/// `UP`.
fn link_is_up(listing: &str, link: &str) -> bool {
    listing.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let name = fields.next().unwrap_or_default();
        let name = name.split('@').next().unwrap_or_default();
        name == link && fields.next() == Some("UP")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_up_only_with_carrier() {
        let listing = "lo UNKNOWN 00:00\n\
                       cl0@if2 UP 02:01 <BROADCAST,UP,LOWER_UP>\n\
                       pod0@if2 LOWERLAYERDOWN 02:02 <NO-CARRIER,UP>\n";
        assert!(link_is_up(listing, "cl0"));
        assert!(!link_is_up(listing, "pod0"));
        assert!(!link_is_up(listing, "pod1"));
    }

    #[test]
    fn duplicate_and_reserved_names_are_rejected() {
        let duplicate = Topology::builder()
            .pod("ep1", |p| p.tcp(80))
            .client("ep1")
            .validate();
        assert!(matches!(duplicate, Err(NetnsError::InvalidName { name, .. }) if name == "ep1"));
        let reserved = Topology::builder().pod("node", |p| p).validate();
        assert!(reserved.is_err());
    }
}
