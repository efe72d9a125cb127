//! The resolver against indexes recorded from the archive on 2026-11-23 (`testdata/packages/`: the stanzas of
//! the packages the rules read, verbatim), and variants of them made the way suites move on.

use super::*;

const RECORDED: [(&str, &str); 5] = [
    ("bookworm", include_str!("../../testdata/packages/2026-11-23/bookworm.Packages")),
    ("bookworm-security", include_str!("../../testdata/packages/2026-11-23/bookworm-security.Packages")),
    ("trixie", include_str!("../../testdata/packages/2026-11-23/trixie.Packages")),
    ("trixie-security", include_str!("../../testdata/packages/2026-11-23/trixie-security.Packages")),
    ("sid", include_str!("../../testdata/packages/2026-11-23/sid.Packages")),
];

fn index_with(edit: impl Fn(&str, &str) -> String) -> Index {
    let mut index = Index::default();
    for (suite, text) in RECORDED {
        index.add_suite(suite, &edit(suite, text), Kernel::wanted).unwrap();
    }
    index
}

fn recorded() -> Index {
    index_with(|_, text| text.to_owned())
}

fn versions(r: &[Resolved]) -> Vec<(String, String, String)> {
    r.iter().map(|r| (r.package.clone(), r.version.to_string(), r.suite.clone())).collect()
}

fn resolved(rule: RuleId, package: &str, version: &str) -> Resolved {
    Resolved {
        rule,
        package: package.into(),
        version: DebVersion::new(version),
        suite: "cached".into(),
        sha256: "0".repeat(64),
        depends: if rule == RuleId::SidUml { "libc6 (>= 2.38)".into() } else { String::new() },
        filename: String::new(),
        source: Source::Archive,
    }
}

#[test]
fn the_recorded_archive_resolves_every_kernel() {
    let index = recorded();
    let bookworm = Kernel::Bookworm.from_index(&index).unwrap();
    assert_eq!(
        versions(&bookworm),
        [("linux-image-6.1.0-56-amd64".into(), "6.1.192-2".into(), "bookworm-security".into())]
    );
    assert_eq!(bookworm[0].sha256, "a86e2049672f52354c4536a089203b6c82639420424d31c91cf31a181fd4d8f1");
    assert_eq!(
        bookworm[0].filename,
        "pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb"
    );
    let sid = Kernel::Sid.from_index(&index).unwrap();
    assert_eq!(
        versions(&sid),
        [
            ("user-mode-linux".into(), "7.2um1".into(), "sid".into()),
            // the pin of the day before, 2.41-12+deb13u4, is gone; trixie's newer build is picked
            ("libc6".into(), "2.41-12+deb13u5".into(), "trixie".into()),
        ]
    );
}

#[test]
fn a_new_kernel_abi_in_bookworm_security_is_followed() {
    let index = index_with(|suite, text| {
        if suite != "bookworm-security" {
            return text.to_owned();
        }
        // the next ABI lands: the meta-package moves to -57 and the -56 package leaves the suite
        text.replace("linux-image-6.1.0-56-amd64", "linux-image-6.1.0-57-amd64").replace("6.1.192-2", "6.1.195-1")
    });
    let bookworm = Kernel::Bookworm.from_index(&index).unwrap();
    assert_eq!(versions(&bookworm)[0].0, "linux-image-6.1.0-57-amd64");
    assert_eq!(versions(&bookworm)[0].1, "6.1.195-1");
}

#[test]
fn libc_follows_what_user_mode_linux_depends_on() {
    let index = index_with(|suite, text| {
        if suite == "sid" {
            text.replace("Depends: libc6 (>= 2.38)", "Depends: libc6 (>= 2.42)")
        } else {
            text.to_owned()
        }
    });
    let sid = Kernel::Sid.from_index(&index).unwrap();
    assert_eq!(versions(&sid)[1], ("libc6".into(), "2.43-7".into(), "sid".into()), "trixie's 2.41 is too old");
}

