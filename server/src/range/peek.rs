//! Looking ahead without taking: the addresses [`RangeAllocator::allocate_next`] would hand
//! out next, all of them or those a caller lets through.

use std::net::IpAddr;

use super::RangeAllocator;

impl RangeAllocator {
    /// The address [`RangeAllocator::allocate_next`] would hand out, without handing it out.
    pub fn peek_next(&self) -> Option<IpAddr> {
        self.next_free_after(self.cursor)
    }

    /// The first address [`RangeAllocator::peek_next`] would give that `usable` accepts, among
    /// the next `limit` free ones (those it passes over stay free, for later).
    pub fn peek_next_usable(
        &self,
        limit: usize,
        usable: impl Fn(IpAddr) -> bool,
    ) -> Option<IpAddr> {
        let mut after = self.cursor;
        let mut first = None;
        for _ in 0..limit {
            let ip = self.next_free_after(after)?;
            if first == Some(ip) {
                return None;
            }
            if usable(ip) {
                return Some(ip);
            }
            first.get_or_insert(ip);
            after = Some(ip);
        }
        None
    }

    /// The next `n` addresses `allocate_next` would hand out that `skip` lets through (fewer
    /// if fewer are free). `skip` says, of an address it holds back, the last address of the
    /// stretch it holds back: the search goes on after it (a reserved CIDR of any size is one
    /// step), for at most `jumps` such stretches.
    pub fn peek_next_skipping(
        &self,
        n: usize,
        jumps: usize,
        skip: impl Fn(IpAddr) -> Option<IpAddr>,
    ) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        let mut after = self.cursor;
        let mut jumped = 0;
        while out.len() < n {
            let Some(ip) = self.next_free_after(after) else {
                break;
            };
            if out.contains(&ip) {
                break;
            }
            match skip(ip) {
                None => {
                    out.push(ip);
                    after = Some(ip);
                }
                Some(_) if jumped >= jumps => break,
                Some(last) => {
                    jumped += 1;
                    after = Some(last);
                }
            }
        }
        out
    }

    /// The next `n` addresses `allocate_next` would hand out (fewer if fewer are free).
    pub fn peek_next_n(&self, n: usize) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        let mut after = self.cursor;
        while out.len() < n {
            match self.next_free_after(after) {
                Some(ip) if !out.contains(&ip) => {
                    out.push(ip);
                    after = Some(ip);
                }
                _ => break,
            }
        }
        out
    }
}
