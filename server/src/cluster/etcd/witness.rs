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
//! when its request was sent, or by one that landed since at a revision below the answer's:
//! etcd read the witness after that write, so it must show it (a read sent before a claim
//! landed, answered by an etcd restored without the claim at a revision bumped past it: found
//! by the simulation). Writes outside transactions (a node's `seen` key, once per start) are
//! not witnessed.

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
                written: 0,
                number: 0,
            };
        }
    }

    /// Forgets the writes witnessed so far (etcd was found reset: they are not its).
    pub(crate) fn forget(&self) {
        let mut s = self.state.lock().expect("witness lock");
        s.written = 0;
        s.number = 0;
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
        match Witness::judged(marked, since, t) {
            None => Shown::Fine,
            Some(why) if marked.guarded && !t.succeeded => Shown::Refused(why),
            Some(why) => Shown::Reset(why),
        }
    }

    /// The last write to judge the witness by (its revision and number): the last known to
    /// have landed, where it landed after `marked` was sent at a revision below `revision`
    /// (the answer's: etcd read the witness after that write, so it must show it or a later
    /// one; an etcd restored with `--bump-revision` answers past it without it), else the
    /// last known when `marked` was sent (the answer may have been read before the writes
    /// that landed since).
    fn landed_before(&self, marked: &Marked, revision: i64) -> (i64, u64) {
        let s = self.state.lock().expect("witness lock");
        let later = s.written > marked.before
            && s.written < revision
            && !crate::bugs::on(crate::bugs::Bug::WitnessJudgedWhenSent);
        match later && s.instance == marked.instance {
            true => (s.written, s.number),
            false => (marked.before, marked.known),
        }
    }

    fn judged(marked: &Marked, since: (i64, u64), t: &mut pb::TxnResponse) -> Option<String> {
        let added = match t.succeeded {
            true => marked.then,
            false => marked.otherwise,
        };
        if added.put {
            t.responses.pop();
        }
        if !added.read {
            return None;
        }
        let kv = match t.responses.pop().and_then(|o| o.response) {
            Some(Response::ResponseRange(g)) => g.kvs.into_iter().next(),
            _ => None,
        };
        judge(since.0, since.1, &marked.instance, kv.as_ref())
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
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::etcd::request;

    /// The witness at revision `rev`: daemon i1's, a write numbered past every one sent here.
    fn kv(rev: i64) -> KeyValue {
        KeyValue {
            key: b"w".to_vec(),
            mod_revision: rev,
            value: value_of(b"i1", u64::MAX >> 1),
            ..Default::default()
        }
    }

    fn range_answer(kvs: Vec<KeyValue>) -> pb::ResponseOp {
        pb::ResponseOp {
            response: Some(Response::ResponseRange(pb::RangeResponse {
                kvs,
                ..Default::default()
            })),
        }
    }

    fn put_answer() -> pb::ResponseOp {
        pb::ResponseOp {
            response: Some(Response::ResponsePut(Default::default())),
        }
    }

    fn answer(succeeded: bool, revision: i64, responses: Vec<pb::ResponseOp>) -> pb::TxnResponse {
        pb::TxnResponse {
            header: Some(pb::ResponseHeader {
                revision,
                ..Default::default()
            }),
            succeeded,
            responses,
        }
    }

    #[test]
    fn writes_put_the_witness_and_reads_read_it_once_one_was_witnessed() {
        let w = Witness::default();
        let txn = || request::txn([], [op::put("k", "v", 0)], [op::get("k")]);
        // No key yet: nothing added; a range goes as it is.
        let mut t = txn();
        w.mark(&mut t);
        assert_eq!((t.success.len(), t.failure.len()), (1, 1));
        w.set(b"/p/witness/n1".to_vec(), b"i1".to_vec());
        assert!(w.range(request::get("k")).is_ok(), "read with the witness");
        // Nothing witnessed yet: the branch that writes puts it; both read it (a write that
        // lands meanwhile is judged by), nothing is guarded.
        let mut t = txn();
        let m = w.mark(&mut t);
        assert_eq!((t.success.len(), t.failure.len()), (3, 2));
        assert!(t.compare.is_empty());
        // The read-only branch ran: nothing written.
        let mut a = answer(false, 7, vec![range_answer(vec![]), range_answer(vec![])]);
        assert_eq!(w.answered(&m, &mut a), Shown::Fine);
        w.wrote(&m, &a);
        assert_eq!(w.written(), 0);
        let mut a = answer(
            true,
            9,
            vec![put_answer(), range_answer(vec![]), put_answer()],
        );
        assert_eq!(w.answered(&m, &mut a), Shown::Fine);
        assert_eq!(a.responses.len(), 1, "the witness's answer taken out");
        w.wrote(&m, &a);
        assert_eq!(w.written(), 9);
        // From now on every branch reads it, the writes are guarded on it, and a range is a
        // transaction.
        let mut t = txn();
        let m = w.mark(&mut t);
        assert_eq!((t.success.len(), t.failure.len()), (3, 2));
        assert_eq!(t.compare.len(), 3);
        assert_eq!(t.compare[0].key, b"/p/witness/n1");
        assert_eq!(t.compare[0].result, cmp::Greater as i32);
        // The witness this daemon's, from the last write known to have landed on, and written
        // before this one.
        assert_eq!(t.compare[1].result, cmp::Greater as i32);
        assert_eq!(t.compare[2].result, cmp::Less as i32);
        assert_eq!(
            t.compare[2].target_union,
            Some(pb::compare::TargetUnion::Value(m.value_put()))
        );
        let mut a = answer(
            false,
            12,
            vec![range_answer(vec![]), range_answer(vec![kv(9)])],
        );
        assert_eq!(w.answered(&m, &mut a), Shown::Fine);
        assert_eq!(a.responses.len(), 1);
        // The guard failed: the witness is older than the last write; the answer is not the
        // caller's.
        let mut a = answer(
            false,
            12,
            vec![range_answer(vec![]), range_answer(vec![kv(4)])],
        );
        assert!(matches!(w.answered(&m, &mut a), Shown::Refused(_)));
        // Where the other branch writes, no guard.
        let mut t = request::txn([], [op::put("k", "v", 0)], [op::delete("j")]);
        assert!(!w.mark(&mut t).guarded);
        assert!(t.compare.is_empty());
        let (t, m) = w.range(request::get("k")).ok().unwrap();
        assert_eq!(t.success.len(), 2);
        // Its value read too: the instance that wrote it.
        assert!(matches!(&t.success[1].request, Some(Request::RequestRange(r)) if !r.keys_only));
        let mut a = answer(
            true,
            12,
            vec![range_answer(vec![kv(3)]), range_answer(vec![kv(8)])],
        );
        let Shown::Reset(why) = w.answered(&m, &mut a) else {
            panic!("a reset")
        };
        assert!(why.contains("from revision 8"), "{why}");
        let g = Witness::range_answer(a);
        assert_eq!(g.kvs[0].mod_revision, 3);
        assert_eq!(g.header.unwrap().revision, 12);
    }

    /// The value a marked transaction puts in the witness.
    fn put_value(t: &pb::TxnRequest) -> Vec<u8> {
        t.success
            .iter()
            .find_map(|o| match &o.request {
                Some(Request::RequestPut(p)) if p.key == b"/p/witness/n1" => Some(p.value.clone()),
                _ => None,
            })
            .expect("the witness put")
    }

    /// etcd restored from a copy of its data (its revision back where the backup had it): a
    /// write of this node's sent before the backup, whose answer was lost, lands on the
    /// restored etcd at the very revision of the node's last write, which the restore lost.
    /// The witness then shows that revision and this daemon's instance, but not that write:
    /// a reset (found by the simulation, seed 1 000 009 634: the node served a block the
    /// restored etcd did not have).
    #[test]
    fn an_older_write_at_the_revision_of_the_last_is_a_reset() {
        let w = Witness::default();
        w.set(b"/p/witness/n1".to_vec(), b"i1".to_vec());
        let write = || request::txn([], [op::put("k", "v", 0)], []);
        let landed = |w: &Witness, rev: i64| {
            let mut t = write();
            let m = w.mark(&mut t);
            let reads = usize::from(m.then.read);
            let mut responses = vec![put_answer()];
            responses.extend((0..reads).map(|_| range_answer(vec![kv(rev - 1)])));
            responses.push(put_answer());
            let mut a = answer(true, rev, responses);
            assert_eq!(w.answered(&m, &mut a), Shown::Fine);
            w.wrote(&m, &a);
        };
        landed(&w, 37);
        // Sent, its answer lost (the backup is taken meanwhile, without it).
        let mut late = write();
        w.mark(&mut late);
        let late_value = put_value(&late);
        // The next write lands at 47; etcd is then restored, and the late one lands there at
        // 47 again.
        landed(&w, 47);
        let (_, m) = w.range(request::get("k")).expect("a read with the witness");
        let shown = KeyValue {
            key: b"/p/witness/n1".to_vec(),
            mod_revision: 47,
            value: late_value,
            ..Default::default()
        };
        let mut a = answer(
            true,
            48,
            vec![range_answer(vec![]), range_answer(vec![shown])],
        );
        assert!(
            matches!(w.answered(&m, &mut a), Shown::Reset(_)),
            "an older write where the last one was"
        );
    }

    /// A read sent before a write of this node's landed, answered after it at a later
    /// revision (etcd restored from a backup without that write, `--bump-revision`: the
    /// revision only went up), showing the witness older than that write: a reset, though the
    /// read was sent before the write landed. Answered at a revision below the write's, it was
    /// read before the write: nothing wrong (found by the simulation, seed 20 328: the node
    /// handed out from a block the restore had lost).
    #[test]
    fn a_read_answered_past_a_write_that_landed_meanwhile_judges_by_that_write() {
        let w = Witness::default();
        w.set(b"/p/witness/n1".to_vec(), b"i1".to_vec());
        let write = || request::txn([], [op::put("k", "v", 0)], []);
        let landed = |w: &Witness, t: &mut pb::TxnRequest, m: &Marked, rev: i64| {
            let reads = usize::from(m.then.read);
            let mut responses = vec![put_answer()];
            responses.extend((0..reads).map(|_| range_answer(vec![kv(rev - 1)])));
            responses.push(put_answer());
            let mut a = answer(true, rev, responses);
            assert_eq!(w.answered(m, &mut a), Shown::Fine);
            w.wrote(m, &a);
            let _ = t;
        };
        let mut first = write();
        let m = w.mark(&mut first);
        let first_value = put_value(&first);
        landed(&w, &mut first, &m, 20);
        // A claim sent, then a read, then the claim lands.
        let mut claim = write();
        let claimed = w.mark(&mut claim);
        let (_, read) = w.range(request::get("k")).expect("a read with the witness");
        landed(&w, &mut claim, &claimed, 30);
        // The witness as the first write left it (the restore lost the claim).
        let shown = KeyValue {
            key: b"/p/witness/n1".to_vec(),
            mod_revision: 20,
            value: first_value,
            ..Default::default()
        };
        let mut before = answer(
            true,
            29,
            vec![range_answer(vec![]), range_answer(vec![shown.clone()])],
        );
        assert_eq!(
            w.answered(&read, &mut before),
            Shown::Fine,
            "read before it"
        );
        let mut after = answer(
            true,
            1_000_031,
            vec![range_answer(vec![]), range_answer(vec![shown])],
        );
        let Shown::Reset(why) = w.answered(&read, &mut after) else {
            panic!("a reset: the answer is past the claim's revision, the witness before it")
        };
        assert!(why.contains("revision 30"), "{why}");
    }

    /// After a reset (no write known to have landed): two writes sent together, the first
    /// landing at revision 30, the second on an etcd restored again without it, its revision
    /// bumped past it. The second's answer shows a witness older than the first: a reset (it
    /// went unread, and its put hid the restore: found by the simulation, seed 36 000 011 368).
    #[test]
    fn a_write_sent_before_any_landed_is_judged_by_one_that_landed_meanwhile() {
        let w = Witness::default();
        w.set(b"/p/witness/n1".to_vec(), b"i1".to_vec());
        let write = || request::txn([], [op::put("k", "v", 0)], []);
        let (mut first, mut second) = (write(), write());
        let (m1, m2) = (w.mark(&mut first), w.mark(&mut second));
        assert!(m2.then.read && !m2.guarded, "read, not guarded");
        // The witness as a write before the reset left it.
        let old = KeyValue {
            key: b"/p/witness/n1".to_vec(),
            mod_revision: 20,
            value: value_of(b"i1", 0),
            ..Default::default()
        };
        let mut a1 = answer(
            true,
            30,
            vec![put_answer(), range_answer(vec![old.clone()]), put_answer()],
        );
        assert_eq!(w.answered(&m1, &mut a1), Shown::Fine, "nothing to judge by");
        w.wrote(&m1, &a1);
        let mut a2 = answer(
            true,
            1_000_031,
            vec![put_answer(), range_answer(vec![old]), put_answer()],
        );
        let Shown::Reset(why) = w.answered(&m2, &mut a2) else {
            panic!("a reset: the first write landed below this answer's revision")
        };
        assert!(why.contains("revision 30"), "{why}");
    }

    #[test]
    fn a_witness_older_than_the_last_write_or_another_daemons_is_a_reset() {
        let i1 = b"i1".as_slice();
        assert_eq!(judge(0, 0, i1, None), None);
        assert_eq!(judge(9, 5, i1, Some(&kv(9))), None);
        assert_eq!(judge(9, 5, i1, Some(&kv(12))), None);
        assert!(judge(9, 5, i1, Some(&kv(8)))
            .unwrap()
            .contains("from revision 8"));
        assert!(judge(9, 5, i1, None).unwrap().contains("revision 9"));
        let twin = KeyValue {
            value: value_of(b"i2", 7),
            ..kv(12)
        };
        assert!(judge(9, 5, i1, Some(&twin)).unwrap().contains("\"i2\""));
        // An earlier write of this daemon's where its last one was, or past it.
        let earlier = KeyValue {
            value: value_of(b"i1", 4),
            ..kv(9)
        };
        assert!(judge(9, 5, i1, Some(&earlier))
            .unwrap()
            .contains("earlier write"));
        assert_eq!(
            parse(&value_of(b"n1-i3", 0x2a)),
            Some((b"n1-i3".as_slice(), 0x2a))
        );
        assert_eq!(parse(b"n1-i3"), None);
    }
}
