//! Writing one batch: rows and progress in one transaction, and the
//! row-by-row retry that isolates bad rows.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use etl_sink::{EncodedBatch, Reject, SinkError};
use futures::SinkExt;
use tokio_postgres::types::ToSql;

use crate::WriteMethod;
use crate::connection::Conn;
use crate::error::{Class, classify, describe};
use crate::mapping::{Row, copy_line};
use crate::sink::PostgresSink;

/// Rows per multi-row `INSERT` (also bounded by the protocol's 65535
/// parameters).
const INSERT_CHUNK: usize = 1000;

/// What one transaction stores: rows (with their index in the batch) and
/// the progress per partition.
struct Work {
    rows: Vec<(usize, Row)>,
    partitions: Vec<i64>,
    next_offsets: Vec<i64>,
    /// Partition and offset of every record of the batch, by index.
    positions: Vec<(i64, i64)>,
}

impl Work {
    fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.partitions.is_empty()
    }

    /// Hold each partition's progress at its first rejected record
    /// (`rejected` are batch indices). A reject becomes a dead letter
    /// written after this transaction; progress stored past it would let
    /// the next run skip it, and lose it if that write never happened.
    /// Rows after it in the batch are then written again when the batch
    /// is read again (an upsert of the same values).
    fn hold_at(&mut self, rejected: impl IntoIterator<Item = usize>) {
        for index in rejected {
            let Some(&(partition, offset)) = self.positions.get(index) else {
                continue;
            };
            if let Some(k) = self.partitions.iter().position(|p| *p == partition) {
                self.next_offsets[k] = self.next_offsets[k].min(offset);
            }
        }
    }
}

