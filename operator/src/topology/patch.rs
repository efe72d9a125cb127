//! The JSON merge patch (RFC 7386) that turns one document into another (pure): what the reconciler sends to
//! put a hand-edited NetworkLink back, fields the user added included (they are set to `null`).

use serde_json::{Map, Value};

/// The merge patch that, applied to `from`, gives `to`; `None` when they are equal.
pub fn merge_diff(from: &Value, to: &Value) -> Option<Value> {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = Map::new();
            for (k, old) in a {
                match b.get(k) {
                    None => {
                        patch.insert(k.clone(), Value::Null);
                    }
                    Some(new) => {
                        if let Some(p) = merge_diff(old, new) {
                            patch.insert(k.clone(), p);
                        }
                    }
                }
            }
            for (k, new) in b {
                if !a.contains_key(k) {
                    patch.insert(k.clone(), new.clone());
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if from == to => None,
        // Arrays and scalars are replaced whole; a null inside `to` would read as "remove", which no spec of
        // ours writes (absent fields are skipped, not null).
        _ => Some(to.clone()),
    }
}

/// Applies a merge patch (RFC 7386), for tests of [`merge_diff`].
pub fn apply(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            apply(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn added_fields_are_removed_and_changed_ones_replaced() {
        let from =
            json!({"impairment": {"latency": "5ms", "loss": {"percent": "1%"}}, "symmetric": true, "priority": 3});
        let to = json!({"impairment": {"latency": "40ms"}, "oneWay": true, "priority": 3});
        let patch = merge_diff(&from, &to).unwrap();
        assert_eq!(patch, json!({"impairment": {"latency": "40ms", "loss": null}, "symmetric": null, "oneWay": true}));
        assert_eq!(merge_diff(&to, &to), None);
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i32>().prop_map(Value::from),
            "[a-c]{0,2}".prop_map(Value::from),
            any::<bool>().prop_map(Value::from)
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_diff_applied_gives_the_target(from in arb_json(), to in arb_json()) {
            let mut doc = from.clone();
            if let Some(p) = merge_diff(&from, &to) {
                apply(&mut doc, &p);
            }
            prop_assert_eq!(doc, to);
        }
    }
}
