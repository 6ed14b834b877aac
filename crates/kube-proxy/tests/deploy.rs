//! The manifests in `deploy/`: every object parses into its Kubernetes type
//! with no field lost (the API server's strict field validation refuses an
//! unknown field), the pieces refer to each other correctly, and the
//! binary accepts the DaemonSet's command line with the ConfigMap mounted as
//! the kubelet mounts it. The least-privilege variant
//! (`deploy/least-privilege/daemonset.yaml`) is the same DaemonSet except
//! for its proxy container's capabilities (NET_ADMIN and NET_RAW, nothing
//! else, not privileged) and a privileged `--init-only` init container.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where the DaemonSet mounts the ConfigMap.
const CONFIG_MOUNT: &str = "/var/lib/kube-proxy";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every YAML document of every file in deploy/, with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value =
                Value::deserialize(document).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            if !value.is_null() {
                documents.push((name.clone(), value));
            }
        }
    }
    documents
}

/// `value` as `T`, failing when a field of the manifest is not a field of
/// `T` (it would be lost in the round trip).
fn typed<T: DeserializeOwned + Serialize>(file: &str, value: &Value) -> T {
    let object: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", kind(value)));
    let back = serde_json::to_value(&object).unwrap();
    assert_eq!(
        &back,
        value,
        "{file}: {} has fields its type does not know (or of the wrong type)",
        kind(value)
    );
    object
}

fn kind(value: &Value) -> &str {
    value["kind"].as_str().unwrap_or("<no kind>")
}

/// The objects of deploy/, one of each kind.
#[derive(Default)]
struct Deploy {
    service_account: Option<ServiceAccount>,
    binding: Option<ClusterRoleBinding>,
    config_map: Option<ConfigMap>,
    daemon_set: Option<DaemonSet>,
}

fn deploy() -> Deploy {
    let mut deploy = Deploy::default();
    for (file, value) in documents() {
        let duplicate = match kind(&value) {
            "ServiceAccount" => deploy
                .service_account
                .replace(typed(&file, &value))
                .is_some(),
            "ClusterRoleBinding" => deploy.binding.replace(typed(&file, &value)).is_some(),
            "ConfigMap" => deploy.config_map.replace(typed(&file, &value)).is_some(),
            "DaemonSet" => deploy.daemon_set.replace(typed(&file, &value)).is_some(),
            other => panic!("{file}: unexpected kind {other}"),
        };
        assert!(!duplicate, "{file}: a second {}", kind(&value));
    }
    deploy
}

fn pod_spec(daemon_set: &DaemonSet) -> &PodSpec {
    daemon_set
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

/// The least-privilege variant, `deploy/least-privilege/daemonset.yaml`:
/// one DaemonSet, checked as strictly as the objects of deploy/.
fn least_privilege_daemon_set() -> DaemonSet {
    let file = "least-privilege/daemonset.yaml";
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    let documents: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| {
            Value::deserialize(document).unwrap_or_else(|e| panic!("{file}: not YAML: {e}"))
        })
        .filter(|value| !value.is_null())
        .collect();
    assert_eq!(documents.len(), 1, "{file}: one object");
    assert_eq!(kind(&documents[0]), "DaemonSet", "{file}");
    typed(file, &documents[0])
}

fn container(daemon_set: &DaemonSet) -> &Container {
    let pod = pod_spec(daemon_set);
    assert_eq!(pod.containers.len(), 1, "one container");
    &pod.containers[0]
}

