//! A node's daemon started on its state dir (as ipoold starts: the node's name taken, its
//! blocks synced), or killed (-9), its state dir keeping what was durable.

use crate::daemon::Daemon;
use crate::world::World;

impl World {
    /// Starts slot `i`'s daemon on its state dir.
    pub fn start(&mut self, i: usize) -> Result<(), String> {
        self.start_daemon(i).map_err(|e| {
            use ipool_server::store::Store;
            match self.slots[i].disk.load() {
                Ok(snap) => format!(
                    "{e} (its state dir: blocks {:?}, networks {:?})",
                    snap.blocks,
                    snap.networks
                        .iter()
                        .map(|n| n.describe_ranges())
                        .collect::<Vec<_>>()
                ),
                Err(_) => e,
            }
        })
    }

    fn start_daemon(&mut self, i: usize) -> Result<(), String> {
        crate::fixed::node_changed(self, i);
        self.next_daemon += 1;
        let s = &self.slots[i];
        let instance = s.instance_id();
        let d = Daemon::start(
            self.next_daemon,
            &self.setting,
            &s.name.clone(),
            &instance,
            s.disk.clone(),
            &self.net,
            i,
            &self.wall,
            s.renamed,
        )?;
        let held = d.held();
        let now = self.ms();
        let s = &mut self.slots[i];
        s.daemon = Some(d);
        s.gone = false;
        s.unaware = false;
        s.aware_at = Some(now);
        s.written.clear();
        s.lost_writes.clear();
        s.serving_since = None;
        s.syncs = [(0, now); 2];
        s.trouble_at = now;
        s.streak = [0; 2];
        crate::labels::tell(self, i);
        self.note(format!(
            "{} (slot {i}) started, instance {instance}",
            self.slots[i].name
        ));
        self.checker.held_by(i, &held)
    }

    /// Kills slot `i`'s daemon (-9); its state dir keeps what was durable.
    pub fn kill(&mut self, i: usize) {
        if let Some(d) = self.slots[i].daemon.take() {
            d.kill();
            crate::fixed::node_changed(self, i);
            self.slots[i].disk = crate::daemon::crashed(&self.slots[i].disk);
            // ADDs it never answered: the kubelet DELs them once the daemon is back.
            let lost: Vec<String> = self
                .kubelet
                .adding
                .iter()
                .filter(|(_, a)| a.slot == i)
                .map(|(c, _)| c.clone())
                .collect();
            for c in lost {
                self.kubelet.adding.remove(&c);
                self.kubelet.owed.insert(c, i);
            }
        }
    }
}
