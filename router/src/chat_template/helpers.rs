//! The functions and filters real chat templates call, as `transformers` provides them:
//! `raise_exception`, `strftime_now` and a Python-compatible `tojson`.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The error message with its cause chain and template location.
pub(super) fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// `raise_exception(message)`: aborts rendering with `message`.
pub(super) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `value | tojson(indent=None, sort_keys=False)` with Python
/// `json.dumps(ensure_ascii=False)` output: `", "` and `": "` separators
/// without indent, `","` and newline + indent with it; strings are not
/// HTML-escaped (unlike minijinja's own `tojson`).
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, &value, indent, sort_keys.unwrap_or(false), 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    v: &Value,
    indent: Option<usize>,
    sort: bool,
    level: usize,
) -> Result<(), Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let json = serde_json::to_string(v)
                .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
            out.push_str(&json);
        }
        ValueKind::String => {
            out.push_str(&serde_json::Value::from(v.as_str().unwrap_or_default()).to_string())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                write_json(out, item, indent, sort, level + 1)?;
            }
            if !items.is_empty() {
                newline(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                let key_text = key.as_str().map_or_else(|| key.to_string(), str::to_string);
                out.push_str(&serde_json::Value::from(key_text).to_string());
                out.push_str(": ");
                write_json(out, &v.get_item(key)?, indent, sort, level + 1)?;
            }
            if !keys.is_empty() {
                newline(out, level);
            }
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::BadSerialization,
                format!("cannot convert {} to JSON", v.kind()),
            ))
        }
    }
    Ok(())
}

/// `strftime_now(format)`: the local time now, formatted with Python `strftime` directives
/// (`"%d %b %Y"` gives `"26 Jul 2024"`; Llama 3.1's template calls it for its date line).
pub(super) fn strftime_now(format: String) -> Result<Value, Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}
