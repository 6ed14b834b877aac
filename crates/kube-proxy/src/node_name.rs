//! The node name the proxy runs as.

use std::fs;

/// Where Linux publishes the host name (what `hostname` prints).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// The node name: `hostnameOverride` when set, else the OS host name,
/// trimmed and lower-cased as upstream does.
pub fn node_name(hostname_override: &str) -> Result<String, std::io::Error> {
    let name = if hostname_override.trim().is_empty() {
        fs::read_to_string(HOSTNAME_FILE)?
    } else {
        hostname_override.to_owned()
    };
    Ok(normalize(&name))
}

fn normalize(name: &str) -> String {
    name.trim().to_lowercase()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn override_is_trimmed_and_lower_cased() {
        assert_eq!(node_name(" Node-1 ").unwrap(), "node-1");
    }

    #[test]
    fn without_override_the_os_host_name_is_used() {
        let os = fs::read_to_string(HOSTNAME_FILE).unwrap();
        assert_eq!(node_name("").unwrap(), os.trim().to_lowercase());
    }
}
