//! Payload encryption at rest (`encryptionEnabled` with `QUEEN_ENCRYPTION_KEY`): AES-256-GCM with
//! a fresh OS-random 96-bit nonce per message (RustCrypto's `aes-gcm`). A sealed payload is
//! `u8 version (1) | 12 B nonce | ciphertext | 16 B tag`, kept in its frame with the frame's
//! encrypted flag, so storage, retention, dead letters and requeues carry it unchanged and only
//! the broker ever sees the plaintext. A payload is sealed before compression: the segment's zstd
//! then compresses the frame headers only.
//!
//! Every broker of a cluster must hold the same key: the first broker with one stores a sealed
//! constant (`cluster_settings.encryption_key_check`); a broker whose key cannot open it, or
//! that has no key while one is stored, refuses to start, so nothing is written under another
//! key and nothing is ever served undecrypted.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use queen_core::frames::{Frame, FrameView};
use queen_core::storage::{AdminStorage, PushGroup};

const VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
/// The cluster setting holding the sealed key check.
pub const KEY_CHECK_SETTING: &str = "encryption_key_check";
const KEY_CHECK_PLAINTEXT: &[u8] = b"queen payload encryption key check, version 1";

/// The broker's payload key. Its `Debug` never shows the key.
pub struct PayloadCipher {
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for PayloadCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PayloadCipher(AES-256-GCM)")
    }
}

impl PayloadCipher {
    /// From `QUEEN_ENCRYPTION_KEY`: 64 hexadecimal characters (32 bytes). The error never
    /// repeats the value.
    pub fn from_hex(text: &str) -> Result<PayloadCipher, String> {
        let bytes = hex::decode(text.trim())
            .ok()
            .filter(|b| b.len() == 32)
            .ok_or("QUEEN_ENCRYPTION_KEY must be 64 hexadecimal characters (a 32-byte key)")?;
        Ok(PayloadCipher {
            cipher: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&bytes)),
        })
    }

    pub fn seal(&self, plaintext: &[u8]) -> Result<Vec<u8>, String> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(&nonce, plaintext)
            .map_err(|_| "payload encryption failed".to_string())?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext, or an error when the payload was not sealed under this key (or is
    /// damaged): the tag check fails, so a wrong key is never mistaken for data.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, String> {
        let (version, rest) = sealed.split_first().ok_or("sealed payload is empty")?;
        if *version != VERSION || rest.len() < NONCE_LEN {
            return Err(format!(
                "sealed payload of unknown form (version {version})"
            ));
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        self.cipher
            .decrypt(Nonce::from_slice(nonce), ciphertext)
            .map_err(|_| "the payload does not open under QUEEN_ENCRYPTION_KEY".to_string())
    }

    /// Seals every plaintext frame of a group (the client's compressed blob no longer matches).
    pub fn seal_group(&self, group: &mut PushGroup) -> Result<(), String> {
        for f in group.frames.iter_mut().filter(|f| !f.encrypted) {
            f.payload = self.seal(&f.payload)?;
            f.encrypted = true;
        }
        group.blob = None;
        Ok(())
    }

    /// A new key check to propose to the cluster.
    pub fn key_check(&self) -> Result<Vec<u8>, String> {
        self.seal(KEY_CHECK_PLAINTEXT)
    }

    /// Whether `stored` (the cluster's key check) was sealed under this key.
    pub fn opens_key_check(&self, stored: &[u8]) -> bool {
        self.open(stored).is_ok_and(|p| p == KEY_CHECK_PLAINTEXT)
    }
}

