//! Edge: accepting gRPC connections on a unix socket from the kubelet's
//! grpc-go, whatever `:authority` it sends.
//!
//! Why: the kubelet's plugin watcher dials a registration socket with the
//! bare socket path as the gRPC target, so grpc-go sends the percent-encoded
//! path (`%2Fvar%2Flib%2Fkubelet%2F...-reg.sock`) as `:authority`. h2 (under
//! tonic/hyper) parses `:authority` with `http::uri::Authority`, which refuses
//! `%` in a host (and `/`), and resets the stream with PROTOCOL_ERROR before
//! any handler runs (h2 0.4.20 `server.rs` `convert_poll_message`; still so
//! in h2 0.4.21 and http 1.5, the latest releases). No h2 or hyper option
//! turns that check off, so each accepted connection goes through a small
//! pump: client-to-server HEADERS (+CONTINUATION) blocks are HPACK-decoded
//! with the client's dynamic table, an `:authority` that `Authority` refuses
//! becomes `localhost` (what grpc-go itself sends for `unix:` targets;
//! nothing here reads it), and the block is written again as plain literals
//! that index nothing, so the server's HPACK table stays empty and in step.
//! Every other frame, and everything server-to-client, passes unchanged.

use crate::hpack::{self, Decoder, Field, HpackError};
use futures::Stream;
use futures::StreamExt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// The HTTP/2 client connection preface (RFC 9113 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What a refused `:authority` becomes.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's initial value: every HTTP/2 server takes frames
/// this large, so re-encoded blocks are cut to it.
const MAX_FRAME: usize = 16_384;
/// A header block this large is refused (h2's own header list limit is 16 KiB).
const MAX_BLOCK: usize = 1 << 20;
/// Buffer between the pump and the server, each way.
const PIPE: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("HPACK: {0}")]
    Hpack(#[from] HpackError),
    #[error("HTTP/2: {0}")]
    Protocol(&'static str),
}

/// The listener's connections, each through the `:authority` pump: give it
/// to tonic's `serve_with_incoming[_shutdown]`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<Rewritten>> {
    UnixListenerStream::new(listener).map(|r| r.map(accept))
}

/// Starts the pump for one accepted connection (on the current runtime).
pub fn accept(stream: UnixStream) -> Rewritten {
    let info = stream.connect_info();
    let (ours, theirs) = tokio::io::duplex(PIPE);
    tokio::spawn(pump(stream, ours));
    Rewritten { io: theirs, info }
}

/// The server's end of a pumped connection.
#[derive(Debug)]
pub struct Rewritten {
    io: DuplexStream,
    info: UdsConnectInfo,
}

