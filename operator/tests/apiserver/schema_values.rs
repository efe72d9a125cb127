//! Values generated from a CRD's OpenAPI v3 schema itself, as proptest strategies: what the schema says a field
//! is (type, enum, pattern, bounds, required properties) decides what is generated, so that a field added to the
//! CRD is covered without touching the test. Generated values are often refused by the API server (CEL rules
//! across fields, numbers past a CEL bound); the caller sends them and judges only what is admitted.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Strings tried where the schema says nothing more than "a string": names and label keys, the CIDRs and
/// operators that rules look for, and the edges (empty, a space, a slash).
const STRINGS: &[&str] = &["", "a", "app", "client", "api", "zone-a", "isthmus.dev/role", "a b", "/", "In", "Exists"];

/// Strings tried where a rule says the string is a CIDR: networks, and what such a rule must refuse.
const CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "203.0.113.0/24",
    "0.0.0.0/0",
    "192.0.2.7/32",
    "2001:db8::/32",
    "::/0",
    "10.0.0.1/8",
    "10.0.0.0",
    "300.0.0.0/8",
    "a",
];

/// A strategy for values of `schema` (a CRD's structural schema, as JSON).
pub fn values(schema: &Value) -> BoxedStrategy<Value> {
    at_depth(schema, 0)
}

fn at_depth(schema: &Value, depth: usize) -> BoxedStrategy<Value> {
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        let choices: Vec<Value> = choices.iter().filter(|v| !v.is_null()).cloned().collect();
        return proptest::sample::select(choices).boxed();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object(schema, depth),
        Some("array") => array(schema, depth),
        Some("string") => string(schema),
        Some("integer") => integer(schema),
        Some("number") => (0.0..1e6_f64).prop_map(Value::from).boxed(),
        Some("boolean") => any::<bool>().prop_map(Value::from).boxed(),
        other => panic!("a structural schema gives every field a type; got {other:?} in {schema}"),
    }
}

fn object(schema: &Value, depth: usize) -> BoxedStrategy<Value> {
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    if let Some(each) = schema.get("additionalProperties") {
        let most = bound(schema, "maxProperties").min(3);
        return proptest::collection::btree_map(key(), at_depth(each, depth + 1), 0..=most)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
            .boxed();
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    // Half of the top level's optional fields (rules across them need several), about two of a nested object's
    // at a time: each one more is one more chance to break a rule across fields, and a spec the server refuses
    // tells nothing.
    let optional = properties.into_iter().flatten().filter(|(name, _)| !required.contains(&name.as_str())).count();
    let presence = if depth == 0 { 0.5 } else { (2.0 / optional.max(1) as f64).min(0.5) };
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = properties
        .into_iter()
        .flatten()
        .map(|(name, field)| {
            let is_required = required.contains(&name.as_str());
            let name = name.clone();
            let value = at_depth(field, depth + 1).prop_map(move |v| (name.clone(), v));
            if is_required { value.prop_map(Some).boxed() } else { proptest::option::weighted(presence, value).boxed() }
        })
        .collect();
    fields.prop_map(|fields| Value::Object(fields.into_iter().flatten().collect::<Map<_, _>>())).boxed()
}

fn array(schema: &Value, depth: usize) -> BoxedStrategy<Value> {
    let least = schema.get("minItems").map_or(0, |_| bound(schema, "minItems")).min(2);
    let most = bound(schema, "maxItems").clamp(least, 2);
    proptest::collection::vec(at_depth(&schema["items"], depth + 1), least..=most).prop_map(Value::Array).boxed()
}

fn string(schema: &Value) -> BoxedStrategy<Value> {
    if schema.get("format").and_then(Value::as_str) == Some("date-time") {
        return Just(Value::from("2026-12-05T08:00:00Z")).boxed();
    }
    let least = schema.get("minLength").map_or(0, |_| bound(schema, "minLength"));
    let most = schema.get("maxLength").and_then(Value::as_u64).map_or(usize::MAX, |m| m as usize);
    let fits = move |s: &String| (least..=most).contains(&s.chars().count());
    let strategy = match pattern(schema) {
        // Counted repetitions as written (numbers up to the pattern's widest), and narrowed to a few more than
        // their minimum (numbers near the bounds that CEL rules check), half and half.
        Some(p) => prop_oneof![regex(&p), regex(&narrowed(&p))].boxed(),
        None if rules(schema).any(|r| r.contains("isCIDR(self)")) => {
            proptest::sample::select(CIDRS.iter().map(|s| s.to_string()).collect::<Vec<_>>()).boxed()
        }
        None => {
            let mut pool: Vec<String> = STRINGS.iter().map(|s| s.to_string()).collect();
            if most < 1024 {
                pool.push("x".repeat(most));
            }
            prop_oneof![proptest::sample::select(pool), "[a-z][a-z0-9.-]{0,20}"].boxed()
        }
    };
    strategy.prop_filter("the schema's length bounds", fits).prop_map(Value::from).boxed()
}

fn integer(schema: &Value) -> BoxedStrategy<Value> {
    let (low, high) = match schema.get("format").and_then(Value::as_str) {
        Some("int32") => (i32::MIN as i64, i32::MAX as i64),
        Some("uint32") => (0, u32::MAX as i64),
        Some("uint64") => (0, i64::MAX),
        _ => (i64::MIN, i64::MAX),
    };
    let low = schema.get("minimum").and_then(Value::as_i64).unwrap_or(low);
    let high = schema.get("maximum").and_then(Value::as_i64).unwrap_or(high);
    // Small numbers are the common case (gaps, priorities); the bounds are where rules break.
    let small = low.clamp(0, high);
    prop_oneof![Just(low), Just(high), low..=high, small..=small.saturating_add(16).min(high)]
        .prop_map(Value::from)
        .boxed()
}

/// The schema's `pattern`, else the regex of a CEL rule `self.matches(r'…')` on the field, without the anchors
/// (every such pattern in isthmus's CRDs is anchored at both ends; proptest generates no anchors).
fn pattern(schema: &Value) -> Option<String> {
    let from_rule = || {
        rules(schema).find_map(|rule| {
            let start = rule.find("self.matches(r'")? + "self.matches(r'".len();
            let len = rule[start..].find("')")?;
            Some(rule[start..start + len].to_owned())
        })
    };
    let p = schema.get("pattern").and_then(Value::as_str).map(str::to_owned).or_else(from_rule)?;
    let p = p.strip_prefix('^').unwrap_or(&p);
    Some(p.strip_suffix('$').unwrap_or(p).to_owned())
}

/// The CEL rules on the field itself.
fn rules(schema: &Value) -> impl Iterator<Item = &str> {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["rule"].as_str())
}

