// abuse.mjs — thousands of bad requests in a row against `tern serve` on a real model, each
// answered with the right status (and the field it names), while a good client keeps getting
// the same correct answer: malformed JSON, wrong types, unknown fields (ignored), negative and
// absurd numbers, invalid UTF-8, deep nesting, oversized bodies, bad routes and methods,
// requests that can never fit, plus slow clients (headers trickled, then abandoned) and
// vanishing clients (half a body, a request and gone, a stream cut after its first bytes).
// 2000 small requests go over a few keep-alive connections so the run stays short. At the end
// nothing may be left running and every KV block must be free again.
import net from 'node:net';
import { existsSync } from 'node:fs';
import {
  assert, check, eq, failures, keepAliveClient, postJSON, rawPost, rawRequest, skip, startServer, TERN,
} from './harness.js';
import { makeFixture } from './fixture.js';

if (!existsSync(TERN)) { skip('server_abuse', 'build/tern not built'); process.exit(0); }
const N_BAD = Number(process.env.TERN_ABUSE_N || 2000);

const fx = makeFixture();
const srv = await startServer([fx.dir, '--threads', '1', '--timeout', '2', '--max-body', '1']);
const U = srv.url;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const stats = async () => (await (await fetch(`${U}/stats`)).json()).engine;
const M = (content) => [{ role: 'user', content }];
const GOOD = { messages: M('the good client asks'), max_tokens: 12, temperature: 0 };
const ref = await postJSON(`${U}/v1/chat/completions`, GOOD);
const REF = ref.json?.choices?.[0]?.message?.content;

