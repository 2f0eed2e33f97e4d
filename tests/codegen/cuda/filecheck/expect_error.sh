#!/bin/sh
# Negative FileCheck test: CMD must fail, and its stderr must match the
# CHECK lines with PREFIX in CHECKFILE.
# usage: expect_error.sh FILECHECK CHECKFILE PREFIX CMD...
fc=$1; file=$2; prefix=$3; shift 3
out=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "expected a failure from: $*" >&2
  exit 1
fi
printf '%s\n' "$out" | "$fc" --check-prefix="$prefix" "$file"
