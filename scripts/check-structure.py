#!/usr/bin/env python3
"""Checks two rules of the house that neither rustc nor clippy checks (CI runs it):

- no cycle between the modules of one parent (siblings), in any crate of the workspace,
  and the server's layers only look down (LAYERS below);
- no function longer than MAX_FUNCTION_LINES outside tests (`#[cfg(test)]` modules and
  the `tests/` folders are not read).

It reads the source as text: `use` items and `crate::`/`super::`/`self::` paths make the
edges. Exit status 1 and a line per finding when a rule is broken.

    python3 scripts/check-structure.py
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CRATES = ["host/src", "compute/src", "v2m/src", "sdk/src", "types/src", "allocator/src"]
GUEST_SOURCES = ["plugins", "host/benches", "compute/benches", "fuzz/fuzz_targets", "host/build.rs"]
MAX_FUNCTION_LINES = 150
# The server's top-level modules, highest first: a module may use those after it only.
LAYERS = ["fuzzing", "serve", "cli", "api", "jobs", "graph", "runtime", "store"]


def rust_files(path):
    if os.path.isfile(path):
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in ("target", "tests")]
        for name in sorted(files):
            if name.endswith(".rs"):
                yield os.path.join(root, name)


def code_of(text):
    """The text before the first `#[cfg(test)]`, without comments and string contents."""
    cut = text.find("#[cfg(test)]")
    text = text if cut < 0 else text[:cut]
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"([^"\\]|\\.)*"', '""', text)


def modules(src):
    """Module path (a tuple) -> file, for one crate's source folder."""
    found = {}
    for path in rust_files(src):
        parts = os.path.relpath(path, src)[:-3].split(os.sep)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        found[tuple(parts)] = path
    return found


def use_paths(prefix, body):
    """The paths one `use` tree names, its braces expanded."""
    paths, depth, item = [], 0, ""
    for c in body + ",":
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            item = item.strip()
            nested = re.match(r"^([\w:]*?)::\{(.*)\}$", item, re.S)
            if nested:
                paths += use_paths(prefix + nested.group(1).split("::"), nested.group(2))
            elif item.startswith("{"):
                paths += use_paths(prefix, item[1:-1])
            elif item:
                paths.append(prefix + item.split(" as ")[0].strip().split("::"))
            item = ""
        else:
            item += c
    return paths


def resolve(mods, here, parts):
    """The module a path inside module `here` points into, if it is one of the crate's."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] == "self":
        base, parts = list(here), parts[1:]
    elif parts[0] == "super":
        base = list(here)
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
    elif tuple(list(here) + [parts[0]]) in mods:
        base = list(here)
    else:
        return None
    full = base + parts
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in mods:
            return tuple(full[:k])
    return None


def edges_of(mods):
    edges = set()
    for here, path in mods.items():
        code = code_of(open(path, encoding="utf-8").read())
        paths = []
        for use in re.finditer(r"\buse\s+([^;]+);", code):
            paths += use_paths([], use.group(1).replace("\n", " "))
        paths += [m.group(1).split("::") for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", code)]
        for p in paths:
            there = resolve(mods, here, p)
            if there is not None and there != here:
                edges.add((here, there))
    return edges


def strongly_connected(graph):
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycle_findings(crate, mods, edges):
    findings = []
    for parent in sorted({m[:-1] for m in mods if m}):
        depth = len(parent)
        inside = lambda m: len(m) > depth and m[:depth] == parent
        graph = {m[depth]: set() for m in mods if inside(m)}
        for a, b in edges:
            if inside(a) and inside(b) and a[depth] != b[depth]:
                graph[a[depth]].add(b[depth])
        for group in strongly_connected(graph):
            links = ", ".join(f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group)
            findings.append(f"{crate}: cycle in {'::'.join(parent) or 'the crate root'}: {links}")
    return findings


def layer_findings(edges):
    rank = {name: i for i, name in enumerate(LAYERS)}
    findings = set()
    for a, b in edges:
        if a and b and a[0] in rank and b[0] in rank and rank[a[0]] > rank[b[0]]:
            findings.add(f"host/src: {a[0]} (lower) uses {b[0]} (higher): {'::'.join(a)} -> {'::'.join(b)}")
    return sorted(findings)


def long_functions(path):
    lines = code_of(open(path, encoding="utf-8").read()).split("\n")
    header = re.compile(r"\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")
    i, found = 0, []
    while i < len(lines):
        match = header.match(lines[i])
        if not match:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            for c in re.sub(r"'.'", "''", lines[j]):
                if c == "{":
                    depth, opened = depth + 1, True
                elif c == "}":
                    depth -= 1
            if (opened and depth <= 0) or (not opened and lines[j].rstrip().endswith(";")):
                break
            j += 1
        if j - i + 1 > MAX_FUNCTION_LINES:
            found.append(f"{os.path.relpath(path, ROOT)}:{i + 1}: fn {match.group(7)} is {j - i + 1} lines")
        i = j + 1 if opened else i + 1
    return found


def main():
    findings = []
    for crate in CRATES:
        mods = modules(os.path.join(ROOT, crate))
        edges = edges_of(mods)
        findings += cycle_findings(crate, mods, edges)
        if crate == "host/src":
            findings += layer_findings(edges)
    for source in CRATES + GUEST_SOURCES:
        for path in rust_files(os.path.join(ROOT, source)):
            findings += long_functions(path)
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
