// fixture.js — a small real model with a tokenizer for the server tests (not a test itself).
//
// The parity fixtures (tests/parity/fixtures) have random transformers weights but no
// tokenizer; the embedded demo has a tokenizer but synthetic weights whose output is mostly
// newlines (useless for seed and batch tests). makeFixture() joins the two in a temporary
// directory: the llama3 fixture's config and weights, with the vocabulary grown from 256 to
// the demo tokenizer's 264 ids (8 special tokens first, then the 256 byte tokens; the new
// embedding / lm_head rows are copies of existing ones), next to the demo's tokenizer.json
// and tokenizer_config.json (byte-level BPE + a small chat template), written there by
// `tern generate demo` with TERN_CACHE pointing into the temporary directory.
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT, TERN } from './harness.js';

const SRC = path.join(ROOT, 'tests', 'parity', 'fixtures', 'llama3');
const N_SPECIAL = 8;

function readSafetensors(file) {
  const buf = readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  return { header, data: buf.subarray(8 + n) };
}

function writeSafetensors(file, tensors) {   // tensors: [{name, dtype, shape, bytes}]
  const header = { __metadata__: { format: 'pt' } };
  let off = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + t.bytes.length] };
    off += t.bytes.length;
  }
  let h = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (h.length % 8)) % 8;
  h = Buffer.concat([h, Buffer.alloc(pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  writeFileSync(file, Buffer.concat([len, h, ...tensors.map((t) => t.bytes)]));
}

// Returns { dir, cleanup() } or throws when the inputs are missing.
export function makeFixture() {
  if (!existsSync(path.join(SRC, 'model.safetensors'))) throw new Error('llama3 parity fixture missing');
  const dir = mkdtempSync(path.join(os.tmpdir(), 'tern-srv-fixture-'));
  const cache = path.join(dir, 'cache');
  execFileSync(TERN, ['generate', 'demo', '--ids', '2', '--max-tokens', '1', '--print-ids'], { env: { ...process.env, TERN_CACHE: cache }, stdio: 'ignore' });
  const demo = path.join(cache, 'demo-v1');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(path.join(demo, f), path.join(dir, f));
  const tok = JSON.parse(readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const nVocab = Object.keys(tok.model.vocab).length;

  const cfg = JSON.parse(readFileSync(path.join(SRC, 'config.json'), 'utf8'));
  const old = cfg.vocab_size;
  if (nVocab !== old + N_SPECIAL) throw new Error(`unexpected vocab sizes ${old} / ${nVocab}`);
  // a 4096-token context (the fixture says 512) so that a long generation can be aborted mid-way
  Object.assign(cfg, { vocab_size: nVocab, bos_token_id: 2, eos_token_id: [1, 4], pad_token_id: 0, max_position_embeddings: 4096 });
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg, null, 2));

  const { header, data } = readSafetensors(path.join(SRC, 'model.safetensors'));
  const tensors = [];
  for (const [name, v] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    let bytes = data.subarray(v.data_offsets[0], v.data_offsets[1]);
    let shape = v.shape;
    if ((name === 'model.embed_tokens.weight' || name === 'lm_head.weight') && shape[0] === old) {
      const row = bytes.length / old;
      // special ids 0..7 reuse rows 100..107 (any distinct rows will do); bytes shift up by 8
      bytes = Buffer.concat([Buffer.from(bytes.subarray(100 * row, (100 + N_SPECIAL) * row)), bytes]);
      shape = [nVocab, shape[1]];
    }
    tensors.push({ name, dtype: v.dtype, shape, bytes: Buffer.from(bytes) });
  }
  writeSafetensors(path.join(dir, 'model.safetensors'), tensors);
  rmSync(cache, { recursive: true, force: true });
  const cleanup = () => rmSync(dir, { recursive: true, force: true });
  process.on('exit', cleanup);       // also when a test throws before its own cleanup
  return { dir, cleanup };
}
