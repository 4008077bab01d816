//! The one Redis URL form of the context service and the task store
//! (DESIGN §7.8):
//!
//! ```text
//! redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]                    one server
//! rediss://…                                                    the same over TLS
//! redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/SERVICE[/DB][?sentinel_auth=none|same]
//! rediss+sentinel://…                                           TLS to the Sentinels and to the primary
//! redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…][/0]  a Redis Cluster, from any of these nodes
//! rediss+cluster://…                                            the same over TLS to every node
//! ```
//!
//! The `redis` crate has Sentinel support but no URL for it; this form is the
//! one the Python `redis+sentinel://` URL packages and the Lettuce driver
//! (`redis-sentinel://`) share: hosts separated by commas, the service (the
//! `sentinel monitor` name) as the first path segment. Ports default to 6379
//! (servers) and 26379 (Sentinels). Credentials are the data nodes'; the
//! Sentinels are asked without them unless `sentinel_auth=same` (Sentinels
//! protected with the same `requirepass`). Anything else in the query is an
//! error, so a misspelt option is never ignored.
//!
//! The cluster form lists seed nodes the same way (the scheme the Lettuce
//! and go-redis cluster URLs use, `redis+cluster`): any one that answers is
//! enough, the client discovers the rest of the topology from it
//! (`CLUSTER SLOTS`) and follows it. A cluster has database 0 only.

use percent_encoding::percent_decode_str;

const REDIS_PORT: u16 = 6379;
const SENTINEL_PORT: u16 = 26379;

/// A host and port (an IPv6 address without brackets).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Whether the Sentinels get the URL's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SentinelAuth {
    /// Sentinels without `requirepass` (Redis' default).
    #[default]
    None,
    /// Sentinels protected by the same credentials as the data nodes.
    Same,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nodes {
    /// One server, always this address.
    Direct(HostPort),
    /// The primary of `service`, as the Sentinels currently say.
    Sentinel {
        sentinels: Vec<HostPort>,
        service: String,
        auth: SentinelAuth,
    },
    /// A Redis Cluster: these nodes are where discovery starts (any one
    /// reachable suffices); the slots' owners are asked of the cluster.
    Cluster { seeds: Vec<HostPort> },
}

/// A parsed Redis URL. `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    pub nodes: Nodes,
    /// `rediss`: TLS to every node, the server's certificate verified.
    pub tls: bool,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match (&self.nodes, self.tls) {
            (Nodes::Direct(_), false) => "redis",
            (Nodes::Direct(_), true) => "rediss",
            (Nodes::Sentinel { .. }, false) => "redis+sentinel",
            (Nodes::Sentinel { .. }, true) => "rediss+sentinel",
            (Nodes::Cluster { .. }, false) => "redis+cluster",
            (Nodes::Cluster { .. }, true) => "rediss+cluster",
        };
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        match &self.nodes {
            Nodes::Direct(node) => write!(f, "{node}/{}", self.db),
            Nodes::Sentinel {
                sentinels,
                service,
                auth,
            } => {
                let hosts: Vec<String> = sentinels.iter().map(ToString::to_string).collect();
                write!(f, "{}/{service}/{}", hosts.join(","), self.db)?;
                if *auth == SentinelAuth::Same {
                    write!(f, "?sentinel_auth=same")?;
                }
                Ok(())
            }
            Nodes::Cluster { seeds } => {
                let hosts: Vec<String> = seeds.iter().map(ToString::to_string).collect();
                write!(f, "{}", hosts.join(","))
            }
        }
    }
}

