//! The container image of `scripts/image/build`: an OCI layout whose blobs
//! match their digests, a root filesystem holding the proxy and every
//! program the modes run, and the image's own proxy answering `--version`
//! and `--dry-run` inside it (chroot). The Containerfile installs the same
//! packages.
//!
//! And the archive on its way to a node's container runtime, with each
//! runtime's own tools:
//! - containerd: `ctr -n k8s.io images import` into a private containerd
//!   (its own root, state and socket under a temporary directory) lists the
//!   image under its name in kubelet's namespace `k8s.io`, unpacked, with
//!   the archive's manifest digest;
//! - CRI-O: `skopeo copy oci-archive:… containers-storage:…` into a private
//!   store holds the same manifest, its layer unpacked with the proxy in it;
//! - a registry: `scripts/image/push` (what `scripts/image/build --registry`
//!   runs) into Debian's `docker-registry` on the loopback of a test network
//!   namespace pushes the manifest unchanged under
//!   `HOST/PATH/kube-proxy-rs:VERSION`, and prints that reference with the
//!   digest.
//!
//! The image is built once per run of this file, into
//! `CARGO_TARGET_TMPDIR/image`, and shared by its tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use kp_testkit::netns::{require_root, wait_until, Netns, NsChild};
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

/// The archive of `scripts/image/build`, built once for all tests of this
/// file from the proxy this test suite built (stripped as the script
/// strips it).
fn built_archive() -> &'static Path {
    static ARCHIVE: OnceLock<PathBuf> = OnceLock::new();
    ARCHIVE.get_or_init(|| {
        require_root();
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image");
        let build = run(Command::new(repo().join("scripts/image/build"))
            .args(["--binary", env!("CARGO_BIN_EXE_kube-proxy"), "--out"])
            .arg(&out));
        let archive = PathBuf::from(String::from_utf8_lossy(&build.stdout).trim());
        assert!(archive.starts_with(&out), "prints the archive: {archive:?}");
        archive
    })
}

/// The image's name and the digest of its manifest, from the archive's
/// `index.json`.
fn name_and_digest(archive: &Path) -> (String, String) {
    let index = run(Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("./index.json"));
    let index: Value = serde_json::from_slice(&index.stdout).unwrap();
    let manifest = &index["manifests"][0];
    (
        manifest["annotations"]["io.containerd.image.name"]
            .as_str()
            .unwrap()
            .to_owned(),
        manifest["digest"].as_str().unwrap().to_owned(),
    )
}

/// Fails the test unless `program` runs; names the Debian package.
#[track_caller]
fn require_program(program: &str, version_arg: &str, package: &str) {
    let ran = Command::new(program)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        ran.is_ok_and(|status| status.success()),
        "this test needs `{program}`: install it with `apt-get install {package}` \
         (scripts/lib/requirements.sh lists it, so scripts/test installs it)"
    );
}

#[test]
fn the_image_holds_a_working_proxy_and_the_programs_of_every_mode() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    let archive = built_archive();

    // The archive is the layout, as `podman load` / `docker load` read it.
    let layout = work.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
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

