#!/usr/bin/env python3
"""Circles of files: which Rust files import each other, directly or around a ring.

A file's imports are the paths it names (`use` items and paths written inline) that start at
`crate::`, `super::`, `self::` or the crate's own name, resolved to the file of the longest
module they name. A module's declaration (`mod x;`) is not an import, nor is a module's use of its own
parts (a parent file calling or re-exporting its children: how a module is put together, as
mini-redis's lib.rs re-exports its frame), nor a `tests` module's use of what it tests. Each crate root (lib.rs, main.rs, a binary's file) starts a tree
of its own.

Prints each circle (a strongly connected set of files) and exits 1 when there is one, unless
`--count` is given (then it prints the number of circles and the files in them).
"""

import os
import re
import sys

CRATES = {
    "server/src": "ipool_server",
    "sim/src": "ipool_sim",
    "bench/src": "ipool_bench",
    "testkit/src": "ipool_testkit",
    "cni-client/src": "ipool_cni",
    "proto/src": "ipool_proto",
}


def roots(src):
    """(root file, crate name or None for a binary) of each tree under `src`."""
    out = []
    for name in ("lib.rs", "main.rs"):
        p = os.path.join(src, name)
        if os.path.exists(p):
            out.append(p)
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for e in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, e)
            if e.endswith(".rs"):
                out.append(p)
            elif os.path.exists(os.path.join(p, "main.rs")):
                out.append(os.path.join(p, "main.rs"))
    return out


def strip(text):
    """The text without comments and string literals (their words are not paths)."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def walk(root):
    """Module path (tuple) -> file, for the tree under `root`."""
    mods = {(): root}
    stack = [((), root)]
    while stack:
        path, f = stack.pop()
        base = os.path.dirname(f)
        stem = os.path.basename(f)[:-3]
        # A crate root's and a mod.rs's parts lie beside it; any other file's, in its folder.
        if stem != "mod" and path != ():
            base = os.path.join(base, stem)
        text = strip(open(f).read())
        for m in re.finditer(r'\b(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', text):
            name = m.group(1)
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    mods[path + (name,)] = cand
                    stack.append((path + (name,), cand))
                    break
    return mods


def inline_mods(text):
    """The text with each inline module's `super::` turned into `self::` (one level for each
    module around it): in `mod op { use super::x; }` super is the file's own module."""
    out, i = [], 0
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        body = inline_mods(text[m.end() : j])
        body = re.sub(r"\bsuper::", "self::", body)
        out.append(text[i : m.end()] + body)
        i = j
    out.append(text[i:])
    return "".join(out)


def paths_in(text):
    """Every path the text names: from `use` trees (expanded) and inline paths."""
    out = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        out.extend(expand(m.group(1).replace(" ", "").replace("\n", "")))
    for m in re.finditer(r"(?<![\w:])((?:\w+)(?:::\w+)+)", text):
        out.append(m.group(1))
    return out


def expand(tree):
    """`a::{b,c::{d,e}}` -> a::b, a::c::d, a::c::e."""
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0]]
    prefix = tree[:i]
    depth, parts, cur = 0, [], ""
    for ch in tree[i + 1 : tree.rfind("}")]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out.extend(expand(prefix + p))
    return out


def resolve(path, here, crate, mods):
    """The module file `path` (named in module `here`) points at, or None."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate" or segs[0] == crate:
        cur, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        cur = here
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                cur = cur[:-1]
            rest = rest[1:]
    elif here + (segs[0],) in mods:
        # A module declared in this file, named bare.
        cur, rest = here, segs
    else:
        return None
    best = cur
    for s in rest:
        if cur + (s,) in mods:
            cur = cur + (s,)
            best = cur
        else:
            break
    return best


def edges():
    graph = {}
    for src, crate in CRATES.items():
        if not os.path.isdir(src):
            continue
        for root in roots(src):
            is_lib = os.path.basename(root) == "lib.rs"
            mods = walk(root)
            files = {f: p for p, f in mods.items()}
            for f, here in files.items():
                # A tests module's imports are of what it tests.
                if here and here[-1] == "tests":
                    continue
                text = strip(open(f).read())
                # A file's own `#[cfg(test)] mod tests { ... }` is left out too.
                text = re.split(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)[0]
                text = inline_mods(text)
                for p in paths_in(text):
                    target = resolve(p, here, crate if is_lib else "crate", mods)
                    # A module's use of its own parts (its children's items, re-exported or
                    # called) is how a module is put together, not a circle: left out.
                    if target is None or target[: len(here)] == here:
                        continue
                    tf = mods[target]
                    # A module naming one of its own ancestors by path only to reach a sibling
                    # goes to the sibling: resolve() already takes the longest module.
                    graph.setdefault(f, set()).add(tf)
    return graph


def circles(graph):
    """Strongly connected sets of more than one file (Tarjan's algorithm)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(100000)

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
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return sorted(out)


# The circles known and not undone yet, each with why: a circle within one of these passes
# (it may shrink); any other fails. None is left (the simulation's `World`, the last one, was
# undone in session 38: its steps, its run, its daemons' starts each in a file of their own).
KNOWN: list = []


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    found = circles(edges())
    if "--count" in sys.argv:
        print(f"{len(found)} circles, {sum(len(c) for c in found)} files in them")
        return 0
    bad = 0
    for c in found:
        known = any(set(c) <= files for _, files in KNOWN)
        print(("known circle: " if known else "circle: ") + " <-> ".join(c))
        bad += 0 if known else 1
    if bad:
        print(f"{bad} circle(s) of files: give the shared part a home of its own")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
