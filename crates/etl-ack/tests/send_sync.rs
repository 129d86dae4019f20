//! The handles cross threads and tasks: assert the auto traits promised.

use etl_ack::{AckEvent, AckReceiver, AckRef, AckSet, Acker, BatchMeta};

fn send<T: Send>() {}
fn sync<T: Sync>() {}

#[test]
fn handles_are_send_and_sync_where_promised() {
    send::<AckRef>();
    sync::<AckRef>();
    send::<AckSet>();
    sync::<AckSet>();
    send::<Acker>();
    sync::<Acker>();
    send::<AckReceiver>();
    send::<AckEvent>();
    send::<BatchMeta>();
}
