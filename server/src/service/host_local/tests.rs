use super::*;
use crate::error::Refusal;

/// What passes (the node fenced, the pool disabled) ends the take-over for now, as any
/// wait does: the allocation is taken over at the next call, never dropped (the network
/// marked done without it, its address would go to a new pod while the old one runs).
#[test]
fn a_refusal_that_passes_stops_the_take_over_and_one_that_does_not_drops_the_allocation() {
    let refused = |refusal| Error::Refused {
        refusal,
        message: String::new(),
    };
    for passes in [
        Refusal::NodeFenced,
        Refusal::PoolDisabled,
        Refusal::FixedAddressElsewhere,
    ] {
        assert!(stops(&refused(passes)), "{passes:?}");
    }
    assert!(stops(&Error::Busy(String::new())));
    assert!(!stops(&refused(Refusal::PoolExhausted)));
    assert!(!stops(&Error::InUse(String::new())));
}
