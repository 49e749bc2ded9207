//! Requests to etcd, built: reads of a key or a prefix, puts, deletes, and transactions of
//! comparisons and operations (etcd's `Txn`).

use ipool_proto::etcd::etcdserverpb as pb;
use pb::response_op;

/// The end of the range of every key that starts with `prefix` (etcd's prefix rule).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): every key from the prefix on.
    vec![0]
}

/// A read of one key.
pub fn get(key: impl Into<Vec<u8>>) -> pb::RangeRequest {
    pb::RangeRequest {
        key: key.into(),
        ..Default::default()
    }
}

/// A read of every key under `prefix`.
pub fn get_prefix(prefix: impl Into<Vec<u8>>) -> pb::RangeRequest {
    let key = prefix.into();
    pb::RangeRequest {
        range_end: prefix_end(&key),
        key,
        ..Default::default()
    }
}

pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> pb::PutRequest {
    pb::PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
        ..Default::default()
    }
}

pub fn delete(key: impl Into<Vec<u8>>) -> pb::DeleteRangeRequest {
    pb::DeleteRangeRequest {
        key: key.into(),
        ..Default::default()
    }
}

/// Comparisons of a transaction.
pub mod cmp {
    use super::pb::compare::{CompareResult, CompareTarget, TargetUnion};
    use super::pb::Compare;

    fn compare(
        key: Vec<u8>,
        result: CompareResult,
        target: CompareTarget,
        t: TargetUnion,
    ) -> Compare {
        Compare {
            result: result as i32,
            target: target as i32,
            key,
            target_union: Some(t),
            range_end: Vec::new(),
        }
    }

    /// The key's version (0: absent) compared with `v`.
    pub fn version(key: impl Into<Vec<u8>>, result: CompareResult, v: i64) -> Compare {
        compare(
            key.into(),
            result,
            CompareTarget::Version,
            TargetUnion::Version(v),
        )
    }

    pub fn create_revision(key: impl Into<Vec<u8>>, result: CompareResult, r: i64) -> Compare {
        compare(
            key.into(),
            result,
            CompareTarget::Create,
            TargetUnion::CreateRevision(r),
        )
    }

    pub fn mod_revision(key: impl Into<Vec<u8>>, result: CompareResult, r: i64) -> Compare {
        compare(
            key.into(),
            result,
            CompareTarget::Mod,
            TargetUnion::ModRevision(r),
        )
    }

    pub fn value(key: impl Into<Vec<u8>>, result: CompareResult, v: Vec<u8>) -> Compare {
        compare(
            key.into(),
            result,
            CompareTarget::Value,
            TargetUnion::Value(v),
        )
    }

    /// The comparison made over every key under the prefix `key`.
    pub fn with_prefix(mut c: Compare) -> Compare {
        c.range_end = super::prefix_end(&c.key);
        c
    }

    pub use CompareResult::{Equal, Greater, Less, NotEqual};
}

/// Operations of a transaction.
pub mod op {
    use super::pb::{request_op::Request, RequestOp};

    pub fn get(key: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestRange(super::get(key))),
        }
    }

    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(super::put(key, value, lease))),
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestDeleteRange(super::delete(key))),
        }
    }
}

/// A transaction: if every comparison holds, `then`, else `otherwise`.
pub fn txn(
    when: impl IntoIterator<Item = pb::Compare>,
    then: impl IntoIterator<Item = pb::RequestOp>,
    otherwise: impl IntoIterator<Item = pb::RequestOp>,
) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: when.into_iter().collect(),
        success: then.into_iter().collect(),
        failure: otherwise.into_iter().collect(),
    }
}

/// The key-values that the `Get` operations of a transaction's answer read.
pub fn txn_reads(
    r: &pb::TxnResponse,
) -> impl Iterator<Item = &ipool_proto::etcd::mvccpb::KeyValue> {
    r.responses.iter().flat_map(|op| match &op.response {
        Some(response_op::Response::ResponseRange(g)) => g.kvs.iter(),
        _ => [].iter(),
    })
}

#[cfg(test)]
mod tests;
