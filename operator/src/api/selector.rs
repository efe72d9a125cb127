//! The schema of a label selector in isthmus's CRDs: Kubernetes' `LabelSelector`, with the bounds and rules the
//! API server applies to the selectors of its built-in objects, which a CRD's schema does not get on its own.
//!
//! Why: without them a selector may hold an operator the operator cannot evaluate (admitted, then refused as
//! `InvalidSpec`) and any number of labels of any length, which every plan evaluates against every pod.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A label key: a DNS-subdomain prefix of at most 253 characters, `/`, and a name of at most 63.
pub const MAX_LABEL_KEY: usize = 253 + 1 + 63;
/// A label value.
pub const MAX_LABEL_VALUE: usize = 63;
/// Labels in `matchLabels`, requirements in `matchExpressions`, values of one requirement: each at most this
/// many, far beyond any selector written by hand.
pub const MAX_SELECTOR_TERMS: usize = 64;

/// The operators kube's `Selector` evaluates, as Kubernetes spells them.
pub const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// `schema_with` for a `LabelSelector` field.
pub fn schema(_: &mut SchemaGenerator) -> Schema {
    selector(false)
}

/// `schema_with` for an `Option<LabelSelector>` field.
pub fn optional_schema(_: &mut SchemaGenerator) -> Schema {
    selector(true)
}

fn selector(nullable: bool) -> Schema {
    let key_rule = format!("self.all(k, size(k) <= {MAX_LABEL_KEY})");
    let values_rule = "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : \
                       !has(self.values) || size(self.values) == 0";
    let mut schema = json_schema!({
        "type": "object",
        "properties": {
            "matchLabels": {
                "description": "matchLabels is a map of {key,value} pairs. A single {key,value} in the matchLabels map is equivalent to an element of matchExpressions, whose key field is \"key\", the operator is \"In\", and the values array contains only \"value\". The requirements are ANDed.",
                "type": "object",
                "maxProperties": MAX_SELECTOR_TERMS,
                "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE},
                "x-kubernetes-validations": [{
                    "rule": key_rule,
                    "message": format!("a label key is at most {MAX_LABEL_KEY} characters (a 253-character prefix, '/', and a 63-character name)"),
                }],
            },
            "matchExpressions": {
                "description": "matchExpressions is a list of label selector requirements. The requirements are ANDed.",
                "type": "array",
                "maxItems": MAX_SELECTOR_TERMS,
                "items": {
                    "description": "A label selector requirement is a selector that contains values, a key, and an operator that relates the key and values.",
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "description": "key is the label key that the selector applies to.",
                            "type": "string",
                            "maxLength": MAX_LABEL_KEY,
                        },
                        "operator": {
                            "description": "operator represents a key's relationship to a set of values: In, NotIn, Exists or DoesNotExist.",
                            "type": "string",
                            "enum": OPERATORS,
                        },
                        "values": {
                            "description": "values is an array of string values. If the operator is In or NotIn, the values array must be non-empty. If the operator is Exists or DoesNotExist, the values array must be empty.",
                            "type": "array",
                            "maxItems": MAX_SELECTOR_TERMS,
                            "items": {"type": "string", "maxLength": MAX_LABEL_VALUE},
                        },
                    },
                    "x-kubernetes-validations": [{
                        "rule": values_rule,
                        "message": "In and NotIn need values; Exists and DoesNotExist take none",
                    }],
                },
            },
        },
    });
    if nullable {
        schema.insert("nullable".into(), true.into());
    }
    schema
}
