//! The push failover buffer (`FILE_BUFFER_DIR`, off unless set). A push accepted while
//! PostgreSQL is unreachable, or while push maintenance mode is on, is appended to a local file
//! and fsync'd before the client hears `buffered`; the broker's drain stores the buffered pushes
//! once storage answers again, in the order they were accepted (so per-partition FIFO holds),
//! each with the message ids it was given and the time it was accepted. Storing is idempotent by
//! transactionId, so a drain cut short by a crash stores nothing twice when it starts over from
//! its last recorded position.
//!
//! Files: `pushes.log` (one JSON record per accepted push request) and `pushes.drained` (the byte
//! offset up to which records are stored, replaced atomically). A record storage refuses for
//! good (a client's bad data) moves to `failed.log` rather than block the ones after it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use queen_core::frames::Frame;
use queen_core::storage::PushGroup;
use queen_core::Timestamp;
use serde::{Deserialize, Serialize};

use crate::helpers::lock;

#[derive(Serialize, Deserialize)]
struct Record {
    accepted_at_us: i64,
    groups: Vec<RecordGroup>,
}

#[derive(Serialize, Deserialize)]
struct RecordGroup {
    queue: String,
    partition: String,
    frames: Vec<RecordFrame>,
}

#[derive(Serialize, Deserialize)]
struct RecordFrame {
    message_id: String,
    transaction_id: String,
    trace_id: Option<String>,
    /// The producer identity the push was authenticated as (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    producer: Option<String>,
    /// The payload's JSON text, as the client sent it (empty when `sealed`).
    payload: String,
    /// The sealed payload in hex, for a queue with encryptionEnabled (the plaintext never
    /// reaches the buffer file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed: Option<String>,
}

/// One buffered push, read back for the drain.
pub struct Buffered {
    pub accepted_at: Timestamp,
    pub groups: Vec<PushGroup>,
    /// Where the next record starts: the drained offset once this one is stored.
    next_offset: u64,
    /// The record's line, for `failed.log`.
    line: String,
}

impl Buffered {
    fn messages(&self) -> usize {
        self.groups.iter().map(|g| g.frames.len()).sum()
    }
}

pub struct FileBuffer {
    dir: PathBuf,
    /// The append handle; also serializes appends against the drain's truncation.
    log: Mutex<File>,
    /// Records appended and not yet stored.
    pending: AtomicU64,
    /// Messages in those records.
    pending_messages: AtomicU64,
}

