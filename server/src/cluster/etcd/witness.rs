//! A node's witness in etcd: `witness/<node>`, put in every transaction of the node's that
//! writes, so that its revision there is that of the node's last write. An etcd restored from
//! a backup taken before that write shows the key older, or not at all, whatever the other
//! nodes wrote since: their writes move the revision past every one this node has seen (and
//! `etcdutl snapshot restore --bump-revision`, as Kubernetes advises, moves it on at once),
//! which hides the restore from the revision check of
//! [`EtcdClient::resets`](super::client::EtcdClient::resets), but cannot bring this node's own
//! write back.
//!
//! Once the node has written, every request of its that touches keys reads the witness too, in
//! the same request: a range is sent as a transaction of two ranges, and each branch of a
//! transaction reads it last (before putting it, in a branch that writes). So no answer from a
//! restored etcd is taken for the truth, not even once, before the node sees the restore (a
//! regular sync that trusted a listing without the pins made after the backup forgot them,
//! and the first sync after the reset had nothing left to make again). And its writes are
//! conditioned on the witness being its last write or a later one: none lands on a restored
//! etcd, not even one whose answer is lost, which would bring the witness up to date unseen
//! (found by the simulation). The node's first write comes before it serves (taking its
//! name). The witness's value is the daemon's instance and the write's number
//! (`<instance>/<16 hex digits>`, rising with each write the process sends): a second daemon
//! under the node's name (which an etcd restored without the first one's `alive` key lets take
//! the name) writes its own instance, and the first, whose writes that hides, sees another's
//! and counts a reset (found by the simulation). A write is conditioned on the witness being
//! this daemon's, from the last write known to have landed or one sent after it, and sent
//! before this one: so the number only rises in etcd, and a witness whose number is below
//! that of the last write known to have landed is a reset. That catches a write sent before a
//! backup, its answer lost, that lands on the etcd restored from it at the revision of the
//! node's last write, which the restore reused (found by the simulation: the revision and the
//! instance alone looked right). An answer is judged by the last write known to have landed
//! when its request was sent, or by one that landed since at a revision up to the answer's:
//! etcd read the witness after that write, so it must show it (a read sent before a claim
//! landed, answered by an etcd restored without the claim at a revision bumped past it; and a
//! second claim sent with the first, landing on an etcd restored without it at the very
//! revision the restore reused: both found by the simulation). Two writes of this daemon's
//! that landed on the wrong sides of each other, one numbered after the other at a revision
//! below it, landed on two etcds (on one, the numbers rise with the revision): a reset too
//! (two claims sent together, the second landing below the first on an etcd restored from a
//! backup taken between them, with its data copied: found by the simulation). So did a write
//! that landed below the last one known to have landed and past the witness that one's read
//! showed: on one etcd that read would have shown it (two writes sent together, the second
//! landing first, the first on an etcd restored from a backup taken before the second, below
//! it: found by the simulation with restores made on purpose). And a witness at the revision
//! of the last write known to have landed that another write of this daemon's put: no two
//! writes share a revision on one etcd (a write sent with the last, its answer lost, that
//! landed on an etcd restored from a backup taken just before the last, at the revision the
//! restore reused: found by the simulation). Writes outside
//! transactions (a node's `seen` key, once per start) are not witnessed.

use std::sync::Mutex;

use ipool_proto::etcd::etcdserverpb as pb;
use ipool_proto::etcd::mvccpb::KeyValue;
use pb::request_op::Request;
use pb::response_op::Response;

use super::request::{cmp, op};

/// etcd's default `--max-txn-ops`: a branch that would go past it is sent as it is.
const MAX_TXN_OPS: usize = 128;

/// The witness of one client (set once the node is known).
#[derive(Default)]
pub(crate) struct Witness {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    key: Option<Vec<u8>>,
    /// This daemon's instance: the witness's value (a second daemon under the node's name,
    /// which the restored etcd let take it, writes its own).
    instance: Vec<u8>,
    /// The revision of the last write that put the key (0: none yet).
    written: i64,
    /// The number of that write (see [`number`]).
    number: u64,
    /// A write that read the witness: the revision it landed at, and the witness's revision
    /// as its read showed it (before its own put).
    read: (i64, i64),
}

/// The numbers of this process's witnessed writes.
static WRITES: super::numbers::Numbers = super::numbers::Numbers::new();

/// The witness's value for write `number` of `instance` (fixed width: values of one instance
/// sort as their numbers do).
fn value_of(instance: &[u8], number: u64) -> Vec<u8> {
    if unnumbered() {
        return instance.to_vec();
    }
    let mut v = instance.to_vec();
    v.extend_from_slice(format!("/{number:016x}").as_bytes());
    v
}

