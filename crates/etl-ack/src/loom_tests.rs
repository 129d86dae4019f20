//! Loom models of the races the delivery contract depends on. Run with
//! `cargo xtask loom` (`RUSTFLAGS="--cfg etl_loom"`, release mode,
//! `LOOM_MAX_PREEMPTIONS=2`).

use loom::sync::Mutex;
use loom::thread;

use etl_record::{Offset, PartitionId};

use crate::ack_ref::loom_support::{Recorder, recorded};
use crate::sync::Arc;
use crate::{AckMsg, AckSet, AckStatus, BatchId};

fn id() -> BatchId {
    BatchId {
        partition: PartitionId(0),
        epoch: 1,
        seq: 0,
    }
}

fn recorder() -> Recorder {
    Arc::new(Mutex::new(Vec::new()))
}

fn messages(rec: &Recorder) -> Vec<AckMsg> {
    rec.lock().map(|v| v.clone()).unwrap_or_default()
}

#[test]
fn fail_races_the_last_drop() {
    loom::model(|| {
        let rec = recorder();
        let ack = recorded(id(), Offset(9), &rec);
        let other = ack.clone();
        let failer = thread::spawn(move || {
            other.fail();
            drop(other);
        });
        drop(ack);
        failer.join().expect("no panic");
        let msgs = messages(&rec);
        assert_eq!(msgs.len(), 1, "exactly one resolution");
        // The fail precedes its own thread's drop, so it precedes the last
        // drop in every interleaving: the batch must resolve Failed.
        assert_eq!(msgs[0].status, AckStatus::Failed);
        assert_eq!(msgs[0].last_offset, Offset(9));
    });
}

#[test]
fn fail_on_the_main_thread_while_a_clone_drops_elsewhere() {
    loom::model(|| {
        let rec = recorder();
        let ack = recorded(id(), Offset(9), &rec);
        let other = ack.clone();
        let dropper = thread::spawn(move || drop(other));
        ack.fail();
        drop(ack);
        dropper.join().expect("no panic");
        let msgs = messages(&rec);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].status, AckStatus::Failed);
    });
}

#[test]
fn ack_set_drop_races_deliver() {
    loom::model(|| {
        let rec = recorder();
        let ack = recorded(id(), Offset(3), &rec);
        let mut delivered = AckSet::new();
        delivered.push(ack.clone());
        let mut torn_down = AckSet::new();
        torn_down.push(ack);
        let a = thread::spawn(move || delivered.deliver());
        let b = thread::spawn(move || drop(torn_down));
        a.join().expect("no panic");
        b.join().expect("no panic");
        let msgs = messages(&rec);
        assert_eq!(msgs.len(), 1, "exactly one resolution");
        assert_eq!(
            msgs[0].status,
            AckStatus::Failed,
            "a torn-down set fails the batch whatever the order"
        );
    });
}

#[test]
fn delivering_sets_on_two_threads_resolves_delivered() {
    loom::model(|| {
        let rec = recorder();
        let ack = recorded(id(), Offset(3), &rec);
        let mut one = AckSet::new();
        one.push(ack.clone());
        let mut two = AckSet::new();
        two.push(ack);
        let a = thread::spawn(move || one.deliver());
        two.deliver();
        a.join().expect("no panic");
        let msgs = messages(&rec);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].status, AckStatus::Delivered);
    });
}

#[test]
fn clones_dropped_from_three_threads_resolve_once() {
    loom::model(|| {
        let rec = recorder();
        let ack = recorded(id(), Offset(5), &rec);
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let clone = ack.clone();
                thread::spawn(move || drop(clone))
            })
            .collect();
        drop(ack);
        for h in handles {
            h.join().expect("no panic");
        }
        let msgs = messages(&rec);
        assert_eq!(msgs.len(), 1, "exactly one resolution");
        assert_eq!(msgs[0].status, AckStatus::Delivered);
        assert_eq!(msgs[0].id, id());
    });
}

/// A sink registering a write races a revocation closing the epoch and
/// then asking whether a write is under way: either the write is refused,
/// or the revocation sees it under way until it ends. So a write never
/// runs once the revocation handed the partition over. (The revocation's
/// own decision, with a failure ending the epoch, is modelled where it
/// lives: etl-checkpoint's `a_hand_over_never_finishes_while_a_write_of_an_ended_epoch_is_under_way`.)
#[test]
fn a_registered_write_races_the_close_and_the_handover() {
    use loom::sync::atomic::{AtomicBool, Ordering};

    use crate::WriteFence;

    loom::model(|| {
        let fence = Arc::new(WriteFence::new());
        let handed_over = Arc::new(AtomicBool::new(false));
        let writer = {
            let (fence, handed_over) = (fence.clone(), handed_over.clone());
            thread::spawn(move || {
                if fence.register(id()) {
                    assert!(
                        !handed_over.load(Ordering::SeqCst),
                        "a write runs after the handover"
                    );
                    fence.release(id());
                }
            })
        };
        fence.close(id().partition, id().epoch);
        if !fence.writing(id().partition) {
            handed_over.store(true, Ordering::SeqCst);
        }
        writer.join().expect("no panic");
        assert!(!fence.register(id()), "the closed epoch stays closed");
    });
}
