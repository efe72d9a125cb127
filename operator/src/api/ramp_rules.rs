//! The CEL rules that admit a ramp (`spec.schedule.ramp`) exactly when the operator can build every step of it
//! (crate::schedule): its values read in the unit of its `field`, a step that moves, at most
//! `MAX_PHASES - 1` steps of at least 1 ms each, and every step's impairment valid over the link's own.
//!
//! Values are compared as the operator computes them: durations as CEL `duration`s (Go's parser truncates a
//! fraction of a nanosecond as `crate::unit_syntax::parse_duration` does), percentages in 10⁻⁹ % and rates in
//! bits, each a double rounded to the nearest whole unit as the operator rounds it.

use isthmus_agent_api::MAX_BUCKET_TIME;
use isthmus_agent_api::impairment::{MAX_DELAY, MAX_JITTER};
use isthmus_agent_api::schedule::MAX_PHASES;

use crate::unit_syntax;

/// The ramp's `value`, read in the unit of its field.
pub fn values_in_unit(ramp: &str, value: &str) -> String {
    let v = format!("{ramp}.{value}");
    let time = format!(
        "{v}.matches(r'{}') && duration({v}) <= duration('{}s')",
        unit_syntax::DURATION_PATTERN,
        MAX_DELAY.as_secs()
    );
    let percent = format!("{v}.matches(r'{}')", unit_syntax::PERCENT_PATTERN);
    let bits = unit_syntax::cel_rate_bits(&v);
    let rate = format!(
        "{v}.matches(r'{}') && {bits} >= {:.1} && {bits} <= 1e12",
        unit_syntax::RATE_PATTERN,
        unit_syntax::MIN_RATE_BPS
    );
    format!("{ramp}.field in ['Latency', 'Jitter'] ? {time} : {ramp}.field == 'Loss' ? {percent} : {rate}")
}

pub const VALUES_IN_UNIT: &str = "in the unit of field: a duration up to 3600s such as 10ms (Latency, Jitter), a percentage such as 0.5% (Loss), a rate from 100bit to 1000Gbit such as 10Mbit (Bandwidth)";

/// Every value of the ramp reads in its unit: the guard of the rules below, which leave a value that does not
/// to [`values_in_unit`]'s message.
fn readable(ramp: &str) -> String {
    ["from", "to", "step"].iter().map(|v| format!("({})", values_in_unit(ramp, v))).collect::<Vec<_>>().join(" && ")
}

/// CEL for the whole units of `value` (an int): ns, 10⁻⁹ % or bit/s.
fn whole(ramp: &str, value: &str) -> String {
    let v = format!("{ramp}.{value}");
    format!(
        "({ramp}.field in ['Latency', 'Jitter'] ? int(duration({v})) : {ramp}.field == 'Loss' ? \
         int(double({v}.find('^[0-9.]+')) * 1e9 + 0.5) : int({bits} + 0.5))",
        bits = unit_syntax::cel_rate_bits(&v),
    )
}

/// CEL for how far the ramp moves, in whole units.
fn distance(ramp: &str) -> String {
    let (from, to) = (whole(ramp, "from"), whole(ramp, "to"));
    format!("({to} >= {from} ? {to} - {from} : {from} - {to})")
}

/// The step moves the value, and the ramp takes at most `MAX_PHASES - 1` steps.
pub fn step_count() -> String {
    format!(
        "!({readable}) || ({step} > 0 && {distance} <= {most} * {step})",
        readable = readable("self"),
        step = whole("self", "step"),
        distance = distance("self"),
        most = MAX_PHASES - 1,
    )
}

pub const STEP_COUNT: &str =
    "a step moves the value (it is above 0), and a ramp takes at most 3599 steps: take longer steps";

/// `over` lasts at least 1 ms and gives every step at least 1 ms (in doubles: `over` in ms times a step can
/// pass CEL's integers).
pub fn step_length() -> String {
    format!(
        "duration(self.over) >= duration('1ms') && (!({readable}) || {step} <= 0 || double({distance}) <= \
         double(duration(self.over).getMilliseconds()) * double({step}))",
        readable = readable("self"),
        step = whole("self", "step"),
        distance = distance("self"),
    )
}

pub const STEP_LENGTH: &str = "every step of a ramp lasts at least 1ms: a longer over, or longer steps";

/// On the link (`self` is its spec): whether the ramp moves the forward and the reverse direction.
const MOVES_FORWARD: &str = "(!has(self.schedule.ramp.direction) || self.schedule.ramp.direction != 'Reverse')";
fn moves_reverse() -> String {
    format!(
        "((!has(self.schedule.ramp.direction) || self.schedule.ramp.direction != 'Forward') && {})",
        super::spec::CEL_REVERSE_IN_FORCE
    )
}

/// `check` (of whether the own impairment is set, and its CEL path) on the link's own reverse impairment: the
/// forward one on a symmetric link (two branches: CEL types `impairment` and `reverse` apart).
fn on_reverse_own(check: impl Fn(&str, &str) -> String) -> String {
    format!(
        "(has(self.symmetric) && self.symmetric ? {} : {})",
        check("has(self.impairment)", "self.impairment"),
        check("has(self.reverse)", "self.reverse")
    )
}

