//! The initial snapshot: the rows of every published table as of the
//! slot's creation, then the slot itself.
//!
//! The slot is first created `TEMPORARY` with an exported snapshot, on a
//! connection of its own. A second connection reads every published
//! table in a `REPEATABLE READ` transaction that imports that snapshot,
//! through a cursor, `max_batch_records` rows at a time (memory stays
//! bounded whatever the table's size), and hands each chunk on as a
//! batch of `"read"` records. Once the checkpointer has committed past
//! the last of them, the temporary slot is copied to the configured,
//! permanent one (`pg_copy_logical_replication_slot`), whose stream
//! starts at the snapshot's consistent point: what the snapshot saw is
//! not streamed, what it did not see is, nothing is between.
//!
//! The permanent slot exists only once the snapshot was delivered whole.
//! A crash before that (a kill, a lost connection) drops the temporary
//! slot with its connection, and the next start takes the snapshot
//! again from the beginning: rows delivered by the interrupted one come
//! twice (at least once), none is lost. The rows take offsets at or above
//! the committed offset and an exactly-once sink's stored progress (so
//! neither skips them), and below the consistent point, where the
//! stream's offsets start (so the first transaction streamed is anchored,
//! see `crate::progress`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use etl_record::{DeadLetter, Offset, Position, Record};
use etl_source::PollBatch;
use tokio::sync::mpsc;

use crate::change::{Change, Op, TxnInfo, record};
use crate::pgoutput::{Column, Relation, Value};
use crate::session::{Event, PARTITION, Shared, consistent_point, identifier, literal};
use crate::wire::Connection;
use crate::{CdcError, Lsn};

/// How often the delivery of the snapshot is checked.
const DELIVERY_POLL: Duration = Duration::from_millis(100);

/// The cursor the tables are read through.
const CURSOR: &str = "etl_snapshot";

/// A name for the temporary slot: the slot's own, then a part that
/// differs from one attempt to the next (a temporary slot of a connection
/// that died may linger until the server notices).
fn temporary_name(slot: &str) -> String {
    let prefix: String = slot.chars().take(40).collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_snap_{:x}_{nanos:x}", std::process::id())
}

/// One published table, as the snapshot reads it.
struct Table {
    relation: Relation,
    /// The publication's row filter (PostgreSQL 15 and later), if any.
    filter: Option<String>,
}

/// Take the initial snapshot and create the slot. Returns the slot's
/// confirmed position, or `None` when the source stopped taking batches.
/// Offsets below `floor` are not sent; `floor` moves as batches are
/// handed on.
pub(crate) async fn take(
    shared: &Arc<Shared>,
    floor: &mut i64,
    tx: &mpsc::Sender<Event>,
) -> Result<Option<Lsn>, CdcError> {
    let application = format!("etl postgres_cdc {} snapshot", shared.slot);
    let mut holder =
        Connection::connect(&shared.settings, &application, shared.connect_timeout).await?;
    let temporary = temporary_name(&shared.slot);
    let rows = holder
        .query(&format!(
            "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT",
            identifier(&temporary)
        ))
        .await?;
    let consistent = consistent_point(holder.target(), &rows)?;
    let name = rows
        .first()
        .and_then(|r| r.get(2).cloned().flatten())
        .ok_or_else(|| CdcError::Protocol {
            target: holder.target().to_owned(),
            reason: "CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT returned no snapshot".to_owned(),
        })?;
    tracing::info!(slot = %shared.slot, %consistent, "initial snapshot started");

    let mut reader =
        Connection::connect(&shared.settings, &application, shared.connect_timeout).await?;
    reader
        .query(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET TRANSACTION SNAPSHOT {}",
            literal(&name)
        ))
        .await?;
    let time = reader
        .query("SELECT (extract(epoch FROM now()) * 1000000)::int8")
        .await?;
    let txn = TxnInfo {
        commit_lsn: consistent,
        commit_time_micros: time
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|t| t.parse().ok())
            .unwrap_or(0),
        xid: None,
    };
    let tables = tables(shared, &mut reader).await?;

    let first = shared.progress().snapshot_start(*floor);
    // The rows' offsets stay below the consistent point, where the
    // stream's offsets start: the first transaction streamed is then anchored
    // (crate::progress), so a restart gives it its offsets again.
    let limit = i64::try_from(consistent.0).unwrap_or(i64::MAX);
    let mut next = first;
    let mut batch = PollBatch::new(PARTITION);
    for table in &tables {
        let columns: Vec<String> = table
            .relation
            .columns
            .iter()
            .map(|c| identifier(&c.name))
            .collect();
        let mut select = format!(
            "DECLARE {CURSOR} NO SCROLL CURSOR FOR SELECT {} FROM {}.{}",
            columns.join(", "),
            identifier(&table.relation.schema),
            identifier(&table.relation.name),
        );
        if let Some(filter) = &table.filter {
            select.push_str(&format!(" WHERE {filter}"));
        }
        reader.query(&select).await?;
        loop {
            let rows = reader
                .query(&format!("FETCH FORWARD {} FROM {CURSOR}", shared.max_batch))
                .await?;
            let done = rows.len() < shared.max_batch;
            for row in rows {
                let tuple: Vec<Value> = row
                    .into_iter()
                    .map(|v| v.map_or(Value::Null, |t| Value::Text(Bytes::from(t))))
                    .collect();
                let change = Change {
                    op: Op::Read,
                    relation: &table.relation,
                    old: None,
                    new: Some(&tuple),
                };
                if next >= limit {
                    return Err(too_many_rows(holder.target(), first, consistent));
                }
                match record(&shared.source, PARTITION, next, &txn, &change) {
                    Ok(record) => batch.records.push(record),
                    Err(reason) => {
                        let position =
                            Position::new(shared.source.clone(), PARTITION, Offset(next));
                        let data = Bytes::from(format!("{tuple:?}"));
                        batch.rejected.push(DeadLetter::new(
                            Record::new(position, data),
                            format!("initial snapshot at LSN {consistent}: {reason}"),
                        ));
                    }
                }
                next = next.saturating_add(1);
                if batch.len() >= shared.max_batch {
                    if !hand_on(&mut batch, tx).await {
                        return Ok(None);
                    }
                    *floor = next;
                }
            }
            if done {
                break;
            }
        }
        reader.query(&format!("CLOSE {CURSOR}")).await?;
    }
    if !hand_on(&mut batch, tx).await {
        return Ok(None);
    }
    *floor = next;
    reader.query("COMMIT").await?;
    drop(reader);
    shared.progress().snapshot_end(next);
    tracing::info!(slot = %shared.slot, rows = next - first, "initial snapshot read");

    // The slot is made only once every row was delivered: before that, a
    // crash leaves no slot and the snapshot is taken again.
    while shared.progress().committed() < next {
        if tx.is_closed() {
            return Ok(None);
        }
        shared.follow_commits();
        tokio::time::sleep(DELIVERY_POLL).await;
    }
    holder
        .query(&format!(
            "SELECT 1 FROM pg_catalog.pg_copy_logical_replication_slot({}, {}, false)",
            literal(&temporary),
            literal(&shared.slot)
        ))
        .await?;
    tracing::info!(slot = %shared.slot, %consistent, "initial snapshot delivered; replication slot created");
    Ok(Some(consistent))
}

