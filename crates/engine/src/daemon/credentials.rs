//! The daemon's credential authority (issue 9, issue 37: split from the
//! users-file parser, daemon::users): the loaded users table, the shared key
//! of a daemon without one, the decoy answer for unknown names, and the
//! one-time tokens (minted, bound to their minter, consumed by one Auth).
//! docs/SECURITY.md describes the promises.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use ramsys_proto::control::Bytes32;
use sha2::Sha256;

use crate::daemon::users::{
    check_unique, ExportRoot, UserSpec, DEFAULT_TOKEN_TTL_S, MAX_TOKEN_TTL_S, TOKEN_PREFIX,
};
use crate::data::rate::Bucket;
use crate::transport::crypto::random32;

/// Unused tokens one user may hold at once (bounds the table).
const MAX_TOKENS_PER_USER: usize = 64;

struct User {
    key: Vec<u8>,
    root: Arc<ExportRoot>,
    max_sessions: Option<u32>,
    read_only: bool,
    /// `max_rate` (rate 0: none), shared by all the user's sessions.
    rate: Arc<Bucket>,
}

/// The loaded users table: keys read, roots opened (once, shared by users
/// with the same root).
pub struct Users {
    users: HashMap<String, User>,
}

impl Users {
    /// Read every key file and open every root; the first failure is an
    /// error naming the user.
    pub fn open(specs: &[UserSpec]) -> anyhow::Result<Users> {
        anyhow::ensure!(!specs.is_empty(), "the users table names no user");
        check_unique(specs).map_err(anyhow::Error::msg)?;
        let mut roots: HashMap<PathBuf, Arc<ExportRoot>> = HashMap::new();
        let mut users = HashMap::new();
        for s in specs {
            let key = ramsys_resources::keys::load_existing(&s.key_file)
                .map_err(|e| anyhow::anyhow!("user {}: {e:#}", s.name))?;
            let canon = s
                .root
                .canonicalize()
                .map_err(|e| anyhow::anyhow!("user {}: root {}: {e}", s.name, s.root.display()))?;
            let root = match roots.get(&canon) {
                Some(r) => r.clone(),
                None => {
                    let r = Arc::new(
                        ExportRoot::open(&canon)
                            .map_err(|e| anyhow::anyhow!("user {}: {e}", s.name))?,
                    );
                    roots.insert(canon, r.clone());
                    r
                }
            };
            users.insert(
                s.name.clone(),
                User {
                    key,
                    root,
                    max_sessions: s.max_sessions,
                    read_only: s.read_only,
                    rate: Bucket::new("user", s.name.clone(), s.max_rate.unwrap_or(0)),
                },
            );
        }
        Ok(Users { users })
    }

    /// Keep the rate buckets of users `old` has too (a reload): running
    /// sessions and new ones then share one bucket, at the new rate.
    pub fn carry_rates_from(&mut self, old: &Users) {
        for (name, u) in self.users.iter_mut() {
            if let Some(o) = old.users.get(name) {
                o.rate.set_rate(u.rate.rate());
                u.rate = o.rate.clone();
            }
        }
    }

