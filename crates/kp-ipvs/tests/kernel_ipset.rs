//! ipset over nfnetlink against the host kernel (which has ipset, unlike
//! IPVS), in a network namespace the test creates and removes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kp_ipvs::netlink::ipset::IpsetNetlink;
use kp_testkit::netns::{require_root, require_tool, Netns};

#[test]
fn destroying_a_set_tells_whether_there_was_one_and_leaves_other_sets() {
    require_root();
    require_tool("ipset");
    let ns = Netns::create("ipset-destroy").unwrap();
    ns.exec_ok("ipset", &["create", "KUBE-CLUSTER-IP", "hash:ip,port"]);
    ns.exec_ok("ipset", &["create", "SOMEONE-ELSES", "hash:ip"]);

    let (first, second) = ns.run(|| {
        let mut ipset = IpsetNetlink::new();
        (
            ipset.destroy("KUBE-CLUSTER-IP").unwrap(),
            ipset.destroy("KUBE-CLUSTER-IP").unwrap(),
        )
    });

    assert!(first, "the set existed");
    assert!(!second, "there was no set left to destroy");
    assert_eq!(ns.exec_ok("ipset", &["list", "-n"]).trim(), "SOMEONE-ELSES");
}
