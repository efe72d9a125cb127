//! A link's `spec.schedule` as one [`Timeline`] per direction it shapes. Pure: the spec, the link's own
//! impairments, its creation time and the traces it names (read from the ConfigMap by the caller) in; the
//! timelines out, or the field that is wrong and why. The agents carry the timelines out on their own clocks.

pub mod ramp;
pub mod trace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::schedule::{End, Jitter, Phase, ScheduleError, Timeline, TimelineFields};
use isthmus_agent_api::{Correlated, Direction, Impairment, ImpairmentFields, Loss, Percent};

use crate::api::quantity::{DurationValue, PercentValue};
use crate::api::{
    FlapSpec, NetworkLinkSpec, RampDirection, RampField, RampSpec, ResolvedImpairments, ScheduleEnd, ScheduleSpec,
    SpecError, TraceSpec, format_duration, format_rate, overlay,
};
use crate::unit_syntax::{UnitError, parse_duration, parse_percent, parse_rate};
use trace::Trace;

/// The label that makes a ConfigMap a trace the operator reads (and watches): only labelled ConfigMaps, so that
/// the operator neither holds nor needs every ConfigMap of the cluster.
pub const TRACE_LABEL: &str = "isthmus.dev/trace";

/// The default rate window of a replayed trace, and its bounds.
pub const DEFAULT_TRACE_WINDOW: Duration = Duration::from_millis(100);
pub const MIN_TRACE_WINDOW: Duration = Duration::from_millis(10);
pub const MAX_TRACE_WINDOW: Duration = Duration::from_secs(10);

/// How status and measurements name phase `phase` of `timeline`: its own name (`up`, `step 3`, the user's), else
/// `phase N` counted from 1.
pub fn phase_name(timeline: &Timeline, phase: usize) -> String {
    match timeline.phases()[phase].name.as_str() {
        "" => format!("phase {}", phase + 1),
        name => name.to_owned(),
    }
}

/// The timelines of a scheduled link: one per direction whose impairment changes (a ramp or a trace may move one
/// direction only; the other keeps the link's own).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timelines {
    pub forward: Option<Arc<Timeline>>,
    pub reverse: Option<Arc<Timeline>>,
}

impl Timelines {
    /// The timeline of `direction`, if its impairment changes with time.
    pub fn of(&self, direction: Direction) -> Option<&Arc<Timeline>> {
        match direction {
            Direction::Forward => self.forward.as_ref(),
            Direction::Reverse => self.reverse.as_ref(),
        }
    }
}

/// The ConfigMap a trace names, as read: `None` when it does not exist, else its data by key.
pub type TraceData<'a> = Option<&'a BTreeMap<String, String>>;

const FIELD: &str = "spec.schedule";

/// The link's timelines, or `None` for a link without a schedule.
pub fn compile(
    spec: &NetworkLinkSpec,
    own: &ResolvedImpairments,
    created_unix_ms: u64,
    traces: TraceData<'_>,
) -> Result<Option<Timelines>, SpecError> {
    let Some(schedule) = &spec.schedule else { return Ok(None) };
    check_shape(schedule)?;
    let start = start_unix_ms(schedule, created_unix_ms)?;
    let ctx = Ctx { spec, own, start };
    let timelines = match (&schedule.phases[..], &schedule.flap, &schedule.ramp, &schedule.trace) {
        (phases @ [_, ..], None, None, None) => ctx.phases(phases, end_of(schedule, End::Repeat))?,
        ([], Some(flap), None, None) => ctx.flap(flap, end_of(schedule, End::Repeat))?,
        ([], None, Some(ramp), None) => ctx.ramp(ramp, end_of(schedule, End::Hold))?,
        ([], None, None, Some(trace)) => ctx.trace(trace, traces, end_of(schedule, End::Repeat))?,
        _ => {
            return Err(SpecError {
                field: FIELD.into(),
                message: "set exactly one of phases, flap, ramp and trace".into(),
            });
        }
    };
    Ok(Some(timelines))
}

