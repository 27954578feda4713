#!/usr/bin/env python3
"""hack/archcheck.py -- the architecture rules the compiler does not check.

Cargo already refuses an upward import between crates (crates/*: see the
README's "How it fits together"). Inside each crate this script builds

- the file graph: file A -> file B when A names an item of B's module through
  `crate::...`, `super::...`, `self::...` or a child module's name; and
- the folder graph: the same edges between the folders the files are in
  (a module's root file `x.rs` next to `x/` counts as part of `x/`; a folder
  and its subfolders are one unit, so only folders apart from each other are
  compared),

and fails, listing every file cycle (files that reach each other), every
pair of folders that import each other, and every `#[path]` outside the
files still allowed one (`ALLOWED_PATH_ATTRS`): a module is a folder. Not edges: a module's root file
declaring its children (`mod x;`) and re-exporting them (`pub use x::...`),
which is wiring; a submodule naming its ancestors' own items (`super::Style`),
since a module and its submodules are one unit whose root file is its facade
(the parent's imports of its children do count); and anything in a crate's
entry file (lib.rs, main.rs), which only wires the folders together.

Between crates it reads the workspace's manifests (`cargo metadata
--no-deps`) and fails on

- a memprof crate depending on one that is not in a lower layer of
  `LAYERS` (the README's "How it fits together" says why each layer is
  where it is), or on a crate the table does not place; and
- a pure crate (`PURE`) with a normal or build dependency on anything that
  talks to the network: kube's client or runtime (or kube with any feature
  beyond its types), hyper, rustls, warp, or tokio's net; and
- memprof-analysis (`TYPES_ONLY`) enabling any feature of memprof-api.

Stdlib only; run from the repository root (`make lint` runs it).
"""

import json
import os
import re
import subprocess
import sys

# Cycles being dissolved elsewhere; each entry names why it is tolerated.
ALLOWED_FILE_CYCLES = set()

# Files that still mount a module with `#[path]`, to be made folders like the
# rest (x.rs beside x/, where `mod child;` finds x/child.rs); no other may.
ALLOWED_PATH_ATTRS = set()
# Outside the crates' trees: crate roots of their own that mount shared modules.
PATH_ATTR_DIRS = ("examples", "tests", "bench")
PATH_ATTR = re.compile(r"#\[path\s*=")

MOD_DECL = re.compile(r'^\s*(?:#\[path\s*=\s*"([^"]+)"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', re.M)
PATH_ATTR_MOD = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;')
INLINE_MOD = re.compile(r'\bmod\s+(\w+)\s*\{')
PATH_REF = re.compile(r'(?<![\w:])(crate|super|self|[a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)')
PUB_USE = re.compile(r'^\s*pub(?:\([^)]*\))?\s+use\s+[^;]*;', re.M)


