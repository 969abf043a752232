//! Edge: registering a pool with the kubelet (`Registration.Register` on
//! `<kubelet-dir>/kubelet.sock`).

use crate::api::{self, registration_client::RegistrationClient};
use crate::resource_name::ResourceName;
use crate::server::plugin_options;
use crate::uds::{self, UdsError};
use std::path::Path;
use std::time::Duration;

const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error(transparent)]
    Connect(#[from] UdsError),
    #[error("kubelet refused registration of {resource}: {status}")]
    Refused {
        resource: String,
        status: tonic::Status,
    },
    #[error("registration of {resource} timed out")]
    Timeout { resource: String },
}

/// The request this plugin sends for a pool.
pub fn request(resource: &ResourceName) -> api::RegisterRequest {
    api::RegisterRequest {
        version: api::VERSION.into(),
        endpoint: resource.socket_name(),
        resource_name: resource.to_string(),
        options: Some(plugin_options()),
    }
}

pub async fn register(kubelet_socket: &Path, resource: &ResourceName) -> Result<(), RegisterError> {
    let channel = uds::connect(kubelet_socket).await?;
    let mut client = RegistrationClient::new(channel);
    match tokio::time::timeout(REGISTER_TIMEOUT, client.register(request(resource))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(RegisterError::Refused {
            resource: resource.to_string(),
            status,
        }),
        Err(_) => Err(RegisterError::Timeout {
            resource: resource.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retry warning prints this error: its cause once, not twice.
    #[tokio::test]
    async fn connect_failure_names_path_and_cause_once() {
        let d = tempfile::tempdir().unwrap();
        let res = ResourceName::parse("vf").unwrap();
        // A socket file nobody listens on: what a restarting kubelet leaves.
        let sock = d.path().join("kubelet.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let e = register(&sock, &res).await.unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "cannot connect to {}: transport error: Connection refused (os error 111)",
                sock.display()
            )
        );
        let missing = d.path().join("missing.sock");
        let e = register(&missing, &res).await.unwrap_err().to_string();
        assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
        assert!(e.contains(&missing.display().to_string()), "{e}");
    }
}
