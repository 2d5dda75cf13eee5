// load_model.mjs — write a random-weight Llama-shaped model directory for bench/load.sh, big
// enough that the model, not the tiny demo, sets the cost of a token (so the server-overhead
// figure means something), with the demo's byte-level tokenizer (264 ids) next to it.
//   node bench/load_model.mjs DIR [--hidden 1024] [--layers 8] [--ff 2816] [--heads 16] [--kv-heads 4]
// Weights: bf16, N(0, 0.02) (norm weights 1), fixed seed; tokenizer files come from
// `tern generate demo` run with TERN_CACHE inside DIR. Nothing here is meaningful text.
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, openSync, rmSync, writeSync, closeSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const dir = args[0];
if (!dir) { console.error('usage: node bench/load_model.mjs DIR [--hidden N] [--layers N] [--ff N] [--heads N] [--kv-heads N]'); process.exit(2); }
const opt = (k, d) => { const i = args.indexOf(k); return i > 0 ? Number(args[i + 1]) : d; };
const H = opt('--hidden', 1024), L = opt('--layers', 8), FF = opt('--ff', 2816), NH = opt('--heads', 16), NKV = opt('--kv-heads', 4);
const HD = H / NH, V = 264;
mkdirSync(dir, { recursive: true });

const cache = path.join(dir, 'cache');
execFileSync(process.env.TERN_BIN || path.join(ROOT, 'build', 'tern'), ['generate', 'demo', '--ids', '2', '--max-tokens', '1', '--print-ids'],
  { env: { ...process.env, TERN_CACHE: cache }, stdio: 'ignore' });
for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(path.join(cache, 'demo-v1', f), path.join(dir, f));
rmSync(cache, { recursive: true, force: true });

writeFileSync(path.join(dir, 'config.json'), JSON.stringify({
  architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: H, intermediate_size: FF, num_hidden_layers: L,
  num_attention_heads: NH, num_key_value_heads: NKV, head_dim: HD, vocab_size: V, max_position_embeddings: 4096,
  rms_norm_eps: 1e-5, rope_theta: 500000.0, hidden_act: 'silu', tie_word_embeddings: false, bos_token_id: 2,
  eos_token_id: [1, 4], pad_token_id: 0, torch_dtype: 'bfloat16',
}, null, 2));

const tensors = [['model.embed_tokens.weight', [V, H]], ['model.norm.weight', [H]], ['lm_head.weight', [V, H]]];
for (let l = 0; l < L; l++) {
  const p = `model.layers.${l}.`;
  tensors.push([`${p}input_layernorm.weight`, [H]], [`${p}post_attention_layernorm.weight`, [H]],
    [`${p}self_attn.q_proj.weight`, [NH * HD, H]], [`${p}self_attn.k_proj.weight`, [NKV * HD, H]],
    [`${p}self_attn.v_proj.weight`, [NKV * HD, H]], [`${p}self_attn.o_proj.weight`, [H, NH * HD]],
    [`${p}mlp.gate_proj.weight`, [FF, H]], [`${p}mlp.up_proj.weight`, [FF, H]], [`${p}mlp.down_proj.weight`, [H, FF]]);
}
const header = { __metadata__: { format: 'pt' } };
let off = 0;
for (const [name, shape] of tensors) {
  const n = shape.reduce((a, b) => a * b, 1) * 2;
  header[name] = { dtype: 'BF16', shape, data_offsets: [off, off + n] };
  off += n;
}
let h = Buffer.from(JSON.stringify(header));
h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
const fd = openSync(path.join(dir, 'model.safetensors'), 'w');
const len = Buffer.alloc(8);
len.writeBigUInt64LE(BigInt(h.length));
writeSync(fd, len);
writeSync(fd, h);
let seed = 12345;
const rnd = () => { seed = (seed * 1103515245 + 12345) >>> 0; return seed / 4294967296; };
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
for (const [name, shape] of tensors) {
  const n = shape.reduce((a, b) => a * b, 1);
  const b = Buffer.alloc(n * 2);
  const norm = name.endsWith('norm.weight');
  for (let i = 0; i < n; i++) {
    // sum of 4 uniforms ~ normal; scaled to std 0.02
    f32[0] = norm ? 1 : (rnd() + rnd() + rnd() + rnd() - 2) * 0.0346;
    b.writeUInt16LE(u32[0] >>> 16, i * 2);
  }
  writeSync(fd, b);
}
closeSync(fd);
console.log(`wrote ${dir}: llama hidden ${H}, ${L} layers, ff ${FF}, ${(off / 1048576).toFixed(1)} MiB of bf16 weights`);
