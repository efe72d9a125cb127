//! Debian version numbers ordered as dpkg orders them (deb-version(5)): epoch, then the upstream version,
//! then the revision, each compared by dpkg's alternating non-digit / digit rule in which `~` sorts before
//! everything, even the end of the string.

use std::cmp::Ordering;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct DebVersion(String);

impl DebVersion {
    pub fn new(text: impl Into<String>) -> DebVersion {
        DebVersion(text.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// (epoch, upstream, revision); a missing epoch is 0 and a missing revision is empty, as in dpkg.
    fn parts(&self) -> (u64, &str, &str) {
        let s = self.0.trim();
        let (epoch, rest) = match s.split_once(':') {
            Some((e, rest)) if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) => {
                (e.parse().unwrap_or(u64::MAX), rest)
            }
            _ => (0, s),
        };
        match rest.rsplit_once('-') {
            Some((upstream, revision)) => (epoch, upstream, revision),
            None => (epoch, rest, ""),
        }
    }
}

impl fmt::Display for DebVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Ord for DebVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        let (ea, ua, ra) = self.parts();
        let (eb, ub, rb) = other.parts();
        ea.cmp(&eb).then_with(|| verrevcmp(ua, ub)).then_with(|| verrevcmp(ra, rb))
    }
}

impl PartialOrd for DebVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// dpkg's weight of a non-digit character: `~` lowest, then the end of the part (and digits, which end a
/// non-digit run), then letters, then everything else.
fn weight(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(c) => i32::from(c) + 256,
    }
}

fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
            let (wa, wb) = (weight(a.get(i).copied()), weight(b.get(j).copied()));
            if wa != wb {
                return wa.cmp(&wb);
            }
            i += 1;
            j += 1;
        }
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while digit(a, i) && digit(b, j) {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if digit(a, i) {
            return Ordering::Greater;
        }
        if digit(b, j) {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cmp(a: &str, b: &str) -> Ordering {
        DebVersion::new(a).cmp(&DebVersion::new(b))
    }

    #[test]
    fn orders_as_dpkg() {
        // Pairs checked with `dpkg --compare-versions A lt B` on Debian 12.
        let ascending = [
            ("1.0~rc1", "1.0"),
            ("1.0", "1.0-1"),
            ("1.0-1", "1.0-1+b1"),
            ("2.41-12+deb13u4", "2.41-12+deb13u5"),
            ("2.41-12+deb13u5", "2.43-7"),
            ("6.1.176-1", "6.1.192-2"),
            ("6.1.192-1", "6.1.192-2"),
            ("6.12um1+b22", "7.2um1"),
            ("7.2um1", "7.10um1"),
            ("6.1um4+b13", "6.12um1"),
            ("1:0.9", "2:0.1"),
            ("9.9", "1:0.1"),
            ("1.0a", "1.0b"),
            ("1.0a", "1.0+"),
            ("1.0~~", "1.0~"),
            ("1.0~", "1.0"),
            ("1.01", "1.2"),
            ("0:1.0", "1.1"),
        ];
        for (lo, hi) in ascending {
            assert_eq!(cmp(lo, hi), Ordering::Less, "{lo} < {hi}");
            assert_eq!(cmp(hi, lo), Ordering::Greater, "{hi} > {lo}");
        }
        assert_eq!(cmp("1.001", "1.1"), Ordering::Equal);
        assert_eq!(cmp("0:2.38", "2.38"), Ordering::Equal);
    }

    const VERSION: &str = "([0-9]:)?[0-9][0-9a-z.+~]{0,6}(-[0-9][0-9a-z.+~]{0,3})?";

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// dpkg itself is the reference (every machine this rig runs on is Debian).
        #[test]
        fn agrees_with_dpkg(a in VERSION, b in VERSION) {
            let dpkg_says = |op: &str| std::process::Command::new("dpkg")
                .args(["--compare-versions", &a, op, &b]).status().expect("dpkg runs").success();
            let expected = if dpkg_says("lt") { Ordering::Less } else if dpkg_says("eq") { Ordering::Equal }
                           else { Ordering::Greater };
            prop_assert_eq!(cmp(&a, &b), expected, "{} vs {}", a, b);
        }

        #[test]
        fn a_total_order(a in "[0-9]{0,2}:?[0-9a-z.+~]{1,8}(-[0-9a-z.+~]{1,4})?",
                         b in "[0-9]{0,2}:?[0-9a-z.+~]{1,8}(-[0-9a-z.+~]{1,4})?",
                         c in "[0-9a-z.+~]{1,8}(-[0-9a-z.+~]{1,4})?") {
            prop_assert_eq!(cmp(&a, &b), cmp(&b, &a).reverse());
            prop_assert_eq!(cmp(&a, &a), Ordering::Equal);
            if cmp(&a, &b) != Ordering::Greater && cmp(&b, &c) != Ordering::Greater {
                prop_assert_ne!(cmp(&a, &c), Ordering::Greater);
            }
        }
    }
}
