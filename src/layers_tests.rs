//! The house stays drawn: `lib.rs`'s layer list names every module once, no module imports
//! from its own layer or one above it, and the modules inside any one module import one
//! another without a circle. Read from the sources, test code left out: a test may reach
//! anywhere, production code may not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most layers the list may have: a deeper house is harder to hold in one's head.
const MOST_LAYERS: usize = 12;

/// A module's path from the crate root (`["store", "lines"]`).
type ModPath = Vec<String>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layer list in `lib.rs`'s doc: each `[`module`]` link after "N." is in layer N.
fn layer_list(lib: &str) -> BTreeMap<String, usize> {
    let doc: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(str::trim_start)
        .skip_while(|l| !l.starts_with("Layers,"))
        .collect();
    assert!(!doc.is_empty(), "lib.rs's doc has no \"Layers,\" list");
    let mut layers = BTreeMap::new();
    let mut layer = None;
    for line in doc {
        // A layer starts a line or follows "; " ("9. [`admin`]; 10. [`app`]").
        for (i, part) in line.split("; ").enumerate() {
            let number: String = part.chars().take_while(char::is_ascii_digit).collect();
            if !number.is_empty() && part[number.len()..].starts_with(". ") && (i > 0 || line.starts_with(&number)) {
                layer = Some(number.parse::<usize>().expect("a layer number"));
            }
            let mut rest = part;
            while let Some(at) = rest.find("[`") {
                let name = &rest[at + 2..];
                let end = name.find("`]").expect("a link closes");
                if let Some(n) = layer {
                    let before = layers.insert(name[..end].to_string(), n);
                    assert!(before.is_none(), "lib.rs lists [`{}`] twice", &name[..end]);
                }
                rest = &name[end..];
            }
        }
    }
    layers
}

/// The modules `lib.rs` declares for production (not `#[cfg(test)]`).
fn declared(lib: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        let name = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod "));
        if let Some(name) = name.and_then(|n| n.strip_suffix(';')) {
            if !test_only {
                out.insert(name.to_string());
            }
        }
        test_only = line == "#[cfg(test)]";
    }
    out
}

/// Source with comments, string and char literals blanked out (so braces and paths in them
/// do not count), then `#[cfg(test)]` items cut.
fn code_of(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|c| *c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            i += body + rest[body..].find(&close).expect("a raw string closes") + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if let Some(len) = char_literal(rest) {
            i += len;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            i += c.len_utf8();
        }
    }
    cut_test_items(&out)
}

/// The length of the char literal `rest` starts with ('{', '\'', '\u{7b}'), if it is one
/// (a lifetime, 'a, has no closing quote).
fn char_literal(rest: &str) -> Option<usize> {
    let mut cs = rest.strip_prefix('\'')?.chars();
    match (cs.next()?, cs.next()?) {
        ('\\', _) => Some(3 + rest[3..].find('\'')? + 1),
        (c, '\'') => Some(1 + c.len_utf8() + 1),
        _ => None,
    }
}

/// `code` without the items marked `#[cfg(test)]` (an item ends at its `;` or its block).
fn cut_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        // A field (`name: Type,`) ends at its comma; an item at its `;` or its block.
        let (semi, open) = match field_end(&item["#[cfg(test)]".len()..]) {
            Some(comma) => (Some("#[cfg(test)]".len() + comma), None),
            None => (item.find(';'), item.find('{')),
        };
        let end = match (semi, open) {
            (Some(s), Some(o)) if s < o => s + 1,
            (Some(s), None) => s + 1,
            (_, Some(o)) => {
                let mut depth = 0;
                o + item[o..]
                    .char_indices()
                    .find_map(|(j, c)| {
                        depth += (c == '{') as i32 - (c == '}') as i32;
                        (depth == 0).then_some(j + 1)
                    })
                    .expect("a block closes")
            }
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Where the field that `rest` starts with ends (the offset of its comma or of the
/// struct's closing brace), if `rest` starts with a field: `name: Type` after any further
/// attributes, not a path (`name::`).
fn field_end(rest: &str) -> Option<usize> {
    let mut s = rest.trim_start();
    while s.starts_with("#[") {
        s = s[s.find(']')? + 1..].trim_start();
    }
    let s = s
        .strip_prefix("pub(crate) ")
        .or_else(|| s.strip_prefix("pub "))
        .unwrap_or(s);
    let name = s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').count();
    let after = s[name..].trim_start();
    if name == 0 || !after.starts_with(':') || after.starts_with("::") {
        return None;
    }
    let start = rest.len() - after.len();
    let (mut depth, mut prev) = (0, ' ');
    for (i, c) in after.char_indices() {
        let arrow = prev == '-';
        prev = c;
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            '>' if arrow => {}
            ')' | ']' | '>' => depth -= 1,
            '}' if depth == 0 => return Some(start + i),
            '}' => depth -= 1,
            ',' if depth == 0 => return Some(start + i),
            _ => {}
        }
    }
    None
}

/// Every production source file with its module path; test files (and `#[path]` test
/// modules) left out.
fn files(src: &Path) -> Vec<(ModPath, String)> {
    let mut all = Vec::new();
    walk(src, &mut Vec::new(), &mut all);
    // `#[path = "ca_make.rs"] mod make;` in ca.rs: ca_make.rs is `ca::make`.
    let mut renamed = BTreeMap::new();
    for (module, code) in &all {
        for decl in code.split("#[path = ").skip(1) {
            let file = decl.split('"').nth(1).unwrap_or_default();
            let name = decl
                .split("mod ")
                .nth(1)
                .and_then(|d| d.split(';').next())
                .unwrap_or_default();
            let mut from = module[..module.len() - 1].to_vec();
            from.push(file.trim_end_matches(".rs").to_string());
            let mut to = module.clone();
            to.push(name.trim().to_string());
            renamed.insert(from, to);
        }
    }
    all.into_iter()
        .map(|(m, code)| (renamed.get(&m).cloned().unwrap_or(m), code_of(&code)))
        .collect()
}

fn walk(dir: &Path, at: &mut ModPath, out: &mut Vec<(ModPath, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("src reads").flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains("test") || (at.is_empty() && (name == "sim" || name == "main.rs" || name == "lib.rs")) {
            continue;
        }
        if entry.path().is_dir() {
            at.push(name);
            walk(&entry.path(), at, out);
            at.pop();
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut module = at.clone();
            if stem != "mod" {
                module.push(stem.to_string());
            }
            // A `#[path]` file is named after its parent module's file; the text says which.
            let text = std::fs::read_to_string(entry.path()).expect("a source reads");
            out.push((module, text));
        }
    }
}

/// The paths `code` (the file of module `here`) names from `crate::`, `super::` and `self::`,
/// made absolute; a `{…}` group gives one path per member (its first name is enough).
fn paths_named(here: &ModPath, code: &str) -> Vec<ModPath> {
    let mut out = Vec::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').count();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let boundary = i == 0 || !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':');
        let start = ["crate::", "super::", "self::"].iter().find(|p| rest.starts_with(**p));
        let (Some(start), true) = (start, boundary) else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let mut base: ModPath = match *start {
            "crate::" => Vec::new(),
            "self::" => here.clone(),
            _ => here[..here.len().saturating_sub(1)].to_vec(),
        };
        let mut j = i + start.len();
        while code[j..].starts_with("super::") {
            base.pop();
            j += "super::".len();
        }
        let mut groups = vec![(base, j)];
        while let Some((mut path, mut k)) = groups.pop() {
            let whole = loop {
                if code[k..].starts_with('{') {
                    for member in split_group(&code[k + 1..]) {
                        groups.push((path.clone(), k + 1 + member));
                    }
                    break false;
                }
                let n = ident(&code[k..]);
                if n == 0 {
                    break true;
                }
                path.push(code[k..k + n].to_string());
                k += n;
                if !code[k..].starts_with("::") {
                    break true;
                }
                k += 2;
            };
            if whole {
                out.push(path);
            }
        }
        i = j;
    }
    out
}

