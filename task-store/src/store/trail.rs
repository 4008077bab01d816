//! Where the trail (`agent_reach_trail`) keeps a tenant's records: beside
//! the tasks, under `{prefix}:{tenant}`, one hash tag per chain (a router
//! replica's) so that a chain and its indexes are one slot of a Redis
//! Cluster while chains spread over the shards (`{C}`: the chain's tag):
//! - `trail:{C}:segments` — stream: one entry per segment (a written
//!   batch), id `{ms}-{last seq}` (its last record's id), field `z` the
//!   segment's text (`agent_reach_trail::segment`: a line per record)
//!   compressed, or `s` the text itself (a segment written before segments
//!   were compressed, or one too large to compress); trimmed to the retention.
//! - `trail:{C}:heads` — stream: one entry per segment, id `{ms}-{segment}`, field `j` (the signed head).
//! - `trail:{C}:written` — the last segment whose head and lists are written.
//! - `trail:{C}:ix:rq:{bucket}` — string: a line `{request id} {record id}`
//!   per record whose request id is one the router generates
//!   (`agent_reach_trail::request_id`: its time in front), in the bucket of
//!   that time (1 s; epoch ms of its start); appended, never read, when a
//!   batch is written. Expires an hour after the retention.
//! - `trail:{C}:ix:request:{hour}` — hash: any other request id → its
//!   record ids (comma-separated) among the segments sealed in that hour
//!   (epoch ms of the hour's start); `trail:{C}:ix:request:hours` the hours
//!   written (sorted set). Both expire an hour after the retention.
//! - `trail:{C}:ix:{session|run}:{id}` — list of the record ids an index
//!   names, expiring with the retention.
//! - `trail:{C}:inputs:{capability}` — list of the newest record ids holding
//!   their input (at most [`INPUTS_KEPT`]), what replays sample.
//! - `trail:chains` — sorted set: chains by their last write (ms).
//!
//! A record `{ms}-{seq}` is read from the first segment whose id is not
//! below it. Redis does per-batch work: one stream entry, one append per
//! bucket the batch's generated request ids fall in, one list push per
//! session, run or capability named, and per record only a line of those
//! writes; only a request id the router did not generate costs a field of
//! the hour's hash, read and written (`router-bench --trail`: an entry and
//! an index key per record cost Redis more than the call it recorded; the
//! hash's fields, 3.7 µs of Redis a record, were still most of the rest).

use std::collections::HashMap;
use std::time::Duration;

use agent_reach_trail::{request_id, segment, Batch, ChainInfo, Index, Stored, StoredHead, TrailStore};
use async_trait::async_trait;
use redis::Value as RedisValue;

use super::record::{entry_fields, stream_entries};
use super::TaskStore;

/// Record ids kept per capability for replays to sample.
pub const INPUTS_KEPT: isize = 10_000;

/// The request index's buckets.
const HOUR_MS: u64 = 3_600_000;

/// Segments read per command when a reader walks a chain.
const SEGMENTS_PER_READ: usize = 8;

/// A batch's head and lists in one script, idempotent: a batch written
/// before (a retry after a lost answer) finds its segment named in
/// `trail:{C}:written` and writes nothing twice. Neither the segment's text
/// nor the request index goes through it: a script turns every argument
/// into a Lua string and back (for the text, hundreds of kilobytes a batch;
/// for the index, a microsecond a record on Redis's side in `router-bench
/// --trail`), and their writes are idempotent on their own (see
/// [`TaskStore::append`]).
const TRAIL_APPEND: &str = r#"
-- KEYS: 1 written (the last segment whose head and lists are written),
--       2 heads stream, 3 request index hours (sorted set), 4.. lists
-- ARGV: 1 retention s, 2 oldest ms (MINID), 3 segment id, 4 head id,
--       5 head JWS, 6 inputs kept, 7 the hour (ms), 8 requests n,
--       then per list: kind ('i' index, 'n' inputs), count, the record ids
local function order(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end
local keep = tonumber(ARGV[1]) + 3600
local written = redis.call('GET', KEYS[1])
if written then
  local ms, seq = order(ARGV[3])
  local top_ms, top_seq = order(written)
  if ms < top_ms or (ms == top_ms and seq <= top_seq) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[3], 'EX', keep)
