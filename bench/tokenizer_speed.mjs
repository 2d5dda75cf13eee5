// tokenizer_speed.mjs — tern's tokenizer against HF `tokenizers` (the npm binding of HF's Rust
// library) in the same run, on the same few MB of mixed text.
//   node bench/tokenizer_speed.mjs [--rounds 3] [--names "gemma3 qwen3"] [--mb 4]
// Text: the parity corpus generator (tests/text/lib/tok_corpus.mjs, another seed: prose in many
// scripts, emoji, code, whitespace runs, digits, special-token text, random Unicode) plus
// paragraphs of this repository's own sources and docs, about --mb MB in all, one text per
// encode call. Tokenizer files: scripts/fetch_tokenizers.sh (never committed).
// Contenders, interleaved round by round (best round wins; every contender is timed warm: best
// of 2 passes inside its process, so both BPE word caches are filled):
//   hf_batch      HF encodeBatch, its thread pool on every core (in this process)
//   hf_1thread    HF encodeBatch with TOKENIZERS_PARALLELISM=false (a child process)
//   tern_1thread  build/bench_tokenizer: tern_tokenizer_encode per text, one thread
//   tern_Nthread  the same, texts dealt to N = nproc threads
// Times exclude loading and process start-up. Prints a table and CSV (name,contender,MB/s,tok/s).
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { makeCorpus } from '../tests/text/lib/tok_corpus.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
const ROUNDS = Number(opt('--rounds', 3)), MB = Number(opt('--mb', 4));
const NAMES = opt('--names', 'gemma3 qwen3').split(/\s+/).filter(Boolean);
const NCPU = os.availableParallelism ? os.availableParallelism() : os.cpus().length;
const work = path.join(root, 'build/tok-speed');
const bench = path.join(root, 'build/bench_tokenizer');
const req = createRequire(path.join(root, 'tests/package.json'));

// ---- child mode: HF single-threaded (the env var must be set before the library starts) ----
if (args[0] === '--hf-child') {
  const hf = req('tokenizers');
  const tok = hf.Tokenizer.fromFile(args[1]);
  const texts = fs.readFileSync(args[2], 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l));
  let best = Infinity, tokens = 0;
  for (let r = 0; r < 2; r++) {
    const t0 = process.hrtime.bigint();
    const enc = await tok.encodeBatch(texts, { addSpecialTokens: true });
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    tokens = enc.reduce((a, e) => a + e.getLength(), 0);
  }
  console.log(JSON.stringify({ best_s: best, tokens }));
  process.exit(0);
}

let hf;
try { hf = req('tokenizers'); } catch { console.error('tokenizer_speed: npm package `tokenizers` missing (scripts/setup.sh)'); process.exit(2); }
if (!fs.existsSync(bench)) execFileSync('make', ['-C', root, 'build/bench_tokenizer'], { stdio: 'inherit' });
spawnSync('bash', [path.join(root, 'scripts/fetch_tokenizers.sh'), ...NAMES], { stdio: ['ignore', 'ignore', 'inherit'] });
fs.mkdirSync(work, { recursive: true });

// ---- the text ----
function ownText() {
  const out = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(c|h|md|mjs|sh)$/.test(e.name)) out.push(...fs.readFileSync(p, 'utf8').split(/\n\s*\n/).filter((s) => s.trim()));
    }
  };
  for (const d of ['src', 'docs', 'tools', 'tests/unit', 'bench']) if (fs.existsSync(path.join(root, d))) walk(path.join(root, d));
  return out;
}
const bytesOf = (a) => a.reduce((n, s) => n + Buffer.byteLength(s), 0);
const texts = makeCorpus(8000, 4242);
for (const s of ownText()) { if (bytesOf(texts) > MB * 1e6) break; texts.push(s); }
const textFile = path.join(work, 'texts.jsonl');
fs.writeFileSync(textFile, texts.map((s) => JSON.stringify(s)).join('\n') + '\n');
const BYTES = bytesOf(texts);
console.log(`text: ${texts.length} texts, ${(BYTES / 1e6).toFixed(2)} MB; machine: ${os.cpus()[0].model}, ${NCPU} cores; ` +
  `load average ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}; rounds ${ROUNDS}`);

const rows = [];
for (const name of NAMES) {
  const dir = path.join(root, 'build/tokenizers', name);
  const file = path.join(dir, 'tokenizer.json');
  if (!fs.existsSync(file)) { console.log(`${name}: tokenizer files not available (offline?); skipped`); continue; }
  const tok = hf.Tokenizer.fromFile(file);
  const best = {}, tokens = {};
  const note = (k, s, n) => { best[k] = Math.min(best[k] ?? Infinity, s); tokens[k] = n; };
  const tern = (threads) => JSON.parse(execFileSync(bench, [dir, textFile, '--reps', '2', '--threads', String(threads)], { encoding: 'utf8' }));
  for (let r = 0; r < ROUNDS; r++) {
    for (let k = 0; k < 2; k++) { // hf_batch: 2 passes, as the others
      const t0 = process.hrtime.bigint();
      const enc = await tok.encodeBatch(texts, { addSpecialTokens: true });
      note('hf_batch', Number(process.hrtime.bigint() - t0) / 1e9, enc.reduce((a, e) => a + e.getLength(), 0));
    }
    const c = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--hf-child', file, textFile],
      { encoding: 'utf8', env: { ...process.env, TOKENIZERS_PARALLELISM: 'false' } });
    if (c.status === 0) { const j = JSON.parse(c.stdout); note('hf_1thread', j.best_s, j.tokens); }
    else console.log(`hf child failed: ${c.stderr.slice(0, 300)}`);
    let j = tern(1); note('tern_1thread', j.best_s, j.tokens);
    j = tern(NCPU); note(`tern_${NCPU}thread`, j.best_s, j.tokens);
  }
  const want = tokens.hf_batch;
  for (const k of Object.keys(best)) {
    rows.push({ name, k, mbs: BYTES / best[k] / 1e6, toks: tokens[k] / best[k], s: best[k], same: tokens[k] === want });
  }
}
console.log('\n| tokenizer | contender | best s | MB/s | tokens/s | same token count as HF |\n|---|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.name} | ${r.k} | ${r.s.toFixed(3)} | ${r.mbs.toFixed(2)} | ${Math.round(r.toks)} | ${r.same ? 'yes' : 'NO'} |`);
console.log('\nname,contender,mb_s,tok_s');
for (const r of rows) console.log(`${r.name},${r.k},${r.mbs.toFixed(3)},${Math.round(r.toks)}`);
