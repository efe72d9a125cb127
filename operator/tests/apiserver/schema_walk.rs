//! Walks over a CRD's structural schema (as JSON), alone or beside a value written under it: the one place that
//! knows how a schema nests (properties, items, additionalProperties, the combinators) and how the API server
//! names a place in it.

use serde_json::Value;

/// Where a value sits: the path as the API server names it in a refusal (`status.conditions[0].message`) and
/// the JSON pointer to it (`/conditions/0/message`).
#[derive(Clone, Debug, Default)]
pub struct Place {
    pub path: String,
    pub pointer: String,
}

impl Place {
    pub fn root(path: &str) -> Place {
        Place { path: path.into(), pointer: String::new() }
    }

    fn field(&self, name: &str) -> Place {
        Place { path: format!("{}.{name}", self.path), pointer: format!("{}/{name}", self.pointer) }
    }

    fn item(&self, i: usize) -> Place {
        Place { path: format!("{}[{i}]", self.path), pointer: format!("{}/{i}", self.pointer) }
    }

    /// The first of every list on the way here: the place stands for all its siblings.
    pub fn is_first_item(&self) -> bool {
        !self.pointer.split('/').any(|step| step.parse::<usize>().is_ok_and(|i| i > 0))
    }
}

/// Calls `visit` with every schema nested in `schema` and its path (`[]` for a list's items, `{}` for a map's
/// values, `(anyOf 0)` for a combinator's branches), parents first.
pub fn each_schema(schema: &Value, path: &str, visit: &mut impl FnMut(&Value, &str)) {
    visit(schema, path);
    for key in ["anyOf", "oneOf", "allOf"] {
        for (i, s) in schema.get(key).and_then(Value::as_array).into_iter().flatten().enumerate() {
            each_schema(s, &format!("{path}({key} {i})"), visit);
        }
    }
    if let Some(items) = schema.get("items") {
        each_schema(items, &format!("{path}[]"), visit);
    }
    for (name, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
        each_schema(property, &format!("{path}.{name}"), visit);
    }
    if let Some(each) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        each_schema(each, &format!("{path}{{}}"), visit);
    }
}

/// Calls `visit` with every value nested in `value`, the schema it is written under (`Value::Null` for a field
/// the schema lacks) and its place, parents first.
pub fn each_value(schema: &Value, value: &Value, place: &Place, visit: &mut impl FnMut(&Value, &Value, &Place)) {
    visit(schema, value, place);
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                each_value(&schema["items"], item, &place.item(i), visit);
            }
        }
        Value::Object(fields) => {
            for (name, v) in fields {
                each_value(&schema["properties"][name], v, &place.field(name), visit);
            }
        }
        _ => {}
    }
}
