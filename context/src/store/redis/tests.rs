//! Unit tests of the Redis store: the scripts' policy and answers, error
//! replies, a silent connection replaced, the key layout.

use agent_reach_stores::slot::key_slot;

use super::connection::{checked, CONNECTIONS};
use super::layout::buckets;
use super::scripts::{bake_policy, Answer, PATCH, PATCH_ONE};
use super::*;
use crate::model::Written;
use crate::store::ContextStore;

#[test]
fn patch_scripts_carry_the_whole_policy() {
    let policy = StorePolicy {
        default_ttl: Duration::from_secs(1800),
        one_shot_ttl: Duration::from_millis(150),
        idle_timeout: Duration::from_secs(600),
        max_fields: 7,
        max_context_bytes: 4096,
    };
    for parts in [PATCH_ONE, PATCH] {
        let text = bake_policy(&parts.concat(), &policy);
        assert!(!text.contains('$'), "a placeholder is left in:\n{text}");
        // Default tier: 30 min, refresh within 1 s (the cap), idle deadline 10 min;
        // one_shot: 150 ms, within 1 ms (a hundredth, in whole ms), its TTL before the idle timeout.
        assert!(text.contains("local ttl, granularity, idle = 1800000, 1000, 600000"));
        assert!(text.contains("ttl, granularity, idle = 150, 1, 150 end"));
        assert!(text.contains("if count > 7 then") && text.contains("if bytes > 4096 then"));
    }
}

#[test]
fn script_answers_map_to_store_errors() {
    let policy = StorePolicy::default();
    let answer = |items: Vec<Reply>| Answer::parse(Reply::Array(items)).unwrap();
    let conflict = answer(vec![Reply::Bulk(b"conflict".to_vec()), Reply::Int(7)]);
    assert_eq!(
        conflict.written(&policy),
        Err(StoreError::VersionConflict { current: 7 })
    );
    let too_large = answer(vec![Reply::Bulk(b"too_large".to_vec()), Reply::Int(300_000)]);
    assert_eq!(
        too_large.written(&policy),
        Err(StoreError::TooLarge {
            limit: policy.max_context_bytes,
            would_have: 300_000
        })
    );
    let ok = answer(vec![Reply::Bulk(b"ok".to_vec()), Reply::Int(3), Reply::Int(1_000)]);
    assert_eq!(
        ok.written(&policy),
        Ok(Written {
            version: 3,
            expires_at_ms: 1_000
        })
    );
    let odd = answer(vec![Reply::Bulk(b"surprise".to_vec())]);
    assert!(matches!(odd.written(&policy), Err(StoreError::Corrupt(_))));
    assert!(Answer::parse(Reply::Nil).is_err());
}

#[test]
fn transient_redis_errors_are_unavailable() {
    let read_only = Reply::Error("READONLY You can't write against a read only replica.".into());
    assert!(matches!(checked(read_only), Err(StoreError::Unavailable(_))));
    let loading = Reply::Error("LOADING Redis is loading the dataset in memory".into());
    assert!(matches!(checked(loading), Err(StoreError::Unavailable(_))));
    let script_bug = Reply::Error("ERR user_script:1: Script attempted to access nonexistent global".into());
    assert!(matches!(checked(script_bug), Err(StoreError::Corrupt(_))));
    assert_eq!(checked(Reply::Int(1)), Ok(Reply::Int(1)));
}

#[tokio::test(flavor = "current_thread")]
async fn a_connection_that_lets_a_call_time_out_closes_and_is_replaced() {
    // A peer that accepts and never answers: a Redis lost without a reset.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let accepted = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = silent.accept().await.unwrap();
            held.push(stream);
        }
    });
    let namespace = Namespace {
        prefix: "t".into(),
        tenant: "t".into(),
    };
    let store = RedisStore::new(
        &agent_reach_stores::RedisLink::parse(&url).unwrap(),
        &namespace,
        StorePolicy::default(),
        Duration::from_millis(100),
    )
    .unwrap();
    let current = |store: &RedisStore| {
        CONNECTIONS.with(|connections| {
            connections
                .borrow()
                .iter()
                .find(|(id, _, _, _)| *id == store.id)
                .map(|(_, _, _, connection)| connection.clone())
        })
    };
    let silence = store.ping().await;
    assert!(
        matches!(&silence, Err(StoreError::Unavailable(message)) if message.contains("no answer from Redis within 100 ms")),
        "{silence:?}"
    );
    let first = current(&store).expect("this thread's connection");
    assert!(first.is_closed(), "the silent connection was closed");
    // The next call opens a fresh connection (to the same silent peer here).
    assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))));
    let second = current(&store).expect("this thread's connection");
    assert!(!second.same_as(&first), "a new connection replaced the silent one");
    accepted.abort();
}

#[test]
fn ttls_are_never_zero() {
    assert_eq!(millis(Duration::ZERO), 1);
    assert_eq!(millis(Duration::from_secs(2)), 2000);
    let namespace = Namespace {
        prefix: "agent-reach".into(),
        tenant: "default".into(),
    };
    let bucket = bucket_of("c1");
    let tag = &buckets()[bucket].0;
    assert_eq!(
        namespace.context_prefix(bucket),
        format!("agent-reach:default:ctx:{{{tag}}}:")
    );
    assert_eq!(
        namespace.deadlines(bucket),
        format!("agent-reach:default:deadlines:{{{tag}}}")
    );
}

#[test]
fn a_contexts_keys_share_a_slot_and_buckets_spread_over_the_slots() {
    let namespace = Namespace {
        prefix: "agent-reach".into(),
        tenant: "default".into(),
    };
    for id in ["c1", "ctx_0123456789abcdef0123456789abcdef", "a{b}c", "{}"] {
        let bucket = bucket_of(id);
        let hash = format!("{}{id}", namespace.context_prefix(bucket));
        assert_eq!(
            key_slot(hash.as_bytes()),
            key_slot(namespace.deadlines(bucket).as_bytes()),
            "{id}"
        );
        assert_eq!(key_slot(hash.as_bytes()), buckets()[bucket].1);
    }
    // Each bucket its own slot, in its own 64-slot stretch: a cluster's
    // primaries hold buckets in proportion to their slots.
    for (bucket, (_, slot)) in buckets().iter().enumerate() {
        assert_eq!(usize::from(*slot) / 64, bucket);
    }
    // Part of the key layout (DESIGN §4.7): a change here moves every stored context.
    assert_eq!(bucket_of("c1"), 11);
    assert_eq!(
        [&buckets()[0].0, &buckets()[11].0, &buckets()[255].0],
        ["c113", "c10", "c143"]
    );
}
