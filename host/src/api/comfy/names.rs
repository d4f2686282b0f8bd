//! ComfyUI file names (`filename`, `subfolder`, `type`) as names of the tenant's assets.
//!
//! An `input` file is the tenant's newest upload under `subfolder/filename`. An `output` or
//! `temp` file whose subfolder is one of the tenant's job ids is that job's output of that
//! name (history lists outputs so); any other `output`/`temp` name is an upload made with
//! that type. Nothing here is ever a path on the server.

/// A ComfyUI folder type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FolderType {
    /// Uploads.
    Input,
    /// Outputs.
    Output,
    /// Temporary outputs (previews).
    Temp,
}

impl FolderType {
    /// Parses ComfyUI's `type`; absent is `default`.
    pub(super) fn parse(text: Option<&str>, default: FolderType) -> Result<FolderType, String> {
        match text.filter(|t| !t.is_empty()) {
            None => Ok(default),
            Some("input") => Ok(FolderType::Input),
            Some("output") => Ok(FolderType::Output),
            Some("temp") => Ok(FolderType::Temp),
            Some(other) => Err(format!("type {other:?} is not one of input, output, temp")),
        }
    }

    /// ComfyUI's name.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            FolderType::Input => "input",
            FolderType::Output => "output",
            FolderType::Temp => "temp",
        }
    }
}

/// Longest file name or subfolder accepted.
const MAX_NAME: usize = 512;

/// Refuses a name that could be read as a path outside the tenant's names: empty (when
/// `required`), a NUL byte, a `..`, an absolute path or a drive letter, or over-long.
pub(super) fn check(text: &str, what: &str, required: bool) -> Result<(), String> {
    if text.is_empty() {
        return if required {
            Err(format!("{what} is empty"))
        } else {
            Ok(())
        };
    }
    if text.len() > MAX_NAME {
        return Err(format!("{what} is longer than {MAX_NAME} bytes"));
    }
    if text.contains('\0') {
        return Err(format!("{what} contains a NUL byte"));
    }
    if text.contains("..") {
        return Err(format!("{what} contains `..`"));
    }
    let bytes = text.as_bytes();
    if text.starts_with('/') || text.starts_with('\\') || (bytes.len() >= 2 && bytes[1] == b':') {
        return Err(format!("{what} is an absolute path"));
    }
    Ok(())
}

/// Splits ComfyUI's `name [output]` annotation off a file name.
pub(super) fn split_annotation(name: &str) -> (&str, Option<FolderType>) {
    for kind in [FolderType::Input, FolderType::Output, FolderType::Temp] {
        if let Some(stem) = name.strip_suffix(&format!(" [{}]", kind.as_str())) {
            return (stem, Some(kind));
        }
    }
    (name, None)
}

/// The asset name an upload of `kind` into `subfolder` named `name` is stored under.
pub(super) fn upload_key(kind: FolderType, subfolder: &str, name: &str) -> String {
    let subfolder = subfolder.trim_matches('/');
    let path = if subfolder.is_empty() {
        name.to_string()
    } else {
        format!("{subfolder}/{name}")
    };
    match kind {
        FolderType::Input => path,
        other => format!("[{}] {path}", other.as_str()),
    }
}

/// Whether an asset name is one the `LoadImage` combo lists: an input upload with a name
/// the rules accept.
pub(super) fn is_listed_input(key: &str) -> bool {
    !key.starts_with('[') && check(key, "name", true).is_ok()
}

/// What a ComfyUI file reference names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FileRef {
    /// An upload, by its asset name.
    Upload(String),
    /// Output `name` of job `job_id`.
    Output {
        /// The job.
        job_id: String,
        /// The output's file name.
        name: String,
    },
}

/// Resolves `filename` (possibly annotated) in `subfolder` of folder type `kind`.
pub(super) fn resolve(filename: &str, subfolder: &str, kind: FolderType) -> Result<FileRef, String> {
    let (name, annotated) = split_annotation(filename);
    let kind = annotated.unwrap_or(kind);
    check(name, "filename", true)?;
    check(subfolder, "subfolder", false)?;
    let (name, subfolder) = match name.rsplit_once('/') {
        // `subfolder/name` in the file name itself, as combos list them.
        Some((dir, base)) if subfolder.is_empty() => (base, dir),
        _ => (name, subfolder),
    };
    if kind != FolderType::Input {
        if let Ok(job) = uuid::Uuid::parse_str(subfolder.trim_matches('/')) {
            return Ok(FileRef::Output {
                job_id: job.hyphenated().to_string(),
                name: name.to_string(),
            });
        }
    }
    Ok(FileRef::Upload(upload_key(kind, subfolder, name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_are_refused() {
        for bad in ["../x.png", "a/../b.png", "/etc/passwd", "\\x", "C:x", "a\0b", ""] {
            assert!(resolve(bad, "", FolderType::Input).is_err(), "{bad:?}");
        }
        assert!(resolve("x.png", "../up", FolderType::Input).is_err());
        assert!(resolve("x.png", "/abs", FolderType::Output).is_err());
    }

    #[test]
    fn names_map_onto_assets() {
        assert_eq!(
            resolve("x.png", "", FolderType::Input),
            Ok(FileRef::Upload("x.png".into()))
        );
        assert_eq!(
            resolve("d/x.png", "", FolderType::Input),
            Ok(FileRef::Upload("d/x.png".into()))
        );
        assert_eq!(
            resolve("x.png [temp]", "", FolderType::Input),
            Ok(FileRef::Upload("[temp] x.png".into()))
        );
        let job = "0b5f7a2e-3c44-4f7e-9a55-0f0e1d2c3b4a";
        assert_eq!(
            resolve("o.png", job, FolderType::Output),
            Ok(FileRef::Output {
                job_id: job.into(),
                name: "o.png".into()
            })
        );
        assert!(!is_listed_input("[output] x.png"));
        assert!(is_listed_input("x.png"));
    }
}
