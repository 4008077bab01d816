//! The Lua scripts, each a change on one slot, loaded once; and the state
//! lists they are given (from the one transition table).

use redis::Script;

use crate::model::State;

/// The task store's scripts, loaded once.
pub(super) struct Scripts {
    pub(super) submit: Script,
    pub(super) transition: Script,
    pub(super) finish: Script,
    pub(super) claim: Script,
    pub(super) reclaim: Script,
    pub(super) running: Script,
    pub(super) prepare: Script,
    pub(super) lease_due: Script,
    pub(super) extend: Script,
    pub(super) accept: Script,
    pub(super) replay: Script,
    pub(super) set_callback: Script,
    pub(super) release_request: Script,
    pub(super) index: Script,
    pub(super) publish: Script,
    pub(super) ask_for_input: Script,
    pub(super) continue_task: Script,
    pub(super) put_push: Script,
}

impl Scripts {
    /// Every script, from its text.
    pub(super) fn load() -> Self {
        Self {
            submit: Script::new(SUBMIT),
            transition: Script::new(TRANSITION),
            finish: Script::new(&format!("{NOTIFY_PUSH}{FINISH}")),
            claim: Script::new(&format!("{TAKE}{CLAIM}")),
            reclaim: Script::new(&format!("{TAKE}{RECLAIM}")),
            running: Script::new(RUNNING),
            prepare: Script::new(PREPARE),
            lease_due: Script::new(LEASE_DUE),
            extend: Script::new(EXTEND),
            accept: Script::new(ACCEPT),
            replay: Script::new(REPLAY),
            set_callback: Script::new(SET_CALLBACK),
            release_request: Script::new(RELEASE_REQUEST),
            index: Script::new(INDEX),
            publish: Script::new(PUBLISH),
            ask_for_input: Script::new(&format!("{NOTIFY_PUSH}{ASK_FOR_INPUT}")),
            continue_task: Script::new(CONTINUE_TASK),
            put_push: Script::new(PUT_PUSH),
        }
    }
}

pub(super) const SUBMIT: &str = r#"
-- Stores and queues a task in its lane, unless it is stored already (the
-- request id was claimed for it before, by this submission or an earlier one).
-- On one server (ARGV[9] '1') it also claims the request id itself and adds
-- the task to its caller's index, every key being on that server: the whole
-- submission is this one script.
-- KEYS: 1 task hash, 2 queue, 3 the lane's queue set, 4 the lane's backlog,
--       on one server only: 5 the idempotency key, 6 the caller's index, then
--       the other lanes' backlogs (the bound then counts every lane at once)
-- ARGV: 1 task id, 2 spec JSON, 3 now ms, 4 backlog field (capability|priority),
--       5 queue it ('1'/'0': a held broadcast parent is stored only), 6 group,
--       7 the tenant's backlog bound ('0': none): refused with {2, waiting} at or over it,
--       8 tasks waiting in lanes not counted here (a cluster's other shards, read just before),
--       9 '1': one server (claim here; another task holding the request id: {3, its id}),
--       10 retention s, 11 index size, 12 a push config's field ('': none), 13 its JSON
local others = 5
if ARGV[9] == '1' then
  others = 7
  local holder = redis.call('GET', KEYS[5])
  if holder and holder ~= ARGV[1] then return {3, holder} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, ARGV[1]} end
if ARGV[7] ~= '0' and ARGV[5] == '1' then
  local waiting = tonumber(ARGV[8])
  for _, count in ipairs(redis.call('HVALS', KEYS[4])) do waiting = waiting + tonumber(count) end
  for k = others, #KEYS do
    for _, count in ipairs(redis.call('HVALS', KEYS[k])) do waiting = waiting + tonumber(count) end
  end
  if waiting >= tonumber(ARGV[7]) then return {2, tostring(waiting)} end
end
if ARGV[9] == '1' then
  redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[10])
  redis.call('ZADD', KEYS[6], ARGV[3], ARGV[1])
  redis.call('ZREMRANGEBYRANK', KEYS[6], 0, -1 - tonumber(ARGV[11]))
  redis.call('EXPIRE', KEYS[6], ARGV[10])
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'state', 'pending', 'attempts', 0, 'updated_at_ms', ARGV[3],
  'transitions', '{"state":"pending","at_ms":' .. ARGV[3] .. '}\n')
if ARGV[12] ~= '' then redis.call('HSET', KEYS[1], ARGV[12], ARGV[13]) end
if ARGV[5] == '1' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[6], '0', 'MKSTREAM')
    redis.call('SADD', KEYS[3], KEYS[2])
  end
  redis.call('HSET', KEYS[1], 'backlog', ARGV[4])
  redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
  redis.call('XADD', KEYS[2], '*', 'task_id', ARGV[1])
end
return {1, ARGV[1]}
"#;

