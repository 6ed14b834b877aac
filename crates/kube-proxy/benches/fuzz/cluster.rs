//! Random clusters as manifests: Services, EndpointSlices and the Node,
//! mostly valid (so most objects reach the renderer) with now and then a
//! value the API server would refuse, written as YAML or JSON.

use serde_json::{json, Map, Value};

use crate::rng::Gen;

/// How often a field gets a value from its "invalid" list.
const ODD: f64 = 0.02;

const NAMESPACES: &[&str] = &["demo", "default", "kube-system", "ns-1"];
const BAD_NAMESPACES: &[&str] = &["Demo", "", "a_b", "a.b", "-x", "x-", "\u{e9}t\u{e9}"];
const NAMES: &[&str] = &["web", "api", "dns", "a", "svc-1", "shop", "x9"];
const BAD_NAMES: &[&str] = &["Web", "1abc", "a.b", "-x", "", "a b", "a\"b", "a\nb"];
const PORT_NAMES: &[&str] = &["http", "https", "dns", "metrics", "p-1"];
const BAD_PORT_NAMES: &[&str] = &["HTTP", "a_b", "toolongportname1", "-a", "a b", "\"q\""];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const BAD_PROTOCOLS: &[&str] = &["tcp", "ICMP", "", "TCP "];
const BAD_IPS: &[&str] = &[
    "10.96.0.300",
    "None",
    "",
    "::ffff:10.96.0.1",
    "010.096.000.001",
    "0.0.0.0",
    "255.255.255.255",
    "fe80::1",
    "127.0.0.1",
    "::1",
    "1.2.3",
    "10.96.0.1/32",
    "224.0.0.1",
];
const BAD_CIDRS: &[&str] = &["10.0.0.1/33", "abc", "10.0.0.0", "::/129", "", "10.0.0.1/8"];
const CIDRS: &[&str] = &[
    "192.168.99.0/24",
    "0.0.0.0/0",
    "198.51.100.7/32",
    "fd00:192:168:99::/64",
    "::/0",
    "10.244.0.0/16",
];
const ZONES: &[&str] = &["zone-a", "zone-b"];
const NODES: &[&str] = &["node-1", "node-2"];

/// A cluster as the list of its documents.
pub struct Cluster {
    docs: Vec<Value>,
}

impl Cluster {
    /// A new random cluster: 1 to 5 Services with 0 to 2 slices each, and
    /// usually this node's Node.
    pub fn random(gen: &mut Gen) -> Self {
        let mut docs = Vec::new();
        for _ in 0..1 + gen.below(5) {
            service_with_slices(gen, &mut docs);
        }
        if gen.chance(0.8) {
            docs.push(node(gen));
        }
        Self { docs }
    }

    /// One edit, as between two reads of the manifests: a Service (with its
    /// slices) added, a document replaced or removed, or endpoints changed.
    pub fn evolve(&mut self, gen: &mut Gen) {
        let len = self.docs.len();
        match gen.below(4) {
            0 => service_with_slices(gen, &mut self.docs),
            1 if len > 0 => {
                self.docs.remove(gen.below(len));
            }
            2 if len > 0 => {
                let at = gen.below(len);
                let replacement = match self.docs[at]["kind"].as_str() {
                    Some("Service") => service(gen),
                    Some("Node") => node(gen),
                    _ => self.docs[at].clone(),
                };
                self.docs[at] = replacement;
            }
            _ => self.reshuffle_endpoints(gen),
        }
    }

    fn reshuffle_endpoints(&mut self, gen: &mut Gen) {
        let slices: Vec<usize> = (0..self.docs.len())
            .filter(|&i| self.docs[i]["kind"] == "EndpointSlice")
            .collect();
        if slices.is_empty() {
            return;
        }
        let at = *gen.pick(&slices);
        let family = self.docs[at]["addressType"]
            .as_str()
            .unwrap_or("IPv4")
            .to_owned();
        self.docs[at]["endpoints"] = endpoints(gen, &family);
    }

    /// The documents as a manifest file: `(file name, text)`.
    pub fn write(&self, gen: &mut Gen) -> (&'static str, String) {
        let as_list = gen.chance(0.15);
        let list = || json!({"apiVersion": "v1", "kind": "List", "items": self.docs});
        if gen.chance(0.25) {
            let text = if as_list {
                list().to_string()
            } else {
                self.docs.iter().map(|d| format!("{d}\n")).collect()
            };
            ("fuzz.json", text)
        } else if as_list {
            (
                "fuzz.yaml",
                serde_yaml_ng::to_string(&list()).unwrap_or_default(),
            )
        } else {
            let docs: Vec<String> = self
                .docs
                .iter()
                .map(|d| serde_yaml_ng::to_string(d).unwrap_or_default())
                .collect();
            ("fuzz.yaml", docs.join("---\n"))
        }
    }
}

