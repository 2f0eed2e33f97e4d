#!/usr/bin/env python3
"""The README's demo output block is exactly what scripts/demo prints; the
tuning pass's lines (`rattn tune: ...`) and the report's path are compared
with every number masked, since times vary from run to run.

Usage: readme_demo.py SOURCE_DIR BUILD_DIR. Runs scripts/demo on the existing
build (no setup) and compares its stdout with the fenced block that follows
the README line saying what `scripts/demo` prints.
"""
import difflib
import os
import re
import subprocess
import sys


def readme_block(readme):
    lines = open(readme, encoding="utf-8").read().split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("`scripts/demo` prints"))
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return "\n".join(lines[fence + 1:end]) + "\n"


def mask(text):
    """Numbers of the tuning pass's lines as '#' (up to its held-out figures), the
    report's folder as OUT."""
    out = []
    for line in text.split("\n"):
        if line.startswith("rattn tune:"):
            # Whether the held-out part met the target varies with the run too.
            line = re.sub(r"\d+(\.\d+)?", "#", line.split("; held-out")[0])
        elif line.startswith("(the report: "):
            line = "(the report: OUT/report.md)"
        out.append(line)
    return "\n".join(out)


def main():
    source, build = sys.argv[1], sys.argv[2]
    env = dict(os.environ, RATTN_SKIP_SETUP="1", RATTN_BUILD_DIR=build)
    run = subprocess.run([os.path.join(source, "scripts", "demo")], env=env, capture_output=True, text=True,
                         timeout=600)
    if run.returncode != 0:
        sys.exit(f"scripts/demo exited {run.returncode}:\n{run.stderr}")
    want = mask(readme_block(os.path.join(source, "README.md")))
    got = mask(run.stdout)
    if got != want:
        diff = difflib.unified_diff(want.splitlines(True), got.splitlines(True), "README.md", "scripts/demo")
        sys.exit("README.md's demo output differs from what scripts/demo prints:\n" + "".join(diff))
    print(f"README demo block matches scripts/demo ({len(want.splitlines())} lines)")


if __name__ == "__main__":
    main()
