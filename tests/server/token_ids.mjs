// token_ids.mjs — token-id prompts and the "ids mode" of `tern serve` for a model without a
// tokenizer (`tern serve random:glm5-tiny`: random weights of a tiny preset geometry, made in
// memory, no tokenizer.json — what bench/load.sh uses for realistic step times).
// Checked: /v1/completions with prompt [ids] and [[ids]] (streaming and not) generates; the
// text of each generated id is "<ID>" and concatenates to what /detokenize returns for the same
// ids; greedy output is the same streamed and not; usage counts; logprob token strings use the
// same form; a string prompt, chat, /tokenize and response_format are 400 naming the missing
// tokenizer; bad ids are 400. On the fake engine: [ids] and [[ids]] prompts give the same
// answer as the same bytes as a string.
import { assert, check, eq, failures, parseSSE, postJSON, skip, startServer, TERN } from './harness.js';
import { existsSync } from 'node:fs';

if (!existsSync(TERN)) { skip('server_token_ids', 'build/tern not built'); process.exit(0); }

// ---- fake engine: ids == bytes + 3 (fake_engine.c) ----
{
  const srv = await startServer(['--fake-engine'], { TERN_FAKE_DELAY_MS: '0' });
  const U = srv.url;
  const ids = [1, ...Buffer.from('abc').map((b) => b + 3)];
  await check('ids_prompt_fake_engine', async () => {
    const a = await postJSON(`${U}/v1/completions`, { prompt: 'abc', max_tokens: 6, temperature: 0 });
    const b = await postJSON(`${U}/v1/completions`, { prompt: ids, max_tokens: 6, temperature: 0 });
    const c = await postJSON(`${U}/v1/completions`, { prompt: [ids], max_tokens: 6, temperature: 0 });
    for (const r of [a, b, c]) eq(r.status, 200, `status ${r.text.slice(0, 200)}`);
    eq(b.json.choices[0].text, a.json.choices[0].text, '[ids] vs string');
    eq(c.json.choices[0].text, a.json.choices[0].text, '[[ids]] vs string');
    eq(b.json.usage.prompt_tokens, a.json.usage.prompt_tokens, 'prompt_tokens');
    const s = await postJSON(`${U}/v1/completions`, { prompt: ids, max_tokens: 6, temperature: 0, stream: true });
    const ev = parseSSE(s.text);
    eq(ev[ev.length - 1].data, '[DONE]');
    eq(ev.slice(0, -1).map((e) => e.data.choices[0].text).join(''), a.json.choices[0].text, 'streamed');
  });
  await check('ids_prompt_errors', async () => {
    for (const [p, why] of [[[], 'empty'], [[1, 2.5], 'fraction'], [[1, 1e9], 'beyond vocab'], [[[1], [2]], 'two prompts'],
      [['a', 'b'], 'two strings'], [[1, 'a'], 'mixed']]) {
      const r = await postJSON(`${U}/v1/completions`, { prompt: p, max_tokens: 2 });
      eq(r.status, 400, `${why}: ${r.text.slice(0, 200)}`);
      eq(r.json.error.param, 'prompt', `${why} param`);
    }
  });
  await srv.stop();
}

// ---- a model without a tokenizer ----
let srv = null;
try {
  srv = await startServer(['random:glm5-tiny', '--threads', '1', '--max-concurrency', '4', '--max-ctx', '512']);
} catch (e) {
  if (/unknown preset/.test(String(e))) { skip('server_random_model', 'no glm5-tiny preset in this build'); process.exit(0); }
  throw e;
}
const U = srv.url;
const prompt = [5, 17, 99, 4000, 12, 7];
const idsOf = (text) => [...text.matchAll(/<(\d+)>/g)].map((m) => Number(m[1]));

