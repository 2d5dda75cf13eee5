// tp_glm_quant.mjs — tensor parallelism on the quantized GLM-5 fixtures (MLX q4, FP8 blocks).
//
// The committed quantized GLM-5 fixtures are too small to split as they are: their dense and
// shared-expert down projections (and o_proj over 4 ranks) have fewer input columns per rank
// than one MLX group (32) or FP8 block (128), so tern refuses them (test_model_tp checks the
// message). To still exercise the quantized shard rules (q_b_proj rows, embed_q / unembed_out
// stacks by head, gate/up rows, experts by id — in 4-, 6- and 8-bit MLX and FP8 blocks), this
// test writes a temporary copy of each fixture where only the tensors that cannot split are
// dequantized to float32 (the same numbers, another dtype), then runs `tern logits` and
// `tern generate` with TERN_TP=1 and TERN_TP=N on that copy: N ranks must match one rank
// within 5e-5 rel per row with the same argmax, one rank must stay within the 1e-3 parity bound
// of the fixture's reference, and the greedy continuation must be the reference's.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
const tern = path.join(root, 'build/tern');
const fixdir = path.join(root, 'tests/parity/fixtures');
if (!fs.existsSync(tern)) { console.log('SKIP: tp_glm_quant (build/tern absent)'); process.exit(0); }

const bf16 = (u16) => { const b = Buffer.alloc(4); b.writeUInt32LE((u16 << 16) >>> 0); return b.readFloatLE(0); };
const e4m3 = (v) => {
  const s = v & 0x80 ? -1 : 1, e = (v >> 3) & 15, m = v & 7;
  if (e === 15 && m === 7) return NaN;
  return e === 0 ? s * (m / 8) * 2 ** -6 : s * (1 + m / 8) * 2 ** (e - 7);
};

function readST(file) {
  const buf = fs.readFileSync(file), n = Number(buf.readBigUInt64LE(0));
  const hdr = JSON.parse(buf.subarray(8, 8 + n).toString());
  const data = buf.subarray(8 + n), t = {};
  for (const [k, v] of Object.entries(hdr)) if (k !== '__metadata__') t[k] = { ...v, bytes: data.subarray(v.data_offsets[0], v.data_offsets[1]) };
  return t;
}

function writeST(file, t) {
  const hdr = {}; let off = 0;
  for (const [k, v] of Object.entries(t)) { hdr[k] = { dtype: v.dtype, shape: v.shape, data_offsets: [off, off + v.bytes.length] }; off += v.bytes.length; }
  let h = Buffer.from(JSON.stringify(hdr));
  h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8); len.writeBigUInt64LE(BigInt(h.length));
  fs.writeFileSync(file, Buffer.concat([len, h, ...Object.values(t).map((v) => v.bytes)]));
}

const vals = (v) => { // bf16 / f32 tensor -> numbers
  const n = v.bytes.length / (v.dtype === 'F32' ? 4 : 2), out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = v.dtype === 'F32' ? v.bytes.readFloatLE(4 * i) : bf16(v.bytes.readUInt16LE(2 * i));
  return out;
};
const f32 = (arr, shape) => { const b = Buffer.alloc(4 * arr.length); arr.forEach((x, i) => b.writeFloatLE(x, 4 * i)); return { dtype: 'F32', shape, bytes: b }; };

// MLX affine: w = scale * q + bias per group of gs inputs; q packed little-end first in uint32 words.
function dequantMLX(t, base, bits, gs) {
  const w = t[base + '.weight'], s = vals(t[base + '.scales']), b = vals(t[base + '.biases']);
  const [rows, words] = w.shape, inn = (32 * words) / bits, ng = inn / gs, out = new Float64Array(rows * inn);
  for (let r = 0; r < rows; r++) {
    const row = w.bytes.subarray(r * words * 4, (r + 1) * words * 4);
    for (let c = 0; c < inn; c++) {
      let q = 0;
      for (let k = 0; k < bits; k++) { const bit = c * bits + k; q |= ((row[bit >> 3] >> (bit & 7)) & 1) << k; }
      const g = r * ng + Math.floor(c / gs);
      out[r * inn + c] = Math.fround(Math.fround(s[g] * q) + b[g]);
    }
  }
  return f32(out, [rows, inn]);
}

function dequantFP8(t, base) {
  const w = t[base + '.weight'], sc = vals(t[base + '.weight_scale_inv']), [rows, cols] = w.shape;
  const scols = t[base + '.weight_scale_inv'].shape[1], out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++)
    out[r * cols + c] = Math.fround(e4m3(w.bytes[r * cols + c]) * sc[Math.floor(r / 128) * scols + Math.floor(c / 128)]);
  return f32(out, [rows, cols]);
}

