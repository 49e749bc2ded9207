//! The operators' commands: the one under way (one at a time), a second operator's beside it
//! (`crate::provoke`), every command by number (its requests may arrive after it ended), what
//! each came to, and the pool as they were told it (`crate::told`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// An operator's command.
#[derive(Clone)]
pub(crate) struct Op {
    /// `--force`.
    pub forced: bool,
    /// The node it releases, if it is release-node.
    pub release_of: Option<String>,
    /// The release of departed nodes, as the daemon that leads it runs it: without
    /// `--force`, of any node whose Node is gone.
    pub departed: bool,
}

/// What an operator's command came to.
pub(crate) struct OpDone {
    pub what: String,
    pub result: Result<String, String>,
    /// The command's number.
    pub seq: usize,
    /// A second operator's command, run beside the one under way (`crate::provoke`).
    pub second: bool,
}

/// The operators' commands.
#[derive(Default)]
pub(crate) struct Operators {
    /// What the commands came to, as they end (taken in by `World::drain`).
    pub done: Arc<Mutex<Vec<OpDone>>>,
    /// A command is running (one at a time), forced or not.
    pub running: Option<Op>,
    /// A second operator's pool command is running beside it (`crate::provoke`).
    pub second: bool,
    /// Commands so far (the one under way is the last).
    pub seq: usize,
    /// Every command, by number: its requests may arrive after it ended.
    pub commands: BTreeMap<usize, Op>,
    /// The commands that are the CronJob's looks (`crate::identity`).
    pub cronjob: BTreeSet<usize>,
    /// The nodes the last look of the departed could not judge (they recorded no Node name).
    pub unknown_nodes: Vec<String>,
    /// The pool as the operators were told it.
    pub told: crate::told::Told,
}
