//! Kind-specific details of an object, as ordered key/value pairs: what
//! [`Object::describe`](crate::Object::describe) fills in for a snapshot
//! ([`crate::snapshot`]).
//!
//! A leaf module (it knows only handles), so the object trait and the
//! snapshot's plain values can both use it without importing each other.

use std::fmt;

use crate::handle::RawHandle;

/// One detail's value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Value {
    /// A count or number, printed in decimal (a JSON number).
    Num(u64),
    /// An id printed in hex (`0x1a2b`): comm ids, service ids, keys. A JSON
    /// string, so that 64-bit ids survive JSON readers that use doubles.
    Hex(u64),
    /// A word or address (`RTS`, `127.0.0.2`).
    Text(String),
    /// Another object, by handle (`QP#3g0`).
    Handle(RawHandle),
    /// A yes/no detail.
    Flag(bool),
}

impl Value {
    /// The number of a [`Value::Num`] or [`Value::Hex`].
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Num(n) | Value::Hex(n) => Some(n),
            _ => None,
        }
    }

    /// The text of a [`Value::Text`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The handle of a [`Value::Handle`].
    pub fn as_handle(&self) -> Option<RawHandle> {
        match *self {
            Value::Handle(h) => Some(h),
            _ => None,
        }
    }

    /// The value as JSON (numbers bare, everything else a string but flags).
    pub fn to_json(&self) -> String {
        match self {
            Value::Num(n) => n.to_string(),
            Value::Flag(b) => b.to_string(),
            other => format!("\"{}\"", json_escape(&other.to_string())),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Num(n) => write!(f, "{n}"),
            Value::Hex(n) => write!(f, "{n:#x}"),
            Value::Text(s) => f.write_str(s),
            Value::Handle(h) => write!(f, "{h}"),
            Value::Flag(b) => f.write_str(if *b { "yes" } else { "no" }),
        }
    }
}

/// Kind-specific details, in the order they were added. Keys are short
/// lower-case words joined by `-` (`lqpn`, `lcomm-id`), as `rdma res show`
/// prints them; a key is meant to appear once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attrs(Vec<(&'static str, Value)>);

impl Attrs {
    /// No details.
    pub fn new() -> Attrs {
        Attrs::default()
    }

    /// Add any value.
    pub fn push(&mut self, key: &'static str, value: Value) -> &mut Self {
        self.0.push((key, value));
        self
    }

    /// Add a decimal number.
    pub fn num(&mut self, key: &'static str, n: impl Into<u64>) -> &mut Self {
        self.push(key, Value::Num(n.into()))
    }

    /// Add an id shown in hex.
    pub fn hex(&mut self, key: &'static str, n: impl Into<u64>) -> &mut Self {
        self.push(key, Value::Hex(n.into()))
    }

    /// Add a word or address.
    pub fn text(&mut self, key: &'static str, s: impl Into<String>) -> &mut Self {
        self.push(key, Value::Text(s.into()))
    }

    /// Add another object's handle.
    pub fn handle(&mut self, key: &'static str, h: RawHandle) -> &mut Self {
        self.push(key, Value::Handle(h))
    }

    /// Add a yes/no detail.
    pub fn flag(&mut self, key: &'static str, b: bool) -> &mut Self {
        self.push(key, Value::Flag(b))
    }

    /// The first value under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Every detail, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Value)> + '_ {
        self.0.iter().map(|(k, v)| (*k, v))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The details as one JSON object.
    pub fn to_json(&self) -> String {
        let fields: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("\"{}\":{}", json_escape(k), v.to_json()))
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

/// `key value key value ...`, as `rdma res show` prints details.
impl fmt::Display for Attrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i != 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k} {v}")?;
        }
        Ok(())
    }
}

/// `s` as the inside of a JSON string.
pub(crate) fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::Kind;

    #[test]
    fn text_and_json_keep_order_and_types() {
        let mut a = Attrs::new();
        a.num("lqpn", 12u32)
            .text("state", "RTS")
            .hex("lcomm-id", 0xabcdu32)
            .handle("qp", RawHandle::new(Kind::QP, 1, 3))
            .flag("bound", true)
            .text("odd", "a\"b\\c\n");
        assert_eq!(
            a.to_string(),
            "lqpn 12 state RTS lcomm-id 0xabcd qp QP#3g1 bound yes odd a\"b\\c\n"
        );
        assert_eq!(
            a.to_json(),
            "{\"lqpn\":12,\"state\":\"RTS\",\"lcomm-id\":\"0xabcd\",\"qp\":\"QP#3g1\",\
             \"bound\":true,\"odd\":\"a\\\"b\\\\c\\u000a\"}"
        );
        assert_eq!(a.get("lcomm-id").and_then(Value::as_u64), Some(0xabcd));
        assert_eq!(a.get("state").and_then(Value::as_str), Some("RTS"));
        assert_eq!(a.get("missing"), None);
    }
}
