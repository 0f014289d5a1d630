//! docs/architecture.md held to the code, so that its picture and its names stay true.
//!
//! Every file and folder the document names exists; every name of the code it gives
//! (`Type::item`, `module::item`, a type, a constant, a function) is defined in the
//! workspace, or, for another crate's names, used by its code; a name given right after
//! a file (`` `fetch/direct.rs` (`is_stray`) ``) is that file's; and every arrow of the
//! picture (a `▼` between two modules of its stack) is an import of the upper module's
//! code into the lower one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::layers::{production_imports, source_dir};

/// Names the document gives that are not the code's, nor any crate's the code uses:
/// what a profile or the kernel shows.
const OUTSIDE_THE_CODE: &[&str] = &[
    "copy_folio_from_iter_atomic",
    "crc_u64_parallel3",
    "epoll_wait",
    "fuse_dev_write",
    "max_background",
    "FOPEN_PASSTHROUGH",
    "O_DIRECT",
    "O_NOFOLLOW",
    "max_pages",
];

/// The workspace's code: each Rust or Python file, its text without comments.
struct Workspace {
    root: PathBuf,
    files: Vec<(PathBuf, String)>,
}

impl Workspace {
    fn read() -> Workspace {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).to_owned();
        let mut paths = Vec::new();
        for dir in [
            "src", "crates", "tests", "bench", "examples", "fuzz", "scripts",
        ] {
            collect_files(&root.join(dir), &mut paths);
        }
        let files = paths
            .into_iter()
            .filter(|path| {
                path.extension()
                    .is_some_and(|e| e == "rs" || e == "py" || e == "pyi")
            })
            .map(|path| {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let comment = if path.extension().is_some_and(|e| e == "rs") {
                    "//"
                } else {
                    "#"
                };
                let code = text
                    .lines()
                    .map(|line| line.split(comment).next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n");
                (path.strip_prefix(&root).unwrap().to_owned(), code)
            })
            .collect();
        Workspace { root, files }
    }

    /// Whether `name` (a file or a folder, `x/`) is the end of a path in the workspace.
    fn has_path(&self, name: &str) -> bool {
        let name = name.trim_end_matches('/');
        ["", "src", "docs"]
            .iter()
            .any(|dir| self.root.join(dir).join(name).exists())
            || self.files.iter().any(|(path, _)| {
                path.ancestors()
                    .any(|place| place.ends_with(name) && place != Path::new(""))
            })
    }

    /// Whether `word` stands as a whole word in some file's code.
    fn uses(&self, word: &str) -> bool {
        self.files.iter().any(|(_, code)| has_word(code, word))
    }

    /// The code of the definitions of `owner`: a type's body and its `impl` blocks, or
    /// a module's files.
    fn bodies_of(&self, owner: &str) -> Vec<&str> {
        let mut bodies = Vec::new();
        let is_module = owner.starts_with(|c: char| c.is_lowercase());
        for (path, code) in &self.files {
            if is_module {
                let dirs: Vec<String> = path
                    .iter()
                    .map(|part| part.to_string_lossy().replace('-', "_"))
                    .collect();
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                let parent = dirs.len().checked_sub(2).map(|at| dirs[at].as_str());
                let is_root = stem == "mod" || stem == "lib";
                let names_it = stem == owner
                    || (is_root && parent == Some(owner))
                    || (stem == "lib" && dirs.len() >= 3 && dirs[dirs.len() - 3] == owner)
                    || (parent == Some(owner) && !is_root);
                if names_it {
                    bodies.push(code.as_str());
                }
                continue;
            }
            for head in ["struct ", "enum ", "trait ", "union "] {
                for (at, _) in code.match_indices(&format!("{head}{owner}")) {
                    if is_name_end(code, at + head.len() + owner.len()) {
                        bodies.push(braced_after(code, at));
                    }
                }
            }
            for (at, _) in code.match_indices("impl") {
                let header_end = code[at..].find('{').map_or(code.len(), |end| at + end);
                let header = &code[at..header_end];
                let implemented = header.split(" for ").last().unwrap_or(header);
                let type_name = implemented
                    .trim_start_matches("impl")
                    .split(" where")
                    .next()
                    .unwrap_or_default()
                    .trim();
                let type_name = strip_generics(type_name);
                if type_name.rsplit("::").next() == Some(owner) && is_name_end(code, at + 4) {
                    bodies.push(braced_after(code, at));
                }
            }
        }
        bodies
    }

    /// Whether `owner::item` is defined in the workspace, or, for another crate's
    /// `owner`, written so in its code.
    fn defines(&self, owner: &str, item: &str) -> bool {
        let bodies = self.bodies_of(owner);
        if bodies.is_empty() {
            let written = format!("{owner}::{item}");
            return self.files.iter().any(|(_, code)| code.contains(&written));
        }
        bodies.iter().any(|body| defines_in(body, item))
            || (owner.starts_with(|c: char| c.is_lowercase())
                && self.has_path(&format!("{owner}/{item}.rs")))
    }
}

