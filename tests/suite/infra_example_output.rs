//! `scripts/check-example-output`, which `scripts/run-examples` (CI) runs on each example's
//! output: the lines of the example's "Output" block must come in order, `…` standing for any
//! text.

use std::path::Path;
use std::process::Command;

/// The check's exit code and standard error for `output`, against the quickstart's block.
fn check(name: &str, output: &str) -> (Option<i32>, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file =
        std::env::temp_dir().join(format!("example-output-{name}-{}.txt", std::process::id()));
    std::fs::write(&file, output).expect("the output file");
    let result = Command::new(root.join("scripts/check-example-output"))
        .arg(root.join("examples/quickstart.rs"))
        .arg(&file)
        .output()
        .expect("the check runs");
    let _ = std::fs::remove_file(&file);
    (
        result.status.code(),
        String::from_utf8_lossy(&result.stderr).into_owned(),
    )
}

#[test]
fn the_promised_lines_in_order_pass_with_any_text_for_the_ellipsis_and_between() {
    let output = "building...\nacquired \"nightly-report\" with fencing token 17\n\
                  a second instance finds the lock busy\nnoise\nreleased\n\
                  the other instance acquired it next, with token 18\n";
    assert_eq!(check("good", output), (Some(0), String::new()));
}

#[test]
fn a_missing_or_misplaced_line_is_named() {
    let missing = "acquired \"nightly-report\" with fencing token 17\nreleased\n";
    let (code, stderr) = check("missing", missing);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("'a second instance finds the lock busy'"),
        "{stderr}"
    );
    let swapped = "a second instance finds the lock busy\n\
                   acquired \"nightly-report\" with fencing token 17\nreleased\n\
                   the other instance acquired it next, with token 18\n";
    let (code, stderr) = check("swapped", swapped);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("'a second instance"), "{stderr}");
    // The ellipsis stands for text, not for a missing line's end.
    let (code, _) = check("cut", "acquired \"nightly-report\" with fencing\n");
    assert_eq!(code, Some(1));
}

#[test]
fn every_example_promises_its_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for entry in std::fs::read_dir(root.join("examples")).expect("examples/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|extension| extension == "rs") {
            let source = std::fs::read_to_string(&path).expect("the example");
            assert!(
                source.contains("//! Output") && source.contains("//! ```text"),
                "{} has no Output block in its header",
                path.display()
            );
        }
    }
}
