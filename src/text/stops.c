/*
 * stops.c — the engine's stop-token set (see stops.h for the rule).
 *
 * Why the turn-end tokens and not only EOS: HF configs list EOS ids for plain generation,
 * but chat templates end turns with their own markers, and some of those are missing from
 * the EOS lists of published configs (Gemma 4 lists `<turn|>` but not `<|tool_response>`;
 * GLM-4.x lists `<|endoftext|>` only in some copies; older Llama-3 configs miss
 * `<|eot_id|>`). Without them the model keeps going after its turn: it writes the tool's
 * reply or the user's next message itself. llama.cpp and vLLM add the same tokens as
 * end-of-generation for these families. A token string found in the vocabulary (added
 * tokens or model vocab) is used; absent ones are skipped, so one list serves every model.
 */
#include "text/stops.h"

#include <string.h>

const char *const tern_turn_end_tokens[] = {
    "<turn|>", "<|tool_response>", "<end_of_turn>",  /* Gemma 4, Gemma 4 tool turn, Gemma 2/3 */
    "<|observation|>", "<|user|>",                   /* GLM-4 / GLM-5 */
    "<|im_end|>",                                    /* Qwen, ChatML */
    "<|eot_id|>", "<|eom_id|>",                      /* Llama-3 */
    NULL,
};

static void add(int32_t *ids, int *n, int64_t id, int n_vocab) {
    if (id < 0 || id >= n_vocab || *n >= TERN_STOP_IDS_MAX) return;
    for (int i = 0; i < *n; i++)
        if (ids[i] == id) return;
    ids[(*n)++] = (int32_t)id;
}

void tern_stop_ids_build(const int *cfg_eos, int n_cfg_eos, const tern_tokenizer *tok, int n_vocab,
                         int32_t ids[TERN_STOP_IDS_MAX], int *n) {
    *n = 0;
    for (int i = 0; cfg_eos && i < n_cfg_eos; i++) add(ids, n, cfg_eos[i], n_vocab);
    if (!tok) return;
    add(ids, n, tern_tokenizer_eos_id(tok), n_vocab);
    for (int i = 0; tern_turn_end_tokens[i]; i++) {
        const char *s = tern_turn_end_tokens[i];
        add(ids, n, tern_tokenizer_token_to_id(tok, s, strlen(s)), n_vocab);
    }
}