    /// Every user's rate bucket, by name.
    pub fn rates(&self) -> Vec<Arc<Bucket>> {
        let mut v: Vec<_> = self.users.values().map(|u| u.rate.clone()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Users in the table.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Distinct export roots (to register their devices).
    pub fn roots(&self) -> Vec<Arc<ExportRoot>> {
        let mut v: Vec<Arc<ExportRoot>> = Vec::new();
        for u in self.users.values() {
            if !v.iter().any(|r| Arc::ptr_eq(r, &u.root)) {
                v.push(u.root.clone());
            }
        }
        v
    }
}

struct TokenRec {
    key: Vec<u8>,
    /// The minting user (None: the shared-key account).
    account: Option<String>,
    minter: String,
    expires: Instant,
}

/// Whom a Hello names, as far as the daemon can tell before Auth.
enum Claim {
    Shared(String),
    User(String),
    Token(String),
    Unknown,
}

/// The handshake key for a Hello and what the user gets if Auth succeeds.
pub struct Pending {
    pub key: Vec<u8>,
    claim: Claim,
}

/// What an authenticated session may do.
pub struct Grant {
    /// Name in logs and `ramsys status` ("alice", or "alice/otp-…").
    pub shown: String,
    /// The configured user whose root and limits apply (None: shared key).
    pub account: Option<String>,
    pub root: Arc<ExportRoot>,
    pub read_only: bool,
    /// Authenticated with a one-time credential (which cannot mint more).
    pub token: bool,
    /// The user's `max_rate` bucket (None: shared key), for a session where
    /// the daemon is the source (data::rate).
    pub rate: Option<Arc<Bucket>>,
    _slot: Option<SessionSlot>,
}

/// Counts a session against its user's `max_sessions` while it lives.
struct SessionSlot(Arc<Mutex<HashMap<String, u32>>>, String);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut m = self.0.lock().unwrap();
        if let Some(n) = m.get_mut(&self.1) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Why an Auth that verified is still refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Reported to the client exactly like a wrong key (unknown name, token
    /// used or expired meanwhile); the reason is for the daemon's log.
    Auth(String),
    /// A limit: the message is for the user.
    Limit(String),
}

/// The daemon's credential store: the shared key or the users table, and
/// the outstanding one-time credentials.
pub struct Credentials {
    shared_key: Vec<u8>,
    default_root: Arc<ExportRoot>,
    /// Behind a lock so a reload (SIGHUP) can swap it while sessions run;
    /// read once per connection, never per block.
    users: RwLock<Option<Arc<Users>>>,
    tokens: Mutex<HashMap<String, TokenRec>>,
    active: Arc<Mutex<HashMap<String, u32>>>,
    decoy: Bytes32,
}

fn hex_key(raw: &Bytes32) -> Vec<u8> {
    hex::encode(raw).into_bytes()
}

impl Credentials {
    pub fn new(shared_key: Vec<u8>, default_root: Arc<ExportRoot>) -> Credentials {
        Credentials {
            shared_key,
            default_root,
            users: RwLock::new(None),
            tokens: Mutex::new(HashMap::new()),
            active: Arc::new(Mutex::new(HashMap::new())),
            decoy: random32(),
        }
    }

    /// Serve this users table instead of the shared key.
    pub fn set_users(&mut self, users: Users) {
        *self.users.get_mut().unwrap() = Some(Arc::new(users));
    }

    /// Swap in a reloaded table: running sessions keep what they were
    /// granted; new ones see the new table. Users present in both keep
    /// their rate bucket (and session count) across the swap.
    pub fn replace_users(&self, mut users: Users) {
        let mut g = self.users.write().unwrap();
        if let Some(old) = g.as_ref() {
            users.carry_rates_from(old);
        }
        *g = Some(Arc::new(users));
    }

    pub fn users(&self) -> Option<Arc<Users>> {
        self.users.read().unwrap().clone()
    }

    /// A key no client holds, the same for the same name (so repeated
    /// probes of one name look like a real user's), and shaped like a key
    /// file's content (64 hex digits) so the handshake costs the same.
    fn decoy_key(&self, name: &str) -> Vec<u8> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.decoy).expect("any key length");
        m.update(name.as_bytes());
        hex_key(&m.finalize().into_bytes().into())
    }

    /// The key to run the handshake with for a Hello naming `name`.
    pub fn lookup(&self, name: &str) -> Pending {
        // Computed for every name, so a known and an unknown name cost the
        // same before the Challenge goes out.
        let users = self.users();
        let decoy = users.as_ref().map(|_| self.decoy_key(name));
        if name.starts_with(TOKEN_PREFIX) {
            let t = self.tokens.lock().unwrap();
            if let Some(r) = t.get(name).filter(|r| r.expires > Instant::now()) {
                return Pending {
                    key: r.key.clone(),
                    claim: Claim::Token(name.to_string()),
                };
            }
        }
        match &users {
            None => Pending {
                key: self.shared_key.clone(),
                claim: Claim::Shared(name.to_string()),
            },
            Some(u) => match u.users.get(name) {
                Some(user) => Pending {
                    key: user.key.clone(),
                    claim: Claim::User(name.to_string()),
                },
                None => Pending {
                    key: decoy.unwrap_or_default(),
                    claim: Claim::Unknown,
                },
            },
        }
    }