redis.call('XADD', KEYS[2], 'MINID', '~', ARGV[2], ARGV[4], 'j', ARGV[5])
if tonumber(ARGV[8]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[7], ARGV[7])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (tonumber(ARGV[2]) - 3600000))
  redis.call('EXPIRE', KEYS[3], keep)
end
local a = 9
local slice = 1000
for k = 4, #KEYS do
  local kind, count = ARGV[a], tonumber(ARGV[a + 1])
  for from = a + 2, a + 1 + count, slice do
    redis.call('RPUSH', KEYS[k], unpack(ARGV, from, math.min(a + 1 + count, from + slice - 1)))
  end
  if kind == 'n' then redis.call('LTRIM', KEYS[k], -tonumber(ARGV[6]), -1) end
  redis.call('EXPIRE', KEYS[k], ARGV[1])
  a = a + 2 + count
end
return 1
"#;

fn trail_append() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(TRAIL_APPEND))
}

impl TaskStore {
    fn chain_tag(router: &str) -> String {
        format!("tr-{router}")
    }

    fn trail_key(&self, router: &str, what: &str) -> String {
        format!("{}:trail:{{{}}}:{what}", self.namespace, Self::chain_tag(router))
    }

    fn chains_key(&self) -> String {
        format!("{}:trail:chains", self.namespace)
    }

    /// Up to [`SEGMENTS_PER_READ`] segments of `router`'s chain between
    /// `from` and `to` (stream range bounds), oldest first, or newest first
    /// when `reverse`; each with its records.
    async fn segments(
        &self,
        router: &str,
        from: &str,
        to: &str,
        reverse: bool,
    ) -> Result<Vec<(String, Vec<Stored>)>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let (command, first, second) = if reverse {
            ("XREVRANGE", to, from)
        } else {
            ("XRANGE", from, to)
        };
        let answer: RedisValue = redis::cmd(command)
            .arg(self.trail_key(router, "segments"))
            .arg(first)
            .arg(second)
            .arg("COUNT")
            .arg(SEGMENTS_PER_READ)
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail: {error}"))?;
        Ok(segment_entries(&answer))
    }

    /// The stored records of `router`'s chain with these ids, in the
    /// order given (one read per segment they fall in; an id no segment
    /// holds any more is left out).
    async fn records_by_id(&self, router: &str, ids: &[String]) -> Result<Vec<Stored>, String> {
        let mut wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
        wanted.sort_by_key(|id| stream_order(id));
        wanted.dedup();
        let mut found: HashMap<&str, Stored> = HashMap::new();
        let mut at = 0;
        while at < wanted.len() {
            let segments = self.segments(router, wanted[at], "+", false).await?;
            let Some((_, records)) = segments.into_iter().next() else {
                break;
            };
            let last = records.last().map(|stored| stream_order(&stored.id));
            for stored in records {
                if let Some(id) = wanted[at..].iter().find(|id| **id == stored.id) {
                    found.insert(id, stored);
                }
            }
            // Past this segment (or past an id that no segment holds).
            let before = at;
            while at < wanted.len() && last.is_some_and(|last| stream_order(wanted[at]) <= last) {
                at += 1;
            }
            if at == before {
                at += 1;
            }
        }
        Ok(ids.iter().filter_map(|id| found.remove(id.as_str())).collect())
    }
}

/// The stream range after `after` (exclusive), or from the start.
fn start_after(after: Option<&str>) -> String {
    after.map_or_else(|| "-".to_string(), |after| format!("({after}"))
}

