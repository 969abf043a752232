//! RDMA netlink (NETLINK_RDMA, the `nldev` client iproute2's `rdma` tool
//! speaks), hand-encoded: no crate speaks it. Constants from
//! `rdma/rdma_netlink.h`: messages carry attributes right after `nlmsghdr`
//! (no family header); the type is `(RDMA_NL_NLDEV << 10) + command`.

use crate::{
    DecodeError, MsgBuilder, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attrs, read_str, read_u32,
};

/// `NETLINK_RDMA`.
pub const NETLINK_RDMA: i32 = 20;
pub const RDMA_NL_NLDEV: u16 = 5;
pub const RDMA_NLDEV_CMD_GET: u16 = 1;
pub const RDMA_NLDEV_CMD_SET: u16 = 2;
pub const RDMA_NLDEV_CMD_NEWLINK: u16 = 3;
pub const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;
pub const RDMA_NLDEV_CMD_SYS_SET: u16 = 7;
pub const RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1;
pub const RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2;
pub const RDMA_NLDEV_ATTR_NDEV_NAME: u16 = 51;
pub const RDMA_NLDEV_ATTR_LINK_TYPE: u16 = 65;
pub const RDMA_NLDEV_SYS_ATTR_NETNS_MODE: u16 = 66;
pub const RDMA_NLDEV_NET_NS_FD: u16 = 68;

/// `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd)`.
pub const fn nldev_type(cmd: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + cmd
}

/// The host's RDMA netns mode (`rdma system show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaNetnsMode {
    /// Every RDMA device is visible in every netns; devices cannot move.
    Shared,
    /// A device lives in one netns and can be moved.
    Exclusive,
}

impl RdmaNetnsMode {
    /// `ib_devices_shared_netns` (ib_core's `netns_mode` module parameter):
    /// 1 shared, 0 exclusive.
    pub const fn kernel_value(self) -> u8 {
        match self {
            RdmaNetnsMode::Shared => 1,
            RdmaNetnsMode::Exclusive => 0,
        }
    }

    /// `rdma system show`'s word for it.
    pub const fn as_str(self) -> &'static str {
        match self {
            RdmaNetnsMode::Shared => "shared",
            RdmaNetnsMode::Exclusive => "exclusive",
        }
    }
}

impl std::fmt::Display for RdmaNetnsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub fn sys_get() -> MsgBuilder {
    MsgBuilder::new(
        nldev_type(RDMA_NLDEV_CMD_SYS_GET),
        NLM_F_REQUEST | NLM_F_ACK,
    )
}

/// `rdma system set netns exclusive|shared`: the u8 the kernel's
/// `nldev_set_sys_set_doit` hands to `rdma_compatdev_set` (0 exclusive, 1
/// shared: `ib_devices_shared_netns`). The kernel answers EBUSY while any
/// netns but the initial one exists, and changes nothing then.
pub fn sys_set_netns_mode(mode: RdmaNetnsMode) -> MsgBuilder {
    let mut b = MsgBuilder::new(
        nldev_type(RDMA_NLDEV_CMD_SYS_SET),
        NLM_F_REQUEST | NLM_F_ACK,
    );
    b.attr_u8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, mode.kernel_value());
    b
}

pub fn dump_devices() -> MsgBuilder {
    MsgBuilder::new(nldev_type(RDMA_NLDEV_CMD_GET), NLM_F_REQUEST | NLM_F_DUMP)
}

/// Moves device `index` into the netns behind `netns_fd`.
pub fn set_netns(index: u32, netns_fd: u32) -> MsgBuilder {
    let mut b = MsgBuilder::new(nldev_type(RDMA_NLDEV_CMD_SET), NLM_F_REQUEST | NLM_F_ACK);
    b.attr_u32(RDMA_NLDEV_ATTR_DEV_INDEX, index);
    b.attr_u32(RDMA_NLDEV_NET_NS_FD, netns_fd);
    b
}

/// Creates soft RDMA device `name` of `link_type` (`rxe`, `siw`) over the
/// netdev `netdev` of the sending socket's netns: `rdma link add NAME type
/// TYPE netdev NETDEV`, attributes in iproute2's order.
pub fn new_link(name: &str, link_type: &str, netdev: &str) -> MsgBuilder {
    let mut b = MsgBuilder::new(
        nldev_type(RDMA_NLDEV_CMD_NEWLINK),
        NLM_F_REQUEST | NLM_F_ACK,
    );
    b.attr_str(RDMA_NLDEV_ATTR_DEV_NAME, name)
        .attr_str(RDMA_NLDEV_ATTR_LINK_TYPE, link_type)
        .attr_str(RDMA_NLDEV_ATTR_NDEV_NAME, netdev);
    b
}

/// `(index, name)` of one device of a GET dump.
pub fn parse_device(payload: &[u8]) -> Result<(u32, String), DecodeError> {
    let mut index = None;
    let mut name = None;
    for a in attrs(payload) {
        let (ty, p) = a?;
        match ty {
            RDMA_NLDEV_ATTR_DEV_INDEX => index = read_u32(p),
            RDMA_NLDEV_ATTR_DEV_NAME => name = Some(read_str(p)),
            _ => {}
        }
    }
    match (index, name) {
        (Some(i), Some(n)) => Ok((i, n)),
        _ => Err(DecodeError("RDMA device without index or name".into())),
    }
}

