//! ADD as data: from a validated config, the resolved VF and the host's RDMA
//! netns mode, the list of changes to make, in order. Pure.

use crate::addr::Mac;
use crate::config::{NetConf, RdmaPolicy};
use crate::memlock::Memlock;
use crate::protocol::{CniError, code};
use crate::rdma::RdmaError;
use crate::vf::{Target, VfTarget};
use kroce_netlink::rdma::RdmaNetnsMode;
use kroce_netlink::vf_attrs::{VfSetting, VfState, VlanProto};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPlan {
    pub vf: Target,
    pub pod_ifname: String,
    /// PF-side changes, one netlink request each, in this order.
    pub vf_settings: Vec<VfSetting>,
    pub mac: Option<Mac>,
    pub mtu: Option<u32>,
    /// The RDMA device to move into the pod netns.
    pub rdma_device: Option<String>,
    /// `rdma_device` is a soft device over the VF's netdev (this is its link
    /// type): the kernel deleted it when the netdev moved, so it is made
    /// again in the pod netns instead of moved.
    pub rdma_recreate: Option<String>,
    pub ipam: bool,
    pub memlock: Option<Memlock>,
}

/// One ADD step. Each has an undo in the release path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `vf_settings[i]` on the PF.
    VfSetting(usize),
    /// Delete the VF's alternative names (they would follow it into the pod
    /// and collide with names there; restored on release).
    DropAltnames,
    /// Move into the pod netns, renamed to CNI_IFNAME in the same request.
    MoveToPod,
    SetMac,
    SetMtu,
    LinkUp,
    MoveRdma,
    /// `rdma link add` of the soft device over the pod's netdev, from inside
    /// the pod netns; moved there when the kernel made it elsewhere.
    RecreateRdma,
    IpamAdd,
    Addresses,
    Routes,
    RecordMemlock,
}

impl AddPlan {
    pub fn steps(&self) -> Vec<Step> {
        // PF-side settings only through a PF (`plan_add` refuses them
        // for a device without one).
        let pf_side = if self.vf.vf().is_some() {
            self.vf_settings.len()
        } else {
            0
        };
        let mut s: Vec<Step> = (0..pf_side).map(Step::VfSetting).collect();
        s.push(Step::DropAltnames);
        s.push(Step::MoveToPod);
        if self.mac.is_some() {
            s.push(Step::SetMac);
        }
        if self.mtu.is_some() {
            s.push(Step::SetMtu);
        }
        s.push(Step::LinkUp);
        if self.rdma_device.is_some() {
            s.push(if self.rdma_recreate.is_some() {
                Step::RecreateRdma
            } else {
                Step::MoveRdma
            });
        }
        if self.ipam {
            s.extend([Step::IpamAdd, Step::Addresses, Step::Routes]);
        }
        if self.memlock.is_some() {
            s.push(Step::RecordMemlock);
        }
        s
    }
}

/// The PF-side settings a config asks for, in the order they are applied.
pub fn vf_settings(conf: &NetConf) -> Vec<VfSetting> {
    let a = &conf.vf;
    let mut out = Vec::new();
    if let Some(mac) = conf.mac {
        out.push(VfSetting::Mac { mac });
    }
    if let Some(vlan) = a.vlan {
        out.push(VfSetting::Vlan {
            vlan,
            qos: a.vlan_qos.unwrap_or(0),
            proto: a.vlan_proto.unwrap_or(VlanProto::Dot1Q),
        });
    }
    // The one not given is completed from the VF's state (`complete_rates`).
    if a.min_tx_rate.is_some() || a.max_tx_rate.is_some() {
        out.push(VfSetting::Rate {
            min: a.min_tx_rate.unwrap_or(0),
            max: a.max_tx_rate.unwrap_or(0),
        });
    }
    if let Some(on) = a.spoofchk {
        out.push(VfSetting::Spoofchk { on });
    }
    if let Some(on) = a.trust {
        out.push(VfSetting::Trust { on });
    }
    if let Some(state) = a.link_state {
        out.push(VfSetting::LinkState { state });
    }
    out
}