#[test]
fn a_rule_nothing_satisfies_is_an_error_naming_it() {
    // sid's user-mode-linux goes back to 6.x: below the rule's floor
    let index =
        index_with(|suite, text| if suite == "sid" { text.replace("7.2um1", "6.18um1") } else { text.to_owned() });
    let err = Kernel::Sid.from_index(&index).unwrap_err();
    assert!(matches!(err, ResolveError::Unmet { rule: RuleId::SidUml, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("rule sid-uml cannot be met: sid offers user-mode-linux 6.18um1"), "{text}");
    assert!(text.contains("version >= 7.0"), "{text}");

    // the package leaves the suite altogether
    let index = index_with(|suite, text| {
        if suite == "sid" {
            text.replace("Package: user-mode-linux", "Package: user-mode-linux-gone")
        } else {
            text.to_owned()
        }
    });
    let text = Kernel::Sid.from_index(&index).unwrap_err().to_string();
    assert!(text.contains("sid offers no user-mode-linux"), "{text}");

    // the meta-package depends on an ABI package no suite carries
    let index = index_with(|suite, text| {
        if suite == "bookworm-security" {
            text.replace("Package: linux-image-6.1.0-56-amd64", "Package: x")
        } else {
            text.to_owned()
        }
    });
    let text = Kernel::Bookworm.from_index(&index).unwrap_err().to_string();
    assert!(text.contains("rule bookworm-kernel cannot be met"), "{text}");
    assert!(text.contains("offers no linux-image-6.1.0-56-amd64"), "{text}");
}

#[test]
fn a_cached_package_the_archive_no_longer_has_is_used() {
    // yesterday's pins, prepared in the cache; today's archive has moved on
    let cached = vec![vec![
        resolved(RuleId::SidUml, "user-mode-linux", "7.2um1"),
        resolved(RuleId::UmlLibc, "libc6", "2.41-12+deb13u4"),
    ]];
    let index = recorded();
    let mut asked = false;
    let choice = choose(Kernel::Sid, &cached, false, || {
        asked = true;
        Ok(&index)
    })
    .unwrap();
    let Choice::Cached(0, packages) = choice else { panic!("{choice:?}") };
    assert_eq!(packages[1].version.as_str(), "2.41-12+deb13u4");
    assert!(packages.iter().all(|p| p.source == Source::Cache));
    assert!(!asked, "a warm cache needs nothing from the archive");

    // and when the archive cannot be read at all, even on --refresh
    let choice = choose(Kernel::Sid, &cached, true, || Err("Temporary failure resolving 'deb.debian.org'".into()));
    assert!(matches!(choice, Ok(Choice::Cached(0, _))), "{choice:?}");
}

#[test]
fn the_cache_is_not_used_when_it_does_not_satisfy_the_rule() {
    let index = recorded();
    // a cached UML 6.x (below the floor) and a libc too old for the UML: neither entry serves
    let cached = vec![
        vec![resolved(RuleId::SidUml, "user-mode-linux", "6.12um1"), resolved(RuleId::UmlLibc, "libc6", "2.41-1")],
        vec![resolved(RuleId::SidUml, "user-mode-linux", "7.2um1"), resolved(RuleId::UmlLibc, "libc6", "2.36-9")],
    ];
    let choice = choose(Kernel::Sid, &cached, false, || Ok(&index)).unwrap();
    let Choice::Fetch(packages) = choice else { panic!("{choice:?}") };
    assert_eq!(packages[1].version.as_str(), "2.41-12+deb13u5");
    let err = choose(Kernel::Sid, &cached, false, || Err("offline".into())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule sid-uml: nothing in the cache satisfies it and the archive could not be read: offline"
    );
}

#[test]
fn refresh_prefers_the_archive_and_recognises_what_is_prepared() {
    let index = recorded();
    let old = vec![resolved(RuleId::BookwormKernel, "linux-image-6.1.0-55-amd64", "6.1.192-1")];
    let choice = choose(Kernel::Bookworm, std::slice::from_ref(&old), true, || Ok(&index)).unwrap();
    let Choice::Fetch(packages) = choice else { panic!("{choice:?}") };
    assert_eq!(packages[0].package, "linux-image-6.1.0-56-amd64");

    let current = Kernel::Bookworm.from_index(&index).unwrap();
    let choice = choose(Kernel::Bookworm, &[old.clone(), current], true, || Ok(&index)).unwrap();
    assert!(matches!(choice, Choice::Current(1, _)), "{choice:?}");
    // without --refresh the newest cached entry wins, and the archive is not read
    let newer = vec![resolved(RuleId::BookwormKernel, "linux-image-6.1.0-56-amd64", "6.1.192-2")];
    let choice =
        choose(Kernel::Bookworm, &[old, newer], false, || -> Result<&Index, String> { unreachable!() }).unwrap();
    assert!(matches!(choice, Choice::Cached(1, _)), "{choice:?}");
}
