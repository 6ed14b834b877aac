#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const PROC_MODULES_ALL: &str = "\
ip_vs_sh 16384 0 - Live 0x0000000000000000
ip_vs_wrr 16384 0 - Live 0x0000000000000000
ip_vs_rr 16384 0 - Live 0x0000000000000000
ip_vs 188416 6 ip_vs_sh,ip_vs_wrr,ip_vs_rr, Live 0x0000000000000000
nf_conntrack 172032 1 ip_vs, Live 0x0000000000000000
";

fn files(osrelease: &str, proc_modules: Option<&str>) -> KernelFiles {
    KernelFiles {
        osrelease: format!("{osrelease}\n"),
        proc_modules: proc_modules.map(str::to_owned),
        modules_builtin: None,
        boot_config: None,
    }
}

/// A loader that loads nothing and remembers what it was asked for.
#[derive(Default)]
struct Recorder {
    asked: Vec<String>,
    loads: Vec<&'static str>,
}

impl ModuleLoader for Recorder {
    fn load(&mut self, module: &str) -> bool {
        self.asked.push(module.to_owned());
        self.loads.contains(&module)
    }
}

#[track_caller]
fn missing(result: Result<KernelVersion, CapabilityError>) -> Vec<String> {
    match result {
        Err(CapabilityError::MissingModules { modules, .. }) => modules,
        other => panic!("expected missing modules, got {other:?}"),
    }
}

#[test]
fn versions_parse_from_osrelease() {
    assert_eq!(
        KernelVersion::parse("6.1.0-27-amd64"),
        Some(KernelVersion {
            major: 6,
            minor: 1,
            patch: 0
        })
    );
    assert_eq!(
        KernelVersion::parse("4.18\n").map(|v| v.to_string()),
        Some("4.18.0".into())
    );
    assert_eq!(KernelVersion::parse("6.18.44-fc-v657").unwrap().minor, 18);
    assert_eq!(KernelVersion::parse("linux"), None);
    assert_eq!(KernelVersion::parse("6"), None);
}

#[test]
fn the_conntrack_module_depends_on_the_kernel_version() {
    let old = KernelVersion::parse("4.18.0").unwrap();
    let new = KernelVersion::parse("4.19.0").unwrap();
    assert_eq!(
        required_modules(old, "rr"),
        [
            "ip_vs",
            "ip_vs_rr",
            "ip_vs_wrr",
            "ip_vs_sh",
            "nf_conntrack_ipv4"
        ]
    );
    assert_eq!(
        required_modules(new, "lc"),
        [
            "ip_vs",
            "ip_vs_rr",
            "ip_vs_wrr",
            "ip_vs_sh",
            "nf_conntrack",
            "ip_vs_lc"
        ]
    );
}

#[test]
fn everything_loaded_passes_without_modprobe() {
    let mut loader = Recorder::default();
    let version = check_modules(
        &files("6.1.0-27-amd64", Some(PROC_MODULES_ALL)),
        "",
        &mut loader,
    )
    .expect("all modules are loaded");
    assert_eq!(version.major, 6);
    assert!(loader.asked.is_empty(), "modprobe ran: {:?}", loader.asked);
}

#[test]
fn a_missing_module_is_loaded_with_modprobe_first() {
    let loaded = "ip_vs 1 0 - Live 0\nnf_conntrack 1 0 - Live 0\n";
    let mut loader = Recorder {
        loads: vec!["ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"],
        ..Recorder::default()
    };
    check_modules(&files("6.1.0", Some(loaded)), "rr", &mut loader).expect("modprobe loaded them");
    assert_eq!(loader.asked, ["ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"]);
}

#[test]
fn the_error_names_what_modprobe_could_not_load_in_upstream_words() {
    let loaded = "ip_vs 1 0 - Live 0\n";
    let mut loader = Recorder {
        loads: vec!["ip_vs_rr"],
        ..Recorder::default()
    };
    let error = check_modules(&files("6.1.0", Some(loaded)), "lc", &mut loader).unwrap_err();
    assert_eq!(
        error.to_string(),
        "IPVS proxier will not be used because the following required kernel modules are not loaded: [ip_vs_wrr ip_vs_sh nf_conntrack ip_vs_lc]"
    );
}

