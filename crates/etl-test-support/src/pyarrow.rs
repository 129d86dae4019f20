//! An independent reader of what the object-store sink writes: pyarrow,
//! pinned, from PyPI, in a virtual environment under `target/pyarrow/`.
//!
//! [`read_objects`] reads every object under a prefix of a local folder,
//! an S3-compatible server or an Azure Blob container (through pyarrow's
//! own S3 and Azure clients) and
//! returns, per object, its key, its Arrow schema as pyarrow prints it and
//! its rows as JSON values. Parquet files are read with `pyarrow.parquet`,
//! NDJSON ones (`.ndjson`, `.ndjson.gz`, `.ndjson.zst`) line by line after
//! pyarrow's own decompression.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::{Error, with_file_lock, workspace_root};

/// The pinned reader.
pub const PYARROW: &str = "pyarrow==26.0.1";

/// Where the objects to read are.
#[derive(Debug, Clone)]
pub enum Location {
    /// A local folder (the root of a local object store).
    Folder(PathBuf),
    /// A bucket of an S3-compatible server.
    S3 {
        /// `http://127.0.0.1:PORT`.
        endpoint: String,
        /// The bucket.
        bucket: String,
        /// Access key id.
        access_key: String,
        /// Secret access key.
        secret_key: String,
        /// The region the server expects.
        region: String,
    },
    /// A container of an Azure Blob service (Azurite), read through
    /// pyarrow's own Azure client.
    Azure {
        /// `http://127.0.0.1:PORT`, the blob service (the account is
        /// given apart).
        service: String,
        /// The storage account.
        account: String,
        /// The account's key.
        key: String,
        /// The container.
        container: String,
    },
}

/// The script: arguments are a JSON description of the location and the
/// prefix; prints `[{"key", "schema", "rows"}]` sorted by key.
const SCRIPT: &str = r#"
import io, json, sys
import pyarrow as pa, pyarrow.parquet as pq, pyarrow.fs as pafs
loc = json.loads(sys.argv[1]); prefix = sys.argv[2]
if loc["kind"] == "folder":
    fs = pafs.LocalFileSystem(); root = loc["path"]
elif loc["kind"] == "azure":
    scheme, host = loc["service"].split("://", 1)
    fs = pafs.AzureFileSystem(loc["account"], account_key=loc["key"],
        blob_storage_authority=host, blob_storage_scheme=scheme,
        dfs_storage_authority=host, dfs_storage_scheme=scheme)
    root = loc["container"]
else:
    scheme, host = loc["endpoint"].split("://", 1)
    fs = pafs.S3FileSystem(access_key=loc["access_key"], secret_key=loc["secret_key"],
        endpoint_override=host, scheme=scheme, region=loc["region"], force_virtual_addressing=False)
    root = loc["bucket"]
base = root.rstrip("/") + "/" + prefix
out = []
try:
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
except FileNotFoundError:
    infos = []
for info in sorted(infos, key=lambda i: i.path):
    if info.type != pafs.FileType.File:
        continue
    key = info.path[len(root.rstrip("/")) + 1:]
    if key.endswith(".parquet"):
        with fs.open_input_file(info.path) as f:
            table = pq.read_table(f)
        out.append({"key": key, "schema": str(table.schema), "rows": table.to_pylist()})
    else:
        codec = "gzip" if key.endswith(".gz") else ("zstd" if key.endswith(".zst") else None)
        with fs.open_input_stream(info.path, compression=codec) as f:
            text = f.read().decode("utf-8")
        out.append({"key": key, "schema": "", "rows": [json.loads(l) for l in text.splitlines() if l]})
json.dump(out, sys.stdout, default=str)
"#;

/// Every object under `prefix` of `location`, read by pyarrow: key,
/// schema (empty for NDJSON), rows.
pub fn read_objects(
    location: &Location,
    prefix: &str,
) -> Result<Vec<(String, String, Vec<serde_json::Value>)>, Error> {
    let python = python()?;
    let loc = match location {
        Location::Folder(path) => serde_json::json!({"kind": "folder", "path": path}),
        Location::S3 {
            endpoint,
            bucket,
            access_key,
            secret_key,
            region,
        } => serde_json::json!({
            "kind": "s3", "endpoint": endpoint, "bucket": bucket,
            "access_key": access_key, "secret_key": secret_key, "region": region,
        }),
        Location::Azure {
            service,
            account,
            key,
            container,
        } => serde_json::json!({
            "kind": "azure", "service": service, "account": account, "key": key,
            "container": container,
        }),
    };
    let output = Command::new(&python)
        .args(["-c", SCRIPT, &loc.to_string(), prefix])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error(format!("cannot run {}: {e}", python.display())))?;
    if !output.status.success() {
        return Err(Error(format!(
            "pyarrow could not read {prefix:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let objects: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout)
        .map_err(|e| Error(format!("pyarrow's answer is not JSON: {e}")))?;
    Ok(objects
        .into_iter()
        .map(|o| {
            let text = |f: &str| o[f].as_str().unwrap_or_default().to_owned();
            let rows = o["rows"].as_array().cloned().unwrap_or_default();
            (text("key"), text("schema"), rows)
        })
        .collect())
}

/// `target/pyarrow/venv/bin/python`, installing the reader first if
/// missing: a Python that imports the pinned pyarrow.
pub fn python() -> Result<PathBuf, Error> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_thread_at_a_time = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = workspace_root().join("target").join("pyarrow");
    let venv = cache.join("venv");
    let python = venv.join("bin").join("python");
    // Written last: an install cut short is done again.
    let marker = cache.join("installed");
    let installed =
        || python.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m == PYARROW);
    if installed() {
        return Ok(python);
    }
    with_file_lock("pyarrow", || {
        if installed() {
            return Ok(python.clone());
        }
        std::fs::create_dir_all(&cache)
            .map_err(|e| Error(format!("cannot create {}: {e}", cache.display())))?;
        eprintln!(
            "installing the test reader ({PYARROW}) into {}",
            venv.display()
        );
        let run = |program: &str, args: &[&str]| -> Result<(), Error> {
            let status = Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .status()
                .map_err(|e| Error(format!("cannot run {program}: {e}")))?;
            if status.success() {
                Ok(())
            } else {
                Err(Error(format!(
                    "`{program} {}` failed: {status}",
                    args.join(" ")
                )))
            }
        };
        run(
            "python3",
            &["-m", "venv", "--clear", &venv.to_string_lossy()],
        )?;
        run(
            &venv.join("bin").join("pip").to_string_lossy(),
            &["install", "-q", "--disable-pip-version-check", PYARROW],
        )?;
        std::fs::write(&marker, PYARROW)
            .map_err(|e| Error(format!("cannot write {}: {e}", marker.display())))?;
        Ok(python.clone())
    })
}
