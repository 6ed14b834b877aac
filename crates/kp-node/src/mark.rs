//! The masquerade mark: the bit of the packet mark that asks for SNAT.

use std::fmt;

use kp_config::InvalidValue;

/// The bit of the packet mark that asks for SNAT (`iptables.masqueradeBit`
/// or `nftables.masqueradeBit`, 0..=31, default 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasqueradeMark {
    bit: u8,
}

impl MasqueradeMark {
    /// Upstream's default bit, 14 (`0x00004000`).
    pub const DEFAULT_BIT: u8 = 14;

    /// The mark of `bit` as configured in `field` (unset: the default).
    pub fn from_config(bit: Option<i32>, field: &'static str) -> Result<Self, InvalidValue> {
        let bit = bit.unwrap_or(i32::from(Self::DEFAULT_BIT));
        u8::try_from(bit)
            .ok()
            .and_then(|bit| Self::new(bit).ok())
            .ok_or_else(|| InvalidValue {
                field,
                value: bit.to_string(),
                expected: "an integer from 0 to 31",
            })
    }

    /// The mark of `bit`, which must be 0..=31.
    pub fn new(bit: u8) -> Result<Self, InvalidValue> {
        if bit > 31 {
            return Err(InvalidValue {
                field: "masqueradeBit",
                value: bit.to_string(),
                expected: "an integer from 0 to 31",
            });
        }
        Ok(Self { bit })
    }

    /// The bit.
    pub fn bit(self) -> u8 {
        self.bit
    }

    /// The mark's value, `1 << bit`.
    pub fn value(self) -> u32 {
        1u32 << self.bit
    }
}

impl Default for MasqueradeMark {
    fn default() -> Self {
        Self {
            bit: Self::DEFAULT_BIT,
        }
    }
}

/// As upstream formats it (Go `%#08x`: the digits padded to 8, then `0x`),
/// e.g. `0x00004000` for bit 14.
impl fmt::Display for MasqueradeMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08x}", self.value())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_mark_is_formatted_like_upstream() {
        assert_eq!(MasqueradeMark::default().to_string(), "0x00004000");
        assert_eq!(MasqueradeMark::new(0).unwrap().to_string(), "0x00000001");
        assert_eq!(MasqueradeMark::new(31).unwrap().to_string(), "0x80000000");
    }

    #[test]
    fn a_bit_outside_0_to_31_names_its_field() {
        let error = MasqueradeMark::from_config(Some(32), "iptables.masqueradeBit").unwrap_err();
        assert_eq!(error.field, "iptables.masqueradeBit");
        assert_eq!(error.value, "32");
        assert!(MasqueradeMark::from_config(Some(-1), "nftables.masqueradeBit").is_err());
        assert_eq!(
            MasqueradeMark::from_config(None, "iptables.masqueradeBit").unwrap(),
            MasqueradeMark::default()
        );
    }
}
