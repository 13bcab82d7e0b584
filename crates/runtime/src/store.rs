//! The state store: one SQLite file under the home directory.
//!
//! Several `sandhost` processes may share one home: every write is a short
//! transaction, the database runs in WAL mode with a busy timeout, and state
//! changes that must happen once (claiming a lease for clean-up, say) are
//! compare-and-set updates that report whether this process won.
//!
//! Records here are inner types: they are not serializable; JSON columns hold
//! provider metadata and configs as text.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, Row};
use sandhost_contract::resolve::LeasePolicy;
use serde_json::Value;

use crate::error::RuntimeError;

pub(crate) type Result<T> = std::result::Result<T, RuntimeError>;

/// The database file's name inside the home directory.
pub const DB_FILE: &str = "sandhost.db";

/// Embedded migrations; `PRAGMA user_version` holds how many have been applied.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema
    "CREATE TABLE environments (
        id          TEXT PRIMARY KEY,
        driver_key  TEXT NOT NULL,
        config      TEXT NOT NULL,
        shared      INTEGER NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX shared_environments ON environments (driver_key, config) WHERE shared = 1;
    CREATE TABLE leases (
        id                 TEXT PRIMARY KEY,
        environment_id     TEXT NOT NULL REFERENCES environments(id),
        policy             TEXT NOT NULL,
        state              TEXT NOT NULL,
        provider_lease_id  TEXT,
        plugin_id          TEXT NOT NULL,
        plugin_version     TEXT NOT NULL,
        driver_key         TEXT NOT NULL,
        metadata           TEXT NOT NULL DEFAULT '{}',
        outcome            TEXT,
        outcome_reason     TEXT,
        expires_at         INTEGER,
        created_at         INTEGER NOT NULL,
        updated_at         INTEGER NOT NULL
    );
    CREATE INDEX leases_by_environment ON leases (environment_id, policy, state);
    CREATE TABLE sandboxes (
        id             TEXT PRIMARY KEY,
        lease_id       TEXT NOT NULL REFERENCES leases(id),
        provider       TEXT NOT NULL,
        template_name  TEXT NOT NULL,
        template_yaml  TEXT NOT NULL,
        state          TEXT NOT NULL,
        created_at     INTEGER NOT NULL,
        expires_at     INTEGER
    );
    CREATE TABLE runs (
        id           TEXT PRIMARY KEY,
        lease_id     TEXT NOT NULL REFERENCES leases(id),
        sandbox_id   TEXT,
        command      TEXT NOT NULL,
        started_at   INTEGER NOT NULL,
        finished_at  INTEGER,
        exit_code    INTEGER,
        timed_out    INTEGER NOT NULL DEFAULT 0
    );",
];

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs() as i64
}

/// A fresh random id with a readable prefix (`sbx-`, `lease-`, ...).
pub fn new_id(prefix: &str) -> String {
    let u = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &u[..16])
}

/// Where a lease is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Row written, provider acquire in flight (or the process died during it).
    Acquiring,
    /// The provider holds the lease.
    Active,
    /// Released: a retained lease may be resumed.
    Released,
    /// Claimed by one process for destruction.
    Destroying,
    /// Gone at the provider.
    Destroyed,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquiring => "acquiring",
            Self::Active => "active",
            Self::Released => "released",
            Self::Destroying => "destroying",
            Self::Destroyed => "destroyed",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "acquiring" => Self::Acquiring,
            "active" => Self::Active,
            "released" => Self::Released,
            "destroying" => Self::Destroying,
            _ => Self::Destroyed,
        }
    }
}

fn policy_str(p: LeasePolicy) -> &'static str {
    match p {
        LeasePolicy::Ephemeral => "ephemeral",
        LeasePolicy::ReuseByEnvironment => "reuse_by_environment",
    }
}

/// How a lease came to be (recorded with a reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    Created,
    Resumed,
    Replacement,
}

impl LeaseOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Resumed => "resumed",
            Self::Replacement => "replacement",
        }
    }
}