impl std::fmt::Debug for FileBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBuffer")
            .field("dir", &self.dir)
            .field("pending", &self.pending())
            .finish()
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl FileBuffer {
    /// Opens (or creates) the buffer in `dir`, recovering what a previous process left.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<FileBuffer> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(dir.join("pushes.log"))?;
        // A record a crash cut short (no newline yet) was never answered `buffered`: drop it, so
        // the next append does not run on from it.
        let content = fs::read(dir.join("pushes.log"))?;
        let whole = content
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        if whole < content.len() {
            log.set_len(whole as u64)?;
            log.sync_all()?;
        }
        let buffer = FileBuffer {
            dir,
            log: Mutex::new(log),
            pending: AtomicU64::new(0),
            pending_messages: AtomicU64::new(0),
        };
        let left = buffer.read_from(buffer.drained_offset()?, usize::MAX)?;
        buffer.pending.store(left.len() as u64, Ordering::SeqCst);
        let messages: usize = left.iter().map(Buffered::messages).sum();
        buffer
            .pending_messages
            .store(messages as u64, Ordering::SeqCst);
        Ok(buffer)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Buffered pushes not yet stored.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::SeqCst)
    }

    /// Messages in them.
    pub fn pending_messages(&self) -> u64 {
        self.pending_messages.load(Ordering::SeqCst)
    }

    fn drained_offset(&self) -> io::Result<u64> {
        match fs::read_to_string(self.dir.join("pushes.drained")) {
            Ok(s) => s.trim().parse().map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("pushes.drained: {e}"))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Records the drained offset: a new file renamed over the old one, then the directory synced,
    /// so a crash leaves the old offset or the new one, never a torn one.
    fn set_drained_offset(&self, offset: u64) -> io::Result<()> {
        let tmp = self.dir.join("pushes.drained.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(offset.to_string().as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join("pushes.drained"))?;
        sync_dir(&self.dir)
    }

    /// Appends one accepted push and makes it durable before returning (blocking I/O: call it
    /// off the runtime's workers).
    pub fn append(&self, accepted_at: Timestamp, groups: &[PushGroup]) -> io::Result<()> {
        let record = Record {
            accepted_at_us: accepted_at.0,
            groups: groups
                .iter()
                .map(|g| {
                    Ok(RecordGroup {
                        queue: g.queue.clone(),
                        partition: g.partition.clone(),
                        frames: g
                            .frames
                            .iter()
                            .map(|f| {
                                let (payload, sealed) = if f.encrypted {
                                    (String::new(), Some(hex::encode(&f.payload)))
                                } else {
                                    let text =
                                        String::from_utf8(f.payload.clone()).map_err(|e| {
                                            io::Error::new(io::ErrorKind::InvalidData, e)
                                        })?;
                                    (text, None)
                                };
                                Ok(RecordFrame {
                                    message_id: f.message_id.to_string(),
                                    transaction_id: f.transaction_id.clone(),
                                    trace_id: f.trace_id.map(|t| t.to_string()),
                                    producer: f.producer.clone(),
                                    payload,
                                    sealed,
                                })
                            })
                            .collect::<io::Result<_>>()?,
                    })
                })
                .collect::<io::Result<_>>()?,
        };
        let mut line = serde_json::to_vec(&record)?;
        line.push(b'\n');
        let mut log = lock(&self.log);
        log.write_all(&line)?;
        log.sync_data()?;
        self.pending.fetch_add(1, Ordering::SeqCst);
        let messages: usize = groups.iter().map(|g| g.frames.len()).sum();
        self.pending_messages
            .fetch_add(messages as u64, Ordering::SeqCst);
        Ok(())
    }

    /// Up to `max` records from byte `offset` on, in order.
    fn read_from(&self, offset: u64, max: usize) -> io::Result<Vec<Buffered>> {
        let mut f = File::open(self.dir.join("pushes.log"))?;
        f.seek(SeekFrom::Start(offset))?;
        let mut reader = BufReader::new(f);
        let mut out = vec![];
        let mut at = offset;
        while out.len() < max {
            let mut line = String::new();
            let n = reader.read_line(&mut line)?;
            if n == 0 || !line.ends_with('\n') {
                // The end, or a record a crash cut short before its fsync: never answered
                // `buffered`, so nothing was promised for it.
                break;
            }
            at += n as u64;
            let record: Record = serde_json::from_str(line.trim_end()).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("pushes.log: {e}"))
            })?;
            out.push(Buffered {
                accepted_at: Timestamp(record.accepted_at_us),
                groups: record
                    .groups
                    .into_iter()
                    .map(|g| {
                        Ok(PushGroup {
                            queue: g.queue,
                            partition: g.partition,
                            frames: g
                                .frames
                                .into_iter()
                                .map(|f| {
                                    let uuid = |s: &str| {
                                        uuid::Uuid::parse_str(s).map_err(|e| {
                                            io::Error::new(io::ErrorKind::InvalidData, e)
                                        })
                                    };
                                    let (payload, encrypted) = match f.sealed {
                                        Some(hex) => (
                                            hex::decode(hex).map_err(|e| {
                                                io::Error::new(io::ErrorKind::InvalidData, e)
                                            })?,
                                            true,
                                        ),
                                        None => (f.payload.into_bytes(), false),
                                    };
                                    Ok(Frame {
                                        message_id: uuid(&f.message_id)?,
                                        transaction_id: f.transaction_id,
                                        trace_id: f.trace_id.as_deref().map(uuid).transpose()?,
                                        producer: f.producer,
                                        encrypted,
                                        payload,
                                    })
                                })
                                .collect::<io::Result<_>>()?,
                            blob: None,
                        })
                    })
                    .collect::<io::Result<_>>()?,
                next_offset: at,
                line,
            });
        }
        Ok(out)
    }

    /// The next buffered pushes to store, oldest first.
    pub fn next_batch(&self, max: usize) -> io::Result<Vec<Buffered>> {
        self.read_from(self.drained_offset()?, max)
    }

    /// `record` is stored: the drain moves past it. When nothing is left, the files start over
    /// (under the append lock, so no push lands in between).
    pub fn mark_stored(&self, record: &Buffered) -> io::Result<()> {
        self.set_drained_offset(record.next_offset)?;
        self.pending.fetch_sub(1, Ordering::SeqCst);
        self.pending_messages
            .fetch_sub(record.messages() as u64, Ordering::SeqCst);
        let log = lock(&self.log);
        if log.metadata()?.len() == record.next_offset {
            log.set_len(0)?;
            log.sync_all()?;
            self.set_drained_offset(0)?;
        }
        Ok(())
    }

    /// `record` can never be stored (storage refused its data): it moves to `failed.log` so the
    /// ones after it are not held up.
    pub fn mark_failed(&self, record: &Buffered) -> io::Result<()> {
        let mut failed = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("failed.log"))?;
        failed.write_all(record.line.as_bytes())?;
        failed.sync_data()?;
        self.mark_stored(record)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn group(partition: &str, tx: &str) -> PushGroup {
        PushGroup {
            queue: "q".into(),
            partition: partition.into(),
            frames: vec![Frame {
                producer: None,
                encrypted: false,
                message_id: uuid::Uuid::from_u128(7),
                transaction_id: tx.into(),
                trace_id: None,
                payload: br#"{"a": 1}"#.to_vec(),
            }],
            blob: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("queen-buffer-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn producer_and_sealed_payloads_survive_the_file() {
        let dir = scratch("sealed");
        let b = FileBuffer::open(&dir).unwrap();
        let mut g = group("p", "t1");
        g.frames[0].producer = Some("svc-a".into());
        g.frames[0].encrypted = true;
        g.frames[0].payload = vec![1, 0, 255, 7];
        let plain = group("p", "t2");
        b.append(Timestamp(1), &[g.clone(), plain.clone()]).unwrap();
        let back = b.next_batch(1).unwrap().pop().unwrap();
        assert_eq!(back.groups, vec![g, plain]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn records_come_back_in_order_and_survive_a_reopen() {
        let dir = scratch("order");
        let b = FileBuffer::open(&dir).unwrap();
        b.append(Timestamp(1), &[group("p", "t1")]).unwrap();
        b.append(Timestamp(2), &[group("p", "t2")]).unwrap();
        assert_eq!(b.pending(), 2);
        let first = b.next_batch(1).unwrap().pop().unwrap();
        assert_eq!(first.groups[0].frames[0].transaction_id, "t1");
        assert_eq!(first.accepted_at, Timestamp(1));
        b.mark_stored(&first).unwrap();
        drop(b);
        // A new process: the stored record is not read again, the other one is.
        let b = FileBuffer::open(&dir).unwrap();
        assert_eq!(b.pending(), 1);
        let rest = b.next_batch(10).unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].groups[0].frames[0].transaction_id, "t2");
        assert_eq!(rest[0].groups[0].frames[0].payload, br#"{"a": 1}"#);
        b.mark_stored(&rest[0]).unwrap();
        assert_eq!(b.pending(), 0);
        assert_eq!(
            fs::metadata(dir.join("pushes.log")).unwrap().len(),
            0,
            "starts over"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_record_cut_short_by_a_crash_is_ignored() {
        let dir = scratch("torn");
        let b = FileBuffer::open(&dir).unwrap();
        b.append(Timestamp(1), &[group("p", "t1")]).unwrap();
        drop(b);
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("pushes.log"))
            .unwrap();
        f.write_all(br#"{"accepted_at_us": 2, "gro"#).unwrap();
        let b = FileBuffer::open(&dir).unwrap();
        assert_eq!(b.pending(), 1);
        // What comes next is whole again.
        b.append(Timestamp(3), &[group("p", "t3")]).unwrap();
        let all = b.next_batch(10).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].groups[0].frames[0].transaction_id, "t3");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_refused_record_moves_aside() {
        let dir = scratch("failed");
        let b = FileBuffer::open(&dir).unwrap();
        b.append(Timestamp(1), &[group("p", "bad")]).unwrap();
        b.append(Timestamp(2), &[group("p", "good")]).unwrap();
        let bad = b.next_batch(1).unwrap().pop().unwrap();
        b.mark_failed(&bad).unwrap();
        let next = b.next_batch(1).unwrap().pop().unwrap();
        assert_eq!(next.groups[0].frames[0].transaction_id, "good");
        assert!(fs::read_to_string(dir.join("failed.log"))
            .unwrap()
            .contains("\"bad\""));
        let _ = fs::remove_dir_all(&dir);
    }
}
