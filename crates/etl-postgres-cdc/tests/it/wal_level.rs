//! A server whose `wal_level` is not `logical`: the source refuses it
//! with the setting to change, the `etl` command exits 78
//! (docs/operations.md) with nothing committed, and `etl validate`,
//! which never connects, finds nothing wrong in the file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etl_postgres_cdc::PostgresCdcSource;
use etl_record::{Offset, PartitionId};
use etl_source::{Source, SourceError, SourceEvent};
use etl_test_support::{etl_binary, run_stderr, start_run, wait_exit};

use crate::support::{Names, client_of};

/// A pipeline from the slot into `out.ndjson`, offsets in `state`.
fn config(dir: &Path, names: &Names) -> PathBuf {
    let path = dir.join("pipeline.toml");
    std::fs::write(
        &path,
        format!(
            "[source]\ntype = \"postgres_cdc\"\nurl = \"{}\"\npublication = \"{}\"\n\
             slot = \"{}\"\nconnect_timeout = \"5s\"\n\n\
             [[sinks]]\ntype = \"file\"\npath = \"out.ndjson\"\n\n\
             [checkpoint]\nstore = {{ type = \"file\", path = \"state\" }}\n",
            names.url,
            names.publication(),
            names.slot()
        ),
    )
    .unwrap();
    path
}

/// Whether `message` names the current level and the setting to change,
/// as docs/postgres-cdc.md ("When it fails") promises.
fn names_the_fix(message: &str) -> bool {
    message.contains("wal_level is replica") && message.contains("wal_level = logical")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_logical_wal_is_refused_naming_wal_level_and_nothing_is_committed() {
    let server = tokio::task::spawn_blocking(|| {
        etl_test_support::postgres::start_with(&[("wal_level", "replica")])
    })
    .await
    .unwrap()
    .unwrap();
    let names = Names::on("walrep", server.url());
    let db = client_of(&server.url()).await;
    let level: String = db.query_one("SHOW wal_level", &[]).await.unwrap().get(0);
    assert_eq!(level, "replica");
    // The tables and the publication exist (a publication may be created
    // at any level): only the level is wrong.
    names.create(&db).await;
    let grows = names.table("grows");
    db.batch_execute(&format!("INSERT INTO {grows} VALUES (1, 1), (2, 2)"))
        .await
        .unwrap();

    // The source on its own: a configuration error, not a retry.
    let mut source = PostgresCdcSource::new(names.config()).unwrap();
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(p) if p == vec![PartitionId(0)]
    ));
    source.seek(PartitionId(0), Offset(0)).await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match source.next().await {
                Ok(SourceEvent::Idle) => {}
                Ok(other) => panic!("a source on a replica-level server sent {other:?}"),
                Err(e) => break e,
            }
        }
    })
    .await
    .expect("the source neither failed nor sent anything in 60 s");
    match error {
        SourceError::Config(message) => assert!(names_the_fix(&message), "{message}"),
        other => panic!("not a configuration error: {other}"),
    }
    drop(source);

    // The command: exit 78 with the same message, nothing written or
    // committed, no slot left behind.
    let dir = std::env::temp_dir().join(format!("etl-cdc-wal-level-{}", names.suffix));
    std::fs::create_dir_all(&dir).unwrap();
    let config = config(&dir, &names);
    let binary = tokio::task::spawn_blocking(etl_binary).await.unwrap();
    let status = {
        let (dir, config) = (dir.clone(), config.clone());
        tokio::task::spawn_blocking(move || {
            let mut child = start_run(&dir, &[], &config, 1).unwrap();
            wait_exit(&mut child, Duration::from_secs(60)).unwrap()
        })
        .await
        .unwrap()
    };
    let stderr = run_stderr(&dir, 1);
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(names_the_fix(&stderr), "{stderr}");
    assert!(!stderr.contains(server.password()), "{stderr}");
    let written = std::fs::read(dir.join("out.ndjson")).unwrap_or_default();
    assert!(written.is_empty(), "{}", String::from_utf8_lossy(&written));
    let offsets = Command::new(&binary)
        .args(["offsets", "show", "--json"])
        .arg(&config)
        .current_dir(&dir)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&offsets.stdout).into_owned();
    assert!(
        offsets.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&offsets.stderr)
    );
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(
        shown["partitions"],
        serde_json::json!([]),
        "offsets committed: {shown}"
    );
    let slots: i64 = db
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "a slot was created on a replica-level server");

    // `etl validate` reads the file without connecting (the server is
    // stopped): the file is valid, and the level is the server's, which
    // it cannot know.
    server.stop().unwrap();
    let validated = Command::new(&binary)
        .arg("validate")
        .arg(&config)
        .current_dir(&dir)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
    assert_eq!(validated.status.code(), Some(0), "{out}");
    assert!(!out.contains("wal_level"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