fn start_unix_ms(schedule: &ScheduleSpec, created_unix_ms: u64) -> Result<u64, SpecError> {
    match (&schedule.start, &schedule.start_at) {
        (Some(_), Some(_)) => Err(err(
            "spec.schedule.startAt",
            "start (after the link's creation) and startAt (an instant) exclude each other",
        )),
        (_, Some(at)) => u64::try_from(at.0.as_millisecond())
            .map_err(|_| err("spec.schedule.startAt", "an instant before 1970 is no start")),
        (Some(after), None) => Ok(created_unix_ms + duration(after, "spec.schedule.start")?.as_millis() as u64),
        (None, None) => Ok(created_unix_ms),
    }
}

fn end_of(schedule: &ScheduleSpec, default: End) -> End {
    match schedule.end {
        None => default,
        Some(ScheduleEnd::Repeat) => End::Repeat,
        Some(ScheduleEnd::Hold) => End::Hold,
        Some(ScheduleEnd::Revert) => End::Revert,
    }
}

struct Ctx<'a> {
    spec: &'a NetworkLinkSpec,
    own: &'a ResolvedImpairments,
    start: u64,
}

impl Ctx<'_> {
    fn phases(&self, phases: &[crate::api::PhaseSpec], end: End) -> Result<Timelines, SpecError> {
        let mut forward = Vec::with_capacity(phases.len());
        let mut reverse = Vec::with_capacity(phases.len());
        for (i, p) in phases.iter().enumerate() {
            let at = format!("{FIELD}.phases[{i}]");
            let ms = phase_ms(&p.duration, &format!("{at}.duration"))?;
            let name = p.name.clone().unwrap_or_else(|| format!("phase {}", i + 1));
            let fwd = overlay(self.own.forward.fields().clone(), p.impairment.as_ref(), &format!("{at}.impairment"))?;
            forward.push(phase(ms, fwd, &name));
            match (&self.own.reverse, &p.reverse) {
                (None, Some(_)) => {
                    return Err(err(format!("{at}.reverse"), "the link does not shape to → from (it is one-way)"));
                }
                (Some(_), Some(_)) if self.spec.symmetric => {
                    return Err(err(
                        format!("{at}.reverse"),
                        "on a symmetric link impairment changes both directions; leave reverse out",
                    ));
                }
                (Some(own), changes) => {
                    let (changes, field) = if self.spec.symmetric {
                        (p.impairment.as_ref(), format!("{at}.impairment"))
                    } else {
                        (changes.as_ref(), format!("{at}.reverse"))
                    };
                    reverse.push(phase(ms, overlay(own.fields().clone(), changes, &field)?, &name));
                }
                (None, None) => {}
            }
        }
        Ok(Timelines {
            forward: Some(self.timeline(forward, end, None, FIELD)?),
            reverse: if reverse.is_empty() { None } else { Some(self.timeline(reverse, end, None, FIELD)?) },
        })
    }

    fn flap(&self, flap: &FlapSpec, end: End) -> Result<Timelines, SpecError> {
        let at = format!("{FIELD}.flap");
        let up = phase_ms(&flap.up, &format!("{at}.up"))?;
        let down = phase_ms(&flap.down, &format!("{at}.down"))?;
        let jitter = match &flap.jitter {
            None => None,
            Some(p) => Some(Jitter {
                percent: percent_of(p, &format!("{at}.jitter"))?,
                seed: u64::try_from(flap.seed.unwrap_or(0))
                    .map_err(|_| err(format!("{at}.seed"), "a seed is 0 or above"))?,
            }),
        };
        let down_field = format!("{at}.downImpairment");
        let direction = |own: &Impairment| -> Result<Arc<Timeline>, SpecError> {
            let cut = match &flap.down_impairment {
                Some(changes) => overlay(own.fields().clone(), Some(changes), &down_field)?,
                None => Impairment::try_from(ImpairmentFields {
                    loss: Some(Loss::Random(Correlated { percent: Percent::HUNDRED, correlation: Percent::ZERO })),
                    ..own.fields().clone()
                })
                .map_err(|e| err(&down_field, e.to_string()))?,
            };
            let phases = vec![phase(up, own.clone(), "up"), phase(down, cut, "down")];
            self.timeline(phases, end, jitter, &at)
        };
        Ok(Timelines {
            forward: Some(direction(&self.own.forward)?),
            reverse: self.own.reverse.as_ref().map(direction).transpose()?,
        })
    }

    fn ramp(&self, r: &RampSpec, end: End) -> Result<Timelines, SpecError> {
        let at = format!("{FIELD}.ramp");
        let value = |text: &str, name: &str| ramp_value(r.field, text, &format!("{at}.{name}"));
        let (from, to, step) = (value(&r.from, "from")?, value(&r.to, "to")?, value(&r.step, "step")?);
        let over = phase_ms(&r.over, &format!("{at}.over"))?;
        let steps = ramp::steps(from, to, step, over).map_err(|e| err(format!("{at}.step"), e.to_string()))?;
        let direction = |own: &Impairment| -> Result<Arc<Timeline>, SpecError> {
            let phases = steps
                .iter()
                .map(|s| {
                    let (fields, name) = with_ramp_value(own.fields().clone(), r.field, s.value);
                    let impairment = Impairment::try_from(fields).map_err(|e| err(&at, e.to_string()))?;
                    Ok(phase(s.duration_ms, impairment, &name))
                })
                .collect::<Result<Vec<_>, SpecError>>()?;
            self.timeline(phases, end, None, &at)
        };
        let (forward, reverse) = match r.direction.unwrap_or(RampDirection::Both) {
            RampDirection::Both => (true, true),
            RampDirection::Forward => (true, false),
            RampDirection::Reverse if self.own.reverse.is_none() => {
                return Err(err(format!("{at}.direction"), "the link does not shape to → from (it is one-way)"));
            }
            RampDirection::Reverse => (false, true),
        };
        Ok(Timelines {
            forward: if forward { Some(direction(&self.own.forward)?) } else { None },
            reverse: if reverse { self.own.reverse.as_ref().map(direction).transpose()? } else { None },
        })
    }

    fn trace(&self, t: &TraceSpec, data: TraceData<'_>, end: End) -> Result<Timelines, SpecError> {
        let at = format!("{FIELD}.trace");
        let window = match &t.window {
            None => DEFAULT_TRACE_WINDOW,
            Some(w) => duration(w, &format!("{at}.window"))?,
        };
        if !(MIN_TRACE_WINDOW..=MAX_TRACE_WINDOW).contains(&window) {
            return Err(err(format!("{at}.window"), "a rate window lasts from 10ms to 10s"));
        }
        let Some(data) = data else {
            return Err(err(
                format!("{at}.configMap"),
                format!("no ConfigMap {:?} labelled {TRACE_LABEL} in the link's namespace", t.config_map),
            ));
        };
        let direction = |own: &Impairment, key: &str, field: String| -> Result<Arc<Timeline>, SpecError> {
            let text =
                data.get(key).ok_or_else(|| err(&field, format!("ConfigMap {:?} has no key {key:?}", t.config_map)))?;
            let trace = Trace::parse(text).map_err(|e| err(&field, format!("{key}: {e}")))?;
            let windows = trace.windows(window.as_millis() as u64).map_err(|e| err(&field, format!("{key}: {e}")))?;
            let phases = windows
                .iter()
                .enumerate()
                .map(|(k, w)| {
                    let fields = ImpairmentFields { rate_bps: Some(w.rate_bps), ..own.fields().clone() };
                    let impairment = Impairment::try_from(fields).map_err(|e| err(&field, e.to_string()))?;
                    Ok(phase(w.length_ms, impairment, &format!("window {}", k + 1)))
                })
                .collect::<Result<Vec<_>, SpecError>>()?;
            self.timeline(phases, end, None, &field)
        };
        let forward =
            t.uplink.as_deref().map(|k| direction(&self.own.forward, k, format!("{at}.uplink"))).transpose()?;
        let reverse = match (&t.downlink, &self.own.reverse) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(err(format!("{at}.downlink"), "the link does not shape to → from (it is one-way)"));
            }
            (Some(k), Some(own)) => Some(direction(own, k, format!("{at}.downlink"))?),
        };
        Ok(Timelines { forward, reverse })
    }

    fn timeline(
        &self,
        phases: Vec<Phase>,
        end: End,
        jitter: Option<Jitter>,
        field: &str,
    ) -> Result<Arc<Timeline>, SpecError> {
        let fields = TimelineFields { start_unix_ms: self.start, phases, end, jitter };
        Timeline::try_from(fields).map(Arc::new).map_err(|e: ScheduleError| err(field, e.to_string()))
    }
}

