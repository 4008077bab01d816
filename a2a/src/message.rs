//! A message's payload: the call a `SendMessage` asks for (one part, checked as an
//! envelope is), read typed for the common shape (`PlainSend`) or from the JSON tree.

use super::*;

/// What a message asks: the checked call; its request and session ids are
/// the ids to answer with ([`call_of`] always sets both).
pub(crate) struct MessageCall {
    pub(crate) checked: envelope::CheckedRequest,
}

/// A refusal before the call: JSON-RPC's code and message, with the stable error when there is one.
pub(crate) struct Refusal {
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) error: Option<RouterError>,
}

impl Refusal {
    /// A refusal answered as the stable error's A2A error (`code` 0: by [`failed`]).
    pub(crate) fn stable(error: RouterError) -> Self {
        Self {
            code: 0,
            message: String::new(),
            error: Some(error),
        }
    }

    pub(crate) fn into_response(self, id: &Value) -> Response {
        match self.error {
            Some(error) if self.code == 0 => failed(id, &error),
            error => reply(StatusCode::OK, rpc_error(id, self.code, &self.message, error.as_ref())),
        }
    }
}

pub(crate) fn invalid(message: impl Into<String>) -> Refusal {
    Refusal {
        code: INVALID_PARAMS,
        message: message.into(),
        error: None,
    }
}

/// The message's parts as the payload ([`payload_of`]), its sender's fields checked.
pub(crate) fn message_call(
    service: &RouterService,
    caller: &Caller,
    capability: &str,
    params: &Value,
    wire: Wire,
) -> Result<MessageCall, Refusal> {
    // Authorised first, as on `/v1/invoke`: a caller learns nothing of capabilities it may not call.
    service
        .admission()
        .authorize(caller, capability)
        .map_err(Refusal::stable)?;
    let Some(message) = params.get("message").filter(|message| message.is_object()) else {
        return Err(invalid("`params.message` (the Message to send) is required"));
    };
    check_sender(message, wire)?;
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if parts.is_empty() {
        return Err(invalid("the message must carry at least one part (the payload)"));
    }
    let Some(offered) = service.offered(capability) else {
        return Err(not_offered(capability));
    };
    let payload = payload_of(parts, wire, capability, &offered.described.input_schema)?;
    let message_id = field(message, "messageId").and_then(Value::as_str);
    let context_id = field(message, "contextId").and_then(Value::as_str);
    call_of(capability, payload, message_id, context_id)
}

/// One part of a message, read as the payload takes it.
enum Piece<'a> {
    Data(&'a Value),
    Text(&'a str),
}

/// A message's parts as the call's payload (DESIGN §8, "A2A"):
/// - one DataPart: its `data`;
/// - TextParts: `{"text": …}`, several joined by a newline, for a
///   capability whose input has a string `text` (else `-32005`);
/// - several DataParts: their objects merged (each must hold an object; a
///   key in two is refused), with the joined text as `text` when TextParts
///   come too;
/// - a file (`url`, `raw`, v0.3's `file`): `-32005`, this agent takes JSON and text.
pub(crate) fn payload_of(parts: &[Value], wire: Wire, capability: &str, input_schema: &str) -> Result<Value, Refusal> {
    let not_supported = || {
        Refusal {
        code: CONTENT_TYPE_NOT_SUPPORTED,
        message: format!(
            "`{capability}` takes DataParts (application/json) and, when its input has a string `text`, TextParts; not files"
        ),
        error: None,
    }
    };
    let mut pieces = Vec::with_capacity(parts.len());
    for part in parts {
        let kind = part.get("kind").and_then(Value::as_str);
        let piece = if let Some(data) = part.get("data").filter(|_| wire == Wire::V1 || kind == Some("data")) {
            Piece::Data(data)
        } else if let Some(text) = part
            .get("text")
            .and_then(Value::as_str)
            .filter(|_| wire == Wire::V1 || kind == Some("text"))
        {
            Piece::Text(text)
        } else {
            return Err(not_supported());
        };
        pieces.push(piece);
    }
    let texts: Vec<&str> = pieces
        .iter()
        .filter_map(|piece| match piece {
            Piece::Text(text) => Some(*text),
            Piece::Data(_) => None,
        })
        .collect();
    let data: Vec<&Value> = pieces
        .iter()
        .filter_map(|piece| match piece {
            Piece::Data(data) => Some(*data),
            Piece::Text(_) => None,
        })
        .collect();
    // Parsed only when text comes: a DataPart (the common call) needs no schema here.
    if !texts.is_empty() && !takes_text(&schema_value(input_schema)) {
        return Err(Refusal {
            code: CONTENT_TYPE_NOT_SUPPORTED,
            message: format!(
                "`{capability}` does not take text: send a DataPart whose data matches its input schema \
                 (on its agent card); a TextPart maps to {{\"text\": …}} only for capabilities whose input has a string `text`"
            ),
            error: None,
        });
    }
    let text = (!texts.is_empty()).then(|| texts.join("\n"));
    match (data.as_slice(), text) {
        ([one], None) => Ok((*one).clone()),
        ([], Some(text)) => Ok(json!({ "text": text })),
        (data, text) => {
            let mut merged = serde_json::Map::new();
            for (index, value) in data.iter().enumerate() {
                let Value::Object(fields) = value else {
                    return Err(invalid(format!(
                        "part {index} of the DataParts holds {}: several parts merge into one object only when each DataPart holds an object",
                        kind_of(value)
                    )));
                };
                for (key, value) in fields {
                    if merged.insert(key.clone(), value.clone()).is_some() {
                        return Err(invalid(format!(
                            "the key `{key}` is in more than one DataPart: parts merge into one object, each key from one part"
                        )));
                    }
                }
            }
            if let Some(text) = text {
                if merged.insert("text".to_string(), json!(text)).is_some() {
                    return Err(invalid(
                        "a DataPart holds `text` and the message carries TextParts too: their joined text is the payload's `text`",
                    ));
                }
            }
            Ok(Value::Object(merged))
        }
    }
}

/// What a JSON value is, for a message.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The role a client's message carries, in each wire (v1.0 also takes the enum's number, as ProtoJSON does).
pub(crate) fn is_user_role(role: &Value, wire: Wire) -> bool {
    match wire {
        Wire::V1 => role == "ROLE_USER" || role == 1,
        Wire::V03 => role == "user",
    }
}

/// The fields every Message must carry (spec §4.1.4: `messageId`, `role`),
/// refused `-32602` naming the field when missing or not what a client sends.
pub(crate) fn check_sender(message: &Value, wire: Wire) -> Result<(), Refusal> {
    if field(message, "messageId")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(invalid(
            "`params.message.messageId` is required: a non-empty string the sender chose (e.g. a UUID)",
        ));
    }
    let user = match wire {
        Wire::V1 => "ROLE_USER",
        Wire::V03 => "user",
    };
    match message.get("role") {
        Some(role) if is_user_role(role, wire) => Ok(()),
        None | Some(Value::Null) => Err(invalid(format!(
            "`params.message.role` is required: `{user}` for a message sent to an agent"
        ))),
        Some(other) => Err(invalid(format!(
            "`params.message.role` is {other}; a message sent to an agent has role `{user}`"
        ))),
    }
}