/// `p` with each `{m,n}` narrowed to `{m,m+2}`.
fn narrowed(p: &str) -> String {
    let counted = regex::Regex::new(r"\{(\d+),(\d+)\}").expect("a valid regex");
    counted
        .replace_all(p, |c: &regex::Captures| {
            let (m, n): (u32, u32) = (c[1].parse().unwrap(), c[2].parse().unwrap());
            format!("{{{m},{}}}", n.min(m + 2))
        })
        .into_owned()
}

fn regex(p: &str) -> BoxedStrategy<String> {
    proptest::string::string_regex(p).unwrap_or_else(|e| panic!("pattern {p}: {e}")).boxed()
}

/// Map keys: label keys and names, now and then one longer than a label key may be.
fn key() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z]{1,8}",
        1 => "[a-z]{1,8}\\.dev/[a-z]{1,8}",
        1 => Just("k".repeat(318)),
    ]
    .boxed()
}

fn bound(schema: &Value, name: &str) -> usize {
    schema.get(name).and_then(Value::as_u64).map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use serde_json::json;

    use super::*;

    fn sample(schema: Value, n: usize) -> Vec<Value> {
        let strategy = values(&schema);
        let mut runner = TestRunner::deterministic();
        (0..n).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect()
    }

    #[test]
    fn generated_values_keep_to_the_schema_they_come_from() {
        let schema = json!({
            "type": "object", "required": ["rate"],
            "properties": {
                "rate": {"type": "string", "maxLength": 16, "x-kubernetes-validations": [
                    {"rule": "self.matches(r'^[0-9]{1,13}(bit|kbit)$')"}]},
                "mode": {"type": "string", "enum": ["A", "B", null]},
                "gap": {"type": "integer", "minimum": 1, "maximum": 9},
                "cidrs": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 64}},
                "labels": {"type": "object", "maxProperties": 2, "additionalProperties": {"type": "string"}},
            }
        });
        let rate = regex::Regex::new(r"^[0-9]{1,13}(bit|kbit)$").unwrap();
        let values = sample(schema, 300);
        for v in &values {
            assert!(rate.is_match(v["rate"].as_str().unwrap()), "{v}");
            assert!(v["rate"].as_str().unwrap().len() <= 16, "{v}");
            assert!(v.get("mode").is_none_or(|m| m == "A" || m == "B"), "{v}");
            assert!(v.get("gap").is_none_or(|g| (1..=9).contains(&g.as_i64().unwrap())), "{v}");
            assert!(v.get("cidrs").is_none_or(|c| c.as_array().unwrap().len() <= 2), "{v}");
            assert!(v.get("labels").is_none_or(|l| l.as_object().unwrap().len() <= 2), "{v}");
        }
        for field in ["mode", "gap", "cidrs", "labels"] {
            assert!(values.iter().any(|v| v.get(field).is_some()), "{field} never generated");
            assert!(values.iter().any(|v| v.get(field).is_none()), "{field} always generated");
        }
        assert!(values.iter().any(|v| v["rate"].as_str().unwrap().len() <= 6), "narrowed numbers are generated");
    }

    #[test]
    fn narrowing_keeps_the_minimum_and_shortens_the_widest() {
        assert_eq!(narrowed(r"[0-9]{1,13}(\.[0-9]{1,9})?s"), r"[0-9]{1,3}(\.[0-9]{1,3})?s");
        assert_eq!(narrowed(r"0{1,2}"), r"0{1,2}");
    }
}
