#!/bin/sh
# Writes the console's bundled libraries' Debian copyright files into one text: OUT FILE...
set -e
out=$1
shift
for f in "$@"; do
  printf '== %s\n' "$f"
  cat "$f"
  printf '\n'
done > "$out"
