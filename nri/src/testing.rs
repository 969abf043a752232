//! A stand-in for the runtime side of NRI (containerd's / CRI-O's
//! adaptation), speaking the real wire protocol over a unix socket: it
//! accepts a plugin, answers its registration, and calls its Plugin service.
//! It can also send raw bytes to test how the plugin copes with garbage.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::mux::{self, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::proto::{PLUGIN_SERVICE, RUNTIME_SERVICE, api, envelope};
use crate::ttrpc::{self, Decoded, Reply};

/// How long any wait in the stand-in may take before it gives up.
pub const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("the plugin closed the connection")]
    Closed,
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("plugin answered with status {code}: {message}")]
    Status { code: i32, message: String },
}

/// The runtime's listening NRI socket.
#[derive(Debug)]
pub struct FakeRuntime {
    listener: UnixListener,
    path: PathBuf,
}

impl FakeRuntime {
    /// Listens on `path` (a stale socket file from an earlier run is removed,
    /// as the runtimes do).
    pub fn bind(path: &Path) -> io::Result<Self> {
        match std::fs::remove_file(path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
        Ok(FakeRuntime {
            listener: UnixListener::bind(path)?,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for a plugin to connect.
    pub async fn accept(&self) -> Result<PluginConn, FakeError> {
        self.accept_within(WAIT).await
    }

    /// Waits up to `wait` for a plugin to connect (`FakeError::Timeout` if
    /// none does: how a test shows that no connection was made).
    pub async fn accept_within(&self, wait: Duration) -> Result<PluginConn, FakeError> {
        let (stream, _) = tokio::time::timeout(wait, self.listener.accept())
            .await
            .map_err(|_| FakeError::Timeout(wait))??;
        Ok(PluginConn::new(stream))
    }
}

/// One ttrpc message seen on a mux connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub conn: u32,
    pub item: Decoded,
}

/// The runtime's end of one plugin connection.
#[derive(Debug)]
pub struct PluginConn {
    stream: UnixStream,
    trunk: mux::Decoder,
    plugin_conn: ttrpc::Decoder,
    runtime_conn: ttrpc::Decoder,
    seen: VecDeque<Seen>,
    next_stream: u32,
}

impl PluginConn {
    fn new(stream: UnixStream) -> Self {
        PluginConn {
            stream,
            trunk: mux::Decoder::new(),
            plugin_conn: ttrpc::Decoder::new(),
            runtime_conn: ttrpc::Decoder::new(),
            seen: VecDeque::new(),
            next_stream: 1,
        }
    }

    /// Waits for the plugin's RegisterPlugin call and accepts it.
    pub async fn expect_register(&mut self) -> Result<api::RegisterPluginRequest, FakeError> {
        let (stream_id, request) = self.expect_request().await?;
        if request.service != RUNTIME_SERVICE || request.method != "RegisterPlugin" {
            return Err(FakeError::Protocol(format!(
                "expected {RUNTIME_SERVICE}/RegisterPlugin, got {}/{}",
                request.service, request.method
            )));
        }
        let register = api::RegisterPluginRequest::decode(request.payload.as_slice())
            .map_err(|e| FakeError::Protocol(format!("RegisterPluginRequest: {e}")))?;
        self.reply_runtime(stream_id, &Reply::Ok(api::Empty {}.encode_to_vec()))
            .await?;
        Ok(register)
    }

    /// Waits for the plugin's next request on the Runtime service conn
    /// without answering it.
    pub async fn expect_request(&mut self) -> Result<(u32, envelope::Request), FakeError> {
        let seen = self
            .next_seen(|s| {
                s.conn == RUNTIME_SERVICE_CONN
                    && matches!(&s.item, Decoded::Message { header, .. } if header.kind == ttrpc::TYPE_REQUEST)
            })
            .await?;
        let Decoded::Message { header, data } = seen.item else {
            return Err(FakeError::Protocol("oversized request".into()));
        };
        let request = envelope::Request::decode(data.as_slice())
            .map_err(|e| FakeError::Protocol(format!("ttrpc Request: {e}")))?;
        Ok((header.stream_id, request))
    }

    /// Answers a request on the Runtime service conn.
    pub async fn reply_runtime(&mut self, stream_id: u32, reply: &Reply) -> Result<(), FakeError> {
        let frame = ttrpc::encode_response(stream_id, reply)
            .map_err(|e| FakeError::Protocol(e.to_string()))?;
        self.send_raw(&mux::encode(RUNTIME_SERVICE_CONN, &frame))
            .await
    }

    /// Calls a Plugin-service method and returns the plugin's reply.
    pub async fn call(&mut self, method: &str, payload: Vec<u8>) -> Result<Reply, FakeError> {
        let stream_id = self.next_stream_id();
        let frame = ttrpc::encode_request(stream_id, PLUGIN_SERVICE, method, payload)
            .map_err(|e| FakeError::Protocol(e.to_string()))?;
        self.send_raw(&mux::encode(PLUGIN_SERVICE_CONN, &frame))
            .await?;
        self.expect_response(stream_id).await
    }

    /// Sends a hand-made ttrpc frame on the Plugin service conn.
    pub async fn send_plugin_frame(&mut self, frame: &[u8]) -> Result<(), FakeError> {
        self.send_raw(&mux::encode(PLUGIN_SERVICE_CONN, frame))
            .await
    }

    /// Waits for the plugin's response on stream `stream_id` of the Plugin service conn.
    pub async fn expect_response(&mut self, stream_id: u32) -> Result<Reply, FakeError> {
        let seen = self
            .next_seen(|s| {
                s.conn == PLUGIN_SERVICE_CONN
                    && matches!(&s.item, Decoded::Message { header, .. }
                        if header.kind == ttrpc::TYPE_RESPONSE && header.stream_id == stream_id)
            })
            .await?;
        let Decoded::Message { data, .. } = seen.item else {
            return Err(FakeError::Protocol("oversized response".into()));
        };
        let response = envelope::Response::decode(data.as_slice())
            .map_err(|e| FakeError::Protocol(format!("ttrpc Response: {e}")))?;
        Ok(Reply::from_response(response))
    }

    /// A fresh odd stream ID for a runtime-initiated call.
    pub fn next_stream_id(&mut self) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        id
    }

    pub async fn configure(
        &mut self,
        request: api::ConfigureRequest,
    ) -> Result<api::ConfigureResponse, FakeError> {
        let payload = self.call_ok("Configure", request.encode_to_vec()).await?;
        api::ConfigureResponse::decode(payload.as_slice())
            .map_err(|e| FakeError::Protocol(format!("ConfigureResponse: {e}")))
    }

    pub async fn synchronize(
        &mut self,
        request: api::SynchronizeRequest,
    ) -> Result<api::SynchronizeResponse, FakeError> {
        let payload = self.call_ok("Synchronize", request.encode_to_vec()).await?;
        api::SynchronizeResponse::decode(payload.as_slice())
            .map_err(|e| FakeError::Protocol(format!("SynchronizeResponse: {e}")))
    }

    pub async fn create_container(
        &mut self,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> Result<api::CreateContainerResponse, FakeError> {
        let request = api::CreateContainerRequest {
            pod: Some(pod),
            container: Some(container),
        };
        let payload = self
            .call_ok("CreateContainer", request.encode_to_vec())
            .await?;
        api::CreateContainerResponse::decode(payload.as_slice())
            .map_err(|e| FakeError::Protocol(format!("CreateContainerResponse: {e}")))
    }

    pub async fn shutdown(&mut self) -> Result<(), FakeError> {
        self.call_ok("Shutdown", api::Empty {}.encode_to_vec())
            .await
            .map(drop)
    }

    async fn call_ok(&mut self, method: &str, payload: Vec<u8>) -> Result<Vec<u8>, FakeError> {
        match self.call(method, payload).await? {
            Reply::Ok(payload) => Ok(payload),
            Reply::Err { code, message } => Err(FakeError::Status { code, message }),
        }
    }

    /// Writes raw bytes to the trunk.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), FakeError> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Waits until the plugin closes the connection (anything it still sends
    /// is discarded).
    pub async fn expect_closed(&mut self) -> Result<(), FakeError> {
        let mut buf = [0u8; 4096];
        tokio::time::timeout(WAIT, async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .map_err(|_| FakeError::Timeout(WAIT))
    }

    /// Everything seen but not consumed by an `expect_*` call.
    pub fn unconsumed(&self) -> &VecDeque<Seen> {
        &self.seen
    }

    async fn next_seen(&mut self, wanted: impl Fn(&Seen) -> bool) -> Result<Seen, FakeError> {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(pos) = self.seen.iter().position(&wanted)
                    && let Some(found) = self.seen.remove(pos)
                {
                    return Ok(found);
                }
                self.read_more().await?;
            }
        })
        .await
        .map_err(|_| FakeError::Timeout(WAIT))?
    }

    async fn read_more(&mut self) -> Result<(), FakeError> {
        let mut buf = [0u8; 16 * 1024];
        let n = self.stream.read(&mut buf).await?;
        if n == 0 {
            return Err(FakeError::Closed);
        }
        self.trunk.push(&buf[..n]);
        while let Some(frame) = self
            .trunk
            .next_frame()
            .map_err(|e| FakeError::Protocol(e.to_string()))?
        {
            let decoder = match frame.conn {
                PLUGIN_SERVICE_CONN => &mut self.plugin_conn,
                RUNTIME_SERVICE_CONN => &mut self.runtime_conn,
                other => {
                    return Err(FakeError::Protocol(format!(
                        "plugin wrote to mux conn {other}"
                    )));
                }
            };
            decoder.push(&frame.payload);
            while let Some(item) = decoder.next_message() {
                self.seen.push_back(Seen {
                    conn: frame.conn,
                    item,
                });
            }
        }
        Ok(())
    }
}
