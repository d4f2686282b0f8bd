//! What ComfyUI's web editor keeps on the server, per tenant: user data files (saved
//! workflows, templates, ...) and the settings, which ComfyUI keeps in the user data file
//! [`SETTINGS`]. This service is their one reader and writer over the store, with the bounds
//! of a tenant's user data and the per-tenant lock that serialises settings changes. It
//! answers before the plugins have loaded: the editor reads its settings first.
//!
//! Paths are checked by the caller (the ComfyUI routes' naming rules); here they are names
//! in the tenant's store, never paths of the server.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::store::{Store, StoreError, UserDataLimits, UserFile, UserWrite};

/// Largest user data file, the settings file included.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Bounds of one tenant's user data.
pub const LIMITS: UserDataLimits = UserDataLimits {
    files: 10_000,
    bytes: 256 << 20,
};
/// The user data file ComfyUI keeps settings in.
pub const SETTINGS: &str = "comfy.settings.json";

/// Why a user data operation failed.
#[derive(Debug, thiserror::Error)]
pub enum UserDataError {
    /// The settings would be over [`MAX_FILE_BYTES`] once written.
    #[error("the settings are over {MAX_FILE_BYTES} bytes")]
    SettingsTooLarge,
    /// The store failed while `doing` something.
    #[error("{doing}: {error}")]
    Store {
        /// What was being done, for the log.
        doing: &'static str,
        /// What went wrong.
        error: StoreError,
    },
}

/// A change to a tenant's settings.
#[derive(Debug, Clone)]
pub enum SettingsChange {
    /// Sets one setting.
    One {
        /// The setting's id.
        id: String,
        /// Its new value.
        value: Json,
    },
    /// Sets each of these settings, leaving the others.
    Many(Map<String, Json>),
}

/// ComfyUI's user data and settings of every tenant, over `store`.
#[derive(Clone, Copy)]
pub struct UserData<'a> {
    store: &'a dyn Store,
    settings_locks: &'a SettingsLocks,
}

fn failed(doing: &'static str) -> impl FnOnce(StoreError) -> UserDataError {
    move |error| UserDataError::Store { doing, error }
}

impl<'a> UserData<'a> {
    /// The user data in `store`, with settings changes serialised by `settings_locks` (one
    /// set of locks for every change of this process).
    pub fn new(store: &'a dyn Store, settings_locks: &'a SettingsLocks) -> Self {
        Self { store, settings_locks }
    }

    /// `tenant`'s files whose path starts with `prefix`, by path.
    pub async fn files(&self, tenant: &str, prefix: &str) -> Result<Vec<UserFile>, UserDataError> {
        self.store
            .user_files(tenant, prefix)
            .await
            .map_err(failed("reading user data"))
    }

    /// `tenant`'s file `path` with its content.
    pub async fn file(&self, tenant: &str, path: &str) -> Result<Option<(UserFile, Vec<u8>)>, UserDataError> {
        self.store
            .user_file(tenant, path)
            .await
            .map_err(failed("reading user data"))
    }

    /// Writes `tenant`'s file `path` within [`LIMITS`]; an existing one is replaced only when
    /// `overwrite`.
    pub async fn put(
        &self,
        tenant: &str,
        path: &str,
        content: Vec<u8>,
        overwrite: bool,
    ) -> Result<UserWrite, UserDataError> {
        self.store
            .put_user_file(tenant, path, content, overwrite, LIMITS)
            .await
            .map_err(failed("writing user data"))
    }

    /// Deletes `tenant`'s file `path`; false when there was none.
    pub async fn delete(&self, tenant: &str, path: &str) -> Result<bool, UserDataError> {
        self.store
            .delete_user_file(tenant, path)
            .await
            .map_err(failed("deleting user data"))
    }