// Copy fixture `name` to a temp dir with the tensors matching `re` dequantized.
function prepare(name, re, tmp) {
  const src = path.join(fixdir, name), dst = path.join(tmp, name);
  fs.mkdirSync(dst, { recursive: true });
  const cfg = JSON.parse(fs.readFileSync(path.join(src, 'config.json')));
  const t = readST(path.join(src, 'model.safetensors'));
  const bases = [...new Set(Object.keys(t).filter((k) => k.endsWith('.weight')).map((k) => k.slice(0, -7)))].filter((b) => re.test(b));
  for (const base of bases) {
    if (t[base + '.scales']) {
      const q = cfg.quantization, o = q[base], bits = (o && o.bits) || q.bits, gs = (o && o.group_size) || q.group_size;
      const d = dequantMLX(t, base, bits, gs);
      delete t[base + '.scales']; delete t[base + '.biases'];
      t[base + '.weight'] = d;
      for (const q of [cfg.quantization, cfg.quantization_config]) if (q) q[base] = false;
    } else if (t[base + '.weight_scale_inv']) {
      t[base + '.weight'] = dequantFP8(t, base);
      delete t[base + '.weight_scale_inv'];
      cfg.quantization_config.modules_to_not_convert.push(base.replace(/^model\./, ''));
    }
  }
  writeST(path.join(dst, 'model.safetensors'), t);
  fs.writeFileSync(path.join(dst, 'config.json'), JSON.stringify(cfg, null, 1));
  return { dst, n: bases.length };
}

const relL2 = (a, b) => { let d = 0, r = 0; for (let i = 0; i < a.length; i++) { d += (a[i] - b[i]) ** 2; r += b[i] ** 2; } return Math.sqrt(d / r); };
const argmax = (a) => a.reduce((m, x, i) => (x > a[m] ? i : m), 0);
const readF32 = (f) => { const b = fs.readFileSync(f); return new Float32Array(b.buffer, b.byteOffset, b.length / 4); };

function run(args, N) {
  return execFileSync(tern, args, { env: { ...process.env, TERN_TP: String(N) }, stdio: ['ignore', 'pipe', 'pipe'], timeout: 60000 }).toString();
}

const cases = [
  // dense down_proj (96 -> 48 columns), shared down_proj (32 -> 16): below a group of 32
  { name: 'glm5_dsa_q4', N: 2, re: /layers\.[0-9]+\.mlp\.(down_proj|shared_experts\.down_proj)$/ },
  { name: 'glm5_dsa_q4', N: 4, re: /layers\.[0-9]+\.(mlp\.(down_proj|shared_experts\.down_proj)|self_attn\.o_proj)$/ },
  // FP8 blocks of 128: every head / MLP split is below one block; experts (by id) stay FP8
  { name: 'glm5_dsa_fp8', N: 2, re: /self_attn\.(q_b_proj|kv_b_proj|o_proj)$|mlp\.(gate_proj|up_proj|down_proj)$|shared_experts\./ },
  { name: 'glm5_dsa_fp8', N: 4, re: /self_attn\.(q_b_proj|kv_b_proj|o_proj)$|mlp\.(gate_proj|up_proj|down_proj)$|shared_experts\./ },
];

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-tpq-'));
try {
  for (const c of cases) {
    const label = `tp_glm_quant_${c.name}_N${c.N}`;
    try {
      const src = path.join(fixdir, c.name);
      if (!fs.existsSync(src)) { console.log(`SKIP: ${label} (no fixture)`); continue; }
      const ref = JSON.parse(fs.readFileSync(path.join(src, 'ref.json')));
      const oracle = readF32(path.join(src, 'ref_logits.f32'));
      const { dst, n } = prepare(c.name, c.re, path.join(tmp, `N${c.N}`));
      const ids = ref.all_ids.join(','), out1 = path.join(dst, 'l1.f32'), outN = path.join(dst, 'lN.f32');
      run(['logits', dst, '--ids', ids, '--out', out1, '--threads', '2'], 1);
      run(['logits', dst, '--ids', ids, '--out', outN, '--threads', '2'], c.N);
      const a = readF32(out1), b = readF32(outN), V = a.length / ref.all_ids.length;
      let worst = 0, worstRef = 0, badArg = -1;
      for (let r = 0; r < ref.all_ids.length; r++) {
        const x = b.subarray(r * V, (r + 1) * V), y = a.subarray(r * V, (r + 1) * V);
        worst = Math.max(worst, relL2(x, y));
        worstRef = Math.max(worstRef, relL2(y, oracle.subarray(r * V, (r + 1) * V)));
        if (argmax(x) !== argmax(y) && badArg < 0) badArg = r;
      }
      const np = ref.prompt_ids.length, want = ref.all_ids.slice(np).join(' ');
      const gen = run(['generate', dst, '--ids', ref.prompt_ids.join(','), '--max-tokens', String(ref.all_ids.length - np),
        '--temperature', '0', '--ignore-eos', '--print-ids', '--threads', '2'], c.N).trim();
      const ok = worst <= 5e-5 && badArg < 0 && worstRef <= 1e-3 && gen === want;
      console.log(`${ok ? 'PASS' : 'FAIL'}: ${label} (${n} tensors dequantized; max rel vs N=1 ${worst.toExponential(2)}, ` +
        `N=1 vs reference ${worstRef.toExponential(2)}, argmax ${badArg < 0 ? 'same' : 'differs at row ' + badArg}, ` +
        `greedy ${gen === want ? 'identical' : 'DIFFERENT: ' + gen})`);
    } catch (e) {
      console.log(`FAIL: ${label}: ${String(e.stderr || e.message).slice(0, 400)}`);
    }
  }
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
