//! Debian `Packages` indexes (deb-control(5) stanzas) as apt has already verified them: apt checks each
//! index against the suite's signed `InRelease`, and the `SHA256` of each stanza is what `apt-get download`
//! checks the `.deb` against. The rig reads them to choose packages by rule instead of by pinned version.

use std::collections::HashMap;

use super::debver::DebVersion;

/// One binary package as a suite offers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub package: String,
    pub version: DebVersion,
    /// The suite's codename (`bookworm`, `bookworm-security`, `trixie`, `sid`).
    pub suite: String,
    pub filename: String,
    pub sha256: String,
    pub size: u64,
    /// `Pre-Depends` and `Depends` as the index writes them (kept to be recorded with a resolution).
    pub depends: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    pub name: String,
    pub constraint: Option<(Relation, DebVersion)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    Earlier,
    EarlierOrEqual,
    Equal,
    LaterOrEqual,
    Later,
}

impl Relation {
    fn parse(op: &str) -> Option<Relation> {
        Some(match op {
            "<<" => Relation::Earlier,
            "<=" | "<" => Relation::EarlierOrEqual,
            "=" => Relation::Equal,
            ">=" | ">" => Relation::LaterOrEqual,
            ">>" => Relation::Later,
            _ => return None,
        })
    }
}

impl Offer {
    pub fn dependencies(&self) -> Vec<Vec<Dependency>> {
        parse_depends(&self.depends)
    }
}

/// The least version of `name` that a `Depends` field asks for (`>=`, `>>` or `=`), if any.
pub fn minimum_of(depends: &str, name: &str) -> Option<DebVersion> {
    parse_depends(depends)
        .into_iter()
        .flatten()
        .filter(|d| d.name == name)
        .filter_map(|d| match d.constraint {
            Some((Relation::LaterOrEqual | Relation::Later | Relation::Equal, v)) => Some(v),
            _ => None,
        })
        .max()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{suite} index, stanza {stanza}: {reason}")]
pub struct IndexError {
    pub suite: String,
    pub stanza: usize,
    pub reason: String,
}

/// The offers of several suites, by package name.
#[derive(Debug, Default)]
pub struct Index {
    by_name: HashMap<String, Vec<Offer>>,
}

impl Index {
    /// Adds one suite's index text, keeping only the packages `wanted` accepts (a suite's full index is tens
    /// of megabytes; the rig needs a handful of its packages).
    pub fn add_suite(&mut self, suite: &str, text: &str, wanted: impl Fn(&str) -> bool) -> Result<(), IndexError> {
        for (n, stanza) in text.split("\n\n").filter(|s| !s.trim().is_empty()).enumerate() {
            let fields = fields(stanza);
            let Some(package) = fields.get("Package") else {
                return Err(IndexError { suite: suite.into(), stanza: n, reason: "no Package field".into() });
            };
            if !wanted(package) {
                continue;
            }
            let field = |name: &str| {
                fields.get(name).map(|v| v.to_string()).ok_or_else(|| IndexError {
                    suite: suite.into(),
                    stanza: n,
                    reason: format!("package {package} has no {name} field"),
                })
            };
            let size = field("Size")?.parse().map_err(|e| IndexError {
                suite: suite.into(),
                stanza: n,
                reason: format!("package {package}: Size: {e}"),
            })?;
            let depends = [fields.get("Pre-Depends"), fields.get("Depends")]
                .into_iter()
                .flatten()
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            let offer = Offer {
                package: package.to_string(),
                version: DebVersion::new(field("Version")?),
                suite: suite.to_owned(),
                filename: field("Filename")?,
                sha256: field("SHA256")?,
                size,
                depends,
            };
            self.by_name.entry(offer.package.clone()).or_default().push(offer);
        }
        Ok(())
    }

    /// Every offer of `package` from the given suites.
    pub fn offers<'a>(&'a self, package: &str, suites: &'a [&str]) -> impl Iterator<Item = &'a Offer> + 'a {
        self.by_name.get(package).into_iter().flatten().filter(move |o| suites.contains(&o.suite.as_str()))
    }
}

