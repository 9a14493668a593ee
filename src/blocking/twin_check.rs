//! A test that every public async method has its blocking twin.
//!
//! The blocking types forward by name (`twins!` in `mod.rs`), so a twin that exists is checked
//! by the compiler against its async method. What the compiler cannot see is an async method
//! added without a twin: this test parses the crate's sources (with `syn`, so formatting does
//! not matter) and names every `pub async fn` of an async type's inherent impls, in any file
//! outside `blocking/`, that has no method of the same name in its blocking twin's impls (written
//! by hand, or listed in a `twins!` call). The exceptions are listed per type, with why.

use std::collections::BTreeSet;
use std::path::Path;

use proc_macro2::TokenTree;
use syn::{ImplItem, Item, Type, Visibility};

/// Methods that run an async closure while the lock is held: a synchronous closure could not
/// be interrupted when the lock is lost, so the blocking API leaves them out (see `mod.rs`).
const RUN_WHILE_HELD: &[&str] = &["run_while_held", "transaction"];

/// Each async type (by name) with its blocking twin, and the async methods it has no twin for,
/// on purpose: the `*_and_run` methods and a job's `run` take an async closure (see
/// `RUN_WHILE_HELD`); `Job` has no blocking twin at all.
const TWINS: &[(&str, Option<&str>, &[&str])] = &[
    ("Provider", Some("Provider"), &["acquire_all_and_run"]),
    (
        "MongoDistributedLock",
        Some("MongoDistributedLock"),
        &["acquire_and_run"],
    ),
    (
        "MongoDistributedSemaphore",
        Some("MongoDistributedSemaphore"),
        &["acquire_and_run"],
    ),
    (
        "MongoDistributedReaderWriterLock",
        Some("MongoDistributedReaderWriterLock"),
        &["acquire_read_and_run", "acquire_write_and_run"],
    ),
    ("LockGuard", Some("LockGuard"), RUN_WHILE_HELD),
    ("ReadGuard", Some("ReadGuard"), RUN_WHILE_HELD),
    ("UpgradeableReadGuard", Some("UpgradeableReadGuard"), &[]),
    ("CompositeGuard", Some("CompositeGuard"), RUN_WHILE_HELD),
    ("DocumentLock", Some("DocumentLock"), &["lock_and_run"]),
    ("DocumentGuard", Some("DocumentGuard"), RUN_WHILE_HELD),
    ("LeaderElection", Some("LeaderElection"), &[]),
    ("Fence", Some("Fence"), &[]),
    ("LockWatch", Some("LockWatch"), &[]),
    ("Job", None, &["run"]),
];

/// The inherent impl blocks of `type_name` in `file`.
fn impls_of<'a>(
    file: &'a syn::File,
    type_name: &'a str,
) -> impl Iterator<Item = &'a syn::ItemImpl> {
    file.items.iter().filter_map(move |item| match item {
        Item::Impl(block) if block.trait_.is_none() && names(&block.self_ty, type_name) => {
            Some(block)
        }
        _ => None,
    })
}

/// Whether `ty` is the type `type_name` (with any generic arguments).
fn names(ty: &Type, type_name: &str) -> bool {
    matches!(ty, Type::Path(path) if path.path.segments.last().is_some_and(|last| last.ident == type_name))
}

/// The public async methods of `type_name`'s inherent impls in `file`.
fn async_methods(file: &syn::File, type_name: &str) -> BTreeSet<String> {
    impls_of(file, type_name)
        .flat_map(|block| &block.items)
        .filter_map(|item| match item {
            ImplItem::Fn(method)
                if method.sig.asyncness.is_some()
                    && matches!(method.vis, Visibility::Public(_)) =>
            {
                Some(method.sig.ident.to_string())
            }
            _ => None,
        })
        .collect()
}

