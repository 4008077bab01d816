//! Where routers meet to share their limits (issue 35, point 2; the router's
//! side is `agent_reach_pipeline`'s `limits::shares`): each router records
//! what its buckets were asked for, and reads every live router's reports
//! of the same limits, in one script.
//!
//! Under `{prefix}:{tenant}:quota:{q:TENANT}` (one slot a tenant, so one
//! exchange is one script; tenants spread over a cluster's shards):
//! - `…:routers` — hash: router id → `EXPIRES_MS` (every router exchanging).
//! - `…:NAME` — hash per limit (`caller:NAME`, `tenant`): router id →
//!   `EXPIRES_MS RATE WANTED HELD`, the router's last report and the places
//!   it holds. The script grants a router at most the places the other live
//!   routers do not hold, so the routers' places never add up to more than
//!   the limit while their reports live.
//!
//! A report expires `ttl` after it was written, by Redis's clock (one clock
//! for every router); the script drops expired fields as it reads, and each
//! hash expires `2 × ttl` after its last write, so nothing outlives the
//! routers that wrote it.

use std::time::Duration;

use redis::Script;

use super::{unavailable, TaskStore, TaskStoreError};

/// Limits reported in one script call at most (a router with more sends several).
const LIMITS_PER_CALL: usize = 200;

/// What a router reports of one limit.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaAsk {
    /// The limit's name (`caller:NAME`, `tenant`).
    pub name: String,
    /// Calls a second that asked for a token.
    pub rate: f64,
    /// Places wanted at once.
    pub wanted: u32,
    /// The limit's places (`concurrency`; 0: none).
    pub limit: u32,
    /// The places this router would hold (its share of `limit`).
    pub target: u32,
    /// Places it holds now (calls in flight).
    pub holding: u32,
}

/// One router's report of one limit, as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaReport {
    pub router: String,
    pub rate: f64,
    pub wanted: u32,
}

/// The answer for one limit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaLimit {
    /// Every live router's report, this router's included.
    pub reports: Vec<QuotaReport>,
    /// The places this router may hold from now on.
    pub granted: u32,
}

/// What an exchange answers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuotaExchange {
    /// Routers whose registration has not expired.
    pub routers: u32,
    /// For each limit reported, in order.
    pub limits: Vec<QuotaLimit>,
}

