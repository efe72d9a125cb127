//! One direction's impairment, in physical units. An [`Impairment`] is valid by construction: it is made only
//! from [`ImpairmentFields`] through `TryFrom`, which checks every field once (deserialising one goes the same
//! way), and it cannot be changed afterwards; code that holds one never checks it again.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why an impairment value was refused; names the field so the message can reach a user unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ImpairmentError {
    pub field: &'static str,
    pub reason: String,
}

impl ImpairmentError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self { field, reason: reason.into() }
    }
}

/// A probability in percent, 0 to 100 inclusive. Constructed only through [`Percent::new`], which rules out NaN
/// and folds -0 into 0, so that equal percentages are equal bit for bit: that makes `Eq` and `Hash` sound.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default, Serialize)]
#[serde(transparent)]
pub struct Percent(f64);

impl Eq for Percent {}

impl Hash for Percent {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl Percent {
    pub const ZERO: Percent = Percent(0.0);
    pub const HUNDRED: Percent = Percent(100.0);

    pub fn new(field: &'static str, value: f64) -> Result<Self, ImpairmentError> {
        if !value.is_finite() {
            return Err(ImpairmentError::new(field, format!("{value} is not a number")));
        }
        if !(0.0..=100.0).contains(&value) {
            return Err(ImpairmentError::new(field, format!("{value}% is outside 0% to 100%")));
        }
        // -0.0 + 0.0 is +0.0.
        Ok(Percent(value + 0.0))
    }

    pub fn value(self) -> f64 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0.0
    }

    /// The kernel's scale for probabilities: 0 → 0, 100 % → u32::MAX.
    pub fn to_kernel(self) -> u32 {
        ((self.0 / 100.0) * f64::from(u32::MAX)).round() as u32
    }
}

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Percent::new("percent", v).map_err(serde::de::Error::custom)
    }
}

/// A probability with the correlation to the previous event (netem's simple correlation model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Correlated {
    pub percent: Percent,
    #[serde(default)]
    pub correlation: Percent,
}

/// Packet loss: independent (with correlation) or the Gilbert-Elliott two-state model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "model")]
pub enum Loss {
    Random(Correlated),
    /// p: good→bad transition, r: bad→good, h: delivery probability in the bad state, k: delivery
    /// probability in the good state (netem's `loss gemodel p r 1-h 1-k` takes 1-h and 1-k; these are h and k
    /// as loss probabilities already, i.e. `loss_in_bad` = 1-h and `loss_in_good` = 1-k).
    GilbertElliott {
        p: Percent,
        r: Percent,
        #[serde(rename = "lossInBad")]
        loss_in_bad: Percent,
        #[serde(rename = "lossInGood")]
        loss_in_good: Percent,
    },
}

/// Reordering: `percent` of packets (with correlation) are sent at once instead of delayed; with `gap` N, every
/// Nth packet is the candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reorder {
    pub percent: Percent,
    #[serde(default)]
    pub correlation: Percent,
    #[serde(default)]
    pub gap: u32,
}

/// The fields of an impairment as a caller writes them, not yet checked: what becomes an [`Impairment`] through
/// `Impairment::try_from`, and the impairment's JSON form. All fields optional; the default passes traffic
/// unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImpairmentFields {
    /// One-way delay added to every packet.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_nanos")]
    pub latency: Option<Duration>,
    /// Uniform random variation of the delay, ± this much.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_nanos")]
    pub jitter: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_correlation: Option<Percent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Loss>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<Correlated>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt: Option<Correlated>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reorder: Option<Reorder>,
    /// Bandwidth in bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
    /// Token bucket size in bytes (how much may be sent at line rate after idling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_bytes: Option<u32>,
    /// Packets queued for this destination before drops; derived from the bandwidth-delay product if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_limit_packets: Option<u32>,
}

mod opt_nanos {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.serialize_u64(d.as_nanos() as u64),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_nanos))
    }
}

/// netem keeps delays as signed 64-bit nanoseconds; beyond this a value cannot be represented.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);
/// The widest jitter netem applies: it keeps the jitter as a signed 32-bit count of nanoseconds (its
/// `tabledist` takes an `s32`), so anything wider would be cut to this.
pub const MAX_JITTER: Duration = Duration::from_nanos(i32::MAX as u64);
/// The longest queue anyone may ask for: 1,000,000 packets, 1.5 GB of full frames — far beyond any link worth
/// emulating (10 Gbit/s for 1.2 s), yet a number the node's kernel can hold. The agent's queue budgets cut
/// further (16 MiB per destination by default).
pub const MAX_QUEUE_LIMIT_PACKETS: u32 = 1_000_000;
/// The longest a token bucket may take to refill at its rate: the kernel keeps TBF's bucket as 32-bit ticks of
/// 64 ns (274.88 s), and a whole second below it leaves room for the rounding of its rate arithmetic.
pub const MAX_BUCKET_TIME: Duration = Duration::from_secs(274);

