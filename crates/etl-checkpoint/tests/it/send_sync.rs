//! What the crate promises about `Send` and `Sync`, checked at compile
//! time: the handle is shared by the source driver, the sink drivers and
//! the runtime's tasks, and the futures of its calls are awaited in tasks
//! a multi-threaded runtime may move between threads.

use etl_checkpoint::{
    CheckpointError, CheckpointHandle, CheckpointMetrics, CheckpointSummary, FileStore,
    InFlightBudget, MemoryStore, PartitionOffsets,
};
use etl_record::PartitionId;

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send_value<T: Send>(_: &T) {}
    fn futures_are_send(handle: &CheckpointHandle, budget: &InFlightBudget) {
        send_value(&handle.assign(Vec::new()));
        send_value(&handle.revoke(Vec::new()));
        send_value(&handle.commit());
        send_value(&handle.shutdown());
        send_value(&handle.store_lost());
        send_value(&handle.halting());
        send_value(&budget.acquire(PartitionId(0), 1));
    }
    send_sync::<CheckpointHandle>();
    send_sync::<InFlightBudget>();
    send_sync::<CheckpointError>();
    send_sync::<CheckpointMetrics>();
    send_sync::<CheckpointSummary>();
    send_sync::<PartitionOffsets>();
    send_sync::<MemoryStore>();
    send_sync::<FileStore>();
    let _ = futures_are_send;
};