// [name, path, body (object | string | Buffer), status, param (undefined: not checked), api]
const chat = '/v1/chat/completions';
const bad = (over) => ({ messages: M('hi'), max_tokens: 2, ...over });
const utf8Bad = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"ab'), Buffer.from([0xff, 0xfe]), Buffer.from('"}],"max_tokens":2}')]);
const utf8Over = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}]}')]);
const utf8Sur = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}]}')]);
const utf8Key = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"x"}],"'), Buffer.from([0xe2, 0x82]), Buffer.from('":1}')]);
const CASES = [
  ['malformed_json', chat, '{"messages": [', 400, ''],
  ['trailing_data', chat, JSON.stringify(bad({})) + ' {}', 400, ''],
  ['not_an_object', chat, '[1, 2, 3]', 400, ''],
  ['empty_body', chat, '', 400, ''],
  ['just_null', chat, 'null', 400, ''],
  ['deep_nesting', chat, '['.repeat(5000) + ']'.repeat(5000), 400, ''],
  ['messages_string', chat, { messages: 'hi' }, 400, 'messages'],
  ['messages_missing', chat, { max_tokens: 2 }, 400, 'messages'],
  ['content_number', chat, { messages: [{ role: 'user', content: 5 }] }, 400, undefined],
  ['role_unknown', chat, { messages: [{ role: 'wizard', content: 'x' }] }, 400, undefined],
  ['temperature_string', chat, bad({ temperature: 'hot' }), 400, 'temperature'],
  ['temperature_negative', chat, bad({ temperature: -3 }), 400, 'temperature'],
  ['temperature_absurd', chat, '{"messages":[{"role":"user","content":"hi"}],"temperature":1e308}', 400, 'temperature'],
  ['temperature_overflow', chat, '{"messages":[{"role":"user","content":"hi"}],"temperature":1e999}', 400, 'temperature'],
  ['max_tokens_negative', chat, bad({ max_tokens: -1 }), 400, 'max_tokens'],
  ['max_tokens_zero', chat, bad({ max_tokens: 0 }), 400, 'max_tokens'],
  ['max_tokens_absurd', chat, bad({ max_tokens: 1e300 }), 400, 'max_tokens'],
  ['max_tokens_fraction', chat, bad({ max_tokens: 1.5 }), 400, 'max_tokens'],
  ['max_tokens_string', chat, bad({ max_tokens: '10' }), 400, 'max_tokens'],
  ['top_p_2', chat, bad({ top_p: 2 }), 400, 'top_p'],
  ['top_k_negative', chat, bad({ top_k: -5 }), 400, 'top_k'],
  ['min_p_negative', chat, bad({ min_p: -0.5 }), 400, 'min_p'],
  ['seed_huge', chat, bad({ seed: 1e30 }), 400, 'seed'],
  ['seed_string', chat, bad({ seed: 'abc' }), 400, 'seed'],
  ['presence_penalty_99', chat, bad({ presence_penalty: 99 }), 400, 'presence_penalty'],
  ['logit_bias_id', chat, bad({ logit_bias: { 99999: 1 } }), 400, 'logit_bias'],
  ['logit_bias_array', chat, bad({ logit_bias: [] }), 400, 'logit_bias'],
  ['stop_number', chat, bad({ stop: 5 }), 400, 'stop'],
  ['stop_too_many', chat, bad({ stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }), 400, 'stop'],
  ['n_2', chat, bad({ n: 2 }), 400, 'n'],
  ['stream_string', chat, bad({ stream: 'yes' }), 400, 'stream'],
  ['top_logprobs_50', chat, bad({ logprobs: true, top_logprobs: 50 }), 400, 'top_logprobs'],
  ['response_format_bad', chat, bad({ response_format: { type: 'yaml' } }), 400, undefined],
  ['tools_not_array', chat, bad({ tools: 'x' }), 400, undefined],
  ['utf8_invalid_bytes', chat, utf8Bad, 400, 'messages[0].content'],
  ['utf8_overlong', chat, utf8Over, 400, 'messages[0].content'],
  ['utf8_surrogate', chat, utf8Sur, 400, 'messages[0].content'],
  ['utf8_bad_key', chat, utf8Key, 400, undefined],
  ['utf8_lone_escape', chat, '{"messages":[{"role":"user","content":"\\ud800"}]}', 400, undefined],
  ['model_unknown', chat, bad({ model: 'nope' }), 404, 'model'],
  ['never_fits', chat, bad({ max_tokens: 4096 }), 400, 'max_tokens'],
  ['prompt_too_long', '/v1/completions', { prompt: 'q'.repeat(5000), max_tokens: 1 }, 400, undefined],
  ['completions_prompt_number', '/v1/completions', { prompt: 5 }, 400, 'prompt'],
  ['completions_ids_out_of_range', '/v1/completions', { prompt: [99999], max_tokens: 1 }, 400, undefined],
  ['anthropic_no_max_tokens', '/v1/messages', { messages: M('x') }, 400, 'anthropic'],
  ['anthropic_temperature_5', '/v1/messages', { max_tokens: 2, temperature: 5, messages: M('x') }, 400, 'anthropic'],
  ['anthropic_bad_block', '/v1/messages', { max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'nope' }] }] }, 400, 'anthropic'],
  ['responses_bad_input', '/v1/responses', { input: 5 }, 400, undefined],
  ['tokenize_wrong_type', '/tokenize', { content: 5 }, 400, undefined],
  ['detokenize_bad_ids', '/detokenize', { tokens: [-1, 'x'] }, 400, undefined],
  ['unknown_route', '/v1/nothing', {}, 404, ''],
  ['unknown_fields_ignored', chat, { ...GOOD, frobnicate: { x: [1, 2] }, another_unknown: null }, 200, 'good'],
];

// the good client: the same greedy request again and again while the abuse runs
let goodN = 0, goodBad = 0, stopGood = false;
const goodLoop = (async () => {
  while (!stopGood) {
    const r = await postJSON(`${U}/v1/chat/completions`, GOOD);
    goodN++;
    if (r.status !== 200 || r.json?.choices?.[0]?.message?.content !== REF) goodBad++;
    await sleep(5);
  }
})();

await check('reference_answer', async () => {
  eq(ref.status, 200, 'status');
  assert(typeof REF === 'string' && REF.length > 0, 'empty reference');
});

