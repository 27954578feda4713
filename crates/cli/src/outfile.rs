//! Files and folders a command was asked to write (`--output`, `--plot`,
//! `--trace-out`, `--json`, `--csv`, `--html`, `--out`, `--logs`,
//! `--plot-dir`), checked before any work starts: a missing parent folder is
//! created (as `mkdir -p` would), and a path that cannot be written fails at
//! once with one line naming the flag, the path and what to do. A run of an
//! hour must not end with nowhere to put its result.
//!
//! Every command calls [`prepare`] (a file) or [`prepare_dir`] (a folder)
//! for each such flag, after file names are filled in (`{rank}`, `{host}`)
//! and before it samples, runs or connects.

use std::path::{Path, PathBuf};

/// Why a file or folder the command was asked to write cannot be.
#[derive(Debug, thiserror::Error)]
pub enum OutFileError {
    /// The parent folder is missing and could not be made.
    #[error("{flag} {}: cannot create the folder {} ({error}); create it, or name a file in a folder you can write to", .path.display(), .dir.display())]
    Folder {
        /// The flag.
        flag: String,
        /// The file or folder asked for.
        path: PathBuf,
        /// The folder that could not be made.
        dir: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// A file was asked for, a folder is there.
    #[error("{flag} {}: is a folder; name a file in it ({})", .path.display(), .path.join("FILE").display())]
    IsFolder {
        /// The flag.
        flag: String,
        /// The folder.
        path: PathBuf,
    },
    /// A folder was asked for, a file is there.
    #[error("{flag} {}: is a file, not a folder; name a folder (it is created if missing)", .path.display())]
    IsFile {
        /// The flag.
        flag: String,
        /// The file.
        path: PathBuf,
    },
    /// The file (or a file in the folder) cannot be created or opened for writing.
    #[error("{flag} {}: cannot write there ({error}); name a file in a folder you can write to", .path.display())]
    NotWritable {
        /// The flag.
        flag: String,
        /// The path.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// A chart flag names neither `.svg` nor `.png`.
    #[error("{flag} {}: name a .svg or .png file", .path.display())]
    ImageExtension {
        /// The flag.
        flag: String,
        /// The file.
        path: PathBuf,
    },
}

/// Makes `path` writable as a file before the work that fills it: its
/// parent folder is created when missing, and the file is opened for
/// writing (an existing file is left as it is, a new one is removed again),
/// so a folder in its place or a read-only folder fails now, not after the run.
pub fn prepare(flag: &str, path: &Path) -> Result<(), OutFileError> {
    if path.is_dir() {
        return Err(OutFileError::IsFolder {
            flag: flag.into(),
            path: path.into(),
        });
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        make_folder(flag, path, dir)?;
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|error| OutFileError::NotWritable {
            flag: flag.into(),
            path: path.into(),
            error,
        })?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// [`prepare`] for a chart: `.svg` or `.png`, then writable.
pub fn prepare_image(flag: &str, path: &Path) -> Result<(), OutFileError> {
    if crate::plot::check_image_path(path).is_err() {
        return Err(OutFileError::ImageExtension {
            flag: flag.into(),
            path: path.into(),
        });
    }
    prepare(flag, path)
}

/// Makes `dir` a folder files can be written into: created when missing,
/// refused when it is a file or cannot be written.
pub fn prepare_dir(flag: &str, dir: &Path) -> Result<(), OutFileError> {
    if dir.is_file() {
        return Err(OutFileError::IsFile {
            flag: flag.into(),
            path: dir.into(),
        });
    }
    make_folder(flag, dir, dir)?;
    let probe = dir.join(format!(".memprof-write-check-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(|error| OutFileError::NotWritable {
        flag: flag.into(),
        path: dir.into(),
        error,
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn make_folder(flag: &str, path: &Path, dir: &Path) -> Result<(), OutFileError> {
    std::fs::create_dir_all(dir).map_err(|error| OutFileError::Folder {
        flag: flag.into(),
        path: path.into(),
        dir: dir.into(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tmp(PathBuf);
    impl Tmp {
        fn new(name: &str) -> Tmp {
            let p =
                std::env::temp_dir().join(format!("memprof-outfile-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Tmp(p)
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_missing_parent_folder_is_created_and_no_file_is_left_behind() {
        let t = Tmp::new("parent");
        let f = t.0.join("out/deeper/host-rank0.json");
        prepare("--output", &f).unwrap();
        assert!(f.parent().unwrap().is_dir());
        assert!(!f.exists(), "the check leaves no empty file");
        // An existing file is kept as it is.
        std::fs::write(&f, "kept").unwrap();
        prepare("--output", &f).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "kept");
        prepare("--output", Path::new("relative-name-only.json")).unwrap();
    }

    #[test]
    fn a_folder_in_the_way_is_one_line_naming_flag_and_path() {
        let t = Tmp::new("blocked");
        let file = t.0.join("file");
        std::fs::write(&file, "").unwrap();
        let e = prepare("--output", &file.join("r.json"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--output "), "{e}");
        assert!(e.contains("cannot create the folder"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = prepare("--csv", &t.0).unwrap_err().to_string();
        assert!(e.contains("is a folder; name a file in it"), "{e}");
        let e = prepare_dir("--plot-dir", &file).unwrap_err().to_string();
        assert!(e.contains("--plot-dir") && e.contains("is a file"), "{e}");
        let e = prepare_image("--plot", &t.0.join("a.jpg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--plot") && e.contains(".svg or .png"), "{e}");
    }

    #[test]
    fn a_folder_is_created_and_checked_writable() {
        let t = Tmp::new("dir");
        let d = t.0.join("charts/run1");
        prepare_dir("--plot-dir", &d).unwrap();
        assert!(d.is_dir());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "no probe left");
    }
}