/// A string field: usually one of `good`, now and then one of `bad`.
fn text(gen: &mut Gen, good: &[&str], bad: &[&str]) -> Value {
    let pool = if gen.chance(ODD) { bad } else { good };
    Value::from(*gen.pick(pool))
}

fn v4(gen: &mut Gen, prefix: &str) -> String {
    format!("{prefix}.{}", gen.below(256))
}

fn v6(gen: &mut Gen, prefix: &str) -> String {
    format!("{prefix}::{:x}", 1 + gen.below(0xffff))
}

/// An address of `family` from the address plan, or a bad one.
fn address(gen: &mut Gen, family: &str, v4_prefix: &str, v6_prefix: &str) -> Value {
    if gen.chance(ODD) {
        return Value::from(*gen.pick(BAD_IPS));
    }
    Value::from(match family {
        "IPv6" => v6(gen, v6_prefix),
        _ => v4(gen, v4_prefix),
    })
}

fn port_number(gen: &mut Gen, good: &[i64]) -> Value {
    if gen.chance(ODD) {
        return gen
            .pick(&[
                json!(0),
                json!(-1),
                json!(65536),
                json!("80"),
                json!(1.5),
                json!(null),
            ])
            .clone();
    }
    if gen.chance(0.2) {
        return json!(gen.between(1, 65535));
    }
    json!(*gen.pick(good))
}

fn metadata(gen: &mut Gen, name: &Value, namespace: &Value) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), name.clone());
    if !gen.chance(0.05) {
        meta.insert("namespace".into(), namespace.clone());
    }
    Value::Object(meta)
}

fn service_with_slices(gen: &mut Gen, docs: &mut Vec<Value>) {
    let svc = service(gen);
    for i in 0..gen.below(3) {
        docs.push(slice(gen, &svc, i));
    }
    docs.push(svc);
}

fn service(gen: &mut Gen) -> Value {
    let family = if gen.chance(0.4) { "IPv6" } else { "IPv4" };
    let kind = *gen.pick(&[
        "ClusterIP",
        "NodePort",
        "LoadBalancer",
        "ClusterIP",
        "ExternalName",
    ]);
    let name = text(gen, NAMES, BAD_NAMES);
    let namespace = text(gen, NAMESPACES, BAD_NAMESPACES);
    let cluster_ip = if gen.chance(0.05) {
        json!("None")
    } else {
        address(gen, family, "10.96.0", "fd00:10:96")
    };
    let count = 1 + gen.below(3);
    let first = gen.below(PORT_NAMES.len());
    let ports: Vec<Value> = (0..count)
        .map(|i| {
            let name = if count == 1 && gen.chance(0.3) {
                None
            } else if gen.chance(ODD) {
                Some(*gen.pick(BAD_PORT_NAMES))
            } else {
                Some(PORT_NAMES[(first + i) % PORT_NAMES.len()])
            };
            service_port(gen, kind, name)
        })
        .collect();
    let mut spec = json!({"type": kind, "clusterIP": cluster_ip, "ports": ports});
    if gen.chance(0.7) {
        spec["clusterIPs"] = json!([cluster_ip]);
        spec["ipFamilies"] = json!([family]);
    }
    if kind == "ExternalName" {
        spec["externalName"] = json!("example.com");
    }
    add_external_traffic(gen, &mut spec, family);
    add_policies(gen, &mut spec);
    let mut svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": metadata(gen, &name, &namespace),
        "spec": spec,
    });
    if kind == "LoadBalancer" && gen.chance(0.8) {
        let ip = address(gen, family, "203.0.113", "fd00:203");
        svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
    }
    if gen.chance(0.1) {
        svc["metadata"]["annotations"] =
            json!({"service.kubernetes.io/topology-mode": *gen.pick(&["Auto", "auto", "Off", ""])});
    }
    svc
}

fn service_port(gen: &mut Gen, kind: &str, name: Option<&str>) -> Value {
    let mut port = json!({
        "port": port_number(gen, &[80, 443, 53, 8080, 1, 65535]),
        "targetPort": port_number(gen, &[8080, 80, 53]),
        "protocol": text(gen, PROTOCOLS, BAD_PROTOCOLS),
    });
    if let Some(name) = name {
        port["name"] = json!(name);
    }
    if kind == "NodePort" || kind == "LoadBalancer" || gen.chance(ODD) {
        port["nodePort"] = if gen.chance(ODD) {
            json!(*gen.pick(&[0, 29999, 70000, -3]))
        } else {
            json!(gen.between(30000, 32767))
        };
    }
    port
}

