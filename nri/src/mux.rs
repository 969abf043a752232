//! NRI's connection multiplexer (containerd/nri `pkg/net/multiplex`).
//!
//! One unix-socket connection (the trunk) carries several logical
//! connections. Every write on a logical connection becomes one frame:
//!
//! ```text
//! +----------------+----------------+-----------------+
//! | conn ID (u32)  | length (u32)   | payload         |
//! +----------------+----------------+-----------------+
//!   big-endian       big-endian       `length` bytes
//! ```
//!
//! NRI uses conn 1 for the plugin's ttrpc service (the runtime is the
//! client) and conn 2 for the runtime's ttrpc service (the plugin is the
//! client). Each logical connection's payloads form a byte stream of ttrpc
//! frames; one payload need not hold exactly one ttrpc frame.

use crate::ttrpc;

/// Conn ID of the Plugin service (runtime → plugin requests).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Conn ID of the Runtime service (plugin → runtime requests).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Mux frame header length.
pub const HEADER_LEN: usize = 8;
/// The largest payload the Go multiplexer writes (one whole ttrpc message).
pub const MAX_PAYLOAD: usize = ttrpc::HEADER_LEN + ttrpc::MAX_DATA_LEN;
/// We write payloads of at most this size: the Go side reads each payload
/// through a 4 KiB bufio.Reader and fails (ENOMEM) on a larger one arriving
/// into a partly filled buffer.
pub const WRITE_CHUNK: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    #[error("mux frame for conn {conn} announces {len} bytes, more than the {MAX_PAYLOAD} allowed")]
    Oversized { conn: u32, len: usize },
}

/// One demultiplexed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub conn: u32,
    pub payload: Vec<u8>,
}

/// Encodes `data` written on `conn` as mux frames (split at [`WRITE_CHUNK`]).
pub fn encode(conn: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + HEADER_LEN * (data.len() / WRITE_CHUNK + 1));
    for chunk in data.chunks(WRITE_CHUNK) {
        out.extend_from_slice(&conn.to_be_bytes());
        // chunk.len() <= WRITE_CHUNK, so it fits in u32.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

/// Reassembles mux frames from trunk bytes as they arrive.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the trunk.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    ///
    /// An oversized frame is an error: the trunk cannot be resynchronised
    /// after it and must be closed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, MuxError> {
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(MuxError::Oversized { conn, len });
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Frame { conn, payload }))
    }

    /// Bytes received but not yet part of a complete frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_hand_computed_frame() {
        assert_eq!(
            encode(2, b"abc"),
            vec![0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']
        );
        assert_eq!(
            encode(1, b""),
            Vec::<u8>::new(),
            "nothing to write, no frame"
        );
    }

    #[test]
    fn splits_large_writes_into_4k_frames() {
        let data: Vec<u8> = (0..(WRITE_CHUNK * 2 + 5)).map(|i| i as u8).collect();
        let out = encode(1, &data);
        assert_eq!(out.len(), data.len() + 3 * HEADER_LEN);
        assert_eq!(&out[..8], &[0, 0, 0, 1, 0, 0, 0x10, 0]);
        let second = HEADER_LEN + WRITE_CHUNK;
        assert_eq!(&out[second..second + 8], &[0, 0, 0, 1, 0, 0, 0x10, 0]);
        let third = 2 * (HEADER_LEN + WRITE_CHUNK);
        assert_eq!(&out[third..third + 8], &[0, 0, 0, 1, 0, 0, 0, 5]);
        let mut dec = Decoder::new();
        dec.push(&out);
        let mut joined = Vec::new();
        while let Some(f) = dec.next_frame().unwrap() {
            assert_eq!(f.conn, 1);
            joined.extend(f.payload);
        }
        assert_eq!(joined, data);
    }

    #[test]
    fn decodes_byte_by_byte() {
        let bytes = [0, 0, 0, 1, 0, 0, 0, 2, 0xAA, 0xBB, 0, 0, 0, 2, 0, 0, 0, 0];
        let mut dec = Decoder::new();
        let mut frames = Vec::new();
        for b in bytes {
            dec.push(&[b]);
            while let Some(f) = dec.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(
            frames,
            vec![
                Frame {
                    conn: 1,
                    payload: vec![0xAA, 0xBB]
                },
                Frame {
                    conn: 2,
                    payload: vec![]
                }
            ]
        );
        assert_eq!(dec.pending(), 0);
    }

    #[test]
    fn oversized_frame_is_an_error_naming_conn_and_length() {
        let mut dec = Decoder::new();
        dec.push(&[0, 0, 0, 7, 0x7f, 0xff, 0xff, 0xff]);
        let err = dec.next_frame().unwrap_err();
        assert_eq!(
            err,
            MuxError::Oversized {
                conn: 7,
                len: 0x7fff_ffff
            }
        );
        assert!(err.to_string().contains("conn 7"));
        // Exactly the maximum is fine (waits for the bytes).
        let mut dec = Decoder::new();
        dec.push(&[0, 0, 0, 1]);
        dec.push(&(MAX_PAYLOAD as u32).to_be_bytes());
        assert_eq!(dec.next_frame(), Ok(None));
    }
}
