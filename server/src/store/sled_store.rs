//! The sled implementation of [`Store`].

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::{AttachmentRecord, Change, Reservation, Snapshot, Store, StoreError, SCHEMA_VERSION};
use crate::config::NetworkDef;

pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    networks: sled::Tree,
    attachments: sled::Tree,
    idle: sled::Tree,
    cursors: sled::Tree,
    reservations: sled::Tree,
    meta: sled::Tree,
    /// sled's data file, synced (fdatasync) after every flush: sled's own flush ends in
    /// `sync_file_range`, which survives a crash of the process but not a power loss.
    data_file: std::fs::File,
}

/// A change turned into bytes before the transaction (which may run more than once).
enum Op {
    Put(usize, Vec<u8>, Vec<u8>),
    Del(usize, Vec<u8>),
}

const NETWORKS: usize = 0;
const ATTACHMENTS: usize = 1;
const IDLE: usize = 2;
const CURSORS: usize = 3;
const RESERVATIONS: usize = 4;
const META: usize = 5;

const BOOT_ID: &str = "boot_id";
const DRAIN_PREFIX: &str = "drain\0";

fn ip_key(network: &str, ip: &IpAddr) -> Vec<u8> {
    format!("{network}\0{ip}").into_bytes()
}

impl SledStore {
    /// Opens (or creates) the database in `dir`. Refuses a store of a newer schema, or one it
    /// cannot read, naming the path.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        let path = dir.join("db");
        let open_err = |e: sled::Error| StoreError::Open {
            path: path.clone(),
            msg: match e {
                sled::Error::Io(io)
                    if io.kind() == std::io::ErrorKind::WouldBlock
                        || io.to_string().contains("could not acquire lock") =>
                {
                    format!("it is locked by another process (is another ipoold running on this state dir?): {io}")
                }
                other => other.to_string(),
            },
        };
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.to_path_buf(),
            msg: e.to_string(),
        })?;
        // No background flusher: every durable write goes through our group commit (flush +
        // fdatasync), so what a reply acknowledged never depends on a timer.
        let db = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            // sled's page cache defaults to 1 GiB and grows towards it with the data: about
            // 20 MiB at 65 536 attachments. Everything is read once at start and then kept in
            // the engine; writes need only the pages they touch, which the OS caches anyway.
            .cache_capacity(1 << 20)
            .open()
            .map_err(|e| match e {
                sled::Error::Corruption { .. } => StoreError::Corrupt {
                    path: path.clone(),
                    msg: e.to_string(),
                },
                other => open_err(other),
            })?;
        let tree = |name: &str| db.open_tree(name).map_err(open_err);
        let meta = tree("meta")?;
        // sled 0.34 keeps everything in one file, `db`, inside its directory.
        let data_file = std::fs::File::open(path.join("db")).map_err(|e| StoreError::Open {
            path: path.join("db"),
            msg: e.to_string(),
        })?;
        let store = SledStore {
            networks: tree("networks")?,
            attachments: tree("attachments")?,
            idle: tree("idle")?,
            cursors: tree("cursors")?,
            reservations: tree("reservations")?,
            meta: meta.clone(),
            data_file,
            db,
            path: path.clone(),
        };
        let write_version = || -> Result<(), StoreError> {
            meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())
                .map_err(open_err)?;
            store.flush()
        };
        match meta.get("schema_version").map_err(open_err)? {
            Some(v) => {
                let found = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| StoreError::Corrupt {
                        path: path.clone(),
                        msg: "schema_version is not a 4-byte number".into(),
                    })?;
                if found > SCHEMA_VERSION {
                    return Err(StoreError::NewerSchema { path, found });
                }
                if found < SCHEMA_VERSION {
                    // 1 -> 2 only adds a tree and a meta key; mark the store so an older
                    // ipoold, which would not see reservations, refuses it.
                    write_version()?;
                }
            }
            None => {
                let has_data = [
                    &store.networks,
                    &store.attachments,
                    &store.idle,
                    &store.cursors,
                    &store.reservations,
                ]
                .iter()
                .any(|t| !t.is_empty());
                if has_data {
                    return Err(StoreError::Corrupt {
                        path,
                        msg: "it holds data but no schema_version".into(),
                    });
                }
                write_version()?;
            }
        }
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, what: &str, key: &[u8], e: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            msg: format!("{what} {:?}: {e}", String::from_utf8_lossy(key)),
        }
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            msg: e.to_string(),
        }
    }

    fn encode(&self, changes: &[Change]) -> Result<Vec<Op>, StoreError> {
        let json = |v: &dyn erased::Json| v.to_vec().map_err(|e| self.io(e));
        changes
            .iter()
            .map(|c| {
                Ok(match c {
                    Change::PutNetwork(d) => {
                        Op::Put(NETWORKS, d.name.as_bytes().to_vec(), json(d)?)
                    }
                    Change::DeleteNetwork(n) => Op::Del(NETWORKS, n.as_bytes().to_vec()),
                    Change::PutAttachment(a) => Op::Put(ATTACHMENTS, a.key.encode(), json(a)?),
                    Change::DeleteAttachment(k) => Op::Del(ATTACHMENTS, k.encode()),
                    Change::PutIdle {
                        network,
                        ip,
                        released_at,
                    } => Op::Put(
                        IDLE,
                        ip_key(network, ip),
                        released_at.to_be_bytes().to_vec(),
                    ),
                    Change::DeleteIdle { network, ip } => Op::Del(IDLE, ip_key(network, ip)),
                    Change::PutCursor {
                        network,
                        set,
                        cursor,
                    } => {
                        let k = format!("{network}\0{set}").into_bytes();
                        match cursor {
                            Some(ip) => Op::Put(CURSORS, k, ip.to_string().into_bytes()),
                            None => Op::Del(CURSORS, k),
                        }
                    }
                    Change::PutReservation(r) => Op::Put(RESERVATIONS, r.key.encode(), json(r)?),
                    Change::DeleteReservation(k) => Op::Del(RESERVATIONS, k.encode()),
                    Change::PutBootId(id) => {
                        Op::Put(META, BOOT_ID.as_bytes().to_vec(), id.as_bytes().to_vec())
                    }
                    Change::PutDrain { network, drained } => {
                        let k = format!("{DRAIN_PREFIX}{network}").into_bytes();
                        if *drained {
                            Op::Put(META, k, b"1".to_vec())
                        } else {
                            Op::Del(META, k)
                        }
                    }
                })
            })
            .collect()
    }
}