/// PF drivers whose VFs take 802.1Q VLANs only: mlx5_core's
/// `mlx5e_set_vf_vlan` answers EPROTONOSUPPORT for any other protocol,
/// after the VF settings before it were applied.
const DOT1Q_ONLY_PF_DRIVERS: &[&str] = &["mlx5_core"];

/// Refuses settings the PF's driver is known to reject, before anything is
/// changed.
fn refuse_unsupported_by_pf(settings: &[VfSetting], v: &VfTarget) -> Result<(), CniError> {
    for s in settings {
        if let VfSetting::Vlan {
            proto: VlanProto::Dot1Ad,
            ..
        } = s
            && let Some(driver) = v
                .pf_driver
                .as_deref()
                .filter(|d| DOT1Q_ONLY_PF_DRIVERS.contains(d))
        {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                format!(
                    "vlanProto \"802.1ad\" is not supported by PF {} ({}, driver {driver}): its VFs take 802.1Q VLANs only (mlx5e_set_vf_vlan answers EPROTONOSUPPORT); use vlanProto \"802.1Q\"",
                    v.pf_ifname, v.pf_pci
                ),
            ));
        }
    }
    Ok(())
}

/// The rate pair to send when `given` are the configured
/// `(min_tx_rate, max_tx_rate)` and `current` what the PF reports now:
/// IFLA_VF_RATE always carries both, so the one not given keeps its current
/// value (as `ip link set PF vf N max_tx_rate X` does). Refuses a pair with
/// max below min (max 0 is "no limit"), naming the kept value.
pub fn rate_pair(
    given: (Option<u32>, Option<u32>),
    current: (u32, u32),
) -> Result<(u32, u32), RateConflict> {
    let min = given.0.unwrap_or(current.0);
    let max = given.1.unwrap_or(current.1);
    if max != 0 && max < min {
        return Err(RateConflict {
            min,
            max,
            min_given: given.0.is_some(),
            max_given: given.1.is_some(),
        });
    }
    Ok((min, max))
}

/// A rate pair with max below min, naming the configured value and the
/// one it conflicts with (the VF's current value when not configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateConflict {
    pub min: u32,
    pub max: u32,
    pub min_given: bool,
    pub max_given: bool,
}

impl std::fmt::Display for RateConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (min, max) = (self.min, self.max);
        match (self.min_given, self.max_given) {
            (true, false) => write!(
                f,
                "min_tx_rate {min} conflicts with the VF's current max_tx_rate {max}"
            ),
            (false, true) => write!(
                f,
                "max_tx_rate {max} conflicts with the VF's current min_tx_rate {min}"
            ),
            _ => write!(f, "min_tx_rate {min} conflicts with max_tx_rate {max}"),
        }?;
        f.write_str(" (max must be 0 or at least min); give both")
    }
}

impl std::error::Error for RateConflict {}

/// `settings` with the rate pair completed from the VF's `current` state
/// (read before any change).
pub fn complete_rates(
    settings: &[VfSetting],
    conf: &NetConf,
    current: &VfState,
) -> Result<Vec<VfSetting>, CniError> {
    settings
        .iter()
        .map(|s| match s {
            VfSetting::Rate { .. } => rate_pair(
                (conf.vf.min_tx_rate, conf.vf.max_tx_rate),
                (current.min_tx_rate, current.max_tx_rate),
            )
            .map(|(min, max)| VfSetting::Rate { min, max })
            .map_err(|e| CniError::new(code::INVALID_CONFIG, e.to_string())),
            other => Ok(*other),
        })
        .collect()
}

/// Plans ADD for the device as read under its lock: [`plan_add`] with the
/// rate pair completed from `current`, the VF's PF-side state before any
/// change (`None` when not read: no PF-side setting asked for).
pub fn plan_add_on(
    conf: &NetConf,
    pod_ifname: &str,
    vf: &Target,
    rdma_mode: Option<Result<RdmaNetnsMode, RdmaError>>,
    current: Option<&VfState>,
) -> Result<(AddPlan, Vec<String>), CniError> {
    let (mut plan, warnings) = plan_add(conf, pod_ifname, vf, rdma_mode)?;
    if let Some(cur) = current {
        plan.vf_settings = complete_rates(&plan.vf_settings, conf, cur)?;
    }
    Ok((plan, warnings))
}

