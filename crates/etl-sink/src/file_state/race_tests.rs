//! Another program truncating the output between the sink's look at its
//! length and its cut back: `set_len` lengthens a file, with zeros.

use std::io::{Read, Write};

use super::tests::{EIO, PATH, disk};
use super::*;
use crate::FsyncPolicy;
use etl_fs::{Mutation, OpenOptions, SimFs, SimOp};
use std::time::Duration;

/// An output handle whose next `set_len` is preceded by another
/// program's `truncate -s 0` of the file: the race the check before a
/// cut back cannot close.
#[derive(Debug)]
struct TruncatedBeforeCut {
    inner: Box<dyn FileHandle>,
    sim: SimFs,
    armed: std::sync::atomic::AtomicBool,
}

impl Read for TruncatedBeforeCut {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Write for TruncatedBeforeCut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl FileHandle for TruncatedBeforeCut {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn seek_to(&mut self, offset: u64) -> io::Result<()> {
        self.inner.seek_to(offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.armed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            self.sim.apply(&Mutation::Truncate {
                path: PATH.into(),
                len: 0,
            })?;
        }
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all()
    }
    fn metadata(&self) -> io::Result<Metadata> {
        self.inner.metadata()
    }
    fn try_lock(&self) -> Result<(), etl_fs::TryLockError> {
        self.inner.try_lock()
    }
}

#[test]
fn a_cut_back_raced_by_an_outside_truncation_never_fills_the_output_with_zeros() {
    for exactly_once in [false, true] {
        let case = format!("exactly_once {exactly_once}");
        let sim = disk(12);
        let config = FileSinkConfig {
            fsync: FsyncPolicy::Interval(Duration::from_secs(3600)),
            exactly_once,
            ..FileSinkConfig::default()
        };
        let mut state = FileState::open(Arc::new(sim.clone()), Path::new(PATH), config).unwrap();
        let line = |o: i64| Bytes::from(format!("{{\"o\":{o}}}\n"));
        let placed = |o: i64, n: usize| [(PartitionId(0), Offset(o), 0..n)];
        let first = line(0);
        state
            .append(&first, exactly_once.then_some(&placed(0, first.len())[..]))
            .unwrap();
        state.sync().unwrap();
        // The failed append is cut back off; another program truncates
        // the file just before the cut.
        let stand_in = sim
            .open(Path::new(PATH), &OpenOptions::new().read(true).append(true))
            .unwrap();
        let inner = std::mem::replace(&mut state.file, stand_in);
        state.file = Box::new(TruncatedBeforeCut {
            inner,
            sim: sim.clone(),
            armed: true.into(),
        });
        sim.fail_next(SimOp::Write, EIO);
        let second = line(1);
        let err = state
            .append(
                &second,
                exactly_once.then_some(&placed(1, second.len())[..]),
            )
            .unwrap_err();
        let bytes = sim.read(Path::new(PATH)).unwrap();
        assert!(
            !bytes.contains(&0),
            "{case}: the cut back filled the truncated output with zeros: {bytes:?}"
        );
        assert!(
            !err.is_retryable(),
            "{case}: a retry would append behind the zeros: {err:?}"
        );
    }
}