/// One lease row.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    pub id: String,
    pub environment_id: String,
    pub policy: LeasePolicy,
    pub state: LeaseState,
    pub provider_lease_id: Option<String>,
    pub plugin_id: String,
    pub plugin_version: String,
    pub driver_key: String,
    pub metadata: Value,
    pub outcome: Option<String>,
    pub outcome_reason: Option<String>,
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What a new lease row needs; it starts in [`LeaseState::Acquiring`].
#[derive(Debug, Clone)]
pub struct NewLease<'a> {
    pub environment_id: &'a str,
    pub policy: LeasePolicy,
    pub plugin_id: &'a str,
    pub plugin_version: &'a str,
    pub driver_key: &'a str,
}

/// One sandbox row.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRecord {
    pub id: String,
    pub lease_id: String,
    pub provider: String,
    pub template_name: String,
    pub template_yaml: String,
    pub state: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

/// The store: one connection to the home's database.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

const LEASE_COLUMNS: &str = "id, environment_id, policy, state, provider_lease_id, plugin_id, \
     plugin_version, driver_key, metadata, outcome, outcome_reason, expires_at, created_at, updated_at";

fn lease_from_row(r: &Row<'_>) -> rusqlite::Result<LeaseRecord> {
    let policy: String = r.get(2)?;
    let state: String = r.get(3)?;
    let metadata: String = r.get(8)?;
    Ok(LeaseRecord {
        id: r.get(0)?,
        environment_id: r.get(1)?,
        policy: LeasePolicy::from_wire(&policy).unwrap_or(LeasePolicy::Ephemeral),
        state: LeaseState::parse(&state),
        provider_lease_id: r.get(4)?,
        plugin_id: r.get(5)?,
        plugin_version: r.get(6)?,
        driver_key: r.get(7)?,
        metadata: serde_json::from_str(&metadata).unwrap_or(Value::Null),
        outcome: r.get(9)?,
        outcome_reason: r.get(10)?,
        expires_at: r.get(11)?,
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
    })
}

const SANDBOX_COLUMNS: &str =
    "id, lease_id, provider, template_name, template_yaml, state, created_at, expires_at";

fn sandbox_from_row(r: &Row<'_>) -> rusqlite::Result<SandboxRecord> {
    Ok(SandboxRecord {
        id: r.get(0)?,
        lease_id: r.get(1)?,
        provider: r.get(2)?,
        template_name: r.get(3)?,
        template_yaml: r.get(4)?,
        state: r.get(5)?,
        created_at: r.get(6)?,
        expires_at: r.get(7)?,
    })
}

impl Store {
    /// Open (creating if needed) the store in `home`, and migrate it.
    pub fn open(home: &Path) -> Result<Self> {
        std::fs::create_dir_all(home).map_err(|source| RuntimeError::Home {
            path: home.display().to_string(),
            source,
        })?;
        let path = home.join(DB_FILE);
        let open_err = |source| RuntimeError::StoreOpen {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(&path).map_err(open_err)?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open_err)?;
        let mut store = Self { conn, path };
        store.migrate()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of migrations applied.
    pub fn schema_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(RuntimeError::store("reading the schema version"))
    }

    /// The schema version this build knows.
    pub fn supported_schema_version() -> i64 {
        MIGRATIONS.len() as i64
    }

