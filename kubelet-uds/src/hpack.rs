//! Pure: just enough HPACK (RFC 7541) to read a client's header blocks and
//! write them again as plain literals. [`crate::grpc_uds`] uses it to replace
//! an `:authority` that the HTTP/2 server would refuse.
//!
//! The decoder keeps the client's dynamic table (it must: later blocks refer
//! to entries earlier ones added); the encoder never indexes and never uses
//! Huffman, so the server's dynamic table stays empty and cannot disagree with
//! anything the client assumes.

use std::collections::VecDeque;

/// The dynamic table size the server allows (SETTINGS_HEADER_TABLE_SIZE):
/// h2's default, which tonic does not change. A client may not go above it.
pub const MAX_TABLE_SIZE: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("header index {0} is not in the table")]
    BadIndex(usize),
    #[error("integer too large in a header block")]
    Overflow,
    #[error("invalid Huffman-coded string")]
    Huffman,
    #[error("dynamic table size update to {0} above {MAX_TABLE_SIZE}")]
    TableSize(usize),
    #[error("dynamic table size update after the first field")]
    LateSizeUpdate,
}

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// Sent as "never indexed": written back the same way.
    pub never_indexed: bool,
}

/// RFC 7541 Appendix A: the static table, index 1..=61 (value "" when none).
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// RFC 7541 Appendix B: the Huffman code length of each symbol 0..=256
/// (256 is EOS). The code is canonical (codes ordered by length, then by
/// symbol), so the lengths alone define it.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];
const MAX_CODE_LEN: usize = 30;
const EOS: u16 = 256;

/// The canonical code as decoding needs it: per length, the first code, how
/// many codes have it, and where its symbols start in `symbols`.
struct Canonical {
    first: [u32; MAX_CODE_LEN + 1],
    count: [u32; MAX_CODE_LEN + 1],
    offset: [usize; MAX_CODE_LEN + 1],
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static CODE: std::sync::OnceLock<Canonical> = std::sync::OnceLock::new();
    CODE.get_or_init(|| {
        let mut c = Canonical {
            first: [0; MAX_CODE_LEN + 1],
            count: [0; MAX_CODE_LEN + 1],
            offset: [0; MAX_CODE_LEN + 1],
            symbols: [0; 257],
        };
        for &l in &HUFFMAN_LENGTHS {
            c.count[l as usize] += 1;
        }
        let (mut code, mut at) = (0u32, 0usize);
        for len in 1..=MAX_CODE_LEN {
            code = (code + c.count[len - 1]) << 1;
            c.first[len] = code;
            c.offset[len] = at;
            at += c.count[len] as usize;
        }
        let mut next = c.offset;
        for (sym, &l) in HUFFMAN_LENGTHS.iter().enumerate() {
            c.symbols[next[l as usize]] = sym as u16;
            next[l as usize] += 1;
        }
        c
    })
}