/// The longest `contextId` taken (it is the call's `session_id`).
pub(crate) const MOST_CONTEXT_ID_BYTES: usize = 256;

/// The checked `/v1/invoke` call a message's payload becomes (its ids, when
/// usable, as the request and session ids; fresh ones otherwise).
pub(crate) fn call_of(
    capability: &str,
    payload: Value,
    message_id: Option<&str>,
    context_id: Option<&str>,
) -> Result<MessageCall, Refusal> {
    // The sender's `messageId` is the request id when it is one (1..=128
    // printable ASCII characters), else the request gets its own.
    let usable = |id: &&str| !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_graphic());
    let request_id = message_id
        .filter(usable)
        .map_or_else(trace::new_request_id, str::to_string);
    // A `contextId` the agent cannot take is refused, never replaced (spec §3.4.1).
    let context_id = match context_id.filter(|id| !id.is_empty()) {
        None => trace::new_request_id(),
        Some(id) if id.len() <= MOST_CONTEXT_ID_BYTES => id.to_string(),
        Some(id) => {
            return Err(invalid(format!(
                "`params.message.contextId` holds {} bytes; a context id (the call's session id) holds at most {MOST_CONTEXT_ID_BYTES}",
                id.len()
            )))
        }
    };
    // The context keeps a conversation on one instance (consistent_hash keys on session_id).
    let checked = envelope::call(capability, payload, request_id, Some(context_id)).map_err(|error| Refusal {
        code: INVALID_PARAMS,
        message: error.message.clone(),
        error: Some(error),
    })?;
    Ok(MessageCall { checked })
}

/// A `SendMessage` (v0.3: `message/send`) of the common shape, read without
/// a JSON tree: a JSON-RPC 2.0 object, no `configuration`, a message object
/// with one DataPart. `None` for anything else, whatever is wrong with it:
/// the general reading then answers it, so both readings agree on every request.
pub(crate) struct PlainSend<'a> {
    pub(crate) id: Value,
    pub(crate) wire: Wire,
    pub(crate) payload: Value,
    pub(crate) message_id: Option<Cow<'a, str>>,
    pub(crate) context_id: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
pub(crate) struct PlainRequest<'a> {
    #[serde(borrow)]
    pub(crate) jsonrpc: Cow<'a, str>,
    pub(crate) id: Value,
    #[serde(borrow)]
    pub(crate) method: Cow<'a, str>,
    #[serde(borrow)]
    pub(crate) params: FromObject<PlainParams<'a>>,
}

#[derive(serde::Deserialize)]
pub(crate) struct PlainParams<'a> {
    #[serde(borrow)]
    pub(crate) message: FromObject<PlainMessage<'a>>,
    /// Anything but `null` asks more than a plain call.
    #[serde(default)]
    pub(crate) configuration: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
