//! Which Debian packages the rig boots, as rules rather than pinned versions: a pinned version leaves the
//! archive when its suite moves on (sid with every upload, bookworm-security with each kernel ABI, trixie at
//! point releases), and a suite that breaks on a calendar is not one anybody can rely on.
//!
//! Integrity does not come from a pin either: apt verifies each index against the suite's signed `InRelease`
//! and each `.deb` against its index's SHA256; the rig records the version and hash it resolved in every
//! report, so each result is traceable to exact packages.
//!
//! A rule is first answered from the cache (a warm machine needs nothing from the archive, and does not
//! change kernels under a developer's feet); the archive is read when nothing cached satisfies it, or on
//! `--refresh`.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::debver::DebVersion;
use super::packages::{Index, Offer, minimum_of};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleId {
    BookwormKernel,
    SidUml,
    UmlLibc,
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleId::BookwormKernel => "bookworm-kernel",
            RuleId::SidUml => "sid-uml",
            RuleId::UmlLibc => "uml-libc",
        })
    }
}

/// How a rule names its package.
#[derive(Debug, Clone, Copy)]
pub enum Pick {
    Named(&'static str),
    /// The first dependency of the newest `meta` whose name starts with `prefix`: Debian's kernel ABI
    /// packages (`linux-image-6.1.0-56-amd64`) change name, their meta-package does not.
    DependencyOf {
        meta: &'static str,
        prefix: &'static str,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub id: RuleId,
    /// Suites in groups of preference: the newest satisfying offer of the first group that has one wins.
    pub suites: &'static [&'static [&'static str]],
    pub pick: Pick,
    pub at_least: Option<&'static str>,
    pub below: Option<&'static str>,
    /// Why the bounds are what they are.
    pub reason: &'static str,
}

pub const BOOKWORM_KERNEL: Rule = Rule {
    id: RuleId::BookwormKernel,
    suites: &[&["bookworm-security", "bookworm"]],
    pick: Pick::DependencyOf { meta: "linux-image-amd64", prefix: "linux-image-" },
    at_least: Some("6.1"),
    below: Some("6.2"),
    reason: "Debian bookworm's stock kernel, the 6.1 long-term series that most clusters of its age run",
};

pub const SID_UML: Rule = Rule {
    id: RuleId::SidUml,
    suites: &[&["sid"]],
    pick: Pick::Named("user-mode-linux"),
    at_least: Some("7.0"),
    below: None,
    reason: "older User-Mode Linux builds crash on CPUs with AMX; 7.x sizes the XSAVE area from the host",
};

/// Its lower bound is raised to what the chosen `user-mode-linux` depends on.
pub const UML_LIBC: Rule = Rule {
    id: RuleId::UmlLibc,
    suites: &[&["trixie", "trixie-security"], &["sid"]],
    pick: Pick::Named("libc6"),
    at_least: Some("2.38"),
    below: None,
    reason: "linux.uml needs a newer glibc than the host's; only its ld.so and libc.so.6 are used, from the cache",
};

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suites = self.suites.iter().map(|g| g.join(" or ")).collect::<Vec<_>>().join(", else ");
        match self.pick {
            Pick::Named(name) => write!(f, "{}: {name} from {suites}", self.id)?,
            Pick::DependencyOf { meta, prefix } => {
                write!(f, "{}: the {prefix}* package that {meta} depends on, from {suites}", self.id)?
            }
        }
        match (self.at_least, self.below) {
            (Some(lo), Some(hi)) => write!(f, ", {lo} <= version < {hi}"),
            (Some(lo), None) => write!(f, ", version >= {lo}"),
            (None, Some(hi)) => write!(f, ", version < {hi}"),
            (None, None) => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Cache,
    Archive,
}

/// A package a rule chose: what the report records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub rule: RuleId,
    pub package: String,
    pub version: DebVersion,
    pub suite: String,
    pub sha256: String,
    /// The package's `Pre-Depends` and `Depends`, as its index wrote them.
    pub depends: String,
    /// The archive path, for a download (empty when read from the cache).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filename: String,
    pub source: Source,
}

impl Resolved {
    fn from_offer(rule: RuleId, offer: &Offer) -> Resolved {
        Resolved {
            rule,
            package: offer.package.clone(),
            version: offer.version.clone(),
            suite: offer.suite.clone(),
            sha256: offer.sha256.clone(),
            depends: offer.depends.clone(),
            filename: offer.filename.clone(),
            source: Source::Archive,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("rule {rule} cannot be met: {found} (the rule: {described})")]
    Unmet { rule: RuleId, described: String, found: String },
    #[error("rule {rule}: nothing in the cache satisfies it and the archive could not be read: {why}")]
    NoArchive { rule: RuleId, why: String },
}

impl Rule {
    /// The version bounds, with `extra_min` (what another chosen package depends on) raising the lower one.
    fn admits(&self, version: &DebVersion, extra_min: Option<&DebVersion>) -> bool {
        self.at_least.is_none_or(|lo| *version >= DebVersion::new(lo))
            && self.below.is_none_or(|hi| *version < DebVersion::new(hi))
            && extra_min.is_none_or(|lo| version >= lo)
    }

    fn names(&self, package: &str) -> bool {
        match self.pick {
            Pick::Named(name) => package == name,
            Pick::DependencyOf { prefix, .. } => package.starts_with(prefix),
        }
    }

    /// The newest cached package that satisfies the rule. A cached kernel is accepted by its name's pattern
    /// and bounds: what the meta-package depends on today is a question for the archive.
    pub fn from_cache<'a>(&self, extra_min: Option<&DebVersion>, cached: &'a [Resolved]) -> Option<&'a Resolved> {
        cached
            .iter()
            .filter(|c| c.rule == self.id && self.names(&c.package) && self.admits(&c.version, extra_min))
            .max_by(|a, b| a.version.cmp(&b.version))
    }

    /// The package the archive's (verified) indexes offer under this rule.
    pub fn from_index(&self, extra_min: Option<&DebVersion>, index: &Index) -> Result<Resolved, ResolveError> {
        let unmet = |found: String| ResolveError::Unmet { rule: self.id, described: self.to_string(), found };
        let mut seen = Vec::new();
        for group in self.suites {
            let name = match self.pick {
                Pick::Named(name) => name.to_owned(),
                Pick::DependencyOf { meta, prefix } => {
                    let Some(newest) = newest(index.offers(meta, group)) else {
                        seen.push(format!("{} offers no {meta}", group.join("/")));
                        continue;
                    };
                    let dependency = newest.dependencies().into_iter().flatten().find(|d| d.name.starts_with(prefix));
                    match dependency {
                        Some(d) => d.name,
                        None => {
                            seen.push(format!("{meta} {} depends on no {prefix}* package", newest.version));
                            continue;
                        }
                    }
                }
            };
            let offers: Vec<&Offer> = index.offers(&name, group).collect();
            if let Some(best) = newest(offers.iter().copied().filter(|o| self.admits(&o.version, extra_min))) {
                return Ok(Resolved::from_offer(self.id, best));
            }
            if offers.is_empty() {
                seen.push(format!("{} offers no {name}", group.join("/")));
            }
            seen.extend(offers.iter().map(|o| format!("{} offers {name} {}", o.suite, o.version)));
        }
        let extra =
            extra_min.map(|m| format!("; at least {m} is needed by another chosen package")).unwrap_or_default();
        Err(unmet(format!("{}{extra}", seen.join(", "))))
    }
}

fn newest<'a>(offers: impl Iterator<Item = &'a Offer>) -> Option<&'a Offer> {
    offers.max_by(|a, b| a.version.cmp(&b.version))
}

