//! Who may read `/metrics` by a bearer token: the convention of controller-runtime's `WithAuthenticationAndAuthorization`
//! filter and kube-rbac-proxy, shared by the agent and the operator.
//!
//! A scraper (Prometheus) presents its ServiceAccount token as `Authorization: Bearer <token>`. The token is
//! authenticated with a TokenReview (`authentication.k8s.io/v1`) and the user it names is authorised with a
//! SubjectAccessReview (`authorization.k8s.io/v1`) for `get` on the non-resource URL [`METRICS_PATH`] (what the
//! chart's `<fullname>-metrics-reader` ClusterRole grants). The answers:
//! - no token, a malformed `Authorization` header, or a token the API server does not authenticate: 401;
//! - an authenticated user without the permission: 403;
//! - the API server could not be asked (a failed review): 503, never cached.
//!
//! Decisions are cached ([`DecisionCache`]) so that a scrape every few seconds costs no review: an allowed token
//! for [`ALLOWED_TTL`], a refused one for [`DENIED_TTL`], at most [`MAX_ENTRIES`] tokens. The cache holds the
//! SHA-256 of each token ([`TokenKey`]), never the token: a memory dump of the agent yields no credential.
//!
//! The decision logic and the cache are pure; [`KubeReviewer`] ([`apiserver`]) is the thin shell that asks the API
//! server.

mod apiserver;

pub use self::apiserver::KubeReviewer;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The path the reviews authorise, and that the serving code serves.
pub const METRICS_PATH: &str = "/metrics";
/// The verb the reviews authorise.
pub const METRICS_VERB: &str = "get";
/// How long an allowed token is trusted without a new review.
pub const ALLOWED_TTL: Duration = Duration::from_secs(120);
/// How long a refused token (unauthenticated or forbidden) is refused without a new review.
pub const DENIED_TTL: Duration = Duration::from_secs(30);
/// The most tokens the cache remembers.
pub const MAX_ENTRIES: usize = 1024;
/// The longest `Authorization` header looked at (API server tokens are a few kB at most).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A cacheable answer about one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Authenticated and allowed `get` on [`METRICS_PATH`].
    Allowed,
    /// No token, or one the API server does not authenticate.
    Unauthenticated,
    /// Authenticated, but without the permission.
    Forbidden,
}

/// What one request got: a [`Decision`], or a review that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Allowed,
    Unauthenticated,
    Forbidden,
    /// The TokenReview or SubjectAccessReview could not be made.
    Error,
}

impl Outcome {
    /// The value of the `outcome` label of the binaries' counters.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Forbidden => "forbidden",
            Outcome::Error => "error",
        }
    }

    /// The HTTP status a refusal is answered with (200 for [`Outcome::Allowed`]: serve).
    pub fn status(self) -> u16 {
        match self {
            Outcome::Allowed => 200,
            Outcome::Unauthenticated => 401,
            Outcome::Forbidden => 403,
            Outcome::Error => 503,
        }
    }

    /// What a refused request is told in its body (None for [`Outcome::Allowed`]); its headers are
    /// [`Outcome::refusal_headers`].
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            Outcome::Allowed => None,
            Outcome::Unauthenticated => Some("a ServiceAccount token is required (Authorization: Bearer)"),
            Outcome::Forbidden => Some("the token's user may not get the non-resource URL /metrics"),
            Outcome::Error => Some("the token could not be reviewed (TokenReview/SubjectAccessReview)"),
        }
    }

    /// Adds the headers a refusal carries: a 401 names the scheme it wants, `WWW-Authenticate: Bearer`
    /// (RFC 6750), so that a client that sent no token learns which one.
    pub fn refusal_headers(self, headers: &mut http::HeaderMap) {
        if self == Outcome::Unauthenticated {
            headers.insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
        }
    }

    /// All outcomes, for counters that should show every series from the start.
    pub const ALL: [Outcome; 4] = [Outcome::Allowed, Outcome::Unauthenticated, Outcome::Forbidden, Outcome::Error];
}