pub(crate) struct PlainMessage<'a> {
    #[serde(default, borrow, rename = "messageId")]
    pub(crate) message_id: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "contextId")]
    pub(crate) context_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) role: Option<Cow<'a, str>>,
    /// A message naming a task continues it: never a plain call.
    #[serde(default, rename = "taskId")]
    pub(crate) task_id: Option<serde::de::IgnoredAny>,
    /// ProtoJSON's snake_case names: the general reading takes them.
    #[serde(default, rename = "task_id")]
    pub(crate) task_id_snake: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "message_id")]
    pub(crate) message_id_snake: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "context_id")]
    pub(crate) context_id_snake: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    pub(crate) parts: [FromObject<PlainPart<'a>>; 1],
}

#[derive(serde::Deserialize)]
pub(crate) struct PlainPart<'a> {
    #[serde(default, borrow)]
    pub(crate) kind: Option<Cow<'a, str>>,
    /// Present (`null` too), or absent.
    #[serde(default, deserialize_with = "present")]
    pub(crate) data: Option<Value>,
}

pub(crate) fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    <Value as serde::Deserialize>::deserialize(deserializer).map(Some)
}

/// A struct read from a JSON object only: serde_json would also read one
/// from an array, field by field, which the general reading refuses.
pub(crate) struct FromObject<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for FromObject<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(MapOnly(deserializer)).map(FromObject)
    }
}

/// A deserializer that takes a struct from a map only (see [`FromObject`]).
pub(crate) struct MapOnly<D>(D);

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for MapOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(visitor)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

impl<'a> PlainSend<'a> {
    /// A JSON-RPC `SendMessage` request (v0.3's `message/send` when allowed).
    pub(crate) fn read(bytes: &'a [u8], legacy_allowed: bool) -> Option<Self> {
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let FromObject(request) =
            <FromObject<PlainRequest<'a>> as serde::Deserialize>::deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        let wire = match request.method.as_ref() {
            "SendMessage" => Wire::V1,
            "message/send" if legacy_allowed => Wire::V03,
            _ => return None,
        };
        let rpc = request.jsonrpc == "2.0" && matches!(request.id, Value::String(_) | Value::Number(_));
        Self::of(request.params.0, wire, request.id).filter(|_| rpc)
    }

    /// The REST binding's `message:send` body (the request's parameters, v1.0).
    pub(crate) fn read_rest(bytes: &'a [u8]) -> Option<Self> {
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        let FromObject(params) =
            <FromObject<PlainParams<'a>> as serde::Deserialize>::deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        Self::of(params, Wire::V1, Value::Null)
    }

    /// The plain call `params` ask for: no `configuration`, one DataPart, the
    /// sender's fields as a client sends them, no task named.
    fn of(params: PlainParams<'a>, wire: Wire, id: Value) -> Option<Self> {
        let plain = params.configuration.is_none();
        let PlainMessage {
            message_id,
            context_id,
            role,
            task_id,
            task_id_snake,
            message_id_snake,
            context_id_snake,
            parts: [FromObject(part)],
        } = params.message.0;
        let snake = task_id_snake.is_some() || message_id_snake.is_some() || context_id_snake.is_some();
        // The sender's fields (the general reading refuses their absence).
        let user = match wire {
            Wire::V1 => "ROLE_USER",
            Wire::V03 => "user",
        };
        let sender = message_id.as_deref().is_some_and(|id| !id.is_empty())
            && role.as_deref() == Some(user)
            && task_id.is_none()
            && !snake;
        // v1.0 takes `data` whatever `kind` says; v0.3 a part of kind `data`.
        let data = part
            .data
            .filter(|_| wire == Wire::V1 || part.kind.as_deref() == Some("data"));
        Some(Self {
            id,
            wire,
            payload: data.filter(|_| plain && sender)?,
            message_id,
            context_id,
        })
    }
}

/// [`message_call`] for a [`PlainSend`]: authorised, then the capability
/// looked up, in the order the general reading refuses them.
pub(crate) fn plain_call(
    service: &RouterService,
    caller: &Caller,
    capability: &str,
    payload: Value,
    message_id: Option<Cow<'_, str>>,
    context_id: Option<Cow<'_, str>>,
) -> Result<MessageCall, Refusal> {
    service
        .admission()
        .authorize(caller, capability)
        .map_err(Refusal::stable)?;
    if !service.is_offered(capability) {
        return Err(not_offered(capability));
    }
    call_of(capability, payload, message_id.as_deref(), context_id.as_deref())
}

/// The refusal of a capability no agent offers.
pub(crate) fn not_offered(capability: &str) -> Refusal {
    Refusal::stable(
        RouterError::new(
            Code::CapabilityNotFound,
            format!("no agent offers capability `{capability}`"),
        )
        .with_details(json!({ "capability": capability })),
    )
}

/// A part carrying `value`, in the request's wire shape.
pub(crate) fn data_part(value: Value, wire: Wire) -> Value {
    match wire {
        Wire::V1 => json!({ "data": value }),
        // v0.3's DataPart holds an object.
        Wire::V03 => {
            let data = if value.is_object() {
                value
            } else {
                json!({ "result": value })
            };
            json!({ "kind": "data", "data": data })
        }
    }
}
