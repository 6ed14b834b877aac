//! The `kube-proxy` binary ends itself when its `--config` file changes, so
//! that the DaemonSet restarts it with the new configuration: on a write to
//! the file, and on a ConfigMap update, which swaps the `..data` symlink in
//! the file's directory without touching the file the proxy read. Its rules
//! stay in place either way.
//!
//! The proxy runs in a node network namespace with `--manifests` holding one
//! Service (10.96.0.41:80) and its EndpointSlice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::builders::{endpoint_slice, service};
use kp_testkit::files::manifest;
use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

const MESSAGE: &str = "Configuration file changed; exiting so the new configuration takes effect";

/// One Service (10.96.0.41:80) and its EndpointSlice, as two manifests.
fn manifests() -> [(&'static str, String); 2] {
    let web = service("demo", "web", |s| {
        s.cluster_ip("10.96.0.41")
            .port("http", 80, "TCP")
            .target_port(8080)
    });
    let slice = endpoint_slice("demo", "web-1", "web", |e| {
        e.address_type("IPv4")
            .port("http", 8080, "TCP")
            .endpoint("10.244.1.2", |ep| ep.ready(true).node("node-1"))
    });
    [
        ("web.json", manifest(&web)),
        ("web-1.json", manifest(&slice)),
    ]
}

fn config(sync_period: &str) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: node-1
clusterCIDR: 10.244.0.0/16
metricsBindAddress: ''
healthzBindAddress: ''
iptables:
  minSyncPeriod: 0s
  syncPeriod: {sync_period}
"
    )
}

/// A ConfigMap volume as kubelet lays it out: `config.conf` →
/// `..data/config.conf`, `..data` → `..<version>`.
struct ConfigMapVolume {
    dir: tempfile::TempDir,
}

impl ConfigMapVolume {
    fn new(text: &str) -> Self {
        let volume = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        volume.publish("..2026_11_22_10_00_00.1", text);
        symlink("..data/config.conf", volume.path()).unwrap();
        volume
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("config.conf")
    }

    /// Kubelet's update: a new version directory, a new `..data_tmp` link
    /// renamed over `..data`.
    fn publish(&self, version: &str, text: &str) {
        let root = self.dir.path();
        fs::create_dir(root.join(version)).unwrap();
        fs::write(root.join(version).join("config.conf"), text).unwrap();
        symlink(version, root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    }
}

struct Proxy {
    child: NsChild,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The proxy on `config`, exiting at once when it changes.
fn start(node: &Netns, config: &Path) -> Proxy {
    start_with(node, config, "0s")
}

/// The proxy on `config`, with `--config-change-exit-jitter=jitter`.
fn start_with(node: &Netns, config: &Path, jitter: &str) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in manifests() {
        fs::write(dir.path().join(name), text).unwrap();
    }
    let log = dir.path().join("proxy.log");
    let mut command = node.command(env!("CARGO_BIN_EXE_kube-proxy"));
    command
        .args(["--config", config.to_str().unwrap()])
        .args(["--manifests", dir.path().to_str().unwrap()])
        .arg(format!("--config-change-exit-jitter={jitter}"))
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(dir.path().join("proxy.err")).unwrap());
    let child = NsChild::spawn(&mut command).unwrap();
    let proxy = Proxy {
        child,
        log,
        _dir: dir,
    };
    let programmed = wait_until(Duration::from_secs(15), || {
        node.iptables_chains("nat", "KUBE-SVC-") > 0
    });
    assert!(
        programmed,
        "the proxy programmed the Service:\n{}",
        proxy.output()
    );
    proxy
}

impl Proxy {
    /// Everything the proxy wrote to stdout and stderr.
    fn output(&self) -> String {
        let err = self.log.with_file_name("proxy.err");
        fs::read_to_string(&self.log).unwrap_or_default()
            + &fs::read_to_string(err).unwrap_or_default()
    }

    /// Waits for the proxy to exit and returns whether it exited with 0.
    fn exit(&mut self) -> Option<bool> {
        let exited = wait_until(Duration::from_secs(10), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        });
        exited.then(|| self.child.try_wait().unwrap().unwrap().success())
    }

    /// The proxy exited non-zero with its message, leaving its rules.
    fn assert_ended_by_config_change(&mut self, node: &Netns) {
        assert_eq!(
            self.exit(),
            Some(false),
            "a non-zero exit:\n{}",
            self.output()
        );
        assert!(self.output().contains(MESSAGE), "{}", self.output());
        assert!(
            node.iptables_chains("nat", "KUBE-SVC-") > 0,
            "the rules stay"
        );
    }

    fn still_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// With a jitter, the proxy waits a random time of up to it (logging the
/// wait) before it exits, and serves on meanwhile.
#[test]
fn a_changed_config_file_ends_the_proxy_within_its_jitter() {
    require_root();
    let node = Netns::create("cfgjitter").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    fs::write(&path, config("30s")).unwrap();
    let mut proxy = start_with(&node, &path, "4s");

    let changed = std::time::Instant::now();
    fs::write(&path, config("45s")).unwrap();
    proxy.assert_ended_by_config_change(&node);
    let waited = changed.elapsed();
    let output = proxy.output();
    // Four seconds at most, and the exit's own time.
    assert!(waited < Duration::from_secs(7), "{waited:?}\n{output}");
    if waited > Duration::from_millis(1500) {
        assert!(
            output.contains("exiting after a random wait"),
            "{waited:?}\n{output}"
        );
    }
}

#[test]
fn writing_the_config_file_ends_the_proxy_with_its_message() {
    require_root();
    let node = Netns::create("cfgwrite").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    fs::write(&path, config("30s")).unwrap();
    let mut proxy = start(&node, &path);

    fs::write(dir.path().join("unrelated.yaml"), "other: file\n").unwrap();
    fs::write(&path, config("45s")).unwrap();

    proxy.assert_ended_by_config_change(&node);
}

#[test]
fn a_configmap_update_ends_the_proxy_with_its_message() {
    require_root();
    let node = Netns::create("cfgswap").unwrap();
    let volume = ConfigMapVolume::new(&config("30s"));
    let mut proxy = start(&node, &volume.path());
    assert!(proxy.still_running());

    volume.publish("..2026_11_22_10_05_00.2", &config("45s"));

    proxy.assert_ended_by_config_change(&node);
}
