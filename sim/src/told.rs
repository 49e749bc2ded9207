//! The pool as the operators were told: a change `ipoolctl` acknowledged (a CIDR added or
//! removed, the pool disabled or enabled, an address reserved or its reservation ended, a
//! nodeSelector set, the pool made or deleted) is what the store holds until a later command
//! changes it. A write read before it and applied over it (a change of another operator's, or
//! a write of a command that gave up, arriving late) loses it: a failure, judged after every
//! step. It is what each pool write's condition (etcd's comparison of the pool's mod revision,
//! the apiserver's `resourceVersion`) guards.
//!
//! A field is judged only while it is known: set by a command acknowledged that no other
//! command that may change it ran beside. A command that may change it makes it unknown
//! from its start; one that failed leaves it unknown (it may have been applied), and keeps
//! what it may change from being known again while a write of its is on its way (it may still
//! land, late, and rightly so where nothing wrote the pool since its read); an etcd restored from a backup makes every field unknown (the operator's doing).

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::store::PoolNow;

/// What of the pool (`crate::POOL`) a command may change.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    /// The pool is there.
    Exists,
    /// The CIDR is one of the pool's.
    Cidr(IpNet),
    Disabled,
    /// The range is reserved in the pool.
    Reserved(IpNet),
    Selector,
}

/// From a command's answer, the fields as it left them.
type After = Box<dyn Fn(&str) -> Vec<(Field, String)> + Send>;

/// What a command may change, and what it says it made of it.
pub struct Change {
    /// None: the whole pool (made, deleted, finished).
    pub touches: Option<Vec<Field>>,
    /// From the command's answer: the fields as it left them.
    pub after: After,
    /// What another command that may change it too ran beside it for (whose write may have
    /// landed after its own): None, nothing; `Some(None)`, everything.
    contested: Option<Option<Vec<Field>>>,
}

impl Change {
    /// A command that leaves the pool alone.
    pub fn none() -> Change {
        Change {
            touches: Some(Vec::new()),
            after: Box::new(|_| Vec::new()),
            contested: None,
        }
    }

    /// A command that may change anything of the pool and says nothing certain of it.
    pub fn all() -> Change {
        Change::whole(|_| Vec::new())
    }

    /// A command that may change anything of the pool, and leaves what `after` says.
    pub fn whole(after: impl Fn(&str) -> Vec<(Field, String)> + Send + 'static) -> Change {
        Change {
            touches: None,
            after: Box::new(after),
            contested: None,
        }
    }

    /// A command that may change `fields`, and leaves them as `after` says from its answer.
    pub fn of(
        fields: Vec<Field>,
        after: impl Fn(&str) -> Vec<(Field, String)> + Send + 'static,
    ) -> Change {
        Change {
            touches: Some(fields),
            after: Box::new(after),
            contested: None,
        }
    }

    fn may_change(&self, f: &Field) -> bool {
        self.touches.as_ref().is_none_or(|t| t.contains(f))
    }

    /// What `self` and `other` may both change (None: everything).
    fn shared(&self, other: &Change) -> Option<Vec<Field>> {
        match (&self.touches, &other.touches) {
            (None, None) => None,
            (Some(a), None) | (None, Some(a)) => Some(a.clone()),
            (Some(a), Some(b)) => Some(a.iter().filter(|f| b.contains(f)).cloned().collect()),
        }
    }

    /// Another command ran beside it that may change `fields` (None: everything) too.
    fn contest(&mut self, fields: Option<Vec<Field>>) {
        self.contested = match (self.contested.take(), fields) {
            (Some(None), _) | (_, None) => Some(None),
            (None, Some(f)) => Some(Some(f)),
            (Some(Some(mut a)), Some(b)) => {
                a.extend(b);
                Some(Some(a))
            }
        };
    }

    fn was_contested(&self, f: &Field) -> bool {
        match &self.contested {
            None => false,
            Some(None) => true,
            Some(Some(fields)) => fields.contains(f),
        }
    }
}

/// The pool's fields as the operators were last told them, and the commands under way.
#[derive(Default)]
pub struct Told {
    /// Field -> (its value, the command that set it).
    known: BTreeMap<Field, (String, String)>,
    running: BTreeMap<usize, Change>,
    /// Commands that failed with a write still on its way (it may land late).
    failed: BTreeMap<usize, Change>,
}

impl Told {
    /// Command `seq` starts: what it may change is unknown from now on.
    pub fn start(&mut self, seq: usize, mut change: Change) {
        self.known.retain(|f, _| !change.may_change(f));
        for other in self.running.values_mut().chain(self.failed.values_mut()) {
            let both = change.shared(other);
            if both.as_ref().is_none_or(|b| !b.is_empty()) {
                other.contest(both.clone());
                change.contest(both);
            }
        }
        self.running.insert(seq, change);
    }

    /// Command `seq` (`what`) ended with `answer` (Err: it failed, and may still land).
    pub fn end(&mut self, seq: usize, what: &str, answer: &Result<String, String>) {
        let Some(change) = self.running.remove(&seq) else {
            return;
        };
        let Ok(said) = answer else {
            self.failed.insert(seq, change);
            return;
        };
        for (f, v) in (change.after)(said) {
            let mut others = self.running.values().chain(self.failed.values());
            if !change.was_contested(&f) && !others.any(|c| c.may_change(&f)) {
                self.known.insert(f, (v, what.to_string()));
            }
        }
    }

    /// The failed commands whose writes are all gone from the network (`writing`: those that
    /// still have one on its way): they can change nothing any more.
    pub fn settle(&mut self, writing: &std::collections::BTreeSet<usize>) {
        self.failed.retain(|seq, _| writing.contains(seq));
    }

    /// Nothing is known to judge.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// etcd restored from an older backup: nothing told before holds.
    pub fn forget(&mut self) {
        self.known.clear();
    }

    /// Each known field of pool `name` as the store has it (`pools`, [`crate::store::Shared::pools`]).
    pub fn check(&self, name: &str, pools: &[PoolNow]) -> Result<(), String> {
        let pool = pools.iter().find(|p| p.name == name);
        for (f, (told, by)) in &self.known {
            let now = value(f, pool);
            if now != *told {
                return Err(format!(
                    "pool {name}: {f:?} is {now} in the store, though `{by}` was answered with it {told} and no command since may have changed it: an acknowledged change lost (a write read before it, applied over it)"
                ));
            }
        }
        Ok(())
    }
}

/// Field `f` of `pool` (None: it is not there) as [`Told`] writes it.
pub fn value(f: &Field, pool: Option<&PoolNow>) -> String {
    let Some(p) = pool else {
        return match f {
            Field::Exists => "no".into(),
            _ => "(no pool)".into(),
        };
    };
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    match f {
        Field::Exists => yes(true),
        Field::Cidr(c) => yes(p.cidrs.contains(c)),
        Field::Disabled => yes(p.disabled),
        Field::Reserved(r) => yes(p.reserved.contains(r)),
        Field::Selector => format!("{:?}", p.node_selector),
    }
}

#[cfg(test)]
mod tests;
