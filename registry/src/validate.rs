//! Turns a registration request into a checked [`Registration`], or the first
//! problem found with its stable code and the field at fault.

use std::collections::{BTreeMap, HashSet};

use agent_reach_access::acl::{check_agent_name, check_dotted};
use agent_reach_proto::http::{CapabilitySpec, RegisterRequest};
use serde_json::Value;

use crate::error::{Code, RegistryError};
use crate::model::{Capability, Status};

const MAX_AGENT_ID_LEN: usize = 128;
const MAX_CAPABILITIES: usize = 64;
const MAX_TAGS: usize = 64;
const MAX_TAG_KEY_LEN: usize = 63;
const MAX_TAG_VALUE_LEN: usize = 256;
const MAX_DESCRIPTION_LEN: usize = 4096;
const MAX_CAPABILITY_TIMEOUT_MS: u64 = 3_600_000;
pub const MAX_WEIGHT: u32 = 1000;

/// Bounds configured per registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlBounds {
    pub min_s: u32,
    pub max_s: u32,
    pub default_s: u32,
}

impl Default for TtlBounds {
    fn default() -> Self {
        Self {
            min_s: 3,
            max_s: 300,
            default_s: 15,
        }
    }
}

/// How much one registration may carry in schemas (DESIGN §2.2): bounded so
/// that the largest registration allowed fits one Watch page and one message
/// every watcher decodes (the registry also caps the body, `--max-body-bytes`,
/// and the capabilities, 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaBounds {
    /// Largest input or output schema, as compact JSON, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of objects and arrays in one schema.
    pub max_depth: usize,
}

impl Default for SchemaBounds {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_SCHEMA_BYTES,
            max_depth: DEFAULT_MAX_SCHEMA_DEPTH,
        }
    }
}

/// `--max-schema-bytes`' default: 768 KiB.
pub const DEFAULT_MAX_SCHEMA_BYTES: usize = 768 * 1024;
/// `--max-schema-depth`' default.
pub const DEFAULT_MAX_SCHEMA_DEPTH: usize = 64;

/// What a registration is checked against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    pub ttl: TtlBounds,
    pub schema: SchemaBounds,
}

/// A registration that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub agent_id: String,
    pub name: String,
    pub endpoint: String,
    pub protocol: String,
    pub weight: u32,
    pub tags: BTreeMap<String, String>,
    pub ttl_s: u32,
    pub status: Status,
    pub capabilities: Vec<Capability>,
}

pub fn registration(request: RegisterRequest, bounds: Bounds) -> Result<Registration, RegistryError> {
    let ttl = bounds.ttl;
    agent_id(&request.agent_id)?;
    check_agent_name(&request.name).map_err(|why| {
        RegistryError::field(
            Code::InvalidName,
            "name",
            format!("agent name `{}`: {why}", request.name),
        )
    })?;
    endpoint(&request.endpoint)?;
    let protocol = request.protocol.unwrap_or_else(|| "http".to_string());
    if protocol != "http" {
        return Err(RegistryError::field(
            Code::InvalidProtocol,
            "protocol",
            format!("protocol `{protocol}` is not supported; use `http`"),
        ));
    }
    let weight = request.weight.unwrap_or(1);
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(RegistryError::field(
            Code::InvalidWeight,
            "weight",
            format!("weight {weight} is outside 1..={MAX_WEIGHT}"),
        ));
    }
    let ttl_s = request.ttl_s.unwrap_or(ttl.default_s);
    if !(ttl.min_s..=ttl.max_s).contains(&ttl_s) {
        return Err(RegistryError::field(
            Code::InvalidTtl,
            "ttl_s",
            format!(
                "ttl_s {ttl_s} is outside this registry's bounds {}..={}",
                ttl.min_s, ttl.max_s
            ),
        ));
    }
    let status = match request.status.as_deref() {
        None => Status::Starting,
        Some(text) => status(text, "status")?,
    };
    if status == Status::Draining {
        return Err(RegistryError::field(
            Code::InvalidStatus,
            "status",
            "an instance cannot register as `draining`",
        ));
    }
    tags(&request.tags)?;
    let capabilities = capabilities(request.capabilities, bounds.schema)?;
    Ok(Registration {
        agent_id: request.agent_id,
        name: request.name,
        endpoint: request.endpoint,
        protocol,
        weight,
        tags: request.tags,
        ttl_s,
        status,
        capabilities,
    })
}

