//! Encryption of DATA blocks (`--encrypt`; docs/SECURITY.md).
//!
//! Each DATA frame's payload is sealed with an AEAD (ChaCha20-Poly1305 or
//! AES-256-GCM) in place in its buffer; the 16-byte tag follows the
//! payload on the wire. The frame header and the segment table (checksum,
//! file ids, offsets, lengths) are the associated data, so they are
//! authenticated but readable. Keys: one per session and direction, HKDF
//! from the session key of the handshake (proto::auth: forward-secret, it
//! never crosses the wire). Nonces: stream number, link epoch and a
//! per-stream block counter that both ends keep themselves, so a nonce is
//! never used twice under one key and a block replayed, dropped or moved
//! between links fails authentication.

use aes_gcm::Aes256Gcm;
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::ChaCha20Poly1305;
use ramsys_proto::auth::keys::{derive, label};

use ramsys_proto::control::Bytes32;
use ramsys_proto::ProtoError;

/// Fresh random bytes from the OS (nonces, keys, credentials).
pub fn random32() -> Bytes32 {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).expect("OS randomness");
    b
}

/// AEAD tag bytes after a sealed payload.
pub const TAG_LEN: usize = 16;
/// Frame-header flag: the DATA body ends with an AEAD tag.
pub const FLAG_SEALED: u8 = 1;

/// Which AEAD protects DATA blocks (wire ids in Propose/Confirm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cipher {
    #[default]
    None,
    ChaCha20Poly1305,
    Aes256Gcm,
}

impl Cipher {
    pub fn id(self) -> u8 {
        match self {
            Cipher::None => 0,
            Cipher::ChaCha20Poly1305 => 1,
            Cipher::Aes256Gcm => 2,
        }
    }
    pub fn from_id(v: u8) -> Result<Self, ProtoError> {
        Ok(match v {
            0 => Cipher::None,
            1 => Cipher::ChaCha20Poly1305,
            2 => Cipher::Aes256Gcm,
            _ => {
                return Err(ProtoError::Malformed {
                    what: "negotiation",
                    detail: format!("unknown cipher {v}"),
                })
            }
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Cipher::None => "none",
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }
    /// What `--encrypt` picks: AES-256-GCM where the CPU has AES and
    /// carry-less multiply instructions (several GB/s per core), else
    /// ChaCha20-Poly1305 (fast in plain software).
    pub fn preferred() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
            {
                return Cipher::Aes256Gcm;
            }
        }
        Cipher::ChaCha20Poly1305
    }
}

impl std::str::FromStr for Cipher {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" | "off" => Ok(Cipher::None),
            "chacha" | "chacha20" | "chacha20-poly1305" => Ok(Cipher::ChaCha20Poly1305),
            "aes" | "aes-gcm" | "aes-256-gcm" => Ok(Cipher::Aes256Gcm),
            "auto" => Ok(Cipher::preferred()),
            _ => Err(format!(
                "unknown cipher {s} (auto, chacha20-poly1305, aes-256-gcm, none)"
            )),
        }
    }
}

/// Direction of a data key: payload flows source to sink; the reverse key
/// authenticates the sink's CREDIT frames ([`StreamSeal::credits`]).
#[derive(Debug, Clone, Copy)]
pub enum Direction {
    SourceToSink,
    SinkToSource,
}

/// Key for `cipher` in `dir`, derived from the session key (HKDF-Expand
/// under a label of its own, proto::auth::keys).
pub fn data_key(session_key: &Bytes32, cipher: Cipher, dir: Direction) -> Bytes32 {
    let dir: &[u8] = match dir {
        Direction::SourceToSink => b"source to sink",
        Direction::SinkToSource => b"sink to source",
    };
    derive(session_key, label::DATA_KEY, &[&[cipher.id()], dir])
}

enum Aead {
    ChaCha(ChaCha20Poly1305),
    Aes(Box<Aes256Gcm>),
}

