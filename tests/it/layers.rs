//! The layer list of `src/lib.rs`, held to the imports of the production code.
//!
//! lib.rs lists the crate's top-level modules as a stack of lines, top to bottom, and
//! the helpers beside it. These tests read that list and every `crate::` path of the
//! production files (tests and comments left out) and hold the list to three rules:
//! a module imports only modules on lines below its own; the helpers beside the stack
//! import nothing of it; and each module sits exactly on the line its imports put it
//! on (one above the highest it imports), so the list says no more order than the
//! code has. With the first two rules there is no import cycle in the stack; the
//! helpers are checked for cycles among themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// lib.rs's list: the stack's lines from the bottom up, and the modules beside it.
struct LayerList {
    lines_bottom_up: Vec<Vec<String>>,
    beside: BTreeSet<String>,
}

impl LayerList {
    /// The line a stack module is on, counted from the bottom (0).
    fn line_of(&self, module: &str) -> Option<usize> {
        self.lines_bottom_up
            .iter()
            .position(|line| line.iter().any(|m| m == module))
    }

    /// Reads the list from lib.rs's module doc: each `- ` item of the stack names its
    /// line's modules as links before its first colon; the paragraph that starts
    /// "Beside the stack" names the helpers.
    fn parse(lib_rs: &str) -> LayerList {
        let doc: Vec<&str> = lib_rs
            .lines()
            .map_while(|line| line.strip_prefix("//!"))
            .map(str::trim)
            .collect();
        let mut items: Vec<String> = Vec::new();
        let mut beside = String::new();
        let mut in_beside = false;
        for line in doc {
            if line.starts_with("Beside the stack") {
                in_beside = true;
            }
            if in_beside {
                beside.push_str(line);
                beside.push(' ');
            } else if let Some(item) = line.strip_prefix("- ") {
                items.push(item.to_owned());
            } else if let (Some(item), false) = (items.last_mut(), line.is_empty()) {
                item.push(' ');
                item.push_str(line);
            }
        }
        let mut lines_bottom_up: Vec<Vec<String>> = items
            .iter()
            .map(|item| module_links(item.split(':').next().unwrap_or_default()))
            .collect();
        lines_bottom_up.reverse();
        LayerList {
            lines_bottom_up,
            beside: module_links(&beside).into_iter().collect(),
        }
    }
}

/// The top-level modules a doc text links to: [`name`], not [`name::item`].
fn module_links(text: &str) -> Vec<String> {
    text.split("[`")
        .skip(1)
        .filter_map(|rest| rest.split_once("`]").map(|(name, _)| name))
        .filter(|name| !name.contains("::"))
        .map(str::to_owned)
        .collect()
}

/// One `crate::` import of a production file.
#[derive(Debug)]
struct Import {
    file: PathBuf,
    from: String,
    to: String,
}

/// Every `crate::module` named by the production files under `src`, by the top-level
/// module each file belongs to (lib.rs and main.rs, which only declare and start, left
/// out).
fn production_imports(src: &Path) -> Vec<Import> {
    let mut imports = Vec::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap();
        let from = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        let name = relative.file_name().unwrap().to_string_lossy();
        if from == "lib" || from == "main" || name.contains("tests") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for to in crate_paths(production_part(&text)) {
            if to != from {
                imports.push(Import {
                    file: relative.to_owned(),
                    from: from.clone(),
                    to,
                });
            }
        }
    }
    imports
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// A file's text before its inline unit tests, without comments.
fn production_part(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(tests) => &text[..tests],
        None => text,
    };
    code.lines()
        .map(|line| match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules that `crate::` paths in `code` start with, grouped paths
/// (`crate::{a::X, b}`) included.
fn crate_paths(code: String) -> Vec<String> {
    let mut modules = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // another crate's name ending in "crate"
        }
        match rest.strip_prefix('{') {
            Some(group) => modules.extend(group_items(group).map(leading_name)),
            None => modules.push(leading_name(rest)),
        }
    }
    modules
}

/// The items of a `{a::X, b::{Y, Z}}` group (its text after the `{`), split at its own
/// commas.
fn group_items(group: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0;
    let end = group
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => return true,
                '}' => depth -= 1,
                _ => {}
            }
            false
        })
        .map_or(group.len(), |(at, _)| at);
    let mut depth = 0;
    group[..end]
        .split(move |c| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => return true,
                _ => {}
            }
            false
        })
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

