//! ttrpc framing (containerd/ttrpc PROTOCOL.md) and its request/response envelope.
//!
//! ```text
//! +----------------+----------------+----------+-----------+--------------+
//! | length (u32)   | stream ID (u32)| type (u8)| flags (u8)| data         |
//! +----------------+----------------+----------+-----------+--------------+
//!   big-endian       big-endian                              `length` bytes
//! ```
//!
//! Types: 1 Request, 2 Response, 3 Data. Client-initiated streams have odd
//! IDs. Data is at most 4 MiB. A Request's data is a `ttrpc.Request`
//! (service, method, payload); a Response's is a `ttrpc.Response` (status,
//! payload). NRI only uses unary calls.

use prost::Message;

use crate::proto::envelope;

pub const HEADER_LEN: usize = 10;
/// Largest data length ttrpc accepts.
pub const MAX_DATA_LEN: usize = 4 << 20;

pub const TYPE_REQUEST: u8 = 0x01;
pub const TYPE_RESPONSE: u8 = 0x02;
pub const TYPE_DATA: u8 = 0x03;

/// google.rpc.Code values used here.
pub mod code {
    pub const OK: i32 = 0;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtrpcError {
    #[error("ttrpc message of {len} bytes exceeds the {MAX_DATA_LEN} byte maximum")]
    Oversized { len: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub length: u32,
    pub stream_id: u32,
    pub kind: u8,
    pub flags: u8,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&self.length.to_be_bytes());
        out[4..8].copy_from_slice(&self.stream_id.to_be_bytes());
        out[8] = self.kind;
        out[9] = self.flags;
        out
    }

    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Self {
        Header {
            length: u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            stream_id: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            kind: bytes[8],
            flags: bytes[9],
        }
    }
}

/// Header + data of one ttrpc message.
pub fn encode_frame(
    stream_id: u32,
    kind: u8,
    flags: u8,
    data: &[u8],
) -> Result<Vec<u8>, TtrpcError> {
    if data.len() > MAX_DATA_LEN {
        return Err(TtrpcError::Oversized { len: data.len() });
    }
    let header = Header {
        // <= MAX_DATA_LEN, fits.
        length: data.len() as u32,
        stream_id,
        kind,
        flags,
    };
    let mut out = Vec::with_capacity(HEADER_LEN + data.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(data);
    Ok(out)
}

/// A unary request frame calling `service`/`method` with an encoded `payload`.
pub fn encode_request(
    stream_id: u32,
    service: &str,
    method: &str,
    payload: Vec<u8>,
) -> Result<Vec<u8>, TtrpcError> {
    let request = envelope::Request {
        service: service.to_owned(),
        method: method.to_owned(),
        payload,
        timeout_nano: 0,
        metadata: Vec::new(),
    };
    encode_frame(stream_id, TYPE_REQUEST, 0, &request.encode_to_vec())
}

/// The answer to a request: a payload, or an error status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Ok(Vec<u8>),
    Err { code: i32, message: String },
}

impl Reply {
    pub fn error(code: i32, message: impl Into<String>) -> Self {
        Reply::Err {
            code,
            message: message.into(),
        }
    }

    pub fn to_response(&self) -> envelope::Response {
        match self {
            Reply::Ok(payload) => envelope::Response {
                status: Some(envelope::Status {
                    code: code::OK,
                    message: String::new(),
                }),
                payload: payload.clone(),
            },
            Reply::Err { code, message } => envelope::Response {
                status: Some(envelope::Status {
                    code: *code,
                    message: message.clone(),
                }),
                payload: Vec::new(),
            },
        }
    }

    /// Reads a `ttrpc.Response` (a missing status means OK, as in Go).
    pub fn from_response(response: envelope::Response) -> Self {
        match response.status {
            Some(status) if status.code != code::OK => Reply::Err {
                code: status.code,
                message: status.message,
            },
            _ => Reply::Ok(response.payload),
        }
    }
}

/// A response frame for `stream_id`.
pub fn encode_response(stream_id: u32, reply: &Reply) -> Result<Vec<u8>, TtrpcError> {
    encode_frame(
        stream_id,
        TYPE_RESPONSE,
        0,
        &reply.to_response().encode_to_vec(),
    )
}

/// One decoded item of a ttrpc byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    Message {
        header: Header,
        data: Vec<u8>,
    },
    /// The header announced more than [`MAX_DATA_LEN`]; its data is being
    /// skipped. Answer with RESOURCE_EXHAUSTED, as Go's ttrpc does.
    Oversized {
        header: Header,
    },
}