def strip_comments_and_strings(text):
    """Blanks out comments and string literals, keeping offsets and newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file, folder):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.folder = folder  # directory holding this module's children
        self.children = {}


def child_file(folder, name, attr):
    if attr:
        return os.path.normpath(os.path.join(folder, attr))
    for cand in (os.path.join(folder, name + ".rs"), os.path.join(folder, name, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def inline_spans(code):
    """(start, end, name) of every inline `mod name { ... }` in a file."""
    spans = []
    for m in INLINE_MOD.finditer(code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        spans.append((m.start(), i, m.group(1)))
    return spans


def load_tree(entry, modules, files):
    """Walks `mod` declarations from a crate entry file."""
    root = Module((), entry, os.path.dirname(entry))
    stack = [root]
    while stack:
        mod = stack.pop()
        modules[mod.path] = mod
        with open(mod.file, encoding="utf-8") as f:
            text = f.read()
        code = strip_comments_and_strings(text)
        files[mod.file] = (mod, code)
        attrs = {m.group(2): m.group(1) for m in PATH_ATTR_MOD.finditer(text)}
        spans = inline_spans(code)
        for m in MOD_DECL.finditer(code):
            if any(s < m.start() < e for s, e, _ in spans):
                inner = [n for s, e, n in spans if s < m.start() < e]
                folder = os.path.join(mod.folder, *inner)
            else:
                folder = mod.folder
            name = m.group(2)
            # `#[path]` is relative to the declaring file's directory.
            f = child_file(os.path.dirname(mod.file) if attrs.get(name) else folder, name, attrs.get(name))
            if f is None:
                continue
            child_folder = os.path.dirname(f) if f.endswith("mod.rs") else os.path.join(os.path.dirname(f), name)
            if attrs.get(name):
                child_folder = os.path.dirname(f)
            child = Module(mod.path + (name,), f, child_folder)
            mod.children[name] = child
            stack.append(child)
    return root


def resolve(modules, names):
    """The deepest module named by a prefix of `names`."""
    best = None
    for k in range(1, len(names) + 1):
        m = modules.get(tuple(names[:k]))
        if m is None:
            break
        best = m
    return best


def module_at(mod, spans, pos):
    """The module path at an offset, counting inline modules."""
    path = list(mod.path)
    for s, e, name in spans:
        if s < pos < e:
            path.append(name)
    return path


def refs(mod, code, modules):
    """Files this module's file names items of."""
    spans = inline_spans(code)
    wiring = [(m.start(), m.end()) for m in PUB_USE.finditer(code)]
    out = set()
    for m in PATH_REF.finditer(code):
        head, rest = m.group(1), m.group(2)
        tail = [p for p in rest.split("::") if p and p != "{"]
        here = module_at(mod, spans, m.start())
        if head == "crate":
            names = tail
        elif head in ("super", "self"):
            base = here if head == "self" else here[:-1]
            while tail and tail[0] == "super":
                base, tail = base[:-1], tail[1:]
            names = base + tail
        elif tuple(here) + (head,) in modules:
            names = here + [head] + tail
        else:
            continue
        target = resolve(modules, names)
        if target is None or target.file == mod.file:
            continue
        is_child = target.path[: len(mod.path)] == mod.path and len(target.path) > len(mod.path)
        if is_child and any(s <= m.start() < e for s, e in wiring):
            continue  # a re-export of a descendant: wiring
        if mod.path[: len(target.path)] == target.path:
            continue  # an ancestor's own items: a submodule is part of its parent
        out.add(target.file)
    return out


def folder_of(file, tree_files):
    base = file[:-3] if file.endswith(".rs") else file
    if file.endswith("mod.rs") or os.path.isdir(base):
        return os.path.dirname(file) if file.endswith("mod.rs") else base
    return os.path.dirname(file)


def enclosing(folder, src):
    """`folder` and every folder above it, up to the crate's src/."""
    out = [folder]
    while folder != src and folder.startswith(src + "/"):
        folder = os.path.dirname(folder)
        out.append(folder)
    return out


