//! The stores gone back in time, as the checker's excuses need them: etcd restored from an
//! older backup (`crate::operator::backup_or_restore`), the apiserver's clock stepped back
//! (`crate::operator::jump_clock`).

/// What went back in time, and when.
#[derive(Default)]
pub(crate) struct Resets {
    /// When (ms) etcd was last restored from a backup.
    pub restored_at: Option<u64>,
    /// The last restore made etcd a new cluster (every answer shows its id).
    pub shows_id: bool,
    /// The request being checked came from a daemon whose name etcd's restore put in doubt.
    pub doubtful_writer: bool,
    /// The apiserver's clock stepped back (its stamps of before lie ahead of it a while).
    pub apiserver_stepped_back: bool,
}