/// The witness as it was: the instance alone, the writes conditioned on it being this
/// daemon's (switch `witness-unnumbered`).
fn unnumbered() -> bool {
    crate::bugs::on(crate::bugs::Bug::WitnessUnnumbered)
}

/// The witness read only once a write of this process's was known to have landed (switch
/// `witness-unread-after-reset`): after a reset, two writes on their way together, the first
/// landing before etcd was restored again and the second after, left the second's answer
/// unjudged, and its witness hid the restore.
fn unread_after_reset() -> bool {
    crate::bugs::on(crate::bugs::Bug::WitnessUnreadAfterReset)
}

/// The instance and the write's number in a witness's value.
fn parse(value: &[u8]) -> Option<(&[u8], u64)> {
    if unnumbered() {
        return Some((value, u64::MAX));
    }
    let at = value.iter().rposition(|b| *b == b'/')?;
    let digits = std::str::from_utf8(&value[at + 1..]).ok()?;
    if digits.len() != 16 {
        return None;
    }
    Some((&value[..at], u64::from_str_radix(digits, 16).ok()?))
}

/// What was added to a branch of a transaction.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Added {
    read: bool,
    put: bool,
}

/// What a transaction was sent with, and the last witnessed write before it was.
#[derive(Clone, Default, Debug)]
pub(crate) struct Marked {
    before: i64,
    /// The number of the last write known to have landed when this one was sent.
    known: u64,
    /// This transaction's number (what it puts).
    number: u64,
    instance: Vec<u8>,
    then: Added,
    otherwise: Added,
    /// Its writes were conditioned on the witness being that write or a later one.
    guarded: bool,
}

/// What the witness showed a transaction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Shown {
    /// Nothing wrong.
    Fine,
    /// A reset (why); the answer stands (a read's, or one whose writes ran).
    Reset(String),
    /// A reset (why) that made the transaction's guard fail: its answer is not its caller's.
    Refused(String),
}

/// The witness's read: its value too (the instance that wrote it; `keys_only` would leave it
/// out).
fn read(key: Vec<u8>) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Request::RequestRange(super::request::get(key))),
    }
}

fn written_key(o: &pb::RequestOp) -> Option<&Vec<u8>> {
    match &o.request {
        Some(Request::RequestPut(p)) => Some(&p.key),
        Some(Request::RequestDeleteRange(d)) => Some(&d.key),
        _ => None,
    }
}

fn writes(ops: &[pb::RequestOp]) -> bool {
    ops.iter().any(|o| {
        matches!(
            o.request,
            Some(Request::RequestPut(_)) | Some(Request::RequestDeleteRange(_))
        )
    })
}

impl Marked {
    /// The value this transaction puts in the witness.
    #[cfg(test)]
    fn value_put(&self) -> Vec<u8> {
        value_of(&self.instance, self.number)
    }
}

impl Witness {
    pub(crate) fn set(&self, key: Vec<u8>, instance: Vec<u8>) {
        let mut s = self.state.lock().expect("witness lock");
        if s.key.as_ref() != Some(&key) || s.instance != instance {
            *s = State {
                key: Some(key),
                instance,
                ..State::default()
            };
        }
    }

    /// Forgets the writes witnessed so far (etcd was found reset: they are not its).
    pub(crate) fn forget(&self) {
        let mut s = self.state.lock().expect("witness lock");
        s.written = 0;
        s.number = 0;
        s.read = (0, 0);
    }

    /// The revision of the last witnessed write.
    #[cfg(test)]
    fn written(&self) -> i64 {
        self.state.lock().expect("witness lock").written
    }

    /// The key, the instance and the last witnessed write (its revision and number).
    fn now(&self) -> Option<(Vec<u8>, Vec<u8>, i64, u64)> {
        if crate::bugs::on(crate::bugs::Bug::WritesUnwitnessed) {
            return None;
        }
        let s = self.state.lock().expect("witness lock");
        s.key
            .clone()
            .map(|k| (k, s.instance.clone(), s.written, s.number))
    }

    /// A range `r` as it is sent: a transaction that reads the witness too, once a write was
    /// witnessed (else `r` as it is).
    pub(crate) fn range(
        &self,
        r: pb::RangeRequest,
    ) -> Result<(pb::TxnRequest, Marked), pb::RangeRequest> {
        match self.now() {
            None => Err(r),
            Some((_, _, 0, _)) if unread_after_reset() => Err(r),
            Some(_) => {
                let ops = [pb::RequestOp {
                    request: Some(Request::RequestRange(r)),
                }];
                let mut t = super::request::txn([], ops, []);
                let marked = self.mark(&mut t);
                Ok((t, marked))
            }
        }
    }