impl Aead {
    /// None for [`Cipher::None`].
    fn new(cipher: Cipher, key: &Bytes32) -> Option<Self> {
        match cipher {
            Cipher::None => None,
            Cipher::ChaCha20Poly1305 => Some(Aead::ChaCha(ChaCha20Poly1305::new(&(*key).into()))),
            Cipher::Aes256Gcm => Some(Aead::Aes(Box::new(Aes256Gcm::new(&(*key).into())))),
        }
    }

    fn seal(&self, nonce: [u8; 12], aad: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        match self {
            Aead::ChaCha(c) => c.encrypt_in_place_detached(&nonce.into(), aad, payload),
            Aead::Aes(c) => c.encrypt_in_place_detached(&nonce.into(), aad, payload),
        }
        .expect("payload within AEAD limits")
        .into()
    }

    fn open(
        &self,
        nonce: [u8; 12],
        aad: &[u8],
        payload: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), OpenFailed> {
        match self {
            Aead::ChaCha(c) => c.decrypt_in_place_detached(&nonce.into(), aad, payload, tag.into()),
            Aead::Aes(c) => c.decrypt_in_place_detached(&nonce.into(), aad, payload, tag.into()),
        }
        .map_err(|_| OpenFailed)
    }
}

/// The AEAD state of one data link at one end: key, stream number, link
/// epoch and the count of blocks sealed (or opened) so far.
pub struct StreamSeal {
    aead: Aead,
    stream: u16,
    epoch: u16,
    counter: u64,
}

/// Authentication of a block failed (tampered, corrupted, replayed or
/// reordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFailed;

impl StreamSeal {
    /// None when `cipher` is [`Cipher::None`].
    pub fn new(cipher: Cipher, session_key: &Bytes32, stream: u16, epoch: u16) -> Option<Self> {
        let key = data_key(session_key, cipher, Direction::SourceToSink);
        let aead = Aead::new(cipher, &key)?;
        Some(StreamSeal {
            aead,
            stream,
            epoch,
            counter: 0,
        })
    }

    /// The AEAD state of the CREDIT frames of one data link (sink to
    /// source): the reserved reverse-direction data key, so no key and
    /// nonce pair is ever shared with the blocks. None for no cipher.
    pub fn credits(cipher: Cipher, session_key: &Bytes32, stream: u16, epoch: u16) -> Option<Self> {
        let key = data_key(session_key, cipher, Direction::SinkToSource);
        let aead = Aead::new(cipher, &key)?;
        Some(StreamSeal {
            aead,
            stream,
            epoch,
            counter: 0,
        })
    }

    /// 96-bit nonce: stream u16, epoch u16, block counter u64 (LE). Unique
    /// per key as long as (stream, epoch) names one link incarnation.
    fn next_nonce(&mut self) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[..2].copy_from_slice(&self.stream.to_le_bytes());
        n[2..4].copy_from_slice(&self.epoch.to_le_bytes());
        n[4..].copy_from_slice(&self.counter.to_le_bytes());
        self.counter += 1;
        n
    }

    /// Encrypt `payload` in place; returns the tag to send after it.
    pub fn seal(&mut self, aad: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        let n = self.next_nonce();
        self.aead.seal(n, aad, payload)
    }

    /// Check and decrypt `payload` in place. On failure the payload is
    /// garbage and must not be used; the counter still advances, as the
    /// sender's did.
    pub fn open(
        &mut self,
        aad: &[u8],
        payload: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), OpenFailed> {
        let n = self.next_nonce();
        self.aead.open(n, aad, payload, tag)
    }
}

/// Key of the control link in one direction (client to server or back)
/// under `--encrypt`; a label of its own, so it never equals a data key.
pub fn control_key(session_key: &Bytes32, cipher: Cipher, client_to_server: bool) -> Bytes32 {
    let label: &[u8] = if client_to_server {
        b"client to server"
    } else {
        b"server to client"
    };
    derive(session_key, label::CONTROL_KEY, &[&[cipher.id()], label])
}

/// AEAD of one direction of a record stream (the sealed control link,
/// transport/sealed.rs): one key per direction, nonce = record counter, so
/// records cannot be dropped, replayed, reordered or reflected.
pub struct RecordSeal {
    aead: Aead,
    counter: u64,
}

