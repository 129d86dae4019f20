//! Loom models of the checkpointer core: batches resolving concurrently
//! from several threads, a revoke racing an in-flight acknowledgement of
//! the revoked epoch, and credits reserved and released concurrently
//! (never past the limits, balanced at the end), a halt racing the
//! failures it causes, and a hand-over racing an exactly-once write and a
//! failure of the same partition.
//!
//! The checkpointer serialises every event on its thread; what races is
//! *when* a resolution is produced relative to what the checkpointer has
//! already consumed. Resolutions go to an `etl_ack` recorder, and the
//! model's main thread plays the checkpointer, consuming whatever has been
//! recorded at an arbitrary point of the interleaving.

use std::time::Instant;

use etl_ack::loom_support::{Recorder, recorded, recorded_fenced};
use etl_ack::{AckMsg, AckSet, BatchId, BatchMeta, WriteFence};
use etl_record::{Offset, PartitionId};
use loom::sync::Mutex;
use loom::thread;

use crate::budget::{InFlightBudget, InFlightLimits};
use crate::commits::{RevokeGate, revoke_gate};
use crate::halt::{Halt, Halting, Verdict};
use crate::sync::Arc;
use crate::tracker::PartitionTracker;

const P: PartitionId = PartitionId(0);

fn recorder() -> Recorder {
    Arc::new(Mutex::new(Vec::new()))
}