impl Outcome {
    /// What [`MetricsAuth::authorize`] came to.
    pub fn of(result: &Result<Decision, ReviewError>) -> Self {
        result.as_ref().map_or(Outcome::Error, |d| (*d).into())
    }
}

impl From<Decision> for Outcome {
    fn from(decision: Decision) -> Self {
        match decision {
            Decision::Allowed => Outcome::Allowed,
            Decision::Unauthenticated => Outcome::Unauthenticated,
            Decision::Forbidden => Outcome::Forbidden,
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value (scheme case-insensitive, as RFC 9110 has it);
/// None when there is none, the scheme is another, the token is empty, has whitespace, or is too long.
pub fn bearer_token(header: Option<&[u8]>) -> Option<&str> {
    let header = std::str::from_utf8(header?).ok()?;
    if header.len() > MAX_TOKEN_BYTES + 7 {
        return None;
    }
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim_start_matches(' ').trim_end();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(char::is_whitespace))
        .then_some(token)
}

/// The cache's key for a token: its SHA-256, so that the token itself is never kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    pub fn of(token: &str) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0; 32];
        key.copy_from_slice(digest.as_ref());
        Self(key)
    }
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Decisions by token hash, each until its own expiry, at most `max_entries` of them.
#[derive(Debug)]
pub struct DecisionCache {
    entries: HashMap<TokenKey, (Decision, Instant)>,
    max_entries: usize,
    allowed_ttl: Duration,
    denied_ttl: Duration,
}

impl Default for DecisionCache {
    fn default() -> Self {
        Self::new(MAX_ENTRIES, ALLOWED_TTL, DENIED_TTL)
    }
}

impl DecisionCache {
    pub fn new(max_entries: usize, allowed_ttl: Duration, denied_ttl: Duration) -> Self {
        Self { entries: HashMap::new(), max_entries, allowed_ttl, denied_ttl }
    }