/// Hand `batch` on, leaving it empty; false when nobody takes it.
async fn hand_on(batch: &mut PollBatch, tx: &mpsc::Sender<Event>) -> bool {
    if batch.is_empty() {
        return true;
    }
    let full = std::mem::replace(batch, PollBatch::new(PARTITION));
    tx.send(Event::Batch(full)).await.is_ok()
}

/// The publication's tables and the columns the stream would send of
/// each, with the replica identity's marked as the key (as `pgoutput`
/// marks them: every column under `REPLICA IDENTITY FULL`).
async fn tables(shared: &Shared, reader: &mut Connection) -> Result<Vec<Table>, CdcError> {
    let version = reader.query("SHOW server_version_num").await?;
    let version: u32 = version
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Column lists and row filters came with PostgreSQL 15.
    let extra = if version >= 150_000 {
        "attnames::text[]::text, rowfilter"
    } else {
        "NULL::text, NULL::text"
    };
    let listed = reader
        .query(&format!(
            "SELECT schemaname, tablename, {extra} FROM pg_catalog.pg_publication_tables \
             WHERE pubname = {} ORDER BY 1, 2",
            literal(&shared.publication)
        ))
        .await?;
    let mut tables = Vec::with_capacity(listed.len());
    for row in listed {
        let mut row = row.into_iter();
        let (Some(Some(schema)), Some(Some(name))) = (row.next(), row.next()) else {
            continue;
        };
        let attnames = row.next().flatten();
        let filter = row.next().flatten();
        let only = match &attnames {
            Some(names) => format!(" AND a.attname = ANY ({}::text[])", literal(names)),
            None => String::new(),
        };
        let columns = reader
            .query(&format!(
                "SELECT a.attname, a.atttypid, a.atttypmod, \
                   CASE c.relreplident WHEN 'f' THEN true WHEN 'n' THEN false \
                   ELSE EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
                     WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey) \
                     AND CASE c.relreplident WHEN 'i' THEN i.indisreplident \
                         ELSE i.indisprimary END) END \
                 FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid \
                 WHERE n.nspname = {} AND c.relname = {} AND a.attnum > 0 \
                   AND NOT a.attisdropped AND a.attgenerated = ''{only} \
                 ORDER BY a.attnum",
                literal(&schema),
                literal(&name)
            ))
            .await?;
        let columns = columns
            .into_iter()
            .filter_map(|c| {
                let mut c = c.into_iter();
                let name = c.next().flatten()?;
                let type_oid = c.next().flatten()?.parse().ok()?;
                let type_modifier = c.next().flatten()?.parse().ok()?;
                let key = c.next().flatten()? == "t";
                Some(Column {
                    key,
                    name,
                    type_oid,
                    type_modifier,
                })
            })
            .collect();
        tables.push(Table {
            relation: Relation {
                id: 0,
                schema,
                name,
                replica_identity: b'd',
                columns,
            },
            filter,
        });
    }
    Ok(tables)
}

/// The error when a snapshot's rows, taking offsets from `first` on,
/// reach the consistent point, where the stream's offsets start.
fn too_many_rows(target: &str, first: i64, consistent: Lsn) -> CdcError {
    CdcError::Setup {
        target: target.to_owned(),
        reason: format!(
            "the initial snapshot's rows take offsets from {first} on (the committed offset), \
             and there are more of them than fit below the slot's consistent point {consistent} \
             ({} offsets), where the stream's offsets start; the pipeline's stored progress is \
             that of an earlier stream: stop the pipeline and start it with an empty offset \
             store and sink progress, or with snapshot = \"never\"",
            i64::try_from(consistent.0)
                .unwrap_or(i64::MAX)
                .saturating_sub(first)
        ),
    }
}