impl RedisUrl {
    /// Parses one of the six forms; the message names what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = |why: &str| format!("invalid Redis URL `{}`: {why}", redact(text));
        let (scheme, rest) = text.split_once("://").ok_or_else(|| {
            invalid("expected redis://, rediss://, redis+sentinel://, redis+cluster:// or their TLS forms")
        })?;
        let (form, tls) = match scheme {
            "redis" => (Form::Direct, false),
            "rediss" => (Form::Direct, true),
            "redis+sentinel" => (Form::Sentinel, false),
            "rediss+sentinel" => (Form::Sentinel, true),
            "redis+cluster" => (Form::Cluster, false),
            "rediss+cluster" => (Form::Cluster, true),
            other => {
                return Err(invalid(&format!(
                    "unknown scheme `{other}` (expected redis, rediss, redis+sentinel, rediss+sentinel, \
                     redis+cluster or rediss+cluster)"
                )))
            }
        };
        let sentinel = form == Form::Sentinel;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let decode = |part: &str| {
            percent_decode_str(part)
                .decode_utf8()
                .map(|text| text.into_owned())
                .map_err(|_| invalid("the credentials are not UTF-8 once percent-decoded"))
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => (
                    Some(decode(user)?).filter(|user| !user.is_empty()),
                    Some(decode(password)?),
                ),
                None => (Some(decode(userinfo)?).filter(|user| !user.is_empty()), None),
            },
        };
        let default_port = if sentinel { SENTINEL_PORT } else { REDIS_PORT };
        let nodes: Vec<HostPort> = hosts
            .split(',')
            .map(|host| host_port(host, default_port).map_err(|why| invalid(&why)))
            .collect::<Result<_, _>>()?;
        let segments: Vec<&str> = path.split('/').filter(|segment| !segment.is_empty()).collect();
        let parse_db = |segment: &str| {
            segment
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| invalid(&format!("`{segment}` is not a database number")))
        };
        let mut auth = SentinelAuth::None;
        for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("sentinel_auth", "none")) if sentinel => auth = SentinelAuth::None,
                Some(("sentinel_auth", "same")) if sentinel => auth = SentinelAuth::Same,
                Some(("sentinel_auth", other)) if sentinel => {
                    return Err(invalid(&format!("sentinel_auth is `none` or `same`, not `{other}`")))
                }
                _ => return Err(invalid(&format!("unknown option `{pair}`"))),
            }
        }
        let (nodes, db) = if form == Form::Cluster {
            match segments.as_slice() {
                [] => {}
                [db] => {
                    if parse_db(db)? != 0 {
                        return Err(invalid(&format!(
                            "a Redis Cluster has database 0 only, not {db} (drop the path or write /0)"
                        )));
                    }
                }
                _ => return Err(invalid("a cluster URL has no path beyond /0")),
            }
            (Nodes::Cluster { seeds: nodes }, 0)
        } else if sentinel {
            let (service, db) = match segments.as_slice() {
                [service] => (*service, 0),
                [service, db] => (*service, parse_db(db)?),
                [] => {
                    return Err(invalid(
                        "a Sentinel URL names the service: redis+sentinel://HOST:PORT,…/SERVICE",
                    ))
                }
                _ => return Err(invalid("the path is /SERVICE or /SERVICE/DB")),
            };
            let service = decode(service)?;
            (
                Nodes::Sentinel {
                    sentinels: nodes,
                    service,
                    auth,
                },
                db,
            )
        } else {
            let [node] = <[HostPort; 1]>::try_from(nodes).map_err(|_| {
                invalid(
                    "several hosts need the Sentinel form (redis+sentinel://HOST:PORT,HOST:PORT/SERVICE) \
                     or the cluster form (redis+cluster://HOST:PORT,HOST:PORT)",
                )
            })?;
            let db = match segments.as_slice() {
                [] => 0,
                [db] => parse_db(db)?,
                _ => return Err(invalid("the path is /DB")),
            };
            (Nodes::Direct(node), db)
        };
        Ok(Self {
            nodes,
            tls,
            db,
            username,
            password,
        })
    }

    pub fn is_sentinel(&self) -> bool {
        matches!(self.nodes, Nodes::Sentinel { .. })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.nodes, Nodes::Cluster { .. })
    }
}

/// Which of the URL forms a scheme names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Direct,
    Sentinel,
    Cluster,
}

fn host_port(text: &str, default_port: u16) -> Result<HostPort, String> {
    if text.is_empty() {
        return Err("a host is missing".to_string());
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{text}`: an IPv6 address needs its closing `]`"))?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("`{text}` is not HOST[:PORT]")),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{text}` has no host"));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("`{port}` is not a port"))?,
    };
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
}

