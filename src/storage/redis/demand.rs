//! RLQS demand shared through Redis: one hash per quota bucket, a field per stream (named so
//! that it is unique across replicas) holding the stream's demand and when Redis last heard
//! of it. Each replica, once per interval and bucket, writes its own streams' fields, deletes
//! those of its streams that left, and reads every field, in one script call: one round trip,
//! and on a cluster one node (one key). Fields older than `stale_after` belong to a replica
//! that stopped; the call that finds one deletes it. The time is Redis's, so replicas' clocks
//! do not matter.

use super::connection::Connection;
use crate::storage::{Demand, DemandPost, StoreError};

/// How a demand not known yet is written.
const UNKNOWN: &str = "?";

/// KEYS[1] the bucket's hash. ARGV: stale-after and expiry in milliseconds, the number of
/// streams posted, their (stream, demand) pairs, then the streams gone. Answers the live
/// fields as (stream, demand) pairs.
const SHARE: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local stale = tonumber(ARGV[1])
local posted = tonumber(ARGV[3])
-- Fields are written and deleted a batch per command (one command per field would cost
-- Redis more than the rest of the call), in batches that Lua's unpack can take.
local function each_batch(command, items)
  for first = 1, #items, 1000 do
    redis.call(command, KEYS[1], unpack(items, first, math.min(first + 999, #items)))
  end
end
local written = {}
for i = 0, posted - 1 do
  written[#written + 1] = ARGV[4 + 2 * i]
  written[#written + 1] = ARGV[5 + 2 * i] .. ' ' .. now
end
each_batch('HSET', written)
local gone = {}
for i = 4 + 2 * posted, #ARGV do
  gone[#gone + 1] = ARGV[i]
end
each_batch('HDEL', gone)
local fields = redis.call('HGETALL', KEYS[1])
local live, stale_fields = {}, {}
for i = 1, #fields, 2 do
  local demand, at = string.match(fields[i + 1], '^(%S+) (%d+)$')
  if at and now - tonumber(at) <= stale then
    live[#live + 1] = fields[i]
    live[#live + 1] = demand
  else
    stale_fields[#stale_fields + 1] = fields[i]
  end
end
each_batch('HDEL', stale_fields)
if #live > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return live
";

/// Posts and reads one bucket's demand (see the module docs); `prefix` is the store's key
/// prefix.
pub async fn share(
    connection: &Connection,
    prefix: &str,
    post: &DemandPost<'_>,
) -> Result<Vec<Demand>, StoreError> {
    let stale_ms = u64::try_from(post.stale_after.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut command = redis::cmd("EVAL");
    command
        .arg(SHARE)
        .arg(1)
        .arg([prefix, post.key].concat())
        .arg(stale_ms)
        // The hash outlives its last stream by the stale time, and no longer.
        .arg(stale_ms.saturating_mul(2))
        .arg(post.demands.len());
    for demand in post.demands {
        let value = match demand.per_second {
            Some(per_second) => format!("{per_second:.3}"),
            None => UNKNOWN.to_owned(),
        };
        command.arg(&demand.stream).arg(value);
    }
    for stream in post.gone {
        command.arg(stream);
    }
    let fields: Vec<String> = connection.query(&command).await?;
    fields
        .chunks(2)
        .map(|pair| match pair {
            [stream, demand] if demand == UNKNOWN => Ok(Demand {
                stream: stream.clone(),
                per_second: None,
            }),
            [stream, demand] => match demand.parse::<f64>() {
                Ok(per_second) if per_second.is_finite() => Ok(Demand {
                    stream: stream.clone(),
                    per_second: Some(per_second),
                }),
                _ => Err(malformed(demand)),
            },
            _ => Err(malformed("an odd number of fields")),
        })
        .collect()
}

fn malformed(what: &str) -> StoreError {
    StoreError::MalformedReply(format!("RLQS demand: {what}"))
}
