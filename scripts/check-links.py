#!/usr/bin/env python3
"""Check relative links (and #anchors) in Markdown files. GitHub anchor rules:
lowercase, spaces to '-', punctuation dropped (keep letters, digits, '-', '_'),
duplicates get -1, -2, ... Usage: scripts/check-links.py README.md docs/*.md backend-*/README.md bench/*.md bench/*/*.md"""
import os, re, sys

def slug(text):
    t = re.sub(r'<[^>]+>', '', text)             # html tags
    t = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', t)  # links: their text
    t = t.strip().lower()
    out = []
    for ch in t:
        if ch.isalnum() or ch in '-_':
            out.append(ch)
        elif ch == ' ':
            out.append('-')
        # everything else (punctuation, backticks, symbols) dropped
    return ''.join(out)

_cache = {}
def anchors(path):
    if path in _cache:
        return _cache[path]
    seen, result = {}, set()
    in_code = False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.lstrip().startswith('```'):
                in_code = not in_code
                continue
            if in_code:
                continue
            m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
            if not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            result.add(s if n == 0 else f'{s}-{n}')
            seen[s] = n + 1
    _cache[path] = result
    return result

def links(path):
    in_code = False
    with open(path, encoding='utf-8') as f:
        for no, line in enumerate(f, 1):
            if line.lstrip().startswith('```'):
                in_code = not in_code
                continue
            if in_code:
                continue
            # drop inline code spans
            line = re.sub(r'`[^`]*`', '', line)
            for m in re.finditer(r'\]\(([^)\s]+)(?:\s+"[^"]*")?\)', line):
                yield no, m.group(1)

bad = checked = 0
for md in sys.argv[1:]:
    base = os.path.dirname(md)
    for no, target in links(md):
        if re.match(r'^[a-z][a-z0-9+.-]*:', target):   # http:, https:, mailto:
            continue
        checked += 1
        file, _, anchor = target.partition('#')
        dest = os.path.normpath(os.path.join(base, file)) if file else md
        if not os.path.exists(dest):
            print(f'{md}:{no}: {target}: no file {dest}'); bad += 1; continue
        if anchor:
            if not dest.endswith('.md'):
                print(f'{md}:{no}: {target}: anchor into a non-Markdown file'); bad += 1; continue
            if anchor not in anchors(dest):
                print(f'{md}:{no}: {target}: no heading #{anchor} in {dest}'); bad += 1
print(f'{checked} relative links checked in {len(sys.argv)-1} files, {bad} broken')
sys.exit(1 if bad else 0)
