//! The layer list of `src/lib.rs`, held to the imports of the library's code.
//!
//! lib.rs lists the crate's top-level modules as a stack of lines, top to bottom, and
//! the helpers beside it. These tests read that list and every path into the crate that
//! the files of `src` name (`crate::`, `super::` and `self::` paths, and a folder
//! root's paths into its own children; unit tests included, so that a test in the
//! library assembles nothing above its module; comments left out) and hold the list
//! to three rules: a module imports only modules on lines below its own; the helpers
//! beside the stack import nothing of it; and each module sits exactly on the line its
//! imports put it on (one above the highest it imports), so the list says no more
//! order than the code has. With the first two rules there is no import cycle in the
//! stack; the helpers are checked for cycles among themselves, and the files of each
//! folder among themselves (its root, `mod.rs`, which declares the others, aside).

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

/// One import of a production file: the top-level module it belongs to, the one it
/// names, and the files of the crate it names.
#[derive(Debug)]
pub(crate) struct Import {
    pub(crate) file: PathBuf,
    pub(crate) from: String,
    pub(crate) to: String,
    /// The file the named path leads to (the longest module path of a file that starts
    /// the named one).
    pub(crate) to_file: Option<PathBuf>,
}

/// A file of `src`: its path below `src`, its module path, and its code without
/// comments, apart from its inline unit tests (`#[cfg(test)] mod tests { .. }`), whose
/// `super::` is the file's own module.
pub(crate) struct SourceFile {
    pub(crate) relative: PathBuf,
    pub(crate) module: Vec<String>,
    code: String,
    inline_tests: String,
}

impl SourceFile {
    /// Whether the file is its module's root, which declares the files of its folder:
    /// `mod.rs`, or `name.rs` beside a folder `name/`.
    fn is_folder_root(&self, src: &Path) -> bool {
        self.relative.ends_with("mod.rs") || src.join(self.relative.with_extension("")).is_dir()
    }
}

/// The files under `src`, unit tests included (lib.rs and main.rs, which only declare
/// and start, left out).
pub(crate) fn production_files(src: &Path) -> Vec<SourceFile> {
    rust_files(src)
        .into_iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(src).unwrap().to_owned();
            if relative == Path::new("lib.rs") || relative == Path::new("main.rs") {
                return None;
            }
            let mut module: Vec<String> = relative
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let (code, inline_tests) = match text.find("#[cfg(test)]\nmod tests {") {
                Some(tests) => (&text[..tests], &text[tests..]),
                None => (text.as_str(), ""),
            };
            Some(SourceFile {
                relative,
                module,
                code: without_comments(code),
                inline_tests: without_comments(inline_tests),
            })
        })
        .collect()
}

/// Every path into the crate named by the files under `src`, by the top-level module
/// each file belongs to.
pub(crate) fn production_imports(src: &Path) -> Vec<Import> {
    let files = production_files(src);
    let by_module: BTreeMap<&[String], &Path> = files
        .iter()
        .map(|file| (file.module.as_slice(), file.relative.as_path()))
        .collect();
    let mut imports = Vec::new();
    for file in &files {
        let from = file.module[0].clone();
        let children = if file.is_folder_root(src) {
            declared_children(&file.code)
        } else {
            Vec::new()
        };
        let tests_module = [file.module.clone(), vec!["tests".to_owned()]].concat();
        let paths = crate_paths_of(&file.code, &file.module, &children)
            .into_iter()
            .chain(crate_paths_of(&file.inline_tests, &tests_module, &[]));
        for path in paths {
            let Some(to) = path.first() else { continue };
            let to_file = (1..=path.len())
                .rev()
                .find_map(|len| by_module.get(&path[..len]))
                .map(|file| file.to_path_buf());
            if to_file.as_deref() == Some(file.relative.as_path()) {
                continue;
            }
            imports.push(Import {
                file: file.relative.clone(),
                from: from.clone(),
                to: to.clone(),
                to_file,
            });
        }
    }
    imports
}

/// The modules a file declares as `mod name;`, whatever their visibility.
fn declared_children(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = match line.strip_prefix("pub") {
                Some(rest) if rest.starts_with('(') => rest.split_once(')')?.1.trim_start(),
                Some(rest) => rest.trim_start(),
                None => line,
            };
            rest.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_owned)
        })
        .collect()
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

/// Code without its comments.
fn without_comments(text: &str) -> String {
    text.lines()
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
    crate_paths_of(&code, &[], &[])
        .into_iter()
        .filter_map(|path| path.into_iter().next())
        .collect()
}