const RELEASE_REQUEST: &str = r#"
-- Frees a request id claimed for a task that was then refused (backlog
-- bound), unless another task holds it by now.
-- KEYS: 1 idempotency key; ARGV: 1 task id
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

const INDEX: &str = r#"
-- Adds a task to its caller's index, keeping the newest.
-- KEYS: 1 the caller's index; ARGV: 1 task id, 2 created ms, 3 index size, 4 retention s
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -1 - tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"#;

const LEASE_DUE: &str = r#"
-- Takes members that are due and pushes their due time out by a lease, so
-- one router handles each; if it dies, the lease runs out and another does.
-- (Callbacks due, and follow-ups a router left.)
-- KEYS: 1 schedule; ARGV: 1 due at or before (ms), 2 lease until ms, 3 limit
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], id) end
return due
"#;

pub(super) const TRANSITION: &str = r#"
-- KEYS: 1 task hash, 2 backlog hash
-- ARGV: 1 new state, 2 now ms, 3 attempts increment, 4.. allowed predecessor states
-- In the new state already: done (this move run again, after a connection
-- that failed once it was sent).
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
if current == ARGV[1] then return {'ok', current} end
local allowed = false
for i = 4, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
if current == 'pending' then
  local field = redis.call('HGET', KEYS[1], 'backlog')
  if field then redis.call('HINCRBY', KEYS[2], field, -1) end
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated_at_ms', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'attempts', ARGV[3])
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"' .. ARGV[1] .. '","at_ms":' .. ARGV[2] .. '}\n')
return {'ok', current}
"#;

pub(super) const FINISH: &str = r#"
-- Records a terminal outcome, acknowledges the queue entry, schedules the
-- callback, starts the retention clock and, for a task of a session, notes
-- the session result beyond the lane as a follow-up, all at once.
-- KEYS: 1 task hash, 2 queue, 3 backlog hash, 4 callback schedule, 5 follow-ups,
--       6 (one server only) the idempotency key, its retention started again here
-- ARGV: 1 terminal state, 2 now ms, 3 result JSON, 4 queue entry id ('' = none),
--       5 group, 6 retention s, 7 task id, 8 has callback ('1'/'0'),
--       9 reporting agent ('' = not an agent's report), 10 the report's fingerprint,
--       11 has a session ('1'/'0'), 12 one server ('1'/'0'), 13.. allowed predecessors
-- An agent's report is taken only from the agent that answered the delivery 202,
-- once: the same report again is 'repeat', another one 'conflict'.
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local entry = ARGV[4]
if ARGV[9] ~= '' then
  local accepted = redis.call('HGET', KEYS[1], 'accepted_agent')
  if not accepted then return {'not_accepted', current} end
  if accepted ~= ARGV[9] then return {'wrong_agent', current, accepted} end
  local previous = redis.call('HGET', KEYS[1], 'report')
  if previous then
    if previous == ARGV[10] then return {'repeat', current} end
    return {'conflict', current}
  end
  entry = redis.call('HGET', KEYS[1], 'entry_id') or ''
end
local allowed = false
for i = 13, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then
  if entry ~= '' then redis.call('XACK', KEYS[2], ARGV[5], entry) end
  -- A worker's very outcome for its entry, recorded already (the script run
  -- again after a connection that failed once it was sent): done. (A cancel
  -- of an ended task stays refused.)
  if ARGV[9] == '' and ARGV[4] ~= '' and current == ARGV[1]
    and redis.call('HGET', KEYS[1], 'result') == ARGV[3] then
    return {'ok', current}
  end
  if ARGV[9] ~= '' then return {'conflict', current} end
  return {'refused', current}
end
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'report', ARGV[10]) end
-- A callback set or deleted after submission (the `callback` field) replaces the spec's.
local has_callback = ARGV[8] == '1'
local replaced = redis.call('HGET', KEYS[1], 'callback')
if replaced then has_callback = replaced ~= 'null' and ARGV[1] ~= 'canceled' end
if has_callback then redis.call('ZADD', KEYS[4], ARGV[2], ARGV[7]) end
notify_push(KEYS[1], KEYS[4], ARGV[2], ARGV[7])
if current == 'pending' then
  local field = redis.call('HGET', KEYS[1], 'backlog')
  if field then redis.call('HINCRBY', KEYS[3], field, -1) end
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated_at_ms', ARGV[2], 'result', ARGV[3])
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"' .. ARGV[1] .. '","at_ms":' .. ARGV[2] .. '}\n')
redis.call('EXPIRE', KEYS[1], ARGV[6])
if ARGV[12] == '1' then redis.call('EXPIRE', KEYS[6], ARGV[6]) end
if entry ~= '' then redis.call('XACK', KEYS[2], ARGV[5], entry) end
if ARGV[11] == '1' then redis.call('ZADD', KEYS[5], ARGV[2], ARGV[7]) end
return {'ok', current}
"#;

