//! Pool gating: a node advertises a network's pools only once the NIC
//! configuration carrying them is applied (and admitted).

use kroce_operator::crd::{RdmaNodeState, RdmaNodeStateSpec};
use kroce_operator::plan::DevicePluginConfig;
use kroce_operator::plan::merge::{Desired, NodePlan};

/// The device plugin's pools a node may advertise: the desired ones once
/// the node state carrying them is applied; until then the pools it
/// advertised before, for resources still desired (a network never
/// appears before its VFs are configured, and disappears at once when it
/// goes). `None`: nothing to advertise (the key is left out).
pub fn advertised_pools(
    desired: &DevicePluginConfig,
    desired_spec: Option<&RdmaNodeStateSpec>,
    state: Option<&RdmaNodeState>,
    previous_yaml: Option<&str>,
) -> Option<DevicePluginConfig> {
    let configured =
        state.is_some_and(|s| s.in_sync() && desired_spec.is_none_or(|d| *d == s.spec));
    let cfg = if configured {
        desired.clone()
    } else {
        let previous: DevicePluginConfig = previous_yaml
            .and_then(|y| serde_saphyr::from_str(y).ok())
            .unwrap_or_default();
        DevicePluginConfig {
            pools: previous
                .pools
                .into_iter()
                .filter(|p| {
                    desired
                        .pools
                        .iter()
                        .any(|d| d.resource_name == p.resource_name)
                })
                .collect(),
        }
    };
    (!cfg.pools.is_empty()).then_some(cfg)
}

/// FNV-1a, 48 bits: a stable fingerprint (std's hasher is seeded per process).
pub(crate) fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h & 0xffff_ffff_ffff
}

/// The part of a node's spec that concerns `network`: the PFs carrying its
/// VF groups (whole, since sharing networks change them too) and its soft
/// devices. `None` when the spec does not carry the network.
pub fn config_generation(spec: &RdmaNodeStateSpec, network: &str) -> Option<u64> {
    let pfs: Vec<_> = spec
        .pfs
        .iter()
        .filter(|p| p.vf_groups.iter().any(|g| g.network == network))
        .collect();
    let soft: Vec<_> = spec
        .soft_devices
        .iter()
        .filter(|g| g.network == network)
        .collect();
    if pfs.is_empty() && soft.is_empty() {
        return None;
    }
    let text = serde_json::to_string(&(pfs, soft)).ok()?;
    Some(fingerprint(text.as_bytes()))
}

/// (config generation, in sync) of `network` on a node.
pub(crate) fn config_view(
    np: &NodePlan,
    state: Option<&RdmaNodeState>,
    network: &str,
) -> (u64, bool) {
    let Some(st) = state else {
        return (0, false);
    };
    let generation = config_generation(&st.spec, network);
    let applied = match &np.desired {
        Desired::Spec(s) => *s == st.spec,
        // A conflict keeps the last good spec: that is what runs.
        Desired::KeepLastGood => true,
        Desired::AwaitInventory => false,
    };
    (
        generation.unwrap_or(0),
        generation.is_some() && applied && st.in_sync(),
    )
}
