//! Link-layer and IP address values as the CNI protocol and netlink carry
//! them: MAC addresses and `ip/prefix` pairs.

/// An Ethernet MAC address: the one grammar every kroce component parses.
pub use kroce_contracts::mac::Mac;

/// An address with its prefix length (defined in kroce-contracts, shared
/// with kroce-netlink).
pub use kroce_contracts::ip_net::IpNet;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip_and_rejects() {
        let m: Mac = "02:AB:cd:00:11:ff".parse().unwrap();
        assert_eq!(m.to_string(), "02:ab:cd:00:11:ff");
        assert!(!m.is_multicast());
        assert!("03:00:00:00:00:01".parse::<Mac>().unwrap().is_multicast());
        for bad in [
            "",
            "02:ab:cd:00:11",
            "02:ab:cd:00:11:ff:00",
            "0g:00:00:00:00:00",
            "2:0:0:0:0:0",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
    }
}
