//! A check at compile time that every public async method has its blocking twin.
//!
//! The blocking types forward by name (`twins!` in `mod.rs`), so a twin that exists is checked
//! by the compiler against its async method. What the compiler cannot see is an async method
//! added without a twin: this file reads the sources of both APIs at compile time and fails the
//! build, naming the method, when a `pub async fn` of an async type has no `fn` of the same
//! name in its blocking twin's impl blocks. The exceptions are listed per type, with why.

/// An async type and its blocking twin, each in the source of its file.
struct Twins {
    /// The async type's file (for a type written in several files, one constant per file).
    async_source: &'static str,
    async_type: &'static str,
    blocking_source: &'static str,
    blocking_type: &'static str,
    /// Async methods with no blocking twin, on purpose.
    exempt: &'static [&'static str],
}

/// Methods that run an async closure while the lock is held: a synchronous closure could not
/// be interrupted when the lock is lost, so the blocking API leaves them out (see `mod.rs`).
const RUN_WHILE_HELD: &[&str] = &["run_while_held", "transaction"];

// Each pair, and each file of a type written in several, is a constant of its own: a scan of a
// few files each, within what the compiler expects of a constant.
const _: () = check(&Twins {
    async_source: include_str!("../provider/mod.rs"),
    async_type: "Provider",
    blocking_source: include_str!("provider.rs"),
    blocking_type: "Provider",
    exempt: &["acquire_all_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../provider/administration.rs"),
    async_type: "Provider",
    blocking_source: include_str!("provider.rs"),
    blocking_type: "Provider",
    exempt: &["acquire_all_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../provider/composite.rs"),
    async_type: "Provider",
    blocking_source: include_str!("provider.rs"),
    blocking_type: "Provider",
    exempt: &["acquire_all_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../lock.rs"),
    async_type: "MongoDistributedLock",
    blocking_source: include_str!("lock.rs"),
    blocking_type: "MongoDistributedLock",
    exempt: &["acquire_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../semaphore.rs"),
    async_type: "MongoDistributedSemaphore",
    blocking_source: include_str!("semaphore.rs"),
    blocking_type: "MongoDistributedSemaphore",
    exempt: &["acquire_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../rw_lock/mod.rs"),
    async_type: "MongoDistributedReaderWriterLock",
    blocking_source: include_str!("rw_lock.rs"),
    blocking_type: "MongoDistributedReaderWriterLock",
    exempt: &["acquire_read_and_run", "acquire_write_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../rw_lock/read_guard.rs"),
    async_type: "ReadGuard",
    blocking_source: include_str!("guard.rs"),
    blocking_type: "ReadGuard",
    exempt: RUN_WHILE_HELD,
});

const _: () = check(&Twins {
    async_source: include_str!("../guard.rs"),
    async_type: "LockGuard",
    blocking_source: include_str!("guard.rs"),
    blocking_type: "LockGuard",
    exempt: RUN_WHILE_HELD,
});

const _: () = check(&Twins {
    async_source: include_str!("../composite.rs"),
    async_type: "CompositeGuard",
    blocking_source: include_str!("guard.rs"),
    blocking_type: "CompositeGuard",
    exempt: RUN_WHILE_HELD,
});

const _: () = check(&Twins {
    async_source: include_str!("../document_lock/mod.rs"),
    async_type: "DocumentLock",
    blocking_source: include_str!("document_lock.rs"),
    blocking_type: "DocumentLock",
    exempt: &["lock_and_run"],
});

const _: () = check(&Twins {
    async_source: include_str!("../document_lock/guard.rs"),
    async_type: "DocumentGuard",
    blocking_source: include_str!("document_lock.rs"),
    blocking_type: "DocumentGuard",
    exempt: RUN_WHILE_HELD,
});

const _: () = check(&Twins {
    async_source: include_str!("../leader.rs"),
    async_type: "LeaderElection",
    blocking_source: include_str!("leader.rs"),
    blocking_type: "LeaderElection",
    exempt: &[],
});

const _: () = check(&Twins {
    async_source: include_str!("../fencing.rs"),
    async_type: "Fence",
    blocking_source: include_str!("fencing.rs"),
    blocking_type: "Fence",
    exempt: &[],
});

const _: () = check(&Twins {
    async_source: include_str!("../watch.rs"),
    async_type: "LockWatch",
    blocking_source: include_str!("watch.rs"),
    blocking_type: "LockWatch",
    exempt: &[],
});

// A job's one async method runs an async closure: no blocking `Job` (see `RUN_WHILE_HELD`).
const _: () = check(&Twins {
    async_source: include_str!("../job.rs"),
    async_type: "Job",
    blocking_source: "",
    blocking_type: "Job",
    exempt: &["run"],
});

/// Panics (at compile time) naming the first public async method without a blocking twin.
const fn check(twins: &Twins) {
    let source = twins.async_source.as_bytes();
    let mut at = 0;
    while let Some(block) = next_impl(source, at, twins.async_type.as_bytes()) {
        let end = block_end(source, block);
        let mut from = block;
        while let Some(found) = find(source, from, end, b"\n    pub async fn ") {
            let start = found + b"\n    pub async fn ".len();
            let name = ident(source, start);
            if !is_exempt(name, twins.exempt) && !has_twin(twins, name) {
                missing(twins.async_type, name);
            }
            from = start;
        }
        at = end;
    }
}