/// The segments of an `XRANGE`/`XREVRANGE` answer, each with its records:
/// read from its compressed text ([`segment::FIELD`]) or its plain one
/// ([`segment::PLAIN_FIELD`]). A segment whose stored bytes do not read
/// back (edited in Redis) has no records: they are missing from the chain,
/// as an unreadable line is.
fn segment_entries(answer: &RedisValue) -> Vec<(String, Vec<Stored>)> {
    stream_entries(answer)
        .map(|(id, fields)| {
            let mut records = Vec::new();
            for (name, value) in fields {
                let RedisValue::BulkString(value) = value else { continue };
                let text = if name == segment::FIELD {
                    segment::decompress(value).ok().map(std::borrow::Cow::Owned)
                } else if name == segment::PLAIN_FIELD {
                    std::str::from_utf8(value).ok().map(std::borrow::Cow::Borrowed)
                } else {
                    None
                };
                if let Some(text) = text {
                    records = segment::decode(&id, &text);
                }
            }
            (id, records)
        })
        .collect()
}

/// A segment's field and value as they are stored: its text compressed,
/// or, when it cannot be (a segment over 4 GiB), the text itself.
fn stored_segment(records: &[agent_reach_trail::Sealed]) -> (&'static str, Vec<u8>) {
    let mut compressed = Vec::new();
    match segment::write_compressed(records, &mut compressed) {
        Ok(()) => (segment::FIELD, compressed),
        Err(_) => (segment::PLAIN_FIELD, segment::encode(records).into_bytes()),
    }
}

/// A request's record ids in the index: those it held (`before`), then
/// `ids` (comma-separated) not among them.
fn merged(before: Option<String>, ids: &str) -> String {
    match before {
        None => ids.to_string(),
        Some(mut held) => {
            for id in ids.split(',') {
                if !held.split(',').any(|old| old == id) {
                    held.push(',');
                    held.push_str(id);
                }
            }
            held
        }
    }
}

/// How far ahead of the chain's clock a generated request id's time may be
/// (another router's or an SDK's clock) and still be taken as its time.
const CLOCK_SKEW_MS: u64 = 300_000;

/// The bucket of the request index a record of `request_id`, sealed at
/// `at_ms`, is listed in: for an id of the generated shape whose time is
/// plausible (not further ahead than [`CLOCK_SKEW_MS`], not older than the
/// retention), the bucket of its time; otherwise none (the hour's hash). A
/// lookup reads the bucket its id names, so a record is always listed where
/// its id's readers look, whoever made the id; and the buckets a chain can
/// write are bounded by the retention, whatever ids callers send.
fn bucket_for(request_id: &str, at_ms: u64, retention_ms: u64) -> Option<u64> {
    let made = request_id::time_of(request_id)?;
    (made <= at_ms.saturating_add(CLOCK_SKEW_MS) && made.saturating_add(retention_ms) >= at_ms)
        .then(|| made / request_id::BUCKET_MS * request_id::BUCKET_MS)
}

/// The record ids `text` (a bucket's lines, `{request id} {record id}`) lists for `request`.
fn listed_in(text: &str, request: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(id, _)| *id == request)
        .map(|(_, record)| record.to_string())
        .collect()
}

/// A stream id's order: its milliseconds, then its sequence number.
fn stream_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

