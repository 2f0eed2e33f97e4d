#!/bin/sh
# The link launcher of librattn.so: records its link command in $1 (one
# argument a line, existing paths made absolute) for `rattn emit --target
# library`, which links the same runtime the same way, then runs it.
out="$1"
shift
tmp="$out.tmp.$$"
for a in "$@"; do
  if [ -e "$a" ]; then realpath "$a"; else printf '%s\n' "$a"; fi
done >"$tmp" && mv -f "$tmp" "$out"
exec "$@"