fn phase(duration_ms: u64, impairment: Impairment, name: &str) -> Phase {
    Phase { duration_ms, impairment: Arc::new(impairment), name: name.to_owned() }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError { field: field.into(), message: message.into() }
}

fn unit(field: &str, e: UnitError) -> SpecError {
    err(field, e.to_string())
}

fn duration(value: &DurationValue, field: &str) -> Result<Duration, SpecError> {
    value.parse().map_err(|e| unit(field, e))
}

/// A phase's length in whole ms, at least 1.
fn phase_ms(value: &DurationValue, field: &str) -> Result<u64, SpecError> {
    let d = duration(value, field)?;
    if d < Duration::from_millis(1) {
        return Err(err(field, format!("{value}: a phase lasts at least 1ms")));
    }
    Ok(d.as_millis() as u64)
}

fn percent_of(value: &PercentValue, field: &str) -> Result<Percent, SpecError> {
    let v = value.parse().map_err(|e| unit(field, e))?;
    Percent::new("percent", v).map_err(|e| err(field, e.reason))
}

/// Loss ramps in 10⁻⁹ % (the finest a percentage is written in), so that their steps are whole numbers.
const NANO_PERCENT: f64 = 1e9;

fn ramp_value(field: RampField, text: &str, at: &str) -> Result<i128, SpecError> {
    Ok(match field {
        RampField::Latency | RampField::Jitter => parse_duration(text).map_err(|e| unit(at, e))?.as_nanos() as i128,
        RampField::Loss => (parse_percent(text).map_err(|e| unit(at, e))? * NANO_PERCENT).round() as i128,
        RampField::Bandwidth => i128::from(parse_rate(text).map_err(|e| unit(at, e))?),
    })
}