/// Shared by the scripts that end or interrupt a task: every A2A push config
/// (field `push:{id}`) is scheduled for a notification now, as the schedule's
/// member `{task id}#{id}` (task ids hold no `#`), its attempts counted afresh.
pub(super) const NOTIFY_PUSH: &str = r#"
local function notify_push(task, schedule, now, task_id)
  for _, field in ipairs(redis.call('HKEYS', task)) do
    if string.sub(field, 1, 5) == 'push:' then
      local id = string.sub(field, 6)
      redis.call('ZADD', schedule, now, task_id .. '#' .. id)
      redis.call('HDEL', task, 'callback_attempts#' .. id)
    end
  end
end
"#;

const ASK_FOR_INPUT: &str = r#"
-- The agent asked for more input: the delivery ended, the task did not. Records
-- its question as a turn, acknowledges the queue entry, notifies the push
-- configs, drops a preemption's checkpoint (the next turn starts afresh), and
-- starts the retention clock (a conversation left waiting expires).
-- KEYS: 1 task hash, 2 queue, 3 callback schedule
-- ARGV: 1 now ms, 2 the agent's turn (one JSON line), 3 queue entry id ('' = none),
--       4 group, 5 retention s, 6 task id, 7.. allowed predecessors
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local line = ARGV[2] .. '\n'
local turns = redis.call('HGET', KEYS[1], 'turns') or ''
-- Run again after a connection that failed once it was sent: done.
if current == 'input_required' and string.sub(turns, -#line) == line then
  if ARGV[3] ~= '' then redis.call('XACK', KEYS[2], ARGV[4], ARGV[3]) end
  return {'ok', current}
end
local allowed = false
for i = 7, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then
  if ARGV[3] ~= '' then redis.call('XACK', KEYS[2], ARGV[4], ARGV[3]) end
  return {'refused', current}
end
redis.call('HSET', KEYS[1], 'state', 'input_required', 'updated_at_ms', ARGV[1], 'turns', turns .. line)
-- A checkpoint of an earlier preemption belonged to the turn that just ended.
redis.call('HDEL', KEYS[1], 'checkpoint')
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"input_required","at_ms":' .. ARGV[1] .. '}\n')
if ARGV[3] ~= '' then redis.call('XACK', KEYS[2], ARGV[4], ARGV[3]) end
redis.call('EXPIRE', KEYS[1], ARGV[5])
notify_push(KEYS[1], KEYS[3], ARGV[1], ARGV[6])
return {'ok', current}
"#;

const CONTINUE_TASK: &str = r#"
-- A message continues a task that asked for input: its turn recorded, the task
-- kept again (no retention while it runs) and queued again in its lane.
-- KEYS: 1 task hash, 2 queue, 3 the lane's queue set, 4 backlog hash
-- ARGV: 1 now ms, 2 the caller's turn (one JSON line), 3 backlog field, 4 group,
--       5 task id, 6.. allowed predecessors
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local line = ARGV[2] .. '\n'
local turns = redis.call('HGET', KEYS[1], 'turns') or ''
-- Run again after a connection that failed once it was sent: done.
if string.sub(turns, -#line) == line then return {'ok', current} end
local allowed = false
for i = 6, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
redis.call('HSET', KEYS[1], 'state', 'pending', 'updated_at_ms', ARGV[1], 'turns', turns .. line)
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"pending","at_ms":' .. ARGV[1] .. '}\n')
redis.call('PERSIST', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[4], '0', 'MKSTREAM')
  redis.call('SADD', KEYS[3], KEYS[2])
end
redis.call('HSET', KEYS[1], 'backlog', ARGV[3])
redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
redis.call('XADD', KEYS[2], '*', 'task_id', ARGV[5])
return {'ok', current}
"#;

const PUT_PUSH: &str = r#"
-- Creates or replaces an A2A push config of a task (field `push:{id}`), at most
-- ARGV[3] per task.
-- KEYS: 1 task hash; ARGV: 1 field, 2 config JSON, 3 most configs
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  local held = 0
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 5) == 'push:' then held = held + 1 end
  end
  if held >= tonumber(ARGV[3]) then return {'full', tostring(held)} end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {'ok', ''}
"#;

