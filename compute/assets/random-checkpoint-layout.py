#!/usr/bin/env python3
"""Writes a `layout.tsv` of `compute/src/models/random_checkpoint.rs` from a recipe's JSON-lines
layout (one tensor a line: `key`, `shape`, `kind`, `fan_in`), such as the parity vectors'
`sd15-parity/layout.jsonl` and `sdxl-parity/layout.jsonl`.

    python3 compute/assets/random-checkpoint-layout.py LAYOUT.jsonl "ABOUT" > compute/assets/NAME/layout.tsv

Keys that differ in one numeric path component only, with the same shape and kind, are merged
into one line with an inclusive range `{a..b}` there (repeated, so that a line may hold several
ranges); the table is checked to expand back to exactly the input. The `fan_in` column is not
kept: the recipe's is `shape[1] * ...` for weights and `shape[1]` (the width) for embeddings, and
the table is refused when a row says otherwise.
"""
import itertools
import json
import math
import re
import sys

KINDS = {"weight": "weight", "zeros": "zeros", "ones": "ones", "arange:int64": "arange_i64",
         "logit_scale": "logit_scale", "embedding:token_embedding": "embedding",
         "embedding:position_embedding": "embedding"}
FORMAT = """\
# One line per tensor, or per run of tensors: key, shape, kind, separated by tabs.
# - key: a `{a..b}` in it stands for each of a, a+1, .., b (inclusive; several give every combination).
# - shape: dimensions joined by x; `scalar` for a 0-dimensional tensor.
# - kind: weight (uniform, std 1/sqrt(fan_in), fan_in = shape[1] x the kernel size) | embedding (std
#   1/sqrt(shape[1])) | zeros | ones | arange_i64 (int64 0, 1, ..) | logit_scale (4.6055).
# Written by compute/assets/random-checkpoint-layout.py from the recipe's layout.jsonl.
"""


def rows_of(path):
    rows = []
    for r in map(json.loads, open(path)):
        shape, kind = r["shape"], r["kind"]
        width = {"weight": math.prod(shape[1:]), "embedding": shape[1] if len(shape) > 1 else None}
        want = width.get(KINDS[kind], 0)
        if r["fan_in"] not in (want, 0) or (KINDS[kind] == "weight" and r["fan_in"] != want):
            raise SystemExit(f"{r['key']}: fan_in {r['fan_in']} is not the recipe's {want}")
        comps = [int(c) if c.isdigit() else c for c in r["key"].split(".")]
        rows.append((comps, "x".join(map(str, shape)) or "scalar", KINDS[kind]))
    return rows


def text(c):
    return c if isinstance(c, str) else str(c) if isinstance(c, int) else "{%d..%d}" % c


def merge_at(rows, p):
    """Merges the rows whose component p is a number and that are equal elsewhere into ranges."""
    groups, out, merged = {}, [], False
    for r in rows:
        comps = r[0]
        if p < len(comps) and isinstance(comps[p], int):
            sig = (tuple(map(text, comps[:p])), tuple(map(text, comps[p + 1:])), r[1], r[2])
            groups.setdefault(sig, []).append(r)
        else:
            out.append(r)
    for group in groups.values():
        runs = []
        for v in sorted(r[0][p] for r in group):
            if runs and v == runs[-1][1] + 1:
                runs[-1][1] = v
            else:
                runs.append([v, v])
        for a, b in runs:
            comps = list(group[0][0])
            comps[p] = (a, b) if b > a else a
            merged |= b > a
            out.append((comps, group[0][1], group[0][2]))
    return out, merged


def compact(rows):
    merged = True
    while merged:
        merged = False
        for p in range(max(len(r[0]) for r in rows)):
            rows, m = merge_at(rows, p)
            merged |= m
    first = lambda c: str(c[0]) if isinstance(c, tuple) else str(c)
    return sorted(rows, key=lambda r: ".".join(map(first, r[0])))


def expand(key):
    parts = re.split(r"\{(\d+)\.\.(\d+)\}", key)
    ranges = [range(int(a), int(b) + 1) for a, b in zip(parts[1::3], parts[2::3])]
    for combo in itertools.product(*ranges):
        yield parts[0] + "".join(str(v) + lit for v, lit in zip(combo, parts[3::3]))


def main():
    path, about = sys.argv[1], sys.argv[2]
    rows = rows_of(path)
    lines = ["\t".join((".".join(map(text, comps)), shape, kind)) for comps, shape, kind in compact(rows)]
    back = sorted((k, s, kd) for line in lines for key, s, kd in [line.split("\t")] for k in expand(key))
    if back != sorted((".".join(map(str, c)), s, kd) for c, s, kd in rows):
        raise SystemExit("the compact table does not expand back to the layout")
    sys.stdout.write("".join("# " + line + "\n" for line in about.splitlines()) + FORMAT)
    sys.stdout.write("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()
