//! Cluster mode (issue 19): nodes claim address blocks from pools shared through etcd.
//! So far: how a pool's CIDRs are carved into blocks ([`cidrset`]) and the pools and blocks
//! in etcd, each decision one transaction ([`etcd`]); `ipoolctl cluster` drives them.

pub mod cidrset;
pub mod etcd;