/// Decodes a Huffman-coded string (RFC 7541 5.2): padding of at most 7
/// one-bits, no EOS inside.
pub fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, HpackError> {
    let c = canonical();
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for byte in src {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let i = code.wrapping_sub(c.first[len]);
            if i < c.count[len] {
                let sym = c.symbols[c.offset[len] + i as usize];
                if sym == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(sym as u8);
                (code, len) = (0, 0);
            } else if len == MAX_CODE_LEN {
                return Err(HpackError::Huffman);
            }
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(out)
}

/// Huffman-codes `src` (what clients such as grpc-go send when shorter).
pub fn huffman_encode(src: &[u8]) -> Vec<u8> {
    let c = canonical();
    let mut codes = [0u32; 257];
    for len in 1..=MAX_CODE_LEN {
        for i in 0..c.count[len] {
            codes[c.symbols[c.offset[len] + i as usize] as usize] = c.first[len] + i;
        }
    }
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0u32);
    for &b in src {
        let len = u32::from(HUFFMAN_LENGTHS[b as usize]);
        acc = (acc << len) | u64::from(codes[b as usize]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        // Pad with the EOS prefix (ones).
        out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
    out
}

/// Appends `v` with an `n`-bit prefix whose other bits are `first`.
pub fn encode_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let mask = (1usize << n) - 1;
    if v < mask {
        out.push(first | v as u8);
        return;
    }
    out.push(first | mask as u8);
    v -= mask;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// Appends a plain (not Huffman-coded) string literal.
pub fn encode_str(out: &mut Vec<u8>, s: &[u8]) {
    encode_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// Appends `f` as a literal field with a literal name that no table keeps:
/// "without indexing", or "never indexed" when it came so.
pub fn encode_literal(out: &mut Vec<u8>, f: &Field) {
    out.push(if f.never_indexed { 0x10 } else { 0x00 });
    encode_str(out, &f.name);
    encode_str(out, &f.value);
}

fn decode_int(src: &mut &[u8], n: u32) -> Result<usize, HpackError> {
    let (&first, rest) = src.split_first().ok_or(HpackError::Truncated)?;
    *src = rest;
    let mask = (1usize << n) - 1;
    let mut v = usize::from(first) & mask;
    if v < mask {
        return Ok(v);
    }
    let mut shift = 0u32;
    loop {
        let (&b, rest) = src.split_first().ok_or(HpackError::Truncated)?;
        *src = rest;
        // Header blocks are capped far below 2^28: anything longer is bogus.
        if shift > 21 {
            return Err(HpackError::Overflow);
        }
        v += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
}

fn decode_str(src: &mut &[u8]) -> Result<Vec<u8>, HpackError> {
    let huffman = src.first().is_some_and(|b| b & 0x80 != 0);
    let len = decode_int(src, 7)?;
    if src.len() < len {
        return Err(HpackError::Truncated);
    }
    let (s, rest) = src.split_at(len);
    *src = rest;
    if huffman {
        huffman_decode(s)
    } else {
        Ok(s.to_vec())
    }
}

/// The decoding side of one connection (its dynamic table).
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: index 62 is `table[0]`.
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: MAX_TABLE_SIZE,
        }
    }
}

fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

impl Decoder {
    fn get(&self, index: usize) -> Result<(Vec<u8>, Vec<u8>), HpackError> {
        match index {
            0 => Err(HpackError::BadIndex(0)),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            }
            _ => self
                .table
                .get(index - 62)
                .cloned()
                .ok_or(HpackError::BadIndex(index)),
        }
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= entry_size(&n, &v),
                None => break,
            }
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = entry_size(name, value);
        if size > self.max {
            // RFC 7541 4.4: an entry larger than the table empties it.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        self.table.push_front((name.to_vec(), value.to_vec()));
        self.size += size;
    }

    /// Decodes one complete header block, updating the dynamic table as
    /// the client's encoder did.
    pub fn decode(&mut self, mut src: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        while let Some(&b) = src.first() {
            if b & 0x80 != 0 {
                let (name, value) = self.get(decode_int(&mut src, 7)?)?;
                fields.push(Field {
                    name,
                    value,
                    never_indexed: false,
                });
            } else if b & 0xe0 == 0x20 {
                if !fields.is_empty() {
                    return Err(HpackError::LateSizeUpdate);
                }
                let max = decode_int(&mut src, 5)?;
                if max > MAX_TABLE_SIZE {
                    return Err(HpackError::TableSize(max));
                }
                self.max = max;
                self.evict_to(max);
            } else {
                // Literal: with incremental indexing (01, 6-bit index),
                // never indexed (0001) or without indexing (0000), 4-bit.
                let indexing = b & 0xc0 == 0x40;
                let never_indexed = b & 0xf0 == 0x10;
                let index = decode_int(&mut src, if indexing { 6 } else { 4 })?;
                let name = if index == 0 {
                    decode_str(&mut src)?
                } else {
                    self.get(index)?.0
                };
                let value = decode_str(&mut src)?;
                if indexing {
                    self.insert(&name, &value);
                }
                fields.push(Field {
                    name,
                    value,
                    never_indexed,
                });
            }
        }
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: &str, v: &str) -> Field {
        Field {
            name: n.into(),
            value: v.into(),
            never_indexed: false,
        }
    }

    /// RFC 7541 C.4: three requests with Huffman coding and the dynamic
    /// table (the examples' bytes).
    #[test]
    fn rfc7541_c4_requests_with_huffman() {
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let mut d = Decoder::default();
        let first = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            first,
            [
                field(":method", "GET"),
                field(":scheme", "http"),
                field(":path", "/"),
                field(":authority", "www.example.com"),
            ]
        );
        assert_eq!(d.size, 57);
        let second = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(second[3], field(":authority", "www.example.com"));
        assert_eq!(second[4], field("cache-control", "no-cache"));
        let third = d
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(third[1], field(":scheme", "https"));
        assert_eq!(third[2], field(":path", "/index.html"));
        assert_eq!(third[3], field(":authority", "www.example.com"));
        assert_eq!(third[4], field("custom-key", "custom-value"));
        assert_eq!(d.size, 164);
    }

    #[test]
    fn huffman_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Frdma.kroce.io-reg.sock";
        assert_eq!(huffman_decode(&huffman_encode(path)).unwrap(), path);
    }

    #[test]
    fn bad_huffman_padding_is_refused() {
        // 'a' is 00011 (5 bits); pad with zeros instead of ones.
        assert_eq!(huffman_decode(&[0b0001_1000]), Err(HpackError::Huffman));
        // A full byte of padding is too much.
        let mut a = huffman_encode(b"a");
        a.push(0xff);
        assert_eq!(huffman_decode(&a), Err(HpackError::Huffman));
    }

    #[test]
    fn literals_and_sizes() {
        let mut out = Vec::new();
        encode_literal(&mut out, &field(":authority", "localhost"));
        let mut sensitive = field("authorization", "x");
        sensitive.never_indexed = true;
        encode_literal(&mut out, &sensitive);
        let mut d = Decoder::default();
        assert_eq!(
            d.decode(&out).unwrap(),
            [field(":authority", "localhost"), sensitive]
        );
        assert!(d.table.is_empty(), "plain literals are never indexed");
        // Long integers (length 300 needs a continuation byte).
        let mut out = Vec::new();
        encode_literal(&mut out, &field("x", &"v".repeat(300)));
        assert_eq!(d.decode(&out).unwrap()[0].value.len(), 300);
        assert_eq!(
            d.decode(&[0x3f, 0xe2, 0x1f]),
            Err(HpackError::TableSize(4097))
        );
        assert_eq!(d.decode(&[0xbe]), Err(HpackError::BadIndex(62)));
        assert_eq!(d.decode(&[0x41]), Err(HpackError::Truncated));
    }
}