/// Holds this broker to the cluster's key, before it serves: with a key, the stored key check
/// (this key's, when it is the first) must open under it; without one, there must be no key
/// check (the cluster encrypts, and this broker could neither write nor read those queues).
pub async fn check_cluster_key(
    admin: &dyn AdminStorage,
    cipher: Option<&PayloadCipher>,
) -> Result<(), String> {
    let proposed = cipher.map(PayloadCipher::key_check).transpose()?;
    let stored = admin
        .cluster_setting(KEY_CHECK_SETTING, proposed)
        .await
        .map_err(|e| format!("reading the cluster's encryption key check: {e}"))?;
    match (cipher, stored) {
        (Some(c), Some(stored)) if c.opens_key_check(&stored) => Ok(()),
        (Some(_), _) => Err(
            "QUEEN_ENCRYPTION_KEY is not the key this cluster encrypts payloads \
             with (queen.cluster_settings holds a key check it cannot open): start with the \
             cluster's key"
                .into(),
        ),
        (None, Some(_)) => Err(
            "this cluster encrypts payloads (queen.cluster_settings holds \
             an encryption key check) and QUEEN_ENCRYPTION_KEY is not set: start with the \
             cluster's key (or, once no encrypted message is left, delete the key check)"
                .into(),
        ),
        (None, None) => Ok(()),
    }
}

/// A delivered frame's JSON payload: opened when sealed. `None` for the cipher: this broker
/// has no key (it refuses to start where a key is in use, so only a broker started before the
/// cluster's first key meets this).
pub fn plaintext<'a>(
    cipher: Option<&PayloadCipher>,
    frame: &'a Frame,
) -> Result<std::borrow::Cow<'a, [u8]>, String> {
    opened(cipher, frame.encrypted, &frame.payload, frame.message_id)
}

/// `plaintext` of a frame read in place.
pub fn plaintext_of_view<'a>(
    cipher: Option<&PayloadCipher>,
    frame: &FrameView<'a>,
) -> Result<std::borrow::Cow<'a, [u8]>, String> {
    opened(cipher, frame.encrypted, frame.payload, frame.message_id)
}

fn opened<'a>(
    cipher: Option<&PayloadCipher>,
    encrypted: bool,
    payload: &'a [u8],
    message_id: uuid::Uuid,
) -> Result<std::borrow::Cow<'a, [u8]>, String> {
    if !encrypted {
        return Ok(std::borrow::Cow::Borrowed(payload));
    }
    let cipher = cipher.ok_or_else(|| {
        format!("message {message_id} is encrypted and this broker has no QUEEN_ENCRYPTION_KEY")
    })?;
    cipher
        .open(payload)
        .map(std::borrow::Cow::Owned)
        .map_err(|e| format!("message {message_id}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn seals_with_fresh_nonces_and_opens_only_under_its_key() {
        let c = PayloadCipher::from_hex(KEY).unwrap();
        let a = c.seal(b"{\"n\":1}").unwrap();
        let b = c.seal(b"{\"n\":1}").unwrap();
        assert_ne!(a, b, "a fresh nonce per message");
        assert_eq!(c.open(&a).unwrap(), b"{\"n\":1}");
        let other = PayloadCipher::from_hex(&KEY.replace("1f", "20")).unwrap();
        assert!(other.open(&a).is_err());
        let mut damaged = a.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert!(c.open(&damaged).is_err());
        assert!(c.open(&[]).is_err() && c.open(&[2, 0, 0]).is_err());
    }

    #[test]
    fn key_check_tells_keys_apart() {
        let c = PayloadCipher::from_hex(KEY).unwrap();
        let check = c.key_check().unwrap();
        assert!(c.opens_key_check(&check));
        let other = PayloadCipher::from_hex(&KEY.replace("00", "ff")).unwrap();
        assert!(!other.opens_key_check(&check));
    }

    #[test]
    fn bad_keys_are_refused_without_echoing_them() {
        for bad in ["", "abc", &KEY[..62], &format!("{}zz", &KEY[..62])] {
            let e = PayloadCipher::from_hex(bad).unwrap_err();
            assert!(!bad.is_empty() && !e.contains(bad) || bad.is_empty());
        }
        assert!(format!("{:?}", PayloadCipher::from_hex(KEY).unwrap()).contains("AES"));
    }
}
