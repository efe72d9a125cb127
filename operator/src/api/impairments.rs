//! From what the user wrote to validated [`Impairment`]s: profile defaults, explicit overrides, unit parsing
//! and the cross-field rules. The CRD's CEL rules say the same; this is the authority the operator acts on, so
//! an object that slipped past an older schema is still refused with the field named.

use isthmus_agent_api::{Correlated, Impairment, ImpairmentError, ImpairmentFields, Loss, Percent, Reorder};

use super::profile::{PresetDirection, Profile};
use super::quantity::{MAX_BURST_BYTES, MIN_BURST_BYTES};
use super::spec::{CorrelatedSpec, ImpairmentSpec, LossSpec, NetworkLinkSpec, ReorderSpec};
use crate::unit_syntax::UnitError;

/// Why a NetworkLink cannot be acted on; `field` is the JSON path below the object (e.g.
/// `spec.impairment.latency`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

impl SpecError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// Both directions, validated. `reverse` is `None` when only `from → to` is impaired.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResolvedImpairments {
    pub forward: Impairment,
    pub reverse: Option<Impairment>,
}

impl NetworkLinkSpec {
    /// True when the link shapes `to → from` as well (explicit reverse, symmetric, or a profile's downlink).
    pub fn has_reverse(&self) -> bool {
        self.reverse.is_some() || self.symmetric || (self.profile.is_some() && !self.one_way)
    }

    /// Checks the cross-field rules and computes both directions' impairments.
    pub fn resolve(&self) -> Result<ResolvedImpairments, SpecError> {
        self.check_shape()?;
        let uplink = self.profile.map(Profile::uplink);
        let downlink = self.profile.map(Profile::downlink);
        let forward = direction(self.impairment.as_ref(), uplink, "spec.impairment")?;
        let reverse = if !self.has_reverse() {
            None
        } else if self.symmetric {
            Some(forward.clone())
        } else {
            Some(direction(self.reverse.as_ref(), downlink, "spec.reverse")?)
        };
        Ok(ResolvedImpairments { forward, reverse })
    }

    fn check_shape(&self) -> Result<(), SpecError> {
        if self.impairment.is_none() && self.profile.is_none() {
            return Err(SpecError::new("spec.impairment", "set impairment, a profile, or both"));
        }
        if self.symmetric && self.reverse.is_some() {
            return Err(SpecError::new("spec.symmetric", "reverse and symmetric exclude each other"));
        }
        if self.symmetric && self.profile.is_some() {
            return Err(SpecError::new(
                "spec.symmetric",
                "a profile already sets the reverse direction (its downlink); override it with reverse",
            ));
        }
        if self.one_way && (self.reverse.is_some() || self.symmetric) {
            return Err(SpecError::new("spec.oneWay", "oneWay excludes reverse and symmetric"));
        }
        if self.to.pod_selector.is_none() && self.to.cidrs.is_empty() {
            return Err(SpecError::new("spec.to", "to needs a podSelector, cidrs, or both"));
        }
        if self.to.namespace_selector.is_some() && self.to.pod_selector.is_none() {
            return Err(SpecError::new("spec.to.namespaceSelector", "namespaceSelector needs a podSelector"));
        }
        if self.has_reverse() && self.to.namespace_selector.is_some() {
            return Err(SpecError::new(
                "spec.to.namespaceSelector",
                "the reverse direction (reverse, symmetric, or a profile's downlink) changes the egress of the to \
                 pods, which a NetworkLink may do only in its own namespace: remove to.namespaceSelector, set \
                 oneWay: true, or create a second NetworkLink in the other namespace",
            ));
        }
        if self.has_reverse() && self.to.pod_selector.is_none() {
            return Err(SpecError::new(
                "spec.to.podSelector",
                "the reverse direction shapes the egress of the to pods, but to has no podSelector",
            ));
        }
        for (i, cidr) in self.to.cidrs.iter().enumerate() {
            cidr.parse().map_err(|e| unit_error(&format!("spec.to.cidrs[{i}]"), e))?;
        }
        Ok(())
    }
}

fn unit_error(field: &str, e: UnitError) -> SpecError {
    SpecError::new(field, e.to_string())
}

fn impairment_error(prefix: &str, e: ImpairmentError) -> SpecError {
    SpecError::new(format!("{prefix}.{}", e.field), e.reason)
}

fn percent(field: &str, value: &super::quantity::PercentValue) -> Result<Percent, SpecError> {
    let v = value.parse().map_err(|e| unit_error(field, e))?;
    Percent::new("percent", v).map_err(|e| SpecError::new(field, e.reason))
}

fn opt_percent(field: &str, value: Option<&super::quantity::PercentValue>) -> Result<Percent, SpecError> {
    value.map_or(Ok(Percent::ZERO), |v| percent(field, v))
}

