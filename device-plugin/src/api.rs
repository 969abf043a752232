//! The kubelet device plugin API (v1beta1), generated from
//! `proto/deviceplugin/v1beta1/api.proto`, and its fixed strings.

#![allow(missing_debug_implementations, clippy::all, clippy::pedantic)]

tonic::include_proto!("v1beta1");

/// The API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket, inside the kubelet plugin dir.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// The bytes on the wire, by hand from the kubelet's field numbers: a
/// renumbered field in `api.proto` breaks these.
#[cfg(test)]
mod wire_tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_the_kubelet() {
        let reg = RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "a".into(),
            resource_name: "r/x".into(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        let mut want = vec![0x0a, 7];
        want.extend(b"v1beta1");
        want.extend([0x12, 1, b'a', 0x1a, 3, b'r', b'/', b'x', 0x22, 2, 0x10, 1]);
        assert_eq!(reg.encode_to_vec(), want);

        let dev = Device {
            id: "x".into(),
            health: "Healthy".into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        };
        let mut want = vec![0x0a, 1, b'x', 0x12, 7];
        want.extend(b"Healthy");
        want.extend([0x1a, 4, 0x0a, 2, 0x08, 1]);
        assert_eq!(dev.encode_to_vec(), want);

        let pref = ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["a".into()],
            must_include_device_i_ds: vec!["b".into()],
            allocation_size: 2,
        };
        assert_eq!(
            pref.encode_to_vec(),
            [0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 2]
        );

        let resp = ContainerAllocateResponse {
            devices: vec![DeviceSpec {
                container_path: "c".into(),
                host_path: "h".into(),
                permissions: "rw".into(),
            }],
            cdi_devices: vec![CdiDevice { name: "n".into() }],
            ..Default::default()
        };
        assert_eq!(
            resp.encode_to_vec(),
            [
                0x1a, 10, 0x0a, 1, b'c', 0x12, 1, b'h', 0x1a, 2, b'r', b'w', 0x2a, 3, 0x0a, 1, b'n'
            ]
        );
    }
}