/// The kernels the rig boots, each with its rules in resolution order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    Bookworm,
    Sid,
}

impl Kernel {
    pub const ALL: [Kernel; 2] = [Kernel::Bookworm, Kernel::Sid];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Bookworm => "bookworm",
            Kernel::Sid => "sid",
        }
    }

    pub fn parse(s: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn rules(self) -> &'static [Rule] {
        match self {
            Kernel::Bookworm => &[BOOKWORM_KERNEL],
            Kernel::Sid => &[SID_UML, UML_LIBC],
        }
    }

    /// The lower bound a rule inherits from packages chosen before it: libc6 must satisfy linux.uml.
    fn extra_min(rule: &Rule, chosen: &[Resolved]) -> Option<DebVersion> {
        match rule.id {
            RuleId::UmlLibc => {
                chosen.iter().find(|r| r.rule == RuleId::SidUml).and_then(|u| minimum_of(&u.depends, "libc6"))
            }
            RuleId::BookwormKernel | RuleId::SidUml => None,
        }
    }

    /// Every rule answered from one prepared cache entry's packages, or None if one of them is not.
    pub fn from_cache(self, cached: &[Resolved]) -> Option<Vec<Resolved>> {
        let mut chosen: Vec<Resolved> = Vec::new();
        for rule in self.rules() {
            let found = rule.from_cache(Self::extra_min(rule, &chosen).as_ref(), cached)?;
            chosen.push(Resolved { source: Source::Cache, ..found.clone() });
        }
        Some(chosen)
    }

    /// Every rule answered from the archive.
    pub fn from_index(self, index: &Index) -> Result<Vec<Resolved>, ResolveError> {
        let mut chosen: Vec<Resolved> = Vec::new();
        for rule in self.rules() {
            let found = rule.from_index(Self::extra_min(rule, &chosen).as_ref(), index)?;
            chosen.push(found);
        }
        Ok(chosen)
    }

    /// The package names a resolution of this kernel reads from the indexes.
    pub fn wanted(package: &str) -> bool {
        Kernel::ALL.iter().flat_map(|k| k.rules()).any(|r| match r.pick {
            Pick::Named(name) => package == name,
            Pick::DependencyOf { meta, prefix } => package == meta || package.starts_with(prefix),
        })
    }
}

