#!/usr/bin/env python3
"""The layering rules of docs/architecture.md, checked on the code itself.

1. Crates: every workspace crate's normal dependencies (from `cargo metadata`)
   must be allowed by the table ALLOWED below; a provider crate may be named
   only by the device enum (`hca`), the facade (`ibal`) and the librdmacm CEPs.
   Dev-dependencies (tests) are free.
2. Files: inside each crate, no two source files may import each other,
   directly or through a longer circle. An import is a path through `crate::`
   or `super::`, or one that starts at a submodule of the file itself
   (`use io::Io;` in a mod.rs that declares `mod io;`); re-exports in lib.rs /
   mod.rs are followed to the file that defines the item, and are no edge of
   their own; `#[cfg(test)] mod tests { .. }` blocks are left out.

Prints every fault and exits 1 if there is one.  `--graph` prints the edges.
"""
import json, os, re, subprocess, sys

# crate -> the workspace crates it may depend on (normal dependencies).
LIBRARY = {
    "al": set(),
    "provider": {"al"},
    "soft-provider": {"al", "provider"},
    "roce": set(),
    "roce-transport": {"al", "provider", "roce"},
    "roce-provider": {"al", "provider", "roce", "roce-transport"},
    "rdma-provider": {"al", "provider"},
    "hca": {"al", "provider", "soft-provider", "roce-provider", "rdma-provider"},
    "qp": {"al", "provider", "hca"},
    "cep": {"al", "provider", "hca", "qp"},
    "cep-rdmacm": {"al", "provider", "hca", "qp", "cep", "rdma-provider"},
    # The facade also re-exports the RoCEv2 wire codec (`ibal::roce::wire`)
    # for the tools that build or re-sign packets (the relay, perf's flood).
    "ibal": {"al", "provider", "hca", "qp", "cep", "cep-rdmacm",
             "soft-provider", "roce", "roce-provider", "rdma-provider"},
}
# Tools and harnesses sit beside the library and use it through the facade
# (plus the layer crates whose internals they exercise); none names a
# provider crate but the loom models, which check one's thread protocols.
LAYERS = {"al", "provider", "hca", "qp", "cep", "ibal"}
TOOLS = {
    "ibal-testkit": LAYERS,
    "ibal-bench": LAYERS | {"ibal-testkit"},
    "ibal-cli": LAYERS | {"ibal-bench", "ibal-testkit"},
    "ibal-conformance": LAYERS,
    # The provider models drive the RoCEv2 provider's internals (its
    # `model` module, built only with --cfg ibal_loom) and build packets.
    "loom-tests": LAYERS | {"roce", "roce-transport", "roce-provider"},
}
ALLOWED = {**LIBRARY, **TOOLS}


def metadata():
    out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def crate_faults(meta):
    names = {p["name"] for p in meta["packages"]}
    faults = []
    for p in meta["packages"]:
        if p["name"] not in ALLOWED:
            faults.append(f"crate {p['name']}: not in the layering table (.ci/layering.py)")
            continue
        for d in p["dependencies"]:
            if d["name"] in names and d.get("kind") in (None, "normal", "build"):
                if d["name"] not in ALLOWED[p["name"]]:
                    faults.append(f"crate {p['name']} depends on {d['name']}: not allowed")
    return faults


ITEM = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:struct|enum|fn|trait|type|const|static|mod|union)\s+(\w+)", re.M)
MACRO = re.compile(r"macro_rules!\s*(\w+)")


def strip(src):
    """Source without comments and without test-only inline modules."""
    src = re.sub(r"(?m)^\s*//.*$", "", src)
    while True:
        m = re.search(r"(?m)^\s*#\[cfg\([^\n]*\btest\b[^\n]*\)\]\s*\n(?:\s*#\[[^\n]*\n)*\s*(?:pub(?:\([^)]*\))?\s+)?mod \w+ \{", src)
        if not m:
            return src
        depth, i = 0, m.end() - 1
        while i < len(src):
            depth += src[i] == "{"
            depth -= src[i] == "}"
            i += 1
            if depth == 0:
                break
        src = src[: m.start()] + src[i:]


def modules(src_dir):
    """module path (tuple) -> file"""
    mods = {}
    for root, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(root, f)
            rel = os.path.relpath(full, src_dir)[:-3].split(os.sep)
            if rel == ["lib"] or rel == ["main"]:
                path = ()
            elif rel[-1] == "mod":
                path = tuple(rel[:-1])
            else:
                path = tuple(rel)
            if path == () and rel == ["main"] and () in mods:
                continue
            mods[path] = full
    return mods