/// Take what has been recorded so far.
fn take(rec: &Recorder) -> Vec<AckMsg> {
    rec.lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

fn meta(epoch: u32, seq: u64) -> BatchMeta {
    let first = seq as i64 * 10;
    BatchMeta {
        id: BatchId {
            partition: P,
            epoch,
            seq,
        },
        first_offset: Offset(first),
        last_offset: Offset(first + 9),
        records: 10,
        bytes: 1,
    }
}

fn budget() -> InFlightBudget {
    InFlightBudget::new(InFlightLimits {
        max_in_flight_batches_per_partition: 2,
        max_in_flight_bytes_per_partition: 100,
        max_in_flight_batches: 2,
        max_in_flight_bytes: 100,
    })
}

/// Feed resolutions to the tracker the way the checkpointer does,
/// releasing credit; returns the watermark seen after each one.
fn consume(t: &mut PartitionTracker, b: &InFlightBudget, msgs: Vec<AckMsg>) -> Vec<Offset> {
    msgs.into_iter()
        .map(|m| {
            let e = t.resolved(&m);
            b.release_many(P, e.release.batches, e.release.bytes);
            t.watermark()
        })
        .collect()
}

#[test]
fn batches_resolving_on_two_threads() {
    loom::model(|| {
        let rec = recorder();
        let b = budget();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let now = Instant::now();
        let metas = [meta(1, 0), meta(1, 1)];
        let mut handles = Vec::new();
        for m in &metas {
            assert!(b.try_acquire(P, m.bytes));
            t.opened(m, now);
            handles.push(recorded(m.id, m.last_offset, &rec));
        }
        let second = handles.pop().expect("two handles");
        let first = handles.pop().expect("two handles");
        let t1 = thread::spawn(move || drop(first));
        let t2 = thread::spawn(move || drop(second));
        // The checkpointer consumes mid-race...
        let early = take(&rec);
        let mut resolutions: Vec<u64> = early.iter().map(|m| m.id.seq).collect();
        let seen = consume(&mut t, &b, early);
        for w in &seen {
            // ...and never passes batch 0 unless batch 0 is delivered.
            assert!(*w == Offset(0) || *w == Offset(10) || *w == Offset(20));
        }
        t1.join().expect("no panic");
        t2.join().expect("no panic");
        let late = take(&rec);
        resolutions.extend(late.iter().map(|m| m.id.seq));
        resolutions.sort_unstable();
        assert_eq!(resolutions, [0, 1], "each batch resolves exactly once");
        let rest = consume(&mut t, &b, late);
        let mut last = Offset(0);
        for w in seen.iter().chain(&rest) {
            assert!(*w >= last, "the watermark never regresses");
            last = *w;
        }
        assert_eq!(t.watermark(), Offset(20), "all delivered: last offset + 1");
        assert_eq!(b.in_flight().batches, 0, "every credit released once");
        assert_eq!(t.stale(), 0);
    });
}

#[test]
fn a_failure_on_one_thread_pins_the_other_threads_delivery() {
    loom::model(|| {
        let rec = recorder();
        let b = budget();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let now = Instant::now();
        let (m0, m1) = (meta(1, 0), meta(1, 1));
        for m in [&m0, &m1] {
            assert!(b.try_acquire(P, m.bytes));
            t.opened(m, now);
        }
        let a0 = recorded(m0.id, m0.last_offset, &rec);
        let a1 = recorded(m1.id, m1.last_offset, &rec);
        let t1 = thread::spawn(move || {
            a0.fail();
            drop(a0);
        });
        let t2 = thread::spawn(move || drop(a1));
        let mut replays = 0;
        let mut step = |t: &mut PartitionTracker| {
            for m in take(&rec) {
                let e = t.resolved(&m);
                b.release_many(P, e.release.batches, e.release.bytes);
                replays += usize::from(e.replay.is_some());
                assert_eq!(t.watermark(), Offset(0), "batch 0 failed: pinned");
            }
        };
        step(&mut t);
        t1.join().expect("no panic");
        t2.join().expect("no panic");
        step(&mut t);
        assert_eq!(replays, 1, "exactly one replay");
        assert_eq!(t.epoch(), 2);
        assert_eq!(b.in_flight().batches, 0);
    });
}

#[test]
fn revoke_races_an_in_flight_ack_of_the_revoked_epoch() {
    loom::model(|| {
        let rec = recorder();
        let b = budget();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let m = meta(1, 0);
        assert!(b.try_acquire(P, m.bytes));
        t.opened(&m, Instant::now());
        let ack = recorded(m.id, m.last_offset, &rec);
        let sink = thread::spawn(move || drop(ack));
        // Acks first, then the revoke: whatever was recorded before the
        // revoke counts, anything later is stale.
        consume(&mut t, &b, take(&rec));
        let before = t.watermark();
        let release = t.end_epoch();
        b.release_many(P, release.batches, release.bytes);
        sink.join().expect("no panic");
        consume(&mut t, &b, take(&rec));
        assert_eq!(t.watermark(), before, "a stale ack changes nothing");
        if before == Offset(0) {
            assert_eq!(t.stale(), 1, "the late ack was counted as stale");
        } else {
            assert_eq!(before, Offset(10));
            assert_eq!(t.stale(), 0);
        }
        assert_eq!(b.in_flight().batches, 0, "released exactly once");
    });
}

#[test]
fn credits_acquired_and_released_concurrently() {
    loom::model(|| {
        let b = InFlightBudget::new(InFlightLimits {
            max_in_flight_batches_per_partition: 1,
            max_in_flight_bytes_per_partition: 10,
            max_in_flight_batches: 1,
            max_in_flight_bytes: 10,
        });
        assert!(b.try_acquire(P, 5));
        let releaser = {
            let b = b.clone();
            thread::spawn(move || b.release(P, 5))
        };
        let contender = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(PartitionId(1), 5))
        };
        let mine = b.try_acquire(P, 5);
        releaser.join().expect("no panic");
        let theirs = contender.join().expect("no panic");
        // Never more than one batch in flight at a time.
        assert!(!(mine && theirs));
        let expect = u32::from(mine) + u32::from(theirs);
        assert_eq!(b.in_flight().batches, expect);
        assert_eq!(b.in_flight().bytes, u64::from(expect) * 5);
    });
}