impl Connected for Rewritten {
    type ConnectInfo = UdsConnectInfo;
    fn connect_info(&self) -> UdsConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Rewritten {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewritten {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

async fn pump(client: UnixStream, server: DuplexStream) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = tokio::io::split(server);
    let inbound = async {
        if let Err(e) = rewrite_requests(&mut cr, &mut sw).await {
            // The server sees the connection end, as h2 would have ended it.
            tracing::debug!(error = %e, "gRPC connection dropped");
        }
        let _ = sw.shutdown().await;
    };
    let outbound = async {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::pin!(inbound, outbound);
    tokio::select! {
        // The client is done sending: let the server's answers drain.
        () = &mut inbound => outbound.await,
        // The server closed the connection: stop reading the client.
        () = &mut outbound => {}
    }
}

fn valid_authority(v: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(v).is_ok()
}

/// One header block re-encoded as frames of at most [`MAX_FRAME`].
fn headers_frames(stream: u32, flags: u8, priority: Option<[u8; 5]>, fields: &[Field]) -> Vec<u8> {
    let mut block = Vec::new();
    for f in fields {
        if f.name == b":authority" && !valid_authority(&f.value) {
            let fixed = Field {
                value: REPLACEMENT_AUTHORITY.to_vec(),
                ..f.clone()
            };
            hpack::encode_literal(&mut block, &fixed);
        } else {
            hpack::encode_literal(&mut block, f);
        }
    }
    let mut out = Vec::with_capacity(block.len() + 32);
    let prio_len = priority.map_or(0, |p| p.len());
    let mut rest = &block[..];
    let mut first = true;
    loop {
        let room = if first {
            MAX_FRAME - prio_len
        } else {
            MAX_FRAME
        };
        let (chunk, more) = rest.split_at(rest.len().min(room));
        rest = more;
        let last = rest.is_empty();
        let (ty, mut fl) = if first {
            (
                HEADERS,
                (flags & END_STREAM) | if priority.is_some() { PRIORITY } else { 0 },
            )
        } else {
            (CONTINUATION, 0)
        };
        if last {
            fl |= END_HEADERS;
        }
        let len = chunk.len() + if first { prio_len } else { 0 };
        out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        out.push(ty);
        out.push(fl);
        out.extend_from_slice(&stream.to_be_bytes());
        if first && let Some(p) = priority {
            out.extend_from_slice(&p);
        }
        out.extend_from_slice(chunk);
        first = false;
        if last {
            return out;
        }
    }
}

/// An open header block: HEADERS seen, END_HEADERS not yet.
struct Open {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// Copies an HTTP/2 client's bytes from `r` to `w`, re-encoding each header
/// block (see the module doc). Returns at the client's end of stream.
pub async fn rewrite_requests<R, W>(r: &mut R, w: &mut W) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    if !read_all(r, &mut preface).await? {
        return Ok(());
    }
    w.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: the server refuses it itself.
        tokio::io::copy(r, w).await?;
        return Ok(());
    }
    let mut decoder = Decoder::default();
    let mut open: Option<Open> = None;
    loop {
        let mut head = [0u8; 9];
        if !read_all(r, &mut head).await? {
            return Ok(());
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (ty, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let header_frame = ty == HEADERS || (ty == CONTINUATION && open.is_some());
        if !header_frame {
            if open.is_some() {
                return Err(PumpError::Protocol("a frame inside a header block"));
            }
            w.write_all(&head).await?;
            let copied = tokio::io::copy(&mut (&mut *r).take(len as u64), w).await?;
            if copied < len as u64 {
                return Ok(());
            }
            w.flush().await?;
            continue;
        }
        if len > MAX_BLOCK {
            return Err(PumpError::Protocol("header block too large"));
        }
        let mut payload = vec![0u8; len];
        if !read_all(r, &mut payload).await? {
            return Ok(());
        }
        let mut o = match open.take() {
            Some(mut o) => {
                if ty != CONTINUATION || stream != o.stream {
                    return Err(PumpError::Protocol("a frame inside a header block"));
                }
                o.block.extend_from_slice(&payload);
                if o.block.len() > MAX_BLOCK {
                    return Err(PumpError::Protocol("header block too large"));
                }
                o
            }
            None => {
                let mut p = &payload[..];
                let mut pad = 0usize;
                if flags & PADDED != 0 {
                    let (&n, rest) = p
                        .split_first()
                        .ok_or(PumpError::Protocol("HEADERS without its pad length"))?;
                    pad = usize::from(n);
                    p = rest;
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    if p.len() < 5 {
                        return Err(PumpError::Protocol("HEADERS without its priority"));
                    }
                    let mut pr = [0u8; 5];
                    pr.copy_from_slice(&p[..5]);
                    priority = Some(pr);
                    p = &p[5..];
                }
                if pad > p.len() {
                    return Err(PumpError::Protocol("HEADERS padding longer than the frame"));
                }
                Open {
                    stream,
                    flags,
                    priority,
                    block: p[..p.len() - pad].to_vec(),
                }
            }
        };
        if flags & END_HEADERS == 0 {
            open = Some(o);
            continue;
        }
        let fields = decoder.decode(&std::mem::take(&mut o.block))?;
        w.write_all(&headers_frames(o.stream, o.flags, o.priority, &fields))
            .await?;
        w.flush().await?;
    }
}

/// Fills `buf`; `false` when the stream ends first.
async fn read_all<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Test helpers: HTTP/2 frames as grpc-go writes them, and a raw client.
#[cfg(any(test, feature = "testing"))]
pub mod frames {
    use super::{CONTINUATION, END_HEADERS, END_STREAM, HEADERS, PREFACE};
    use crate::hpack::{self, Decoder, Field};
    use std::path::Path;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A frame header and payload.
    pub fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.push(ty);
        out.push(flags);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// A literal field with incremental indexing and a Huffman-coded value,
    /// named by static index `name_index` (1 = `:authority`) or by a literal
    /// name when 0: what grpc-go's HPACK encoder writes for a new value.
    pub fn indexed_literal(name_index: usize, name: &str, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        hpack::encode_int(&mut out, 0x40, 6, name_index);
        if name_index == 0 {
            hpack::encode_str(&mut out, name.as_bytes());
        }
        let h = hpack::huffman_encode(value);
        hpack::encode_int(&mut out, 0x80, 7, h.len());
        out.extend_from_slice(&h);
        out
    }

    /// One call's answer as the raw client saw it.
    #[derive(Debug, Default, Clone)]
    pub struct RawResponse {
        pub headers: Vec<Field>,
        pub trailers: Vec<Field>,
        pub data: Vec<u8>,
        /// RST_STREAM's error code (1 = PROTOCOL_ERROR).
        pub reset: Option<u32>,
    }

    impl RawResponse {
        pub fn grpc_status(&self) -> Option<String> {
            self.trailers
                .iter()
                .chain(&self.headers)
                .find(|f| f.name == b"grpc-status")
                .map(|f| String::from_utf8_lossy(&f.value).into_owned())
        }
        /// The first gRPC message (without its 5-byte prefix).
        pub fn message(&self) -> Option<&[u8]> {
            let len = u32::from_be_bytes(self.data.get(1..5)?.try_into().ok()?) as usize;
            self.data.get(5..5 + len)
        }
    }

    /// The client's HPACK encoder, as grpc-go's: new values are added to the
    /// dynamic table (Huffman-coded), repeated ones are sent by index.
    #[derive(Default)]
    struct Encoder {
        table: Vec<(String, Vec<u8>)>,
    }

    impl Encoder {
        fn field(&mut self, out: &mut Vec<u8>, name_index: usize, name: &str, value: &[u8]) {
            if let Some(i) = self
                .table
                .iter()
                .position(|(n, v)| n == name && v.as_slice() == value)
            {
                hpack::encode_int(out, 0x80, 7, 62 + i);
                return;
            }
            out.extend(indexed_literal(name_index, name, value));
            self.table.insert(0, (name.to_string(), value.to_vec()));
        }
    }

    /// Unary gRPC calls over one connection to the unix socket `sock`,
    /// on streams 1, 3, 5..., each `:authority` = `authority` (the first
    /// added to the dynamic table, the next by index, as grpc-go does).
    pub async fn raw_grpc_calls(
        sock: &Path,
        authority: &[u8],
        calls: &[(&str, Vec<u8>)],
    ) -> std::io::Result<Vec<RawResponse>> {
        let mut conn = tokio::net::UnixStream::connect(sock).await?;
        let mut out = PREFACE.to_vec();
        out.extend(frame(4, 0, 0, &[]));
        let mut enc = Encoder::default();
        for (i, (path, body)) in calls.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
            enc.field(&mut block, 4, ":path", path.as_bytes());
            enc.field(&mut block, 1, ":authority", authority);
            enc.field(&mut block, 31, "content-type", b"application/grpc");
            enc.field(&mut block, 0, "te", b"trailers");
            out.extend(frame(HEADERS, END_HEADERS, stream, &block));
            let mut msg = vec![0u8];
            msg.extend((body.len() as u32).to_be_bytes());
            msg.extend(body);
            out.extend(frame(0, END_STREAM, stream, &msg));
        }
        conn.write_all(&out).await?;
        let mut res = vec![RawResponse::default(); calls.len()];
        let mut open = calls.len();
        let mut dec = Decoder::default();
        let mut block = Vec::new();
        while open > 0 {
            let mut head = [0u8; 9];
            if conn.read_exact(&mut head).await.is_err() {
                break;
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (ty, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as usize;
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await?;
            let r = (stream > 0)
                .then(|| res.get_mut((stream - 1) / 2))
                .flatten();
            match (ty, r) {
                (4, _) if flags & 1 == 0 => conn.write_all(&frame(4, 1, 0, &[])).await?,
                (7, _) => break,
                (HEADERS | CONTINUATION, Some(r)) => {
                    block.extend_from_slice(&payload);
                    if flags & END_HEADERS != 0 {
                        let fields = dec
                            .decode(&std::mem::take(&mut block))
                            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                        if r.headers.is_empty() {
                            r.headers = fields;
                        } else {
                            r.trailers = fields;
                        }
                    }
                    if flags & END_STREAM != 0 {
                        open -= 1;
                    }
                }
                (0, Some(r)) => {
                    r.data.extend_from_slice(&payload);
                    if flags & END_STREAM != 0 {
                        open -= 1;
                    }
                }
                (3, Some(r)) => {
                    r.reset = payload
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                    open -= 1;
                }
                _ => {}
            }
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::frames::{frame, indexed_literal};
    use super::*;

    const SOCK: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Frdma.kroce.io-reg.sock";

    async fn run(input: Vec<u8>) -> Result<Vec<u8>, PumpError> {
        let mut out = Vec::new();
        rewrite_requests(&mut &input[..], &mut out).await?;
        Ok(out)
    }

    /// Splits `out` (after the preface) into frames and decodes each block.
    fn blocks(out: &[u8]) -> Vec<(u8, u32, Vec<Field>)> {
        let mut d = Decoder::default();
        let mut rest = &out[PREFACE.len()..];
        let mut res = Vec::new();
        let mut block = Vec::new();
        while !rest.is_empty() {
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let (ty, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let mut payload = &rest[9..9 + len];
            rest = &rest[9 + len..];
            if ty == HEADERS || ty == CONTINUATION {
                if ty == HEADERS && flags & PRIORITY != 0 {
                    payload = &payload[5..];
                }
                block.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    res.push((flags, stream, d.decode(&block).unwrap()));
                    block.clear();
                }
            } else {
                res.push((ty, stream, Vec::new()));
            }
        }
        res
    }

    fn authority(fields: &[Field]) -> Vec<u8> {
        fields
            .iter()
            .find(|f| f.name == b":authority")
            .unwrap()
            .value
            .clone()
    }

    #[tokio::test]
    async fn percent_encoded_authority_becomes_localhost_and_later_references_follow() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(4, 0, 0, &[])); // SETTINGS
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.extend(indexed_literal(
            4,
            ":path",
            b"/pluginregistration.Registration/GetInfo",
        ));
        block.extend(indexed_literal(1, ":authority", SOCK));
        block.extend(indexed_literal(31, "content-type", b"application/grpc"));
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        input.extend(frame(0, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        // Stream 3 refers to the dynamic entries (62 = content-type, 63 =
        // :authority): the client's table, which only the pump knows.
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &[0x83, 0x86, 0xbf, 0xbe],
        ));
        let out = run(input).await.unwrap();
        assert_eq!(&out[..24], PREFACE);
        let b = blocks(&out);
        assert_eq!(b.len(), 4, "{b:?}");
        assert_eq!(authority(&b[1].2), b"localhost");
        assert_eq!(b[1].2[2].value, b"/pluginregistration.Registration/GetInfo");
        assert_eq!(b[1].2[4].value, b"application/grpc");
        assert_eq!(b[3].0, END_HEADERS | END_STREAM);
        assert_eq!(authority(&b[3].2), b"localhost");
        assert_eq!(b[3].2[3].value, b"application/grpc");
        // The DATA frame passed unchanged.
        assert_eq!(b[2], (0, 1, Vec::new()));
    }

    #[tokio::test]
    async fn valid_authority_kept_and_padding_priority_continuation_handled() {
        let mut input = PREFACE.to_vec();
        let mut block = vec![0x83, 0x86, 0x84];
        block.extend(indexed_literal(1, ":authority", b"localhost:1234"));
        block.extend(indexed_literal(0, "x-big", &vec![b'a'; 20_000]));
        // HEADERS padded (3 bytes) with priority, then two CONTINUATIONs.
        let mut first = vec![3u8];
        first.extend([0, 0, 0, 0, 16]);
        first.extend(&block[..10]);
        first.extend([0, 0, 0]);
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &first));
        input.extend(frame(CONTINUATION, 0, 5, &block[10..12_000]));
        input.extend(frame(CONTINUATION, END_HEADERS, 5, &block[12_000..]));
        let out = run(input).await.unwrap();
        let b = blocks(&out);
        assert_eq!(b.len(), 1);
        assert_eq!(authority(&b[0].2), b"localhost:1234");
        assert_eq!(b[0].2[4].value.len(), 20_000);
        // Re-cut to frames of at most 16 KiB; END_STREAM kept.
        assert_eq!(out[24 + 3], HEADERS);
        assert_eq!(out[24 + 4] & END_STREAM, END_STREAM);
    }

    #[tokio::test]
    async fn interleaved_frame_inside_a_block_is_an_error() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x83]));
        input.extend(frame(0, 0, 1, &[]));
        assert!(matches!(run(input).await, Err(PumpError::Protocol(_))));
    }
}
