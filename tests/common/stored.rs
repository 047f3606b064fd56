//! A counter's state as Redis holds it under its key, in either form a state is written in: as
//! text, or packed (`StateLayout::Packed`: a bucket's two numbers, a sliding log's runs).

use tollgate::storage::redis::call::numbers::packed_numbers;

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
    if let Some(numbers) = packed_numbers(&value) {
        let numbers = numbers.into_iter().map(|n| u64::try_from(n).unwrap());
        return (Some(numbers.collect()), true);
    }
    let numbers = std::str::from_utf8(&value)
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (Some(numbers), false)
}
