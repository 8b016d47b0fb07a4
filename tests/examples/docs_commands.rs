//! The commands the documentation gives are ones cargo accepts: every
//! `cargo run` / `cargo test` (and `./scripts/test`) in a shell block or an
//! inline code span of README.md and docs/*.md, and in the shell blocks of
//! the examples' header comments, names targets and packages that exist and
//! the features their `required-features` need. Read from the manifests, with
//! no network and without running anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository: the tests package's parent.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Example,
    Test,
    Bench,
    Bin,
}

#[derive(Debug)]
struct Target {
    kind: Kind,
    name: String,
    required: Vec<String>,
}

#[derive(Debug)]
struct Package {
    name: String,
    features: BTreeSet<String>,
    targets: Vec<Target>,
}

impl Package {
    fn target(&self, kind: Kind, name: &str) -> Option<&Target> {
        self.targets
            .iter()
            .find(|t| t.kind == kind && t.name == name)
    }
}

/// The workspace's packages, the root's first.
struct Workspace(Vec<Package>);

/// `"a"` → `a`; `["a", "b"]` → `[a, b]`.
fn strings(value: &str) -> Vec<String> {
    value
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The parts of a manifest this check needs: the package's name, its
/// features, its declared targets, and (for the root) the workspace members.
/// A line-based reading of the manifests here, which keep each of these on
/// one line.
fn read_manifest(dir: &Path) -> (Package, Vec<String>, BTreeMap<&'static str, bool>) {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    let mut package = Package {
        name: String::new(),
        features: BTreeSet::new(),
        targets: Vec::new(),
    };
    let (mut members, mut auto) = (Vec::new(), BTreeMap::new());
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_owned();
            let kind = match section.as_str() {
                "example" => Some(Kind::Example),
                "test" => Some(Kind::Test),
                "bench" => Some(Kind::Bench),
                "bin" => Some(Kind::Bin),
                _ => None,
            };
            if let (Some(kind), true) = (kind, line.starts_with("[[")) {
                package.targets.push(Target {
                    kind,
                    name: String::new(),
                    required: Vec::new(),
                });
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match section.as_str() {
            "package" if key == "name" => package.name = strings(value).remove(0),
            "package" if key.starts_with("auto") => {
                let auto_key = match key {
                    "autoexamples" => "examples",
                    "autotests" => "tests",
                    "autobins" => "bins",
                    _ => continue,
                };
                auto.insert(auto_key, value == "true");
            }
            "features" => {
                package.features.insert(key.to_owned());
            }
            "workspace" if key == "members" => members = strings(value),
            "example" | "test" | "bench" | "bin" => {
                let target = package.targets.last_mut().expect("a target section");
                match key {
                    "name" => target.name = strings(value).remove(0),
                    "required-features" => target.required = strings(value),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    (package, members, auto)
}

/// Cargo's target discovery where the manifest leaves it on:
/// `examples/NAME.rs`, `examples/NAME/main.rs` and `src/main.rs`.
fn discover(dir: &Path, package: &mut Package, auto: &BTreeMap<&str, bool>) {
    let mut found = Vec::new();
    if auto.get("examples").copied().unwrap_or(true) {
        if let Ok(entries) = std::fs::read_dir(dir.join("examples")) {
            for path in entries.flatten().map(|e| e.path()) {
                let is_example = match path.is_dir() {
                    true => path.join("main.rs").is_file(),
                    false => path.extension().is_some_and(|e| e == "rs"),
                };
                if is_example {
                    let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                    found.push((Kind::Example, name));
                }
            }
        }
    }
    if auto.get("bins").copied().unwrap_or(true) && dir.join("src/main.rs").is_file() {
        found.push((Kind::Bin, package.name.clone()));
    }
    for (kind, name) in found {
        if package.target(kind, &name).is_none() {
            package.targets.push(Target {
                kind,
                name,
                required: Vec::new(),
            });
        }
    }
}

impl Workspace {
    fn load(root: &Path) -> Self {
        let (mut main, members, auto) = read_manifest(root);
        discover(root, &mut main, &auto);
        let mut packages = vec![main];
        for member in members.iter().filter(|m| *m != ".") {
            let dir = root.join(member);
            let (mut package, _, auto) = read_manifest(&dir);
            discover(&dir, &mut package, &auto);
            packages.push(package);
        }
        Self(packages)
    }

    fn package(&self, name: &str) -> Option<&Package> {
        self.0.iter().find(|p| p.name == name)
    }

    /// Why cargo would refuse `command` (the words from `cargo` on), if it would.
    fn refusal(&self, words: &[&str]) -> Option<String> {
        let (subcommand, rest) = match words {
            ["./scripts/test" | "scripts/test", rest @ ..] => ("test", rest),
            ["cargo", toolchain, sub, rest @ ..] if toolchain.starts_with('+') => (*sub, rest),
            ["cargo", sub, rest @ ..] => (*sub, rest),
            _ => return None,
        };
        if subcommand != "run" && subcommand != "test" {
            return None;
        }
        let (mut packages, mut features) = (Vec::new(), BTreeSet::new());
        let mut all_features = words[0].ends_with("scripts/test");
        let mut workspace = all_features;
        let mut wanted: Vec<(Kind, &str)> = Vec::new();
        let mut rest = rest.iter().copied();
        while let Some(word) = rest.next() {
            let (flag, inline) = match word.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
                _ => (word, None),
            };
            let mut value = || inline.or_else(|| rest.next()).unwrap_or("");
            match flag {
                "--" => break,
                "-p" | "--package" => packages.push(value()),
                "--example" => wanted.push((Kind::Example, value())),
                "--test" => wanted.push((Kind::Test, value())),
                "--bench" => wanted.push((Kind::Bench, value())),
                "--bin" => wanted.push((Kind::Bin, value())),
                "-F" | "--features" => {
                    let names = value().trim_matches(['"', '\'']);
                    features.extend(names.split([',', ' ']).filter(|f| !f.is_empty()));
                }
                "--all-features" => all_features = true,
                "--workspace" | "--all" => workspace = true,
                "--exclude" => {
                    value();
                }
                _ => {}
            }
        }
        let mut selected = Vec::new();
        for name in &packages {
            match self.package(name) {
                Some(package) => selected.push(package),
                None => return Some(format!("no package `{name}` in the workspace")),
            }
        }
        if selected.is_empty() {
            match workspace {
                true => selected.extend(&self.0),
                false => selected.push(&self.0[0]),
            }
        }
        // Features go to the selected package (the root's, for a workspace).
        let features_of = match (workspace, packages.len()) {
            (false, 1) | (false, 0) => Some(selected[0]),
            _ => None,
        };
        if let (Some(package), false) = (features_of, all_features) {
            if let Some(unknown) = features
                .iter()
                .find(|f| !f.contains('/') && !package.features.contains(**f))
            {
                return Some(format!(
                    "package `{}` has no feature `{unknown}`",
                    package.name
                ));
            }
        }
        let has_binary = |p: &&Package| p.targets.iter().any(|t| t.kind == Kind::Bin);
        if subcommand == "run" && wanted.is_empty() && !selected.iter().any(has_binary) {
            return Some("nothing to run: the package has no binary".to_owned());
        }
        for (kind, name) in wanted {
            let found = selected
                .iter()
                .find_map(|p| p.target(kind, name).map(|t| (p, t)));
            let Some((package, target)) = found else {
                return Some(format!(
                    "no {kind:?} target `{name}` in the selected packages"
                ));
            };
            let missing: Vec<&str> = target
                .required
                .iter()
                .map(String::as_str)
                .filter(|f| {
                    !all_features
                        && !features.contains(f)
                        && !features.contains(format!("{}/{f}", package.name).as_str())
                })
                .collect();
            if !missing.is_empty() {
                return Some(format!(
                    "{kind:?} `{name}` requires the features {missing:?}, not named on the line"
                ));
            }
        }
        None
    }
}

/// The words of a command line, from `cargo` (or `./scripts/test`) up to
/// the end of that command (`;`, `&`, `|`, a comment).
fn commands(line: &str) -> Vec<Vec<&str>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut found = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let starts = match *word {
            "cargo" => {
                matches!(words.get(i + 1), Some(w) if *w == "run" || *w == "test" || w.starts_with('+'))
            }
            w => w == "./scripts/test" || w == "scripts/test",
        };
        if !starts {
            continue;
        }
        let mut command = Vec::new();
        for word in &words[i..] {
            if word.starts_with('#') || ["&", "&&", "|", "||", ";"].contains(word) {
                break;
            }
            let end = word.ends_with([';', '&']);
            command.push(word.trim_end_matches([';', '&']));
            if end {
                break;
            }
        }
        found.push(command);
    }
    found
}

/// Every shell line of a Markdown text, with its line number: the lines of
/// its `sh`, `bash`, `console` and `shell` blocks (continuations joined), and
/// the inline code spans of its paragraphs (which may wrap).
fn markdown_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut in_shell: Option<bool> = None;
    let mut pending: Option<(usize, String)> = None;
    let mut paragraph: Option<(usize, String)> = None;
    let spans = |paragraph: Option<(usize, String)>, lines: &mut Vec<(usize, String)>| {
        if let Some((start, text)) = paragraph {
            let odd = text.split('`').skip(1).step_by(2);
            lines.extend(odd.map(|span| (start, span.to_owned())));
        }
    };
    for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        let fence = line.trim_start();
        if let Some(info) = fence.strip_prefix("```") {
            spans(paragraph.take(), &mut lines);
            in_shell = match in_shell {
                Some(_) => None,
                None => Some(matches!(info.trim(), "sh" | "bash" | "console" | "shell")),
            };
            continue;
        }
        match in_shell {
            Some(true) => {
                let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
                let body = line.trim_start_matches("$ ");
                match body.strip_suffix('\\') {
                    Some(head) => {
                        joined.push_str(head);
                        joined.push(' ');
                        pending = Some((start, joined));
                    }
                    None => {
                        joined.push_str(body);
                        lines.push((start, joined));
                    }
                }
            }
            Some(false) => {}
            None if line.trim().is_empty() => spans(paragraph.take(), &mut lines),
            None => {
                let (_, text) = paragraph.get_or_insert((n, String::new()));
                text.push_str(line);
                text.push(' ');
            }
        }
    }
    spans(paragraph.take(), &mut lines);
    lines
}

