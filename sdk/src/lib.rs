//! The Rust SDK: declare handlers, register, heartbeat, serve, drain, call
//! other capabilities. Not built yet; see the SDK issue.
