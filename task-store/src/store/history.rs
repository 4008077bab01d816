//! Where routers merge their outcome histories (issue 38, point 1; the
//! router's side is `agent_reach_pipeline`'s `history::exchange`): each
//! router adds the counts it drained since its last exchange to every
//! router's totals, and reads back the totals it asks for, in one script.
//!
//! Under `{prefix}:{tenant}:history:{h:TENANT}:{bucket_ms}:{slot}` (one slot
//! a tenant, so one exchange is one script per chunk; the bucket length in
//! the key, so routers set up with different buckets never mix them): a
//! hash per slot (`capability@version:agent_id`), bucket number → its
//! counters, comma separated. A write drops the buckets older than a week
//! (when it adds a new one) and keeps the hash a week and a day after it.

use std::time::Duration;

use redis::Script;

use super::{unavailable, TaskStore, TaskStoreError};

/// Slots exchanged in one script call at most (more go in several).
const SLOTS_PER_CALL: usize = 100;

/// One slot's part of an exchange.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HistorySlot {
    /// `capability@version:agent_id`.
    pub name: String,
    /// Counters to add, by bucket number.
    pub adds: Vec<(u64, Vec<u32>)>,
    /// Read back every bucket kept; otherwise the buckets of `read`.
    pub read_all: bool,
    pub read: Vec<u64>,
}

/// Every router's totals of one slot's buckets, as read back.
pub type HistoryTotals = Vec<(u64, Vec<u32>)>;

const EXCHANGE: &str = r#"
-- Adds each slot's counters to every router's totals and reads totals back.
-- KEYS: one hash per slot. ARGV: 1 the oldest bucket kept, 2 the ttl in ms,
-- then per key 'MODE|ADDS|READS': MODE 'all' or 'some'; ADDS
-- 'BUCKET:c0,c1,... BUCKET:...'; READS 'BUCKET BUCKET ...'.
local oldest = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local answer = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local mode, adds, reads = string.match(ARGV[i + 2], '^(%a+)|([^|]*)|(.*)$')
  local created = false
  for bucket, counts in string.gmatch(adds, '(%d+):([%d,]+)') do
    local sum = {}
    for value in string.gmatch(counts, '%d+') do sum[#sum + 1] = tonumber(value) end
    local held = redis.call('HGET', key, bucket)
    if held then
      local j = 0
      for value in string.gmatch(held, '%d+') do
        j = j + 1
        if sum[j] ~= nil then sum[j] = sum[j] + tonumber(value) end
      end
    else
      created = true
    end
    for j = 1, #sum do sum[j] = string.format('%.0f', sum[j]) end
    redis.call('HSET', key, bucket, table.concat(sum, ','))
  end
  if created then
    for _, field in ipairs(redis.call('HKEYS', key)) do
      if tonumber(field) < oldest then redis.call('HDEL', key, field) end
    end
  end
  if adds ~= '' then redis.call('PEXPIRE', key, ttl) end
  local out = {}
  if mode == 'all' then
    local all = redis.call('HGETALL', key)
    for j = 1, #all, 2 do
      if tonumber(all[j]) >= oldest then
        out[#out + 1] = all[j]
        out[#out + 1] = all[j + 1]
      end
    end
  else
    for bucket in string.gmatch(reads, '%d+') do
      local held = redis.call('HGET', key, bucket)
      if held then
        out[#out + 1] = bucket
        out[#out + 1] = held
      end
    end
  end
  answer[i] = out
end
return answer
"#;

fn script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(EXCHANGE))
}

impl TaskStore {
    fn history_key(&self, bucket_ms: u64, slot: &str) -> String {
        format!("{}:history:{{h:{}}}:{bucket_ms}:{slot}", self.namespace, self.tenant)
    }

    /// Adds `slots`' counts (buckets of `bucket_ms`; buckets before
    /// `oldest` dropped) to every router's totals, each hash kept `ttl`
    /// after its last write, and answers, for each slot in order, the totals
    /// it asked to read.
    pub async fn exchange_history(
        &self,
        bucket_ms: u64,
        oldest: u64,
        ttl: Duration,
        slots: &[HistorySlot],
    ) -> Result<Vec<HistoryTotals>, TaskStoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut connection = self.connection().await?;
        let mut answer = Vec::with_capacity(slots.len());
        for chunk in slots.chunks(SLOTS_PER_CALL) {
            let mut invocation = script().prepare_invoke();
            invocation.arg(oldest).arg(ttl_ms);
            for slot in chunk {
                invocation.key(self.history_key(bucket_ms, &slot.name));
            }
            for slot in chunk {
                invocation.arg(encode(slot));
            }
            let values: Vec<Vec<String>> = invocation.invoke_async(&mut connection).await.map_err(unavailable)?;
            for value in values {
                answer.push(parse_totals(&value)?);
            }
        }
        if answer.len() != slots.len() {
            return Err(TaskStoreError::Corrupt(format!(
                "the history exchange answered {} slots for {}",
                answer.len(),
                slots.len()
            )));
        }
        Ok(answer)
    }
}

/// A slot's argument: `MODE|ADDS|READS`.
fn encode(slot: &HistorySlot) -> String {
    let adds: Vec<String> = slot
        .adds
        .iter()
        .map(|(bucket, counts)| {
            let counts: Vec<String> = counts.iter().map(u32::to_string).collect();
            format!("{bucket}:{}", counts.join(","))
        })
        .collect();
    let reads: Vec<String> = slot.read.iter().map(u64::to_string).collect();
    format!(
        "{}|{}|{}",
        if slot.read_all { "all" } else { "some" },
        adds.join(" "),
        reads.join(" ")
    )
}

/// `bucket, "c0,c1,…", …` into totals (a count past `u32` is held at its maximum).
fn parse_totals(list: &[String]) -> Result<HistoryTotals, TaskStoreError> {
    list.chunks(2)
        .map(|pair| {
            let [bucket, counts] = pair else {
                return Err(TaskStoreError::Corrupt("an odd history list".to_string()));
            };
            let corrupt = || TaskStoreError::Corrupt(format!("history bucket `{bucket}`: `{counts}`"));
            let bucket: u64 = bucket.parse().map_err(|_| corrupt())?;
            let counts = counts
                .split(',')
                .map(|count| {
                    count
                        .parse::<u64>()
                        .map(|count| u32::try_from(count).unwrap_or(u32::MAX))
                        .map_err(|_| corrupt())
                })
                .collect::<Result<Vec<u32>, _>>()?;
            Ok((bucket, counts))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_encode_and_totals_parse() {
        let slot = HistorySlot {
            name: "a@1.0.0:x".to_string(),
            adds: vec![(7, vec![1, 0, 2]), (8, vec![3, 4, 5])],
            read_all: false,
            read: vec![7, 8],
        };
        assert_eq!(encode(&slot), "some|7:1,0,2 8:3,4,5|7 8");
        let all = HistorySlot {
            read_all: true,
            ..Default::default()
        };
        assert_eq!(encode(&all), "all||");
        let totals = parse_totals(&["7".to_string(), "1,0,99999999999".to_string()]).unwrap();
        assert_eq!(totals, vec![(7, vec![1, 0, u32::MAX])]);
        assert!(parse_totals(&["x".to_string(), "1".to_string()]).is_err());
        assert!(parse_totals(&["7".to_string()]).is_err());
    }
}