/// The name a path starts with.
fn leading_name(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_list() -> LayerList {
    LayerList::parse(&std::fs::read_to_string(source_dir().join("lib.rs")).unwrap())
}

/// The modules lib.rs declares: `pub mod name;`.
fn declared_modules() -> BTreeSet<String> {
    std::fs::read_to_string(source_dir().join("lib.rs"))
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_layer_list_names_every_module_once() {
    let list = layer_list();
    let mut named: Vec<String> = list.lines_bottom_up.concat();
    named.extend(list.beside.iter().cloned());
    let named_set: BTreeSet<String> = named.iter().cloned().collect();
    assert_eq!(
        named.len(),
        named_set.len(),
        "a module named twice: {named:?}"
    );
    assert_eq!(
        named_set,
        declared_modules(),
        "lib.rs's layer list and its `pub mod`s differ"
    );
}

#[test]
fn every_import_runs_down_the_stack() {
    let list = layer_list();
    let against: Vec<String> = production_imports(&source_dir())
        .into_iter()
        .filter_map(|import| {
            let to = list.line_of(&import.to);
            match (
                list.line_of(&import.from),
                list.beside.contains(&import.from),
            ) {
                (Some(from), _) if to.is_some_and(|to| to >= from) => Some(format!(
                    "{}: {} (line {from} from the bottom) imports {} (line {})",
                    import.file.display(),
                    import.from,
                    import.to,
                    to.unwrap()
                )),
                (_, true) if to.is_some() => Some(format!(
                    "{}: {}, beside the stack, imports {} of the stack",
                    import.file.display(),
                    import.from,
                    import.to
                )),
                _ => None,
            }
        })
        .collect();
    assert!(
        against.is_empty(),
        "imports against src/lib.rs's layer list:\n{}",
        against.join("\n")
    );
}

#[test]
fn each_module_sits_one_line_above_the_highest_it_imports() {
    let list = layer_list();
    let mut imported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for import in production_imports(&source_dir()) {
        imported.entry(import.from).or_default().insert(import.to);
    }
    // Bottom up, each line's modules sit where the lines below already are.
    let mut placed: BTreeMap<String, usize> = BTreeMap::new();
    let mut misplaced = Vec::new();
    for (line, modules) in list.lines_bottom_up.iter().enumerate() {
        for module in modules {
            let fits = imported
                .get(module)
                .into_iter()
                .flatten()
                .filter_map(|to| placed.get(to).map(|line| line + 1))
                .max()
                .unwrap_or(0);
            if fits != line {
                misplaced.push(format!(
                    "{module} is on line {line} from the bottom; its imports put it on line {fits}"
                ));
            }
        }
        for module in modules {
            placed.insert(module.clone(), line);
        }
    }
    assert!(
        misplaced.is_empty(),
        "src/lib.rs's layer list is not the one its imports make:\n{}",
        misplaced.join("\n")
    );
}

#[test]
fn no_modules_import_each_other_in_a_circle() {
    let mut imported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for import in production_imports(&source_dir()) {
        imported.entry(import.from).or_default().insert(import.to);
    }
    let circles: Vec<Vec<String>> = imported
        .keys()
        .filter_map(|start| circle_through(start, &imported))
        .collect();
    assert!(
        circles.is_empty(),
        "modules importing each other in a circle: {circles:?}"
    );
}

/// A path of imports from `start` back to itself, if there is one.
fn circle_through(
    start: &str,
    imported: &BTreeMap<String, BTreeSet<String>>,
) -> Option<Vec<String>> {
    let mut path = vec![start.to_owned()];
    let mut seen = BTreeSet::new();
    fn walk(
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
        imported: &BTreeMap<String, BTreeSet<String>>,
    ) -> bool {
        for next in imported.get(path.last().unwrap()).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(start, path, seen, imported) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(start, &mut path, &mut seen, imported).then_some(path)
}

#[test]
fn grouped_and_nested_crate_paths_are_read_as_their_top_modules() {
    let code = "use crate::{cache::{DiskCache, Part}, error::FsError};\n\
                let x = crate::view::plan_read(a);\n\
                use my_crate::other;"
        .to_owned();
    assert_eq!(crate_paths(code), ["cache", "error", "view"]);
}