/// Whether the blocking type has a method called `name` in one of its impl blocks: written by
/// hand (`pub fn name`) or generated (`fn name` in a `twins!` list), each at the start of a line.
const fn has_twin(twins: &Twins, name: &[u8]) -> bool {
    const DECLARATIONS: [&[u8]; 2] = [b"\n    pub fn ", b"\n        fn "];
    let source = twins.blocking_source.as_bytes();
    let mut at = 0;
    while let Some(block) = next_impl(source, at, twins.blocking_type.as_bytes()) {
        let end = block_end(source, block);
        let mut declaration = 0;
        while declaration < DECLARATIONS.len() {
            let needle = DECLARATIONS[declaration];
            let mut from = block;
            while let Some(found) = find(source, from, end, needle) {
                let start = found + needle.len();
                if equal(ident(source, start), name) {
                    return true;
                }
                from = start;
            }
            declaration += 1;
        }
        at = end;
    }
    false
}

/// The start of the next inherent impl block of `type_name` at or after `from`: a line
/// `impl Type {`, `impl Type<..`, or `impl<..> Type<..`.
const fn next_impl(source: &[u8], from: usize, type_name: &[u8]) -> Option<usize> {
    let mut at = from;
    while let Some(found) = find(source, at, source.len(), b"\nimpl") {
        let mut name = found + b"\nimpl".len();
        if name < source.len() && source[name] == b'<' {
            while name < source.len() && source[name] != b'>' {
                name += 1;
            }
            name += 1;
        }
        name += 1; // the space
        let after = name + type_name.len();
        if equal(ident(source, name), type_name)
            && after < source.len()
            && (source[after] == b' ' || source[after] == b'<')
        {
            return Some(found);
        }
        at = found + 1;
    }
    None
}

/// The end of the impl block starting at `start`: its closing brace at the start of a line.
const fn block_end(source: &[u8], start: usize) -> usize {
    match find(source, start, source.len(), b"\n}\n") {
        Some(end) => end,
        None => source.len(),
    }
}

/// The first occurrence of `needle` in `source[from..to]`.
const fn find(source: &[u8], from: usize, to: usize, needle: &[u8]) -> Option<usize> {
    let mut at = from;
    while at + needle.len() <= to {
        let mut matched = 0;
        while matched < needle.len() && source[at + matched] == needle[matched] {
            matched += 1;
        }
        if matched == needle.len() {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// The identifier starting at `start`.
const fn ident(source: &[u8], start: usize) -> &[u8] {
    let mut end = start;
    while end < source.len() && (source[end].is_ascii_alphanumeric() || source[end] == b'_') {
        end += 1;
    }
    let (_, rest) = source.split_at(start);
    rest.split_at(end - start).0
}

const fn equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    while at < a.len() {
        if a[at] != b[at] {
            return false;
        }
        at += 1;
    }
    true
}

const fn is_exempt(name: &[u8], exempt: &[&str]) -> bool {
    let mut at = 0;
    while at < exempt.len() {
        if equal(name, exempt[at].as_bytes()) {
            return true;
        }
        at += 1;
    }
    false
}

/// Fails the build: "no blocking twin: Type::method".
const fn missing(type_name: &str, name: &[u8]) {
    let mut message = [0u8; 160];
    let mut length = 0;
    let parts: [&[u8]; 4] = [b"no blocking twin: ", type_name.as_bytes(), b"::", name];
    let mut part = 0;
    while part < parts.len() {
        let mut at = 0;
        while at < parts[part].len() && length < message.len() {
            message[length] = parts[part][at];
            length += 1;
            at += 1;
        }
        part += 1;
    }
    match std::str::from_utf8(message.split_at(length).0) {
        Ok(message) => panic!("{}", message),
        Err(_) => panic!("no blocking twin for a method of an async type"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASYNC: &str = "\nimpl Thing {\n    pub async fn go(&self) {}\n    pub async fn run_while_held(&self) {}\n    pub fn sync(&self) {}\n}\n\nimpl Drop for Thing {\n    pub async fn not_inherent(&self) {}\n}\n";

    fn twins(blocking_source: &'static str) -> Twins {
        Twins {
            async_source: ASYNC,
            async_type: "Thing",
            blocking_source,
            blocking_type: "Thing",
            exempt: RUN_WHILE_HELD,
        }
    }

    #[test]
    fn a_twin_in_the_blocking_type_satisfies_the_check() {
        let generated =
            "\nimpl Thing {\n    twins! { Thing:\n        fn go(&self) -> ();\n    }\n}\n";
        check(&twins(generated));
        let written = "\nimpl<T> Thing<T> {\n    pub fn go(self) -> Result<()> {}\n}\n";
        check(&twins(written));
    }

    #[test]
    #[should_panic(expected = "no blocking twin: Thing::go")]
    fn an_async_method_without_a_twin_is_named() {
        // `go` exists, but in another type's impl block.
        check(&twins("\nimpl Other {\n    pub fn go(&self) {}\n}\n"));
    }

    #[test]
    #[should_panic(expected = "no blocking twin: Thing::go")]
    fn a_comment_that_mentions_the_method_is_not_a_twin() {
        check(&twins(
            "\nimpl Thing {\n    /// Unlike fn go(), this blocks.\n    pub fn wait(&self) {}\n}\n",
        ));
    }

    #[test]
    #[should_panic(expected = "no blocking twin: Thing::go")]
    fn a_prefix_is_not_a_twin() {
        check(&twins("\nimpl Thing {\n    pub fn go_on(&self) {}\n}\n"));
    }
}
