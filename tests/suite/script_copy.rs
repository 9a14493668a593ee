//! What the tests of the repository's check scripts (`scripts/check-*`, `scripts/plant-mistakes`)
//! share: a copy of `src/`,
//! `model/README.md` and one script, in a directory of its own, to break and check.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A copy of `src/`, `model/README.md` and the script, removed when dropped.
pub(crate) struct Copy {
    root: PathBuf,
    script: &'static str,
}

impl Copy {
    /// Copies the tree for `script` (a path under the repository, such as
    /// `scripts/check-architecture`); `name` tells the copies of one test apart.
    pub(crate) fn new(script: &'static str, name: &str) -> Copy {
        let stem = Path::new(script).file_name().unwrap().to_string_lossy();
        let root =
            std::env::temp_dir().join(format!("{stem}-{name}-{}", uuid::Uuid::new_v4().simple()));
        let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
        copy_tree(&repository.join("src"), &root.join("src"));
        for file in [script, "model/README.md"] {
            std::fs::create_dir_all(root.join(file).parent().unwrap()).unwrap();
            std::fs::copy(repository.join(file), root.join(file)).unwrap();
        }
        Copy { root, script }
    }

    /// Adds `line` at the end of `file` (under `src/`), creating the file if needed.
    pub(crate) fn append(&self, file: &str, line: &str) {
        let path = self.root.join("src").join(file);
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(line);
        text.push('\n');
        std::fs::write(path, text).unwrap();
    }

    /// Replaces the only occurrence of `from` in `file` (a path under the copy's root) by `to`.
    pub(crate) fn replace(&self, file: &str, from: &str, to: &str) {
        let path = self.root.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches(from).count(), 1, "{from:?} in {file}");
        std::fs::write(path, text.replace(from, to)).unwrap();
    }

    /// The script's exit code and what it printed on stderr.
    ///
    /// The copy is run by `python3`, not executed itself: executing a file this process has just
    /// written can fail with "Text file busy" while a child forked by another test thread still
    /// holds the inherited write descriptor (rust-lang/rust#114554; a CI run hit it).
    pub(crate) fn check(&self) -> (Option<i32>, String) {
        self.run(&[])
    }

    /// Runs the copy's script with `arguments` (by `python3`, as [`check`](Self::check) does):
    /// its exit code and what it printed on stderr.
    pub(crate) fn run(&self, arguments: &[&str]) -> (Option<i32>, String) {
        output(
            Command::new("python3")
                .arg(self.root.join(self.script))
                .args(arguments),
        )
    }

    /// Checks the copy: the script must fail and name `problem`.
    pub(crate) fn assert_refused(&self, problem: &str) {
        let (code, stderr) = self.check();
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(problem), "no {problem:?} in: {stderr}");
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs the checked-in `script` of the repository at `root`, as CI does.
pub(crate) fn run_script(root: &Path, script: &str) -> (Option<i32>, String) {
    output(&mut Command::new(root.join(script)))
}

fn output(command: &mut Command) -> (Option<i32>, String) {
    let output = command
        .output()
        .expect("run a check script (needs python3)");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