/// What happens to packets of one direction of a link: [`ImpairmentFields`] that passed the checks. Read it
/// through [`Impairment::fields`]; `Impairment::default()` passes traffic unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "ImpairmentFields", into = "ImpairmentFields")]
pub struct Impairment(ImpairmentFields);

impl Impairment {
    pub fn fields(&self) -> &ImpairmentFields {
        &self.0
    }

    /// True when the impairment needs netem (anything but rate).
    pub fn needs_netem(&self) -> bool {
        self.0.needs_netem()
    }
}

impl TryFrom<ImpairmentFields> for Impairment {
    type Error = ImpairmentError;

    /// Checks every field against what the kernel can represent and what makes sense, naming the first field
    /// that is wrong.
    fn try_from(fields: ImpairmentFields) -> Result<Self, ImpairmentError> {
        fields.check()?;
        Ok(Impairment(fields))
    }
}

impl From<Impairment> for ImpairmentFields {
    fn from(impairment: Impairment) -> Self {
        impairment.0
    }
}

impl ImpairmentFields {
    fn check(&self) -> Result<(), ImpairmentError> {
        if let Some(l) = self.latency
            && l > MAX_DELAY
        {
            return Err(ImpairmentError::new("latency", format!("{l:?} is longer than {MAX_DELAY:?}")));
        }
        if let Some(j) = self.jitter {
            if j > MAX_JITTER {
                return Err(ImpairmentError::new(
                    "jitter",
                    format!(
                        "{j:?} is wider than {MAX_JITTER:?}, the most the kernel's netem can vary a delay by (it keeps \
                         jitter in 31 bits of nanoseconds)"
                    ),
                ));
            }
            if !j.is_zero() && self.latency.is_none_or(|l| l.is_zero()) {
                return Err(ImpairmentError::new("jitter", "jitter needs a latency to vary around"));
            }
        }
        if self.jitter_correlation.is_some_and(|c| !c.is_zero()) && self.jitter.is_none_or(|j| j.is_zero()) {
            return Err(ImpairmentError::new("jitterCorrelation", "correlation given without jitter"));
        }
        if let Some(r) = self.reorder
            && !r.percent.is_zero()
            && self.latency.is_none_or(|l| l.is_zero())
        {
            return Err(ImpairmentError::new(
                "reorder",
                "reordering sends some packets without the delay, so it needs a latency",
            ));
        }
        if let Some(r) = self.reorder
            && r.gap > 0
            && r.percent.is_zero()
        {
            return Err(ImpairmentError::new("reorder.gap", "gap given without a reorder probability"));
        }
        if let Some(rate) = self.rate_bps
            && rate < 8
        {
            return Err(ImpairmentError::new("rate", format!("{rate} bit/s is below 8 bit/s (one byte a second)")));
        }
        if let Some(b) = self.burst_bytes {
            if self.rate_bps.is_none() {
                return Err(ImpairmentError::new("burst", "burst given without a rate"));
            }
            if b < 1600 {
                return Err(ImpairmentError::new(
                    "burst",
                    format!("{b} bytes is smaller than one full-size packet (1600 bytes)"),
                ));
            }
            if let Some(rate) = self.rate_bps
                && u128::from(b) * 8 > u128::from(rate) * u128::from(MAX_BUCKET_TIME.as_secs())
            {
                return Err(ImpairmentError::new(
                    "burst",
                    format!(
                        "{b} bytes take longer than {MAX_BUCKET_TIME:?} to send at {rate} bit/s, the most the \
                         kernel's token bucket holds: a smaller burst or a higher bandwidth"
                    ),
                ));
            }
        }
        match self.queue_limit_packets {
            Some(0) => return Err(ImpairmentError::new("queueLimit", "0 packets would drop everything")),
            Some(q) if q > MAX_QUEUE_LIMIT_PACKETS => {
                return Err(ImpairmentError::new(
                    "queueLimit",
                    format!("{q} packets is more than the maximum of {MAX_QUEUE_LIMIT_PACKETS}"),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// True when the impairment needs netem (anything but rate).
    pub fn needs_netem(&self) -> bool {
        self.latency.is_some_and(|d| !d.is_zero())
            || self.loss.is_some()
            || self.duplicate.is_some_and(|d| !d.percent.is_zero())
            || self.corrupt.is_some_and(|c| !c.percent.is_zero())
            || self.reorder.is_some_and(|r| !r.percent.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Option<Duration> {
        Some(Duration::from_millis(v))
    }

    #[test]
    fn percent_bounds_name_the_field() {
        assert_eq!(Percent::new("loss", -0.1).unwrap_err().field, "loss");
        assert!(Percent::new("loss", 100.1).unwrap_err().to_string().contains("outside 0% to 100%"));
        assert!(Percent::new("loss", f64::NAN).is_err());
        assert_eq!(Percent::new("loss", 100.0).unwrap().to_kernel(), u32::MAX);
        assert_eq!(Percent::new("loss", 0.0).unwrap().to_kernel(), 0);
    }

    fn check(fields: ImpairmentFields) -> Result<Impairment, ImpairmentError> {
        Impairment::try_from(fields)
    }

    #[test]
    fn impossible_combinations_are_refused() {
        let jitter_alone = ImpairmentFields { jitter: ms(5), ..Default::default() };
        assert_eq!(check(jitter_alone).unwrap_err().field, "jitter");
        let widest = ImpairmentFields { latency: ms(5000), jitter: Some(MAX_JITTER), ..Default::default() };
        assert!(check(widest).is_ok());
        let wider = ImpairmentFields {
            latency: ms(5000),
            jitter: Some(MAX_JITTER + Duration::from_nanos(1)),
            ..Default::default()
        };
        let err = check(wider).unwrap_err();
        assert_eq!(err.field, "jitter");
        assert!(err.reason.contains("2.147483647s") && err.reason.contains("netem"), "{}", err.reason);
        let zero_rate = ImpairmentFields { rate_bps: Some(0), ..Default::default() };
        assert_eq!(check(zero_rate).unwrap_err().field, "rate");
        let burst_alone = ImpairmentFields { burst_bytes: Some(32_000), ..Default::default() };
        assert_eq!(check(burst_alone).unwrap_err().field, "burst");
        // 274 s at the rate is the deepest bucket; a byte more is refused, naming the burst.
        let deepest = ImpairmentFields { rate_bps: Some(1000), burst_bytes: Some(34_250), ..Default::default() };
        assert!(check(deepest).is_ok());
        let deeper = ImpairmentFields { rate_bps: Some(1000), burst_bytes: Some(34_251), ..Default::default() };
        let err = check(deeper).unwrap_err();
        assert_eq!(err.field, "burst");
        assert!(err.reason.contains("274s"), "{}", err.reason);
        let gap_alone = ImpairmentFields {
            latency: ms(10),
            reorder: Some(Reorder { percent: Percent::ZERO, correlation: Percent::ZERO, gap: 5 }),
            ..Default::default()
        };
        assert_eq!(check(gap_alone).unwrap_err().field, "reorder.gap");
        let queue = ImpairmentFields { queue_limit_packets: Some(0), ..Default::default() };
        assert_eq!(check(queue).unwrap_err().field, "queueLimit");
        let at_max = ImpairmentFields { queue_limit_packets: Some(MAX_QUEUE_LIMIT_PACKETS), ..Default::default() };
        assert!(check(at_max).is_ok());
        let beyond = ImpairmentFields { queue_limit_packets: Some(MAX_QUEUE_LIMIT_PACKETS + 1), ..Default::default() };
        let error = check(beyond).unwrap_err();
        assert_eq!(error.field, "queueLimit");
        assert!(error.to_string().contains("maximum of 1000000"), "{error}");
    }

    #[test]
    fn deserialization_rejects_out_of_range_percent() {
        let err = serde_json::from_str::<Impairment>(r#"{"duplicate":{"percent":101}}"#).unwrap_err();
        assert!(err.to_string().contains("outside"), "{err}");
    }

    #[test]
    fn deserialization_checks_like_try_from() {
        let err = serde_json::from_str::<Impairment>(r#"{"burstBytes":32000}"#).unwrap_err();
        assert!(err.to_string().starts_with("burst: burst given without a rate"), "{err}");
        let fields: ImpairmentFields = serde_json::from_str(r#"{"burstBytes":32000}"#).unwrap();
        assert_eq!(fields.burst_bytes, Some(32_000), "the fields alone are not checked");
    }

    #[test]
    fn json_round_trip() {
        let i = check(ImpairmentFields {
            latency: ms(120),
            jitter: ms(5),
            loss: Some(Loss::Random(Correlated {
                percent: Percent::new("loss", 0.1).unwrap(),
                correlation: Percent::ZERO,
            })),
            rate_bps: Some(100_000_000),
            ..Default::default()
        })
        .unwrap();
        let back: Impairment = serde_json::from_str(&serde_json::to_string(&i).unwrap()).unwrap();
        assert_eq!(back, i);
        assert!(check(back.into()).is_ok());
    }

    #[test]
    fn equal_impairments_hash_equal() {
        let hash = |i: &Impairment| {
            let mut hasher = std::hash::DefaultHasher::new();
            i.hash(&mut hasher);
            hasher.finish()
        };
        let lossy = |percent: f64| {
            let loss =
                Loss::Random(Correlated { percent: Percent::new("loss", percent).unwrap(), ..Default::default() });
            check(ImpairmentFields { loss: Some(loss), ..Default::default() }).unwrap()
        };
        assert_eq!(lossy(-0.0), lossy(0.0));
        assert_eq!(hash(&lossy(-0.0)), hash(&lossy(0.0)), "-0 % is 0 %");
        assert_ne!(lossy(0.1), lossy(0.2));
    }
}
