#!/usr/bin/env bash
# Checks that every relative link in README.md, CHANGELOG.md and docs/**/*.md resolves: the
# file (or folder) exists in the tree, and a #fragment names a heading of the Markdown file it
# points at (GitHub's anchor rule). Links inside code blocks and to http(s)/mailto are skipped.
# Names each broken link as FILE:LINE: target. Run by //tools:docs_links_test.
# Usage: tools/docs_links_check.sh [REPO_ROOT]   (default: the repository holding this script)
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
python3 - "$root" <<'PY'
import os, re, sys

root = sys.argv[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, inside = {}, False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                inside = not inside
            elif not inside and line.startswith("#"):
                base = slug(line.lstrip("#"))
                n = seen.get(base, 0)
                seen[base] = n + 1
                seen.setdefault(base if n == 0 else f"{base}-{n}", 1)
        cache[path] = set(seen)
    return cache[path]


docs = [os.path.join(root, f) for f in ("README.md", "CHANGELOG.md")]
for d, _, files in os.walk(os.path.join(root, "docs")):
    docs += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
bad, count = [], 0
for doc in docs:
    if not os.path.exists(doc):
        bad.append(f"{os.path.relpath(doc, root)}: missing")
        continue
    inside = False
    for n, line in enumerate(open(doc, encoding="utf-8"), 1):
        if line.startswith("```"):
            inside = not inside
            continue
        if inside:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue
            count += 1
            path, _, frag = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            where = f"{os.path.relpath(doc, root)}:{n}: {target}"
            if not os.path.exists(full):
                bad.append(f"{where} (no such file)")
            elif frag and full.endswith(".md") and frag not in anchors(full):
                bad.append(f"{where} (no heading #{frag})")
if bad:
    print(f"docs_links_check: {len(bad)} of {count} links are broken:", *bad, sep="\n  ")
    sys.exit(1)
print(f"docs_links_check: {count} links in {len(docs)} files resolve")
PY