/// Plans ADD. `rdma_mode` is what reading the host's RDMA netns mode gave
/// (only asked when the VF has an RDMA device and policy is not `Never`).
/// Returns the plan and warnings to log.
pub fn plan_add(
    conf: &NetConf,
    pod_ifname: &str,
    vf: &Target,
    rdma_mode: Option<Result<RdmaNetnsMode, RdmaError>>,
) -> Result<(AddPlan, Vec<String>), CniError> {
    let mut warnings = Vec::new();
    let mut vf_settings = vf_settings(conf);
    if vf.vf().is_none() {
        // No PF: the MAC goes on the netdev alone. The rest the config
        // parser refuses already.
        vf_settings.retain(|s| !matches!(s, VfSetting::Mac { .. }));
    }
    if vf.vf().is_none() && !vf_settings.is_empty() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("{vf} has no PF: PF-side VF attributes cannot be set"),
        ));
    }
    if let Some(v) = vf.vf() {
        refuse_unsupported_by_pf(&vf_settings, v)?;
    }
    // A soft device (an rxe on a VF's netdev, or the soft device attached
    // by name) dies when its netdev leaves the host netns: made again, never
    // moved.
    let soft = vf.soft_link().map(|(_, ty)| ty.clone());
    if let (Some((dev, ty)), RdmaPolicy::Never) = (vf.soft_link(), conf.rdma) {
        let of = vf.vf().map(|_| format!(" of {vf}")).unwrap_or_default();
        warnings.push(format!(
            "rdma is false: the kernel deletes {ty} device {dev}{of} when its netdev leaves the host netns; DEL makes it again on the host"
        ));
    }
    let rdma_device = match (vf.rdma(), conf.rdma) {
        (_, RdmaPolicy::Never) => None,
        // Made again in the pod netns (any netns mode: it dies with the
        // move either way); without RDMA netlink it cannot be, and `auto`
        // warns as below.
        (Some(dev), _) if soft.is_some() && matches!(rdma_mode, Some(Ok(_))) => Some(dev.clone()),
        (None, RdmaPolicy::Always) => {
            return Err(CniError::new(
                code::RDMA,
                format!("rdma is true but {vf} has no RDMA device"),
            ));
        }
        (None, RdmaPolicy::Auto) => None,
        (Some(dev), policy) => match (rdma_mode, policy) {
            (Some(Ok(RdmaNetnsMode::Exclusive)), _) => Some(dev.clone()),
            (Some(Ok(RdmaNetnsMode::Shared)), RdmaPolicy::Always) => {
                return Err(CniError::new(
                    code::RDMA,
                    format!(
                        "rdma is true but the host's RDMA netns mode is shared: {dev} cannot move into the pod (set `rdma system set netns exclusive`, or rdma \"auto\")"
                    ),
                ));
            }
            (Some(Ok(RdmaNetnsMode::Shared)), _) => None,
            (Some(Err(e)), RdmaPolicy::Always) => {
                return Err(CniError::new(
                    code::RDMA,
                    format!("rdma is true but the RDMA netns mode cannot be read: {e}"),
                ));
            }
            (None, RdmaPolicy::Always) => {
                return Err(CniError::new(
                    code::RDMA,
                    "rdma is true but the RDMA netns mode was not read",
                ));
            }
            (Some(Err(e)), _) => {
                warnings.push(format!(
                    "cannot read the RDMA netns mode ({e}); RDMA device {dev} of {vf} stays in the host netns"
                ));
                None
            }
            (None, _) => None,
        },
    };
    let plan = AddPlan {
        vf: vf.clone(),
        pod_ifname: pod_ifname.to_string(),
        vf_settings,
        mac: conf.mac,
        mtu: conf.mtu,
        rdma_recreate: soft.filter(|_| rdma_device.is_some()),
        rdma_device,
        ipam: conf.ipam.is_some(),
        memlock: conf.memlock,
    };
    Ok((plan, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::CniArgs;

    fn conf(extra: serde_json::Value) -> NetConf {
        let mut c = serde_json::json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni","deviceID":"0000:3b:00.2"});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        crate::config::parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap()
    }

    fn vf(rdma: Option<&str>) -> Target {
        Target::Vf(crate::vf::VfTarget {
            pci: "0000:3b:00.2".parse().unwrap(),
            pf_pci: "0000:3b:00.0".parse().unwrap(),
            vf_index: 0,
            pf_ifname: "ens1f0".into(),
            netdev: Some("ens1f0v0".into()),
            rdma: rdma.map(str::to_string),
            rdma_soft: None,
            driver: Some("mlx5_core".into()),
            pf_driver: Some("mlx5_core".into()),
        })
    }

    /// A soft device over the VF's netdev is made again in the pod in
    /// either netns mode (the move deletes it either way); `rdma: false`
    /// warns that it is deleted.
    #[test]
    fn rxe_on_a_vf_is_recreated_not_moved() {
        let mut t = vf(Some("rxe_vf0"));
        if let Target::Vf(v) = &mut t {
            v.rdma_soft = Some("rxe".into());
        }
        for (policy, mode) in [
            ("true", RdmaNetnsMode::Shared),
            ("true", RdmaNetnsMode::Exclusive),
            ("\"auto\"", RdmaNetnsMode::Shared),
        ] {
            let c = conf(serde_json::from_str(&format!("{{\"rdma\": {policy}}}")).unwrap());
            let (p, w) = plan_add(&c, "net1", &t, Some(Ok(mode))).unwrap();
            assert!(w.is_empty(), "{w:?}");
            assert_eq!(p.rdma_device.as_deref(), Some("rxe_vf0"));
            assert_eq!(p.rdma_recreate.as_deref(), Some("rxe"));
            assert!(p.steps().contains(&Step::RecreateRdma));
            assert!(!p.steps().contains(&Step::MoveRdma));
        }
        let c = conf(serde_json::json!({"rdma": false}));
        let (p, w) = plan_add(&c, "net1", &t, None).unwrap();
        assert_eq!((p.rdma_device, p.rdma_recreate), (None, None));
        assert!(w[0].contains("rxe_vf0") && w[0].contains("DEL"), "{w:?}");
    }

    #[test]
    fn soft_device_plan() {
        let soft = Target::Soft(crate::vf::SoftTarget {
            link_type: None,
            soft_rdma: "rxe_t0".into(),
            netdev: Some("v0".into()),
        });
        let mut c = serde_json::json!({"cniVersion":"1.0.0","name":"n","type":"kroce-cni",
            "deviceID":"rxe_t0","mtu":1400,"mac":"02:00:00:00:00:09"});
        let n =
            crate::config::parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        let (p, _) = plan_add(&n, "net1", &soft, Some(Ok(RdmaNetnsMode::Exclusive))).unwrap();
        assert!(p.vf_settings.is_empty(), "{:?}", p.vf_settings);
        assert_eq!(
            p.mac.map(|m| m.to_string()).as_deref(),
            Some("02:00:00:00:00:09")
        );
        assert!(p.steps().contains(&Step::SetMac));
        assert_eq!(p.rdma_device.as_deref(), Some("rxe_t0"));
        assert_eq!(p.rdma_recreate, None, "a claim without the link type");
        assert_eq!(p.mtu, Some(1400));
        // With its link type (as resolved now): made again in the pod, in
        // either netns mode, never moved.
        let typed = Target::Soft(crate::vf::SoftTarget {
            link_type: Some("rxe".into()),
            soft_rdma: "rxe_t0".into(),
            netdev: Some("v0".into()),
        });
        for mode in [RdmaNetnsMode::Exclusive, RdmaNetnsMode::Shared] {
            let (p, w) = plan_add(&n, "net1", &typed, Some(Ok(mode))).unwrap();
            assert_eq!(p.rdma_device.as_deref(), Some("rxe_t0"), "{mode:?}");
            assert_eq!(p.rdma_recreate.as_deref(), Some("rxe"), "{mode:?}");
            assert!(p.steps().contains(&Step::RecreateRdma), "{mode:?}");
            assert!(!p.steps().contains(&Step::MoveRdma), "{mode:?}");
            assert!(w.is_empty(), "{w:?}");
        }
        // PF-side settings with a soft target are refused even past the parser.
        c["deviceID"] = "0000:3b:00.2".into();
        c.as_object_mut().unwrap().remove("mac");
        c["vlan"] = 5.into();
        let n =
            crate::config::parse(&serde_json::to_vec(&c).unwrap(), &CniArgs::default()).unwrap();
        let e = plan_add(&n, "net1", &soft, None).unwrap_err();
        assert!(e.to_string().contains("soft RDMA device rxe_t0"), "{e}");
    }

    #[test]
    fn full_plan_order() {
        let c = conf(
            serde_json::json!({"mac":"02:00:00:00:00:07","vlan":10,"vlanQoS":2,"max_tx_rate":500,
            "spoofchk":"off","trust":"on","link_state":"disable","mtu":9000,"memlock":"unlimited",
            "ipam":{"type":"host-local"}}),
        );
        let (p, w) = plan_add(
            &c,
            "net1",
            &vf(Some("mlx5_2")),
            Some(Ok(RdmaNetnsMode::Exclusive)),
        )
        .unwrap();
        assert!(w.is_empty());
        let names: Vec<&str> = p.vf_settings.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            ["mac", "vlan", "rate", "spoofchk", "trust", "link_state"]
        );
        assert_eq!(p.vf_settings[2], VfSetting::Rate { min: 0, max: 500 });
        assert_eq!(p.rdma_device.as_deref(), Some("mlx5_2"));
        let steps = p.steps();
        assert_eq!(steps.len(), 6 + 11 - 1);
        assert_eq!(steps[6], Step::DropAltnames);
        assert_eq!(*steps.last().unwrap(), Step::RecordMemlock);
    }

    #[test]
    fn rate_pair_keeps_the_one_not_given() {
        // Only max given: the current min stays (it used to be reset to 0).
        assert_eq!(rate_pair((None, Some(500)), (100, 1000)), Ok((100, 500)));
        assert_eq!(rate_pair((Some(200), None), (100, 1000)), Ok((200, 1000)));
        assert_eq!(rate_pair((Some(1), Some(2)), (100, 1000)), Ok((1, 2)));
        // max 0 is "no limit": any min goes.
        assert_eq!(rate_pair((Some(300), None), (0, 0)), Ok((300, 0)));
        assert_eq!(rate_pair((None, Some(0)), (700, 900)), Ok((700, 0)));
        let e = rate_pair((None, Some(50)), (100, 1000))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_tx_rate 50") && e.contains("current min_tx_rate 100"),
            "{e}"
        );
        let e = rate_pair((Some(2000), None), (100, 1000))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("min_tx_rate 2000") && e.contains("current max_tx_rate 1000"),
            "{e}"
        );
    }

    /// The typed conflict reads as the message it replaced.
    #[test]
    fn rate_conflict_reads_as_before() {
        let text = |given, current| rate_pair(given, current).unwrap_err().to_string();
        let old = |field: &str, value: u32, other: String| {
            format!(
                "{field} {value} conflicts with {other} (max must be 0 or at least min); give both"
            )
        };
        assert_eq!(
            text((Some(9), None), (0, 5)),
            old("min_tx_rate", 9, "the VF's current max_tx_rate 5".into())
        );
        assert_eq!(
            text((None, Some(5)), (9, 0)),
            old("max_tx_rate", 5, "the VF's current min_tx_rate 9".into())
        );
        assert_eq!(
            text((Some(9), Some(5)), (0, 0)),
            old("min_tx_rate", 9, "max_tx_rate 5".into())
        );
        assert_eq!(
            text((None, None), (9, 5)),
            old("min_tx_rate", 9, "max_tx_rate 5".into())
        );
    }

    #[test]
    fn complete_rates_reads_the_current_pair() {
        let c = conf(serde_json::json!({"max_tx_rate": 500, "spoofchk": "off"}));
        let current = VfState {
            min_tx_rate: 100,
            max_tx_rate: 1000,
            ..VfState::default()
        };
        let (p, _) = plan_add(&c, "net1", &vf(None), None).unwrap();
        let done = complete_rates(&p.vf_settings, &c, &current).unwrap();
        assert_eq!(
            done,
            vec![
                VfSetting::Rate { min: 100, max: 500 },
                VfSetting::Spoofchk { on: false }
            ]
        );
        let low = conf(serde_json::json!({"max_tx_rate": 50}));
        let (p, _) = plan_add(&low, "net1", &vf(None), None).unwrap();
        let e = complete_rates(&p.vf_settings, &low, &current).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
    }

    #[test]
    fn dot1ad_refused_on_mlx5_pf_only() {
        let c = conf(serde_json::json!({"vlan": 10, "vlanProto": "802.1ad"}));
        let e = plan_add(&c, "net1", &vf(None), None).unwrap_err();
        assert_eq!(e.code, code::UNSUPPORTED_FIELD);
        for needle in [
            "mlx5_core",
            "ens1f0",
            "0000:3b:00.0",
            "vlanProto",
            "802.1ad",
        ] {
            assert!(e.msg.contains(needle), "{needle}: {e}");
        }
        let Target::Vf(mut other) = vf(None) else {
            unreachable!()
        };
        other.pf_driver = Some("ice".into());
        let (p, _) = plan_add(&c, "net1", &Target::Vf(other.clone()), None).unwrap();
        assert_eq!(p.vf_settings.len(), 1);
        // An old claim's target without the PF driver is not refused.
        other.pf_driver = None;
        assert!(plan_add(&c, "net1", &Target::Vf(other), None).is_ok());
        let q = conf(serde_json::json!({"vlan": 10, "vlanProto": "802.1Q"}));
        assert!(plan_add(&q, "net1", &vf(None), None).is_ok());
    }

    #[test]
    fn minimal_plan_touches_no_pf() {
        let (p, _) = plan_add(&conf(serde_json::json!({})), "net1", &vf(None), None).unwrap();
        assert!(p.vf_settings.is_empty());
        assert_eq!(
            p.steps(),
            vec![Step::DropAltnames, Step::MoveToPod, Step::LinkUp]
        );
    }

    #[test]
    fn rdma_policy_table() {
        let auto = conf(serde_json::json!({}));
        let always = conf(serde_json::json!({"rdma":true}));
        let never = conf(serde_json::json!({"rdma":false}));
        let v = vf(Some("mlx5_2"));
        let shared = || Some(Ok(RdmaNetnsMode::Shared));
        // What a host without an RDMA stack answers.
        let unreadable = || {
            Some(Err(RdmaError::EnterNetns {
                netns: "host".into(),
                source: std::io::Error::other("EPROTONOSUPPORT"),
            }))
        };
        assert_eq!(
            plan_add(&auto, "n", &v, shared()).unwrap().0.rdma_device,
            None
        );
        let e = plan_add(&always, "n", &v, shared()).unwrap_err();
        assert!(e.msg.contains("shared"), "{e}");
        let (p, w) = plan_add(&auto, "n", &v, unreadable()).unwrap();
        assert_eq!(p.rdma_device, None);
        assert!(w[0].contains("mlx5_2"));
        assert!(plan_add(&always, "n", &v, unreadable()).is_err());
        assert_eq!(
            plan_add(&never, "n", &v, Some(Ok(RdmaNetnsMode::Exclusive)))
                .unwrap()
                .0
                .rdma_device,
            None
        );
        assert!(plan_add(&always, "n", &vf(None), None).is_err());
    }
}
