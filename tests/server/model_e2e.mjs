// model_e2e.mjs — `tern serve` on a real (tiny, random-weight) model with a tokenizer, driven by
// the official `openai` and `@anthropic-ai/sdk` clients: start-up report, seed reproducibility,
// server default sampling flags, stop strings, abort mid-stream frees the request's KV, 32
// concurrent clients equal their solo runs (greedy), requests that can never fit (400 before
// generation), a full wait queue (429 + Retry-After). The model is built at test time by
// fixture.js (llama3 parity fixture + the demo's byte-level tokenizer). SKIPs visibly when the
// npm clients or the binary are missing.
import { existsSync } from 'node:fs';
import { assert, check, eq, failures, postJSON, skip, startServer, TERN } from './harness.js';
import { makeFixture } from './fixture.js';

let OpenAI, Anthropic;
try {
  OpenAI = (await import('openai')).default;
  Anthropic = (await import('@anthropic-ai/sdk')).default;
} catch (e) {
  skip('model_e2e', `npm packages openai / @anthropic-ai/sdk not installed (cd tests && npm install): ${e.message.slice(0, 80)}`);
  process.exit(0);
}
if (!existsSync(TERN)) { skip('model_e2e', 'build/tern not built'); process.exit(0); }

const fx = makeFixture();
// --threads 1: the tiny model is fastest single-threaded, and the CI machine has 2 cores
const srv = await startServer([fx.dir, '--threads', '1', '--max-concurrency', '16']);
const oa = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'k', maxRetries: 0, timeout: 60000 });
const an = new Anthropic({ baseURL: srv.url, apiKey: 'k', maxRetries: 0, timeout: 60000 });
const model = (await oa.models.list()).data[0].id;
const msgs = (t) => [{ role: 'user', content: t }];
const stats = async (s = srv) => (await (await fetch(`${s.url}/stats`)).json()).engine;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function idle(s = srv) {          // the engine publishes stats after each step: wait until settled
  let st;
  for (let i = 0; i < 200; i++) {
    st = await stats(s);
    if (st.running === 0 && st.waiting === 0) return st;
    await sleep(10);
  }
  return st;
}
const chat = async (p, extra = {}) => oa.chat.completions.create({ model, messages: msgs(p), max_tokens: 24, ...extra });

