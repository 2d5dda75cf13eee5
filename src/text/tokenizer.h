/*
 * tokenizer.h — Hugging Face `tokenizer.json` tokenizers (BPE family), bit-exact with HF
 * `tokenizers` for encode and decode.
 *
 * Pipeline (same order as HF, see tokenizer_encode.c):
 *   raw text → split out non-normalized added tokens (leftmost-longest; single_word, lstrip,
 *   rstrip) → normalizer (Replace, Prepend, NFC/NFD/NFKC/NFKD, Strip, Lowercase, Sequence) →
 *   split out normalized added tokens → pre-tokenizer (Split regex via PCRE2, ByteLevel,
 *   Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence) → BPE per word (heap merge,
 *   byte fallback, unk/fuse_unk, ignore_merges) → post-processor (TemplateProcessing,
 *   Roberta/Bert, ByteLevel, Sequence) when add_special.
 * Decode: id → token (added-token content first), optional skip of special tokens, then the
 * decoder chain (Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel, Sequence).
 * Anything else in the file → TERN_EUNSUPPORTED naming the component.
 *
 * Invalid UTF-8 in the input text is replaced by U+FFFD before encoding (one U+FFFD per
 * maximal invalid subsequence, as Rust's String::from_utf8_lossy does), so encode never fails
 * on bad bytes. Decode output is always valid UTF-8.
 *
 * Thread safety: a loaded tokenizer is immutable except for an internal word cache guarded
 * by a mutex, so encode/decode may run concurrently from several threads.
 */
#ifndef TERN_TEXT_TOKENIZER_H
#define TERN_TEXT_TOKENIZER_H

#include "tern.h"
#include <stddef.h>
#include <stdint.h>

typedef struct tern_tokenizer tern_tokenizer;

/* Load from a directory (reads tokenizer.json, plus tokenizer_config.json and
 * special_tokens_map.json when present) or from a path to a tokenizer.json file (the two
 * config files are then looked for beside it). *out is NULL on failure. */
tern_status tern_tokenizer_load(tern_tokenizer **out, const char *dir_or_file, tern_error *err);
void tern_tokenizer_free(tern_tokenizer *tok);

/* Encode text[0..len) (need not be NUL-terminated). add_special: run the post-processor
 * (BOS etc.), like HF encode(text, add_special_tokens). parse_special: 1 = special added
 * tokens written in the text become their ids (HF default); 0 = their text is tokenized as
 * ordinary text (HF `split_special_tokens` / encode_special_tokens=true): the prompt-injection
 * guard for user content. Non-special added tokens (e.g. Qwen `<think>`, Gemma `<unused0>`)
 * are matched in both modes, as HF does. *ids is malloc'd (free()); *n may be 0. */
tern_status tern_tokenizer_encode(const tern_tokenizer *tok, const char *text, size_t len,
                                  int add_special, int parse_special, int32_t **ids, size_t *n,
                                  tern_error *err);

/* ---- the prompt-injection guard (docs/TEXT.md) ----
 * Special-token text typed by a user must not become a special token; only the chat
 * template may write those. So untrusted strings (message content, tool results, tool-call
 * arguments) are ESCAPED before rendering, and the rendered prompt is encoded with
 * TERN_ENC_ESCAPED:
 *   escape: every U+FDD0 (a Unicode noncharacter) in the text is doubled, and one U+FDD0
 *           (a "break mark") is inserted before every occurrence of a special added token's
 *           content (all occurrences, overlapping ones too);
 *   encode: a run of 2k U+FDD0 is k literal U+FDD0, an odd run is k literal + one break
 *           mark; an added-token match whose span [start, end) holds a break mark is
 *           not a special token (it is tokenized as text, exactly like HF with
 *           split_special_tokens=True); non-special added tokens (Qwen `<think>`) still match,
 *           as in HF. Break marks vanish; the text is tokenized as if they were never there.
 * Text without U+FDD0 and without special-token text is unchanged by escape and encodes
 * identically in both modes. Limits: a special token that is normalized:true (none in the
 * Gemma/Qwen/Llama files) is only matched, in a segment holding a break mark, as text; a
 * special token spanning the boundary between template text and user text is not caught. */
#define TERN_TOK_ESC "\xEF\xB7\x90" /* U+FDD0, the escape character */

/* Escape s[0..n) as described above. *out is malloc'd and NUL-terminated (free());
 * *out_len optional. Never fails on bad input (bytes are copied as they are). */
tern_status tern_tokenizer_escape(const tern_tokenizer *tok, const char *s, size_t n, char **out, size_t *out_len,
                                  tern_error *err);

enum {
    TERN_ENC_ADD_SPECIAL = 1,   /* run the post-processor (BOS, ...) */
    TERN_ENC_PARSE_SPECIAL = 2, /* special-token text becomes special ids (HF default) */
    TERN_ENC_ESCAPED = 4,       /* the text was built from tern_tokenizer_escape'd parts */
};
/* tern_tokenizer_encode with TERN_ENC_* flags. A rendered chat prompt whose messages were
 * escaped (tern_chat_opts.escape_tok) is encoded with TERN_ENC_PARSE_SPECIAL | TERN_ENC_ESCAPED
 * (no ADD_SPECIAL: the template writes its own BOS, see chat.h). */
tern_status tern_tokenizer_encode_ex(const tern_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                     int32_t **ids, size_t *n, tern_error *err);

/* Decode ids to text like HF decode(ids, skip_special_tokens). Unknown ids are dropped (as
 * HF does). *str is malloc'd, NUL-terminated (free()); *len (optional) gets its length. */
tern_status tern_tokenizer_decode(const tern_tokenizer *tok, const int32_t *ids, size_t n,
                                  int skip_special, char **str, size_t *len, tern_error *err);

/* Number of id slots: 1 + the largest id of the model vocab, the added tokens or the post-processor. */
size_t tern_tokenizer_vocab_size(const tern_tokenizer *tok);
/* Token string → id (added tokens first, then the model vocab); -1 if absent. */
int32_t tern_tokenizer_token_to_id(const tern_tokenizer *tok, const char *s, size_t len);
/* Id → token string as stored (not decoded; e.g. "Ġhello", "▁the", "<0x0A>"); NULL if the
 * id has no token. *len (optional) gets the length; the string is NUL-terminated. */
const char *tern_tokenizer_id_to_token(const tern_tokenizer *tok, int32_t id, size_t *len);
/* 1 if the id's token string is a special added token (dropped by skip_special). */
int tern_tokenizer_is_special(const tern_tokenizer *tok, int32_t id);

/* BOS/EOS from tokenizer_config.json (or special_tokens_map.json); -1 if none. */
int32_t tern_tokenizer_bos_id(const tern_tokenizer *tok);
int32_t tern_tokenizer_eos_id(const tern_tokenizer *tok);
/* tokenizer_config.json add_bos_token / add_eos_token: 1, 0, or -1 when absent/null. */
int tern_tokenizer_add_bos(const tern_tokenizer *tok);
int tern_tokenizer_add_eos(const tern_tokenizer *tok);

/* Load from an in-memory tokenizer.json text (tests, embedded models). config_json may be
 * NULL (otherwise the text of a tokenizer_config.json). `name` is used in error messages. */
tern_status tern_tokenizer_load_json(tern_tokenizer **out, const char *json, size_t len,
                                     const char *config_json, const char *name, tern_error *err);

#endif
