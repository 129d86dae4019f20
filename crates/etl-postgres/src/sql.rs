//! The SQL the sink runs, built once from the configuration.
//!
//! Identifiers are quoted and type names were checked by
//! [`PostgresSinkConfig::validate`](crate::PostgresSinkConfig::validate);
//! every value is a bound parameter or `COPY` data, never spliced in.

use std::fmt::Write;

use crate::PostgresSinkConfig;
use crate::mapping::{Mapping, quote_table};

/// The temporary staging table `COPY` writes into (one per connection).
const STAGE: &str = "etl_stage";

/// Statements for one sink.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    /// `CREATE TABLE IF NOT EXISTS` for the target.
    pub(crate) create_target: String,
    /// `CREATE TABLE IF NOT EXISTS` for the progress table.
    pub(crate) create_progress: String,
    /// `CREATE TEMP TABLE` for the staging table.
    pub(crate) create_stage: String,
    /// `COPY etl_stage FROM STDIN`.
    pub(crate) copy: String,
    /// Staging table to target, keeping the last row per key.
    pub(crate) merge: String,
    /// One row, as `$1..$n` text parameters.
    pub(crate) insert_one: String,
    /// Store progress: `$1` name, `$2` partitions, `$3` next offsets.
    pub(crate) store_progress: String,
    /// Read progress: `$1` name.
    pub(crate) read_progress: String,
    insert_head: String,
    conflict: String,
    casts: Vec<String>,
}

impl Statements {
    pub(crate) fn new(config: &PostgresSinkConfig, mapping: &Mapping) -> Statements {
        let target = quote_table(&config.table);
        let progress = quote_table(&config.progress_table);
        let cols = &mapping.columns;
        let key = &cols[mapping.key];
        let names: Vec<&str> = cols.iter().map(|c| c.quoted.as_str()).collect();
        let staged: Vec<String> = (0..cols.len()).map(|i| format!("c{i}")).collect();

        let mut create_target = format!("CREATE TABLE IF NOT EXISTS {target} (");
        for (i, c) in cols.iter().enumerate() {
            let primary = if i == mapping.key { " PRIMARY KEY" } else { "" };
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(create_target, "{sep}{} {}{primary}", c.quoted, c.pg_type);
        }
        create_target.push(')');

        let updates: Vec<String> = cols
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != mapping.key)
            .map(|(_, c)| format!("{0} = EXCLUDED.{0}", c.quoted))
            .collect();
        let conflict = if updates.is_empty() {
            format!(" ON CONFLICT ({}) DO NOTHING", key.quoted)
        } else {
            format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                key.quoted,
                updates.join(", ")
            )
        };
        let insert_head = format!("INSERT INTO {target} ({}) VALUES ", names.join(", "));
        let casts: Vec<String> = cols
            .iter()
            .map(|c| format!("::text::{}", c.pg_type))
            .collect();

        let selected: Vec<String> = staged
            .iter()
            .zip(cols)
            .map(|(s, c)| format!("{s}::{}", c.pg_type))
            .collect();
        // DISTINCT ON keeps the last row of each key: one statement may not
        // upsert the same key twice.
        let merge = format!(
            "INSERT INTO {target} ({names}) SELECT DISTINCT ON (c{k}) {sel} FROM {STAGE} \
             ORDER BY c{k}, seq DESC{conflict}",
            names = names.join(", "),
            k = mapping.key,
            sel = selected.join(", "),
        );
        let stage_cols: Vec<String> = staged.iter().map(|s| format!("{s} text")).collect();
        let mut s = Statements {
            create_target,
            create_progress: format!(
                "CREATE TABLE IF NOT EXISTS {progress} (name text NOT NULL, \
                 partition bigint NOT NULL, next_offset bigint NOT NULL, \
                 PRIMARY KEY (name, partition))"
            ),
            create_stage: format!(
                "CREATE TEMP TABLE IF NOT EXISTS {STAGE} (seq bigint, {}) ON COMMIT DELETE ROWS",
                stage_cols.join(", ")
            ),
            copy: format!("COPY {STAGE} (seq, {}) FROM STDIN", staged.join(", ")),
            merge,
            insert_one: String::new(),
            store_progress: format!(
                "INSERT INTO {progress} AS p (name, partition, next_offset) \
                 SELECT $1, u.partition, u.next_offset \
                 FROM unnest($2::bigint[], $3::bigint[]) AS u(partition, next_offset) \
                 ON CONFLICT (name, partition) DO UPDATE \
                 SET next_offset = GREATEST(p.next_offset, EXCLUDED.next_offset)"
            ),
            read_progress: format!("SELECT partition, next_offset FROM {progress} WHERE name = $1"),
            insert_head,
            conflict,
            casts,
        };
        s.insert_one = s.insert_rows(1);
        s
    }

    /// A multi-row `INSERT` of `rows` rows, parameters numbered row-major.
    pub(crate) fn insert_rows(&self, rows: usize) -> String {
        let width = self.casts.len();
        let mut sql = self.insert_head.clone();
        for r in 0..rows {
            sql.push_str(if r == 0 { "(" } else { ", (" });
            for (c, cast) in self.casts.iter().enumerate() {
                let sep = if c == 0 { "" } else { ", " };
                let _ = write!(sql, "{sep}${}{cast}", r * width + c + 1);
            }
            sql.push(')');
        }
        sql.push_str(&self.conflict);
        sql
    }

    /// Columns per row.
    pub(crate) fn width(&self) -> usize {
        self.casts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_quote_names_and_cast_text() {
        let config = PostgresSinkConfig::new("postgres://h/db", "app.orders")
            .column("id", "id", "bigint")
            .column("note", "note", "text");
        let mapping = Mapping::new(&config);
        let s = Statements::new(&config, &mapping);
        assert_eq!(
            s.create_target,
            "CREATE TABLE IF NOT EXISTS \"app\".\"orders\" (\"etl_key\" text PRIMARY KEY, \"id\" bigint, \"note\" text)"
        );
        assert_eq!(
            s.insert_rows(2),
            "INSERT INTO \"app\".\"orders\" (\"etl_key\", \"id\", \"note\") VALUES \
             ($1::text::text, $2::text::bigint, $3::text::text), \
             ($4::text::text, $5::text::bigint, $6::text::text) \
             ON CONFLICT (\"etl_key\") DO UPDATE SET \"id\" = EXCLUDED.\"id\", \"note\" = EXCLUDED.\"note\""
        );
        assert!(s.merge.contains("DISTINCT ON (c0)"), "{}", s.merge);
        assert_eq!(s.width(), 3);
    }
}
