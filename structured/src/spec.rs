//! A request's constraint as this crate reads it, free of any transport: the router and the worker
//! convert the public proto's `Constraint` into a [`ConstraintSpec`] at their edge.

/// The language the generated text must stay in, by kind (mirrors the `kind` oneof of the public
/// proto's `Constraint`; borrowed from the request, so a large schema is not copied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintSpec<'a> {
    /// `json_schema`: a JSON Schema document, as text (parsed by the compiler).
    JsonSchema(&'a str),
    /// `json_object`: any JSON object (the schema `{"type": "object"}`).
    JsonObject,
    /// `regex`: the whole output matches it (Rust `regex` syntax).
    Regex(&'a str),
    /// `lark`: a grammar in llguidance's Lark dialect, from rule `start`.
    Lark(&'a str),
    /// `choice`: exactly one of these strings (none may be empty; at least one).
    Choice(&'a [String]),
}
