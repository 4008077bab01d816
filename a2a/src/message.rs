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

/// The message's one part as the payload (a DataPart's data, or a TextPart as `{"text"}`).
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
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let [part] = parts else {
        return Err(invalid(format!(
            "the message must carry exactly one part (the payload); it has {}",
            parts.len()
        )));
    };
    let kind = part.get("kind").and_then(Value::as_str);
    let Some(offered) = service.offered(capability) else {
        return Err(not_offered(capability));
    };
    let text_payload;
    let payload = if let Some(data) = part.get("data").filter(|_| wire == Wire::V1 || kind == Some("data")) {
        data
    } else if let Some(text) = part
        .get("text")
        .and_then(Value::as_str)
        .filter(|_| wire == Wire::V1 || kind == Some("text"))
    {
        // Parsed only for a TextPart: a DataPart (the common call) needs no schema here.
        let input_schema = schema_value(&offered.described.input_schema);
        if !takes_text(&input_schema) {
            return Err(Refusal {
                code: CONTENT_TYPE_NOT_SUPPORTED,
                message: format!(
                    "`{capability}` does not take text: send a DataPart whose data matches its input schema \
                     (on its agent card); a TextPart maps to {{\"text\": …}} only for capabilities whose input has a string `text`"
                ),
                error: None,
            });
        }
        text_payload = json!({ "text": text });
        &text_payload
    } else {
        return Err(Refusal {
            code: CONTENT_TYPE_NOT_SUPPORTED,
            message: format!("`{capability}` takes one DataPart (application/json) or, when its input has a string `text`, one TextPart"),
            error: None,
        });
    };
    let message_id = message.get("messageId").and_then(Value::as_str);
    let context_id = message.get("contextId").and_then(Value::as_str);
    call_of(capability, payload.clone(), message_id, context_id)
}

/// The checked `/v1/invoke` call a message's payload becomes (its ids, when
/// usable, as the request and session ids; fresh ones otherwise).
pub(crate) fn call_of(
    capability: &str,
    payload: Value,
    message_id: Option<&str>,
    context_id: Option<&str>,
) -> Result<MessageCall, Refusal> {
    let usable = |id: &&str| !id.is_empty() && id.len() <= 128;
    let request_id = message_id
        .filter(usable)
        .map_or_else(trace::new_request_id, str::to_string);
    let context_id = context_id
        .filter(usable)
        .map_or_else(trace::new_request_id, str::to_string);
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
        let plain = request.jsonrpc == "2.0"
            && matches!(request.id, Value::String(_) | Value::Number(_))
            && request.params.0.configuration.is_none();
        let PlainMessage {
            message_id,
            context_id,
            parts: [FromObject(part)],
        } = request.params.0.message.0;
        // v1.0 takes `data` whatever `kind` says; v0.3 a part of kind `data`.
        let data = part
            .data
            .filter(|_| wire == Wire::V1 || part.kind.as_deref() == Some("data"));
        Some(Self {
            id: request.id,
            wire,
            payload: data.filter(|_| plain)?,
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