#[async_trait]
impl TrailStore for TaskStore {
    /// Three round trips at most: the hash's values for the batch's request
    /// ids of other shapes, when it has any (a request named in an earlier
    /// batch of the hour keeps those records); the segment, the script and
    /// the index's writes (the buckets' appends, the hash's fields) in one
    /// pipeline; the chains set (another slot on a cluster). Only this
    /// chain's writer writes its keys, so reading the hash before writing it
    /// races with nobody. Every step is idempotent, so a batch written again
    /// after a failure (or a lost answer) ends as one write would: the
    /// segment is refused by its stream id, the script finds it named in
    /// `written`, the hash adds no record id it already lists, and a
    /// bucket's append lists a record twice, which a lookup names once.
    async fn append(&self, batch: &Batch, retention: Duration) -> Result<(), String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let retention_s = retention.as_secs().max(1);
        let oldest = batch.at_ms.saturating_sub(retention_ms);
        let hour = batch.at_ms / HOUR_MS * HOUR_MS;
        let index_key = self.trail_key(&batch.router, &format!("ix:request:{hour}"));
        // Each request id once, with its records' ids; each list key once,
        // with its records' ids.
        let mut requests: Vec<(&str, String)> = Vec::with_capacity(batch.records.len());
        let mut request_at: HashMap<&str, usize> = HashMap::with_capacity(batch.records.len());
        let mut lists: Vec<(String, bool, Vec<String>)> = Vec::new();
        let mut list_at: HashMap<String, usize> = HashMap::new();
        let mut list = |key: String, inputs: bool, id: &str| match list_at.get(&key) {
            Some(&index) => lists[index].2.push(id.to_string()),
            None => {
                list_at.insert(key.clone(), lists.len());
                lists.push((key, inputs, vec![id.to_string()]));
            }
        };
        // A generated request id names its own bucket (its records are
        // listed there, one line each, with no read); any other is a field
        // of the hour's hash.
        let mut buckets: Vec<(u64, String)> = Vec::new();
        for sealed in &batch.records {
            let id = sealed.stored.id.as_str();
            if let Some(bucket) = bucket_for(&sealed.request_id, batch.at_ms, retention_ms) {
                let at = match buckets.iter().position(|(start, _)| *start == bucket) {
                    Some(at) => at,
                    None => {
                        buckets.push((bucket, String::with_capacity(batch.records.len() * 48)));
                        buckets.len() - 1
                    }
                };
                let text = &mut buckets[at].1;
                text.push_str(&sealed.request_id);
                text.push(' ');
                text.push_str(id);
                text.push('\n');
            } else {
                match request_at.get(sealed.request_id.as_str()) {
                    Some(&index) => {
                        requests[index].1.push(',');
                        requests[index].1.push_str(id);
                    }
                    None => {
                        request_at.insert(&sealed.request_id, requests.len());
                        requests.push((&sealed.request_id, id.to_string()));
                    }
                }
            }
            if let Some(session) = &sealed.session_id {
                list(
                    self.trail_key(&batch.router, &format!("ix:session:{session}")),
                    false,
                    id,
                );
            }
            if let Some(run) = &sealed.run_id {
                list(self.trail_key(&batch.router, &format!("ix:run:{run}")), false, id);
            }
            if let Some(capability) = &sealed.input_of {
                list(self.trail_key(&batch.router, &format!("inputs:{capability}")), true, id);
            }
        }
        // What the index already holds for these requests.
        let before: Vec<Option<String>> = if requests.is_empty() {
            Vec::new()
        } else {
            let mut command = redis::cmd("HMGET");
            command.arg(&index_key);
            for (request, _) in &requests {
                command.arg(*request);
            }
            command
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("reading the trail's index: {error}"))?
        };
        // The segment: a stream id at or below the stream's top means it
        // was written before.
        // The segment, the script and the index's writes in one round trip,
        // each answer read on its own (a segment written before is refused
        // by its stream id and taken as written).
        let segment_id = batch.segment_id();
        let mut keys = vec![
            self.trail_key(&batch.router, "written"),
            self.trail_key(&batch.router, "heads"),
            self.trail_key(&batch.router, "ix:request:hours"),
        ];
        keys.extend(lists.iter().map(|(key, _, _)| key.clone()));
        let mut index_values: Vec<(&str, String)> = Vec::with_capacity(requests.len());
        for ((request, ids), before) in requests.iter().zip(before) {
            index_values.push((request, merged(before, ids)));
        }
        let script = trail_append();
        let (field, text) = stored_segment(&batch.records);
        let mut loaded = false;
        loop {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            let mut segment_write = redis::Cmd::with_capacity(8, text.len() + 256);
            segment_write
                .arg("XADD")
                .arg(self.trail_key(&batch.router, "segments"))
                .arg("MINID")
                .arg("~")
                .arg(oldest)
                .arg(&segment_id)
                .arg(field)
                .arg(&text[..]);
            pipe.add_command(segment_write);
            let evalsha = pipe
                .cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(&keys)
                .arg(retention_s)
                .arg(oldest)
                .arg(&segment_id)
                .arg(&batch.head.id)
                .arg(&batch.head.jws)
                .arg(INPUTS_KEPT)
                .arg(hour)
                .arg(requests.len());
            for (_, inputs, ids) in &lists {
                evalsha.arg(if *inputs { "n" } else { "i" }).arg(ids.len()).arg(ids);
            }
            if !index_values.is_empty() {
                let command = pipe.cmd("HSET").arg(&index_key);
                for (request, ids) in &index_values {
                    command.arg(*request).arg(ids);
                }
                pipe.cmd("EXPIRE").arg(&index_key).arg(retention_s + 3600);
            }
            for (bucket, text) in &buckets {
                let key = self.trail_key(&batch.router, &format!("ix:rq:{bucket}"));
                pipe.cmd("APPEND").arg(&key).arg(text);
                pipe.cmd("EXPIRE").arg(&key).arg(retention_s + 3600);
            }
            let answers: Vec<redis::RedisResult<RedisValue>> = pipe
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("writing the trail: {error}"))?;
            let mut answers = answers.into_iter();
            if let Some(Err(error)) = answers.next() {
                if !error.to_string().contains("equal or smaller") {
                    return Err(format!("writing the trail: {error}"));
                }
            }
            match answers.next() {
                // Redis restarted (or flushed its scripts): load it, write
                // again (every step is idempotent).
                Some(Err(error)) if error.code() == Some("NOSCRIPT") && !loaded => {
                    script
                        .load_async(&mut connection)
                        .await
                        .map_err(|error| format!("writing the trail: {error}"))?;
                    loaded = true;
                    continue;
                }
                Some(Err(error)) => return Err(format!("writing the trail: {error}")),
                _ => {}
            }
            if let Some(Err(error)) = answers.find(Result::is_err) {
                return Err(format!("writing the trail's index: {error}"));
            }
            break;
        }
        // Another slot on a cluster: its own command.
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg(self.chains_key())
            .arg(batch.at_ms)
            .arg(&batch.router)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.chains_key())
            .arg("-inf")
            .arg(format!("({oldest}"))
            .ignore()
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("writing the trail's chains: {error}"))?;
        Ok(())
    }

    async fn chains(&self) -> Result<Vec<ChainInfo>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let chains: Vec<(String, f64)> = redis::cmd("ZREVRANGE")
            .arg(self.chains_key())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail's chains: {error}"))?;
        Ok(chains
            .into_iter()
            .map(|(router, at)| ChainInfo {
                router,
                last_at_ms: at as u64,
            })
            .collect())
    }

    async fn records_of(&self, index: &Index, limit: usize) -> Result<Vec<Stored>, String> {
        let (kind, value) = index.parts();
        let mut found = Vec::new();
        for chain in self.chains().await? {
            let room = limit.saturating_sub(found.len());
            let mut connection = self.connection().await.map_err(|error| error.to_string())?;
            let ids: Vec<String> = if let Index::Request(request) = index {
                // The bucket a generated id names, and every hour of the
                // chain's hash that may hold an id of any other shape.
                let hours_key = self.trail_key(&chain.router, "ix:request:hours");
                let read = |error: redis::RedisError| format!("reading the trail's index: {error}");
                let (hours, listed): (Vec<u64>, Option<String>) = match request_id::bucket_of(request) {
                    Some(bucket) => redis::pipe()
                        .cmd("ZRANGE")
                        .arg(&hours_key)
                        .arg(0)
                        .arg(-1)
                        .cmd("GET")
                        .arg(self.trail_key(&chain.router, &format!("ix:rq:{bucket}")))
                        .query_async(&mut connection)
                        .await
                        .map_err(read)?,
                    None => {
                        let hours = redis::cmd("ZRANGE")
                            .arg(&hours_key)
                            .arg(0)
                            .arg(-1)
                            .query_async(&mut connection)
                            .await
                            .map_err(read)?;
                        (hours, None)
                    }
                };
                let mut ids = listed.map(|text| listed_in(&text, request)).unwrap_or_default();
                if !hours.is_empty() {
                    let mut pipe = redis::pipe();
                    for hour in &hours {
                        pipe.cmd("HGET")
                            .arg(self.trail_key(&chain.router, &format!("ix:request:{hour}")))
                            .arg(request);
                    }
                    let lists: Vec<Option<String>> = pipe
                        .query_async(&mut connection)
                        .await
                        .map_err(|error| format!("reading the trail's index: {error}"))?;
                    ids.extend(
                        lists
                            .iter()
                            .flatten()
                            .flat_map(|ids| ids.split(','))
                            .map(str::to_string),
                    );
                }
                ids
            } else {
                redis::cmd("LRANGE")
                    .arg(self.trail_key(&chain.router, &format!("ix:{kind}:{value}")))
                    .arg(0)
                    .arg(isize::try_from(room).unwrap_or(isize::MAX).saturating_sub(1))
                    .query_async(&mut connection)
                    .await
                    .map_err(|error| format!("reading the trail's index: {error}"))?
            };
            let ids = &ids[..ids.len().min(room)];
            found.extend(self.records_by_id(&chain.router, ids).await?);
            if found.len() >= limit {
                found.truncate(limit);
                break;
            }
        }
        Ok(found)
    }

    async fn chain_records(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<Stored>, String> {
        let limit = limit.max(1);
        let after_order = after.map(stream_order);
        // The segment holding the record after `after` is the first whose
        // id is above `after` (a segment's id is its last record's).
        let mut from = start_after(after);
        let mut found = Vec::new();
        loop {
            let segments = self.segments(router, &from, "+", false).await?;
            let Some((last_id, _)) = segments.last() else {
                return Ok(found);
            };
            from = format!("({last_id}");
            let read = segments.len();
            for (_, records) in segments {
                for stored in records {
                    if after_order.is_some_and(|after| stream_order(&stored.id) <= after) {
                        continue;
                    }
                    found.push(stored);
                    if found.len() == limit {
                        return Ok(found);
                    }
                }
            }
            if read < SEGMENTS_PER_READ {
                return Ok(found);
            }
        }
    }

    async fn chain_heads(&self, router: &str, after: Option<&str>, limit: usize) -> Result<Vec<StoredHead>, String> {
        let mut connection = self.connection().await.map_err(|error| error.to_string())?;
        let answer: RedisValue = redis::cmd("XRANGE")
            .arg(self.trail_key(router, "heads"))
            .arg(start_after(after))
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut connection)
            .await
            .map_err(|error| format!("reading the trail's heads: {error}"))?;
        Ok(entry_fields(&answer)
            .into_iter()
            .map(|(id, mut fields)| StoredHead {
                id,
                jws: fields.remove("j").unwrap_or_default(),
            })
            .collect())
    }

    async fn chain_records_since(&self, router: &str, since_ms: u64, limit: usize) -> Result<Vec<Stored>, String> {
        let limit = limit.max(1);
        let from = format!("{since_ms}-0");
        let mut to = "+".to_string();
        let mut found = Vec::new();
        loop {
            let segments = self.segments(router, &from, &to, true).await?;
            let Some((oldest_id, _)) = segments.last() else {
                return Ok(found);
            };
            to = format!("({oldest_id}");
            let read = segments.len();
            // Every record of a segment shares its `ms`: all are since `since_ms`.
            for (_, records) in segments {
                for stored in records.into_iter().rev() {
                    found.push(stored);
                    if found.len() == limit {
                        return Ok(found);
                    }
                }
            }
            if read < SEGMENTS_PER_READ {
                return Ok(found);
            }
        }
    }

    async fn recent_with_input(&self, capability: &str, limit: usize) -> Result<Vec<Stored>, String> {
        let mut found = Vec::new();
        for chain in self.chains().await? {
            let mut connection = self.connection().await.map_err(|error| error.to_string())?;
            let ids: Vec<String> = redis::cmd("LRANGE")
                .arg(self.trail_key(&chain.router, &format!("inputs:{capability}")))
                .arg(-isize::try_from(limit).unwrap_or(isize::MAX))
                .arg(-1)
                .query_async(&mut connection)
                .await
                .map_err(|error| format!("reading the trail's inputs: {error}"))?;
            found.extend(self.records_by_id(&chain.router, &ids).await?);
        }
        // Newest first, across chains.
        found.sort_by_key(|stored| std::cmp::Reverse(stream_order(&stored.id)));
        found.truncate(limit);
        Ok(found)
    }
}
