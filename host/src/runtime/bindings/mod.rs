//! The generated host bindings of both node contracts, one module per version: a leaf that
//! only names the host-held resource types (`super::value`) the WIT resources map onto.
//! Everything that lowers values into them or implements their imports sits above it.

pub(crate) mod v0_1;
pub(crate) mod v0_2;

/// A 0.2.0 asset reference as the 0.1.0 implementations take it (the records are the same).
impl From<v0_2::wit::AssetRef> for v0_1::wit::AssetRef {
    fn from(a: v0_2::wit::AssetRef) -> Self {
        v0_1::wit::AssetRef {
            id: a.id,
            hash: a.hash,
            file_path: a.file_path,
        }
    }
}

/// A 0.1.0 implementation's node error as 0.2.0 returns it (the records are the same).
impl From<v0_1::wit::NodeError> for v0_2::wit::NodeError {
    fn from(e: v0_1::wit::NodeError) -> Self {
        v0_2::wit::NodeError {
            code: e.code,
            message: e.message,
        }
    }
}
