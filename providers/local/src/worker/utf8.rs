//! Lossy UTF-8 decoding of a byte stream that arrives in arbitrary chunks:
//! a character split across two chunks is emitted whole with the second.

/// Decodes one stream chunk by chunk.
#[derive(Debug, Default)]
pub struct ChunkDecoder {
    pending: Vec<u8>,
}

impl ChunkDecoder {
    /// Decode what can be decoded; an incomplete sequence at the end waits
    /// for the next chunk, invalid bytes become U+FFFD.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        self.pending.extend_from_slice(chunk);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (ok, tail) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(ok).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &tail[n..];
                        }
                        None => {
                            rest = tail;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// What is left at the end of the stream, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_chunks_are_not_broken() {
        let bytes = "aé€😀z".as_bytes();
        for cut in 0..bytes.len() {
            let mut d = ChunkDecoder::default();
            let mut s = d.push(&bytes[..cut]);
            s.push_str(&d.push(&bytes[cut..]));
            s.push_str(&d.finish());
            assert_eq!(s, "aé€😀z", "cut at {cut}");
        }
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut d = ChunkDecoder::default();
        assert_eq!(d.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(d.push(b"\xe2\x82"), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