const EXCHANGE: &str = r#"
-- Records one router's reports, grants it places, reads every live router's.
-- KEYS: 1 the routers hash, then one hash per limit
-- ARGV: 1 router id, 2 ttl ms, then per limit 'RATE WANTED LIMIT TARGET HOLDING'
-- A field is 'EXPIRES RATE WANTED HELD'. Places are granted so that the live
-- routers' HELD never add up to more than the limit: a router gets at most
-- what the others do not hold, and holds at least what it has in flight.
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl = tonumber(ARGV[2])
local me = ARGV[1]
local function live_fields(key)
  local all = redis.call('HGETALL', key)
  local live = {}
  for i = 1, #all, 2 do
    local expires, rest = string.match(all[i + 1], '^(%d+) ?(.*)$')
    if expires == nil or tonumber(expires) < now then
      redis.call('HDEL', key, all[i])
    elseif all[i] ~= me then
      live[#live + 1] = { all[i], rest }
    end
  end
  return live
end
local routers = live_fields(KEYS[1])
redis.call('HSET', KEYS[1], me, tostring(now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local answer = { #routers + 1 }
for i = 2, #KEYS do
  local rate, wanted, limit, target, holding =
    string.match(ARGV[i + 1], '^(%S+) (%d+) (%d+) (%d+) (%d+)$')
  limit, target, holding = tonumber(limit), tonumber(target), tonumber(holding)
  local others = live_fields(KEYS[i])
  local held = 0
  local list = {}
  for _, field in ipairs(others) do
    local r, w, h = string.match(field[2], '^(%S+) (%d+) (%d+)$')
    if r ~= nil then
      held = held + tonumber(h)
      list[#list + 1] = field[1]
      list[#list + 1] = r .. ' ' .. w
    end
  end
  local granted = math.max(0, math.min(target, limit - held))
  local mine = math.max(granted, holding)
  redis.call('HSET', KEYS[i], me, (now + ttl) .. ' ' .. rate .. ' ' .. wanted .. ' ' .. mine)
  redis.call('PEXPIRE', KEYS[i], ttl * 2)
  list[#list + 1] = me
  list[#list + 1] = rate .. ' ' .. wanted
  answer[i] = { granted, list }
end
return answer
"#;

fn script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(EXCHANGE))
}

impl TaskStore {
    fn quota_key(&self, name: &str) -> String {
        format!("{}:quota:{{q:{}}}:{name}", self.namespace, self.tenant)
    }

    /// Records `router`'s `asks`, each kept `ttl`, grants it places, and
    /// answers every live router's reports of the same limits.
    pub async fn exchange_quotas(
        &self,
        router: &str,
        asks: &[QuotaAsk],
        ttl: Duration,
    ) -> Result<QuotaExchange, TaskStoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut connection = self.connection().await?;
        let mut answer = QuotaExchange::default();
        // One call even with no limit reported: the router counts itself in.
        let chunks: Vec<&[QuotaAsk]> = if asks.is_empty() {
            vec![&[]]
        } else {
            asks.chunks(LIMITS_PER_CALL).collect()
        };
        for chunk in chunks {
            let mut invocation = script().prepare_invoke();
            invocation.key(self.quota_key("routers")).arg(router).arg(ttl_ms);
            for ask in chunk {
                let rate = if ask.rate.is_finite() { ask.rate.max(0.0) } else { 0.0 };
                invocation.key(self.quota_key(&ask.name)).arg(format!(
                    "{rate} {} {} {} {}",
                    ask.wanted, ask.limit, ask.target, ask.holding
                ));
            }
            let values: Vec<redis::Value> = invocation.invoke_async(&mut connection).await.map_err(unavailable)?;
            let mut values = values.into_iter();
            let routers: u32 = values
                .next()
                .map(redis::from_redis_value)
                .transpose()
                .map_err(|error| TaskStoreError::Corrupt(format!("quota exchange: {error}")))?
                .ok_or_else(|| TaskStoreError::Corrupt("the quota exchange answered nothing".to_string()))?;
            answer.routers = routers;
            for value in values {
                let (granted, list): (u32, Vec<String>) = redis::from_redis_value(value)
                    .map_err(|error| TaskStoreError::Corrupt(format!("quota exchange: {error}")))?;
                answer.limits.push(QuotaLimit {
                    reports: parse_reports(&list)?,
                    granted,
                });
            }
        }
        if answer.limits.len() != asks.len() {
            return Err(TaskStoreError::Corrupt(format!(
                "the quota exchange answered {} limits for {}",
                answer.limits.len(),
                asks.len()
            )));
        }
        Ok(answer)
    }
}

/// `router, "RATE WANTED", …` into reports.
fn parse_reports(list: &[String]) -> Result<Vec<QuotaReport>, TaskStoreError> {
    list.chunks(2)
        .map(|pair| {
            let [router, value] = pair else {
                return Err(TaskStoreError::Corrupt("an odd quota report list".to_string()));
            };
            let corrupt = || TaskStoreError::Corrupt(format!("quota report `{value}` of router `{router}`"));
            let (rate, wanted) = value.split_once(' ').ok_or_else(corrupt)?;
            Ok(QuotaReport {
                router: router.clone(),
                rate: rate.parse().map_err(|_| corrupt())?,
                wanted: wanted.parse().map_err(|_| corrupt())?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_and_a_broken_one_is_corrupt() {
        let list = [
            "a".to_string(),
            "12.5 3".to_string(),
            "b".to_string(),
            "0 0".to_string(),
        ];
        let reports = parse_reports(&list).unwrap();
        assert_eq!(reports[0].router, "a");
        assert_eq!(reports[0].rate, 12.5);
        assert_eq!(reports[0].wanted, 3);
        assert_eq!(reports[1].wanted, 0);
        assert!(matches!(
            parse_reports(&["a".to_string(), "x".to_string()]),
            Err(TaskStoreError::Corrupt(_))
        ));
        assert!(matches!(
            parse_reports(&["a".to_string()]),
            Err(TaskStoreError::Corrupt(_))
        ));
    }
}