/// A CEL guard: the link has a ramp of `field` whose values read in its unit.
fn ramp_of(field: &str) -> String {
    format!(
        "has(self.schedule) && has(self.schedule.ramp) && self.schedule.ramp.field == '{field}' && {}",
        readable("self.schedule.ramp")
    )
}

/// Whether the own impairment at `own` (a CEL object, possibly absent: `has_own`) sets a nonzero `field` of
/// percentages (`reorder.percent`, `jitterCorrelation`).
fn nonzero_percent(has_own: &str, own: &str, field: &str) -> String {
    let (parent, leaf) = field.rsplit_once('.').map_or(("", field), |(p, l)| (p, l));
    let path = if parent.is_empty() { own.to_owned() } else { format!("{own}.{parent}") };
    let has = if parent.is_empty() {
        format!("{has_own} && has({own}.{leaf})")
    } else {
        format!("{has_own} && has({own}.{parent}) && has({path}.{leaf})")
    };
    format!("({has} && !{path}.{leaf}.matches('^[0.]*%$'))")
}

/// A latency ramp that reaches 0 in a direction that has jitter or reordering: each needs a latency.
pub fn latency_ramp_keeps_a_latency() -> String {
    let zero =
        "(duration(self.schedule.ramp.from) == duration('0s') || duration(self.schedule.ramp.to) == duration('0s'))";
    let needs = |has_own: &str, own: &str| {
        format!(
            "(({has_own} && has({own}.jitter) && duration({own}.jitter) > duration('0s')) || {reorder})",
            reorder = nonzero_percent(has_own, own, "reorder.percent")
        )
    };
    format!(
        "!({ramp} && {zero}) || (!({MOVES_FORWARD} && {fwd}) && !({rev_moves} && {rev}))",
        ramp = ramp_of("Latency"),
        fwd = needs("has(self.impairment)", "self.impairment"),
        rev_moves = moves_reverse(),
        rev = on_reverse_own(needs),
    )
}

pub const LATENCY_RAMP: &str =
    "a latency ramp reaches 0 where the link has jitter or reordering, which need a latency: ramp to a latency above 0";

/// A jitter ramp: every value at most netem's widest jitter, a latency above 0 where a value is, and no zero
/// where the link sets a jitter correlation.
pub fn jitter_ramp_fits() -> String {
    let (from, to) = ("duration(self.schedule.ramp.from)", "duration(self.schedule.ramp.to)");
    let latency = |has_own: &str, own: &str| {
        format!("({has_own} && has({own}.latency) ? duration({own}.latency) > duration('0s') : has(self.profile))")
    };
    let zero = format!("({from} == duration('0s') || {to} == duration('0s'))");
    let nonzero = format!("({from} > duration('0s') || {to} > duration('0s'))");
    let direction = |moves: &str, has_own: &str, own: &str| {
        format!(
            "(!{moves} || ((!{nonzero} || {latency}) && !({zero} && {correlated})))",
            latency = latency(has_own, own),
            correlated = nonzero_percent(has_own, own, "jitterCorrelation"),
        )
    };
    format!(
        "!({ramp}) || ({from} <= duration('{max}ns') && {to} <= duration('{max}ns') && {fwd} && {rev})",
        ramp = ramp_of("Jitter"),
        max = MAX_JITTER.as_nanos(),
        fwd = direction(MOVES_FORWARD, "has(self.impairment)", "self.impairment"),
        rev = on_reverse_own(|has_own, own| direction(&moves_reverse(), has_own, own)),
    )
}

pub const JITTER_RAMP: &str = "a jitter ramp: every value at most 2.147483647s, the link has a latency above 0 (or a profile) in each direction it moves, and reaches no 0 where the link sets jitterCorrelation";

/// A bandwidth ramp: the link's own burst is sent within the kernel's bucket time at the ramp's lowest rate.
pub fn bandwidth_ramp_fits_the_burst() -> String {
    let (from, to) =
        (unit_syntax::cel_rate_bits("self.schedule.ramp.from"), unit_syntax::cel_rate_bits("self.schedule.ramp.to"));
    let lowest = format!("({from} <= {to} ? {from} : {to})");
    let fits = |moves: &str, has_own: &str, own: &str| {
        format!(
            "(!{moves} || !({has_own} && has({own}.burst)) || {bytes} * 8.0 <= {secs}.0 * {lowest})",
            bytes = unit_syntax::cel_size_bytes(&format!("{own}.burst")),
            secs = MAX_BUCKET_TIME.as_secs(),
        )
    };
    format!(
        "!({ramp}) || ({fwd} && {rev})",
        ramp = ramp_of("Bandwidth"),
        fwd = fits(MOVES_FORWARD, "has(self.impairment)", "self.impairment"),
        rev = on_reverse_own(|has_own, own| fits(&moves_reverse(), has_own, own)),
    )
}

pub const BANDWIDTH_RAMP: &str = "a bandwidth ramp goes below what the link's burst needs: the burst must be sent within 274s at the ramp's lowest bandwidth";