    /// After Auth verified under `p.key`: apply limits, consume a token.
    pub fn admit(&self, p: Pending) -> Result<Grant, Refusal> {
        let gone = |n: &str| Refusal::Auth(format!("one-time credential {n} used or expired"));
        let (shown, account, token) = match p.claim {
            Claim::Unknown => return Err(Refusal::Auth("unknown user".into())),
            Claim::Shared(n) => (n, None, None),
            Claim::User(n) => (n.clone(), Some(n), None),
            Claim::Token(n) => {
                let t = self.tokens.lock().unwrap();
                let r = t
                    .get(&n)
                    .filter(|r| r.expires > Instant::now())
                    .ok_or_else(|| gone(&n))?;
                (format!("{}/{n}", r.minter), r.account.clone(), Some(n))
            }
        };
        let users = self.users();
        let user = account.as_ref().and_then(|a| users.as_ref()?.users.get(a));
        let (root, read_only, rate) = match user {
            Some(u) => (u.root.clone(), u.read_only, Some(u.rate.clone())),
            None => (self.default_root.clone(), false, None),
        };
        // The limit first, so a session refused for it keeps its token.
        // Every user's sessions are counted (status and
        // ramsys_user_sessions show them), limited or not.
        let mut slot = None;
        if let (Some(a), Some(u)) = (&account, user) {
            let mut m = self.active.lock().unwrap();
            let n = m.entry(a.clone()).or_insert(0);
            if let Some(max) = u.max_sessions.filter(|max| *n >= *max) {
                return Err(Refusal::Limit(format!(
                    "user {a} already has {n} sessions (max_sessions = {max})"
                )));
            }
            *n += 1;
            slot = Some(SessionSlot(self.active.clone(), a.clone()));
        }
        // One use: whoever removes it first wins (a loser's slot is
        // released on return); a replay finds it gone.
        if let Some(n) = &token {
            let r = self
                .tokens
                .lock()
                .unwrap()
                .remove(n)
                .ok_or_else(|| gone(n))?;
            if r.expires <= Instant::now() {
                return Err(gone(n));
            }
        }
        Ok(Grant {
            shown,
            account,
            root,
            read_only,
            token: token.is_some(),
            rate,
            _slot: slot,
        })
    }

    /// The grant of `user` for a session a site peer opens on that user's
    /// behalf (Control::OnBehalf, server::relay): allowed only on a link
    /// that authenticated as the site identity `site_user` (with a users
    /// table, that user; without one, the shared key under any name). The
    /// user gets exactly what a session of its own would: its root,
    /// read-only flag and limits. `user` empty: the relaying daemon has no
    /// users table, refused by a daemon that has one.
    pub fn on_behalf(&self, link: &Grant, site_user: &str, user: &str) -> Result<Grant, String> {
        let users = self.users();
        if !self.is_site(link, site_user) {
            return Err(format!(
                "user {} may not act for another user (only the site identity may)",
                link.shown
            ));
        }
        let claim = match &users {
            None => Claim::Shared(user.to_string()),
            Some(_) if user.is_empty() => {
                return Err("the relaying daemon has no users table; this one has".into())
            }
            Some(u) if u.users.contains_key(user) && !user.starts_with(TOKEN_PREFIX) => {
                Claim::User(user.to_string())
            }
            Some(_) => return Err(format!("no user {user} here")),
        };
        self.admit(Pending {
            key: Vec::new(),
            claim,
        })
        .map_err(|r| match r {
            Refusal::Auth(m) | Refusal::Limit(m) => m,
        })
    }