impl RecordSeal {
    /// None when `cipher` is [`Cipher::None`].
    pub fn new(cipher: Cipher, key: &Bytes32) -> Option<Self> {
        let aead = Aead::new(cipher, key)?;
        Some(RecordSeal { aead, counter: 0 })
    }

    fn next_nonce(&mut self) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[0] = b'C';
        n[4..].copy_from_slice(&self.counter.to_le_bytes());
        self.counter += 1;
        n
    }

    /// Encrypt `payload` in place; returns the tag.
    pub fn seal(&mut self, aad: &[u8], payload: &mut [u8]) -> [u8; TAG_LEN] {
        let n = self.next_nonce();
        self.aead.seal(n, aad, payload)
    }

    /// Check and decrypt `payload` in place.
    pub fn open(
        &mut self,
        aad: &[u8],
        payload: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), OpenFailed> {
        let n = self.next_nonce();
        self.aead.open(n, aad, payload, tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(c: Cipher) -> (StreamSeal, StreamSeal) {
        let k = [7u8; 32];
        (
            StreamSeal::new(c, &k, 3, 0).unwrap(),
            StreamSeal::new(c, &k, 3, 0).unwrap(),
        )
    }

    #[test]
    fn roundtrip_and_tamper_for_both_ciphers() {
        for c in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            let (mut tx, mut rx) = pair(c);
            let plain: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
            let mut buf = plain.clone();
            let tag = tx.seal(b"hdr+table", &mut buf);
            assert_ne!(buf, plain, "{c:?} left the payload readable");
            rx.open(b"hdr+table", &mut buf, &tag).unwrap();
            assert_eq!(buf, plain);

            // A flipped payload bit, a changed header or table, a replayed
            // block: all fail.
            let mut b2 = plain.clone();
            let t2 = tx.seal(b"aad", &mut b2);
            let mut flipped = b2.clone();
            flipped[100] ^= 1;
            let mut rx2 = StreamSeal::new(c, &[7u8; 32], 3, 0).unwrap();
            rx2.counter = 1;
            assert_eq!(rx2.open(b"aad", &mut flipped, &t2), Err(OpenFailed));
            let mut rx3 = StreamSeal::new(c, &[7u8; 32], 3, 0).unwrap();
            rx3.counter = 1;
            assert_eq!(
                rx3.open(b"aaD", &mut b2.clone(), &t2),
                Err(OpenFailed),
                "associated data not authenticated"
            );
            // rx already consumed counter 0: the same block again is a
            // replay and fails.
            let mut replay = buf.clone();
            let tag0 = {
                let (mut t, _) = pair(c);
                t.seal(b"hdr+table", &mut replay)
            };
            assert_eq!(rx.open(b"hdr+table", &mut replay, &tag0), Err(OpenFailed));
        }
    }

    #[test]
    fn keys_differ_by_session_cipher_direction_and_nonces_by_stream() {
        let a = data_key(&[1; 32], Cipher::Aes256Gcm, Direction::SourceToSink);
        assert_ne!(
            a,
            data_key(&[2; 32], Cipher::Aes256Gcm, Direction::SourceToSink)
        );
        assert_ne!(
            a,
            data_key(&[1; 32], Cipher::ChaCha20Poly1305, Direction::SourceToSink)
        );
        assert_ne!(
            a,
            data_key(&[1; 32], Cipher::Aes256Gcm, Direction::SinkToSource)
        );
        let mut s0 = StreamSeal::new(Cipher::Aes256Gcm, &[1; 32], 0, 0).unwrap();
        let mut s1 = StreamSeal::new(Cipher::Aes256Gcm, &[1; 32], 1, 0).unwrap();
        let mut e1 = StreamSeal::new(Cipher::Aes256Gcm, &[1; 32], 0, 1).unwrap();
        let n0 = s0.next_nonce();
        assert_ne!(n0, s1.next_nonce());
        assert_ne!(n0, e1.next_nonce());
        assert_ne!(n0, s0.next_nonce());
        assert!(StreamSeal::new(Cipher::None, &[1; 32], 0, 0).is_none());
    }
}
