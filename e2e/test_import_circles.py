#!/usr/bin/env python3
"""No import circle in the workspace (run by `make unit`).

Within each crate of the workspace, its top-level modules (`src/<m>.rs` or `src/<m>/`) must import one another
without a circle: a module reached from `src/x` by `crate::y` paths may not reach back to `x`. A circle means
two jobs that cannot be read, tested or moved apart; the layering of each crate is in docs/architecture.md.
The datapaths crate also keeps its documented order (`agent/datapaths/src/lib.rs`): each layer imports only
the ones before it.

Imports are read from code, not comments: every `crate::<module>` path, and `crate::{a, b::c}` groups. A
binary under `src/bin/<name>/` is a crate of its own.
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


def code_of(text):
    """The text without comments (line and block), so that doc links are not imports."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.split("\n"))


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


if __name__ == "__main__":
    unittest.main()
