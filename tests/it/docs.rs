//! The documentation's links, checked. The README is the front door (the two commands, what
//! courier is, the quick start, the ways to adopt it) and everything else lives in pages
//! under `docs/`, which link to each other and to the README by relative links and
//! `#anchors`. A page renamed or a heading reworded breaks such a link without a sound, so
//! this test reads the Markdown itself: every relative link resolves to a file, every
//! `#anchor` into a Markdown file names one of its headings (GitHub's anchor rules), every
//! page of `docs/` is reachable from the README, and the README stays short and starts with
//! the two commands.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 600;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every `docs/*.md`, README first.
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    let mut all = vec![root().join("README.md")];
    all.extend(docs);
    all
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of `text` outside fenced code blocks (a `# comment` in a shell block is not a
/// heading, and a `[x](y)` in a code sample is not a link).
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            out.push(line);
        }
    }
    out
}

/// GitHub's anchor for a heading: lowercase, spaces become `-`, punctuation other than `-`
/// and `_` is dropped (backticks included).
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading in a Markdown text; a repeated heading gets `-1`, `-2`, …
/// as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[hashes..]);
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// The targets of the Markdown links and images in a text (`[text](target)`,
/// `![alt](target)`), outside code blocks and inline code.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Drop inline code spans: the odd segments between backticks.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// Where a relative link from `page` points, and its anchor if any.
fn resolve(page: &Path, target: &str) -> (PathBuf, Option<String>) {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a.to_string())),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap().join(path)
    };
    (file, anchor)
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        for target in link_targets(&read(&page)) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            let (file, anchor) = resolve(&page, &target);
            if !file.exists() {
                broken.push(format!("{name}: ({target}): no such file"));
                continue;
            }
            if let Some(a) = anchor {
                if file.extension().is_some_and(|x| x == "md") && !anchors(&read(&file)).contains(&a) {
                    broken.push(format!("{name}: ({target}): no heading makes #{a}"));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} relative links found: is the link parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let readme = root().join("README.md");
    let linked: HashSet<PathBuf> = link_targets(&read(&readme))
        .iter()
        .filter(|t| !is_external(t))
        .filter_map(|t| resolve(&readme, t).0.canonicalize().ok())
        .collect();
    let missing: Vec<String> = pages()[1..]
        .iter()
        .filter(|p| !linked.contains(&p.canonicalize().unwrap()))
        .map(|p| p.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(missing.is_empty(), "docs pages not linked from README.md: {missing:?}");
}

#[test]
fn the_readme_is_short_and_starts_with_the_two_commands() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, at most {README_MAX_LINES}"
    );

    // The title, then (blank lines aside) a shell block with exactly the two commands.
    let mut it = readme.lines().filter(|l| !l.trim().is_empty());
    assert_eq!(it.next(), Some("# courier"), "README.md starts with its title");
    let block: Vec<&str> = it.take(4).collect();
    assert_eq!(
        block[0], "```sh",
        "the first thing after the title is the commands' block"
    );
    assert!(block[1].starts_with("./scripts/run.sh "), "first command: {}", block[1]);
    assert!(
        block[2].starts_with("./scripts/test.sh "),
        "second command: {}",
        block[2]
    );
    assert_eq!(block[3], "```", "the block holds the two commands only");
}

#[test]
fn anchors_follow_github() {
    assert_eq!(anchor("Trace context (`traceparent`)"), "trace-context-traceparent");
    assert_eq!(
        anchor("Ed25519 signatures (`whsk_` keys, `v1a`)"),
        "ed25519-signatures-whsk_-keys-v1a"
    );
    assert_eq!(
        anchor("Admin API (default `127.0.0.1:8788`)"),
        "admin-api-default-1270018788"
    );
    assert_eq!(
        anchor("Drain: who may ask, where it sends"),
        "drain-who-may-ask-where-it-sends"
    );
    let dup = anchors("# A\n## A\n```sh\n# A\n```\n");
    assert_eq!(dup, HashSet::from(["a".to_string(), "a-1".to_string()]));
}