#[test]
fn every_manifest_parses_into_its_type_and_the_objects_fit_together() {
    let deploy = deploy();
    let account = deploy.service_account.expect("a ServiceAccount");
    let binding = deploy.binding.expect("a ClusterRoleBinding");
    let config_map = deploy.config_map.expect("a ConfigMap");
    let daemon_set = deploy.daemon_set.expect("a DaemonSet");

    // kubeadm's names, so that `set image` on a kubeadm cluster and
    // applying deploy/ address the same objects.
    for (what, namespace, name) in [
        (
            "ServiceAccount",
            &account.metadata.namespace,
            &account.metadata.name,
        ),
        (
            "ConfigMap",
            &config_map.metadata.namespace,
            &config_map.metadata.name,
        ),
        (
            "DaemonSet",
            &daemon_set.metadata.namespace,
            &daemon_set.metadata.name,
        ),
    ] {
        assert_eq!(namespace.as_deref(), Some("kube-system"), "{what}");
        assert_eq!(name.as_deref(), Some("kube-proxy"), "{what}");
    }
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "system:node-proxier");
    let subjects = binding.subjects.unwrap_or_default();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == "kube-proxy"
            && s.namespace.as_deref() == Some("kube-system")),
        "the binding names the ServiceAccount: {subjects:?}"
    );

    let pod = pod_spec(&daemon_set);
    assert_eq!(pod.service_account_name.as_deref(), Some("kube-proxy"));
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint, as kubeadm's: {tolerations:?}"
    );

    let container = container(&daemon_set);
    assert_eq!(
        container.command.as_ref().unwrap()[0],
        "/usr/local/bin/kube-proxy"
    );
    assert_eq!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true)
    );
    let mounts: BTreeMap<_, _> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.as_str(), (m.name.as_str(), m.read_only)))
        .collect();
    assert_eq!(mounts.get(CONFIG_MOUNT).map(|m| m.0), Some("kube-proxy"));
    assert_eq!(
        mounts.get("/run/xtables.lock").map(|m| m.0),
        Some("xtables-lock")
    );
    assert_eq!(
        mounts.get("/lib/modules"),
        Some(&("lib-modules", Some(true)))
    );
    let volumes: BTreeMap<_, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    assert_eq!(
        volumes["kube-proxy"]
            .config_map
            .as_ref()
            .map(|c| c.name.as_str()),
        Some("kube-proxy")
    );
    let lock = volumes["xtables-lock"].host_path.as_ref().unwrap();
    assert_eq!(lock.path, "/run/xtables.lock");
    assert_eq!(lock.type_.as_deref(), Some("FileOrCreate"));
    assert_eq!(
        volumes["lib-modules"]
            .host_path
            .as_ref()
            .map(|h| h.path.as_str()),
        Some("/lib/modules")
    );

    // Probes on the healthz port the config serves: the default
    // `0.0.0.0:10256`, which answers on both families (system_bind.rs), as
    // kubeadm leaves it; an IPv4 address written here would fail the
    // probes of an IPv6-only node.
    let config = config_map.data.as_ref().unwrap()["config.conf"].clone();
    assert!(!config.contains("healthzBindAddress"), "{config}");
    for (probe, path) in [
        (&container.liveness_probe, "/livez"),
        (&container.readiness_probe, "/healthz"),
    ] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::Int(10256));
    }
    let node_name = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(node_name, Some("spec.nodeName"));
}

/// `$(NAME)` in a container argument, expanded from the container's
/// environment as the kubelet does.
fn expand(argument: &str, env: &BTreeMap<&str, &str>) -> String {
    let mut out = argument.to_owned();
    for (name, value) in env {
        out = out.replace(&format!("$({name})"), value);
    }
    assert!(!out.contains("$("), "unexpanded variable in {argument}");
    out
}