/// `text` with the password of its userinfo replaced, for error messages.
pub fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.to_string(),
            port,
        }
    }

    #[test]
    fn the_four_forms_parse() {
        let direct = RedisUrl::parse("redis://127.0.0.1:6380/2").unwrap();
        assert_eq!(direct.nodes, Nodes::Direct(node("127.0.0.1", 6380)));
        assert_eq!((direct.tls, direct.db), (false, 2));

        let tls = RedisUrl::parse("rediss://user:p%40ss@redis.internal").unwrap();
        assert_eq!(tls.nodes, Nodes::Direct(node("redis.internal", 6379)));
        assert!(tls.tls);
        assert_eq!(tls.username.as_deref(), Some("user"));
        assert_eq!(tls.password.as_deref(), Some("p@ss"));

        let sentinel = RedisUrl::parse("redis+sentinel://:secret@s1:26380,s2,[::1]:26381/mymaster/3").unwrap();
        assert_eq!(
            sentinel.nodes,
            Nodes::Sentinel {
                sentinels: vec![node("s1", 26380), node("s2", 26379), node("::1", 26381)],
                service: "mymaster".to_string(),
                auth: SentinelAuth::None,
            }
        );
        assert_eq!((sentinel.tls, sentinel.db), (false, 3));
        assert_eq!(sentinel.username, None);
        assert_eq!(sentinel.password.as_deref(), Some("secret"));

        let both = RedisUrl::parse("rediss+sentinel://a:1,b:2/svc?sentinel_auth=same").unwrap();
        assert!(both.tls && both.is_sentinel());
        assert!(matches!(
            both.nodes,
            Nodes::Sentinel {
                auth: SentinelAuth::Same,
                ..
            }
        ));
    }

    #[test]
    fn the_cluster_forms_parse() {
        let cluster = RedisUrl::parse("redis+cluster://10.0.0.1:7000,10.0.0.2,[::1]:7002").unwrap();
        assert_eq!(
            cluster.nodes,
            Nodes::Cluster {
                seeds: vec![node("10.0.0.1", 7000), node("10.0.0.2", 6379), node("::1", 7002)]
            }
        );
        assert!(cluster.is_cluster() && !cluster.tls && cluster.db == 0);
        let one = RedisUrl::parse("rediss+cluster://app:s3cret@redis.internal:7000/0").unwrap();
        assert!(one.tls && one.is_cluster());
        assert_eq!(
            (one.username.as_deref(), one.password.as_deref()),
            (Some("app"), Some("s3cret"))
        );
        assert_eq!(one.to_string(), "rediss+cluster://app:***@redis.internal:7000");
        assert_eq!(
            RedisUrl::parse(&cluster.to_string()).unwrap(),
            cluster,
            "printed, it parses back"
        );
    }

    #[test]
    fn printing_never_shows_the_password() {
        let url = RedisUrl::parse("rediss+sentinel://app:hunter2@a:1,b:2/svc/1?sentinel_auth=same").unwrap();
        let shown = format!("{url} {url:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(
            url.to_string(),
            "rediss+sentinel://app:***@a:1,b:2/svc/1?sentinel_auth=same"
        );
        assert_eq!(redact("redis://:hunter2@h:1/0"), "redis://:***@h:1/0");
        let error = RedisUrl::parse("redis://:hunter2@h:notaport").unwrap_err();
        assert!(!error.contains("hunter2") && error.contains("notaport"), "{error}");
    }

    #[test]
    fn each_mistake_is_named() {
        let cases = [
            ("http://h:1", "unknown scheme `http`"),
            ("h:6379", "expected redis://"),
            ("redis://a:1,b:2", "several hosts need the Sentinel form"),
            ("redis+sentinel://a:1,b:2", "names the service"),
            ("redis+sentinel://a:1/svc/x", "`x` is not a database number"),
            (
                "redis+sentinel://a:1/svc?sentinel_auth=maybe",
                "sentinel_auth is `none` or `same`",
            ),
            ("redis://h:1?timeout=5", "unknown option `timeout=5`"),
            ("redis://h:0", "`0` is not a port"),
            ("redis://:1", "has no host"),
            ("redis+sentinel://a:1,,b:2/svc", "a host is missing"),
            ("redis://[::1/0", "closing `]`"),
            ("redis://a:1,b:2", "or the cluster form (redis+cluster://"),
            ("redis+cluster://a:1,b:2/3", "database 0 only, not 3"),
            ("redis+cluster://a:1/x", "`x` is not a database number"),
            ("redis+cluster://a:1/0/svc", "no path beyond /0"),
            (
                "redis+cluster://a:1?sentinel_auth=same",
                "unknown option `sentinel_auth=same`",
            ),
            ("redis+cluster://a:1,,b:2", "a host is missing"),
            ("rediss+clusters://a:1", "unknown scheme `rediss+clusters`"),
        ];
        for (url, expected) in cases {
            let error = RedisUrl::parse(url).unwrap_err();
            assert!(error.contains(expected), "{url}: {error}");
        }
    }
}
