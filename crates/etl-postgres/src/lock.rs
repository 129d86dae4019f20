//! The exactly-once sink's hold on its progress.
//!
//! Two sinks storing progress under the same name in the same progress
//! table would interleave their rows and progress (each resuming from the
//! other's offsets). An exactly-once sink therefore writes only through
//! one connection that holds a session-level advisory lock
//! (`pg_try_advisory_lock`) on the pair (progress table, progress name),
//! for the sink's whole life:
//!
//! * the key is the 64-bit FNV-1a hash of the progress table's
//!   schema-qualified name as the server resolves it (`public.etl_progress`
//!   whether the config says `etl_progress` or `public.etl_progress`), a
//!   zero byte, and the progress name, read as a signed `bigint`;
//! * a second sink on the same key is refused at open with
//!   [`PostgresError::InUse`] naming the holder's server process id;
//! * with [`ProgressLock::Shared`] (the members of one Kafka consumer
//!   group, which the group keeps on disjoint partitions) the lock is
//!   `pg_try_advisory_lock_shared`: members coexist, an exclusive sink
//!   does not;
//! * the server releases the lock when the holder's connection ends (a
//!   clean close, a crash, `kill -9`), so nothing is left behind. After a
//!   lost connection the sink takes the lock again on its new connection
//!   before it writes; if another sink took it meanwhile, the write fails
//!   with [`PostgresError::InUse`] and the pipeline halts.
//!
//! Rows and progress are written on the locking connection itself, so no
//! transaction can commit progress without the lock held by its session.

use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};

use crate::connection::{Conn, Connector, Pool};
use crate::{PostgresError, ProgressLock};

/// How long opening waits for a holder whose session is ending (the
/// previous run of this pipeline, whose connection the server has not
/// closed yet) before refusing.
const GRACE: Duration = Duration::from_secs(2);
/// Pause between attempts within [`GRACE`].
const PAUSE: Duration = Duration::from_millis(100);

/// The progress table's schema-qualified name, as the server resolves the
/// configured one (which exists by now).
const RESOLVE: &str = "SELECT n.nspname::text || '.' || c.relname::text \
     FROM pg_catalog.pg_class c \
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.oid = pg_catalog.to_regclass($1)";
const TRY_LOCK: &str = "SELECT pg_catalog.pg_try_advisory_lock($1)";
const TRY_LOCK_SHARED: &str = "SELECT pg_catalog.pg_try_advisory_lock_shared($1)";
/// A session holding a bigint advisory lock in this database: the key's
/// high and low 32 bits are `classid` and `objid`, `objsubid` is 1.
const HOLDER: &str = "SELECT l.pid FROM pg_catalog.pg_locks l \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
     AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
     AND l.classid = (($1::bigint >> 32) & 4294967295)::oid \
     AND l.objid = ($1::bigint & 4294967295)::oid \
     LIMIT 1";

/// The advisory lock key of `name` in the progress table `table`
/// (schema-qualified): FNV-1a 64 of `table`, a zero byte and `name`.
pub(crate) fn lock_key(table: &str, name: &str) -> i64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let hash = table
        .bytes()
        .chain([0])
        .chain(name.bytes())
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// The locking connection of an exactly-once sink.
#[derive(Debug)]
pub(crate) struct Holder {
    /// The connection, out of its slot while a write uses it; `None` after
    /// a failed write dropped it (the next write reconnects and locks
    /// again).
    slot: Mutex<Option<Conn>>,
    key: i64,
    mode: ProgressLock,
    /// The progress table, schema-qualified.
    table: String,
    name: String,
}