fn collect_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, into);
        } else {
            into.push(path);
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn is_name_end(code: &str, at: usize) -> bool {
    !code[at..].starts_with(is_name_char)
}

fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word)
        .any(|(at, _)| !code[..at].ends_with(is_name_char) && is_name_end(code, at + word.len()))
}

/// A type as written in an `impl` header, without its generic arguments.
fn strip_generics(written: &str) -> &str {
    let written = written.trim_start_matches('<');
    let written = match written.find('>') {
        // `impl<T> Type<T>`: the generics of the impl come first.
        Some(close) if written[..close].find('<').is_none() => written[close + 1..].trim(),
        _ => written,
    };
    written.split('<').next().unwrap_or_default().trim()
}

/// The text from `at` to the end of the first braced block after it.
fn braced_after(code: &str, at: usize) -> &str {
    let Some(open) = code[at..].find(['{', ';']).map(|offset| at + offset) else {
        return &code[at..];
    };
    if code[open..].starts_with(';') {
        return &code[at..open];
    }
    let mut depth = 0;
    for (offset, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &code[at..open + offset + 1];
                }
            }
            _ => {}
        }
    }
    &code[at..]
}

/// Whether `body` defines `item`: a function, constant, type or module of that name, or
/// a field or variant (a line that starts with it).
fn defines_in(body: &str, item: &str) -> bool {
    let heads = [
        "fn ",
        "const ",
        "static ",
        "type ",
        "struct ",
        "enum ",
        "trait ",
        "mod ",
        "macro_rules! ",
        "def ",
        "class ",
    ];
    heads.iter().any(|head| {
        body.match_indices(&format!("{head}{item}"))
            .any(|(at, _)| is_name_end(body, at + head.len() + item.len()))
    }) || body.lines().any(|line| {
        let line = line.trim_start();
        let line = match line.strip_prefix("pub") {
            Some(rest) if rest.starts_with('(') => {
                rest.split_once(')').map_or(rest, |(_, rest)| rest)
            }
            Some(rest) => rest,
            None => line,
        };
        let line = line.trim_start();
        line.strip_prefix(item)
            .is_some_and(|rest| !rest.starts_with(is_name_char))
    })
}

/// The document, and its picture (the first fenced block).
struct Document {
    text: String,
    picture: String,
}

impl Document {
    fn read() -> Document {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
        let text = std::fs::read_to_string(path).unwrap();
        let picture = text
            .split("```")
            .nth(1)
            .expect("the picture's fenced block")
            .to_owned();
        Document { text, picture }
    }

    /// The text between backticks, and the words of the picture that look like code.
    fn code_spans(&self) -> BTreeSet<String> {
        let mut spans: BTreeSet<String> = self
            .text
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|span| !span.contains('\n'))
            .map(str::to_owned)
            .collect();
        let words = self
            .picture
            .split(|c: char| !(is_name_char(c) || matches!(c, ':' | '/' | '.' | '-')));
        for word in words {
            let word = word.trim_end_matches(['.', ':']);
            let is_code = word.contains("::")
                || word.ends_with(".rs")
                || (word.contains('_') && word.starts_with(|c: char| c.is_lowercase()))
                || is_camel_case(word);
            if is_code && !word.contains("::/") {
                spans.insert(word.to_owned());
            }
        }
        spans
    }
}

/// `FsCore`, `DiskCache`: a capital, lower case, and another capital further on.
fn is_camel_case(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && word.chars().skip(2).any(|c| c.is_ascii_uppercase())
        && word.chars().all(is_name_char)
}

fn is_path(span: &str) -> bool {
    let is_file = [".rs", ".py", ".pyi", ".md"]
        .iter()
        .any(|ending| span.ends_with(ending));
    let is_folder = span.ends_with('/') && span.len() > 1;
    (is_file || is_folder)
        && !span.starts_with('.')
        && span
            .chars()
            .all(|c| is_name_char(c) || matches!(c, '/' | '.' | '-'))
}

fn is_code_path(span: &str) -> bool {
    span.contains("::")
        && span
            .split("::")
            .all(|segment| !segment.is_empty() && segment.chars().all(is_name_char))
}