/// The methods of `type_name`'s inherent impls in `file`: public ones written by hand, and those
/// a `twins!` call generates (each `fn name` in its list).
fn blocking_methods(file: &syn::File, type_name: &str) -> BTreeSet<String> {
    let mut methods = BTreeSet::new();
    for item in impls_of(file, type_name).flat_map(|block| &block.items) {
        match item {
            ImplItem::Fn(method) if matches!(method.vis, Visibility::Public(_)) => {
                methods.insert(method.sig.ident.to_string());
            }
            ImplItem::Macro(call) if call.mac.path.is_ident("twins") => {
                let tokens: Vec<TokenTree> = call.mac.tokens.clone().into_iter().collect();
                for pair in tokens.windows(2) {
                    if let [TokenTree::Ident(keyword), TokenTree::Ident(name)] = pair
                        && keyword == "fn"
                    {
                        methods.insert(name.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    methods
}

/// Every async method of the `twins` table without its blocking twin, as `Type::method`, in
/// `async_files` and `blocking_files` (parsed sources).
fn missing(
    twins: &[(&str, Option<&str>, &[&str])],
    async_files: &[syn::File],
    blocking_files: &[syn::File],
) -> Vec<String> {
    let mut missing = Vec::new();
    for (async_type, blocking_type, exempt) in twins {
        let present: BTreeSet<String> = blocking_type
            .map(|blocking_type| {
                blocking_files
                    .iter()
                    .flat_map(|file| blocking_methods(file, blocking_type))
                    .collect()
            })
            .unwrap_or_default();
        for file in async_files {
            for method in async_methods(file, async_type) {
                if !exempt.contains(&method.as_str()) && !present.contains(&method) {
                    missing.push(format!("{async_type}::{method}"));
                }
            }
        }
    }
    missing
}

/// The parsed `.rs` files under `dir`, with those under `skip` left out.
fn parse_tree(dir: &Path, skip: Option<&Path>) -> Vec<syn::File> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("a source entry").path();
            if Some(path.as_path()) == skip {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let source = std::fs::read_to_string(&path).expect("a readable source");
                files.push(syn::parse_file(&source).expect("a source that parses"));
            }
        }
    }
    files
}

#[test]
fn every_public_async_method_has_its_blocking_twin() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let blocking = src.join("blocking");
    let async_files = parse_tree(&src, Some(&blocking));
    let blocking_files = parse_tree(&blocking, None);
    // The table names types that exist: each has async methods somewhere.
    for (async_type, _, _) in TWINS {
        assert!(
            async_files
                .iter()
                .any(|file| !async_methods(file, async_type).is_empty()),
            "no public async method found for {async_type}: is the table out of date?"
        );
    }
    assert_eq!(
        missing(TWINS, &async_files, &blocking_files),
        Vec::<String>::new(),
        "public async methods without a blocking twin (add one to `twins!`, or list the \
         method as an exception with why)"
    );
}

mod tests {
    use super::*;

    const ASYNC: &str = "impl Thing {\n    pub async fn go(&self) {}\n    pub async fn run_while_held(&self) {}\n    pub fn sync(&self) {}\n    async fn private(&self) {}\n}\n\nimpl Drop for Thing {\n    fn drop(&mut self) {}\n}\n";

    fn missing_in(blocking: &str) -> Vec<String> {
        let twins: &[(&str, Option<&str>, &[&str])] = &[("Thing", Some("Thing"), RUN_WHILE_HELD)];
        let parsed = |source: &str| syn::parse_file(source).expect("a source that parses");
        missing(twins, &[parsed(ASYNC)], &[parsed(blocking)])
    }

    #[test]
    fn a_twin_written_or_generated_in_any_layout_satisfies_the_check() {
        let generated =
            "impl Thing {\n    twins! { Thing:\n        fn go(&self) -> ();\n    }\n}\n";
        assert!(missing_in(generated).is_empty());
        let on_one_line = "impl Thing { twins! { Thing: fn go(self) -> (); } }";
        assert!(missing_in(on_one_line).is_empty());
        let written = "impl<T> Thing<T> {\n    pub fn go(self) -> Result<()> { todo!() }\n}\n";
        assert!(missing_in(written).is_empty());
    }

    #[test]
    fn an_async_method_without_a_twin_is_named() {
        // `go` exists, but in another type's impl block, or in a trait impl.
        assert_eq!(
            missing_in("impl Other {\n    pub fn go(&self) {}\n}\n"),
            ["Thing::go"]
        );
        assert_eq!(
            missing_in("impl Go for Thing {\n    fn go(&self) {}\n}\n"),
            ["Thing::go"]
        );
    }

    #[test]
    fn a_comment_or_a_prefix_is_not_a_twin() {
        assert_eq!(
            missing_in(
                "impl Thing {\n    /// Unlike fn go(), this blocks.\n    pub fn wait(&self) {}\n}\n"
            ),
            ["Thing::go"]
        );
        assert_eq!(
            missing_in("impl Thing {\n    pub fn go_on(&self) {}\n}\n"),
            ["Thing::go"]
        );
    }
}
