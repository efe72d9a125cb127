#!/usr/bin/env python3
"""No import circle in the workspace (run by `make unit`).

Within each crate of the workspace, its top-level modules (`src/<m>.rs` or `src/<m>/`) must import one another
without a circle: a module reached from `src/x` by `crate::y` paths may not reach back to `x`. A circle means
two jobs that cannot be read, tested or moved apart; the layering of each crate is in docs/architecture.md.
The datapaths crate also keeps its documented order (`agent/datapaths/src/lib.rs`): each layer imports only
the ones before it.

Imports are read from code, not comments (found as Rust's lexer finds them, so a `//` in a string is none):
every `crate::<module>` path, and `crate::{a, b::c}` groups. A binary under `src/bin/<name>/` is a crate of its
own.
"""
import os
import re
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `crate::x`, not `$crate::x` (a macro's) nor `pub(crate)`.
CRATE_PATH = re.compile(r"(?<![\w$])crate::([a-z_][a-z0-9_]*)")
CRATE_GROUP = re.compile(r"(?<![\w$])crate::\{([^}]*)\}")
GROUP_ITEM = re.compile(r"(?:^|,)\s*([a-z_][a-z0-9_]*)")

DATAPATHS_LAYERS = ["netns", "datapath", "emulator", "userspace"]


def workspace_members():
    text = read_file(os.path.join(REPO, "Cargo.toml"))
    members = re.search(r"^members\s*=\s*\[([^\]]*)\]", text, re.M).group(1)
    return re.findall(r'"([^"]+)"', members)


# What opens a comment or a literal: `//`, `/*`, a string, a char literal or lifetime, a raw string (`r"…"`,
# `r#"…"#`, after `b` or `c` too; not an identifier's `r` nor a raw identifier's `r#`).
OPENER = re.compile(r"""//|/\*|"|'|(?<!\w)[bc]?r(#*)\"""")
STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
BLOCK_MARK = re.compile(r"/\*|\*/")


def code_of(text):
    """The text without comments, so that doc links are not imports: `//` to the end of the line and `/* */`
    (nested), read as Rust's lexer reads them. A `//` or `/*` inside a string (escapes included), a raw string
    (`r#"…"#`) or a char literal (`'"'`) opens no comment, and a lifetime (`'a`) opens no literal. Strings are
    kept; a block comment leaves its line breaks."""
    out, i, start, n = [], 0, 0, len(text)
    while opener := OPENER.search(text, i):
        token, i = opener.group(), opener.start()
        if token == "//":
            out.append(text[start:i])
            end = text.find("\n", i)
            i = start = n if end < 0 else end
        elif token == "/*":
            out.append(text[start:i])
            i = end_of_block_comment(text, i)
            out.append("\n" * text.count("\n", start, i))
            start = i
        elif token == '"':
            rest = STRING_REST.match(text, i + 1)
            i = rest.end() if rest else n
        elif token == "'":
            i = end_of_char_or_lifetime(text, i)
        else:
            hashes = opener.group(1)
            end = text.find('"' + hashes, opener.end())
            i = n if end < 0 else end + 1 + len(hashes)
    out.append(text[start:])
    return "".join(out)


def end_of_block_comment(text, i):
    """Just past the `*/` that closes the block comment opened at `i`; Rust's nest."""
    depth = 0
    for mark in BLOCK_MARK.finditer(text, i):
        depth += 1 if mark.group() == "/*" else -1
        if depth == 0:
            return mark.end()
    return len(text)


def end_of_char_or_lifetime(text, i):
    """Past the char literal opened by the `'` at `i` (`'x'`, `'"'`, `'\\''`, `'\\u{…}'`), or just past the `'`
    of a lifetime or label (`'a`, `'static`), which opens nothing."""
    if text.startswith("\\", i + 1):
        end = text.find("'", i + 3)
        return len(text) if end < 0 else end + 1
    if text.startswith("'", i + 2) and not text.startswith("'", i + 1):
        return i + 3
    return i + 1


def imports_of(text):
    code = code_of(text)
    found = set(CRATE_PATH.findall(code))
    for group in CRATE_GROUP.findall(code):
        found.update(GROUP_ITEM.findall(group))
    return found


def crate_roots(member):
    """(name, source dir, files) per crate of a workspace member: the library and main binary share `src/`,
    each `src/bin/<name>/` is its own."""
    src = os.path.join(REPO, member, "src")
    bins = os.path.join(src, "bin")
    roots = []
    lib_files = []
    for root, dirs, files in os.walk(src):
        if os.path.abspath(root) == os.path.abspath(bins):
            for d in dirs:
                roots.append((f"{member} bin {d}", os.path.join(bins, d), walk_rs(os.path.join(bins, d))))
            dirs[:] = []
            continue
        lib_files += [os.path.join(root, f) for f in files if f.endswith(".rs")]
    roots.append((member, src, lib_files))
    return roots


def walk_rs(directory):
    return [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs if f.endswith(".rs")]


def read_file(path):
    with open(path) as f:
        return f.read()


def module_graph(src, files, read=read_file):
    """Top-level module → the other top-level modules it imports."""
    graph = {}
    for path in files:
        top = os.path.relpath(path, src).split(os.sep)[0]
        top = top[:-3] if top.endswith(".rs") else top
        if top in ("lib", "main"):
            continue
        graph.setdefault(top, set()).update(m for m in imports_of(read(path)) if m != top)
    return graph


def circles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph, component):
    return "; ".join(f"{m} → {', '.join(sorted(graph[m] & set(component)))}" for m in component)


