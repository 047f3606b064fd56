//! The structure drawn from the imports: every `use` and every path through `crate::`,
//! `super::` or a child module, file by file under src/ (test code left out). It must have no
//! loops, and no import may go from a module to one in a higher layer of the table in
//! docs/design.md ("Layers"), which must name every module of src/lib.rs exactly once. Files
//! stay under about 450 lines, src/lib.rs's map names every module, and every repository path
//! docs/ and the README name exists.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module of the library: its path (`storage::redis::slots`) and its code without tests.
struct Module {
    file: PathBuf,
    code: String,
}

#[test]
fn imports_have_no_loops_and_never_go_up_a_layer() {
    let modules = modules();
    let graph = graph(&modules);
    if std::env::var_os("TOLLGATE_PRINT_IMPORTS").is_some() {
        for (from, targets) in &graph {
            println!(
                "{from} -> {}",
                targets.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import loop: {}", cycle.join(" → "));
    }
    let layers = layers();
    let top: BTreeSet<&str> = modules
        .keys()
        .map(|path| path.split("::").next().unwrap())
        .collect();
    let listed: BTreeSet<&str> = layers.keys().map(String::as_str).collect();
    assert_eq!(
        top, listed,
        "docs/design.md's layer table must name every module of src/lib.rs"
    );
    let layer = |path: &str| layers[path.split("::").next().unwrap()];
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(from, targets)| targets.iter().map(move |to| (from, to)))
        .filter(|(from, to)| layer(from) < layer(to))
        .map(|(from, to)| {
            format!(
                "{from} (layer {}) → {to} (layer {})",
                layer(from),
                layer(to)
            )
        })
        .collect();
    assert!(
        upward.is_empty(),
        "imports from a lower layer to a higher one:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_file_under_src_is_longer_than_about_450_lines_apart_from_tests() {
    let long: Vec<String> = modules()
        .values()
        .filter(|module| module.code.lines().count() > 460)
        .map(|module| {
            format!(
                "{}: {} lines",
                module.file.display(),
                module.code.lines().count()
            )
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn the_lib_map_names_every_module() {
    let lib = std::fs::read_to_string("src/lib.rs").unwrap();
    let map: String = lib
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<String> = modules()
        .keys()
        .filter(|path| {
            let file = path.replace("::", "/");
            !map.contains(&format!("`{path}`"))
                && !map.contains(&format!("{file}.rs"))
                && !map.contains(&format!("{file}/"))
        })
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's map does not name: {}",
        missing.join(", ")
    );
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let mut documents: Vec<PathBuf> = std::fs::read_dir("docs")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    documents.push(PathBuf::from("README.md"));
    let mut missing = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        for path in repository_paths(&text) {
            if !Path::new(&path).exists() {
                missing.push(format!("{}: {path}", document.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The paths in `text` that start at one of the repository's top folders (`src/…`,
/// `tests/…`, …), without a trailing anchor or punctuation; a path with a placeholder
/// (`<name>`, `*`) names no one file and is left out.
fn repository_paths(text: &str) -> Vec<String> {
    const ROOTS: [&str; 10] = [
        "src/",
        "tests/",
        "scripts/",
        "deploy/",
        "docs/",
        "examples/",
        "benches/",
        "proto/",
        "fuzz/",
        ".ci/",
    ];
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/._-<>*{}".contains(c);
    let mut paths = Vec::new();
    for (at, _) in text.char_indices() {
        let rest = &text[at..];
        let Some(root) = ROOTS.iter().find(|root| rest.starts_with(**root)) else {
            continue;
        };
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || "/._-".contains(c)) {
            continue;
        }
        let end = rest.find(|c: char| !path_char(c)).unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches(['.', ',', ';', ':', ')']);
        if path.len() > root.len() && !path.contains(['<', '>', '*', '{', '}']) {
            paths.push(path.to_owned());
        }
    }
    paths
}

/// Every library module but test-only ones, by path.
fn modules() -> BTreeMap<String, Module> {
    let mut modules = BTreeMap::new();
    let mut pending = vec![(String::new(), PathBuf::from("src/lib.rs"))];
    while let Some((path, file)) = pending.pop() {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_tests(&file, &text);
        for child in children(&code) {
            let dir = match file.file_name().and_then(|name| name.to_str()) {
                Some("lib.rs" | "mod.rs") => file.parent().unwrap().to_path_buf(),
                _ => file.with_extension(""),
            };
            let flat = dir.join(format!("{child}.rs"));
            let child_file = if flat.exists() {
                flat
            } else {
                dir.join(&child).join("mod.rs")
            };
            let child_path = if path.is_empty() {
                child.clone()
            } else {
                format!("{path}::{child}")
            };
            pending.push((child_path, child_file));
        }
        if !path.is_empty() {
            modules.insert(path, Module { file, code });
        }
    }
    modules
}

/// The code of a file without its tests: a `#[cfg(test)]` item is either a `mod x;` line or
/// the `mod tests { … }` that ends the file.
fn without_tests(file: &Path, text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(strip_comment(line));
            out.push('\n');
            continue;
        }
        let Some(item) = lines.next() else { break };
        if item.trim_end().ends_with(';') {
            continue;
        }
        let rest: Vec<&str> = lines.by_ref().collect();
        assert!(
            item.contains("mod ") && rest.last().is_some_and(|last| *last == "}"),
            "{}: a #[cfg(test)] block must be the module that ends the file",
            file.display()
        );
    }
    out
}

fn strip_comment(line: &str) -> &str {
    match line.find("//") {
        // A `//` inside a string literal (a URL) is kept: it names no module anyway.
        Some(at) if !line[..at].contains('"') => &line[..at],
        _ => line,
    }
}

/// The modules a file declares (`mod x;`, `pub mod x;`).
fn children(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

/// Module → the modules it imports.
fn graph(modules: &BTreeMap<String, Module>) -> BTreeMap<String, BTreeSet<String>> {
    let macros = macro_homes(modules);
    modules
        .iter()
        .map(|(path, module)| {
            let targets = paths(&module.code)
                .into_iter()
                .filter_map(|segments| resolve(path, &segments, modules, &macros))
                .filter(|target| target != path)
                .collect();
            (path.clone(), targets)
        })
        .collect()
}

/// Where each exported macro is defined (`crate::request_span!` names a macro, not a module).
fn macro_homes(modules: &BTreeMap<String, Module>) -> BTreeMap<String, String> {
    let mut homes = BTreeMap::new();
    for (path, module) in modules {
        for line in module.code.lines() {
            if let Some(rest) = line.trim().strip_prefix("macro_rules! ") {
                let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
                homes.insert(name, path.clone());
            }
        }
    }
    homes
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in the code, as segments: `use` trees expanded, and every `a::b::c` elsewhere.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    // `use` statements first, removed from the text so their trees are not read twice.
    let mut others = String::new();
    while let Some(at) = find_use(rest) {
        others.push_str(&rest[..at]);
        let end = rest[at..].find(';').map_or(rest.len(), |end| at + end);
        let tree = rest[at..end]
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .trim_start_matches("use ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        expand(&tree, &mut Vec::new(), &mut out);
        rest = &rest[end..];
    }
    others.push_str(rest);
    let chars: Vec<char> = others.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts =
            is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let word: String = chars[j..].iter().take_while(|c| is_ident(**c)).collect();
            j += word.chars().count();
            segments.push(word);
            if chars.get(j) == Some(&':')
                && chars.get(j + 1) == Some(&':')
                && chars.get(j + 2).is_some_and(|c| is_ident(*c))
            {
                j += 2;
            } else {
                break;
            }
        }
        if segments.len() > 1 {
            out.push(segments);
        }
        i = j.max(i + 1);
    }
    out
}

/// The start of the next `use` statement at the start of a line.
fn find_use(code: &str) -> Option<usize> {
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if ["use ", "pub use ", "pub(crate) use "]
            .iter()
            .any(|p| trimmed.starts_with(p))
        {
            return Some(offset + line.len() - trimmed.len());
        }
        offset += line.len();
    }
    None
}

/// Expands a use tree (`a::b::{c, d::{e, f}}`) into paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let leaf = tree.split(" as ").next().unwrap_or(tree);
        let mut path = prefix.clone();
        path.extend(
            leaf.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        out.push(path);
        return;
    };
    let head: Vec<String> = tree[..open]
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let depth = prefix.len();
    prefix.extend(head);
    let mut level = 0;
    let mut start = 0;
    for (at, c) in inner.char_indices() {
        match c {
            '{' => level += 1,
            '}' => level -= 1,
            ',' if level == 0 => {
                expand(&inner[start..at], prefix, out);
                start = at + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        expand(&inner[start..], prefix, out);
    }
    prefix.truncate(depth);
}

/// The module a path in `from` (at `file`) names, if it names one of ours.
fn resolve(
    from: &str,
    segments: &[String],
    modules: &BTreeMap<String, Module>,
    macros: &BTreeMap<String, String>,
) -> Option<String> {
    let mut base: Vec<&str> = from.split("::").collect();
    let mut rest = segments;
    match segments.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &segments[1..];
        }
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some("self") => rest = &segments[1..],
        // Relative to this module: only a child module of it counts.
        Some(first) if modules.contains_key(&join(&base, &[first.to_owned()])) => {}
        _ => return None,
    }
    let mut found = None;
    for length in 1..=rest.len() {
        let candidate = join(&base, &rest[..length]);
        if modules.contains_key(&candidate) {
            found = Some(candidate);
        }
    }
    if found.is_none() && base.is_empty() {
        found = rest.first().and_then(|name| macros.get(name)).cloned();
    }
    found.or_else(|| {
        (!base.is_empty())
            .then(|| base.join("::"))
            .filter(|m| modules.contains_key(m))
    })
}

fn join(base: &[&str], rest: &[String]) -> String {
    base.iter()
        .map(|s| (*s).to_owned())
        .chain(rest.iter().cloned())
        .collect::<Vec<_>>()
        .join("::")
}

/// A loop in the graph, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[start..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

/// docs/design.md's layer table: `| 3 | `storage`, `config` | … |` rows under "## Layers".
fn layers() -> BTreeMap<String, u32> {
    let design = std::fs::read_to_string("docs/design.md").expect("docs/design.md");
    let section = design
        .split("\n## ")
        .find(|section| section.starts_with("Layers"))
        .expect("docs/design.md has a \"Layers\" section");
    let mut layers = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(layer) = cells.get(1).and_then(|cell| cell.parse::<u32>().ok()) else {
            continue;
        };
        for name in cells[2].split(',') {
            let name = name.trim().trim_matches('`').to_owned();
            assert!(
                layers.insert(name.clone(), layer).is_none(),
                "docs/design.md names {name} twice"
            );
        }
    }
    layers
}