fn add_external_traffic(gen: &mut Gen, spec: &mut Value, family: &str) {
    if gen.chance(0.2) {
        let ips: Vec<Value> = (0..1 + gen.below(2))
            .map(|_| address(gen, family, "203.0.113", "fd00:203"))
            .collect();
        spec["externalIPs"] = Value::from(ips);
    }
    if gen.chance(0.15) {
        let ranges: Vec<Value> = (0..1 + gen.below(3))
            .map(|_| text(gen, CIDRS, BAD_CIDRS))
            .collect();
        spec["loadBalancerSourceRanges"] = Value::from(ranges);
    }
    if gen.chance(0.3) {
        spec["externalTrafficPolicy"] = text(gen, &["Local", "Cluster"], &["local", ""]);
        if spec["externalTrafficPolicy"] == "Local" && gen.chance(0.7) {
            spec["healthCheckNodePort"] = json!(gen.between(30000, 32767));
        }
    }
}

fn add_policies(gen: &mut Gen, spec: &mut Value) {
    if gen.chance(0.2) {
        spec["internalTrafficPolicy"] = text(gen, &["Local", "Cluster"], &["Remote"]);
    }
    if gen.chance(0.2) {
        spec["sessionAffinity"] = json!("ClientIP");
        let timeout = if gen.chance(ODD) {
            json!(*gen.pick(&[0, 86401, -1]))
        } else {
            json!(gen.between(1, 86400))
        };
        if gen.chance(0.7) {
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": timeout}});
        }
    }
    if gen.chance(0.1) {
        spec["trafficDistribution"] = text(gen, &["PreferClose", "PreferSameZone"], &["Nearby"]);
    }
}

fn slice(gen: &mut Gen, svc: &Value, index: usize) -> Value {
    let family = match svc["spec"]["ipFamilies"][0].as_str() {
        Some(family) if !gen.chance(0.05) => family.to_owned(),
        _ => (*gen.pick(&["IPv4", "IPv6", "IPv4", "FQDN"])).to_owned(),
    };
    let service_name = svc["metadata"]["name"].as_str().unwrap_or("web");
    let namespace = svc["metadata"]["namespace"].clone();
    let name = Value::from(format!("{service_name}-{index}{}", gen.below(10)));
    let mut meta = metadata(gen, &name, &namespace);
    meta["labels"] = json!({"kubernetes.io/service-name": service_name});
    let ports: Vec<Value> = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let mut port = json!({"port": p["targetPort"], "protocol": p["protocol"]});
            if let Some(name) = p.get("name") {
                port["name"] = name.clone();
            }
            port
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": family,
        "ports": ports,
        "endpoints": endpoints(gen, &family),
    })
}

fn endpoints(gen: &mut Gen, family: &str) -> Value {
    let list: Vec<Value> = (0..gen.below(6))
        .map(|_| {
            let mut endpoint = json!({
                "addresses": [address(gen, family, "10.244.1", "fd00:10:244:1")],
                "conditions": {
                    "ready": gen.chance(0.8),
                    "serving": gen.chance(0.9),
                    "terminating": gen.chance(0.15),
                },
            });
            if gen.chance(0.9) {
                endpoint["nodeName"] = json!(*gen.pick(NODES));
            }
            if gen.chance(0.5) {
                endpoint["zone"] = json!(*gen.pick(ZONES));
            }
            if gen.chance(0.2) {
                endpoint["hints"] = json!({
                    "forZones": [{"name": *gen.pick(ZONES)}],
                    "forNodes": [{"name": *gen.pick(NODES)}],
                });
            }
            endpoint
        })
        .collect();
    Value::from(list)
}

fn node(gen: &mut Gen) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/zone": *gen.pick(ZONES)}},
        "spec": {"podCIDRs": [text(gen, &["10.244.1.0/24", "fd00:10:244:1::/64"], BAD_CIDRS)]},
        "status": {"addresses": [
            {"type": "InternalIP", "address": address(gen, "IPv4", "192.168.99", "fd00:192:168:99")},
            {"type": "InternalIP", "address": address(gen, "IPv6", "192.168.99", "fd00:192:168:99")},
        ]},
    })
}