impl Holder {
    /// Resolve the progress table on `conn`, take the lock on it, and keep
    /// it as the sink's writing connection.
    pub(crate) async fn take(
        conn: Conn,
        progress_table: &str,
        name: &str,
        mode: ProgressLock,
    ) -> Result<Holder, PostgresError> {
        let quoted = crate::mapping::quote_table(progress_table);
        let row = conn
            .client
            .query_opt(RESOLVE, &[&quoted])
            .await
            .map_err(|source| PostgresError::Query {
                during: "find the progress table",
                table: progress_table.to_owned(),
                source,
            })?;
        let table = match row.map(|r| r.get::<_, Option<String>>(0)) {
            Some(Some(table)) => table,
            _ => {
                return Err(PostgresError::CorruptProgress {
                    table: progress_table.to_owned(),
                    reason: "the table does not exist".to_owned(),
                });
            }
        };
        let holder = Holder {
            slot: Mutex::new(None),
            key: lock_key(&table, name),
            mode,
            table,
            name: name.to_owned(),
        };
        holder.lock(&conn).await?;
        *holder.slot.lock().await = Some(conn);
        Ok(holder)
    }

    /// The progress table, schema-qualified.
    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// Take the lock on `conn`, waiting up to [`GRACE`] for a holder whose
    /// session is ending.
    async fn lock(&self, conn: &Conn) -> Result<(), PostgresError> {
        let query_error = |source| PostgresError::Query {
            during: "lock the progress",
            table: self.table.clone(),
            source,
        };
        let attempts = GRACE.as_millis() / PAUSE.as_millis();
        for attempt in 0..=attempts {
            let row = conn
                .client
                .query_one(
                    match self.mode {
                        ProgressLock::Exclusive => TRY_LOCK,
                        ProgressLock::Shared => TRY_LOCK_SHARED,
                    },
                    &[&self.key],
                )
                .await
                .map_err(query_error)?;
            if row.get::<_, bool>(0) {
                return Ok(());
            }
            if attempt < attempts {
                tokio::time::sleep(PAUSE).await;
            }
        }
        let pid = conn
            .client
            .query_opt(HOLDER, &[&self.key])
            .await
            .ok()
            .flatten()
            .map(|row| row.get::<_, i32>(0));
        Err(PostgresError::InUse {
            table: self.table.clone(),
            name: self.name.clone(),
            pid,
        })
    }
}

/// A connection lent to one operation. [`Lease::release`] returns it after
/// success; dropping it drops the connection (it may be broken), and with
/// it a held lock, which the next lease takes again.
#[derive(Debug)]
pub(crate) struct Lease<'a> {
    pub(crate) conn: Conn,
    home: Home<'a>,
}

#[derive(Debug)]
enum Home<'a> {
    Pool(&'a Pool),
    Held(MutexGuard<'a, Option<Conn>>),
}

impl<'a> Lease<'a> {
    /// The locking connection (reconnecting and locking again when the last
    /// one was lost), or a pooled one without a holder.
    pub(crate) async fn take(
        holder: Option<&'a Holder>,
        pool: &'a Pool,
        connector: &Connector,
    ) -> Result<Lease<'a>, PostgresError> {
        let Some(holder) = holder else {
            return Ok(Lease {
                conn: pool.take(connector).await?,
                home: Home::Pool(pool),
            });
        };
        let mut slot = holder.slot.lock().await;
        let conn = match slot.take() {
            Some(conn) if !conn.client.is_closed() => conn,
            _ => {
                let conn = connector.connect().await?;
                holder.lock(&conn).await?;
                tracing::info!(
                    target = connector.target(),
                    progress_table = %holder.table,
                    progress_name = %holder.name,
                    "PostgreSQL progress lock taken again on a new connection"
                );
                conn
            }
        };
        Ok(Lease {
            conn,
            home: Home::Held(slot),
        })
    }

    /// Give a healthy connection back.
    pub(crate) fn release(self) {
        match self.home {
            Home::Pool(pool) => pool.give_back(self.conn),
            Home::Held(mut slot) => *slot = Some(self.conn),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fnv1a_of_table_and_name() {
        // FNV-1a 64 of one zero byte.
        assert_eq!(
            lock_key("", ""),
            i64::from_ne_bytes(0xaf63_bd4c_8601_b7df_u64.to_ne_bytes())
        );
        let key = lock_key("public.etl_progress", "orders");
        assert_eq!(key, lock_key("public.etl_progress", "orders"));
        assert_ne!(key, lock_key("public.etl_progress", "orders2"));
        assert_ne!(key, lock_key("app.etl_progress", "orders"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(lock_key("ab", "c"), lock_key("a", "bc"));
    }
}