#[test]
fn try_acquire_and_release_many_racing_stay_within_limits_and_balance() {
    const LIMITS: InFlightLimits = InFlightLimits {
        max_in_flight_batches_per_partition: 2,
        max_in_flight_bytes_per_partition: 8,
        max_in_flight_batches: 3,
        max_in_flight_bytes: 12,
    };
    loom::model(|| {
        let b = InFlightBudget::new(LIMITS);
        let within = |b: &InFlightBudget| {
            let all = b.in_flight();
            assert!(
                all.batches <= LIMITS.max_in_flight_batches
                    && all.bytes <= LIMITS.max_in_flight_bytes
            );
            for p in [P, PartitionId(1)] {
                let one = b.in_flight_of(p);
                assert!(one.batches <= LIMITS.max_in_flight_batches_per_partition);
                assert!(one.bytes <= LIMITS.max_in_flight_bytes_per_partition);
            }
        };
        // Each thread takes what credit it can for its partition, checks
        // the bounds, then gives it all back in one call.
        let worker = |b: InFlightBudget, p: PartitionId| {
            move || {
                let got = (0..2).filter(|_| b.try_acquire(p, 4)).count() as u32;
                within(&b);
                b.release_many(p, got, u64::from(got) * 4);
                got
            }
        };
        let t1 = thread::spawn(worker(b.clone(), P));
        let t2 = thread::spawn(worker(b.clone(), PartitionId(1)));
        let (g1, g2) = (t1.join().expect("no panic"), t2.join().expect("no panic"));
        assert!(g1 >= 1 && g2 >= 1, "three batches fit: each gets one");
        within(&b);
        assert_eq!(
            b.in_flight(),
            crate::budget::InFlight::default(),
            "balanced"
        );
        assert_eq!(b.in_flight_of(P), crate::budget::InFlight::default());
    });
}

#[test]
fn a_failure_caused_by_a_halt_always_finds_the_halt_recorded() {
    loom::model(|| {
        let rec = recorder();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let m0 = meta(1, 0);
        t.opened(&m0, Instant::now());
        let a0 = recorded(m0.id, m0.last_offset, &rec);
        let halt = Arc::new(Halt::new());
        let mut halting = Halting::new(halt.clone());
        // The halting part: records the halt, then what it held fails.
        let part = thread::spawn(move || {
            halt.record();
            a0.fail();
            drop(a0);
        });
        // The checkpointer, at any point of the race: whenever it sees
        // the failure, the replay is withheld.
        let mut step = |t: &mut PartitionTracker| {
            for m in take(&rec) {
                let replay = t.resolved(&m).replay.expect("the failure");
                assert_eq!(
                    halting.judge(&replay),
                    Verdict::Withhold,
                    "no replay of a halt"
                );
            }
        };
        step(&mut t);
        part.join().expect("no panic");
        step(&mut t);
        assert_eq!(t.watermark(), Offset(0), "pinned");
    });
}

/// A hand-over of a partition races a sink writing one of its batches
/// while another batch of it fails (ending the epoch, so the
/// checkpointer counts nothing in flight). The checkpointer closes the
/// epoch, then at any point of the race takes what was resolved and asks
/// the revocation's real gate, deadline passed or not: it never hands
/// the partition over while the write can still land, and once the
/// writer is done it does.
#[test]
fn a_hand_over_never_finishes_while_a_write_of_an_ended_epoch_is_under_way() {
    use loom::sync::atomic::{AtomicBool, Ordering};

    for past_deadline in [false, true] {
        loom::model(move || {
            let rec = recorder();
            let fence = Arc::new(WriteFence::new());
            let mut t = PartitionTracker::new(P, 1, Offset(0));
            let (m0, m1) = (meta(1, 0), meta(1, 1));
            t.opened(&m0, Instant::now());
            t.opened(&m1, Instant::now());
            let writing: AckSet = vec![recorded_fenced(m0.id, m0.last_offset, &rec, &fence)].into();
            let failing: AckSet = vec![recorded_fenced(m1.id, m1.last_offset, &rec, &fence)].into();
            let handed_over = Arc::new(AtomicBool::new(false));
            let writer = {
                let handed_over = handed_over.clone();
                thread::spawn(move || {
                    let guard = writing.begin_write();
                    failing.fail();
                    if let Some(guard) = guard {
                        assert!(
                            !handed_over.load(Ordering::SeqCst),
                            "a write lands after the hand-over"
                        );
                        drop(guard);
                        writing.deliver();
                    }
                })
            };
            // The checkpointer: the hand-over closes the epoch, then one
            // pass of the revocation at any point of the race.
            fence.close(P, 1);
            let pass = |t: &mut PartitionTracker| {
                for m in take(&rec) {
                    let _ = t.resolved(&m);
                }
                revoke_gate(false, t.unresolved(), past_deadline, fence.writing(P))
            };
            if pass(&mut t) == RevokeGate::Finish {
                handed_over.store(true, Ordering::SeqCst);
            }
            writer.join().expect("no panic");
            assert_eq!(
                pass(&mut t),
                RevokeGate::Finish,
                "handed over once the write ended"
            );
        });
    }
}
