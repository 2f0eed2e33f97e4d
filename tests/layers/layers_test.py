#!/usr/bin/env python3
"""The layer graph of docs/architecture.md: a source file may include only
its own folder's headers and those of layers below it. Known debts (an
include that crosses the graph the wrong way today) are listed in
KNOWN_DEBTS; the test fails on any other wrong-way include, and on a listed
debt that no longer exists (so the list only shrinks)."""
import pathlib
import re
import sys

LAYERS = {"core": 0, "dsl": 1, "kernels": 2, "codegen": 3, "runtime": 4, "include": 4, "harness": 5,
          "autotune": 6, "models": 6, "bench": 6, "tools": 7, "integrations": 8}
# Public headers live in include/ and belong to the runtime's layer.
PUBLIC = {"rattn.h": "include", "rattn.hpp": "include"}
# (file, included path): wrong-way includes that exist today, each a debt
# named in docs/architecture.md ("Known debts").
KNOWN_DEBTS = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of_include(path):
    if path in PUBLIC:
        return PUBLIC[path]
    head = path.split("/", 1)[0]
    return head if head in LAYERS else None


def main(root):
    root = pathlib.Path(root)
    found = set()
    for layer in LAYERS:
        for f in sorted((root / layer).rglob("*")):
            if f.suffix not in (".h", ".hpp", ".cpp", ".cc", ".c") or not f.is_file():
                continue
            own = layer
            for inc in INCLUDE.findall(f.read_text(errors="replace")):
                target = folder_of_include(inc)
                if target is None or target == own:
                    continue
                lo, hi = LAYERS[own], LAYERS[target]
                # Upward, or sideways between two folders of one layer (autotune, models, bench).
                if hi > lo or (hi == lo and own != target and not (own == "runtime" and target == "include")):
                    found.add((str(f.relative_to(root)), inc))
    new = sorted(found - set(KNOWN_DEBTS))
    paid = sorted(set(KNOWN_DEBTS) - found)
    for f, inc in new:
        print(f"layer violation: {f} includes \"{inc}\" ({f.split('/')[0]} may not include {folder_of_include(inc)})")
    for f, inc in paid:
        print(f"debt paid: {f} no longer includes \"{inc}\"; remove it from KNOWN_DEBTS and docs/architecture.md")
    if new or paid:
        return 1
    print(f"ok: {len(found)} known debts, no new wrong-way include")
    return 0


def self_test():
    """A planted wrong-way include is found; the same tree without it passes."""
    import contextlib
    import io
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        base = pathlib.Path(d)
        (base / "core").mkdir()
        (base / "runtime").mkdir()
        (base / "runtime" / "r.h").write_text('#include "core/c.h"\n#include "rattn.h"\n')
        (base / "core" / "c.h").write_text("#pragma once\n")
        global KNOWN_DEBTS
        saved, KNOWN_DEBTS = KNOWN_DEBTS, set()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                clean = main(base)
                (base / "core" / "c.h").write_text('#include "runtime/r.h"\n')
                dirty = main(base)
        finally:
            KNOWN_DEBTS = saved
    assert clean == 0 and dirty == 1, (clean, dirty)


if __name__ == "__main__":
    self_test()
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