    /// Moves `tenant`'s file `from` to `to`; an existing `to` is replaced only when
    /// `overwrite`.
    pub async fn rename(
        &self,
        tenant: &str,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<UserWrite, UserDataError> {
        self.store
            .move_user_file(tenant, from, to, overwrite)
            .await
            .map_err(failed("moving user data"))
    }

    /// `tenant`'s settings; none saved yet (or a settings file that is not a JSON object)
    /// is `{}`.
    pub async fn settings(&self, tenant: &str) -> Result<Map<String, Json>, UserDataError> {
        let file = self.file(tenant, SETTINGS).await?;
        Ok(file
            .and_then(|(_, content)| serde_json::from_slice::<Json>(&content).ok())
            .and_then(|v| match v {
                Json::Object(map) => Some(map),
                _ => None,
            })
            .unwrap_or_default())
    }

    /// Applies `change` to `tenant`'s settings. Changes of one tenant run one at a time, so
    /// concurrent changes of different settings all land.
    pub async fn change_settings(&self, tenant: &str, change: SettingsChange) -> Result<UserWrite, UserDataError> {
        let _settings = self.settings_locks.lock(tenant).await;
        let mut current = self.settings(tenant).await?;
        match change {
            SettingsChange::One { id, value } => {
                current.insert(id, value);
            }
            SettingsChange::Many(changes) => current.extend(changes),
        }
        let content = serde_json::to_vec_pretty(&Json::Object(current)).unwrap_or_default();
        if content.len() as u64 > MAX_FILE_BYTES {
            return Err(UserDataError::SettingsTooLarge);
        }
        self.store
            .put_user_file(tenant, SETTINGS, content, true, LIMITS)
            .await
            .map_err(failed("writing settings"))
    }
}

/// One lock per tenant for the read-modify-write of its settings file. A tenant's lock is
/// dropped once nobody holds it.
#[derive(Debug, Default)]
pub struct SettingsLocks(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl SettingsLocks {
    /// Holds `tenant`'s lock until the guard drops.
    async fn lock(&self, tenant: &str) -> SettingsGuard<'_> {
        let lock = {
            let mut locks = self.0.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(tenant.to_string()).or_default().clone()
        };
        SettingsGuard {
            _held: lock.clone().lock_owned().await,
            lock,
            locks: self,
            tenant: tenant.to_string(),
        }
    }

    /// How many tenants' locks are kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A tenant's settings lock, held.
struct SettingsGuard<'a> {
    _held: tokio::sync::OwnedMutexGuard<()>,
    lock: Arc<tokio::sync::Mutex<()>>,
    locks: &'a SettingsLocks,
    tenant: String,
}

impl Drop for SettingsGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.locks.0.lock().unwrap_or_else(|e| e.into_inner());
        // The map's, this guard's and the held guard's references: nobody else waits.
        if Arc::strong_count(&self.lock) <= 3 {
            locks.remove(&self.tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("weft.db")).unwrap();
        (dir, Arc::new(store))
    }

    #[tokio::test]
    async fn concurrent_changes_of_different_settings_all_land() {
        let (_dir, store) = store();
        let locks = SettingsLocks::default();
        let data = UserData::new(store.as_ref(), &locks);
        let changes = (0..16).map(|i| {
            data.change_settings(
                "t",
                SettingsChange::One {
                    id: format!("s{i}"),
                    value: Json::from(i),
                },
            )
        });
        for written in futures::future::join_all(changes).await {
            assert!(matches!(written.unwrap(), UserWrite::Written(_)));
        }
        let settings = data.settings("t").await.unwrap();
        assert_eq!(settings.len(), 16);
        assert_eq!(settings["s7"], Json::from(7));
        assert_eq!(locks.kept(), 0, "a lock nobody holds is dropped");
    }

    #[tokio::test]
    async fn settings_over_the_file_bound_are_refused_and_the_old_ones_stay() {
        let (_dir, store) = store();
        let locks = SettingsLocks::default();
        let data = UserData::new(store.as_ref(), &locks);
        let small = SettingsChange::One {
            id: "a".into(),
            value: Json::from(1),
        };
        data.change_settings("t", small).await.unwrap();
        let huge = SettingsChange::One {
            id: "b".into(),
            value: Json::from("x".repeat(MAX_FILE_BYTES as usize)),
        };
        let refused = data.change_settings("t", huge).await;
        assert!(matches!(refused, Err(UserDataError::SettingsTooLarge)), "{refused:?}");
        let settings = data.settings("t").await.unwrap();
        assert_eq!(settings.keys().collect::<Vec<_>>(), ["a"]);
    }

    #[tokio::test]
    async fn a_settings_file_that_is_not_an_object_reads_as_no_settings() {
        let (_dir, store) = store();
        let locks = SettingsLocks::default();
        let data = UserData::new(store.as_ref(), &locks);
        data.put("t", SETTINGS, b"[1, 2]".to_vec(), true).await.unwrap();
        assert!(data.settings("t").await.unwrap().is_empty());
    }
}