impl PostgresSink {
    pub(crate) async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let (mut work, mut rejects) = self.prepare_work(batch);
        if !work.is_empty() {
            let mut lease = self.lease().await.inspect_err(|e| {
                self.outage.failed(self.connector.target(), e);
            })?;
            let conn = &mut lease.conn;
            let written = match self.write_all(conn, &work).await {
                Err(e) if classify(&e) == Class::Row => {
                    tracing::debug!(reason = %describe(&e), "batch refused; writing it row by row");
                    self.write_each(conn, &mut work, &mut rejects).await
                }
                other => other,
            };
            if let Err(source) = written {
                // The connection is dropped: it may be broken.
                let err = self.query_error("write a batch", source);
                self.outage.failed(self.connector.target(), &err);
                return Err(err.into());
            }
            lease.release();
            self.outage.succeeded(self.connector.target());
            if self.exactly_once() {
                let mut progress = self.progress_lock();
                for (p, o) in work.partitions.iter().zip(&work.next_offsets) {
                    if let Ok(p) = u32::try_from(*p) {
                        progress.advance(etl_record::PartitionId(p), etl_record::Offset(*o));
                    }
                }
            }
        }
        if rejects.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejects))
        }
    }

    /// Render the rows (refusing values that are not JSON documents) and,
    /// in exactly-once mode, skip records the stored progress covers and
    /// compute the progress past the batch.
    fn prepare_work(&self, batch: &EncodedBatch) -> (Work, Vec<Reject>) {
        let stored = self.exactly_once().then(|| self.progress_lock().clone());
        let mut rows = Vec::with_capacity(batch.len());
        let mut rejects = Vec::new();
        let mut next: BTreeMap<u32, i64> = BTreeMap::new();
        for (i, record) in batch.records().iter().enumerate() {
            if let Some(stored) = &stored {
                let p = record.position.partition.0;
                let o = record.position.offset.next().0;
                let entry = next.entry(p).or_insert(o);
                *entry = (*entry).max(o);
                if stored.covers(record) {
                    continue;
                }
            }
            match self.mapping.render(record) {
                Ok(row) => rows.push((i, row)),
                Err(reason) => rejects.push(Reject::new(i, reason)),
            }
        }
        let mut work = Work {
            rows,
            partitions: next.keys().map(|&p| i64::from(p)).collect(),
            next_offsets: next.values().copied().collect(),
            positions: batch
                .records()
                .iter()
                .map(|r| (i64::from(r.position.partition.0), r.position.offset.0))
                .collect(),
        };
        work.hold_at(rejects.iter().map(|r| r.index));
        (work, rejects)
    }

    /// The whole batch in one transaction.
    async fn write_all(&self, conn: &mut Conn, work: &Work) -> Result<(), tokio_postgres::Error> {
        match self.config.method {
            WriteMethod::Copy => self.write_copy(conn, work).await,
            WriteMethod::Insert => self.write_insert(conn, work).await,
        }
    }

    async fn write_copy(&self, conn: &mut Conn, work: &Work) -> Result<(), tokio_postgres::Error> {
        if !conn.staged && !work.rows.is_empty() {
            conn.client.batch_execute(&self.sql.create_stage).await?;
            conn.staged = true;
        }
        let copy = conn.prepare(&self.sql.copy).await?;
        let merge = conn.prepare(&self.sql.merge).await?;
        let store = self.progress_statement(conn, work).await?;
        let tx = conn.client.transaction().await?;
        if !work.rows.is_empty() {
            let mut data = Vec::with_capacity(work.rows.len() * 64);
            for (seq, (_, row)) in work.rows.iter().enumerate() {
                copy_line(seq, row, &mut data);
            }
            let sink = tx.copy_in::<_, Bytes>(&copy).await?;
            futures::pin_mut!(sink);
            sink.send(Bytes::from(data)).await?;
            sink.as_mut().finish().await?;
            tx.execute(&merge, &[]).await?;
        }
        if let Some(store) = store {
            self.store_progress(&tx, &store, work).await?;
        }
        tx.commit().await
    }

    async fn write_insert(
        &self,
        conn: &mut Conn,
        work: &Work,
    ) -> Result<(), tokio_postgres::Error> {
        // One statement must not upsert a key twice: keep each key's last
        // row (later records win, as they would one by one).
        let key = self.mapping.key;
        let mut last: HashMap<Option<&str>, usize> = HashMap::with_capacity(work.rows.len());
        for (i, (_, row)) in work.rows.iter().enumerate() {
            last.insert(row[key].as_deref(), i);
        }
        let rows: Vec<&Row> = work
            .rows
            .iter()
            .enumerate()
            .filter(|(i, (_, row))| last.get(&row[key].as_deref()) == Some(i))
            .map(|(_, (_, row))| row)
            .collect();
        let chunk = INSERT_CHUNK.min(u16::MAX as usize / self.sql.width().max(1));
        let mut statements = Vec::new();
        for part in rows.chunks(chunk) {
            statements.push(conn.prepare(&self.sql.insert_rows(part.len())).await?);
        }
        let store = self.progress_statement(conn, work).await?;
        let tx = conn.client.transaction().await?;
        for (part, statement) in rows.chunks(chunk).zip(&statements) {
            let params: Vec<&(dyn ToSql + Sync)> = part
                .iter()
                .flat_map(|row| row.iter().map(|v| v as &(dyn ToSql + Sync)))
                .collect();
            tx.execute(statement, &params).await?;
        }
        if let Some(store) = store {
            self.store_progress(&tx, &store, work).await?;
        }
        tx.commit().await
    }

    /// The batch again in one transaction, each row in a savepoint: rows
    /// the database refuses for their data become rejects with its reason.
    async fn write_each(
        &self,
        conn: &mut Conn,
        work: &mut Work,
        rejects: &mut Vec<Reject>,
    ) -> Result<(), tokio_postgres::Error> {
        let insert = conn.prepare(&self.sql.insert_one).await?;
        let store = self.progress_statement(conn, work).await?;
        let mut found = Vec::new();
        let mut tx = conn.client.transaction().await?;
        for (index, row) in &work.rows {
            let savepoint = tx.savepoint("etl_row").await?;
            let params: Vec<&(dyn ToSql + Sync)> =
                row.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            match savepoint.execute(&insert, &params).await {
                Ok(_) => savepoint.commit().await?,
                Err(e) if classify(&e) == Class::Row => {
                    savepoint.rollback().await?;
                    found.push(Reject::new(*index, describe(&e)));
                }
                Err(e) => return Err(e),
            }
        }
        work.hold_at(found.iter().map(|r| r.index));
        if let Some(store) = store {
            self.store_progress(&tx, &store, work).await?;
        }
        tx.commit().await?;
        rejects.extend(found);
        Ok(())
    }

    async fn progress_statement(
        &self,
        conn: &mut Conn,
        work: &Work,
    ) -> Result<Option<tokio_postgres::Statement>, tokio_postgres::Error> {
        if work.partitions.is_empty() {
            return Ok(None);
        }
        conn.prepare(&self.sql.store_progress).await.map(Some)
    }

    async fn store_progress(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        statement: &tokio_postgres::Statement,
        work: &Work,
    ) -> Result<(), tokio_postgres::Error> {
        tx.execute(
            statement,
            &[
                &self.config.progress_key(),
                &work.partitions,
                &work.next_offsets,
            ],
        )
        .await
        .map(drop)
    }
}