    /// Each branch of `t` reads the witness last (once a write was witnessed), and puts it
    /// after, if it writes.
    pub(crate) fn mark(&self, t: &mut pb::TxnRequest) -> Marked {
        let Some((key, instance, before, known)) = self.now() else {
            return Marked::default();
        };
        let number = WRITES.next();
        let value = value_of(&instance, number);
        let add = |ops: &mut Vec<pb::RequestOp>| {
            // etcd refuses a key written twice in one transaction (this node's own witness
            // deleted: its daemon released by its own client, as a test does).
            let put = writes(ops) && !ops.iter().any(|o| written_key(o) == Some(&key));
            // Read even before a write of this process's is known to have landed (at its start,
            // or after a reset): one that lands while this is on its way is then judged by.
            let added = Added {
                read: before > 0 || !unread_after_reset(),
                put,
            };
            if ops.len() + added.read as usize + added.put as usize > MAX_TXN_OPS {
                return Added::default();
            }
            if added.read {
                ops.push(read(key.clone()));
            }
            if added.put {
                ops.push(op::put(key.clone(), value.clone(), 0));
            }
            added
        };
        let then = add(&mut t.success);
        let otherwise = add(&mut t.failure);
        // Writes land only on the etcd this node wrote to: none applies to a restored one, not
        // even one whose answer is lost (it would bring the witness up to date unseen); and
        // only over the last write known to have landed, or one sent after it and before this
        // one (whose answer is not in yet), so that the numbers only rise. Not where the
        // other branch writes (a guard that fails would run it).
        let guarded = before > 0 && then.put && !otherwise.put;
        if guarded {
            t.compare
                .push(cmp::mod_revision(key.clone(), cmp::Greater, before - 1));
            if unnumbered() {
                t.compare
                    .push(cmp::value(key, cmp::Equal, instance.clone()));
            } else {
                t.compare.push(cmp::value(
                    key.clone(),
                    cmp::Greater,
                    value_of(&instance, known.saturating_sub(1)),
                ));
                t.compare.push(cmp::value(key, cmp::Less, value));
            }
        }
        Marked {
            before,
            known,
            number,
            instance,
            then,
            otherwise,
            guarded,
        }
    }

    /// Takes what `marked` added out of the answer `t`: what the witness showed the branch
    /// that ran (its last witnessed write gone: a reset).
    pub(crate) fn answered(&self, marked: &Marked, t: &mut pb::TxnResponse) -> Shown {
        let revision = t.header.as_ref().map_or(0, |h| h.revision);
        let since = self.landed_before(marked, revision);
        let (wrong, read) = Witness::judged(marked, since, t);
        let shown = wrong.or_else(|| self.crossed(marked, t, revision));
        if let (None, Some(read), true) = (&shown, read, t.succeeded && marked.then.put) {
            let mut s = self.state.lock().expect("witness lock");
            if revision > s.written {
                s.read = (revision, read);
            }
        }
        match shown {
            None => Shown::Fine,
            Some(why) if marked.guarded && !t.succeeded => Shown::Refused(why),
            Some(why) => Shown::Reset(why),
        }
    }

    /// A write of this daemon's that landed (guarded by the witness, which it put) at
    /// `revision` on the wrong side of the last one known to have landed: numbered after it
    /// and below its revision, or numbered before it and past it. On one etcd the numbers
    /// only rise with the revision (each write's compare refuses a witness numbered at or past
    /// its own), so the two landed on two etcds: it was restored from a backup between them.
    /// Or below it and past the witness that one's read showed: on one etcd its read would
    /// have shown this write's put (a write numbered before it, landing below it on an etcd
    /// restored, its data copied, from a backup taken before it).
    fn crossed(&self, marked: &Marked, t: &pb::TxnResponse, revision: i64) -> Option<String> {
        if !(marked.guarded && t.succeeded && marked.then.put)
            || crate::bugs::on(crate::bugs::Bug::CrossedWritesUnseen)
        {
            return None;
        }
        let s = self.state.lock().expect("witness lock");
        if s.written == 0 || s.instance != marked.instance {
            return None;
        }
        let unread = s.read.0 == s.written && s.read.1 < revision && revision < s.written;
        let crossed = (marked.number > s.number && revision < s.written)
            || (marked.number < s.number && revision > s.written)
            || (unread && !crate::bugs::on(crate::bugs::Bug::UnreadWriteBelow));
        crossed.then(|| {
            format!(
                "this node's write landed at revision {revision}, on the wrong side of its write known to have landed at revision {} (etcd restored from an older backup between them?)",
                s.written
            )
        })
    }