const PUBLISH: &str = r#"
-- Appends an ended task to its session's results, once.
-- KEYS: 1 session results stream, 2 the task ids in it; ARGV: 1 task id, 2 state, 3 retention s
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('XADD', KEYS[1], '*', 'task_id', ARGV[1], 'state', ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"#;

/// Shared by the claim and reclaim scripts: an entry's task, loaded; an entry
/// whose task ended (canceled) or expired is acknowledged and skipped.
const TAKE: &str = r#"
local function take(out, queue, entries)
  local taken = 0
  for _, entry in ipairs(entries) do
    if type(entry) ~= 'table' then break end
    local id, fields = entry[1], entry[2]
    local task_id
    if type(fields) == 'table' then
      for f = 1, #fields, 2 do if fields[f] == 'task_id' then task_id = fields[f + 1] end end
    end
    local record = {}
    if task_id then record = redis.call('HGETALL', ARGV[3] .. task_id) end
    local state
    for f = 1, #record, 2 do if record[f] == 'state' then state = record[f + 1] end end
    if state == nil or string.find(ARGV[4], ' ' .. state .. ' ', 1, true) then
      redis.call('XACK', queue, ARGV[1], id)
    else
      out[#out + 1] = {queue, id, record}
      taken = taken + 1
    end
  end
  return taken
end
"#;

/// KEYS: 1 the lane's queue set (the lane's slot)
/// ARGV: 1 group, 2 consumer, 3 task key prefix, 4 terminal states (' a b c '), then (queue, count) pairs.
/// Entries of ended tasks do not count: reading goes on past them.
const CLAIM: &str = r#"
local out = {}
for i = 5, #ARGV, 2 do
  local queue, wanted = ARGV[i], tonumber(ARGV[i + 1])
  while wanted > 0 do
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', wanted, 'STREAMS', queue, '>')
    if not reply or #reply[1][2] == 0 then break end
    wanted = wanted - take(out, queue, reply[1][2])
  end
end
return out
"#;

/// KEYS: 1 the lane's queue set
/// ARGV: 1 group, 2 consumer, 3 task key prefix, 4 terminal states, 5 min idle ms, 6 count
const RECLAIM: &str = r#"
local out = {}
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local left = tonumber(ARGV[6]) - #out
  if left <= 0 then break end
  local reply = redis.call('XAUTOCLAIM', queue, ARGV[1], ARGV[2], ARGV[5], '0-0', 'COUNT', left)
  take(out, queue, reply[2])
end
return out
"#;

/// Claimed-not-acknowledged entries per queue of a lane.
/// KEYS: 1 the lane's queue set; ARGV: 1 group
const RUNNING: &str = r#"
local out = {}
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local summary = redis.call('XPENDING', queue, ARGV[1])
  out[#out + 1] = {queue, summary[1]}
end
return out
"#;

/// Recreates the consumer group of every queue of a lane (a Redis that lost them).
/// KEYS: 1 the lane's queue set; ARGV: 1 group
const PREPARE: &str = r#"
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local created = redis.pcall('XGROUP', 'CREATE', queue, ARGV[1], '0', 'MKSTREAM')
  if type(created) == 'table' and created.err and not string.find(created.err, 'BUSYGROUP', 1, true) then
    return redis.error_reply(created.err)
  end
end
return 1
"#;

const EXTEND: &str = r#"
-- Refreshes a running delivery's claim (its idle time) so no router reclaims
-- it, only while this worker still holds the entry.
-- KEYS: 1 queue; ARGV: 1 group, 2 consumer, 3 entry id
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #held == 0 then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
"#;

const ACCEPT: &str = r#"
-- The agent answered the delivery 202: it reports later. Records who may report,
-- until when, and the queue entry the report acknowledges.
-- KEYS: 1 task hash; ARGV: 1 accepted JSON, 2 agent name, 3 queue entry id
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
if current ~= 'running' then return {'refused', current} end
redis.call('HSET', KEYS[1], 'accepted', ARGV[1], 'accepted_agent', ARGV[2], 'entry_id', ARGV[3])
return {'ok', current}
"#;

const SET_CALLBACK: &str = r#"
-- Sets (JSON) or deletes ('null') a task's callback while the task has not ended.
-- KEYS: 1 task hash; ARGV: 1 callback JSON or 'null', 2.. the states it may be set in
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local allowed = false
for i = 2, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
redis.call('HSET', KEYS[1], 'callback', ARGV[1])
return {'ok', current}
"#;

const REPLAY: &str = r#"
-- Schedules a dead-lettered callback again from its first attempt: due now,
-- its attempt count reset (the dead letter is removed after this).
-- KEYS: 1 task hash, 2 callback schedule; ARGV: 1 schedule member, 2 now ms, 3 its attempts field
if redis.call('EXISTS', KEYS[1]) == 0 then return 'expired' end
redis.call('HSET', KEYS[1], ARGV[3], 0)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 'ok'
"#;

pub(super) fn state_args(next: State) -> Vec<&'static str> {
    State::predecessors(next).into_iter().map(State::as_str).collect()
}

/// The terminal states, space-separated and padded, for the scripts' `take`.
pub(super) fn terminal_states() -> String {
    let words: Vec<&str> = State::ALL
        .into_iter()
        .filter(|state| state.is_terminal())
        .map(State::as_str)
        .collect();
    format!(" {} ", words.join(" "))
}
