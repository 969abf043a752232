//! The kubelet's DRA plugin API (`k8s.io.kubelet.pkg.apis.dra.v1`) and plugin
//! registration API (`pluginregistration`), generated from `proto/dra/v1` and
//! `proto/pluginregistration/v1`, and their fixed strings.

#![allow(missing_debug_implementations, clippy::all, clippy::pedantic)]

/// `k8s.io.kubelet.pkg.apis.dra.v1`: the DRAPlugin service.
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `v1alpha1`: the DRAResourceHealth service (device health to pod status).
pub mod health {
    tonic::include_proto!("v1alpha1");
}

/// `pluginregistration`: the Registration service every kubelet plugin serves.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `PluginInfo.type` of a DRA plugin (pluginregistration/v1 constants.go).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The `supported_versions` entry of a plugin serving the dra/v1 DRAPlugin
/// service (`DRAPluginService` in k8s.io/kubelet/pkg/apis/dra/v1).
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";

/// The bytes on the wire, by hand from the kubelet's field numbers: a
/// renumbered field in the protos breaks these.
#[cfg(test)]
mod wire_tests {
    use super::*;
    use prost::Message;

    #[test]
    fn dra_field_numbers_match_the_kubelet() {
        let claim = dra::Claim {
            namespace: "n".into(),
            uid: "u".into(),
            name: "c".into(),
        };
        assert_eq!(
            claim.encode_to_vec(),
            [0x0a, 1, b'n', 0x12, 1, b'u', 0x1a, 1, b'c']
        );
        let dev = dra::Device {
            request_names: vec!["r".into()],
            pool_name: "p".into(),
            device_name: "d".into(),
            cdi_device_ids: vec!["x".into()],
        };
        assert_eq!(
            dev.encode_to_vec(),
            [0x0a, 1, b'r', 0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 1, b'x']
        );
        let one = dra::NodePrepareResourceResponse {
            devices: vec![],
            error: "e".into(),
        };
        assert_eq!(one.encode_to_vec(), [0x12, 1, b'e']);
        // map<string, V> = repeated entry {key = 1; value = 2} at field 1.
        let resp = dra::NodePrepareResourcesResponse {
            claims: [("k".to_string(), one)].into_iter().collect(),
        };
        assert_eq!(
            resp.encode_to_vec(),
            [0x0a, 8, 0x0a, 1, b'k', 0x12, 3, 0x12, 1, b'e']
        );
        let un = dra::NodeUnprepareResourceResponse { error: "e".into() };
        assert_eq!(un.encode_to_vec(), [0x0a, 1, b'e']);
        let req = dra::NodeUnprepareResourcesRequest {
            claims: vec![claim],
        };
        assert_eq!(req.encode_to_vec()[..2], [0x0a, 9]);
    }

    #[test]
    fn registration_field_numbers_match_the_kubelet() {
        let info = registration::PluginInfo {
            r#type: "t".into(),
            name: "n".into(),
            endpoint: "e".into(),
            supported_versions: vec!["v".into()],
        };
        assert_eq!(
            info.encode_to_vec(),
            [0x0a, 1, b't', 0x12, 1, b'n', 0x1a, 1, b'e', 0x22, 1, b'v']
        );
        let st = registration::RegistrationStatus {
            plugin_registered: true,
            error: "x".into(),
        };
        assert_eq!(st.encode_to_vec(), [0x08, 1, 0x12, 1, b'x']);
    }

    /// The kubelet calls these paths; they come from the proto packages.
    #[test]
    fn grpc_paths_match_the_kubelet() {
        assert_eq!(
            <dra::dra_plugin_server::DraPluginServer<()> as tonic::server::NamedService>::NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        );
        assert_eq!(
            <registration::registration_server::RegistrationServer<()> as tonic::server::NamedService>::NAME,
            "pluginregistration.Registration"
        );
    }
}
