/*
 * stops.h — the engine's stop-token set: the one documented place that decides which token
 * ids end a generation (unless the request says ignore_eos).
 *
 * The set is the union, in this order and without duplicates, of
 *   1. the EOS ids of config.json and generation_config.json (io/config merges both into
 *      tern_model_config.eos_ids; pass them as cfg_eos),
 *   2. the tokenizer's eos_token (tokenizer_config.json / special_tokens_map.json),
 *   3. the turn-end tokens chat templates rely on, when the vocabulary has them
 *      (TERN_TURN_END_TOKENS below): a model that emitted one has finished its turn, and
 *      stopping there keeps it from writing the user's next turn or the tool's answer itself
 *      (Gemma 4 ends a tool-call turn with `<|tool_response>`, GLM with `<|observation|>`).
 * Ids outside [0, n_vocab) (the model's logits row) are dropped: they can never be sampled.
 * The result holds at most TERN_STOP_IDS_MAX ids.
 */
#ifndef TERN_TEXT_STOPS_H
#define TERN_TEXT_STOPS_H

#include "tern.h"
#include "text/tokenizer.h"

#include <stdint.h>

#define TERN_STOP_IDS_MAX 32

/* The turn-end token strings looked up in the vocabulary (NULL-terminated list):
 *   Gemma 4   <turn|>  <|tool_response>      Gemma 2/3  <end_of_turn>
 *   GLM-4/5   <|observation|>  <|user|>      Qwen/ChatML <|im_end|>
 *   Llama-3   <|eot_id|>  <|eom_id|> */
extern const char *const tern_turn_end_tokens[];

/* Build the stop set described above into ids[0..*n) (capacity TERN_STOP_IDS_MAX).
 * tok may be NULL (config EOS only). Never fails. */
void tern_stop_ids_build(const int *cfg_eos, int n_cfg_eos, const tern_tokenizer *tok, int n_vocab,
                         int32_t ids[TERN_STOP_IDS_MAX], int *n);

#endif