#[test]
fn the_least_privilege_variant_differs_only_in_capabilities_and_its_init_container() {
    let privileged = deploy().daemon_set.unwrap();
    let variant = least_privilege_daemon_set();
    let proxy = container(&variant);

    // The proxy container: not privileged, no way to gain more, and exactly
    // NET_ADMIN and NET_RAW of all capabilities.
    let security = proxy.security_context.clone().unwrap();
    assert_eq!(security.privileged, Some(false));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    let capabilities = security.capabilities.clone().unwrap();
    assert_eq!(capabilities.drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(
        capabilities.add,
        Some(vec!["NET_ADMIN".to_owned(), "NET_RAW".to_owned()])
    );

    // The init container: the proxy's image, command line and config
    // mount, plus --init-only, privileged for /proc/sys and /sys.
    let pod = pod_spec(&variant);
    let init = pod.init_containers.as_deref().unwrap_or_default();
    assert_eq!(init.len(), 1, "one init container: {init:?}");
    let init = &init[0];
    assert_eq!(init.image, proxy.image);
    assert_eq!(init.image_pull_policy, proxy.image_pull_policy);
    let mut expected_command = proxy.command.clone().unwrap();
    expected_command.push("--init-only".to_owned());
    assert_eq!(init.command, Some(expected_command));
    assert_eq!(init.args, None);
    assert_eq!(init.env, proxy.env, "NODE_NAME for --hostname-override");
    assert_eq!(
        init.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let init_mounts: Vec<_> = init.volume_mounts.iter().flatten().collect();
    assert!(
        init_mounts
            .iter()
            .any(|m| m.mount_path == CONFIG_MOUNT && m.name == "kube-proxy"),
        "the init container reads the same ConfigMap at {CONFIG_MOUNT}: {init_mounts:?}"
    );
    for probe in [
        &init.liveness_probe,
        &init.readiness_probe,
        &init.startup_probe,
    ] {
        assert!(probe.is_none(), "an init container has no probes");
    }

    // Everything else, probes, image, volumes and all, is the privileged
    // DaemonSet's: with the init container gone and the security context
    // put back, the two are equal.
    let mut undone = variant.clone();
    let spec = undone
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap();
    spec.init_containers = None;
    spec.containers[0].security_context = container(&privileged).security_context.clone();
    assert_eq!(
        serde_json::to_value(&undone).unwrap(),
        serde_json::to_value(&privileged).unwrap(),
        "the variant is deploy/daemonset.yaml apart from the proxy's capabilities and the init container"
    );
}

#[test]
fn the_binary_accepts_the_daemonsets_command_line_and_config() {
    let deploy = deploy();
    let config_map = deploy.config_map.unwrap();
    for daemon_set in [deploy.daemon_set.unwrap(), least_privilege_daemon_set()] {
        accepts_the_command_line(&config_map, &daemon_set);
    }
}

/// Runs the proxy container's command line of `daemon_set` as a dry run on
/// the example manifests, with `config_map` mounted as the kubelet mounts it.
fn accepts_the_command_line(config_map: &ConfigMap, daemon_set: &DaemonSet) {
    let container = container(daemon_set);

    // The ConfigMap as the kubelet mounts it: one file per key. The mount
    // point is a temporary directory, so paths under it are moved there.
    let mount = tempfile::tempdir().unwrap();
    let moved = |text: &str| text.replace(CONFIG_MOUNT, mount.path().to_str().unwrap());
    for (key, value) in config_map.data.as_ref().unwrap() {
        std::fs::write(mount.path().join(key), moved(value)).unwrap();
    }
    let env = BTreeMap::from([("NODE_NAME", "node-1")]);
    let command = container.command.as_ref().unwrap();
    let args: Vec<String> = command[1..]
        .iter()
        .chain(container.args.iter().flatten())
        .map(|a| moved(&expand(a, &env)))
        .collect();

    // Only what runs it without a cluster is added.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let out = Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .args(&args)
        .arg("--manifests")
        .arg(&examples)
        .arg("--dry-run")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{args:?}\n{stderr}");
    assert!(
        stderr.contains("\"Starting kube-proxy\" node=\"node-1\" mode=\"iptables\""),
        "the hostname from the downward API and the ConfigMap's mode are used:\n{stderr}"
    );
    assert!(
        !stderr.contains("ignored") && !stderr.lines().any(|l| l.starts_with('E')),
        "no flag of the DaemonSet is ignored, nothing fails:\n{stderr}"
    );
    assert!(
        stdout.contains("*nat") && stdout.contains("-A KUBE-SERVICES"),
        "the dry run prints the rules:\n{stdout}"
    );
}
