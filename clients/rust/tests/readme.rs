//! README.md against what it says: the files it shows (`<!-- file: PATH -->` and a fenced
//! block) are exactly those files, which the suites run as they are; the refused statuses it
//! lists are the crate's (src/contract_tests.rs checks those against contract/contract.json).

use std::path::Path;

const README: &str = include_str!("../README.md");

/// (PATH, the block shown after `<!-- file: PATH -->`).
fn shown_files() -> Vec<(String, String)> {
    let mut shown = Vec::new();
    let mut rest = README;
    while let Some(at) = rest.find("<!-- file: ") {
        rest = &rest[at + "<!-- file: ".len()..];
        let (path, after) = rest.split_once(" -->\n").expect("<!-- file: PATH -->");
        let fence = after.strip_prefix("```").expect("a fenced block right after the marker");
        let body = &fence[fence.find('\n').unwrap() + 1..];
        let end = body.find("\n```").expect("the block's end");
        shown.push((path.to_owned(), body[..end + 1].to_owned()));
        rest = body;
    }
    shown
}

#[test]
fn the_files_it_shows_are_the_files() {
    let shown = shown_files();
    assert!(shown.iter().any(|(p, _)| p == "examples/orders.rs"), "the first app is shown");
    for (path, block) in shown {
        let file = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&path))
            .unwrap_or_else(|e| panic!("README.md shows {path}: {e}"));
        assert!(block == file, "README.md's block for {path} is not the file as it is");
    }
}

#[test]
fn the_refused_statuses_it_lists_are_the_crates() {
    let row = README
        .lines()
        .find(|l| l.starts_with("| a refusal: "))
        .expect("the table row of the refused statuses");
    let listed: Vec<u16> = row["| a refusal: ".len()..]
        .split(" (")
        .next()
        .unwrap()
        .split(", ")
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(listed, pg_idempotency::REFUSED_STATUSES.to_vec());
}