pub fn agent_id(agent_id: &str) -> Result<(), RegistryError> {
    let valid = !agent_id.is_empty()
        && agent_id.len() <= MAX_AGENT_ID_LEN
        && agent_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && agent_id != "."
        && agent_id != "..";
    if valid {
        Ok(())
    } else {
        Err(RegistryError::field(
            Code::InvalidAgentId,
            "agent_id",
            format!("agent_id `{agent_id}` must be 1..={MAX_AGENT_ID_LEN} characters of A-Z, a-z, 0-9, `-`, `_`, `.`"),
        ))
    }
}

pub fn status(text: &str, field: &str) -> Result<Status, RegistryError> {
    Status::parse(text).map_err(|_| {
        RegistryError::field(
            Code::InvalidStatus,
            field,
            format!("status `{text}` is not one of starting, ready, busy, overloaded, draining"),
        )
    })
}

fn endpoint(endpoint: &str) -> Result<(), RegistryError> {
    let invalid = |why: String| RegistryError::field(Code::InvalidEndpoint, "endpoint", why);
    let url =
        url::Url::parse(endpoint).map_err(|error| invalid(format!("endpoint `{endpoint}` is not a URL: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "endpoint scheme `{}` must be http or https",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(format!("endpoint `{endpoint}` has no host")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // The registry is readable by every authenticated caller: no secrets in it.
        return Err(invalid("endpoint must not embed credentials".to_string()));
    }
    Ok(())
}

fn tags(tags: &BTreeMap<String, String>) -> Result<(), RegistryError> {
    if tags.len() > MAX_TAGS {
        return Err(RegistryError::field(
            Code::InvalidTags,
            "tags",
            format!("{} tags; at most {MAX_TAGS} are allowed", tags.len()),
        ));
    }
    for (key, value) in tags {
        let key_ok = !key.is_empty()
            && key.len() <= MAX_TAG_KEY_LEN
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !key_ok || value.len() > MAX_TAG_VALUE_LEN {
            return Err(RegistryError::field(
                Code::InvalidTags,
                format!("tags.{key}"),
                format!(
                    "tag keys are 1..={MAX_TAG_KEY_LEN} characters of A-Z, a-z, 0-9, `-_./`; values at most {MAX_TAG_VALUE_LEN} bytes"
                ),
            ));
        }
    }
    Ok(())
}

fn capabilities(specs: Vec<CapabilitySpec>, bounds: SchemaBounds) -> Result<Vec<Capability>, RegistryError> {
    if specs.is_empty() {
        return Err(RegistryError::field(
            Code::NoCapabilities,
            "capabilities",
            "an instance must offer at least one capability",
        ));
    }
    if specs.len() > MAX_CAPABILITIES {
        return Err(RegistryError::field(
            Code::NoCapabilities,
            "capabilities",
            format!("{} capabilities; at most {MAX_CAPABILITIES} per instance", specs.len()),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for (index, spec) in specs.into_iter().enumerate() {
        let at = |field: &str| format!("capabilities[{index}].{field}");
        check_dotted(&spec.name).map_err(|why| {
            RegistryError::field(
                Code::InvalidCapabilityName,
                at("name"),
                format!("capability name `{}`: {why}", spec.name),
            )
        })?;
        let version = semver::Version::parse(&spec.version).map_err(|error| {
            RegistryError::field(
                Code::InvalidVersion,
                at("version"),
                format!("version `{}` is not semver (e.g. 1.2.0): {error}", spec.version),
            )
        })?;
        if !seen.insert((spec.name.clone(), version.clone())) {
            return Err(RegistryError::field(
                Code::DuplicateCapability,
                at("name"),
                format!("capability `{}` version {version} is listed twice", spec.name),
            ));
        }
        let description = spec.description.unwrap_or_default();
        if description.len() > MAX_DESCRIPTION_LEN {
            return Err(RegistryError::field(
                Code::InvalidFieldType,
                at("description"),
                format!(
                    "description is {} bytes; at most {MAX_DESCRIPTION_LEN}",
                    description.len()
                ),
            ));
        }
        if let Some(schema) = &spec.input_schema {
            json_schema(schema, &at("input_schema"), bounds)?;
        }
        if let Some(schema) = &spec.output_schema {
            json_schema(schema, &at("output_schema"), bounds)?;
        }
        if let Some(timeout) = spec.timeout_ms {
            if !(1..=MAX_CAPABILITY_TIMEOUT_MS).contains(&timeout) {
                return Err(RegistryError::field(
                    Code::InvalidTimeout,
                    at("timeout_ms"),
                    format!("timeout_ms {timeout} is outside 1..={MAX_CAPABILITY_TIMEOUT_MS}"),
                ));
            }
        }
        out.push(Capability {
            name: spec.name,
            version,
            description,
            input_schema: spec.input_schema,
            output_schema: spec.output_schema,
            timeout_ms: spec.timeout_ms,
            check_output: spec.check_output.unwrap_or(true),
            preemptible: spec.preemptible.unwrap_or(false),
        });
    }
    Ok(out)
}

/// A schema must be within the bounds, valid against the draft 2020-12
/// meta-schema *and* compile (regexes, local `$ref`s); remote `$ref`s are not
/// fetched and so rejected.
fn json_schema(schema: &Value, field: &str, bounds: SchemaBounds) -> Result<(), RegistryError> {
    let invalid = |why: String| RegistryError::field(Code::InvalidSchema, field, why);
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(invalid("a JSON Schema must be an object or a boolean".to_string()));
    }
    // Depth first: it bounds the recursion of everything after it.
    let depth = depth(schema, bounds.max_depth);
    if depth > bounds.max_depth {
        return Err(RegistryError::field(
            Code::SchemaTooDeep,
            field,
            format!(
                "schema nests objects and arrays more than {} deep (--max-schema-depth)",
                bounds.max_depth
            ),
        ));
    }
    let size = compact_len(schema);
    if size > bounds.max_bytes {
        return Err(RegistryError::field(
            Code::SchemaTooLarge,
            field,
            format!(
                "schema is {size} bytes as compact JSON; at most {} (--max-schema-bytes)",
                bounds.max_bytes
            ),
        )
        .with_details(serde_json::json!({ "bytes": size, "limit": bounds.max_bytes })));
    }
    jsonschema::draft202012::meta::validate(schema).map_err(|error| {
        invalid(format!(
            "not a valid JSON Schema (draft 2020-12): {error} at `{}`",
            error.instance_path()
        ))
    })?;
    jsonschema::draft202012::new(schema).map_err(|error| invalid(format!("schema does not compile: {error}")))?;
    Ok(())
}

/// How deeply `value` nests objects and arrays (a scalar is 0), counted no
/// further than one past `most`.
fn depth(value: &Value, most: usize) -> usize {
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Object(map) => Box::new(map.values()),
        Value::Array(items) => Box::new(items.iter()),
        _ => return 0,
    };
    if most == 0 {
        return 1;
    }
    1 + children.map(|child| depth(child, most - 1)).max().unwrap_or(0)
}

/// The length of `value` as compact JSON, without writing it anywhere.
fn compact_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use agent_reach_errors::ErrorCode as _;

    use super::*;
    use serde_json::json;

    fn valid() -> RegisterRequest {
        serde_json::from_value(json!({
            "agent_id": "order_query-1", "name": "order_query", "endpoint": "http://127.0.0.1:9000/invoke",
            "capabilities": [{"name": "order.query", "version": "1.2.0",
                "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}}}]
        }))
        .unwrap()
    }

    fn code_of(mutate: impl FnOnce(&mut RegisterRequest)) -> (&'static str, Option<String>) {
        let mut request = valid();
        mutate(&mut request);
        let error = registration(request, Bounds::default()).unwrap_err();
        (error.code.as_str(), error.field)
    }

    #[test]
    fn accepts_a_valid_registration_with_defaults() {
        let registration = registration(valid(), Bounds::default()).unwrap();
        assert_eq!(registration.weight, 1);
        assert_eq!(registration.ttl_s, 15);
        assert_eq!(registration.status, Status::Starting);
    }

    #[test]
    fn each_problem_has_its_code_and_field() {
        assert_eq!(code_of(|r| r.agent_id = "a/b".into()).0, "INVALID_AGENT_ID");
        assert_eq!(code_of(|r| r.name = "Order".into()).0, "INVALID_NAME");
        assert_eq!(code_of(|r| r.endpoint = "ftp://x".into()).0, "INVALID_ENDPOINT");
        assert_eq!(code_of(|r| r.endpoint = "http://u:p@x".into()).0, "INVALID_ENDPOINT");
        assert_eq!(code_of(|r| r.weight = Some(0)).0, "INVALID_WEIGHT");
        assert_eq!(code_of(|r| r.weight = Some(1001)).0, "INVALID_WEIGHT");
        assert_eq!(code_of(|r| r.ttl_s = Some(1)).0, "INVALID_TTL");
        assert_eq!(code_of(|r| r.status = Some("zombie".into())).0, "INVALID_STATUS");
        assert_eq!(code_of(|r| r.capabilities.clear()).0, "NO_CAPABILITIES");
        assert_eq!(
            code_of(|r| r.capabilities[0].name = "Order.Query".into()),
            ("INVALID_CAPABILITY_NAME", Some("capabilities[0].name".into()))
        );
        assert_eq!(
            code_of(|r| r.capabilities[0].version = "1.2".into()).0,
            "INVALID_VERSION"
        );
        assert_eq!(
            code_of(|r| r.capabilities[0].input_schema = Some(json!({"type": "strnig"}))),
            ("INVALID_SCHEMA", Some("capabilities[0].input_schema".into()))
        );
        assert_eq!(
            code_of(|r| r.capabilities[0].output_schema = Some(json!({"pattern": "(unclosed"}))).0,
            "INVALID_SCHEMA"
        );
        assert_eq!(code_of(|r| r.capabilities[0].timeout_ms = Some(0)).0, "INVALID_TIMEOUT");
        assert_eq!(
            code_of(|r| {
                let copy = r.capabilities[0].clone();
                r.capabilities.push(copy);
            }),
            ("DUPLICATE_CAPABILITY", Some("capabilities[1].name".into()))
        );
    }

    #[test]
    fn schemas_are_bounded_in_size_and_depth() {
        // A wide schema just under the size bound is accepted, one byte over is not.
        let wide = |properties: usize| {
            let properties: serde_json::Map<String, Value> = (0..properties)
                .map(|index| (format!("field_{index:06}"), json!({"type": "string"})))
                .collect();
            json!({"type": "object", "properties": properties})
        };
        let bounds = Bounds {
            schema: SchemaBounds {
                max_bytes: 4096,
                max_depth: 8,
            },
            ..Bounds::default()
        };
        let fits = (1..200)
            .rev()
            .map(wide)
            .find(|schema| compact_len(schema) <= 4096)
            .unwrap();
        assert_eq!(compact_len(&fits), serde_json::to_vec(&fits).unwrap().len());
        let mut request = valid();
        request.capabilities[0].input_schema = Some(fits.clone());
        registration(request, bounds).unwrap();
        let over = wide(fits["properties"].as_object().unwrap().len() + 1);
        let mut request = valid();
        request.capabilities[0].output_schema = Some(over);
        let error = registration(request, bounds).unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.field.as_deref()),
            ("SCHEMA_TOO_LARGE", Some("capabilities[0].output_schema"))
        );
        assert_eq!(error.code.http_status(), http::StatusCode::PAYLOAD_TOO_LARGE);

        // Eight levels pass, nine do not (and the count stops early).
        let nested = |levels: usize| (0..levels).fold(json!({"type": "string"}), |inner, _| json!({"not": inner}));
        assert_eq!(depth(&nested(8), 8), 9);
        assert_eq!(depth(&nested(1000), 8), 9);
        let mut request = valid();
        request.capabilities[0].input_schema = Some(nested(7));
        registration(request, bounds).unwrap();
        let mut request = valid();
        request.capabilities[0].input_schema = Some(nested(8));
        let error = registration(request, bounds).unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.field.as_deref()),
            ("SCHEMA_TOO_DEEP", Some("capabilities[0].input_schema"))
        );
    }

    #[test]
    fn local_refs_compile_and_remote_refs_are_refused_unfetched() {
        let mut request = valid();
        request.capabilities[0].input_schema = Some(json!({
            "$defs": {"id": {"type": "string"}},
            "type": "object",
            "properties": {"order_id": {"$ref": "#/$defs/id"}}
        }));
        registration(request, Bounds::default()).unwrap();
        // jsonschema is built without its HTTP and file resolvers: a remote
        // document is never fetched, so the schema does not compile.
        let mut request = valid();
        request.capabilities[0].input_schema = Some(json!({"$ref": "https://schemas.example.invalid/order.json"}));
        let error = registration(request, Bounds::default()).unwrap_err();
        assert_eq!(error.code.as_str(), "INVALID_SCHEMA");
        assert_eq!(error.field.as_deref(), Some("capabilities[0].input_schema"));
        assert!(error.message.contains("does not compile"), "{}", error.message);
    }
}