/// serde_json behind a trait object, so `encode` can take any record.
mod erased {
    pub trait Json {
        fn to_vec(&self) -> serde_json::Result<Vec<u8>>;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
            serde_json::to_vec(self)
        }
    }
}

fn split2(key: &[u8]) -> Option<(String, String)> {
    let s = std::str::from_utf8(key).ok()?;
    let (a, b) = s.split_once('\0')?;
    Some((a.to_string(), b.to_string()))
}

impl Store for SledStore {
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut attachments = Vec::new();
        let snap = self.load_with(&mut |a| attachments.push(a))?;
        Ok(Snapshot {
            attachments,
            ..snap
        })
    }

    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        let mut snap = Snapshot::default();
        for kv in self.networks.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let d: NetworkDef =
                serde_json::from_slice(&v).map_err(|e| self.corrupt("network", &k, e))?;
            snap.networks.push(d);
        }
        for kv in self.attachments.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let a: AttachmentRecord =
                serde_json::from_slice(&v).map_err(|e| self.corrupt("attachment", &k, e))?;
            each_attachment(a);
        }
        for kv in self.idle.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let (net, ip) = split2(&k).ok_or_else(|| self.corrupt("idle key", &k, "bad key"))?;
            let ip: IpAddr = ip.parse().map_err(|e| self.corrupt("idle key", &k, e))?;
            let at = <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|e| self.corrupt("idle value", &k, e))?;
            snap.idle.push((net, ip, at));
        }
        for kv in self.cursors.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let (net, set) = split2(&k).ok_or_else(|| self.corrupt("cursor key", &k, "bad key"))?;
            let set: usize = set.parse().map_err(|e| self.corrupt("cursor key", &k, e))?;
            let ip: IpAddr = std::str::from_utf8(&v)
                .map_err(|e| self.corrupt("cursor", &k, e))?
                .parse()
                .map_err(|e| self.corrupt("cursor", &k, e))?;
            snap.cursors.push((net, set, ip));
        }
        for kv in self.reservations.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let r: Reservation =
                serde_json::from_slice(&v).map_err(|e| self.corrupt("reservation", &k, e))?;
            snap.reservations.push(r);
        }
        if let Some(v) = self.meta.get(BOOT_ID).map_err(|e| self.io(e))? {
            let id =
                std::str::from_utf8(&v).map_err(|e| self.corrupt("meta", BOOT_ID.as_bytes(), e))?;
            snap.boot_id = Some(id.to_string());
        }
        for kv in self.meta.scan_prefix(DRAIN_PREFIX) {
            let (k, _) = kv.map_err(|e| self.io(e))?;
            let net = std::str::from_utf8(&k[DRAIN_PREFIX.len()..])
                .map_err(|e| self.corrupt("meta", &k, e))?;
            snap.drained.push(net.to_string());
        }
        Ok(snap)
    }

    fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
        let ops = self.encode(changes)?;
        let trees = (
            &self.networks,
            &self.attachments,
            &self.idle,
            &self.cursors,
            &self.reservations,
            &self.meta,
        );
        trees
            .transaction(|(n, a, i, c, r, m)| {
                for op in &ops {
                    let t = |idx: usize| match idx {
                        NETWORKS => n,
                        ATTACHMENTS => a,
                        IDLE => i,
                        CURSORS => c,
                        RESERVATIONS => r,
                        _ => m,
                    };
                    match op {
                        Op::Put(idx, k, v) => {
                            t(*idx).insert(k.as_slice(), v.as_slice())?;
                        }
                        Op::Del(idx, k) => {
                            t(*idx).remove(k.as_slice())?;
                        }
                    }
                }
                Ok::<(), ConflictableTransactionError<()>>(())
            })
            .map_err(|e: TransactionError<()>| self.io(format!("{e:?}")))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| self.io(e))?;
        self.data_file
            .sync_data()
            .map_err(|e| self.io(format!("fdatasync: {e}")))
    }
}