    /// Is `g` the site identity (issue 34)? With a users table, the
    /// `[site] user` itself; with one shared key, any holder of it (who
    /// is as good as the operator). Never a one-time credential. Only the
    /// site identity may join the site (SiteHello) or act for a user
    /// (OnBehalf).
    pub fn is_site(&self, g: &Grant, site_user: &str) -> bool {
        !g.token
            && match self.users() {
                None => true,
                Some(_) => g.account.as_deref() == Some(site_user),
            }
    }

    /// Mint a one-time credential for the holder of `g`: (user name, raw
    /// key, lifetime in seconds). The usable key is the hex text of the raw
    /// bytes.
    pub fn mint(&self, g: &Grant, ttl_s: u32) -> Result<(String, Bytes32, u32), String> {
        if g.token {
            return Err("a one-time credential cannot mint another".into());
        }
        let ttl = match ttl_s {
            0 => DEFAULT_TOKEN_TTL_S,
            t => t.min(MAX_TOKEN_TTL_S),
        };
        let now = Instant::now();
        let mut t = self.tokens.lock().unwrap();
        t.retain(|_, r| r.expires > now);
        let mine = t.values().filter(|r| r.minter == g.shown).count();
        if mine >= MAX_TOKENS_PER_USER {
            return Err(format!(
                "{} already holds {mine} unused one-time credentials",
                g.shown
            ));
        }
        let raw = random32();
        let name = format!("{TOKEN_PREFIX}{}", hex::encode(&random32()[..16]));
        t.insert(
            name.clone(),
            TokenRec {
                key: hex_key(&raw),
                account: g.account.clone(),
                minter: g.shown.clone(),
                expires: now + Duration::from_secs(ttl as u64),
            },
        );
        Ok((name, raw, ttl))
    }

