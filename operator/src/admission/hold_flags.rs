//! The operator's flags for the hold ([`super::hold`]), flattened into its command line, and their check before
//! anything starts: a hold that could not serve is a startup error, not a pod refused later.

use std::time::Duration;

/// The longest any held pod may wait: past an hour, a pod is better failed than held.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, clap::Args)]
pub struct HoldFlags {
    /// The image of the hold's init container, the operator's own (`isthmus-operator wait-for-links`); empty:
    /// no pod is held (docs/networklink.md, "Impaired from the first packet"). Needs --webhook-dns-name.
    #[arg(long, env = "ISTHMUS_HOLD_IMAGE", default_value = "")]
    pub hold_image: String,
    /// The pull policy of the hold's init container (the operator's own).
    #[arg(long, env = "ISTHMUS_HOLD_IMAGE_PULL_POLICY", default_value = "IfNotPresent",
          value_parser = ["IfNotPresent", "Always", "Never"])]
    pub hold_image_pull_policy: String,
    /// The MutatingWebhookConfiguration of the hold, whose `caBundle` the leader keeps; empty: none.
    #[arg(long, env = "ISTHMUS_HOLD_WEBHOOK_CONFIGURATION", default_value = "")]
    pub hold_webhook_configuration: String,
    /// How long a held pod waits for its links before its init container fails, in seconds, unless its
    /// annotation `isthmus.dev/wait-for-links-timeout` says otherwise.
    #[arg(long, env = "ISTHMUS_HOLD_TIMEOUT_SECONDS", default_value_t = 120)]
    pub hold_timeout_seconds: u64,
    /// The longest timeout a pod's annotation may ask for, in seconds (at most 3600).
    #[arg(long, env = "ISTHMUS_HOLD_MAX_TIMEOUT_SECONDS", default_value_t = 600)]
    pub hold_max_timeout_seconds: u64,
}

/// What the flags allow, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub image: String,
    pub image_pull_policy: String,
    pub configuration: Option<String>,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HoldFlagsError {
    #[error("--hold-image needs --webhook-dns-name: held pods ask the webhook's listener")]
    NoListener,
    #[error(
        "--hold-timeout-seconds ({default}) must be from 1 to --hold-max-timeout-seconds ({max}), itself at most \
         3600: a held pod that would wait longer is better failed"
    )]
    Timeouts { default: u64, max: u64 },
}

impl HoldFlags {
    /// The hold, or None when it is off; `webhook` says whether the webhooks' listener is served.
    pub fn hold(&self, webhook: bool) -> Result<Option<Hold>, HoldFlagsError> {
        if self.hold_image.is_empty() {
            return Ok(None);
        }
        if !webhook {
            return Err(HoldFlagsError::NoListener);
        }
        let (default, max) = (self.hold_timeout_seconds, self.hold_max_timeout_seconds);
        if default == 0 || default > max || Duration::from_secs(max) > MAX_TIMEOUT {
            return Err(HoldFlagsError::Timeouts { default, max });
        }
        Ok(Some(Hold {
            image: self.hold_image.clone(),
            image_pull_policy: self.hold_image_pull_policy.clone(),
            configuration: Some(self.hold_webhook_configuration.clone()).filter(|c| !c.is_empty()),
            default_timeout: Duration::from_secs(default),
            max_timeout: Duration::from_secs(max),
        }))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        hold: HoldFlags,
    }

    fn flags(args: &[&str]) -> HoldFlags {
        Cli::try_parse_from(std::iter::once("op").chain(args.iter().copied())).unwrap().hold
    }

    #[test]
    fn the_hold_is_off_without_an_image_and_checked_with_one() {
        assert_eq!(flags(&[]).hold(true), Ok(None));
        let on = flags(&["--hold-image", "r/op:1", "--hold-webhook-configuration", "isthmus-hold"]).hold(true).unwrap();
        assert_eq!(
            on,
            Some(Hold {
                image: "r/op:1".into(),
                image_pull_policy: "IfNotPresent".into(),
                configuration: Some("isthmus-hold".into()),
                default_timeout: Duration::from_secs(120),
                max_timeout: Duration::from_secs(600),
            })
        );
        assert_eq!(flags(&["--hold-image", "r/op:1"]).hold(false), Err(HoldFlagsError::NoListener));
        for (default, max) in [("0", "600"), ("601", "600"), ("120", "3601")] {
            let f = flags(&["--hold-image", "i", "--hold-timeout-seconds", default, "--hold-max-timeout-seconds", max]);
            assert!(matches!(f.hold(true), Err(HoldFlagsError::Timeouts { .. })), "{default} {max}");
        }
        assert!(Cli::try_parse_from(["op", "--hold-image-pull-policy", "Sometimes"]).is_err());
    }
}
