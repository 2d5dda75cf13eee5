// tok_build.mjs — tokenizers built by our own script with HF `tokenizers` (the npm binding),
// for tests/text/tokenizer_parity.mjs and bench/tokenizer_speed.mjs. Written under build/tokenizers/
// (never committed). Each builder returns { dir, tok } where tok is the HF Tokenizer that the
// file was saved from (the oracle), or null when the source file is missing.
//
//  gemma4_style: the real Gemma 3 tokenizer.json (fetched by scripts/fetch_tokenizers.sh) with
//    Gemma 4's markers (`<|turn>`, `<turn|>`, `<|tool_call>`, `<|"|>`, `<|channel>`, ...) added
//    through HF's addAddedTokens as special, non-normalized tokens (new ids after the vocab; the
//    real Gemma 4 file puts `<|turn>`/`<turn|>` at 105/106 instead, which changes no code path).
//    `base` may be the already loaded Gemma 3 HF tokenizer (it is extended in place: saves a
//    3 s load). tokenizer_config.json: Gemma 3's, with eos_token `<eos>`.
//  glm_style: a byte-level BPE trained by HF's own BPE trainer on our test corpus (another seed),
//    with GLM-4's Split regex + ByteLevel(use_regex=false), the ByteLevel decoder, the 256
//    byte symbols completed (as GLM/Llama-3 files have them, so nothing is ever unknown),
//    GLM-4's added tokens (role markers special, think/tool tags not), and a TemplateProcessing
//    that prefixes `[gMASK]<sop>` as GLM-4's tokenizer did. The binding has no ByteLevel
//    decoder and takes Split patterns as plain strings, so those two are written into the
//    JSON, which is then loaded back through HF (fromString) to be sure it is valid. Training
//    takes ~2 s (its progress bar prints a few blank lines), so the result is cached under
//    build/ with a recipe stamp.
import fs from 'node:fs';
import path from 'node:path';
import { makeCorpus } from './tok_corpus.mjs';

export const GEMMA4_ADDED = ['<|turn>', '<turn|>', '<|tool_call>', '<tool_call|>', '<|tool_response>', '<tool_response|>', '<|"|>',
  '<|channel>', '<channel|>', '<|think|>', '<|tool>', '<tool|>', '<|image>', '<image|>', '<|image|>',
  '<|audio>', '<audio|>', '<|audio|>', '<|video|>'];
const GLM_SPECIAL = ['<|endoftext|>', '[MASK]', '[gMASK]', '[sMASK]', '<sop>', '<eop>', '<|system|>', '<|user|>',
  '<|assistant|>', '<|observation|>', '<|begin_of_image|>', '<|end_of_image|>'];
const GLM_PLAIN = ['<think>', '</think>', '<tool_call>', '</tool_call>', '<arg_key>', '</arg_key>', '<arg_value>',
  '</arg_value>', '/nothink'];
export const GLM_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// bump when buildGlmStyle changes (the trained file is cached under build/ with this stamp)
const GEMMA4_RECIPE = `gemma4_style v1: gemma3 + ${GEMMA4_ADDED.join(' ')}\n`;
const GLM_RECIPE = 'glm_style v1: makeCorpus(6000, 777), HF default BPE trainer\n';

function save(tok, dir, config) {
  fs.mkdirSync(dir, { recursive: true });
  tok.save(path.join(dir, 'tokenizer.json'));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config, null, 1));
}

export function buildGemma4Style(hf, root, base = null) {
  const src = path.join(root, 'build/tokenizers/gemma3');
  const dir = path.join(root, 'build/tokenizers/gemma4_style');
  if (!fs.existsSync(path.join(src, 'tokenizer.json'))) return { dir, tok: null };
  const tok = base || hf.Tokenizer.fromFile(path.join(src, 'tokenizer.json'));
  tok.addAddedTokens(GEMMA4_ADDED.map((s) => new hf.AddedToken(s, true, { normalized: false })));
  const stamp = path.join(dir, 'RECIPE'); // the source file is sha-pinned: a saved copy stays valid
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === GEMMA4_RECIPE) return { dir, tok };
  const cfg = JSON.parse(fs.readFileSync(path.join(src, 'tokenizer_config.json'), 'utf8'));
  delete cfg.added_tokens_decoder;
  delete cfg.chat_template;
  cfg.eos_token = '<eos>';
  save(tok, dir, cfg);
  fs.writeFileSync(stamp, GEMMA4_RECIPE);
  return { dir, tok };
}

export function buildGlmStyle(hf, root) {
  const dir = path.join(root, 'build/tokenizers/glm_style');
  const stamp = path.join(dir, 'RECIPE');
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === GLM_RECIPE) // built before: reuse
    return { dir, tok: hf.Tokenizer.fromFile(path.join(dir, 'tokenizer.json')) };
  const work = path.join(root, 'build/tokenizers/.glm_train');
  fs.mkdirSync(work, { recursive: true });
  const base = {
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: GLM_REGEX }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: {}, merges: [] },
  };
  // train with HF's BPE trainer (the binding's default trainer for a BPE model)
  const trainFile = path.join(work, 'train.txt');
  fs.writeFileSync(trainFile, makeCorpus(6000, 777).join('\n'));
  const trainer = hf.Tokenizer.fromString(JSON.stringify(base));
  trainer.train([trainFile]);
  trainer.save(path.join(work, 'trained.json'));
  const j = JSON.parse(fs.readFileSync(path.join(work, 'trained.json'), 'utf8'));
  // complete the byte alphabet, then the added tokens, then the post-processor
  let next = Object.keys(j.model.vocab).length;
  for (const c of hf.byteLevelAlphabet()) if (!(c in j.model.vocab)) j.model.vocab[c] = next++;
  const added = [...GLM_SPECIAL.map((s) => [s, true]), ...GLM_PLAIN.map((s) => [s, false])];
  j.added_tokens = added.map(([content, special]) => ({ id: next++, content, single_word: false, lstrip: false,
    rstrip: false, normalized: false, special }));
  const id = (s) => j.added_tokens.find((t) => t.content === s).id;
  const st = (s) => ({ SpecialToken: { id: s, type_id: 0 } });
  j.post_processor = { type: 'TemplateProcessing', single: [st('[gMASK]'), st('<sop>'), { Sequence: { id: 'A', type_id: 0 } }],
    pair: [st('[gMASK]'), st('<sop>'), { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '[gMASK]': { id: '[gMASK]', ids: [id('[gMASK]')], tokens: ['[gMASK]'] },
                      '<sop>': { id: '<sop>', ids: [id('<sop>')], tokens: ['<sop>'] } } };
  j.decoder = base.decoder;
  j.pre_tokenizer = base.pre_tokenizer;
  const tok = hf.Tokenizer.fromString(JSON.stringify(j)); // HF accepts it: a valid tokenizer.json
  save(tok, dir, { bos_token: null, eos_token: '<|endoftext|>', pad_token: '<|endoftext|>', add_bos_token: false,
                   tokenizer_class: 'PreTrainedTokenizerFast' });
  fs.writeFileSync(stamp, GLM_RECIPE);
  fs.rmSync(work, { recursive: true, force: true });
  return { dir, tok };
}