    /// The decision for `key` when one is remembered and still in force at `now`.
    pub fn get(&mut self, key: &TokenKey, now: Instant) -> Option<Decision> {
        match self.entries.get(key) {
            Some(&(decision, expires)) if now < expires => Some(decision),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `decision` from `now`. When the cache is full, the expired entries go first, then the one that
    /// expires soonest, so that the bound holds whatever tokens callers send.
    pub fn insert(&mut self, key: TokenKey, decision: Decision, now: Instant) {
        if self.max_entries == 0 {
            return;
        }
        let ttl = if decision == Decision::Allowed { self.allowed_ttl } else { self.denied_ttl };
        if !self.entries.contains_key(&key) && self.entries.len() >= self.max_entries {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.max_entries
                && let Some(soonest) = self.entries.iter().min_by_key(|(_, (_, expires))| *expires).map(|(k, _)| *k)
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, (decision, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Why a review could not be made (the request is answered 503 and nothing is cached).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("TokenReview: {0}")]
    TokenReview(#[source] kube::Error),
    #[error("SubjectAccessReview: {0}")]
    SubjectAccessReview(#[source] kube::Error),
    #[error("the API server answered the TokenReview without a user")]
    NoUser,
}

/// Asks who a token is and whether it may read [`METRICS_PATH`].
pub trait Reviewer: Send + Sync {
    fn review(&self, token: &str) -> impl Future<Output = Result<Decision, ReviewError>> + Send;
}

/// A [`Reviewer`] and its [`DecisionCache`]: what the serving code asks for each request.
#[derive(Debug)]
pub struct MetricsAuth<R> {
    reviewer: R,
    cache: Mutex<DecisionCache>,
}

impl<R: Reviewer> MetricsAuth<R> {
    pub fn new(reviewer: R, cache: DecisionCache) -> Self {
        Self { reviewer, cache: Mutex::new(cache) }
    }

    /// The decision for a request with this `Authorization` header value, or why none could be made (the
    /// caller logs it and answers 503; [`Outcome::of`]).
    pub async fn authorize(&self, authorization: Option<&[u8]>) -> Result<Decision, ReviewError> {
        let Some(token) = bearer_token(authorization) else { return Ok(Decision::Unauthenticated) };
        let key = TokenKey::of(token);
        if let Some(decision) = self.lock().get(&key, Instant::now()) {
            return Ok(decision);
        }
        let decision = self.reviewer.review(token).await?;
        self.lock().insert(key, decision, Instant::now());
        Ok(decision)
    }

    /// Decisions remembered now.
    pub fn cached(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DecisionCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as Map;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer_token(Some(b"Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(Some(b"bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some(b"BEARER  abc ")), Some("abc"));
        for bad in [&b""[..], b"Bearer", b"Bearer ", b"Basic abc", b"Bearer a b", b"abc", b"Bearer \xff"] {
            assert_eq!(bearer_token(Some(bad)), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(bearer_token(None), None);
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(bearer_token(Some(long.as_bytes())), None);
    }

    #[test]
    fn the_key_is_the_sha256_of_the_token() {
        // sha256("abc"), FIPS 180-2's first test vector.
        assert_eq!(
            format!("{:?}", TokenKey::of("abc")),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(TokenKey::of("abc"), TokenKey::of("abd"));
    }

    #[test]
    fn allowed_and_denied_decisions_expire_after_their_own_ttl() {
        let t0 = Instant::now();
        let mut cache = DecisionCache::new(8, Duration::from_secs(120), Duration::from_secs(30));
        let (ok, no, bad) = (TokenKey::of("ok"), TokenKey::of("no"), TokenKey::of("bad"));
        cache.insert(ok, Decision::Allowed, t0);
        cache.insert(no, Decision::Forbidden, t0);
        cache.insert(bad, Decision::Unauthenticated, t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(cache.get(&ok, at(29)), Some(Decision::Allowed));
        assert_eq!(cache.get(&no, at(29)), Some(Decision::Forbidden));
        assert_eq!(cache.get(&bad, at(29)), Some(Decision::Unauthenticated));
        assert_eq!(cache.get(&no, at(30)), None);
        assert_eq!(cache.get(&bad, at(30)), None);
        assert_eq!(cache.get(&ok, at(119)), Some(Decision::Allowed));
        assert_eq!(cache.get(&ok, at(120)), None);
        assert!(cache.is_empty(), "expired entries are dropped when read");
    }

    #[test]
    fn the_cache_never_holds_more_than_its_bound() {
        let t0 = Instant::now();
        let mut cache = DecisionCache::new(3, Duration::from_secs(120), Duration::from_secs(30));
        for i in 0..100u64 {
            cache.insert(TokenKey::of(&format!("t{i}")), Decision::Forbidden, t0 + Duration::from_millis(i));
            assert!(cache.len() <= 3);
        }
        // The newest stay; the one expiring soonest went each time.
        assert_eq!(cache.get(&TokenKey::of("t99"), t0), Some(Decision::Forbidden));
        assert_eq!(cache.get(&TokenKey::of("t0"), t0), None);
        // An allowed token outlives denied ones inserted at the same time: they go first.
        let t1 = t0 + Duration::from_secs(1);
        cache.insert(TokenKey::of("allowed"), Decision::Allowed, t1);
        for i in 0..10 {
            cache.insert(TokenKey::of(&format!("d{i}")), Decision::Forbidden, t1);
        }
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&TokenKey::of("allowed"), t1), Some(Decision::Allowed));
        // Expired entries make room before anything in force is evicted.
        let later = t1 + Duration::from_secs(31);
        cache.insert(TokenKey::of("new"), Decision::Forbidden, later);
        assert_eq!(cache.get(&TokenKey::of("allowed"), later), Some(Decision::Allowed));
        assert_eq!(cache.len(), 2);
        // A zero bound caches nothing.
        let mut none = DecisionCache::new(0, ALLOWED_TTL, DENIED_TTL);
        none.insert(TokenKey::of("x"), Decision::Allowed, t0);
        assert!(none.is_empty());
    }

    /// Answers from a table, counting the reviews it makes.
    struct Table {
        answers: Map<&'static str, Decision>,
        reviews: AtomicUsize,
    }

    impl Reviewer for Table {
        async fn review(&self, token: &str) -> Result<Decision, ReviewError> {
            self.reviews.fetch_add(1, Ordering::SeqCst);
            match token {
                "broken" => Err(ReviewError::NoUser),
                _ => Ok(self.answers.get(token).copied().unwrap_or(Decision::Unauthenticated)),
            }
        }
    }

    fn auth() -> MetricsAuth<Table> {
        let answers = Map::from([("reader", Decision::Allowed), ("stranger", Decision::Forbidden)]);
        MetricsAuth::new(Table { answers, reviews: AtomicUsize::new(0) }, DecisionCache::default())
    }

    #[tokio::test]
    async fn requests_get_401_403_or_200_and_repeated_tokens_are_not_reviewed_again() {
        let auth = auth();
        assert_eq!(Outcome::of(&auth.authorize(None).await), Outcome::Unauthenticated);
        assert_eq!(Outcome::of(&auth.authorize(Some(b"Basic abc")).await), Outcome::Unauthenticated);
        assert_eq!(auth.reviewer.reviews.load(Ordering::SeqCst), 0, "no review without a token");
        assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer forged")).await), Outcome::Unauthenticated);
        assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer stranger")).await), Outcome::Forbidden);
        assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer reader")).await), Outcome::Allowed);
        assert_eq!(auth.reviewer.reviews.load(Ordering::SeqCst), 3);
        for _ in 0..5 {
            assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer reader")).await), Outcome::Allowed);
            assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer stranger")).await), Outcome::Forbidden);
            assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer forged")).await), Outcome::Unauthenticated);
        }
        assert_eq!(auth.reviewer.reviews.load(Ordering::SeqCst), 3, "cached");
        assert_eq!(
            [Outcome::Allowed, Outcome::Unauthenticated, Outcome::Forbidden, Outcome::Error].map(Outcome::status),
            [200, 401, 403, 503]
        );
    }

    #[test]
    fn only_a_401_names_the_scheme_it_wants() {
        for outcome in Outcome::ALL {
            let mut headers = http::HeaderMap::new();
            outcome.refusal_headers(&mut headers);
            let expected = (outcome == Outcome::Unauthenticated).then_some("Bearer");
            assert_eq!(headers.get(http::header::WWW_AUTHENTICATE).map(|v| v.to_str().unwrap()), expected);
            assert_eq!(headers.len(), usize::from(expected.is_some()), "{outcome:?}");
        }
    }

    #[tokio::test]
    async fn a_failed_review_is_an_error_and_not_cached() {
        let auth = auth();
        assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer broken")).await), Outcome::Error);
        assert_eq!(Outcome::of(&auth.authorize(Some(b"Bearer broken")).await), Outcome::Error);
        assert_eq!(auth.reviewer.reviews.load(Ordering::SeqCst), 2);
        assert_eq!(auth.cached(), 0);
    }

    #[tokio::test]
    async fn the_cache_keeps_hashes_not_tokens() {
        let auth = auth();
        let token = "eyJhbGciOiJSUzI1NiJ9.secret-claims.signature";
        let _ = Outcome::of(&auth.authorize(Some(format!("Bearer {token}").as_bytes())).await);
        assert_eq!(auth.cached(), 1);
        let dump = format!("{:?}", auth.cache.lock().unwrap());
        assert!(!dump.contains(token) && !dump.contains("secret-claims"), "{dump}");
        assert!(dump.contains(&format!("{:?}", TokenKey::of(token))), "{dump}");
    }
}
