//! `scripts/check-write-paths`, which CI runs: `model/README.md` lists every place in `src/` that
//! sends a write to MongoDB, with the model configuration that runs it. It passes on this tree;
//! on a copy with a write planted, added or removed it fails and names the place.

use std::path::Path;

use crate::script_copy::{Copy, run_script};

const SCRIPT: &str = "scripts/check-write-paths";

#[test]
fn this_tree_lists_every_write_path() {
    let (code, stderr) = run_script(Path::new(env!("CARGO_MANIFEST_DIR")), SCRIPT);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Checks a copy changed by `change`: the check must fail and name `problem`.
fn refused(name: &str, change: impl FnOnce(&Copy), problem: &str) {
    let copy = Copy::new(SCRIPT, name);
    let (code, stderr) = copy.check();
    assert_eq!(code, Some(0), "the unchanged copy: {stderr}");
    change(&copy);
    copy.assert_refused(problem);
}

#[test]
fn a_write_in_a_function_the_table_does_not_list_is_refused() {
    refused(
        "new-function",
        |copy| {
            copy.append(
                "lease/admin.rs",
                "pub(crate) async fn take_every_lock(collection: &Collection<Document>) {\n    \
                 let _ = collection\n        .update_many(doc! {}, doc! { \"$set\": { LOCK_ID: \"mine\" } })\n        \
                 .await;\n}",
            );
        },
        "src/lease/admin.rs: take_every_lock calls update_many (1×), and the table of write paths \
         in model/README.md has no row for it",
    );
}

#[test]
fn a_second_write_in_a_listed_function_is_refused() {
    // `send` of `lease/undo.rs` is listed with one `update_one`; a second one, in a closure of a
    // function of the same name, counts for it.
    refused(
        "second-call",
        |copy| {
            copy.append(
                "lease/undo.rs",
                "impl Undo {\n    fn send(&self) {\n        let again = || self.collection\
                 .update_one(self.filter.clone(), self.update.clone());\n        \
                 drop(again);\n    }\n}",
            );
        },
        "src/lease/undo.rs: send calls update_one 2×, the table says 1×",
    );
}

#[test]
fn a_row_whose_write_is_gone_is_refused() {
    refused(
        "gone",
        |copy| {
            copy.replace(
                "src/lease/renewal_commands.rs",
                ".run_command(command)",
                ".run_command_elsewhere(command)",
            );
        },
        "src/lease/renewal_commands.rs: update no longer calls run_command: remove its row \
         from the table of write paths in model/README.md",
    );
}

#[test]
fn a_write_named_in_a_comment_or_a_string_is_no_write() {
    let copy = Copy::new(SCRIPT, "mentions");
    copy.append(
        "lease/admin.rs",
        "// collection.delete_many(everything)\n/* collection.insert_one(x) */\n\
         const MENTION: &str = \"collection.update_one(filter, update) {\";\n\
         const BRACE: char = '{';",
    );
    let (code, stderr) = copy.check();
    assert_eq!(code, Some(0), "{stderr}");
}