/// The paths into the crate that `code`, the code of the module `module`, names, each
/// as the whole path from the crate's root: `crate::` paths, `super::` and `self::`
/// paths resolved against `module`, and paths that start with one of `children` (the
/// modules the file declares), grouped paths (`crate::{a::X, b}`) split.
fn crate_paths_of(code: &str, module: &[String], children: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let starts = ["crate::", "super::", "self::"]
        .into_iter()
        .chain(children.iter().map(String::as_str));
    for start in starts {
        let is_child = !start.ends_with("::");
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // another name ending in this one, or a path's later segment
            }
            let whole = &code[at..];
            let (base, after) = if is_child {
                match whole[start.len()..].strip_prefix("::") {
                    Some(after) => ([module, &[start.to_owned()]].concat(), after),
                    None => continue,
                }
            } else {
                resolve_relative(whole, module)
            };
            let items: Vec<&str> = match after.strip_prefix('{') {
                Some(group) => group_items(group).collect(),
                None => vec![after],
            };
            for item in items {
                let path_end = item
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(item.len());
                let mut path = base.clone();
                path.extend(
                    item[..path_end]
                        .split("::")
                        .filter(|segment| !segment.is_empty() && *segment != "self")
                        .map(str::to_owned),
                );
                paths.push((at, path));
            }
        }
    }
    paths.sort();
    paths.into_iter().map(|(_, path)| path).collect()
}

/// A path that starts with `crate::`, `super::` (any number of them) or `self::`:
/// the module it starts from, and the text after its leading keywords.
fn resolve_relative<'a>(path: &'a str, module: &[String]) -> (Vec<String>, &'a str) {
    if let Some(after) = path.strip_prefix("crate::") {
        return (Vec::new(), after);
    }
    if let Some(after) = path.strip_prefix("self::") {
        return (module.to_vec(), after);
    }
    let mut base = module.to_vec();
    let mut after = path;
    while let Some(rest) = after.strip_prefix("super::") {
        base.pop();
        after = rest;
    }
    (base, after)
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

pub(crate) fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The imports from one top-level module into another.
fn between_modules() -> Vec<Import> {
    production_imports(&source_dir())
        .into_iter()
        .filter(|import| import.from != import.to)
        .collect()
}

fn layer_list() -> LayerList {
    LayerList::parse(&std::fs::read_to_string(source_dir().join("lib.rs")).unwrap())
}

/// The modules lib.rs declares: `mod name;`, whatever their visibility.
fn declared_modules() -> BTreeSet<String> {
    declared_children(&std::fs::read_to_string(source_dir().join("lib.rs")).unwrap())
        .into_iter()
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
        "lib.rs's layer list and its `mod`s differ"
    );
}

#[test]
fn every_import_runs_down_the_stack() {
    let list = layer_list();
    let against: Vec<String> = between_modules()
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
    for import in between_modules() {
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
    for import in between_modules() {
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

/// Circles among the files of one folder that its root (which declares them) is not
/// part of, named file by file, that are known and why they stay.
const FOLDER_CIRCLES_KEPT: &[(&str, &str)] = &[];

#[test]
fn no_files_of_a_folder_import_each_other_in_a_circle() {
    let src = source_dir();
    let roots: BTreeSet<PathBuf> = production_files(&src)
        .into_iter()
        .filter(|file| file.is_folder_root(&src))
        .map(|file| file.relative)
        .collect();
    let mut imported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for import in production_imports(&src) {
        let Some(to_file) = import.to_file else {
            continue;
        };
        if import.from != import.to || roots.contains(&to_file) || roots.contains(&import.file) {
            continue;
        }
        imported
            .entry(import.file.display().to_string())
            .or_default()
            .insert(to_file.display().to_string());
    }
    let circles: Vec<Vec<String>> = imported
        .keys()
        .filter(|start| !FOLDER_CIRCLES_KEPT.iter().any(|(kept, _)| kept == start))
        .filter_map(|start| circle_through(start, &imported))
        .filter(|circle| {
            !circle
                .iter()
                .any(|file| FOLDER_CIRCLES_KEPT.iter().any(|(kept, _)| kept == file))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "files of a folder importing each other in a circle: {circles:?}"
    );
    for (kept, _) in FOLDER_CIRCLES_KEPT {
        assert!(
            circle_through(kept, &imported).is_some(),
            "{kept} is in no circle any more: take it off FOLDER_CIRCLES_KEPT"
        );
    }
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

#[test]
fn relative_paths_and_a_roots_children_are_read_from_the_root() {
    let module = ["fetch".to_owned(), "waits".to_owned()];
    let code = "use super::{Fetcher, edges::Edge};\n\
                use super::super::cache::DiskCache;\n\
                let p = self::inner::f();\n\
                let d = download::start();\n\
                let q = other::download::start();";
    let named = crate_paths_of(code, &module, &["download".to_owned()]);
    assert_eq!(
        named,
        [
            vec!["fetch", "Fetcher"],
            vec!["fetch", "edges", "Edge"],
            vec!["cache", "DiskCache"],
            vec!["fetch", "waits", "inner", "f"],
            vec!["fetch", "waits", "download", "start"],
        ]
    );
}

#[test]
fn a_declared_module_is_read_whatever_its_visibility() {
    let code = "pub mod a;\npub(crate) mod b;\nmod c;\n#[cfg(test)]\nmod tests {\n}\n";
    assert_eq!(declared_children(code), ["a", "b", "c"]);
}
