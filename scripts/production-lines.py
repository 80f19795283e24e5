#!/usr/bin/env python3
"""Production lines under src/ (the figure issue 25 sets targets on): every line of every
.rs file, less test code: files and folders named tests, *_tests.rs, tests_*.rs, src/sim/,
and #[cfg(test)] items. `TOP=20 scripts/production-lines.py` also lists the 20 largest files."""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else 'src'
def is_test_file(p):
    parts = p.split(os.sep)
    name = parts[-1]
    return ('tests' in parts[:-1] or 'sim' in parts[:-1] or name == 'tests.rs'
            or name.endswith('_tests.rs') or name.startswith('tests_'))
def strip_cfg_test(lines):
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == '#[cfg(test)]':
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith('#['):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith(';'):
                i = j + 1
                continue
            depth, started = 0, False
            while j < len(lines):
                depth += lines[j].count('{') - lines[j].count('}')
                started = started or '{' in lines[j]
                j += 1
                if started and depth <= 0:
                    break
            i = j
            continue
        out.append(lines[i]); i += 1
    return out
total, per = 0, []
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        if not f.endswith('.rs') or is_test_file(p):
            continue
        n = len(strip_cfg_test(open(p).read().splitlines()))
        total += n; per.append((n, p))
for n, p in sorted(per, reverse=True)[:int(os.environ.get('TOP', '0'))]:
    print(f'{n:6} {p}')
print(f'{total} production lines in {len(per)} files')