def reexports(src):
    """name -> module path segments, from `pub use a::b::{X, Y}` / `pub use a::X` / globs."""
    named, globs = {}, []
    for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([\w:]+?)::(\{[^}]*\}|\*|\w+(?:\s+as\s+\w+)?)\s*;", src):
        base, tail = m.group(1).split("::"), m.group(2)
        if tail == "*":
            globs.append(base)
        elif tail.startswith("{"):
            for item in tail[1:-1].split(","):
                item = item.strip()
                if not item:
                    continue
                parts = item.split(" as ")
                name = parts[-1].strip().split("::")[-1]
                named[name] = base + parts[0].strip().split("::")[:-1]
        else:
            parts = tail.split(" as ")
            named[parts[-1].strip()] = base
    return named, globs


def file_graph(src_dir):
    mods = modules(src_dir)
    text = {p: strip(open(f).read()) for p, f in mods.items()}
    defined = {p: set(ITEM.findall(t)) | set(MACRO.findall(t)) for p, t in text.items()}
    # `#[macro_export]` macros are named at the crate root but live where
    # they are written
    exported_macros = {}
    for p, t in text.items():
        for name in re.findall(r"#\[macro_export\][^\n]*\n(?:\s*#\[[^\n]*\n)*\s*macro_rules!\s*(\w+)", t):
            exported_macros[name] = p
    exports = {p: reexports(t) for p, t in text.items()}

    def within(module, path):
        """`path` as written in a `pub use` of `module`, as a path from the
        crate root; None for another crate's item."""
        if path[0] == "crate":
            return path[1:]
        if path[0] == "self":
            return list(module) + path[1:]
        if path[0] == "super":
            up = list(module)
            while path and path[0] == "super":
                up, path = up[:-1], path[1:]
            return up + path
        if tuple(list(module) + path[:1]) in mods:
            return list(module) + path
        return None

    def resolve(segs, depth=0):
        """longest module prefix of segs, following re-exports of the last item."""
        segs = [s for s in segs if s]
        best = ()
        for i in range(len(segs), -1, -1):
            if tuple(segs[:i]) in mods:
                best = tuple(segs[:i])
                rest = segs[i:]
                break
        if rest and best == () and rest[0] in exported_macros:
            return exported_macros[rest[0]]
        if rest and depth < 5:
            name = rest[0]
            named, globs = exports[best]
            if name in named and name not in defined[best]:
                target = within(best, named[name])
                return resolve(target + rest, depth + 1) if target is not None else best
            if name not in defined[best]:
                for g in globs:
                    inside = within(best, g)
                    if inside is None:
                        continue
                    target = resolve(inside + rest, depth + 1)
                    # only a glob over a file module of this crate moves the
                    # item elsewhere (an inline module stays in this file)
                    if target[: len(best)] == best and len(target) > len(best) and name in defined.get(target, set()):
                        return target
        return best

    edges = {p: set() for p in mods}
    for p, t in text.items():
        # the module this file's `super` names
        file = mods[p]
        is_dir_mod = file.endswith("mod.rs") or p == ()
        parent = p[:-1] if p else ()
        uses = []
        for m in re.finditer(r"(?m)^([ \t]*)(?:pub(?:\([^)]*\))?\s+)?use\s+(crate|super|self)::([^;]*);", t):
            indent, root, body = m.group(1), m.group(2), re.sub(r"\s+", " ", m.group(3))
            if root == "super" and indent:
                # an indented `use super::` is inside an inline module: its
                # parent is this file
                root = "self"
            for path in expand(body):
                uses.append((root, path))
        for m in re.finditer(r"(?<![\w:])(crate|super)::((?:\w+::)*\w+)", t):
            root, path = m.group(1), m.group(2).split("::")
            if root == "super" and path[0] in defined[p]:
                # inside an inline module, naming this file's own item
                root = "self"
            uses.append((root, path))
        # Paths that start at one of this module's own submodules, as Rust
        # 2018 writes them without `self::` (`use io::Io;` and `io::hook(..)`
        # in agent/mod.rs): a file that declares `mod io;` and uses it depends
        # on it. Re-exports (`pub use child::X;`) stay transparent, as above.
        children = sorted(q[-1] for q in mods if len(q) == len(p) + 1 and q[:-1] == p)
        if children:
            names = "|".join(children)
            code = re.sub(r"pub(?:\([^)]*\))?\s+use\s+[^;]*;", "", t)
            code = re.sub(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", "", code)
            for m in re.finditer(r"\buse\s+((?:%s)::[^;]*);" % names, code):
                for path in expand(re.sub(r"\s+", " ", m.group(1))):
                    uses.append(("self", path))
            for m in re.finditer(r"(?<![\w:])((?:%s)::(?:\w+::)*\w+)" % names, code):
                uses.append(("self", m.group(1).split("::")))
        for root, path in uses:
            if root == "crate":
                base = []
            elif root == "super":
                base = list(parent)
                while path and path[0] == "super":
                    base, path = base[:-1], path[1:]
            else:
                base = list(p)
            target = resolve(base + path)
            if target != p and not is_ancestor(p, target, is_dir_mod):
                edges[p].add(target)
    return mods, edges


def is_ancestor(p, target, _):
    # a child module naming its own submodule's items through its parent is
    # still an edge; only the file itself is excluded
    return False


def expand(body):
    """`a::{b, c::{d, e as f}}` -> [[a,b],[a,c,d],[a,c,e]]"""
    out = []

    def rec(prefix, text):
        text = text.strip()
        if not text:
            return
        if "{" not in text:
            leaf = re.split(r"\s+as\s+", text)[0]
            out.append(prefix + [x.strip() for x in leaf.split("::") if x.strip()])
            return
        i = text.index("{")
        head = [x.strip() for x in text[:i].split("::") if x.strip()]
        inner = text[i + 1 : text.rindex("}")]
        depth, cur = 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                rec(prefix + head, cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        rec(prefix + head, cur)

    rec([], body)
    return [[x for x in path if x not in ("self", "*")] for path in out]


def cycles(edges):
    """strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def self_test():
    """The checker must see a circle where there is one, follow re-exports,
    and leave test modules and inline modules alone."""
    import tempfile
    cases = {
        "circle": ({"lib.rs": "mod a;\nmod b;\n", "a.rs": "use crate::b::B;\npub struct A;\n",
                    "b.rs": "use super::a::A;\npub struct B;\n"}, 1),
        "through a re-export": ({"lib.rs": "mod a;\nmod b;\npub use b::B;\n",
                                 "a.rs": "use crate::B;\npub struct A;\n",
                                 "b.rs": "pub struct B(crate::a::A);\n"}, 1),
        "a parent using its child": ({"lib.rs": "mod m;\n", "m/mod.rs": "mod c;\nuse c::C;\npub struct M(C);\n",
                                      "m/c.rs": "use super::M;\npub struct C;\n"}, 1),
        "layered": ({"lib.rs": "mod a;\nmod b;\n", "a.rs": "pub struct A;\n",
                     "b.rs": "use crate::a::A;\npub struct B(A);\n"}, 0),
        "test-only and inline": ({"lib.rs": "mod a;\nmod b;\n",
                                  "a.rs": "pub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
                                  "b.rs": "use crate::a::A;\npub struct B(A);\nmod inner {\n    use super::B;\n}\n"}, 0),
    }
    for name, (files, want) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for f, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True)
                open(os.path.join(d, f), "w").write(text)
            _, edges = file_graph(d)
            got = len(cycles(edges))
            if got != want:
                print(f"layering self-test '{name}': {got} circle(s), want {want}")
                sys.exit(1)
    print(f"layering self-test: {len(cases)} cases pass")


def main():
    if "--self-test" in sys.argv:
        self_test()
        return
    meta = metadata()
    faults = crate_faults(meta)
    root = meta["workspace_root"]
    for p in meta["packages"]:
        for target in p["targets"]:
            if "lib" not in target["kind"] and "bin" not in target["kind"]:
                continue
            src_dir = os.path.dirname(target["src_path"])
            if target["kind"] == ["bin"] and any("lib" in t["kind"] and os.path.dirname(t["src_path"]) == src_dir for t in p["targets"]):
                continue
            mods, edges = file_graph(src_dir)
            if "--graph" in sys.argv:
                for a, bs in sorted(edges.items()):
                    for b in sorted(bs):
                        print(f"{p['name']}: {'::'.join(a) or 'lib'} -> {'::'.join(b) or 'lib'}")
            for comp in cycles(edges):
                files = sorted(os.path.relpath(mods[m], root) for m in comp)
                faults.append(f"crate {p['name']}: files import each other: {', '.join(files)}")
    for f in faults:
        print(f)
    print(f"layering: {len(faults)} fault(s)")
    sys.exit(1 if faults else 0)


if __name__ == "__main__":
    main()
