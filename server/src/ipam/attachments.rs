//! The live attachments, kept compact: a node may hold tens of thousands, and they are most of
//! the daemon's memory.
//!
//! Each attachment is one boxed [`Entry`] in a hash set, found by its key: its text (key, pod
//! and netns) in one string, its addresses in a boxed slice. Boxing keeps the set's table at
//! one pointer a slot, which matters because the table is sized to the next power of two.
//! Readers get an [`Attachment`], a borrowed view; [`Attachment::to_record`] makes the owned
//! [`AttachmentRecord`] that replies and the store use.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use crate::model::{Millis, PodMeta};
use crate::store::{AttachmentKey, AttachmentRecord, Pod};

#[derive(Default)]
pub(super) struct Attachments {
    set: HashSet<Slot>,
}

struct Entry {
    /// `network \0 container ID \0 ifname` (the lookup key: network and container ID are
    /// validated names, without NUL), then the pod's namespace, name and UID and the netns
    /// path, back to back.
    text: Box<str>,
    /// Where the key, the pod's namespace, name and UID end in `text` (the netns runs to its
    /// end). Offsets rather than separators: those fields are not validated.
    ends: [u32; 4],
    addresses: Box<[IpAddr]>,
    created_at_ms: Millis,
    /// Kubernetes pods only (a pointer's worth for the rest).
    k8s: Option<Box<PodMeta>>,
}

/// A set element: hashed and compared by the key part of its text only, so the set can be
/// searched with that `&str`.
struct Slot(Box<Entry>);

impl Slot {
    fn key(&self) -> &str {
        self.view().key_str()
    }

    fn view(&self) -> Attachment<'_> {
        Attachment(&self.0)
    }
}

impl Borrow<str> for Slot {
    fn borrow(&self) -> &str {
        self.key()
    }
}

impl Hash for Slot {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h)
    }
}

impl PartialEq for Slot {
    fn eq(&self, other: &Slot) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Slot {}

/// The lookup key of `k`, as stored in an entry's text.
fn key_text(k: &AttachmentKey) -> String {
    format!("{}\0{}\0{}", k.network, k.container_id, k.ifname)
}

/// A borrowed view of one attachment.
#[derive(Clone, Copy)]
pub(super) struct Attachment<'a>(&'a Entry);

impl<'a> Attachment<'a> {
    /// Field `i` of the text: 0 the key, 1 the pod's namespace, 2 its name, 3 its UID,
    /// 4 the netns path.
    fn field(&self, i: usize) -> &'a str {
        let e = self.0;
        let from = match i {
            0 => 0,
            _ => e.ends[i - 1] as usize,
        };
        let to = e.ends.get(i).map_or(e.text.len(), |&x| x as usize);
        &e.text[from..to]
    }

    fn key_str(&self) -> &'a str {
        self.field(0)
    }

    fn key_part(&self, i: usize) -> &'a str {
        self.key_str().splitn(3, '\0').nth(i).unwrap_or_default()
    }

    pub(super) fn network(&self) -> &'a str {
        self.key_part(0)
    }

    pub(super) fn container_id(&self) -> &'a str {
        self.key_part(1)
    }

    pub(super) fn ifname(&self) -> &'a str {
        self.key_part(2)
    }

    pub(super) fn key(&self) -> AttachmentKey {
        AttachmentKey {
            network: self.network().to_string(),
            container_id: self.container_id().to_string(),
            ifname: self.ifname().to_string(),
        }
    }

    /// Orders two attachments as their keys order ([`Attachment::cmp_key`]): the key text's
    /// parts are names without NUL, so comparing the texts compares (network, container ID,
    /// ifname).
    pub(super) fn cmp_by_key(&self, other: &Attachment<'_>) -> Ordering {
        self.key_str().cmp(other.key_str())
    }

    /// Orders like [`AttachmentKey`]'s `Ord` (network, container ID, ifname).
    pub(super) fn cmp_key(&self, k: &AttachmentKey) -> Ordering {
        (self.network(), self.container_id(), self.ifname()).cmp(&(
            k.network.as_str(),
            k.container_id.as_str(),
            k.ifname.as_str(),
        ))
    }

    pub(super) fn pod_namespace(&self) -> &'a str {
        self.field(1)
    }

    pub(super) fn pod_name(&self) -> &'a str {
        self.field(2)
    }

    pub(super) fn pod(&self) -> Pod {
        Pod {
            namespace: self.pod_namespace().to_string(),
            name: self.pod_name().to_string(),
            uid: self.field(3).to_string(),
        }
    }

    pub(super) fn netns(&self) -> &'a str {
        self.field(4)
    }

    pub(super) fn addresses(&self) -> &'a [IpAddr] {
        &self.0.addresses
    }

    pub(super) fn created_at_ms(&self) -> Millis {
        self.0.created_at_ms
    }

    /// What the apiserver said about the pod at the ADD.
    pub(super) fn k8s(&self) -> Option<&'a PodMeta> {
        self.0.k8s.as_deref()
    }

    pub(super) fn to_record(self) -> AttachmentRecord {
        AttachmentRecord {
            key: self.key(),
            pod: self.pod(),
            netns: self.netns().to_string(),
            addresses: self.addresses().to_vec(),
            created_at_ms: self.created_at_ms(),
            k8s: self.k8s().cloned(),
        }
    }
}

impl Attachments {
    pub(super) fn len(&self) -> usize {
        self.set.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub(super) fn get(&self, k: &AttachmentKey) -> Option<Attachment<'_>> {
        self.set.get(key_text(k).as_str()).map(Slot::view)
    }

    pub(super) fn contains_key(&self, k: &AttachmentKey) -> bool {
        self.set.contains(key_text(k).as_str())
    }

    /// Every attachment, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Attachment<'_>> {
        self.set.iter().map(Slot::view)
    }

    /// The attachment of `network` that holds `ip`: a scan, for error paths and operators.
    pub(super) fn holder_of(&self, network: &str, ip: IpAddr) -> Option<Attachment<'_>> {
        self.iter()
            .find(|a| a.network() == network && a.addresses().contains(&ip))
    }

    /// Adds `r`, replacing an attachment with the same key.
    pub(super) fn insert(&mut self, r: &AttachmentRecord) {
        let k = &r.key;
        let parts = [
            k.network.as_str(),
            "\0",
            &k.container_id,
            "\0",
            &k.ifname,
            &r.pod.namespace,
            &r.pod.name,
            &r.pod.uid,
            &r.netns,
        ];
        let mut text = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        let mut ends = [0u32; 4];
        for (i, p) in parts.iter().enumerate() {
            text.push_str(p);
            // After the ifname (the key), the namespace, the name and the UID.
            if let Some(slot) = i.checked_sub(4).and_then(|j| ends.get_mut(j)) {
                // gRPC messages are limited to 4 MiB, and every record came in through one.
                *slot = u32::try_from(text.len())
                    .expect("an attachment's text is far below 4 GiB (it came in one message)");
            }
        }
        self.set.replace(Slot(Box::new(Entry {
            text: text.into_boxed_str(),
            ends,
            addresses: r.addresses.clone().into_boxed_slice(),
            created_at_ms: r.created_at_ms,
            k8s: r.k8s.clone().map(Box::new),
        })));
    }

    /// Removes the attachment `k`; true if there was one.
    pub(super) fn remove(&mut self, k: &AttachmentKey) -> bool {
        self.set.remove(key_text(k).as_str())
    }
}

#[cfg(test)]
mod tests;