// slow and vanishing clients, in the background while the flood runs
const side = (async () => {
  const slow = [0, 1].map(() => rawRequest(srv.port, 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le', { timeoutMs: 8000 }));
  const halfBody = Array.from({ length: 20 }, () => new Promise((resolve) => {
    const s = net.connect(srv.port, '127.0.0.1', () => {
      s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"messages": [');
      setTimeout(() => { s.destroy(); resolve(); }, 20);
    });
    s.on('error', resolve);
  }));
  const fireAndGo = Array.from({ length: 20 }, () => new Promise((resolve) => {
    const s = net.connect(srv.port, '127.0.0.1', () => {
      s.write(rawPost(chat, { messages: M('gone'), max_tokens: 200, ignore_eos: true }));
      s.destroy();
      resolve();
    });
    s.on('error', resolve);
  }));
  const cutStreams = Array.from({ length: 10 }, () => new Promise((resolve) => {
    const s = net.connect(srv.port, '127.0.0.1', () => s.write(rawPost(chat, { messages: M('cut'), max_tokens: 3000, ignore_eos: true, stream: true })));
    s.on('data', () => { s.destroy(); resolve(); });
    s.on('error', resolve);
    setTimeout(() => { s.destroy(); resolve(); }, 5000);
  }));
  await Promise.all([...halfBody, ...fireAndGo, ...cutStreams]);
  return Promise.all(slow);
})();

const tally = {};
const wrong = [];
await check(`bad_requests_x${N_BAD}`, async () => {
  const clients = Array.from({ length: 4 }, () => keepAliveClient(srv.port));
  let next = 0;
  await Promise.all(clients.map(async (c) => {
    for (;;) {
      const i = next++;
      if (i >= N_BAD) break;
      const [name, path, body, status, param] = CASES[i % CASES.length];
      const r = await c.send(rawPost(path, body));
      let j = null;
      try { j = JSON.parse(r.body); } catch { /* checked below */ }
      let ok = r.status === status && j !== null;
      if (ok && param === 'anthropic') ok = j.type === 'error' && j.error?.type === 'invalid_request_error';
      else if (ok && param === 'good') ok = j.choices?.[0]?.message?.content === REF;
      else if (ok && status >= 400) ok = typeof j.error?.message === 'string' && (param === undefined || (j.error.param ?? '') === param);
      tally[name] = (tally[name] || 0) + 1;
      if (!ok && wrong.length < 10) wrong.push(`${name}: ${r.status} ${r.body.slice(0, 160)}`);
    }
  }));
  clients.forEach((c) => c.close());
  assert(wrong.length === 0, `wrong answers: ${wrong.join(' || ')}`);
  eq(Object.keys(tally).length, CASES.length, 'every case ran');
});

await check('huge_bodies_413', async () => {
  const big = JSON.stringify({ messages: M('x'.repeat(3 << 20)) });        // 3 MiB > --max-body 1 MB
  for (let i = 0; i < 3; i++) {
    const r = await rawRequest(srv.port, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${big.length}\r\n\r\n${big}`);
    assert(r.data.startsWith('HTTP/1.1 413'), `got ${r.data.slice(0, 80)}`);
  }
  const claim = await rawRequest(srv.port, 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{');
  assert(claim.data.startsWith('HTTP/1.1 413'), `absurd Content-Length: ${claim.data.slice(0, 80)}`);
  const garbage = await rawRequest(srv.port, 'NOT HTTP AT ALL\r\n\r\n');
  assert(/^HTTP\/1\.[01] 4\d\d/.test(garbage.data) || garbage.closed, `garbage: ${garbage.data.slice(0, 80)}`);
});

await check('slow_and_vanishing_clients', async () => {
  const slow = await side;
  for (const r of slow) assert(r.closed && r.ms < 7000, `slow client not closed (${r.ms} ms)`);
});

await check('good_client_unharmed', async () => {
  stopGood = true;
  await goodLoop;
  eq(goodBad, 0, `wrong answers out of ${goodN}`);
  assert(goodN >= 5, `only ${goodN} good requests ran`);
  console.log(`# ${N_BAD} bad requests (${CASES.length} kinds) + ${goodN} good ones, all answered correctly`);
});

await check('nothing_left_behind', async () => {
  let st = await stats();
  for (let i = 0; i < 300 && (st.running || st.waiting || st.kv_blocks_used); i++) { await sleep(10); st = await stats(); }
  eq([st.running, st.waiting, st.kv_blocks_used], [0, 0, 0], 'running, waiting, KV blocks in use');
  assert(srv.alive(), 'server died');
  eq(await srv.stop(), 0, 'exit status');
});
fx.cleanup();
process.exit(failures() ? 1 : 0);