await check('startup_report', async () => {
  const out = srv.stdout();
  const lines = out.split('\n');
  const li = lines.findIndex((l) => l.startsWith('listening on '));
  assert(li > 0, 'no listening line');
  assert(lines.slice(0, li).some((l) => /^model: .*\(llama, 4 layers.*vocab 264\), context 4096/.test(l)), `model line: ${out}`);
  const w = out.match(/memory: weights .*\((\d+) bytes in 1 safetensors file/);
  assert(w && Number(w[1]) > 100000, `weights line: ${out}`);
  const kv = out.match(/memory: KV pool .*\((\d+) bytes\), (\d+) blocks of 16 tokens, .*\((\d+) bytes; full layers/);
  assert(kv, `kv line: ${out}`);
  eq(Number(kv[3]), 4 * 2 * 2 * 16 * 4, 'KV bytes per token (4 layers, K+V, 2 kv heads x 16, f32)');
  eq(Number(kv[2]), (await stats()).kv_blocks_total, 'blocks = /stats');
  const r = out.match(/ready: engine opened .* in ([\d.]+) ms; serving ([\d.]+) ms later/);
  assert(r, `ready line: ${out}`);
  assert(Number(r[2]) < 1000, `ready ${r[2]} ms after the engine opened`);
  console.log(`# ready: engine open ${r[1]} ms, then serving after ${r[2]} ms`);
});

await check('seed_reproducible', async () => {
  const a = await chat('Tell me a story.', { temperature: 1, seed: 1234 });
  const b = await chat('Tell me a story.', { temperature: 1, seed: 1234 });
  const c = await chat('Tell me a story.', { temperature: 1, seed: 99 });
  const t = (x) => x.choices[0].message.content;
  eq(t(a), t(b), 'same seed, same text');
  assert(t(a) !== t(c), 'different seeds gave the same text');
  // streaming with the same seed gives the same text too
  const st = await chat('Tell me a story.', { temperature: 1, seed: 1234, stream: true });
  let s = '';
  for await (const ch of st) s += ch.choices[0]?.delta?.content || '';
  eq(s, t(a), 'stream == non-stream');
});

// reference greedy outputs (solo) for the stop-string and concurrency tests
const PROMPTS = Array.from({ length: 32 }, (_, i) => `Question ${i}: what is ${i * 7 + 3} plus ${i}?`);
const solo = [];
for (const p of PROMPTS) solo.push(await chat(p, { temperature: 0, logprobs: true }));

await check('stop_strings', async () => {
  // a printable ASCII character somewhere after the start of a greedy answer becomes the stop string
  let k = -1, text = '', stop = '';
  for (k = 0; k < solo.length; k++) {
    text = solo[k].choices[0].message.content;
    const m = text.slice(2).match(/[!-~]/);
    if (m) { stop = m[0]; break; }
  }
  assert(stop, 'no printable character in any answer');
  const want = text.slice(0, text.indexOf(stop));
  const r = await chat(PROMPTS[k], { temperature: 0, stop: [stop, 'never-appears'] });
  eq(r.choices[0].message.content, want, 'text before the stop string');
  eq(r.choices[0].finish_reason, 'stop');
  const st = await chat(PROMPTS[k], { temperature: 0, stop, stream: true });
  let s = '';
  for await (const ch of st) s += ch.choices[0]?.delta?.content || '';
  eq(s, want, 'streamed text before the stop string');
  const m = await an.messages.create({ model, max_tokens: 24, temperature: 0, stop_sequences: [stop], messages: msgs(PROMPTS[k]) });
  eq(m.stop_reason, 'stop_sequence');
  eq(m.stop_sequence, stop);
  eq(m.content[0]?.text ?? '', want, 'anthropic text');
});

await check('abort_mid_stream_frees_kv', async () => {
  const base = await idle();
  eq(base.kv_blocks_used, 0, 'KV in use before');
  const st = await oa.chat.completions.create({ model, messages: msgs('Go on forever.'), max_tokens: 4000, temperature: 1, stream: true, ignore_eos: true });
  let n = 0;
  for await (const ch of st) { if (ch.choices[0]?.delta?.content !== undefined) n++; if (n >= 5) break; }   // break aborts the request
  let after = await stats();
  for (let i = 0; i < 300 && !(after.running === 0 && after.kv_blocks_used === base.kv_blocks_used && after.requests_cancelled > base.requests_cancelled); i++) {
    await sleep(10);
    after = await stats();
  }
  eq(after.requests_cancelled, base.requests_cancelled + 1, 'cancelled');
  eq(after.kv_blocks_used, base.kv_blocks_used, 'KV blocks back to the baseline');
  assert(after.generated_tokens - base.generated_tokens < 4000, 'the request ran to its end');
});

await check('concurrent_32_equal_solo', async () => {
  const rs = await Promise.all(PROMPTS.map(async (p, i) => {
    if (i % 2) return chat(p, { temperature: 0, logprobs: true });
    const st = await chat(p, { temperature: 0, logprobs: true, stream: true });
    let text = '';
    const lps = [];
    for await (const ch of st) {
      text += ch.choices[0]?.delta?.content || '';
      for (const c of ch.choices[0]?.logprobs?.content || []) lps.push(c);
    }
    return { choices: [{ message: { content: text }, logprobs: { content: lps } }] };
  }));
  let maxd = 0;
  for (let i = 0; i < PROMPTS.length; i++) {
    eq(rs[i].choices[0].message.content, solo[i].choices[0].message.content, `client ${i} text`);
    const a = solo[i].choices[0].logprobs.content, b = rs[i].choices[0].logprobs.content;
    eq(b.length, a.length, `client ${i} logprob count`);
    for (let t = 0; t < a.length; t++) maxd = Math.max(maxd, Math.abs(a[t].logprob - b[t].logprob));
  }
  assert(maxd < 1e-3, `logprobs differ by ${maxd}`);
  console.log(`# 32 concurrent == solo (greedy); largest logprob difference batch vs solo: ${maxd.toExponential(2)}`);
});

await check('never_fits_400', async () => {
  // prompt + max_tokens beyond the 4096-token context: refused before generation
  const before = await idle();
  let err = null;
  try { await chat('x'.repeat(100), { max_tokens: 4050 }); } catch (e) { err = e; }
  assert(err, 'no error');
  eq(err.status, 400, 'status');
  eq(err.code, 'context_length_exceeded');
  eq(err.param, 'max_tokens');
  let aerr = null;
  try { await an.messages.create({ model, max_tokens: 4090, messages: msgs('y'.repeat(100)) }); } catch (e) { aerr = e; }
  eq(aerr?.status, 400, 'anthropic status');
  eq(aerr?.error?.error?.type, 'invalid_request_error');
  // a prompt longer than the context
  const long = await postJSON(`${srv.url}/v1/completions`, { prompt: 'z'.repeat(5000), max_tokens: 1 });
  eq(long.status, 400, 'long prompt');
  const after = await stats();
  eq(after.prompt_tokens, before.prompt_tokens, 'nothing reached the engine');
});

// a second server: default sampling flags, a KV pool smaller than the context, a queue of 1
const srv2 = await startServer([fx.dir, '--threads', '1', '--temperature', '0.9', '--top-p', '0.9', '--top-k', '40',
  '--min-p', '0.01', '--seed', '7', '--kv-memory', '0.002', '--max-concurrency', '1', '--max-queue', '1', '--ctx', '3500']);
const oa2 = new OpenAI({ baseURL: `${srv2.url}/v1`, apiKey: 'k', maxRetries: 0, timeout: 60000 });

await check('ctx_flag', async () => {
  const m = await oa2.models.retrieve(model);
  eq(m.context_window, 3500, '--ctx 3500');
});

await check('default_sampling_flags', async () => {
  const p = 'Defaults please.';
  const explicit = await chat(p, { temperature: 0.9, top_p: 0.9, top_k: 40, min_p: 0.01, seed: 7 });
  const dflt = await oa2.chat.completions.create({ model, messages: msgs(p), max_tokens: 24 });
  eq(dflt.choices[0].message.content, explicit.choices[0].message.content, 'server defaults == explicit fields');
  const greedy = await oa2.chat.completions.create({ model, messages: msgs(p), max_tokens: 24, temperature: 0 });
  eq(greedy.choices[0].message.content, (await chat(p, { temperature: 0 })).choices[0].message.content, 'request overrides the default');
});

await check('prompt_beyond_kv_pool_400', async () => {
  // 0.002 GB of KV = 2097 tokens at 1 KiB/token: a 3000-token prompt fits the context, never the pool
  const r = await postJSON(`${srv2.url}/v1/completions`, { prompt: 'w'.repeat(3000), max_tokens: 1 });
  eq(r.status, 400, `status (${r.text.slice(0, 200)})`);
  eq(r.json.error.code, 'context_length_exceeded');
  assert(/KV/.test(r.json.error.message), r.json.error.message);
  const ok = await postJSON(`${srv2.url}/v1/completions`, { prompt: 'w'.repeat(100), max_tokens: 2 });
  eq(ok.status, 200, 'a prompt that fits');
});

await check('queue_full_429', async () => {
  // max concurrency 1 + max queue 1: of three long requests at once, one is refused at once
  const body = { model, messages: msgs('long'), max_tokens: 1500, ignore_eos: true };
  const rs = await Promise.all([0, 1, 2].map(() => postJSON(`${srv2.url}/v1/chat/completions`, body)));
  const codes = rs.map((r) => r.status).sort();
  eq(codes, [200, 200, 429], 'statuses');
  const busy = rs.find((r) => r.status === 429);
  eq(busy.headers.get('retry-after'), '1', 'Retry-After');
  eq(busy.json.error.type, 'rate_limit_error');
  const a2 = new Anthropic({ baseURL: srv2.url, apiKey: 'k', maxRetries: 0 });
  const p = [0, 1, 2].map(() => a2.messages.create({ model, max_tokens: 1500, ignore_eos: true, messages: msgs('long') }).then(() => 200, (e) => e));
  const errs = (await Promise.all(p)).filter((x) => x !== 200);
  eq(errs.length, 1, 'one anthropic request refused');
  eq(errs[0].status, 429);
  eq(errs[0].error?.error?.type, 'rate_limit_error');
  const h = (await (await fetch(`${srv2.url}/stats`)).json()).http;
  eq(h.rejected_queue_full, 2, '/stats http.rejected_queue_full');
  assert(/tern_http_rejected_total 2\n/.test(await (await fetch(`${srv2.url}/metrics`)).text()), '/metrics');
});

await check('clean_shutdown', async () => {
  eq(await srv2.stop(), 0, 'exit status (2)');
  eq(await srv.stop(), 0, 'exit status');
});
fx.cleanup();
process.exit(failures() ? 1 : 0);
