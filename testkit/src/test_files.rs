//! A package whose integration tests are one binary (`tests/integration.rs`,
//! every other file in `tests/` a module of it) turns cargo's discovery of
//! test files off (`autotests = false`), so a new file in `tests/` would
//! compile into nothing and its tests would never run.
//! [`assert_every_test_file_runs`] is the test that says so.

use std::path::Path;

/// Fails, naming the files, when a `.rs` file directly in `<manifest_dir>/tests`
/// is neither a module of `tests/integration.rs` (a `mod name;` line) nor a
/// test target of the package's `Cargo.toml` (a `path = "tests/name.rs"` line).
pub fn assert_every_test_file_runs(manifest_dir: &str) {
    let package = Path::new(manifest_dir);
    let read = |path: &Path| {
        std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
    };
    let suite = read(&package.join("tests/integration.rs"));
    let manifest = read(&package.join("Cargo.toml"));
    let modules: Vec<&str> = suite
        .lines()
        .filter_map(|line| line.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let targets: Vec<&str> = manifest
        .lines()
        .filter_map(|line| {
            let value = line.trim().strip_prefix("path")?.trim_start().strip_prefix('=')?.trim();
            value.strip_prefix("\"tests/")?.strip_suffix(".rs\"")
        })
        .collect();
    let directory = package.join("tests");
    let entries =
        std::fs::read_dir(&directory).unwrap_or_else(|error| panic!("listing {}: {error}", directory.display()));
    let mut missing: Vec<String> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".rs")?.to_owned();
            let runs = stem == "integration" || modules.contains(&stem.as_str()) || targets.contains(&stem.as_str());
            (!runs).then_some(name)
        })
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "{}: tests/{} would never run: add `mod <name>;` to tests/integration.rs, \
         or a [[test]] target to Cargo.toml for a file that needs a process of its own",
        package.display(),
        missing.join(", tests/"),
    );
}

#[cfg(test)]
mod tests {
    use super::assert_every_test_file_runs;

    fn package(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("tests")).expect("tests dir");
        for (path, text) in files {
            std::fs::write(dir.path().join(path), text).expect("writing a file");
        }
        dir
    }

    #[test]
    fn files_that_are_modules_or_targets_pass() {
        let dir = package(&[
            ("Cargo.toml", "[[test]]\nname = \"alone\"\npath = \"tests/alone.rs\"\n"),
            ("tests/integration.rs", "mod support;\n\nmod one;\n"),
            ("tests/one.rs", ""),
            ("tests/alone.rs", ""),
        ]);
        std::fs::create_dir(dir.path().join("tests/support")).expect("support dir");
        assert_every_test_file_runs(dir.path().to_str().expect("utf-8 path"));
    }

    #[test]
    #[should_panic(expected = "tests/forgotten.rs would never run")]
    fn a_file_in_neither_place_fails() {
        let dir = package(&[
            ("Cargo.toml", "[package]\nautotests = false\n"),
            ("tests/integration.rs", "mod one;\n"),
            ("tests/one.rs", ""),
            ("tests/forgotten.rs", ""),
        ]);
        assert_every_test_file_runs(dir.path().to_str().expect("utf-8 path"));
    }
}