class ImportCircles(unittest.TestCase):
    def test_no_crate_has_a_circle_among_its_top_level_modules(self):
        checked = 0
        for member in workspace_members():
            for name, src, files in crate_roots(member):
                graph = module_graph(src, files)
                checked += len(graph)
                for component in circles(graph):
                    self.fail(f"{name}: import circle among {component}: {describe(graph, component)}")
        self.assertGreater(checked, 50, "the workspace's modules were found")

    def test_the_datapaths_keep_their_layers(self):
        src = os.path.join(REPO, "agent", "datapaths", "src")
        graph = module_graph(src, walk_rs(src))
        self.assertEqual(sorted(graph), sorted(DATAPATHS_LAYERS), "the layers are the crate's modules")
        for i, layer in enumerate(DATAPATHS_LAYERS):
            later = graph[layer] & set(DATAPATHS_LAYERS[i + 1:])
            self.assertFalse(later, f"{layer} imports {sorted(later)}, a layer after it")

    def test_a_circle_is_found_and_named(self):
        files = {
            "src/a.rs": "use crate::b::X; // crate::c in a comment is no import",
            "src/b/mod.rs": "use crate::{c, d::Y};",
            "src/c.rs": "/* crate::a */ pub(crate) fn f() { $crate::a::g() }",
            "src/d.rs": "fn g() { crate::a::h() }",
        }
        graph = module_graph("src", list(files), read=files.__getitem__)
        self.assertEqual(graph, {"a": {"b"}, "b": {"c", "d"}, "c": set(), "d": {"a"}})
        self.assertEqual(circles(graph), [["a", "b", "d"]])
        self.assertEqual(describe(graph, ["a", "b", "d"]), "a → b; b → d; d → a")
        graph["d"] = set()
        self.assertEqual(circles(graph), [])

    def test_a_url_in_a_string_hides_no_import_after_it(self):
        self.assertEqual(imports_of('let u = "https://example.com"; use crate::b::X; // crate::c'), {"b"})
        self.assertEqual(imports_of('f("a /* b"); crate::d::g(); /* crate::e */'), {"d"})

    def test_escapes_end_no_string_early(self):
        self.assertEqual(imports_of(r'let s = "\"// still the string\\"; use crate::a; // crate::b'), {"a"})
        self.assertEqual(imports_of('let s = "\\\\"; use crate::a; // crate::b'), {"a"}, "an escaped backslash")

    def test_raw_strings_hold_comment_markers(self):
        text = 'let s = r#"a // "quoted" /* b"#; use crate::a; // crate::b\nlet t = r"//"; crate::c::f();'
        self.assertEqual(imports_of(text), {"a", "c"})
        self.assertEqual(imports_of('let s = br##"a "# // b"##; crate::a::f(); // crate::b'), {"a"})
        self.assertEqual(imports_of("let r#type = 1; // crate::b\nuse crate::a;"), {"a"}, "a raw identifier")

    def test_block_comments_nest(self):
        text = "/* outer /* crate::x */ crate::y */ use crate::z;\n/*\n crate::w\n*/ crate::v::f();"
        self.assertEqual(imports_of(text), {"z", "v"})
        self.assertEqual(code_of("a /* b\nc */ d // e\nf"), "a \n d \nf", "a block comment keeps its line breaks")

    def test_char_literals_and_lifetimes(self):
        quote = """let q = '"'; let u = "https://x"; use crate::a; // crate::b"""
        self.assertEqual(imports_of(quote), {"a"}, "a quote as a char opens no string")
        self.assertEqual(imports_of(r"""let q = '\''; let u = "//"; use crate::a; // crate::b"""), {"a"})
        self.assertEqual(imports_of(r"""let q = b'\\'; let u = '\u{22}'; use crate::a; // crate::b"""), {"a"})
        lifetime = "fn f(x: &'static str) { crate::a::g(x) } // crate::b"
        self.assertEqual(imports_of(lifetime), {"a"}, "a lifetime opens no literal")
        labels = "fn f<'a>(x: &'a str) { 'l: loop { break 'l; } } // crate::b \"\nuse crate::c;"
        self.assertEqual(imports_of(labels), {"c"})


if __name__ == "__main__":
    unittest.main()
