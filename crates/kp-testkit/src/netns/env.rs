//! What kernel tests need from the machine, and waiting on a condition.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How often [`wait_until`] checks its condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Fails the calling test unless it runs as root with iproute2 installed.
/// Kernel tests call this first: a kernel test that cannot run fails, it is
/// never skipped quietly.
///
/// # Panics
/// With "kernel tests need root and iproute2: …" and what is missing.
#[track_caller]
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "kernel tests need root and iproute2: this test runs as uid {}; run it as root \
         (e.g. `sudo -E cargo test`) or in a container with CAP_SYS_ADMIN and CAP_NET_ADMIN",
        nix::unistd::geteuid()
    );
    let ip = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        matches!(ip, Ok(status) if status.success()),
        "kernel tests need root and iproute2: `ip -V` did not run ({ip:?}); \
         install it with `apt-get install iproute2`"
    );
}

/// Fails the calling test unless `program` is found on `PATH`; the message
/// names the Debian package that provides it.
///
/// # Panics
/// With "kernel tests need `PROGRAM` …" if it is missing.
#[track_caller]
pub fn require_tool(program: &str) {
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program)))
    });
    assert!(
        found,
        "kernel tests need `{program}`: install it with `apt-get install {}`",
        debian_package(program)
    );
}

/// Polls `condition` every 20 ms until it holds or `timeout` has passed;
/// returns whether it held. This waits on a condition with a deadline,
/// e.g. until the proxy has written its rules; it is not a sleep.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The Debian package that ships `program`.
fn debian_package(program: &str) -> &'static str {
    match program {
        "ip" | "tc" | "bridge" => "iproute2",
        "nft" => "nftables",
        "ipset" => "ipset",
        "conntrack" => "conntrack",
        "sysctl" => "procps",
        p if p.starts_with("iptables") || p.starts_with("ip6tables") => "iptables",
        _ => "the package that provides it",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_name_their_debian_package() {
        assert_eq!(debian_package("iptables-legacy-restore"), "iptables");
        assert_eq!(debian_package("ip6tables-nft-save"), "iptables");
        assert_eq!(debian_package("nft"), "nftables");
        assert_eq!(debian_package("conntrack"), "conntrack");
    }

    #[test]
    #[should_panic(expected = "apt-get install iptables")]
    fn a_missing_tool_fails_the_test() {
        require_tool("iptables-that-does-not-exist");
    }

    #[test]
    fn waiting_ends_as_soon_as_the_condition_holds() {
        let mut calls = 0;
        assert!(wait_until(Duration::from_secs(5), || {
            calls += 1;
            calls == 3
        }));
        assert_eq!(calls, 3);
    }

    #[test]
    fn waiting_gives_up_at_the_deadline() {
        assert!(!wait_until(Duration::ZERO, || false));
    }
}
