#!/usr/bin/env python3
"""Checks every #include "..." of the tree against the dependency rules of
docs/design/architecture.md (the fenced block after "The rules"): each folder may include its own
headers, the standard library (<...>) and what its rule lists; a listed path ending in '/' allows
every header under it. A folder without a rule (tests/, bench/, fuzz/) may include anything.

Prints each include that breaks a rule (file:line, the include, the folder's rule) and exits 1;
prints "layering: N passed, 0 failed" and exits 0 when every include keeps to its folder's rule
(--quiet, as the build runs it: nothing then). The build runs it before the library compiles
(cmake/DfpLayering.cmake); ctest runs it as layering:includes.
"""
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "design", "architecture.md")
SOURCES = (".cpp", ".hpp", ".h", ".cu", ".cuh", ".inc")


def rules(doc=DOC):
    """folder -> allowed prefixes, from the first fenced block after the rules' paragraph."""
    text = open(doc, encoding="utf-8").read()
    at = text.find("The rules, as the test")
    if at < 0:
        sys.exit(f"{DOC}: no paragraph 'The rules, as the test ...' with the rules block after it")
    block = re.search(r"```\n(.*?)```", text[at:], re.S)
    out = {}
    for line in block.group(1).splitlines():
        parts = line.split()
        if parts:
            out[parts[0]] = parts[1:]
    return out


def normalise(inc):
    """An include as a tree path: "dfp/x.hpp" is include/dfp/x.hpp's public name."""
    return inc[len("include/"):] if inc.startswith("include/dfp/") else inc


def check(root, table):
    checked, failures = 0, []
    for folder, allowed in sorted(table.items()):
        base = os.path.join(root, folder)
        if not os.path.isdir(base):
            failures.append(f"{folder}: a rule for a folder the tree lacks (docs/design/architecture.md)")
            continue
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    inc = normalise(m.group(1))
                    checked += 1
                    if "/" not in inc:  # beside the file
                        continue
                    if inc.startswith(folder) or any(inc == a or (a.endswith("/") and inc.startswith(a))
                                                     for a in allowed):
                        continue
                    failures.append(f"{rel}:{n}: includes \"{m.group(1)}\", which {folder}'s rule does not allow "
                                    f"({' '.join(allowed) or 'its own folder only'}; docs/design/architecture.md)")
    return checked, failures


def self_test():
    """The check itself: a tree with one include against its folder's rule fails, naming it."""
    tmp = tempfile.mkdtemp(prefix="dfp-layering-")
    try:
        for rel, text in {"simd/k.hpp": '#include "dfp/status.hpp"\n#include "src/core/context.hpp"\n',
                          "src/core/c.cpp": '#include "simd/k.hpp"\n#include "c.hpp"\n'}.items():
            os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            open(os.path.join(tmp, rel), "w").write(text)
        _, failures = check(tmp, {"simd/": ["dfp/status.hpp"], "src/core/": ["simd/"]})
        return len(failures) == 1 and failures[0].startswith('simd/k.hpp:2: includes "src/core/context.hpp"')
    finally:
        shutil.rmtree(tmp)


def main():
    quiet = "--quiet" in sys.argv[1:]  # the build's check: a word only when an include breaks a rule
    if not self_test():
        print("layering: the check's self-test failed: a forbidden include went unseen")
        return 1
    checked, failures = check(ROOT, rules())
    for f in failures:
        print(f)
    if failures or not quiet:
        print(f"layering: {checked - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
