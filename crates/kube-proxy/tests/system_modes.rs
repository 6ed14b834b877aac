//! The `kube-proxy` binary choosing its mode, in a node network namespace:
//! `--proxy-mode ipvs` on a host whose kernel cannot do IPVS ends the start
//! with upstream's message naming the missing modules, and exit code 1; no
//! silent fallback to another mode, and nothing is programmed. (On a kernel
//! with IPVS the mode itself is proven by the kp-ipvs tests in the VM,
//! `scripts/ipvs-vm/run`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};

#[test]
fn ipvs_mode_on_a_kernel_without_ipvs_names_the_missing_modules_and_exits_one() {
    require_root();
    assert!(
        !std::path::Path::new("/proc/net/ip_vs").exists(),
        "this test needs a host kernel without IPVS, as the build machines have; \
         IPVS hosts are covered by scripts/ipvs-vm/run"
    );
    let node = Netns::create("mode-ipvs").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    fs::create_dir_all(&manifests).unwrap();
    let mut command = node.command(env!("CARGO_BIN_EXE_kube-proxy"));
    command
        .args(["--proxy-mode", "ipvs"])
        .args(["--manifests", manifests.to_str().unwrap()])
        .args(["--hostname-override", "node-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            File::create(dir.path().join("stderr")).unwrap(),
        ));
    let mut proxy = NsChild::spawn(&mut command).unwrap();

    let mut status = None;
    let exited = wait_until(Duration::from_secs(20), || {
        status = proxy.try_wait().unwrap();
        status.is_some()
    });
    let stderr = fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(
        exited,
        "the proxy still runs in ipvs mode; its log:\n{stderr}"
    );

    assert_eq!(status.unwrap().code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "IPVS proxier will not be used because the following required kernel modules are not loaded"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("ip_vs"), "{stderr}");
    let rules = node.exec_ok("iptables-legacy-save", &[]);
    assert!(!rules.contains("KUBE-"), "rules were written:\n{rules}");
}