/// A process the test started, killed when dropped (also on a failed
/// assertion).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A containerd of its own: root, state, socket and plugins under `dir`,
/// the CRI plugin and the snapshotters this machine cannot have turned off
/// (a node's containerd has CRI; importing an image does not use it).
fn private_containerd(dir: &Path) -> (Killed, PathBuf) {
    let socket = dir.join("containerd.sock");
    let config = dir.join("config.toml");
    let at = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    std::fs::write(
        &config,
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
            root = at("root"),
            state = at("state"),
            socket = socket.display(),
            opt = at("opt"),
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
    let containerd = Killed(
        Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let up = wait_until(Duration::from_secs(30), || {
        Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    assert!(
        up,
        "the private containerd did not answer on {} within 30 s; its log:\n{}",
        socket.display(),
        std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
    );
    (containerd, socket)
}

#[test]
fn ctr_imports_the_archive_into_kubelets_containerd_namespace() {
    require_root();
    require_program("containerd", "--version", "containerd");
    require_program("ctr", "--version", "containerd");
    let archive = built_archive();
    let (_, digest) = name_and_digest(archive);
    // The name deploy/'s DaemonSets ask for, with `IfNotPresent`.
    let name = format!("localhost/kube-proxy-rs:{}", env!("CARGO_PKG_VERSION"));
    let dir = tempfile::tempdir().unwrap();
    let (_containerd, socket) = private_containerd(dir.path());
    let ctr = |namespace: &str, args: &[&str]| {
        let out = run(Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", namespace])
            .args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // The command docs/OPERATIONS.md gives for a containerd node.
    let imported = ctr("k8s.io", &["images", "import", archive.to_str().unwrap()]);
    assert!(
        imported.contains(&format!("unpacking {name} ({digest})...done")),
        "the import unpacks {name} {digest}:\n{imported}"
    );

    // kubelet asks containerd for the image by this name in `k8s.io`.
    let listed = ctr("k8s.io", &["images", "ls"]);
    let line = listed
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name.as_str()))
        .unwrap_or_else(|| panic!("{name} is not listed in k8s.io:\n{listed}"));
    assert!(
        line.contains(&digest),
        "{name} has the archive's digest {digest}: {line}"
    );
    assert!(line.contains("linux/amd64"), "{line}");
    let checked = ctr("k8s.io", &["images", "check"]);
    let line = checked
        .lines()
        .find(|line| line.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} is not checked:\n{checked}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert!(
        words.contains(&"complete") && words.last() == Some(&"true"),
        "every blob is there and the image is unpacked: {line}"
    );
    // Another namespace, as `podman load` or an import without `-n k8s.io`
    // fills, is not where kubelet looks.
    let elsewhere = ctr("default", &["images", "ls", "--quiet"]);
    assert!(
        !elsewhere.contains(&name),
        "imported into k8s.io only:\n{elsewhere}"
    );
}

#[test]
fn skopeo_copies_the_archive_into_cri_os_containers_storage() {
    require_root();
    require_program("skopeo", "--version", "skopeo");
    let archive = built_archive();
    let (name, digest) = name_and_digest(archive);
    let dir = tempfile::tempdir().unwrap();
    // A private store (the vfs driver mounts nothing); on a CRI-O node the
    // reference is `containers-storage:NAME`, the store of
    // /etc/containers/storage.conf that CRI-O reads.
    let store = format!(
        "containers-storage:[vfs@{}+{}]{name}",
        dir.path().join("root").display(),
        dir.path().join("run").display()
    );
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(&store));
    let manifest = run(Command::new("skopeo").args(["inspect", "--raw", &store]));
    let held = dir.path().join("manifest.json");
    std::fs::write(&held, &manifest.stdout).unwrap();
    assert_eq!(
        format!("sha256:{}", sha256(&held)),
        digest,
        "the store holds {name} with the archive's manifest"
    );
    // The layer is unpacked in the store, as CRI-O starts a container from it.
    let layers = dir.path().join("root/vfs/dir");
    let unpacked = std::fs::read_dir(&layers)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .any(|layer| layer.join("usr/local/bin/kube-proxy").is_file());
    assert!(
        unpacked,
        "no layer under {} holds the proxy",
        layers.display()
    );
}

/// Debian's `docker-registry` on 127.0.0.1:5000 of `node`, storing under
/// `dir`; answers `/v2/` when this returns.
fn registry(node: &Netns, dir: &Path) -> NsChild {
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:5000\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let log = dir.join("registry.log");
    let mut command = node.command("docker-registry");
    command
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let registry = NsChild::spawn(&mut command).unwrap();
    let up = wait_until(Duration::from_secs(20), || {
        node.run(|| kp_testkit::http::get("127.0.0.1:5000", "/v2/"))
            .is_ok_and(|reply| reply.code == 200)
    });
    assert!(
        up,
        "the registry did not answer within 20 s; its log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    registry
}

#[test]
fn the_push_script_puts_the_archive_into_a_registry_unchanged() {
    require_root();
    require_program("skopeo", "--version", "skopeo");
    require_program("docker-registry", "--version", "docker-registry");
    let archive = built_archive();
    let (_, digest) = name_and_digest(archive);
    let version = env!("CARGO_PKG_VERSION");
    let node = Netns::create("registry").unwrap();
    node.ip(&["link", "set", "lo", "up"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _registry = registry(&node, dir.path());
    let push = repo().join("scripts/image/push");
    let push = push.to_str().unwrap();
    let archive = archive.to_str().unwrap();

    // What `scripts/image/build --registry 127.0.0.1:5000/kube-system
    // --insecure` runs after the build.
    let pushed = node.exec_ok(push, &["--insecure", archive, "127.0.0.1:5000/kube-system"]);
    let reference = format!("127.0.0.1:5000/kube-system/kube-proxy-rs:{version}");
    assert_eq!(pushed.trim(), format!("{reference}@{digest}"));
    let manifest = node.exec_ok(
        "skopeo",
        &[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{reference}"),
        ],
    );
    let held = dir.path().join("manifest.json");
    std::fs::write(&held, manifest).unwrap();
    assert_eq!(
        format!("sha256:{}", sha256(&held)),
        digest,
        "the registry serves the archive's manifest, unchanged"
    );

    // Plain HTTP without --insecure fails, and says what to do.
    let refused = node.exec(push, &[archive, "127.0.0.1:5000/kube-system"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("needs --insecure"), "{stderr}");
    // A reference with a tag of its own is refused before anything is sent.
    let tagged = node.exec(push, &[archive, "127.0.0.1:5000/kube-system:latest"]);
    let stderr = String::from_utf8_lossy(&tagged.stderr);
    assert_eq!(tagged.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("give HOST[:PORT][/PATH], without a scheme, tag or digest"),
        "{stderr}"
    );
}
