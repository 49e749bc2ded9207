//! An annotation of a pod or namespace that cannot be read: the error names the object, the
//! annotation and its value (`ipool.io/sticky`, `ipool.io/ips`, `ipool.io/pool(s)`,
//! `ipool.io/fixed`, `ipool.io/ips-by-ordinal`). An ADD that needs it is refused with it as an
//! invalid request.

/// Why an annotation cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadAnnotation(pub String);

impl From<crate::model::Invalid> for BadAnnotation {
    fn from(e: crate::model::Invalid) -> BadAnnotation {
        BadAnnotation(e.0)
    }
}
