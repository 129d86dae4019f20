//! The file source's read buffer: chunks read from a file, handed out as
//! shared slices, and reused once the last slice of a chunk is dropped.
//!
//! A record's value is a slice of the chunk it was read into, so a chunk
//! lives until its last record is written. Allocating a fresh chunk for
//! every read costs more than the read: a chunk of 256 KiB is a mapping
//! of its own (see `keep_large_buffers_out_of_the_heap` in the `etl`
//! crate), and the first write to each of its pages is a page fault
//! (measured: half of a file-to-file pipeline's page faults, about a
//! tenth of its CPU time). A chunk given back instead goes to a small
//! pool its source reads into next, already mapped and already
//! initialised.
//!
//! No chunk is written while a slice of it is alive: a chunk is read into
//! only while this buffer owns it alone, and it is *sealed* (moved into a
//! shared [`Bytes`]) before the first slice is taken; it comes back to the
//! pool when that `Bytes` and every slice of it are dropped.

use std::io::{self, Read};
use std::mem;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Buf, Bytes};

/// Bytes of spare chunks a pool keeps at most (and at least two chunks);
/// more are freed. Records are released a sink batch at a time, so a
/// pool smaller than a few batches' worth of chunks misses on every
/// burst of reads that follows (measured on the transform benchmark: 16
/// chunks of 256 KiB missed on about one read in five). 8 MiB, with the
/// batch vectors kept for reuse (`etl_record::reuse`), keeps the
/// benchmark's peak RSS under its 64 MiB budget.
const SPARE_BYTES: usize = 8 << 20;

/// A chunk holding less than this fraction (1/8) of its size when its
/// first slice is taken is copied out instead of sealed, so a followed
/// file's small reads do not each pin a whole chunk.
const COPY_BELOW_EIGHTH: usize = 8;

/// Spare read chunks of one size, shared by a source's files.
#[derive(Debug)]
pub(crate) struct ChunkPool {
    size: usize,
    /// Spare chunks kept at most.
    keep: usize,
    spare: Mutex<Vec<Vec<u8>>>,
}

impl ChunkPool {
    /// A pool of chunks of `size` bytes (at least 1).
    pub(crate) fn new(size: usize) -> Arc<Self> {
        let size = size.max(1);
        Arc::new(ChunkPool {
            size,
            keep: (SPARE_BYTES / size).max(2),
            spare: Mutex::new(Vec::new()),
        })
    }

    /// A spare chunk, or a new one; always `size` initialised bytes.
    fn get(&self) -> Vec<u8> {
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_else(|| vec![0; self.size])
    }

