#!/usr/bin/env python3
"""Checks docs/decisions (CI runs it): every record has its title, date, status, context,
decision and consequences; numbers run 1..N; the index lists every record with the same
title, date and status; every relative link resolves.

    python3 scripts/check-decisions.py [docs/decisions]
"""
import os, re, sys
d = sys.argv[1] if len(sys.argv) > 1 else 'docs/decisions'
files = sorted(f for f in os.listdir(d) if re.match(r'^\d{4}-[a-z0-9]+(-[a-z0-9]+)*\.md$', f))
others = sorted(f for f in os.listdir(d) if f not in files and f != 'README.md')
problems = []
if others: problems.append(f'unexpected files: {others}')
nums = [int(f[:4]) for f in files]
if nums != list(range(1, len(files) + 1)): problems.append('numbers are not 1..N without gaps')
index = open(os.path.join(d, 'README.md')).read()
rows = re.findall(r'^\| \[(\d{4})\]\(([^)]+)\) \| (.+?) \| (\S+) \| (.+?) \|$', index, re.M)
if [r[1] for r in rows] != files: problems.append('index rows differ from the files (or their order)')
lengths = []
for f in files:
    t = open(os.path.join(d, f)).read()
    lines = t.splitlines()
    n = f[:4]
    if not lines[0].startswith(f'# {n}. '): problems.append(f'{f}: title line')
    date = re.search(r'^- Date: (\d{4}-\d\d-\d\d)', t, re.M)
    status = re.search(r'^- Status: (accepted|superseded by \[(\d{4})\]\((\d{4}-[^)]+\.md)\))$', t, re.M)
    if not date: problems.append(f'{f}: Date')
    if not status: problems.append(f'{f}: Status')
    heads = re.findall(r'^## (.+)$', t, re.M)
    if heads != ['Context', 'Decision', 'Consequences']: problems.append(f'{f}: sections {heads}')
    for sec in ('Context', 'Decision', 'Consequences'):
        m = re.search(rf'^## {sec}\n(.*?)(?=^## |\Z)', t, re.M | re.S)
        if not m or not m.group(1).strip(): problems.append(f'{f}: empty {sec}')
    row = next((r for r in rows if r[1] == f), None)
    if row:
        if row[2] != lines[0][len(f'# {n}. '):]: problems.append(f'{f}: index title differs')
        if date and row[3] != date.group(1): problems.append(f'{f}: index date differs')
        if status and row[4] != status.group(0)[len('- Status: '):]: problems.append(f'{f}: index status differs')
    for target in re.findall(r'\]\(([^)#]+)\)', t):
        if not target.startswith('http') and not os.path.exists(os.path.join(d, target)):
            problems.append(f'{f}: broken link {target}')
    if '{{' in t: problems.append(f'{f}: unresolved reference')
    lengths.append((len(lines), f))
for target in re.findall(r'\]\(([^)#]+)\)', index):
    if not target.startswith('http') and not os.path.exists(os.path.join(d, target)):
        problems.append(f'README.md: link to missing {target}')
print(f'{len(files)} records, {len(rows)} index rows')
print(f'lines per record: min {min(lengths)[0]} ({min(lengths)[1]}), max {max(lengths)[0]} ({max(lengths)[1]})')
print('superseded:', ', '.join(f'{r[0]} -> {r[4]}' for r in rows if r[4] != 'accepted') or 'none')
for p in problems: print('PROBLEM:', p)
print('OK' if not problems else f'{len(problems)} problem(s)')
sys.exit(1 if problems else 0)
