//! The link attributes every front end accepts, one range each: the
//! RdmaNetwork (operator), a DRA claim's opaque config and a CNI config
//! check an MTU or a VLAN against the same bounds, so a value one accepts
//! is never refused by the next.
//!
//! The kernel still judges the device (`dev_validate_mtu` against its
//! `max_mtu`, which the driver sets); these bounds only keep out values no
//! RDMA NIC takes, before any side effect.

use std::ops::RangeInclusive;

/// Smallest MTU: the kernel's `ETH_MIN_MTU` (IPv4's 68).
pub const MTU_MIN: u32 = 68;
/// Largest MTU: ConnectX's `max_mtu` (9978; mlx5e derives it from the
/// port's hardware MTU of 10240 less its framing). igb tops out at 9216 and
/// the kernel refuses more there.
pub const MTU_MAX: u32 = 9978;
/// 802.1Q: 4095 is reserved, 0 means untagged.
pub const VLAN_MAX: u16 = 4094;
/// 802.1p priority (PCP) is three bits.
pub const VLAN_QOS_MAX: u8 = 7;

pub const MTU_RANGE: RangeInclusive<u32> = MTU_MIN..=MTU_MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_the_common_values_and_refuse_the_reserved_ones() {
        for mtu in [1280, 1500, 4200, 9000, 9216] {
            assert!(MTU_RANGE.contains(&mtu), "{mtu}");
        }
        assert!(!MTU_RANGE.contains(&(MTU_MIN - 1)));
        assert!(!MTU_RANGE.contains(&(MTU_MAX + 1)));
        assert_eq!(VLAN_MAX + 1, 4095, "4095 is reserved by 802.1Q");
        assert_eq!(u32::from(VLAN_QOS_MAX) + 1, 1 << 3);
    }
}
