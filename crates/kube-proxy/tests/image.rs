//! The container image of `scripts/image/build`: an OCI layout whose blobs
//! match their digests, a root filesystem holding the proxy and every
//! program the modes run, and the image's own proxy answering `--version`
//! and `--dry-run` inside it (chroot). The Containerfile installs the same
//! packages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kp_testkit::netns::require_root;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The words of `text` between `start` and the end of its line (or the
/// closing parenthesis), e.g. the package list of the build script.
fn words_after(text: &str, start: &str, end: char) -> Vec<String> {
    let at = text
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not found"));
    let rest = &text[at + start.len()..];
    let line = rest.split(end).next().unwrap();
    let mut words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    words.sort();
    words
}

#[test]
fn the_containerfile_installs_the_packages_the_build_script_installs() {
    let script = std::fs::read_to_string(repo().join("scripts/image/build")).unwrap();
    let containerfile =
        std::fs::read_to_string(repo().join("scripts/image/Containerfile")).unwrap();
    let built = words_after(&script, "packages=(", ')');
    let contained = words_after(&containerfile, "--no-install-recommends ", '\\');
    assert!(!built.is_empty());
    assert_eq!(built, contained);
    assert!(containerfile.contains("COPY target/release/kube-proxy /usr/local/bin/kube-proxy"));
}

fn run(command: &mut Command) -> Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The blob a descriptor names, checked against its digest and size.
fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let path = layout.join("blobs/sha256").join(hex);
    assert_eq!(sha256(&path), hex, "{digest} holds what its digest says");
    let size = std::fs::metadata(&path).unwrap().len();
    assert_eq!(Some(size), descriptor["size"].as_u64(), "{digest}: size");
    path
}

#[test]
fn the_image_holds_a_working_proxy_and_the_programs_of_every_mode() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    // The proxy this test suite built, stripped as the script strips it.
    let out = work.path().join("out");
    let build = run(Command::new(repo().join("scripts/image/build"))
        .args(["--binary", env!("CARGO_BIN_EXE_kube-proxy"), "--out"])
        .arg(&out));
    let archive = PathBuf::from(String::from_utf8_lossy(&build.stdout).trim());
    assert!(archive.starts_with(&out), "prints the archive: {archive:?}");

    // The archive is the layout, as `podman load` / `docker load` read it.
    let layout = work.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout));
    assert_eq!(
        json(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        manifests[0]["annotations"]["io.containerd.image.name"],
        format!("localhost/kube-proxy-rs:{version}")
    );
    let manifest = json(&blob(&layout, &manifests[0]));
    let config = json(&blob(&layout, &manifest["config"]));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = blob(&layout, &layers[0]);
    // Docker's index names the same blobs.
    let docker = json(&layout.join("manifest.json"));
    assert_eq!(
        docker[0]["Layers"][0],
        format!(
            "blobs/sha256/{}",
            layer.file_name().unwrap().to_string_lossy()
        )
    );

    // The uncompressed layer is the diff_id the config names.
    let tar = work.path().join("layer.tar");
    let unzipped = run(Command::new("gzip").arg("-dc").arg(&layer));
    std::fs::write(&tar, unzipped.stdout).unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!("sha256:{}", sha256(&tar))
    );
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    run(Command::new("tar")
        .args(["--numeric-owner", "-xf"])
        .arg(&tar)
        .arg("-C")
        .arg(&rootfs));

    let chroot = |args: &[&str]| {
        let out = run(Command::new("chroot").arg(&rootfs).args(args));
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    assert!(
        chroot(&["/usr/local/bin/kube-proxy", "--version"]).contains(&format!("v{version}")),
        "the image's proxy is this version"
    );
    for program in [
        &["iptables-legacy-restore", "--version"][..],
        &["iptables-nft-restore", "--version"],
        &["ip6tables-legacy-restore", "--version"],
        &["ip6tables-nft-restore", "--version"],
        &["nft", "--version"],
        &["ipset", "version"],
        &["conntrack", "--version"],
        &["ip", "-V"],
        &["modprobe", "--version"],
    ] {
        chroot(program);
    }

    // The dry run on the example manifests, from inside the image.
    let examples = rootfs.join("examples");
    std::fs::create_dir(&examples).unwrap();
    for entry in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, examples.join(path.file_name().unwrap())).unwrap();
    }
    let printed = chroot(&[
        "/usr/local/bin/kube-proxy",
        "--manifests",
        "/examples",
        "--hostname-override",
        "node-1",
        "--cluster-cidr",
        "10.244.0.0/16",
        "--dry-run",
    ]);
    assert!(
        printed.contains("*nat") && printed.contains("-A KUBE-SERVICES"),
        "{printed}"
    );
}