    /// Users with their roots and running sessions, for status and
    /// metrics; `only`: just that user.
    pub fn user_status(&self, only: Option<&str>) -> Vec<(String, String, u32, bool)> {
        let Some(u) = self.users() else {
            return Vec::new();
        };
        let active = self.active.lock().unwrap();
        let mut v: Vec<_> = u
            .users
            .iter()
            .filter(|(n, _)| only.is_none_or(|o| o == n.as_str()))
            .map(|(n, x)| {
                (
                    n.clone(),
                    x.root.path.display().to_string(),
                    active.get(n).copied().unwrap_or(0),
                    x.read_only,
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Outstanding (unused, unexpired) one-time credentials.
    pub fn tokens_outstanding(&self) -> usize {
        let now = Instant::now();
        self.tokens
            .lock()
            .unwrap()
            .values()
            .filter(|r| r.expires > now)
            .count()
    }

    #[cfg(test)]
    fn expire_all(&self) {
        for r in self.tokens.lock().unwrap().values_mut() {
            r.expires = Instant::now() - Duration::from_secs(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn key_file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }

    #[test]
    fn open_reports_missing_key_and_root_by_user() {
        let d = tempfile::tempdir().unwrap();
        let spec = |k: &str, r: &str| UserSpec {
            name: "alice".into(),
            key_file: d.path().join(k),
            root: d.path().join(r),
            max_sessions: None,
            read_only: false,
            max_rate: None,
        };
        std::fs::create_dir(d.path().join("root")).unwrap();
        let e = Users::open(&[spec("nokey", "root")]).err().unwrap();
        assert!(format!("{e}").contains("user alice"), "{e}");
        key_file(d.path(), "k", "0123456789abcdef0123");
        let e = Users::open(&[spec("k", "noroot")]).err().unwrap();
        assert!(format!("{e}").contains("user alice: root"), "{e}");
        assert!(Users::open(&[]).is_err());
        assert!(Users::open(&[spec("k", "root")]).is_ok());
    }

    fn store() -> (tempfile::TempDir, Credentials) {
        let d = tempfile::tempdir().unwrap();
        for n in ["a", "b", "shared"] {
            std::fs::create_dir(d.path().join(n)).unwrap();
        }
        key_file(d.path(), "ka", "aaaaaaaaaaaaaaaaaaaa");
        key_file(d.path(), "kb", "bbbbbbbbbbbbbbbbbbbb");
        let specs = vec![
            UserSpec {
                name: "alice".into(),
                key_file: d.path().join("ka"),
                root: d.path().join("a"),
                max_sessions: Some(1),
                read_only: false,
                max_rate: None,
            },
            UserSpec {
                name: "bob".into(),
                key_file: d.path().join("kb"),
                root: d.path().join("b"),
                max_sessions: None,
                read_only: true,
                max_rate: Some(1 << 20),
            },
        ];
        let def = Arc::new(ExportRoot::open(&d.path().join("shared")).unwrap());
        let mut c = Credentials::new(b"shared-key-0123456".to_vec(), def);
        c.set_users(Users::open(&specs).unwrap());
        (d, c)
    }

    #[test]
    fn users_get_their_key_root_and_limits() {
        let (d, c) = store();
        let p = c.lookup("alice");
        assert_eq!(p.key, b"aaaaaaaaaaaaaaaaaaaa");
        let g = c.admit(p).unwrap();
        assert_eq!(g.root.path, d.path().join("a").canonicalize().unwrap());
        assert!(!g.read_only);
        // max_sessions = 1: a second session waits for the first to end.
        assert!(matches!(c.admit(c.lookup("alice")), Err(Refusal::Limit(_))));
        assert_eq!(c.user_status(Some("alice"))[0].2, 1);
        drop(g);
        assert!(c.admit(c.lookup("alice")).is_ok());
        let b = c.admit(c.lookup("bob")).unwrap();
        assert!(b.read_only);
        assert!(b.root.path.ends_with("b"));
        assert_eq!(c.user_status(None).len(), 2);
        // Sessions of a user without max_sessions are counted too.
        assert_eq!(c.user_status(Some("bob"))[0].2, 1);
        drop(b);
        assert_eq!(c.user_status(Some("bob"))[0].2, 0);
    }

    /// A reload (SIGHUP) swaps the table under running sessions: their
    /// grants stand, new names work at once, and a user present before
    /// and after keeps its rate bucket (now at the new rate).
    #[test]
    fn a_reloaded_table_adds_users_and_keeps_grants_and_buckets() {
        let (d, c) = store();
        let bob = c.admit(c.lookup("bob")).unwrap();
        let bucket = bob.rate.clone().unwrap();
        assert_eq!(bucket.rate(), 1 << 20);
        assert!(matches!(c.admit(c.lookup("carol")), Err(Refusal::Auth(_))));
        key_file(d.path(), "kc", "cccccccccccccccccccc");
        let spec = |n: &str, k: &str, r: &str, rate| UserSpec {
            name: n.into(),
            key_file: d.path().join(k),
            root: d.path().join(r),
            max_sessions: None,
            read_only: false,
            max_rate: rate,
        };
        c.replace_users(
            Users::open(&[
                spec("bob", "kb", "b", Some(2 << 20)),
                spec("carol", "kc", "a", None),
            ])
            .unwrap(),
        );
        assert_eq!(c.lookup("carol").key, b"cccccccccccccccccccc");
        let carol = c.admit(c.lookup("carol")).unwrap();
        assert!(carol.root.path.ends_with("a"));
        // alice is gone for new sessions; bob's running grant still holds.
        assert!(matches!(c.admit(c.lookup("alice")), Err(Refusal::Auth(_))));
        assert!(bob.root.path.ends_with("b"));
        let bob2 = c.admit(c.lookup("bob")).unwrap();
        assert!(Arc::ptr_eq(bob2.rate.as_ref().unwrap(), &bucket));
        assert_eq!(bucket.rate(), 2 << 20);
        let names: Vec<_> = c.user_status(None).into_iter().map(|u| u.0).collect();
        assert_eq!(names, vec!["bob", "carol"]);
    }

    #[test]
    fn unknown_names_get_a_stable_decoy_and_are_refused() {
        let (_d, c) = store();
        let p1 = c.lookup("mallory");
        let p2 = c.lookup("mallory");
        assert_eq!(p1.key, p2.key);
        assert_eq!(p1.key.len(), 64);
        assert_ne!(p1.key, c.lookup("eve").key);
        assert_ne!(p1.key, c.shared_key);
        assert!(matches!(c.admit(p1), Err(Refusal::Auth(_))));
        // The shared key is not accepted in users mode, whatever the name.
        assert_ne!(c.lookup("root").key, c.shared_key);
    }

    #[test]
    fn tokens_are_single_use_bound_to_the_minter_and_expire() {
        let (_d, c) = store();
        let bob = c.admit(c.lookup("bob")).unwrap();
        let (name, raw, ttl) = c.mint(&bob, 0).unwrap();
        assert_eq!(ttl, DEFAULT_TOKEN_TTL_S);
        assert!(name.starts_with("otp-") && name.len() == 4 + 32);
        let p = c.lookup(&name);
        assert_eq!(p.key, hex::encode(raw).into_bytes());
        // A second Hello before the first Auth sees the same key, but only
        // one of the two can be admitted.
        let p2 = c.lookup(&name);
        let g = c.admit(p).unwrap();
        assert!(g.token && g.read_only);
        assert_eq!(g.account.as_deref(), Some("bob"));
        assert_eq!(g.shown, format!("bob/{name}"));
        assert!(Arc::ptr_eq(&g.root, &bob.root));
        assert!(matches!(c.admit(p2), Err(Refusal::Auth(_))));
        // Used: the name is now unknown (decoy key).
        assert_ne!(c.lookup(&name).key, hex::encode(raw).into_bytes());
        // A token cannot mint another.
        assert!(c.mint(&g, 10).is_err());
        // A token of a user at its session limit is refused but not spent.
        let alice = c.admit(c.lookup("alice")).unwrap();
        let (na, _, _) = c.mint(&alice, 0).unwrap();
        assert!(matches!(c.admit(c.lookup(&na)), Err(Refusal::Limit(_))));
        drop(alice);
        assert_eq!(c.admit(c.lookup(&na)).unwrap().shown, format!("alice/{na}"));
        // Expired: refused, even if looked up in time.
        let (n2, _, _) = c.mint(&bob, 5000).unwrap();
        let p = c.lookup(&n2);
        c.expire_all();
        assert!(matches!(c.admit(p), Err(Refusal::Auth(_))));
        assert_eq!(c.tokens_outstanding(), 0);
    }

    #[test]
    fn shared_key_mode_accepts_any_name_and_mints_for_the_root() {
        let d = tempfile::tempdir().unwrap();
        let def = Arc::new(ExportRoot::open(d.path()).unwrap());
        let c = Credentials::new(b"k".repeat(20), def.clone());
        let p = c.lookup("whoever");
        assert_eq!(p.key, b"k".repeat(20));
        let g = c.admit(p).unwrap();
        assert!(g.account.is_none());
        let (n, raw, ttl) = c.mint(&g, 99_999).unwrap();
        assert_eq!(ttl, MAX_TOKEN_TTL_S);
        let t = c.admit(c.lookup(&n)).unwrap();
        assert!(Arc::ptr_eq(&t.root, &def));
        // Replayed: the name falls back to the shared key, which the
        // token holder does not have.
        assert_ne!(c.lookup(&n).key, hex::encode(raw).into_bytes());
    }

    #[test]
    fn token_table_is_bounded_per_user() {
        let (_d, c) = store();
        let a = c.admit(c.lookup("bob")).unwrap();
        for _ in 0..MAX_TOKENS_PER_USER {
            c.mint(&a, 0).unwrap();
        }
        assert!(c.mint(&a, 0).unwrap_err().contains("unused"));
    }
}
