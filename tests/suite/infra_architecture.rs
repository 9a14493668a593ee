//! `scripts/check-architecture`, the layering rules CI enforces (DESIGN.md, "Architecture"): it
//! passes on this tree, and on a copy of it with a rule broken it fails and names the problem.

use std::path::Path;

use crate::script_copy::{Copy, run_script};

const SCRIPT: &str = "scripts/check-architecture";

/// Runs the checked-in script, as CI does.
fn check_architecture(root: &Path) -> (Option<i32>, String) {
    run_script(root, SCRIPT)
}

#[test]
fn this_tree_keeps_every_rule() {
    let (code, stderr) = check_architecture(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_copy_of_this_tree_keeps_every_rule() {
    // The broken copies below differ from this one by a single line.
    let (code, stderr) = Copy::new(SCRIPT, "unchanged").check();
    assert_eq!(code, Some(0), "{stderr}");
}

/// Plants `line` at the end of `file` in a copy of `src/`: the check must fail and name `problem`.
fn refused(file: &str, line: &str, problem: &str) {
    let copy = Copy::new(SCRIPT, file.replace(['/', '.'], "-").as_str());
    copy.append(file, line);
    copy.assert_refused(problem);
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
    let copy = Copy::new(SCRIPT, "engine-items");
    copy.append(
        "watch.rs",
        "use crate::lease::{create_ttl_index, ATTEMPT_SERVER_TIME};",
    );
    let (code, stderr) = copy.check();
    assert_eq!(code, Some(0), "{stderr}");
}
