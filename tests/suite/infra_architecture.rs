//! `scripts/check-architecture`, the layering rules CI enforces (DESIGN.md, "Architecture"): it
//! passes on this tree, and on a copy of it with a rule broken it fails and names the problem.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A copy of `src/` and the script, in a directory of its own, removed when dropped.
struct Copy {
    root: PathBuf,
}

impl Copy {
    fn new(name: &str) -> Copy {
        let root = std::env::temp_dir().join(format!(
            "check-architecture-{name}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
        copy_tree(&repository.join("src"), &root.join("src"));
        std::fs::create_dir_all(root.join("scripts")).unwrap();
        std::fs::copy(
            repository.join("scripts/check-architecture"),
            root.join("scripts/check-architecture"),
        )
        .unwrap();
        Copy { root }
    }

    /// Adds `line` at the end of `file` (under `src/`), creating the file if needed.
    fn append(&self, file: &str, line: &str) {
        let path = self.root.join("src").join(file);
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(line);
        text.push('\n');
        std::fs::write(path, text).unwrap();
    }

    /// The script's exit code and what it printed on stderr.
    ///
    /// The copy is run by `python3`, not executed itself: executing a file this process has just
    /// written can fail with "Text file busy" while a child forked by another test thread still
    /// holds the inherited write descriptor (rust-lang/rust#114554; a CI run hit it).
    fn check(&self) -> (Option<i32>, String) {
        output(Command::new("python3").arg(self.root.join("scripts/check-architecture")))
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

/// Runs the checked-in script, as CI does.
fn check_architecture(root: &Path) -> (Option<i32>, String) {
    output(&mut Command::new(root.join("scripts/check-architecture")))
}

fn output(command: &mut Command) -> (Option<i32>, String) {
    let output = command
        .output()
        .expect("run scripts/check-architecture (needs python3)");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn this_tree_keeps_every_rule() {
    let (code, stderr) = check_architecture(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_copy_of_this_tree_keeps_every_rule() {
    // The broken copies below differ from this one by a single line.
    let (code, stderr) = Copy::new("unchanged").check();
    assert_eq!(code, Some(0), "{stderr}");
}

/// Plants `line` at the end of `file` in a copy of `src/`: the check must fail and name `problem`.
fn refused(file: &str, line: &str, problem: &str) {
    let copy = Copy::new(file.replace(['/', '.'], "-").as_str());
    copy.append(file, line);
    let (code, stderr) = copy.check();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(problem), "no {problem:?} in: {stderr}");
}

#[test]
fn a_foundation_that_imports_a_primitive_is_refused() {
    refused(
        "fencing.rs",
        "use crate::lock::MongoDistributedLock;",
        "fencing (foundations) imports lock, a layer above it",
    );
}

#[test]
fn the_engine_that_imports_the_provider_is_refused() {
    refused(
        "lease/admin.rs",
        "use crate::provider::Provider;",
        "lease::admin (the lease engine) imports provider, a layer above it",
    );
}

#[test]
fn a_primitive_that_imports_another_is_refused() {
    refused(
        "rw_lock.rs",
        "use crate::semaphore::MongoDistributedSemaphore;",
        "primitive rw_lock imports primitive semaphore",
    );
}

#[test]
fn a_module_in_no_layer_is_refused() {
    refused(
        "newcomer.rs",
        "//! A module nobody placed.",
        "newcomer is in no layer",
    );
}

#[test]
fn an_import_cycle_is_refused() {
    // `details` imports `token` already; both are foundations, so only the cycle is wrong.
    refused(
        "token.rs",
        "use crate::details::LockDetails;",
        "import cycle: details -> token -> details",
    );
}

#[test]
fn a_primitive_that_reaches_into_the_engines_internals_is_refused() {
    refused(
        "lock.rs",
        "use crate::lease::record::{Lease, Place};",
        "lock reaches into the engine's internals (lease::record)",
    );
    refused(
        "document_lock.rs",
        "use crate::lease::{undo, Target};",
        "document_lock reaches into the engine's internals (lease::undo)",
    );
}

#[test]
fn what_the_engine_exposes_is_not_an_internal() {
    // An item of `lease` (here a function it re-exports) is its interface, not a module.
    let copy = Copy::new("engine-items");
    copy.append(
        "watch.rs",
        "use crate::lease::{create_ttl_index, ATTEMPT_SERVER_TIME};",
    );
    let (code, stderr) = copy.check();
    assert_eq!(code, Some(0), "{stderr}");
}
