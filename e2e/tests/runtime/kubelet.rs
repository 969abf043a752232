//! What the tests do over CRI, as a kubelet does it: sandboxes and
//! containers of the busybox image, and what their verbose status says.

use super::image;
use kroce_e2e::cri;
use kroce_e2e::cri::runtime_service_client::RuntimeServiceClient;
use serde_json::Value;
use std::path::Path;
use tonic::transport::Channel;

pub type Cri = RuntimeServiceClient<Channel>;

/// Pod `default/<name>` (uid `uid-<name>`), its logs under `logs/<name>`.
pub fn sandbox_config(name: &str, logs: &Path) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.join(name).to_string_lossy().into_owned(),
        linux: Some(cri::LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

/// RunPodSandbox; the sandbox ID, or the runtime's message.
pub async fn run_sandbox(cri: &mut Cri, config: &cri::PodSandboxConfig) -> Result<String, String> {
    cri.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: String::new(),
    })
    .await
    .map(|r| r.into_inner().pod_sandbox_id)
    .map_err(|e| e.message().to_owned())
}

/// The sandbox's network namespace (its name under /run/netns), from the
/// runtime spec in the verbose status, and the status.
pub async fn sandbox_netns(cri: &mut Cri, id: &str) -> (String, cri::PodSandboxStatus) {
    let st = cri
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: Value = serde_json::from_str(st.info.get("info").expect("verbose info")).unwrap();
    let path = info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .expect("sandbox netns path");
    let netns = Path::new(path)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    (netns, st.status.expect("sandbox status"))
}

/// StopPodSandbox and RemovePodSandbox; an error names the step.
pub async fn remove_sandbox(cri: &mut Cri, id: &str) -> Result<(), String> {
    cri.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .map_err(|e| format!("stop sandbox {id}: {}", e.message()))?;
    cri.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .map_err(|e| format!("remove sandbox {id}: {}", e.message()))?;
    Ok(())
}

/// Container `name` of the busybox image running `sh -c <script>`, its log
/// `<name>.log` in the pod's log dir.
pub fn container_config(name: &str, script: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image::IMAGE.into(),
        }),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// CreateContainer in sandbox `pod`; the container ID.
pub async fn create_container(
    cri: &mut Cri,
    pod: &str,
    sandbox: &cri::PodSandboxConfig,
    config: cri::ContainerConfig,
) -> Result<String, String> {
    let name = config
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    cri.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: pod.into(),
        config: Some(config),
        sandbox_config: Some(sandbox.clone()),
    })
    .await
    .map(|r| r.into_inner().container_id)
    .map_err(|e| format!("CreateContainer {name}: {}", e.message()))
}

/// The `info` of the container's verbose status (runtime spec, pid).
pub async fn container_info(cri: &mut Cri, id: &str) -> Result<Value, String> {
    let st = cri
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .map_err(|e| e.message().to_owned())?
        .into_inner();
    serde_json::from_str(st.info.get("info").ok_or("no verbose info")?).map_err(|e| e.to_string())
}

/// StopContainer at once and RemoveContainer.
pub async fn remove_container(cri: &mut Cri, id: &str) {
    cri.stop_container(cri::StopContainerRequest {
        container_id: id.into(),
        timeout: 0,
    })
    .await
    .unwrap();
    cri.remove_container(cri::RemoveContainerRequest {
        container_id: id.into(),
    })
    .await
    .unwrap();
}