    /// Keep `chunk` for reuse if it has the pool's size and there is room.
    fn put(&self, chunk: Vec<u8>) {
        if chunk.len() != self.size {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() < self.keep {
            spare.push(chunk);
        }
    }

    /// Spare chunks held now.
    #[cfg(test)]
    fn spare(&self) -> usize {
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A sealed chunk: the owner behind a [`Bytes`], giving the chunk back to
/// its pool when the last slice is dropped.
struct Lent {
    chunk: Vec<u8>,
    pool: Arc<ChunkPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.chunk
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.put(mem::take(&mut self.chunk));
    }
}

#[derive(Debug)]
enum State {
    /// Read-only bytes: the unread part of a sealed chunk (or a copy).
    Sealed(Bytes),
    /// A chunk owned alone and read into; the unread bytes are
    /// `chunk[start..end]`.
    Filling {
        chunk: Vec<u8>,
        start: usize,
        end: usize,
    },
}

/// Bytes read from a file and not yet taken: one contiguous run, read in
/// chunks from a [`ChunkPool`], taken from the front as shared [`Bytes`].
#[derive(Debug)]
pub(crate) struct ReadBuf {
    state: State,
    pool: Arc<ChunkPool>,
}

impl ReadBuf {
    /// An empty buffer reading into chunks of `pool`.
    pub(crate) fn new(pool: Arc<ChunkPool>) -> Self {
        ReadBuf {
            state: State::Sealed(Bytes::new()),
            pool,
        }
    }

    /// The bytes read and not yet taken.
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.state {
            State::Sealed(bytes) => bytes,
            State::Filling { chunk, start, end } => &chunk[*start..*end],
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget the bytes read (the file position moved).
    pub(crate) fn clear(&mut self) {
        match &mut self.state {
            State::Sealed(bytes) => *bytes = Bytes::new(),
            State::Filling { start, end, .. } => (*start, *end) = (0, 0),
        }
    }

    /// Give the chunk back (the file is closed or idle); what was read and
    /// not taken is forgotten.
    pub(crate) fn release(&mut self) {
        if let State::Filling { chunk, .. } =
            mem::replace(&mut self.state, State::Sealed(Bytes::new()))
        {
            self.pool.put(chunk);
        }
    }

    /// Drop the first `n` bytes (at most [`len`](Self::len)).
    pub(crate) fn advance(&mut self, n: usize) {
        match &mut self.state {
            State::Sealed(bytes) => bytes.advance(n),
            State::Filling { start, end, .. } => *start = (*start + n).min(*end),
        }
    }

    /// Take the first `n` bytes (at most [`len`](Self::len)) as a shared
    /// slice of the chunk they were read into.
    pub(crate) fn take(&mut self, n: usize) -> Bytes {
        self.seal();
        match &mut self.state {
            State::Sealed(bytes) => bytes.split_to(n.min(bytes.len())),
            State::Filling { .. } => unreachable!("sealed just above"),
        }
    }

    /// Stop reading into the chunk and share it, so slices can be taken.
    fn seal(&mut self) {
        if let State::Sealed(_) = self.state {
            return;
        }
        let State::Filling { chunk, start, end } =
            mem::replace(&mut self.state, State::Sealed(Bytes::new()))
        else {
            unreachable!("checked just above");
        };
        let sealed = if (end - start) * COPY_BELOW_EIGHTH < chunk.len() {
            let copy = Bytes::copy_from_slice(&chunk[start..end]);
            self.pool.put(chunk);
            copy
        } else {
            Bytes::from_owner(Lent {
                chunk,
                pool: Arc::clone(&self.pool),
            })
            .slice(start..end)
        };
        self.state = State::Sealed(sealed);
    }

    /// One read from `file` appended to the bytes not yet taken; the
    /// number of bytes read, 0 at the end of the file. Reads at most a
    /// chunk's size at a time; a run longer than a chunk (a long line)
    /// grows it.
    pub(crate) fn fill(&mut self, file: &mut impl Read) -> io::Result<usize> {
        if let State::Sealed(bytes) = &self.state {
            // What is left of a sealed chunk (a line's start) goes to the
            // front of a chunk owned alone.
            let mut chunk = self.pool.get();
            if bytes.len() > chunk.len() / 2 {
                chunk.resize(bytes.len() + self.pool.size, 0);
            }
            chunk[..bytes.len()].copy_from_slice(bytes);
            let end = bytes.len();
            self.state = State::Filling {
                chunk,
                start: 0,
                end,
            };
        }
        let State::Filling { chunk, start, end } = &mut self.state else {
            unreachable!("filling just above");
        };
        if *end == chunk.len() {
            if *start > 0 {
                chunk.copy_within(*start..*end, 0);
                (*start, *end) = (0, *end - *start);
            }
            // Room for a read worth making, else a longer chunk.
            if chunk.len() - *end < (self.pool.size / 2).max(1) {
                let grown = chunk.len() + self.pool.size;
                chunk.resize(grown, 0);
            }
        }
        loop {
            match file.read(&mut chunk[*end..]) {
                Ok(n) => {
                    *end += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader handing out `data` in reads of at most `step` bytes.
    struct Steps<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Steps<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(out.len()).min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Read `data` through a buffer, taking everything up to each
    /// newline as soon as it is there.
    fn lines(pool: &Arc<ChunkPool>, data: &[u8], step: usize) -> Vec<Bytes> {
        let mut file = Steps { data, step };
        let mut buf = ReadBuf::new(Arc::clone(pool));
        let mut out = Vec::new();
        loop {
            if let Some(i) = memchr::memchr(b'\n', buf.bytes()) {
                out.push(buf.take(i + 1));
            } else if buf.fill(&mut file).unwrap() == 0 {
                break;
            }
        }
        if !buf.is_empty() {
            out.push(buf.take(buf.len()));
        }
        out
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                format!("{{\"line\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 97)).into_bytes()
            })
            .collect()
    }

    #[test]
    fn slices_read_back_the_file_whatever_the_read_sizes() {
        let data = text(3000);
        for (size, step) in [(4096, 4096), (4096, 1000), (4096, 7), (64, 5000), (1, 3)] {
            let pool = ChunkPool::new(size);
            let got = lines(&pool, &data, step);
            assert_eq!(got.concat(), data, "chunk {size}, reads of {step}");
            assert!(got.iter().all(|l| l.ends_with(b"\n")));
        }
    }

    #[test]
    fn a_chunk_comes_back_to_the_pool_when_its_last_slice_is_dropped() {
        let pool = ChunkPool::new(4096);
        let data = text(2000);
        let got = lines(&pool, &data, 4096);
        // Slices alive: every full chunk is still lent out.
        let lent_out = pool.spare();
        let keep = got[got.len() / 2].clone();
        drop(got);
        assert!(pool.spare() > lent_out);
        // The chunk `keep` points into stays out, and its bytes stay.
        let copy = keep.to_vec();
        let again = lines(&pool, &text(2000), 4096);
        assert_eq!(keep.to_vec(), copy);
        let spare = pool.spare();
        assert!(spare < pool.keep);
        drop(keep);
        assert_eq!(pool.spare(), spare + 1);
        drop(again);
    }

    #[test]
    fn reused_chunks_are_not_written_while_a_slice_is_alive() {
        let pool = ChunkPool::new(4096);
        let first = lines(&pool, &text(1000), 4096);
        let copies: Vec<Vec<u8>> = first.iter().map(|l| l.to_vec()).collect();
        for _ in 0..5 {
            let _other = lines(&pool, &vec![b'z'; 50_000], 4096);
        }
        let now: Vec<Vec<u8>> = first.iter().map(|l| l.to_vec()).collect();
        assert_eq!(now, copies);
    }

    #[test]
    fn small_reads_are_copied_so_they_do_not_pin_a_chunk() {
        let pool = ChunkPool::new(4096);
        let mut buf = ReadBuf::new(Arc::clone(&pool));
        let mut file = Steps {
            data: b"{\"a\":1}\n",
            step: 100,
        };
        buf.fill(&mut file).unwrap();
        let line = buf.take(8);
        assert_eq!(&line[..], b"{\"a\":1}\n");
        // The chunk went back at once; the line is a copy.
        assert_eq!(pool.spare(), 1);
    }

    #[test]
    fn a_run_longer_than_a_chunk_grows_it_and_the_pool_keeps_only_its_size() {
        let pool = ChunkPool::new(16);
        let mut data = vec![b'a'; 100];
        data.push(b'\n');
        let got = lines(&pool, &data, 1000);
        assert_eq!(got.concat(), data);
        drop(got);
        let spare = pool.spare.lock().unwrap();
        assert!(spare.iter().all(|c| c.len() == 16));
    }

    #[test]
    fn a_full_chunk_with_little_consumed_makes_room_for_a_real_read() {
        let pool = ChunkPool::new(64);
        let mut buf = ReadBuf::new(Arc::clone(&pool));
        let data = vec![b'a'; 500];
        let mut file = Steps {
            data: &data,
            step: 1000,
        };
        assert_eq!(buf.fill(&mut file).unwrap(), 64);
        buf.advance(1);
        assert!(buf.fill(&mut file).unwrap() >= 32);
        assert_eq!(buf.bytes(), &data[1..buf.len() + 1]);
    }

    #[test]
    fn advance_clear_and_release_forget_what_was_read() {
        let pool = ChunkPool::new(4096);
        let mut buf = ReadBuf::new(Arc::clone(&pool));
        let mut file = Steps {
            data: b"abcdef\nghi\n",
            step: 100,
        };
        buf.fill(&mut file).unwrap();
        buf.advance(7);
        assert_eq!(buf.bytes(), b"ghi\n");
        buf.clear();
        assert!(buf.is_empty());
        buf.release();
        assert_eq!(pool.spare(), 1);
        assert!(buf.is_empty());
    }
}