    fn migrate(&mut self) -> Result<()> {
        // An immediate transaction serialises concurrent first opens of one home.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(RuntimeError::store("starting the migration"))?;
        let found: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(RuntimeError::store("reading the schema version"))?;
        let supported = Self::supported_schema_version();
        if found > supported {
            return Err(RuntimeError::StoreTooNew {
                path: self.path.display().to_string(),
                found,
                supported,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            tx.execute_batch(sql)
                .map_err(RuntimeError::store("applying a migration"))?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(RuntimeError::store("recording the schema version"))?;
        }
        tx.commit()
            .map_err(RuntimeError::store("committing the migration"))
    }

    /// The environment for this driver key and config, created on first use.
    /// The same driver key and config always map to the same environment.
    pub fn environment_for(&self, driver_key: &str, config: &Value) -> Result<String> {
        let config = config.to_string();
        self.conn
            .execute(
                "INSERT OR IGNORE INTO environments (id, driver_key, config, shared, created_at)
                 VALUES (?1, ?2, ?3, 1, ?4)",
                params![new_id("env"), driver_key, config, now_secs()],
            )
            .map_err(RuntimeError::store("creating an environment"))?;
        self.conn
            .query_row(
                "SELECT id FROM environments WHERE driver_key = ?1 AND config = ?2 AND shared = 1",
                params![driver_key, config],
                |r| r.get(0),
            )
            .map_err(RuntimeError::store("reading an environment"))
    }

    /// A new environment private to one long-lived sandbox: its retained
    /// lease is found again by this environment and no other.
    pub fn private_environment(&self, driver_key: &str, config: &Value) -> Result<String> {
        let id = new_id("env");
        self.conn
            .execute(
                "INSERT INTO environments (id, driver_key, config, shared, created_at)
                 VALUES (?1, ?2, ?3, 0, ?4)",
                params![id, driver_key, config.to_string(), now_secs()],
            )
            .map_err(RuntimeError::store("creating an environment"))?;
        Ok(id)
    }

    /// The driver key and config of an environment.
    pub fn environment(&self, id: &str) -> Result<(String, Value)> {
        let (key, config): (String, String) = self
            .conn
            .query_row(
                "SELECT driver_key, config FROM environments WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(RuntimeError::store("reading an environment"))?
            .ok_or_else(|| RuntimeError::NotFound {
                what: "environment",
                id: id.into(),
            })?;
        Ok((key, serde_json::from_str(&config).unwrap_or(Value::Null)))
    }

    /// Write a new lease row in the `acquiring` state, before the provider is
    /// asked: a crash during acquisition leaves a row that recovery finds.
    pub fn insert_lease(&self, new: &NewLease<'_>) -> Result<LeaseRecord> {
        let id = new_id("lease");
        let now = now_secs();
        self.conn
            .execute(
                "INSERT INTO leases (id, environment_id, policy, state, plugin_id, plugin_version,
                                     driver_key, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)",
                params![
                    id,
                    new.environment_id,
                    policy_str(new.policy),
                    LeaseState::Acquiring.as_str(),
                    new.plugin_id,
                    new.plugin_version,
                    new.driver_key,
                    now
                ],
            )
            .map_err(RuntimeError::store("inserting a lease"))?;
        self.lease(&id)
    }

    /// Record what the provider answered for an acquired or resumed lease.
    pub fn lease_acquired(
        &self,
        id: &str,
        provider_lease_id: &str,
        metadata: &Value,
        expires_at: Option<i64>,
        outcome: LeaseOutcome,
        reason: &str,
    ) -> Result<()> {
        let n = self
            .conn
            .execute(
                "UPDATE leases SET state = 'active', provider_lease_id = ?2, metadata = ?3,
                        expires_at = ?4, outcome = ?5, outcome_reason = ?6, updated_at = ?7
                 WHERE id = ?1",
                params![
                    id,
                    provider_lease_id,
                    metadata.to_string(),
                    expires_at,
                    outcome.as_str(),
                    reason,
                    now_secs()
                ],
            )
            .map_err(RuntimeError::store("recording an acquired lease"))?;
        if n == 0 {
            return Err(RuntimeError::NotFound {
                what: "lease",
                id: id.into(),
            });
        }
        Ok(())
    }

    /// Move a lease from `from` to `to` if and only if it is in `from` now.
    /// Returns whether this call made the change: of several processes racing
    /// to claim one lease, exactly one sees `true`.
    pub fn transition_lease(&self, id: &str, from: LeaseState, to: LeaseState) -> Result<bool> {
        let n = self
            .conn
            .execute(
                "UPDATE leases SET state = ?3, updated_at = ?4 WHERE id = ?1 AND state = ?2",
                params![id, from.as_str(), to.as_str(), now_secs()],
            )
            .map_err(RuntimeError::store("changing a lease's state"))?;
        Ok(n == 1)
    }

    /// Claim a lease whose row is exactly as `seen` (same state and
    /// `updated_at`), moving it to `to`: of several processes that found the
    /// same stuck or expired row, exactly one wins.
    pub fn claim_lease(&self, seen: &LeaseRecord, to: LeaseState) -> Result<bool> {
        let n = self
            .conn
            .execute(
                "UPDATE leases SET state = ?4, updated_at = max(?5, updated_at + 1)
                 WHERE id = ?1 AND state = ?2 AND updated_at = ?3",
                params![
                    seen.id,
                    seen.state.as_str(),
                    seen.updated_at,
                    to.as_str(),
                    now_secs()
                ],
            )
            .map_err(RuntimeError::store("claiming a lease"))?;
        Ok(n == 1)
    }

    pub fn lease(&self, id: &str) -> Result<LeaseRecord> {
        self.conn
            .query_row(
                &format!("SELECT {LEASE_COLUMNS} FROM leases WHERE id = ?1"),
                [id],
                lease_from_row,
            )
            .optional()
            .map_err(RuntimeError::store("reading a lease"))?
            .ok_or_else(|| RuntimeError::NotFound {
                what: "lease",
                id: id.into(),
            })
    }

    /// The newest retained (reuse-by-environment) lease of an environment
    /// that is active or released, if any.
    pub fn retained_lease(&self, environment_id: &str) -> Result<Option<LeaseRecord>> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {LEASE_COLUMNS} FROM leases
                     WHERE environment_id = ?1 AND policy = 'reuse_by_environment'
                       AND state IN ('active', 'released')
                     ORDER BY created_at DESC, rowid DESC LIMIT 1"
                ),
                [environment_id],
                lease_from_row,
            )
            .optional()
            .map_err(RuntimeError::store("finding a retained lease"))
    }

    /// Leases that need clean-up: expired active/released leases, and leases
    /// stuck in `acquiring` or `destroying` for longer than `stuck_after` secs
    /// (their process died).
    pub fn leases_needing_cleanup(&self, now: i64, stuck_after: i64) -> Result<Vec<LeaseRecord>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {LEASE_COLUMNS} FROM leases
                 WHERE (state IN ('active', 'released') AND expires_at IS NOT NULL AND expires_at <= ?1)
                    OR (state IN ('acquiring', 'destroying') AND updated_at <= ?1 - ?2)
                 ORDER BY created_at"
            ))
            .map_err(RuntimeError::store("finding leases to clean up"))?;
        let rows = stmt
            .query_map(params![now, stuck_after], lease_from_row)
            .map_err(RuntimeError::store("finding leases to clean up"))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(RuntimeError::store("finding leases to clean up"))
    }

    pub fn insert_sandbox(&self, s: &SandboxRecord) -> Result<()> {
        self.conn
            .execute(
                &format!("INSERT INTO sandboxes ({SANDBOX_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                params![
                    s.id,
                    s.lease_id,
                    s.provider,
                    s.template_name,
                    s.template_yaml,
                    s.state,
                    s.created_at,
                    s.expires_at
                ],
            )
            .map_err(RuntimeError::store("inserting a sandbox"))?;
        Ok(())
    }

    pub fn sandbox(&self, id: &str) -> Result<SandboxRecord> {
        self.conn
            .query_row(
                &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"),
                [id],
                sandbox_from_row,
            )
            .optional()
            .map_err(RuntimeError::store("reading a sandbox"))?
            .ok_or_else(|| RuntimeError::NotFound {
                what: "sandbox",
                id: id.into(),
            })
    }

    pub fn sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_at, id"
            ))
            .map_err(RuntimeError::store("listing sandboxes"))?;
        let rows = stmt
            .query_map([], sandbox_from_row)
            .map_err(RuntimeError::store("listing sandboxes"))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(RuntimeError::store("listing sandboxes"))
    }

    /// Point a sandbox at a replacement lease.
    pub fn set_sandbox_lease(
        &self,
        id: &str,
        lease_id: &str,
        expires_at: Option<i64>,
    ) -> Result<()> {
        self.conn
            .execute(
                "UPDATE sandboxes SET lease_id = ?2, expires_at = ?3 WHERE id = ?1",
                params![id, lease_id, expires_at],
            )
            .map_err(RuntimeError::store("updating a sandbox"))?;
        Ok(())
    }

    /// Sandboxes that use a lease.
    pub fn sandboxes_of_lease(&self, lease_id: &str) -> Result<Vec<SandboxRecord>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE lease_id = ?1"
            ))
            .map_err(RuntimeError::store("listing sandboxes"))?;
        let rows = stmt
            .query_map([lease_id], sandbox_from_row)
            .map_err(RuntimeError::store("listing sandboxes"))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(RuntimeError::store("listing sandboxes"))
    }

    /// Remove a sandbox row; returns whether it existed.
    pub fn delete_sandbox(&self, id: &str) -> Result<bool> {
        let n = self
            .conn
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])
            .map_err(RuntimeError::store("deleting a sandbox"))?;
        Ok(n == 1)
    }
}
