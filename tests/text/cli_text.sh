#!/usr/bin/env bash
# cli_text.sh — the text commands' CLI contract (issue 3): `tern template MODEL --messages-file F
# [--tools F] [--add-generation-prompt]` prints the rendered prompt byte for byte; `tern tokenize`
# and `tern template` accept the word `demo`; `tern generate "prompt"` ends with a stats line
# naming prompt tokens, cached tokens, TTFT, prefill tok/s and decode tok/s.
set -u
cd "$(dirname "$0")/../.."
T=build/tern
[ -x "$T" ] || { echo "SKIP: cli_text: build/tern not built"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TERN_CACHE="$tmp/cache"
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; }

printf '[{"role":"user","content":"Hi"}]' > "$tmp/m.json"
printf '[{"type":"function","function":{"name":"get_weather","parameters":{}}},{"type":"function","function":{"name":"search","parameters":{}}}]' > "$tmp/tools.json"

# demo template: {{ bos_token }}{% for m in messages %}<|turn>ROLE\nCONTENT<turn|>\n{% endfor %}[<|turn>model\n]
printf '<bos><|turn>user\nHi<turn|>\n<|turn>model\n' > "$tmp/want"
$T template demo --messages-file "$tmp/m.json" --add-generation-prompt >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && cmp -s "$tmp/out" "$tmp/want"; then ok template_gen_prompt; else bad "template_gen_prompt: $(head -c 300 "$tmp/out" "$tmp/err")"; fi
$T template demo --messages-file "$tmp/m.json" >"$tmp/out" 2>"$tmp/err"
printf '<bos><|turn>user\nHi<turn|>\n' > "$tmp/want"
if cmp -s "$tmp/out" "$tmp/want"; then ok template_no_gen_prompt; else bad "template_no_gen_prompt: $(head -c 300 "$tmp/out" "$tmp/err")"; fi
# --tools reaches the template as `tools`
printf '{%% for t in tools %%}{{ t.function.name }};{%% endfor %%}{{ messages[0].content }}{%% if add_generation_prompt %%}>{%% endif %%}' > "$tmp/t.jinja"
$T template --template-file "$tmp/t.jinja" --messages-file "$tmp/m.json" --tools "$tmp/tools.json" --add-generation-prompt >"$tmp/out" 2>"$tmp/err"
if [ "$(cat "$tmp/out")" = "get_weather;search;Hi>" ]; then ok template_tools_file; else bad "template_tools_file: $(head -c 300 "$tmp/out" "$tmp/err")"; fi
# the old spelling --messages still works
$T template demo --messages "$tmp/m.json" >"$tmp/out" 2>"$tmp/err" && cmp -s "$tmp/out" "$tmp/want" && ok template_messages_alias || bad template_messages_alias
$T template demo --messages-file "$tmp/nope.json" >"$tmp/out" 2>"$tmp/err"
rc=$?; if [ $rc -eq 2 ] && grep -q "nope.json" "$tmp/err"; then ok template_missing_file; else bad "template_missing_file (exit $rc): $(head -c 300 "$tmp/err")"; fi
echo '[1,' > "$tmp/badtools.json"
$T template demo --messages-file "$tmp/m.json" --tools "$tmp/badtools.json" >"$tmp/out" 2>"$tmp/err"
rc=$?; if [ $rc -eq 2 ] && grep -q "badtools.json" "$tmp/err"; then ok template_bad_tools; else bad "template_bad_tools (exit $rc): $(head -c 300 "$tmp/err")"; fi

# tokenize accepts `demo`; special-token text becomes the special id
out=$($T tokenize demo --text '<|turn>hi' 2>"$tmp/err")
if [ "$out" = "2 3 112 113" ]; then ok tokenize_demo; else bad "tokenize_demo: got '$out' $(head -c 200 "$tmp/err")"; fi

# generate: the stats line
$T generate demo "Hello there" --max-tokens 6 --temperature 0 >"$tmp/out" 2>"$tmp/err"
rc=$?
line=$(grep '^\[prompt' "$tmp/err")
if [ $rc -eq 0 ] && echo "$line" | grep -Eq '^\[prompt [0-9]+ tokens \([0-9]+ cached\), generated 6 tokens, TTFT [0-9.]+ s, prefill [0-9.]+ tok/s, decode [0-9.]+ tok/s, length\]$'; then
    ok generate_stats_line
else bad "generate_stats_line (exit $rc): $(head -c 300 "$tmp/err")"; fi
