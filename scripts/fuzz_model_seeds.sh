#!/usr/bin/env bash
# scripts/fuzz_model_seeds.sh — (re)make fuzz_model's seeds from the parity fixtures: each is the fixture's
# config.json, a NUL, and its model.safetensors header JSON (fuzz_model.c writes the data section itself).
# Run from anywhere; writes tests/fuzz/corpus/fuzz_model/.
set -eu
cd "$(dirname "$0")/../.."
out=tests/fuzz/corpus/fuzz_model
mkdir -p "$out"
for d in tests/parity/fixtures/*/; do
    st="$d/model.safetensors"
    [ -f "$st" ] && [ -f "$d/config.json" ] || continue
    n=$(od -An -t u8 -N 8 "$st" | tr -d ' ')
    name=$(basename "$d")
    { cat "$d/config.json"; printf '\0'; tail -c +9 "$st" | head -c "$n"; } > "$out/$name"
done
ls "$out" | wc -l