await check('random_model_ids_text', async () => {
  const r = await postJSON(`${U}/v1/completions`, { prompt, max_tokens: 8, temperature: 0, ignore_eos: true });
  eq(r.status, 200, r.text.slice(0, 300));
  const text = r.json.choices[0].text;
  assert(/^(<\d+>){8}$/.test(text), `text is 8 "<id>" pieces: ${text}`);
  eq(r.json.usage.prompt_tokens, prompt.length, 'prompt_tokens');
  eq(r.json.usage.completion_tokens, 8, 'completion_tokens');
  eq(r.json.choices[0].finish_reason, 'length');
  const d = await postJSON(`${U}/detokenize`, { tokens: idsOf(text) });
  eq(d.status, 200, d.text);
  eq(d.json.content, text, '/detokenize gives the same text');
  const nested = await postJSON(`${U}/v1/completions`, { prompt: [prompt], max_tokens: 8, temperature: 0, ignore_eos: true });
  eq(nested.json.choices[0].text, text, '[[ids]] same greedy output');
  const s = await postJSON(`${U}/v1/completions`, {
    prompt, max_tokens: 8, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true },
  });
  eq(s.status, 200);
  const ev = parseSSE(s.text);
  eq(ev[ev.length - 1].data, '[DONE]');
  const chunks = ev.slice(0, -1).map((e) => e.data);
  eq(chunks.map((c) => c.choices[0].text).join(''), text, 'streamed text = non-streamed');
  eq(chunks[chunks.length - 1].usage.completion_tokens, 8, 'stream usage');
});

await check('random_model_logprobs', async () => {
  const r = await postJSON(`${U}/v1/completions`, { prompt, max_tokens: 3, temperature: 0, ignore_eos: true, logprobs: 2 });
  eq(r.status, 200, r.text.slice(0, 300));
  const lp = r.json.choices[0].logprobs;
  eq(lp.tokens.join(''), r.json.choices[0].text, 'tokens join to the text');
  for (const t of lp.tokens) assert(/^<\d+>$/.test(t), `token "${t}"`);
  for (const o of lp.top_logprobs) for (const k of Object.keys(o)) assert(/^<\d+>$/.test(k), `top "${k}"`);
});

await check('random_model_stop_string', async () => {
  const a = await postJSON(`${U}/v1/completions`, { prompt, max_tokens: 6, temperature: 0, ignore_eos: true });
  const ids = idsOf(a.json.choices[0].text);
  const r = await postJSON(`${U}/v1/completions`, { prompt, max_tokens: 6, temperature: 0, ignore_eos: true, stop: [`<${ids[2]}>`] });
  eq(r.status, 200, r.text.slice(0, 300));
  const want = ids.slice(0, ids.indexOf(ids[2])).map((i) => `<${i}>`).join('');
  eq(r.json.choices[0].text, want, 'text before the stop string');
  eq(r.json.choices[0].finish_reason, 'stop');
});

await check('random_model_text_apis_400', async () => {
  const bad = [
    ['/v1/completions', { prompt: 'hello', max_tokens: 2 }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }],
    ['/v1/messages', { max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }],
    ['/tokenize', { content: 'hi' }],
  ];
  for (const [path, body] of bad) {
    const r = await postJSON(`${U}${path}`, body);
    eq(r.status, 400, `${path}: ${r.text.slice(0, 200)}`);
    assert(/tokenizer/.test(r.text), `${path}: names the tokenizer: ${r.text.slice(0, 200)}`);
  }
  const ids = await postJSON(`${U}/v1/completions`, { prompt: [1, 1e6], max_tokens: 2 });
  eq(ids.status, 400, 'id beyond the vocabulary');
  const h = await fetch(`${U}/health`);
  eq(h.status, 200, 'still healthy');
});

await check('random_model_concurrent_streams', async () => {
  const one = (i) => postJSON(`${U}/v1/completions`, {
    prompt: [3 + i, 40, 41], max_tokens: 5, temperature: 0, ignore_eos: true, stream: true,
  });
  const rs = await Promise.all([0, 1, 2, 3, 4, 5].map(one));
  for (const r of rs) {
    eq(r.status, 200);
    const ev = parseSSE(r.text);
    eq(ev[ev.length - 1].data, '[DONE]');
    eq(idsOf(ev.slice(0, -1).map((e) => e.data.choices[0].text).join('')).length, 5, 'five ids');
  }
});

const code = await srv.stop();
if (code !== 0) console.log(`FAIL: random_model_clean_exit: exit ${code}`);
process.exit(failures() ? 1 : 0);