#[test]
fn every_file_the_document_names_exists() {
    let workspace = Workspace::read();
    let document = Document::read();
    let mut missing: Vec<String> = document
        .code_spans()
        .into_iter()
        .filter(|span| is_path(span) && !workspace.has_path(span))
        .collect();
    // Links: [text](../path).
    for link in document.text.split("](").skip(1) {
        let target = link.split([')', '#']).next().unwrap_or_default();
        if !target.contains("://")
            && !target.is_empty()
            && !workspace.root.join("docs").join(target).exists()
        {
            missing.push(target.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md names files that are not there: {missing:?}"
    );
}

#[test]
fn every_name_the_document_gives_is_the_codes() {
    let workspace = Workspace::read();
    let document = Document::read();
    let mut unknown = Vec::new();
    for span in document.code_spans() {
        if OUTSIDE_THE_CODE.contains(&span.as_str()) {
            continue;
        }
        let known = if is_code_path(&span) {
            let segments: Vec<&str> = span.split("::").collect();
            segments
                .windows(2)
                .all(|pair| workspace.defines(pair[0], pair[1]))
        } else if is_camel_case(&span)
            || (span.len() > 3 && span.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            || (span.contains('_')
                && !span.starts_with('_')
                && span
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
        {
            workspace.uses(&span)
        } else {
            true
        };
        if !known {
            unknown.push(span);
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/architecture.md gives names the code does not have: {unknown:?}"
    );
}

#[test]
fn a_name_given_after_a_file_is_that_files() {
    let workspace = Workspace::read();
    let document = Document::read();
    let mut wrong = Vec::new();
    let spans: Vec<&str> = document.text.split('`').collect();
    // A span, then ` (`, then a span: "`fetch/direct.rs` (`is_stray`".
    for at in (1..spans.len().saturating_sub(2)).step_by(2) {
        let (file, between, name) = (spans[at], spans[at + 1], spans[at + 2]);
        if !file.ends_with(".rs") || between != " (" {
            continue;
        }
        let name = name.rsplit("::").next().unwrap_or(name);
        if !name.chars().all(is_name_char) || name.is_empty() {
            continue;
        }
        let code = workspace
            .files
            .iter()
            .filter(|(path, _)| path.ends_with(file))
            .map(|(_, code)| code.as_str())
            .collect::<Vec<_>>();
        if !code.iter().any(|code| has_word(code, name)) {
            wrong.push(format!("{file} ({name})"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md gives names to files that do not have them: {wrong:?}"
    );
}

/// A module of the picture's stack: its top-level module and, if it names one, its file.
fn module_of(name: &str) -> (String, Option<PathBuf>) {
    let top = name
        .split('/')
        .next()
        .unwrap_or_default()
        .trim_end_matches(".rs")
        .to_owned();
    let file = name.ends_with(".rs").then(|| PathBuf::from(name));
    (top, file)
}

/// The picture's arrows: pairs of modules of its stack (the names at the column of
/// its first) with a `▼` on the lines between them.
fn picture_arrows(picture: &str) -> Vec<(String, String)> {
    let lines: Vec<Vec<char>> = picture.lines().map(|line| line.chars().collect()).collect();
    let first = lines
        .iter()
        .find_map(|line| {
            let text: String = line.iter().collect();
            text.find("fs/fuse.rs")
                .map(|byte| text[..byte].chars().count())
        })
        .expect("the picture starts at fs/fuse.rs");
    let mut arrows = Vec::new();
    let mut above: Option<String> = None;
    let mut arrow_since = false;
    for line in &lines {
        let before: String = line.iter().take(first).collect();
        let token: String = line
            .iter()
            .skip(first)
            .take_while(|c| !c.is_whitespace())
            .collect();
        let starts_box = !token.is_empty()
            && (before.trim().is_empty() || before.contains('▶'))
            && is_path(&token);
        if starts_box {
            if let (Some(upper), true) = (&above, arrow_since) {
                arrows.push((upper.clone(), token.clone()));
            }
            above = Some(token);
            arrow_since = false;
        } else if line.iter().take(first + 4).skip(first).any(|&c| c == '▼') {
            arrow_since = true;
        } else if line.iter().all(|c| c.is_whitespace()) {
            above = None;
        }
    }
    arrows
}

#[test]
fn every_arrow_of_the_picture_is_an_import() {
    let document = Document::read();
    let imports = production_imports(&source_dir());
    let arrows = picture_arrows(&document.picture);
    assert!(
        arrows.len() >= 6,
        "the picture's arrows not found: {arrows:?}"
    );
    let untrue: Vec<String> = arrows
        .iter()
        .filter(|(upper, lower)| {
            let (upper_module, upper_file) = module_of(upper);
            let (lower_module, lower_file) = module_of(lower);
            !imports.iter().any(|import| {
                if upper_module != lower_module {
                    import.from == upper_module && import.to == lower_module
                } else {
                    Some(&import.file) == upper_file.as_ref() && import.to_file == lower_file
                }
            })
        })
        .map(|(upper, lower)| format!("{upper} ▼ {lower}"))
        .collect();
    assert!(
        untrue.is_empty(),
        "arrows of docs/architecture.md's picture that no import makes: {untrue:?}"
    );
}