/// What to boot for one kernel: a prepared cache entry, or packages to fetch from the archive.
#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    /// The index into the prepared entries given.
    Cached(usize, Vec<Resolved>),
    Fetch(Vec<Resolved>),
    /// The archive's choice is already prepared (after `--refresh`).
    Current(usize, Vec<Resolved>),
}

/// The policy: cache first (newest satisfying entry) unless `refresh`; then the archive; with `refresh` and
/// an unreadable archive, the cache still serves. `index` is called only when the archive is needed.
pub fn choose<'a>(
    kernel: Kernel,
    prepared: &[Vec<Resolved>],
    refresh: bool,
    index: impl FnOnce() -> Result<&'a Index, String>,
) -> Result<Choice, ResolveError> {
    let cached = || {
        prepared
            .iter()
            .enumerate()
            .filter_map(|(i, p)| kernel.from_cache(p).map(|r| (i, r)))
            .max_by(|(_, a), (_, b)| a[0].version.cmp(&b[0].version))
    };
    if !refresh && let Some((i, packages)) = cached() {
        return Ok(Choice::Cached(i, packages));
    }
    let index = match index() {
        Ok(index) => index,
        Err(why) => {
            return match cached() {
                Some((i, packages)) => Ok(Choice::Cached(i, packages)),
                None => Err(ResolveError::NoArchive { rule: kernel.rules()[0].id, why }),
            };
        }
    };
    let fetch = kernel.from_index(index)?;
    let same = |p: &Vec<Resolved>| {
        p.len() == fetch.len()
            && p.iter()
                .zip(&fetch)
                .all(|(a, b)| a.package == b.package && a.version == b.version && a.sha256 == b.sha256)
    };
    Ok(match prepared.iter().position(same) {
        Some(i) => {
            Choice::Current(i, prepared[i].iter().map(|r| Resolved { source: Source::Cache, ..r.clone() }).collect())
        }
        None => Choice::Fetch(fetch),
    })
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
