//! PF-side VF attributes (what `ip link set PF vf N ...` sets): the values,
//! one change, and the whole state read back from the PF.

use kroce_contracts::mac::Mac;
use serde::{Deserialize, Serialize};
use std::fmt;

/// VLAN tag protocol of a VF VLAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum VlanProto {
    #[default]
    #[serde(rename = "802.1Q")]
    Dot1Q,
    #[serde(rename = "802.1ad")]
    Dot1Ad,
}

impl VlanProto {
    /// The ethertype, as the kernel stores it (big endian on the wire).
    pub fn ethertype(&self) -> u16 {
        match self {
            VlanProto::Dot1Q => 0x8100,
            VlanProto::Dot1Ad => 0x88a8,
        }
    }

    pub fn from_ethertype(t: u16) -> Option<VlanProto> {
        match t {
            0x8100 => Some(VlanProto::Dot1Q),
            0x88a8 => Some(VlanProto::Dot1Ad),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Option<VlanProto> {
        match s.to_ascii_lowercase().as_str() {
            "802.1q" => Some(VlanProto::Dot1Q),
            "802.1ad" => Some(VlanProto::Dot1Ad),
            _ => None,
        }
    }
}

impl fmt::Display for VlanProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VlanProto::Dot1Q => "802.1Q",
            VlanProto::Dot1Ad => "802.1ad",
        })
    }
}

/// `IFLA_VF_LINK_STATE_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    #[default]
    Auto,
    Enable,
    Disable,
}

impl LinkState {
    pub fn as_u32(&self) -> u32 {
        match self {
            LinkState::Auto => 0,
            LinkState::Enable => 1,
            LinkState::Disable => 2,
        }
    }

    pub fn from_u32(v: u32) -> Option<LinkState> {
        match v {
            0 => Some(LinkState::Auto),
            1 => Some(LinkState::Enable),
            2 => Some(LinkState::Disable),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Option<LinkState> {
        match s {
            "auto" => Some(LinkState::Auto),
            "enable" => Some(LinkState::Enable),
            "disable" => Some(LinkState::Disable),
            _ => None,
        }
    }
}

/// One PF-side change to a VF. Each is sent as its own netlink request so a
/// failure leaves a known set applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum VfSetting {
    Mac {
        mac: Mac,
    },
    Vlan {
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    },
    /// Mbps; 0 means no limit.
    Rate {
        min: u32,
        max: u32,
    },
    Spoofchk {
        on: bool,
    },
    Trust {
        on: bool,
    },
    LinkState {
        state: LinkState,
    },
}

impl VfSetting {
    pub fn name(&self) -> &'static str {
        match self {
            VfSetting::Mac { .. } => "mac",
            VfSetting::Vlan { .. } => "vlan",
            VfSetting::Rate { .. } => "rate",
            VfSetting::Spoofchk { .. } => "spoofchk",
            VfSetting::Trust { .. } => "trust",
            VfSetting::LinkState { .. } => "link_state",
        }
    }

    /// The same kind of setting with the value `state` holds, to restore it.
    /// `None` when the PF never reported that attribute.
    pub fn original_in(&self, state: &VfState) -> Option<VfSetting> {
        match self {
            VfSetting::Mac { .. } => Some(VfSetting::Mac { mac: state.mac }),
            VfSetting::Vlan { .. } => Some(VfSetting::Vlan {
                vlan: state.vlan,
                qos: state.qos,
                proto: state.proto,
            }),
            VfSetting::Rate { .. } => Some(VfSetting::Rate {
                min: state.min_tx_rate,
                max: state.max_tx_rate,
            }),
            VfSetting::Spoofchk { .. } => state.spoofchk.map(|on| VfSetting::Spoofchk { on }),
            VfSetting::Trust { .. } => state.trust.map(|on| VfSetting::Trust { on }),
            VfSetting::LinkState { .. } => {
                state.link_state.map(|state| VfSetting::LinkState { state })
            }
        }
    }
}

impl fmt::Display for VfSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VfSetting::Mac { mac } => write!(f, "mac {mac}"),
            VfSetting::Vlan { vlan, qos, proto } => {
                write!(f, "vlan {vlan} qos {qos} proto {proto}")
            }
            VfSetting::Rate { min, max } => write!(f, "min_tx_rate {min} max_tx_rate {max}"),
            VfSetting::Spoofchk { on } => write!(f, "spoofchk {}", if *on { "on" } else { "off" }),
            VfSetting::Trust { on } => write!(f, "trust {}", if *on { "on" } else { "off" }),
            VfSetting::LinkState { state } => write!(
                f,
                "link_state {}",
                match state {
                    LinkState::Auto => "auto",
                    LinkState::Enable => "enable",
                    LinkState::Disable => "disable",
                }
            ),
        }
    }
}

/// A VF's PF-side state as the PF reports it (`IFLA_VF_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct VfState {
    pub mac: Mac,
    pub vlan: u16,
    pub qos: u8,
    pub proto: VlanProto,
    pub min_tx_rate: u32,
    pub max_tx_rate: u32,
    /// `None` when the driver does not report it (the kernel sends -1).
    pub spoofchk: Option<bool>,
    pub trust: Option<bool>,
    pub link_state: Option<LinkState>,
}

impl VfState {
    /// The state after applying `s` (what a recording PF does).
    pub fn apply(&mut self, s: &VfSetting) {
        match *s {
            VfSetting::Mac { mac } => self.mac = mac,
            VfSetting::Vlan { vlan, qos, proto } => {
                self.vlan = vlan;
                self.qos = qos;
                self.proto = proto;
            }
            VfSetting::Rate { min, max } => {
                self.min_tx_rate = min;
                self.max_tx_rate = max;
            }
            VfSetting::Spoofchk { on } => self.spoofchk = Some(on),
            VfSetting::Trust { on } => self.trust = Some(on),
            VfSetting::LinkState { state } => self.link_state = Some(state),
        }
    }
}
