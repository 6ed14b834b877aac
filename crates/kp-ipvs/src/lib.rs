//! The IPVS backend of kube-proxy-rs (`--proxy-mode ipvs`).
//!
//! - [`capability`]: upstream's start-up check of the kernel version, the
//!   required modules and the ipset version, as a pure function over the
//!   kernel's files plus a wrapper for the real host.
//! - [`planner`]: from the service ports of one sync to the kernel state the
//!   mode wants ([`state::KernelState`]: addresses on `kube-ipvs0`, virtual
//!   servers with real servers, ipset members) and the iptables rules around
//!   it ([`rules`]).
//! - [`diff`](mod@diff): the planned state against the current one, as the shortest
//!   list of operations ([`diff::Op`]).
//! - [`kernel`]: the seam to the kernel ([`kernel::IpvsKernel`]) with an
//!   in-memory fake; [`netlink`] is the real one (IPVS over generic
//!   netlink, ipset over nfnetlink, the dummy link over rtnetlink).
//! - [`backend`]: [`IpvsBackend`], the [`kp_sync::Backend`] of the mode;
//!   [`refused`] names the Services whose operations the kernel refused.
//! - [`trace`]: follows a new connection through the live kernel state
//!   (iptables rules, ipsets, IPVS) for `kube-proxy trace` and `check`.
//! - [`text`]: `ipvsadm -Ln`/`ipset list`-like text for `--dry-run`.
//! - [`cleanup`](mod@cleanup): `--cleanup`, which keeps foreign virtual servers.
//! - [`setup`]: what the binary calls ([`setup::check_host`],
//!   [`setup::system_backend`], [`setup::cleanup`]); the binary maps the
//!   configuration to [`IpvsOptions`].

pub mod backend;
pub mod capability;
pub mod cleanup;
pub mod diff;
pub mod kernel;
pub mod netlink;
pub mod planner;
pub mod refused;
pub mod rules;
pub mod setup;
pub mod state;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod text;
pub mod trace;

pub use backend::{node_sysctls, IpvsBackend, IpvsOptions, MODE};
pub use capability::{check_modules, CapabilityError, HostKernel, KernelFiles, KernelVersion};
pub use cleanup::{cleanup_with, CleanupError, CleanupReport};
pub use diff::{diff, Op};
#[cfg(any(test, feature = "test-util"))]
pub use kernel::FakeKernel;
pub use kernel::{ApplyError, IpvsKernel, KernelError};
pub use planner::{plan, Plan, PlanInput};
pub use setup::{
    check_host, cleanup, has_leftovers, system_backend, SetupError, DEPRECATION_WARNING,
};
pub use state::{
    KernelState, ServiceKey, ServiceState, SetEntry, SetKind, VirtualServer, DUMMY_LINK,
};
