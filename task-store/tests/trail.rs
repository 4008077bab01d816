//! The trail's layout (issue 37) on a real Redis and a real Redis Cluster:
//! a batch is one segment written with its head and indexes in one script,
//! every index finds its records (a request named in several batches
//! included), a chain reads back page by page from the middle of a
//! segment, and a batch written again (a retry after a lost answer) writes
//! nothing twice (a generated request id's bucket may list a record twice:
//! a lookup still names it once).

use std::time::Duration;

use agent_reach_task_store::{StoreConfig, TaskStore};
use agent_reach_trail::{Batch, Index, Sealed, Stored, StoredHead, TrailStore};

/// A stream entry as `XRANGE` answers it: its id and its fields, values as bytes.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

const ROUTER: &str = "r1";

fn sealed(ms: u64, seq: u64, request: &str, session: Option<&str>, input: bool) -> Sealed {
    Sealed {
        seq,
        stored: Stored {
            id: format!("{ms}-{seq}"),
            body: format!(r#"{{"seq":{seq},"request_id":"{request}"}}"#),
            hash: format!("h{seq}"),
        },
        request_id: request.to_string(),
        session_id: session.map(str::to_string),
        run_id: None,
        input_of: input.then(|| "order.query".to_string()),
    }
}

fn hashes(records: Vec<Stored>) -> Vec<String> {
    records.into_iter().map(|stored| stored.hash).collect()
}

fn batch(ms: u64, segment: u64, records: Vec<Sealed>) -> Batch {
    Batch {
        router: ROUTER.to_string(),
        records,
        head: StoredHead {
            id: format!("{ms}-{segment}"),
            jws: format!("head-{segment}"),
        },
        at_ms: ms,
    }
}

/// A connection of the test's own to a single Redis.
async fn direct_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// `single`: one Redis (the test then writes to it directly).
async fn batches_land_once(url: &str, single: bool) {
    let store = TaskStore::new(url, &StoreConfig::default()).expect("store");
    let retention = Duration::from_secs(3600);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let first = batch(
        now,
        1,
        vec![
            sealed(now, 1, "req-a", Some("sess-1"), true),
            sealed(now, 2, "req-b", Some("sess-1"), false),
            // A second record of one request (its retry on another attempt).
            sealed(now, 3, "req-a", None, false),
        ],
    );
    store.append(&first, retention).await.expect("append");
    // The answer was lost and the writer tries again: nothing twice.
    store.append(&first, retention).await.expect("append again");
    let second = batch(now + 5, 2, vec![sealed(now + 5, 4, "req-c", Some("sess-1"), true)]);
    store.append(&second, retention).await.expect("append the next batch");

    // A request named again in a later batch (a task's delivery after its
    // 202), written after a failure that left only its segment stored: the
    // retry completes it and stores the segment once. The segment stored
    // there is plain text (field `s`), as segments were before they were
    // compressed: it reads back beside the compressed ones.
    let third = batch(now + 9, 3, vec![sealed(now + 9, 5, "req-a", None, false)]);
    let mut direct = None;
    if single {
        let mut connection = direct_connection(url).await;
        let keys = keys(&mut connection, "*trail:*:segments").await;
        let _: String = redis::cmd("XADD")
            .arg(&keys[0])
            .arg(third.segment_id())
            .arg("s")
            .arg(agent_reach_trail::segment::encode(&third.records))
            .query_async(&mut connection)
            .await
            .unwrap();
        direct = Some((connection, keys[0].clone()));
    }
    store.append(&third, retention).await.expect("append the third batch");
    // One stream entry per segment, however many records and retries.
    if let Some((mut connection, key)) = direct {
        let entries: u64 = redis::cmd("XLEN").arg(&key).query_async(&mut connection).await.unwrap();
        assert_eq!(entries, 3);
        // The store's own segments are compressed (`z`), its text inside.
        let stored: Vec<StreamEntry> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .unwrap();
        let fields: Vec<&str> = stored.iter().map(|(_, fields)| fields[0].0.as_str()).collect();
        assert_eq!(fields, ["z", "z", "s"]);
        assert_eq!(
            agent_reach_trail::segment::decompress(&stored[0].1[0].1).unwrap(),
            agent_reach_trail::segment::encode(&first.records)
        );
    }

    let records = store.chain_records(ROUTER, None, 4).await.unwrap();
    let ids: Vec<&str> = records.iter().map(|stored| stored.id.as_str()).collect();
    let expected = [
        format!("{now}-1"),
        format!("{now}-2"),
        format!("{now}-3"),
        format!("{}-4", now + 5),
    ];
    assert_eq!(ids, expected.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(records[1].hash, "h2");
    assert_eq!(records[1].body, r#"{"seq":2,"request_id":"req-b"}"#);
    // Paging from the middle of a segment, and newest first since a time.
    let page = hashes(store.chain_records(ROUTER, Some(&format!("{now}-2")), 2).await.unwrap());
    assert_eq!(page, ["h3", "h4"]);
    let since = hashes(store.chain_records_since(ROUTER, now + 1, 10).await.unwrap());
    assert_eq!(since, ["h5", "h4"]);
    let heads = store.chain_heads(ROUTER, None, 10).await.unwrap();
    assert_eq!(
        heads.iter().map(|head| head.jws.as_str()).collect::<Vec<_>>(),
        ["head-1", "head-2", "head-3"]
    );

    let of = |index: Index| {
        let store = &store;
        async move {
            store
                .records_of(&index, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|stored| stored.hash)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(of(Index::Request("req-a".into())).await, ["h1", "h3", "h5"]);
    assert_eq!(of(Index::Request("req-c".into())).await, ["h4"]);
    assert_eq!(of(Index::Session("sess-1".into())).await, ["h1", "h2", "h4"]);
    assert!(of(Index::Run("none".into())).await.is_empty());
    let inputs: Vec<String> = store
        .recent_with_input("order.query", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|stored| stored.hash)
        .collect();
    let mut inputs = inputs;
    inputs.sort();
    assert_eq!(inputs, ["h1", "h4"]);
    assert_eq!(store.chains().await.unwrap()[0].router, ROUTER);

    // Generated request ids (their time in front) are listed in their
    // time's bucket, with no field in the hour's hash; an id of that shape
    // whose time is implausible (a day ahead, or older than the retention)
    // is a field like any other. A batch written twice lists its records
    // twice: a lookup names each once.
    let generated = format!("{:012x}0123456789abcdef", now - 2_000);
    let ahead = format!("{:012x}fedcba9876543210", now + 86_400_000);
    let old = format!("{:012x}00112233445566ff", now - 2 * 3_600_000);
    let fourth = batch(
        now + 12,
        4,
        vec![
            sealed(now + 12, 6, &generated, None, false),
            sealed(now + 12, 7, &ahead, None, false),
            sealed(now + 12, 8, &old, None, false),
        ],
    );
    store.append(&fourth, retention).await.expect("append the fourth batch");
    store.append(&fourth, retention).await.expect("append it again");
    let fifth = batch(now + 15, 5, vec![sealed(now + 15, 9, &generated, None, false)]);
    store.append(&fifth, retention).await.expect("append the fifth batch");
    assert_eq!(of(Index::Request(generated.clone())).await, ["h6", "h9"]);
    assert_eq!(of(Index::Request(ahead.clone())).await, ["h7"]);
    assert_eq!(of(Index::Request(old.clone())).await, ["h8"]);
    if single {
        let mut connection = direct_connection(url).await;
        let (mut named, mut named_old) = (0, 0);
        for key in keys(&mut connection, "*trail:*:ix:request:*").await {
            if key.ends_with(":hours") {
                continue;
            }
            let fields: Vec<String> = redis::cmd("HKEYS")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .unwrap();
            assert!(!fields.contains(&generated), "{key} names {generated}");
            named += usize::from(fields.contains(&ahead));
            named_old += usize::from(fields.contains(&old));
        }
        assert_eq!(named, 1, "the id a day ahead is a field of the hour's hash");
        assert_eq!(
            named_old, 1,
            "the id older than the retention is a field of the hour's hash"
        );
        let bucket = (now - 2_000) / 1_000 * 1_000;
        let buckets = keys(&mut connection, &format!("*trail:*:ix:rq:{bucket}")).await;
        assert_eq!(buckets.len(), 1);
        let ttl: i64 = redis::cmd("TTL")
            .arg(&buckets[0])
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(ttl > 3600, "a bucket outlives the records it lists: {ttl}");
        // Redis forgot the script (a restart): the next batch loads it again.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut connection)
            .await
            .unwrap();
        let sixth = batch(now + 20, 6, vec![sealed(now + 20, 10, "req-d", None, false)]);
        store
            .append(&sixth, retention)
            .await
            .expect("append after a script flush");
        assert_eq!(store.chain_heads(ROUTER, None, 10).await.unwrap().len(), 6);
        assert_eq!(of(Index::Request("req-d".into())).await, ["h10"]);
        // A compressed segment edited in Redis so that it no longer reads
        // back: its records are missing (the chain's verifier names them),
        // and reading the chain past it still works.
        let _: String = redis::cmd("XADD")
            .arg(&keys(&mut connection, "*trail:*:segments").await[0])
            .arg(format!("{}-12", now + 25))
            .arg("z")
            .arg(&b"\x40\x00\x00\x00not an lz4 block"[..])
            .query_async(&mut connection)
            .await
            .unwrap();
        let seventh = batch(now + 30, 8, vec![sealed(now + 30, 13, "req-e", None, false)]);
        store
            .append(&seventh, retention)
            .await
            .expect("append past the edited segment");
        let after = hashes(
            store
                .chain_records(ROUTER, Some(&format!("{}-10", now + 20)), 10)
                .await
                .unwrap(),
        );
        assert_eq!(after, ["h13"]);
    }
}

/// The keys matching `pattern`.
async fn keys(connection: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS").arg(pattern).query_async(connection).await.unwrap()
}

#[tokio::test]
async fn a_batch_lands_once_with_its_indexes_on_one_redis() {
    let redis = agent_reach_testkit::Redis::start();
    batches_land_once(&redis.url(), true).await;
}

#[tokio::test]
async fn a_batch_lands_once_with_its_indexes_on_a_redis_cluster() {
    let cluster = agent_reach_testkit::RedisCluster::start();
    batches_land_once(&cluster.url(), false).await;
}
