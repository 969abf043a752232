//! What one admission pass reads, from the shared stores.

use crate::{Context, Error};
use k8s_openapi::api::core::v1::{Node, Pod};
use kroce_operator::crd::{AdmissionGate, AdmissionSpec, RdmaNodeState};
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What one admission pass lists, inside the lock.
pub(crate) struct World {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) states: BTreeMap<String, Arc<RdmaNodeState>>,
    pub(crate) gates: BTreeMap<String, AdmissionGate>,
    pub(crate) pods: Vec<Arc<Pod>>,
}

/// Every test pod of every network: a pass covers them all.
pub(crate) async fn list_world(ctx: &Context) -> Result<World, Error> {
    let st = &ctx.stores;
    let gates = st
        .networks
        .state()
        .iter()
        .map(|n| {
            (
                n.name_any(),
                AdmissionSpec::of(n.spec.admission.as_ref()).gate,
            )
        })
        .collect();
    Ok(World {
        nodes: st.nodes(),
        states: st.states_by_name(),
        gates,
        pods: st.test_pods(""),
    })
}
