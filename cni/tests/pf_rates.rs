//! The PF's current rates decide the (min, max) pair kroce-cni sends: the
//! PF reply parser (kroce-netlink) feeding kroce-cni's plan. Moved out of
//! the codec's unit tests when the codec left kroce-cni.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kroce_cni::testing::hex;
use kroce_netlink::route::{parse_vfs, set_vf};
use kroce_netlink::vf_attrs::{VfSetting, VlanProto};

fn unhex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

/// A ConnectX PF's RTM_NEWLINK answer to `get_link_vfs` (RTEXT_FILTER_VF
/// | SKIP_STATS), written out in the order and layout of the kernel's
/// `rtnl_fill_vfinfo` (nests without NLA_F_NESTED, the legacy
/// IFLA_VF_TX_RATE before IFLA_VF_RATE, IFLA_VF_BROADCAST,
/// IFLA_VF_RSS_QUERY_EN): VF 0 with min 100 / max 1000 Mbps.
const PF_REPLY_WITH_RATES: &str = "\
    00 00 01 00 04 00 00 00 03 10 00 00 00 00 00 00 \
    0b 00 03 00 65 6e 73 31 66 30 00 00 \
    08 00 15 00 01 00 00 00 \
    c8 00 16 00 c4 00 01 00 \
    28 00 01 00 00 00 00 00 02 00 3b 00 02 42 00 00 00 00 00 00 00 00 00 00 \
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
    24 00 0d 00 ff ff ff ff ff ff 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
    00 00 00 00 00 00 00 00 00 00 00 00 \
    10 00 02 00 00 00 00 00 00 00 00 00 00 00 00 00 \
    18 00 0c 00 14 00 01 00 00 00 00 00 00 00 00 00 00 00 00 00 81 00 00 00 \
    0c 00 03 00 00 00 00 00 e8 03 00 00 \
    10 00 06 00 00 00 00 00 64 00 00 00 e8 03 00 00 \
    0c 00 04 00 00 00 00 00 01 00 00 00 \
    0c 00 05 00 00 00 00 00 00 00 00 00 \
    0c 00 07 00 00 00 00 00 00 00 00 00 \
    0c 00 09 00 00 00 00 00 00 00 00 00";

#[test]
fn current_rates_from_a_pf_reply_decide_the_pair() {
    let reply = unhex(PF_REPLY_WITH_RATES);
    let vfs = parse_vfs(&reply).unwrap();
    assert_eq!(vfs.len(), 1);
    let (vf, st) = vfs[0];
    assert_eq!(vf, 0);
    assert_eq!((st.min_tx_rate, st.max_tx_rate), (100, 1000));
    assert_eq!(st.proto, VlanProto::Dot1Q);
    // `max_tx_rate: 500` alone: the min the PF reports stays.
    let (min, max) =
        kroce_cni::plan::rate_pair((None, Some(500)), (st.min_tx_rate, st.max_tx_rate)).unwrap();
    assert_eq!(
        hex(&set_vf(4, vf, &VfSetting::Rate { min, max }).payload()[16..]),
        "18 00 16 00 14 00 01 00 10 00 06 00 00 00 00 00 64 00 00 00 f4 01 00 00"
    );
}