#[test]
fn built_in_modules_count_as_present() {
    let mut kernel = files("6.1.0", Some("nf_conntrack 1 0 - Live 0\n"));
    kernel.modules_builtin = Some(
        "kernel/net/netfilter/ipvs/ip_vs.ko\nkernel/net/netfilter/ipvs/ip_vs_rr.ko\n\
         kernel/net/netfilter/ipvs/ip_vs_wrr.ko\nkernel/net/netfilter/ipvs/ip_vs_sh.ko\n"
            .into(),
    );
    let mut loader = Recorder::default();
    check_modules(&kernel, "rr", &mut loader).expect("built in");
    assert!(loader.asked.is_empty());
    // ip_vs.ko must not be mistaken for ip_vs_mh.ko's prefix or the reverse.
    assert_eq!(
        missing(check_modules(&kernel, "mh", &mut Recorder::default())),
        ["ip_vs_mh"]
    );
}

#[test]
fn a_kernel_without_loadable_modules_is_judged_by_its_config() {
    let mut kernel = files("6.1.0", None);
    kernel.boot_config = Some(
        "CONFIG_IP_VS=y\nCONFIG_IP_VS_RR=y\nCONFIG_IP_VS_WRR=y\nCONFIG_IP_VS_SH=m\n\
         CONFIG_NF_CONNTRACK=y\n# CONFIG_IP_VS_MH is not set\n"
            .into(),
    );
    let mut loader = Recorder {
        loads: vec!["ip_vs_sh"],
        ..Recorder::default()
    };
    let error = check_modules(&kernel, "rr", &mut loader).unwrap_err();
    assert_eq!(missing(Err(error.clone())), ["ip_vs_sh"]);
    assert!(
        loader.asked.is_empty(),
        "no modprobe without module support"
    );
    assert!(
        error.to_string().contains("does not build them in"),
        "{error}"
    );
}

#[test]
fn without_any_module_listing_every_module_is_named() {
    let error = check_modules(
        &files("6.18.44-fc-v657", None),
        "",
        &mut Recorder::default(),
    )
    .unwrap_err();
    assert_eq!(
        missing(Err(error.clone())),
        ["ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack"]
    );
    let text = error.to_string();
    assert!(text.starts_with("IPVS proxier will not be used because the following required kernel modules are not loaded: [ip_vs ip_vs_rr"), "{text}");
    assert!(text.contains("/boot/config-6.18.44-fc-v657"), "{text}");
}

#[test]
fn dashes_and_underscores_name_the_same_module() {
    let loaded = PROC_MODULES_ALL.replace("nf_conntrack", "nf-conntrack");
    check_modules(&files("6.1.0", Some(&loaded)), "", &mut Recorder::default())
        .expect("nf-conntrack is nf_conntrack");
}

#[test]
fn an_unknown_scheduler_or_version_is_a_clear_error() {
    let error = check_modules(
        &files("6.1.0", Some(PROC_MODULES_ALL)),
        "fastest",
        &mut Recorder::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("ipvs.scheduler"), "{error}");
    assert!(error.to_string().contains("\"fastest\""), "{error}");
    let error = check_modules(
        &files("unknown", Some(PROC_MODULES_ALL)),
        "",
        &mut Recorder::default(),
    )
    .unwrap_err();
    assert!(
        matches!(error, CapabilityError::KernelVersion { .. }),
        "{error}"
    );
}

#[test]
fn ipset_must_speak_protocol_six_or_later() {
    assert!(check_ipset_version(6).is_ok());
    assert!(check_ipset_version(7).is_ok());
    assert_eq!(
        check_ipset_version(5).unwrap_err().to_string(),
        "ipset version: 5 is less than min required version: 6.0"
    );
}

#[test]
fn the_host_wrapper_reads_files_under_its_root() {
    let root = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = root.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("proc/sys/kernel/osrelease", "6.1.0-27-amd64\n");
    write("proc/modules", "nf_conntrack 1 0 - Live 0\n");
    write(
        "lib/modules/6.1.0-27-amd64/modules.builtin",
        "kernel/net/netfilter/ipvs/ip_vs.ko\n",
    );
    let host = HostKernel::with_root(root.path()).without_modprobe();
    let read = host.read_files().unwrap();
    assert!(read.modules_builtin.is_some());
    assert_eq!(read.boot_config, None);
    assert_eq!(
        missing(host.check_modules("rr")),
        ["ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"]
    );
}

/// The machine these tests run on: where IPVS is missing the real check
/// names the modules (the VM harness runs this on a kernel that has them).
#[test]
fn the_real_host_check_names_missing_modules_or_passes() {
    let host = HostKernel::new().without_modprobe();
    let has_ipvs = Path::new("/proc/net/ip_vs").exists();
    match host.check_modules("") {
        Ok(_) => assert!(has_ipvs, "the check passed but /proc/net/ip_vs is absent"),
        Err(CapabilityError::MissingModules { modules, .. }) => {
            assert!(!modules.is_empty());
            if !has_ipvs {
                assert!(modules.contains(&"ip_vs".to_owned()), "{modules:?}");
            }
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}