/// One direction: the preset's values, overridden field by field by the explicit spec, then validated.
fn direction(
    spec: Option<&ImpairmentSpec>,
    preset: Option<PresetDirection>,
    prefix: &str,
) -> Result<Impairment, SpecError> {
    overlay(preset.map(PresetDirection::impairment).unwrap_or_default(), spec, prefix)
}

/// `base` overridden field by field by `spec` (what it sets), then validated; errors name `prefix.<field>`.
pub fn overlay(base: ImpairmentFields, spec: Option<&ImpairmentSpec>, prefix: &str) -> Result<Impairment, SpecError> {
    let mut out = base;
    let Some(spec) = spec else {
        return Impairment::try_from(out).map_err(|e| impairment_error(prefix, e));
    };
    let f = |name: &str| format!("{prefix}.{name}");
    if let Some(v) = &spec.latency {
        out.latency = Some(v.parse().map_err(|e| unit_error(&f("latency"), e))?);
    }
    if let Some(v) = &spec.jitter {
        out.jitter = Some(v.parse().map_err(|e| unit_error(&f("jitter"), e))?);
    }
    if let Some(v) = &spec.jitter_correlation {
        out.jitter_correlation = Some(percent(&f("jitterCorrelation"), v)?);
    }
    if let Some(loss) = &spec.loss {
        out.loss = Some(loss_of(loss, &f("loss"))?);
    }
    if let Some(d) = &spec.duplicate {
        out.duplicate = Some(correlated(d, &f("duplicate"))?);
    }
    if let Some(c) = &spec.corrupt {
        out.corrupt = Some(correlated(c, &f("corrupt"))?);
    }
    if let Some(r) = &spec.reorder {
        out.reorder = Some(reorder(r, &f("reorder"))?);
    }
    if let Some(v) = &spec.bandwidth {
        out.rate_bps = Some(v.parse().map_err(|e| unit_error(&f("bandwidth"), e))?);
    }
    if let Some(v) = &spec.burst {
        let bytes = v.parse().map_err(|e| unit_error(&f("burst"), e))?;
        if !(MIN_BURST_BYTES..=MAX_BURST_BYTES).contains(&bytes) {
            return Err(SpecError::new(
                f("burst"),
                format!("{bytes} bytes is outside {MIN_BURST_BYTES}B (one full-size packet) to {MAX_BURST_BYTES}B"),
            ));
        }
        out.burst_bytes = Some(bytes as u32);
    }
    if let Some(q) = spec.queue_limit {
        out.queue_limit_packets = Some(q);
    }
    Impairment::try_from(out).map_err(|e| impairment_error(prefix, rename_field(e)))
}

/// The agent API names two fields after its own representation; report them as the user wrote them.
fn rename_field(mut e: ImpairmentError) -> ImpairmentError {
    e.field = match e.field {
        "rate" => "bandwidth",
        other => other,
    };
    e
}

fn correlated(spec: &CorrelatedSpec, field: &str) -> Result<Correlated, SpecError> {
    Ok(Correlated {
        percent: percent(&format!("{field}.percent"), &spec.percent)?,
        correlation: opt_percent(&format!("{field}.correlation"), spec.correlation.as_ref())?,
    })
}

fn reorder(spec: &ReorderSpec, field: &str) -> Result<Reorder, SpecError> {
    if spec.gap == Some(0) {
        return Err(SpecError::new(
            format!("{field}.gap"),
            "a gap is at least 1 (every packet); leave it out for no gap",
        ));
    }
    Ok(Reorder {
        percent: percent(&format!("{field}.percent"), &spec.percent)?,
        correlation: opt_percent(&format!("{field}.correlation"), spec.correlation.as_ref())?,
        gap: spec.gap.unwrap_or(0),
    })
}

fn loss_of(spec: &LossSpec, field: &str) -> Result<Loss, SpecError> {
    match (&spec.percent, &spec.gilbert_elliott) {
        (Some(p), None) => Ok(Loss::Random(Correlated {
            percent: percent(&format!("{field}.percent"), p)?,
            correlation: opt_percent(&format!("{field}.correlation"), spec.correlation.as_ref())?,
        })),
        (None, Some(ge)) => {
            if spec.correlation.is_some() {
                return Err(SpecError::new(
                    format!("{field}.correlation"),
                    "correlation applies to random loss (percent)",
                ));
            }
            let ge_field = format!("{field}.gilbertElliott");
            Ok(Loss::GilbertElliott {
                p: percent(&format!("{ge_field}.p"), &ge.p)?,
                r: percent(&format!("{ge_field}.r"), &ge.r)?,
                loss_in_bad: match &ge.loss_in_bad {
                    Some(v) => percent(&format!("{ge_field}.lossInBad"), v)?,
                    None => Percent::HUNDRED,
                },
                loss_in_good: opt_percent(&format!("{ge_field}.lossInGood"), ge.loss_in_good.as_ref())?,
            })
        }
        _ => Err(SpecError::new(field, "set either percent (random loss) or gilbertElliott (bursty loss)")),
    }
}

#[cfg(test)]
#[path = "impairments_tests.rs"]
mod tests;