/// A stanza's fields; continuation lines (starting with a space) belong to the field before them and are
/// not needed by the rig, so they are dropped.
fn fields(stanza: &str) -> HashMap<&str, &str> {
    stanza
        .lines()
        .filter(|l| !l.starts_with([' ', '\t']))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

/// `a (>= 1), b | c (= 2) [amd64], d:any` → [[a>=1], [b, c=2], [d]]
pub fn parse_depends(text: &str) -> Vec<Vec<Dependency>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| entry.split('|').map(str::trim).filter_map(parse_dependency).collect())
        .collect()
}

fn parse_dependency(text: &str) -> Option<Dependency> {
    let (name, rest) = text.split_once(['(', ' ', '[', '<']).map_or((text, ""), |(n, _)| (n, &text[n.len()..]));
    let name = name.split(':').next().unwrap_or(name).trim();
    if name.is_empty() {
        return None;
    }
    let constraint = rest.split_once('(').and_then(|(_, c)| c.split_once(')')).and_then(|(c, _)| {
        let c = c.trim();
        let split = c.find(|ch: char| !matches!(ch, '<' | '>' | '='))?;
        Some((Relation::parse(c[..split].trim())?, DebVersion::new(c[split..].trim())))
    });
    Some(Dependency { name: name.to_owned(), constraint })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_with_alternatives_relations_and_qualifiers() {
        let deps =
            parse_depends("kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool");
        assert_eq!(deps.len(), 3);
        assert_eq!(deps[0], vec![Dependency { name: "kmod".into(), constraint: None }]);
        assert_eq!(deps[1][0].constraint, Some((Relation::LaterOrEqual, DebVersion::new("4.3~"))));
        assert_eq!(
            deps[2].iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["initramfs-tools", "linux-initramfs-tool"]
        );
        let deps = parse_depends("libc6 (>= 2.38), python3:any, foo [amd64], bar (<< 2) <!nocheck>");
        assert_eq!(deps[1][0].name, "python3");
        assert_eq!(deps[2][0], Dependency { name: "foo".into(), constraint: None });
        assert_eq!(deps[3][0].constraint, Some((Relation::Earlier, DebVersion::new("2"))));
        assert!(parse_depends("").is_empty());
    }

    #[test]
    fn an_index_keeps_the_wanted_packages_of_each_suite() {
        let text = include_str!("../../testdata/packages/2026-11-23/sid.Packages");
        let mut index = Index::default();
        index.add_suite("sid", text, |p| p == "user-mode-linux").unwrap();
        let uml: Vec<_> = index.offers("user-mode-linux", &["sid"]).collect();
        assert_eq!(uml.len(), 1);
        assert_eq!(uml[0].version.as_str(), "7.2um1");
        assert_eq!(uml[0].sha256, "f947c9244fd79d481299df2ad68961f6b3b7703bff38c4b0e726f861161da62c");
        assert_eq!(uml[0].filename, "pool/main/u/user-mode-linux/user-mode-linux_7.2um1_amd64.deb");
        assert_eq!(minimum_of(&uml[0].depends, "libc6"), Some(DebVersion::new("2.38")));
        assert_eq!(index.offers("libc6", &["sid"]).count(), 0, "not wanted");
        assert_eq!(index.offers("user-mode-linux", &["trixie"]).count(), 0, "another suite");
    }

    #[test]
    fn a_stanza_without_its_checksum_is_an_error_naming_it() {
        let mut index = Index::default();
        let err = index.add_suite("sid", "Package: a\nVersion: 1\nFilename: a.deb\nSize: 3\n", |_| true).unwrap_err();
        assert_eq!(err.reason, "package a has no SHA256 field");
    }
}
