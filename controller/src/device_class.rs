//! The DeviceClass of a `frontend: dra` network (content from
//! [`kroce_operator::plan::device_class`]): applied when it differs,
//! deleted when the network leaves DRA or is deleted. Only a class
//! labelled as this network's is ever changed or deleted.

use super::sync::World;
use super::{Context, Error, MANAGER};
use k8s_openapi::api::resource::v1::DeviceClass;
use kroce_operator::crd::{Frontend, RdmaNetwork, RdmaNodeStateSpec};
use kroce_operator::names::NETWORK_LABEL;
use kroce_operator::plan::ClusterPlan;
use kroce_operator::plan::device_class::{device_class, foreign_vfs, network_devices};
use kroce_operator::plan::merge::Desired;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;

/// `Degraded` reasons of a DRA network's class.
pub(crate) const DRA_NOT_SERVED: &str = "DeviceClassApiNotServed";
pub(crate) const CLASS_TAKEN: &str = "DeviceClassNameTaken";
pub(crate) const CLASS_OVERLAP: &str = "DeviceClassOverlap";
pub(crate) const CLASS_INVALID: &str = "DeviceClassInvalid";

#[derive(Debug, Default)]
pub(crate) struct ClassOutcome {
    pub changes: Vec<String>,
    /// (reason, message) for the network's `Degraded` condition.
    pub problem: Option<(&'static str, String)>,
}

/// Each node's spec as the class must see it: the plan's where it has one,
/// else the stored one (a node in conflict keeps its last good state).
fn node_specs<'a>(world: &'a World, plan: &'a ClusterPlan) -> Vec<&'a RdmaNodeStateSpec> {
    let mut specs: BTreeMap<&str, &RdmaNodeStateSpec> = world
        .states
        .iter()
        .map(|(n, s)| (n.as_str(), &s.spec))
        .collect();
    for n in &plan.nodes {
        if let Desired::Spec(s) = &n.desired {
            specs.insert(n.node.as_str(), s);
        }
    }
    specs.into_values().collect()
}

fn is_ours(dc: &DeviceClass, network: &str) -> bool {
    dc.labels().get(NETWORK_LABEL).map(String::as_str) == Some(network)
}

fn not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// `keep`: the network is a valid DRA network (apply its class); otherwise
/// its class, if any, is deleted.
pub(crate) async fn sync(
    ctx: &Context,
    net: &RdmaNetwork,
    world: &World,
    plan: &ClusterPlan,
    keep: bool,
) -> Result<ClassOutcome, Error> {
    let name = net.name_any();
    let api: Api<DeviceClass> = Api::all(ctx.client.clone());
    let mut out = ClassOutcome::default();
    // The watch holds kroce's classes: a network's own class needs no GET,
    // and a network outside DRA with none there has nothing to delete. Only
    // a DRA network whose class is not (yet) in the store asks the API:
    // there may be a class of that name that is not ours.
    let existing = match ctx.stores.device_class(&name) {
        Some(Some(dc)) if is_ours(&dc, &name) => Ok(Some(DeviceClass::clone(&dc))),
        Some(_) if !keep => return Ok(out),
        _ => api.get_opt(&name).await,
    };
    let existing = match existing {
        Ok(e) => e,
        // Nothing serves resource.k8s.io/v1 (Kubernetes before 1.34).
        Err(e) if not_served(&e) => {
            if keep {
                out.problem = Some((
                    DRA_NOT_SERVED,
                    "frontend: dra, but the API server does not serve resource.k8s.io/v1 \
                     DeviceClasses (Kubernetes 1.34 or later is needed); no DeviceClass written"
                        .into(),
                ));
            }
            return Ok(out);
        }
        Err(e) => return Err(e.into()),
    };
    if !keep {
        if let Some(dc) = existing.filter(|dc| is_ours(dc, &name)) {
            match api.delete(&dc.name_any(), &DeleteParams::default()).await {
                Ok(_) => out.changes.push(format!("DeviceClass {name} deleted")),
                Err(e) if not_served(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(out);
    }
    if let Some(dc) = &existing
        && !is_ours(dc, &name)
    {
        out.problem = Some((
            CLASS_TAKEN,
            format!(
                "DeviceClass {name} exists and is not this network's (no {NETWORK_LABEL}={name} \
                 label): rename the network or remove that class"
            ),
        ));
        return Ok(out);
    }
    let specs = node_specs(world, plan);
    let devices = network_devices(&name, specs.iter().copied());
    let dra: std::collections::BTreeSet<String> = world
        .networks
        .iter()
        .filter(|n| n.spec.frontend == Frontend::Dra)
        .map(|n| n.name_any())
        .collect();
    let foreign = foreign_vfs(&name, &devices, specs.iter().copied(), |n| dra.contains(n));
    if !foreign.is_empty() {
        out.problem = Some((
            CLASS_OVERLAP,
            format!(
                "the DeviceClass selects VFs by PF address and VF index, and on other nodes \
                 these are another DRA network's or no network's: {}; give the networks \
                 disjoint VF ranges (DeviceClass not updated)",
                foreign.into_iter().take(3).collect::<Vec<_>>().join("; ")
            ),
        ));
        return Ok(out);
    }
    let wanted = match device_class(&name, &net.spec, &devices) {
        Ok(dc) => dc,
        Err(e) => {
            out.problem = Some((CLASS_INVALID, e.to_string()));
            return Ok(out);
        }
    };
    // Labels others added are theirs: only ours must be there.
    let same = existing.as_ref().is_some_and(|dc| {
        let (a, b) = (dc.spec.as_ref(), wanted.spec.as_ref());
        a.map(|s| (&s.selectors, &s.config)) == b.map(|s| (&s.selectors, &s.config))
            && wanted
                .labels()
                .iter()
                .all(|(k, v)| dc.labels().get(k) == Some(v))
    });
    if same {
        return Ok(out);
    }
    let body = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": wanted.metadata,
        "spec": wanted.spec,
    });
    match api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => out.changes.push(format!("DeviceClass {name} applied")),
        Err(e) if not_served(&e) => {
            out.problem = Some((
                DRA_NOT_SERVED,
                "the API server does not serve resource.k8s.io/v1 DeviceClasses (Kubernetes \
                 1.34 or later is needed)"
                    .into(),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    Ok(out)
}
