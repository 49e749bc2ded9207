//! Memory and the store disagree: a change the store took that memory could not follow (a
//! pick whose pool changed since, a network gone under the commit), or a record the store
//! holds that memory cannot place (an address outside its network's ranges, held twice). The
//! engine then stops serving changes and rebuilds its state from the store
//! ([`super::Ipam::recover_store`]), or leaves the record out of memory, saying so.

/// What memory could not follow or place, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Diverged(pub String);

impl From<String> for Diverged {
    fn from(why: String) -> Diverged {
        Diverged(why)
    }
}
