//! What every data-plane mode knows of the node it programs, decided once
//! from the configuration so the modes cannot disagree:
//!
//! - [`LocalDetector`]: how traffic from this cluster's pods is told from
//!   other traffic (`detectLocalMode`), resolved per family to a
//!   [`LocalMatch`] that each mode writes in its own rule language;
//! - [`NodePortAddresses`]: where NodePorts answer (`nodePortAddresses`);
//! - [`MasqueradeMark`]: the packet mark that asks for SNAT;
//! - [`Sysctl`] and [`SysctlSetting`]: the kernel parameters a mode needs,
//!   which each mode lists itself and the binary only applies.
//!
//! Errors are [`kp_config::InvalidValue`]s naming the configuration field.

mod detector;
mod mark;
mod node_ports;
mod sysctl;

pub use detector::{LocalDetector, LocalMatch};
pub use kp_config::InvalidValue;
pub use mark::MasqueradeMark;
pub use node_ports::NodePortAddresses;
pub use sysctl::{ensure_sysctl, MemorySysctl, ProcSysctl, Sysctl, SysctlOutcome, SysctlSetting};