    /// The last write to judge the witness by (its revision and number): the last known to
    /// have landed, where it landed after `marked` was sent at a revision up to `revision`
    /// (the answer's: etcd read the witness after that write, so it must show it or a later
    /// one; an etcd restored with `--bump-revision` answers past it without it, and one
    /// restored without answers a write at the very revision it reused, which no two writes
    /// share), else the last known when `marked` was sent (the answer may have been read
    /// before the writes that landed since).
    fn landed_before(&self, marked: &Marked, revision: i64) -> (i64, u64) {
        let s = self.state.lock().expect("witness lock");
        let reached = match crate::bugs::on(crate::bugs::Bug::WitnessJudgedPastOnly) {
            true => s.written < revision,
            false => s.written <= revision,
        };
        let later = s.written > marked.before
            && reached
            && !crate::bugs::on(crate::bugs::Bug::WitnessJudgedWhenSent);
        match later && s.instance == marked.instance {
            true => (s.written, s.number),
            false => (marked.before, marked.known),
        }
    }

    /// What is wrong with the witness the branch that ran read, if anything, and the
    /// witness's revision as it read it (0: none), if it read it.
    fn judged(
        marked: &Marked,
        since: (i64, u64),
        t: &mut pb::TxnResponse,
    ) -> (Option<String>, Option<i64>) {
        let added = match t.succeeded {
            true => marked.then,
            false => marked.otherwise,
        };
        if added.put {
            t.responses.pop();
        }
        if !added.read {
            return (None, None);
        }
        let kv = match t.responses.pop().and_then(|o| o.response) {
            Some(Response::ResponseRange(g)) => g.kvs.into_iter().next(),
            _ => None,
        };
        let read = kv.as_ref().map_or(0, |kv| kv.mod_revision);
        (
            judge(since.0, since.1, &marked.instance, kv.as_ref()),
            Some(read),
        )
    }

    /// The branch that ran put the witness: the last witnessed write is at the answer's
    /// revision.
    pub(crate) fn wrote(&self, marked: &Marked, t: &pb::TxnResponse) {
        let ran = match t.succeeded {
            true => marked.then,
            false => marked.otherwise,
        };
        if let (true, Some(h)) = (ran.put, &t.header) {
            let mut s = self.state.lock().expect("witness lock");
            s.written = s.written.max(h.revision);
            s.number = s.number.max(marked.number);
        }
    }

    /// The range's answer in the answer `t` to a range sent by [`Witness::range`] (the
    /// witness taken out), with the transaction's header.
    pub(crate) fn range_answer(mut t: pb::TxnResponse) -> pb::RangeResponse {
        let mut g = match t.responses.pop().and_then(|o| o.response) {
            Some(Response::ResponseRange(g)) => g,
            _ => pb::RangeResponse::default(),
        };
        g.header = t.header.take();
        g
    }
}

/// What is wrong with the witness as `kv` (read from etcd) shows it, when the last write
/// witnessed before the read was sent was at revision `before`, numbered `known`: `None` if
/// it is that write or a later one of this daemon's (`instance`).
fn judge(before: i64, known: u64, instance: &[u8], kv: Option<&KeyValue>) -> Option<String> {
    let kv = match kv {
        _ if before == 0 => return None,
        None => {
            return Some(format!(
                "this node's last write (revision {before}) is gone from etcd (restored from an older backup, or the node released?)"
            ))
        }
        Some(kv) => kv,
    };
    let shown = parse(&kv.value);
    match shown {
        Some((i, _)) if i == instance => {}
        _ => {
            let theirs = shown.map_or(kv.value.as_slice(), |(i, _)| i);
            return Some(format!(
                "this node's last write (revision {before}) is not the last in etcd under its name: another daemon's ({:?}) came after it at revision {} (etcd restored from an older backup, and a second daemon under the node's name took it?)",
                String::from_utf8_lossy(theirs),
                kv.mod_revision
            ));
        }
    }
    match shown {
        _ if kv.mod_revision < before => Some(format!(
            "this node's last write (revision {before}) is gone from etcd: its witness is from revision {} (restored from an older backup?)",
            kv.mod_revision
        )),
        Some((_, n)) if n < known => Some(format!(
            "this node's last write (revision {before}) is gone from etcd: its witness is an earlier write of this node's, at revision {} (restored from an older backup, which a write sent before it landed on late?)",
            kv.mod_revision
        )),
        // No two writes share a revision on one etcd.
        Some((_, n))
            if kv.mod_revision == before
                && n != known
                && !unnumbered()
                && !crate::bugs::on(crate::bugs::Bug::OtherWriteAtLastRevision) =>
        {
            Some(format!(
                "this node's last write (revision {before}) is gone from etcd: another write of this node's is at its revision (restored from an older backup, its data copied, which a write sent with it landed on late?)"
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