/// The netns mode of a SYS_GET reply: 0 exclusive, 1 shared
/// (`ib_devices_shared_netns`).
pub fn parse_netns_mode(payload: &[u8]) -> Result<RdmaNetnsMode, DecodeError> {
    for a in attrs(payload) {
        let (ty, p) = a?;
        if ty == RDMA_NLDEV_SYS_ATTR_NETNS_MODE {
            return match p.first() {
                Some(0) => Ok(RdmaNetnsMode::Exclusive),
                Some(1) => Ok(RdmaNetnsMode::Shared),
                other => Err(DecodeError(format!("unknown RDMA netns mode {other:?}"))),
            };
        }
    }
    Err(DecodeError(
        "SYS_GET reply without RDMA_NLDEV_SYS_ATTR_NETNS_MODE".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::hex;

    #[test]
    fn set_netns_bytes() {
        let m = set_netns(3, 9);
        let full = m.finish(0x11);
        // len 32, type (5<<10)+2 = 0x1402, flags REQUEST|ACK, seq 0x11, pid 0,
        // DEV_INDEX u32 3, NET_NS_FD (68 = 0x44) u32 9
        assert_eq!(
            hex(&full),
            "20 00 00 00 02 14 05 00 11 00 00 00 00 00 00 00 \
             08 00 01 00 03 00 00 00 08 00 44 00 09 00 00 00"
        );
    }

    /// What iproute2 6.1's `rdma link add rxe_vf1 type rxe netdev net1`
    /// sends, captured with `strace -e trace=sendto -xx` (an LD_PRELOAD shim
    /// gave it a socket on a kernel without NETLINK_RDMA and answered its
    /// device dump with an empty one): the sequence number differs, the
    /// rest must not.
    #[test]
    fn new_link_bytes_match_iproute2() {
        let iproute2 = "30 00 00 00 03 14 05 00 70 e8 12 6b 00 00 00 00 \
                        0c 00 02 00 72 78 65 5f 76 66 31 00 08 00 41 00 \
                        72 78 65 00 09 00 33 00 6e 65 74 31 00 00 00 00";
        assert_eq!(
            hex(&new_link("rxe_vf1", "rxe", "net1").finish(1796401264)),
            iproute2
        );
    }

    /// What iproute2 6.1's `rdma system set netns exclusive` / `shared`
    /// sends (REQUEST|ACK, one u8 attribute 66, zero padded), captured with
    /// `strace -e trace=sendmsg,sendto -xx` on the VM tier's 7.3 kernel
    /// (e2e/vm/guest.sh writes rdma-sys-set-{exclusive,shared}.strace;
    /// e2e/tests/vm.rs compares each run's capture with this builder): the
    /// sequence number differs, the rest must not.
    #[test]
    fn sys_set_bytes_match_iproute2() {
        let exclusive = "18 00 00 00 07 14 05 00 01 00 00 00 00 00 00 00 \
                         05 00 42 00 00 00 00 00";
        assert_eq!(
            hex(&sys_set_netns_mode(RdmaNetnsMode::Exclusive).finish(1)),
            exclusive
        );
        let shared = "18 00 00 00 07 14 05 00 01 00 00 00 00 00 00 00 \
                      05 00 42 00 01 00 00 00";
        assert_eq!(
            hex(&sys_set_netns_mode(RdmaNetnsMode::Shared).finish(1)),
            shared
        );
    }

    #[test]
    fn sys_get_and_dump_headers() {
        assert_eq!(
            hex(&sys_get().finish(1)),
            "10 00 00 00 06 14 05 00 01 00 00 00 00 00 00 00"
        );
        assert_eq!(
            hex(&dump_devices().finish(2)),
            "10 00 00 00 01 14 01 03 02 00 00 00 00 00 00 00"
        );
    }

    #[test]
    fn parses_replies() {
        let mut b = MsgBuilder::new(nldev_type(RDMA_NLDEV_CMD_GET), 0);
        b.attr_u32(RDMA_NLDEV_ATTR_DEV_INDEX, 4)
            .attr_str(RDMA_NLDEV_ATTR_DEV_NAME, "mlx5_2");
        assert_eq!(
            parse_device(b.payload()).unwrap(),
            (4, "mlx5_2".to_string())
        );
        let mut s = MsgBuilder::new(nldev_type(RDMA_NLDEV_CMD_SYS_GET), 0);
        s.attr_u8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, 0);
        assert_eq!(
            parse_netns_mode(s.payload()).unwrap(),
            RdmaNetnsMode::Exclusive
        );
        let mut s = MsgBuilder::new(nldev_type(RDMA_NLDEV_CMD_SYS_GET), 0);
        s.attr_u8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, 1);
        assert_eq!(
            parse_netns_mode(s.payload()).unwrap(),
            RdmaNetnsMode::Shared
        );
        assert!(parse_netns_mode(&[]).is_err());
        assert!(parse_device(&[]).is_err());
    }
}
