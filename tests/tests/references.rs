//! The repository carries its own contract (issue 25): every requirement and case id cited in
//! the docs, the README, comments, test names and test messages is defined in `docs/spec.md` /
//! `docs/cases.md`; nothing names a file outside the repository; every relative Markdown link,
//! anchor, backticked repository path and cited test name resolves. The rules and their own
//! tests are in `tests/src/references.rs`.

use buzz_agent_e2e::references::{check_repository, read_tree};
use std::path::Path;

#[test]
fn every_cited_id_file_link_and_test_name_resolves_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = read_tree(&root).expect("the repository can be read");
    assert!(
        files.iter().any(|f| f.path == "README.md") && files.len() > 100,
        "read {} files from {}: not the repository",
        files.len(),
        root.display()
    );
    let findings = check_repository(&files, &|rel| root.join(rel).exists());
    let shown: Vec<String> = findings.iter().map(ToString::to_string).collect();
    assert!(
        findings.is_empty(),
        "{} reference(s) do not resolve inside the repository:\n{}",
        findings.len(),
        shown.join("\n")
    );
}
