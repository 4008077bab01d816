//! The repository explains itself: every "DESIGN §n" the code and docs cite
//! is a section of `docs/design.md`, every relative link in the top-level
//! documents reaches a file, and the README keeps the two commands on its
//! first screen.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Files of the repository worth reading for references (no build output, no vendored trees).
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            if !name.starts_with('.') && !["target", "node_modules", "__pycache__"].contains(&name.as_str()) {
                sources(&path, found);
            }
        } else if ["rs", "md", "proto", "toml", "py", "yml", "yaml", "sh"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
        {
            found.push(path);
        }
    }
}

/// The section numbers `docs/design.md` has (`## 3.`, `### 3.10`, `#### 3.10.4`).
fn design_sections() -> BTreeSet<String> {
    let design = std::fs::read_to_string(repo().join("docs/design.md")).expect("docs/design.md exists");
    design
        .lines()
        .filter(|line| line.starts_with('#'))
        .filter_map(|line| line.trim_start_matches('#').split_whitespace().next())
        .map(|number| number.trim_end_matches('.').to_string())
        .filter(|number| number.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .collect()
}

#[test]
fn every_design_reference_names_a_section_of_docs_design_md() {
    let sections = design_sections();
    assert!(sections.contains("3") && sections.contains("8"), "{sections:?}");
    let mut files = Vec::new();
    sources(&repo(), &mut files);
    let mut missing = Vec::new();
    let mut references = 0;
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (at, _) in text.match_indices("DESIGN §") {
            let rest = &text[at + "DESIGN §".len()..];
            let number: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let number = number.trim_end_matches('.');
            if number.is_empty() {
                continue;
            }
            references += 1;
            if !sections.contains(number) {
                missing.push(format!("{}: DESIGN §{number}", file.display()));
            }
        }
    }
    assert!(
        references > 20,
        "only {references} references found: is the walk reading the tree?"
    );
    assert!(
        missing.is_empty(),
        "references to sections docs/design.md lacks:\n{}",
        missing.join("\n")
    );
}

#[test]
fn relative_links_of_the_top_level_documents_reach_a_file() {
    let mut broken = Vec::new();
    for document in [
        "README.md",
        "ARCHITECTURE.md",
        "docs/design.md",
        "docs/benchmarks.md",
        "deploy/README.md",
    ] {
        let path = repo().join(document);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{document}: {error}"));
        let base = path.parent().expect("a document has a folder");
        for (at, _) in text.match_indices("](") {
            let target: String = text[at + 2..].chars().take_while(|c| *c != ')').collect();
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !base.join(target).exists() {
                broken.push(format!("{document}: {target}"));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_opens_with_the_two_commands() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let first_screen: String = readme.lines().take(40).collect::<Vec<_>>().join("\n");
    assert!(
        first_screen.contains("cargo run -p agent-reach-cli -- demo"),
        "{first_screen}"
    );
    assert!(first_screen.contains("scripts/test.sh"), "{first_screen}");
}
