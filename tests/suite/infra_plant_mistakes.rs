//! `scripts/plant-mistakes`, which plants mistakes into a copy of the crate and runs the model
//! checker against each (model/README.md). Its full run builds the crate once per
//! mistake and is run by hand (RELIABILITY.md records its results); CI runs `--check`, which
//! only plants each mistake into copies of the files it edits. Here: every mistake can be planted
//! into this tree, and a mistake whose code changed is refused by name, so the list cannot go
//! stale silently.

use crate::script_copy::Copy;

const SCRIPT: &str = "scripts/plant-mistakes";

#[test]
fn every_mistake_can_be_planted_into_this_tree() {
    let copy = Copy::new(SCRIPT, "unchanged");
    let (code, stderr) = copy.run(&["--check"]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_mistake_whose_code_changed_is_refused_by_name() {
    let copy = Copy::new(SCRIPT, "changed");
    copy.replace(
        "src/lease/protocol/lease.rs",
        "self.lengthened(request.0 + options.lease_lifetime(), request, now)",
        "self.lengthened(request.at() + options.lease_lifetime(), request, now)",
    );
    let (code, stderr) = copy.run(&["--check"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "cannot plant deadline-from-reply: its text is found 0 times in src/lease/protocol/lease.rs"
        ),
        "{stderr}"
    );
    let (code, stderr) = copy.run(&["--check", "no-skew-margin"]);
    assert_eq!(code, Some(0), "the others still plant: {stderr}");
    let (code, stderr) = copy.run(&["--check", "no-such-mistake"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown mistake: no-such-mistake"),
        "{stderr}"
    );
}