def sccs(graph):
    """Tarjan's strongly connected components of size > 1."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def crate_entries():
    entries = []
    crates = sorted(os.listdir("crates")) if os.path.isdir("crates") else []
    for d in ["."] + [os.path.join("crates", c) for c in crates]:
        for e in ("src/lib.rs", "src/main.rs"):
            p = os.path.normpath(os.path.join(d, e))
            if os.path.exists(p):
                entries.append(p)
    return entries


def path_attr_problems(codes):
    """`#[path]` outside ALLOWED_PATH_ATTRS, from {file: code without comments}."""
    return [f"#[path] in {f}: make the module a folder (x.rs beside x/, where "
            "`mod child;` finds x/child.rs; a shared test module: `mod x_support;`)"
            for f, code in sorted(codes.items())
            if PATH_ATTR.search(code) and f not in ALLOWED_PATH_ATTRS]


def loose_rust_files():
    """{file: code} of the .rs files under PATH_ATTR_DIRS."""
    codes = {}
    for top in PATH_ATTR_DIRS:
        for d, _, names in os.walk(top):
            for n in names:
                if n.endswith(".rs"):
                    p = os.path.normpath(os.path.join(d, n))
                    with open(p, encoding="utf-8") as f:
                        codes[p] = strip_comments_and_strings(f.read())
    return codes


def check():
    problems, n_files, n_edges = path_attr_problems(loose_rust_files()), 0, 0
    for entry in crate_entries():
        modules, files = {}, {}
        load_tree(entry, modules, files)
        graph = {}
        for f, (mod, code) in files.items():
            if f == entry:
                continue  # the entry file only wires folders together
            graph[f] = refs(mod, code, modules)
        problems += path_attr_problems({f: code for f, (_, code) in files.items()})
        n_files += len(files)
        n_edges += sum(len(v) for v in graph.values())
        for comp in sccs(graph):
            if any(comp <= allowed for allowed in ALLOWED_FILE_CYCLES):
                continue
            problems.append("file cycle: " + " <-> ".join(sorted(comp)))
        src = os.path.dirname(entry)
        folders = {}
        for f, targets in graph.items():
            for t in targets:
                # An import from x/y/ is also one from x/, into z/ also into its parents.
                for a in enclosing(folder_of(f, files), src):
                    for b in enclosing(folder_of(t, files), src):
                        folders.setdefault(a, set()).add(b)
        for a in sorted(folders):
            for b in sorted(folders[a]):
                # A folder and its subfolders are one unit (a module and
                # its submodules): only folders apart from each other count.
                nested = b.startswith(a + "/") or a.startswith(b + "/")
                if a < b and not nested and a != b and a in folders.get(b, ()):
                    problems.append(f"folders import each other: {a}/ <-> {b}/")
    return problems, n_files, n_edges


# The workspace's crates by layer, lowest first: a crate may depend only on
# crates of lower layers, so the roles never depend on each other and nothing
# pure depends on a role. Written out in the README's "How it fits together".
LAYERS = [
    ["memprof-api"],
    ["memprof-analysis"],
    ["memprof-policy"],
    # The runtime kit the roles share (retry schedules): below the roles so
    # none depends on another for it; it depends on no memprof crate.
    ["memprof-runtime"],
    ["memprof-controller", "memprof-sidecar", "memprof-webhook", "memprof-cli"],
    ["memprof"],
]

# Crates of plain values and functions: a user of their types (the CLI's
# local lab, a test) must not compile an HTTP client or a TLS stack for them.
PURE = {"memprof-api", "memprof-analysis", "memprof-policy"}

# What a pure crate may not name as a normal or build dependency.
NETWORK_CRATES = {"kube-client", "kube-runtime", "hyper", "hyper-util", "rustls",
                  "tokio-rustls", "warp", "reqwest"}
# kube's features that are its types only (kube-core); any other pulls a client.
KUBE_TYPE_FEATURES = {"derive", "jsonpatch", "admission"}
TOKIO_NET_FEATURES = {"net", "full"}
# Pure crates that use memprof-api's types only: none of its features (the
# CRD kinds through kube's derive, the marks, YAML), so analysis builds on
# serde, schemars and k8s-openapi alone.
TYPES_ONLY = {"memprof-analysis"}


def layer_of(name):
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    return None


def is_ours(name):
    return name == "memprof" or name.startswith("memprof-")


def network_reason(dep):
    """Why a dependency talks to the network, or None."""
    name, features = dep["name"], set(dep.get("features") or [])
    if name in NETWORK_CRATES:
        return name
    if name == "kube":
        extra = features - KUBE_TYPE_FEATURES
        if dep.get("uses_default_features", True):
            extra.add("default")
        return f"kube features {sorted(extra)}" if extra else None
    if name == "tokio" and features & TOKIO_NET_FEATURES:
        return f"tokio features {sorted(features & TOKIO_NET_FEATURES)}"
    return None


def crate_problems(metadata):
    """The layer and purity problems of a `cargo metadata` document."""
    problems = []
    for pkg in sorted(metadata["packages"], key=lambda p: p["name"]):
        name = pkg["name"]
        if not is_ours(name):
            continue
        layer = layer_of(name)
        if layer is None:
            problems.append(f"crate {name} has no layer: add it to LAYERS in hack/archcheck.py"
                            " and to the README's \"How it fits together\"")
            continue
        for dep in pkg["dependencies"]:
            problems += dependency_problems(name, layer, dep)
    return problems


def dependency_problems(name, layer, dep):
    kind = dep.get("kind") or "normal"
    target = dep["name"]
    if is_ours(target) and target != name:
        other = layer_of(target)
        if other is None or other >= layer:
            return [f"layer: {name} may not depend on {target} ({kind}); "
                    f"see LAYERS in hack/archcheck.py"]
    if name in TYPES_ONLY and kind != "dev" and target == "memprof-api" and dep.get("features"):
        return [f"{name} uses memprof-api's types only: enable none of its features ({kind})"]
    if name in PURE and kind != "dev":
        why = network_reason(dep)
        if why:
            return [f"pure crate {name} depends on {why} ({kind}): "
                    "move the code that needs it into a role crate"]
    return []


def cargo_metadata():
    out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    problems, n_files, n_edges = check()
    crates = cargo_metadata()
    problems += crate_problems(crates)
    for p in problems:
        print(p)
    n_crates = sum(is_ours(p["name"]) for p in crates["packages"])
    print(f"archcheck: {n_crates} crates, {n_files} files, {n_edges} file edges,"
          f" {len(problems)} problem(s) ({len(ALLOWED_FILE_CYCLES)} allowed cycle(s))")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
