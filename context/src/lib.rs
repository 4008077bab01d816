//! The context service (DESIGN §4): per-session shared state in Redis with
//! tiered TTLs and field-level read whitelists. Not built yet; see the context issue.
