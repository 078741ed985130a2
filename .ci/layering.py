#!/usr/bin/env python3
"""The layering rules of docs/architecture.md, checked on the code itself.

1. Crates: every workspace crate's normal dependencies (from `cargo metadata`)
   must be allowed by the table ALLOWED below; a provider crate may be named
   only by the device enum (`hca`), the facade (`ibal`) and the librdmacm CEPs.
   Dev-dependencies (tests) are free.
2. Files: inside each crate, no two source files may import each other,
   directly or through a longer circle. An import is a path through `crate::`
   or `super::` (re-exports in lib.rs / mod.rs are followed to the file that
   defines the item); `#[cfg(test)] mod tests { .. }` blocks are left out.

Prints every fault and exits 1 if there is one.  `--graph` prints the edges.
"""
import json, os, re, subprocess, sys

# crate -> the workspace crates it may depend on (normal dependencies).
LIBRARY = {
    "al": set(),
    "provider": {"al"},
    "soft-provider": {"al", "provider"},
    "roce": set(),
    "roce-transport": {"provider", "roce"},
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
# provider crate.
LAYERS = {"al", "provider", "hca", "qp", "cep", "ibal"}
TOOLS = {
    "ibal-testkit": LAYERS | {"roce", "roce-transport"},
    "ibal-bench": LAYERS | {"ibal-testkit"},
    "ibal-cli": LAYERS | {"ibal-bench", "ibal-testkit"},
    "ibal-conformance": LAYERS,
    "loom-tests": LAYERS,
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


ITEM = re.compile(r"^\s*pub(?:\([^)]*\))?\s+(?:unsafe\s+)?(?:struct|enum|fn|trait|type|const|static|mod|union)\s+(\w+)", re.M)
MACRO = re.compile(r"macro_rules!\s*(\w+)")


def strip(src):
    src = re.sub(r"(?m)^\s*//.*$", "", src)
    m = re.search(r"(?m)^#\[cfg\(test\)\]\s*\n\s*mod \w+ \{", src)
    if m:
        src = src[: m.start()]
    return src


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
    for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+(?:self::|crate::)?([\w:]+?)::(\{[^}]*\}|\*|\w+(?:\s+as\s+\w+)?)\s*;", src):
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
    exports = {p: reexports(t) for p, t in text.items()}

    def resolve(segs, depth=0):
        """longest module prefix of segs, following re-exports of the last item."""
        segs = [s for s in segs if s]
        best = ()
        for i in range(len(segs), -1, -1):
            if tuple(segs[:i]) in mods:
                best = tuple(segs[:i])
                rest = segs[i:]
                break
        if rest and depth < 5:
            name = rest[0]
            named, globs = exports[best]
            if name in named and name not in defined[best]:
                return resolve(list(best) + named[name] + rest, depth + 1)
            if name not in defined[best]:
                for g in globs:
                    target = resolve(list(best) + g + rest, depth + 1)
                    if name in defined.get(target, set()) or target != tuple(list(best) + g):
                        return target
        return best

    edges = {p: set() for p in mods}
    for p, t in text.items():
        # the module this file's `super` names
        file = mods[p]
        is_dir_mod = file.endswith("mod.rs") or p == ()
        parent = p[:-1] if p else ()
        uses = []
        for m in re.finditer(r"\buse\s+(crate|super|self)::([^;]*);", t):
            root, body = m.group(1), re.sub(r"\s+", "", m.group(2))
            for path in expand(body):
                uses.append((root, path))
        for m in re.finditer(r"(?<![\w:])(crate|super)::((?:\w+::)*\w+)", t):
            uses.append((m.group(1), m.group(2).split("::")))
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
    """`a::{b, c::{d, e}}` -> [[a,b],[a,c,d],[a,c,e]]"""
    out = []

    def rec(prefix, s):
        if not s:
            return
        if "{" not in s:
            parts = [x for x in s.split("::") if x]
            parts = [x.split("as")[0] if False else x for x in parts]
            out.append(prefix + [re.sub(r"as\w+$", "", parts[-1])] if False else prefix + parts)
            return
        i = s.index("{")
        head = [x for x in s[:i].split("::") if x]
        inner = s[i + 1 : s.rindex("}")]
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
    cleaned = []
    for path in out:
        path = [re.sub(r"as\w+$", "", x) if re.search(r"\w+as\w+$", x) else x for x in path]
        cleaned.append([x for x in path if x not in ("self", "*")])
    return cleaned


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


def main():
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
