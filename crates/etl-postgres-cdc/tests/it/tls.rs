//! The replication connection over TLS, checked as the PostgreSQL sink
//! checks it: a server certificate made here, `verify-full` against its
//! CA, and the wrong CA refused as a configuration error.

use std::path::PathBuf;

use etl_postgres::SslMode;
use etl_postgres_cdc::PostgresCdcSource;
use etl_record::{Offset, PartitionId};
use etl_source::{Source, SourceError, SourceEvent};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::support::{Names, client_of};

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_stream_over_verified_tls_and_a_foreign_ca_is_refused() {
    let server = etl_test_support::postgres::start().unwrap();
    let ca_issuer = ca("etl cdc test CA");
    let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca_issuer).unwrap();
    server
        .enable_tls(&cert.pem(), &key.serialize_pem(), None)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("etl-cdc-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = write(&dir, "ca.pem", &ca_issuer.pem());
    let bad = write(&dir, "other.pem", &ca("some other CA").pem());

    let names = Names::on("tls", server.url());
    let db = client_of(&names.url).await;
    names.create(&db).await;
    let grows = names.table("grows");

    let mut config = names.config();
    config.sslmode = Some(SslMode::VerifyFull);
    config.sslrootcert = Some(good);
    let mut source = PostgresCdcSource::new(config).unwrap();
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(_)
    ));
    source.seek(PartitionId(0), Offset(0)).await.unwrap();
    names.wait_for_slot(&db).await;
    db.batch_execute(&format!("INSERT INTO {grows} VALUES (1, 1)"))
        .await
        .unwrap();
    let mut read = 0;
    for _ in 0..300 {
        if let SourceEvent::Batch(batch) = source.next().await.unwrap() {
            read += batch.records.len();
            break;
        }
    }
    assert_eq!(read, 1, "the insert, over TLS");
    drop(source);

    let mut config = names.config();
    config.sslmode = Some(SslMode::VerifyFull);
    config.sslrootcert = Some(bad);
    let mut source = PostgresCdcSource::new(config).unwrap();
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(_)
    ));
    source.seek(PartitionId(0), Offset(0)).await.unwrap();
    let error = loop {
        match source.next().await {
            Ok(SourceEvent::Idle) => {}
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&error, SourceError::Config(m) if m.contains("TLS")),
        "{error}"
    );
    drop(source);
    names.drop_all(&db).await;
    let _ = std::fs::remove_dir_all(dir);
}
