//! A counter's state as Redis holds it under its key, in either form a state is written in: as
//! text, or a bucket's two numbers packed (`BucketLayout::Packed`).

use tollgate::storage::redis::call::numbers::packed_pair;

/// The numbers `key` holds (none: no counter), and whether they were packed.
pub async fn numbers(
    connection: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> (Option<Vec<u64>>, bool) {
    let value: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(connection)
        .await
        .unwrap();
    let Some(value) = value else {
        return (None, false);
    };
    if let Some(pair) = packed_pair(&value) {
        return (Some(pair.map(|n| u64::try_from(n).unwrap()).to_vec()), true);
    }
    let numbers = std::str::from_utf8(&value)
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (Some(numbers), false)
}