/// Reassembles ttrpc messages from a logical connection's byte stream.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    skip: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let skipped = self.skip.min(bytes.len());
        self.skip -= skipped;
        self.buf.extend_from_slice(&bytes[skipped..]);
    }

    /// The next complete message, or `None` if more bytes are needed.
    pub fn next_message(&mut self) -> Option<Decoded> {
        let header_bytes: &[u8; HEADER_LEN] = self.buf.get(..HEADER_LEN)?.try_into().ok()?;
        let header = Header::decode(header_bytes);
        let len = header.length as usize;
        if len > MAX_DATA_LEN {
            let available = self.buf.len() - HEADER_LEN;
            let dropped = available.min(len);
            self.buf.drain(..HEADER_LEN + dropped);
            self.skip = len - dropped;
            return Some(Decoded::Oversized { header });
        }
        if self.buf.len() < HEADER_LEN + len {
            return None;
        }
        let data = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Some(Decoded::Message { header, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_hand_computed_bytes() {
        let h = Header {
            length: 0x0102,
            stream_id: 3,
            kind: TYPE_REQUEST,
            flags: 0,
        };
        assert_eq!(h.encode(), [0, 0, 1, 2, 0, 0, 0, 3, 1, 0]);
        assert_eq!(Header::decode(&h.encode()), h);
    }

    #[test]
    fn request_frame_bytes() {
        // ttrpc.Request{service:"s", method:"m", payload:[0x08,0x01]}:
        //   0a 01 's' | 12 01 'm' | 1a 02 08 01  -> 10 bytes
        let frame = encode_request(1, "s", "m", vec![0x08, 0x01]).unwrap();
        assert_eq!(
            frame,
            vec![
                0, 0, 0, 10, 0, 0, 0, 1, 1, 0, // header
                0x0a, 1, b's', 0x12, 1, b'm', 0x1a, 2, 0x08, 0x01
            ]
        );
    }

    #[test]
    fn response_frame_bytes() {
        // OK with payload [0xAB]: status{} is encoded as 0a 00, payload 12 01 ab.
        let ok = encode_response(5, &Reply::Ok(vec![0xAB])).unwrap();
        assert_eq!(
            ok,
            vec![0, 0, 0, 5, 0, 0, 0, 5, 2, 0, 0x0a, 0, 0x12, 1, 0xAB]
        );
        // Error: status{code:12, message:"x"} = 0a 05 08 0c 12 01 'x'.
        let err = encode_response(7, &Reply::error(code::UNIMPLEMENTED, "x")).unwrap();
        assert_eq!(
            err,
            vec![
                0, 0, 0, 7, 0, 0, 0, 7, 2, 0, 0x0a, 5, 0x08, 12, 0x12, 1, b'x'
            ]
        );
    }

    #[test]
    fn reply_from_response_treats_missing_status_as_ok() {
        let r = envelope::Response {
            status: None,
            payload: vec![1],
        };
        assert_eq!(Reply::from_response(r), Reply::Ok(vec![1]));
    }

    #[test]
    fn decoder_reassembles_split_messages() {
        let mut bytes = encode_frame(1, TYPE_REQUEST, 0, b"hello").unwrap();
        bytes.extend(encode_frame(3, TYPE_DATA, 1, b"").unwrap());
        let mut dec = Decoder::new();
        let mut out = Vec::new();
        for chunk in bytes.chunks(3) {
            dec.push(chunk);
            while let Some(m) = dec.next_message() {
                out.push(m);
            }
        }
        assert_eq!(
            out,
            vec![
                Decoded::Message {
                    header: Header {
                        length: 5,
                        stream_id: 1,
                        kind: TYPE_REQUEST,
                        flags: 0
                    },
                    data: b"hello".to_vec()
                },
                Decoded::Message {
                    header: Header {
                        length: 0,
                        stream_id: 3,
                        kind: TYPE_DATA,
                        flags: 1
                    },
                    data: vec![]
                },
            ]
        );
    }

    #[test]
    fn oversized_message_is_reported_then_skipped() {
        let len = MAX_DATA_LEN + 3;
        let header = Header {
            length: len as u32,
            stream_id: 9,
            kind: TYPE_REQUEST,
            flags: 0,
        };
        let mut dec = Decoder::new();
        dec.push(&header.encode());
        dec.push(&[0u8; 100]);
        assert_eq!(dec.next_message(), Some(Decoded::Oversized { header }));
        assert_eq!(dec.next_message(), None);
        // The rest of the oversized data arrives in pieces, then a good message.
        dec.push(&vec![0u8; len - 100 - 1]);
        assert_eq!(dec.next_message(), None);
        let mut tail = vec![0u8];
        tail.extend(encode_frame(11, TYPE_REQUEST, 0, b"ok").unwrap());
        dec.push(&tail);
        match dec.next_message() {
            Some(Decoded::Message { header, data }) => {
                assert_eq!(header.stream_id, 11);
                assert_eq!(data, b"ok");
            }
            other => panic!("expected the good message, got {other:?}"),
        }
    }

    #[test]
    fn encode_refuses_oversized_data() {
        let err = encode_frame(1, TYPE_RESPONSE, 0, &vec![0u8; MAX_DATA_LEN + 1]).unwrap_err();
        assert_eq!(
            err,
            TtrpcError::Oversized {
                len: MAX_DATA_LEN + 1
            }
        );
    }
}