/// The shell blocks of a Rust file's `//!` header, as Markdown.
fn header_markdown(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.strip_prefix("//!") {
            Some(doc) => doc.strip_prefix(' ').unwrap_or(doc),
            None => "",
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The documents checked: README.md, docs/*.md and the examples' headers.
fn documents(root: &Path) -> Vec<(PathBuf, String)> {
    let sorted = |dir: PathBuf| {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        paths.sort();
        paths
    };
    let read = |path: &Path| std::fs::read_to_string(path).unwrap();
    let mut documents = vec![(root.join("README.md"), read(&root.join("README.md")))];
    for path in sorted(root.join("docs")) {
        if path.extension().is_some_and(|e| e == "md") {
            let text = read(&path);
            documents.push((path, text));
        }
    }
    for path in sorted(root.join("examples")) {
        let main = match path.is_dir() {
            true => [path.join("main.rs"), path.join("src/main.rs")]
                .into_iter()
                .find(|p| p.is_file()),
            false => path.extension().is_some_and(|e| e == "rs").then_some(path),
        };
        if let Some(main) = main {
            let text = header_markdown(&read(&main));
            documents.push((main, text));
        }
    }
    documents
}

#[test]
fn every_documented_cargo_command_names_existing_targets_and_their_features() {
    let root = root();
    let workspace = Workspace::load(&root);
    let (mut checked, mut refused) = (Vec::new(), Vec::new());
    for (path, text) in documents(&root) {
        let file = path.strip_prefix(&root).unwrap().display().to_string();
        for (line, shell) in markdown_lines(&text) {
            for command in commands(&shell) {
                // A template (`--test <binary>`), not a command to paste.
                if command.iter().any(|w| w.contains('<') && w.contains('>')) {
                    continue;
                }
                let shown = command.join(" ");
                if let Some(why) = workspace.refusal(&command) {
                    refused.push(format!("{file}:{line}: `{shown}`: {why}"));
                }
                checked.push(shown);
            }
        }
    }
    assert!(
        refused.is_empty(),
        "commands cargo would refuse:\n{}",
        refused.join("\n")
    );
    // Found what is there to find, so the check is not vacuous.
    assert!(checked.iter().any(|c| c == "cargo run --example checkout"));
    assert!(checked
        .iter()
        .any(|c| c.starts_with("cargo run --example reports")));
    assert!(checked.len() > 20, "only {} commands found", checked.len());
}

#[test]
fn the_check_refuses_what_cargo_refuses() {
    let workspace = Workspace::load(&root());
    let refused = |line: &str| {
        let commands = commands(line);
        assert_eq!(commands.len(), 1, "{line}");
        workspace.refusal(&commands[0])
    };
    for accepted in [
        "cargo run --example checkout",
        "cargo run --example reports --features leases",
        "DATABASE_URL=x cargo run --example reports --features leases,postgres &",
        "cargo run --example reports --all-features",
        "cargo run -p tower-idempotency-axum-per-route --features metrics",
        "cargo test -p tower-idempotency-tests --features leases --test leases reports_",
        "./scripts/test --test leases reports_",
    ] {
        assert_eq!(refused(accepted), None, "{accepted}");
    }
    for (line, why) in [
        ("cargo run --example reports", "requires the features"),
        (
            "cargo run --example reports --features postgres",
            "requires the features",
        ),
        ("cargo run --example nowhere", "no Example target"),
        (
            "cargo run --example checkout --features nonsense",
            "no feature",
        ),
        ("cargo run -p no-such-package", "no package"),
        ("cargo run", "no binary"),
        (
            "cargo test -p tower-idempotency-tests --test leases",
            "requires the features",
        ),
        ("cargo test --test idempotency", "no Test target"),
    ] {
        let refusal = refused(line).unwrap_or_else(|| panic!("accepted: {line}"));
        assert!(refusal.contains(why), "{line}: {refusal}");
    }
}