/// `fields` with the ramped field at `value`, and the phase's name (`latency 30ms`).
fn with_ramp_value(mut fields: ImpairmentFields, field: RampField, value: i128) -> (ImpairmentFields, String) {
    let name = match field {
        RampField::Latency | RampField::Jitter => {
            let d = Duration::from_nanos(value as u64);
            if field == RampField::Latency {
                fields.latency = Some(d);
                format!("latency {}", format_duration(d))
            } else {
                fields.jitter = Some(d);
                format!("jitter {}", format_duration(d))
            }
        }
        RampField::Loss => {
            let percent = value as f64 / NANO_PERCENT;
            let correlation = match fields.loss {
                Some(Loss::Random(c)) => c.correlation,
                _ => Percent::ZERO,
            };
            let p = Percent::new("percent", percent).unwrap_or(Percent::HUNDRED);
            fields.loss = Some(Loss::Random(Correlated { percent: p, correlation }));
            format!("loss {percent}%")
        }
        RampField::Bandwidth => {
            fields.rate_bps = Some(value as u64);
            format!("bandwidth {}", format_rate(value as u64))
        }
    };
    (fields, name)
}

/// Checks a schedule's own fields the way admission does, for objects that slipped past an older schema.
pub fn check_shape(schedule: &ScheduleSpec) -> Result<(), SpecError> {
    let set = [!schedule.phases.is_empty(), schedule.flap.is_some(), schedule.ramp.is_some(), schedule.trace.is_some()];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err(err(FIELD, "set exactly one of phases, flap, ramp and trace"));
    }
    if schedule.phases.len() > crate::api::MAX_SCHEDULE_PHASES {
        return Err(err(
            format!("{FIELD}.phases"),
            format!("{} phases: at most {}", schedule.phases.len(), crate::api::MAX_SCHEDULE_PHASES),
        ));
    }
    if let Some(t) = &schedule.trace
        && t.uplink.is_none()
        && t.downlink.is_none()
    {
        return Err(err(
            format!("{FIELD}.trace"),
            "name the trace of at least one direction: uplink, downlink or both",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