/// The start offsets of a `{…}` group's members (after `{`, until its `}`).
fn split_group(s: &str) -> Vec<usize> {
    let mut starts = vec![s.len() - s.trim_start().len()];
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                let after = &s[i + 1..];
                starts.push(i + 1 + after.len() - after.trim_start().len());
            }
            _ => {}
        }
    }
    starts
}

/// Every import edge between two modules that are children of one parent: parent → {from → {to}}.
fn sibling_edges(files: &[(ModPath, String)]) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let modules: BTreeSet<&ModPath> = files.iter().map(|(m, _)| m).collect();
    let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (here, code) in files {
        for target in paths_named(here, code) {
            let common = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(from), Some(to)) = (here.get(common), target.get(common)) else {
                continue; // a module naming itself, an ancestor or a descendant
            };
            let to_module = target[..=common].to_vec();
            if modules.contains(&to_module) {
                let parent = here[..common].to_vec();
                edges
                    .entry(parent)
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .insert(to.clone());
            }
        }
    }
    edges
}

/// A circle in `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            return Some(path[at..].to_vec());
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_layer_list_is_true() {
    let src = src_dir();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs reads");
    let layers = layer_list(&lib);
    let declared = declared(&lib);
    let listed: BTreeSet<String> = layers.keys().cloned().collect();
    assert_eq!(listed, declared, "lib.rs's layer list and its `pub mod`s differ");
    assert!(
        layers.values().all(|n| *n <= MOST_LAYERS),
        "more than {MOST_LAYERS} layers"
    );
    let edges = sibling_edges(&files(&src));
    let mut wrong = Vec::new();
    for (from, tos) in edges.get(&Vec::new()).into_iter().flatten() {
        for to in tos {
            if layers[to] >= layers[from] {
                wrong.push(format!(
                    "{from} (layer {}) uses {to} (layer {})",
                    layers[from], layers[to]
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports from the same layer or above:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_module_has_a_circle_inside() {
    let edges = sibling_edges(&files(&src_dir()));
    let circles: Vec<String> = edges
        .iter()
        .filter_map(|(parent, graph)| circle(graph).map(|c| format!("{}: {}", parent.join("::"), c.join(" → "))))
        .collect();
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn the_reader_sees_what_it_should() {
    // The parsing itself, on a small source: comments, strings and test items do not count.
    let code = code_of(
        "use crate::{a::B, c};\n// crate::d\nlet s = \"crate::e\";\n#[cfg(test)]\nmod t { use crate::f; }\nfn g() { super::h::i(); }\nstruct S {\n    #[cfg(test)]\n    k: crate::k::K<u8, fn() -> u8>,\n    l: crate::l::L,\n}\n",
    );
    let here = vec!["x".to_string(), "y".to_string()];
    let named: BTreeSet<ModPath> = paths_named(&here, &code).into_iter().collect();
    let p = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<ModPath>();
    let want: BTreeSet<ModPath> = [p(&["a", "B"]), p(&["c"]), p(&["x", "h", "i"]), p(&["l", "L"])]
        .into_iter()
        .collect();
    assert_eq!(named, want);
    let lib = "//! Layers, from the ground up:\n//! 1. [`m`], [`n`] (the\n//!    rest)\n//! 2. [`o`]; 3. [`p`].\n";
    let want: BTreeMap<String, usize> = [("m", 1), ("n", 1), ("o", 2), ("p", 3)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(layer_list(lib), want);
}
