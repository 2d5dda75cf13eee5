// http_api.mjs — end-to-end tests of `tern serve` over raw HTTP, against the fake engine
// (`--fake-engine`: byte tokenizer, fixed reply; see src/server/fake_engine.c), so every
// response can be checked exactly: shapes, streaming, stop strings with hold-back,
// logprobs, errors and abuse (malformed JSON, huge body, slow client, disconnect
// mid-stream, concurrency, auth).
import net from 'node:net';
import {
  FAKE_REPLY, assert, check, eq, failures, parseSSE, postJSON, rawRequest, skip, startServer, TERN,
} from './harness.js';
import { existsSync } from 'node:fs';

if (!existsSync(TERN)) { skip('server_http', 'build/tern not built'); process.exit(0); }
const srv = await startServer(['--fake-engine', '--timeout', '2', '--max-body', '1'], { TERN_FAKE_DELAY_MS: '1' });
const U = srv.url;
const user = (content) => ({ messages: [{ role: 'user', content }] });

await check('health_ok', async () => {
  const r = await fetch(`${U}/health`);
  eq(r.status, 200, 'status');
  eq(await r.text(), '{"status": "ok"}', 'body');
});

await check('models_list', async () => {
  const j = await (await fetch(`${U}/v1/models`)).json();
  eq(j.object, 'list');
  eq(j.data[0].id, 'fake');
  eq(j.data[0].object, 'model');
  const one = await fetch(`${U}/v1/models/fake`);
  eq(one.status, 200, 'models/fake');
  eq((await fetch(`${U}/v1/models/nope`)).status, 404, 'models/nope');
});

await check('chat_nonstream', async () => {
  const r = await postJSON(`${U}/v1/chat/completions`, { model: 'fake', ...user('hi') });
  eq(r.status, 200, 'status');
  const j = r.json;
  assert(/^chatcmpl-/.test(j.id), 'id');
  eq(j.object, 'chat.completion');
  eq(j.model, 'fake');
  eq(j.choices[0].message, { role: 'assistant', content: FAKE_REPLY });
  eq(j.choices[0].finish_reason, 'stop');
  eq(j.choices[0].index, 0);
  // fallback transcript "user: hi\nassistant:" = 19 bytes + BOS
  eq(j.usage.prompt_tokens, 20, 'prompt_tokens');
  eq(j.usage.completion_tokens, Buffer.byteLength(FAKE_REPLY), 'completion_tokens');
  eq(j.usage.total_tokens, j.usage.prompt_tokens + j.usage.completion_tokens);
  eq(j.usage.prompt_tokens_details.cached_tokens, 0);
});

await check('chat_stream', async () => {
  const r = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), stream: true, stream_options: { include_usage: true } });
  eq(r.status, 200);
  assert(r.headers.get('content-type').startsWith('text/event-stream'), 'content-type');
  const ev = parseSSE(r.text);
  eq(ev[ev.length - 1].data, '[DONE]', 'last event');
  const chunks = ev.slice(0, -1).map((e) => e.data);
  eq(chunks[0].choices[0].delta.role, 'assistant', 'first delta role');
  let text = '';
  for (const c of chunks) {
    eq(c.object, 'chat.completion.chunk');
    if (c.choices.length) text += c.choices[0].delta.content || '';
  }
  eq(text, FAKE_REPLY, 'streamed text');
  const fin = chunks[chunks.length - 2];
  eq(fin.choices[0].finish_reason, 'stop');
  const usage = chunks[chunks.length - 1];
  eq(usage.choices, [], 'usage chunk choices');
  eq(usage.usage.completion_tokens, Buffer.byteLength(FAKE_REPLY));
  assert(new Set(chunks.map((c) => c.id)).size === 1, 'one id');
});

await check('chat_max_tokens_length', async () => {
  const r = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), max_completion_tokens: 5 });
  eq(r.json.choices[0].message.content, 'Hello');
  eq(r.json.choices[0].finish_reason, 'length');
});

await check('chat_utf8_never_split', async () => {
  // "été ✓": 2- and 3-byte characters arrive one byte-token at a time; no U+FFFD may leak
  const r = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), stream: true });
  for (const e of parseSSE(r.text).slice(0, -1)) {
    const c = e.data.choices[0].delta.content || '';
    assert(!c.includes('\uFFFD'), `replacement char in delta ${JSON.stringify(c)}`);
  }
  const cut = Buffer.byteLength('Hello from tern! The quick brown fox jumps over the lazy dog. ') + 1; // inside "é"
  const r2 = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), max_tokens: cut });
  eq(r2.json.choices[0].finish_reason, 'length');
  assert(r2.json.choices[0].message.content.startsWith('Hello from tern!'), 'prefix');
});

await check('stop_strings_holdback', async () => {
  for (const stream of [false, true]) {
    const r = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), stop: ['zzz', 'fox j'], stream });
    let text;
    if (stream) {
      const ev = parseSSE(r.text).slice(0, -1).map((e) => e.data);
      text = ev.map((c) => c.choices[0].delta.content || '').join('');
      eq(ev[ev.length - 1].choices[0].finish_reason, 'stop');
    } else {
      text = r.json.choices[0].message.content;
      eq(r.json.choices[0].finish_reason, 'stop');
    }
    eq(text, 'Hello from tern! The quick brown ', `stream=${stream}`);
  }
  // a partial match ("fox x" never appears) must be released, not swallowed
  const r = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), stop: 'fox x' });
  eq(r.json.choices[0].message.content, FAKE_REPLY);
  // multi-byte stop string
  const r3 = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), stop: ['✓'] });
  eq(r3.json.choices[0].message.content, 'Hello from tern! The quick brown fox jumps over the lazy dog. été ');
});

await check('chat_logprobs', async () => {
  const r = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), max_tokens: 3, logprobs: true, top_logprobs: 2 });
  const lp = r.json.choices[0].logprobs.content;
  eq(lp.length, 3);
  eq(lp[0].token, 'H');
  eq(lp[0].logprob, -0.5);
  eq(lp[0].bytes, [72]);
  eq(lp[0].top_logprobs.length, 2);
  eq(lp[0].top_logprobs[0], { token: 'I', logprob: -1.0, bytes: [73] });
});

await check('completions', async () => {
  const r = await postJSON(`${U}/v1/completions`, { prompt: 'abc', max_tokens: 5 });
  eq(r.status, 200);
  eq(r.json.object, 'text_completion');
  eq(r.json.choices[0].text, 'Hello');
  eq(r.json.choices[0].finish_reason, 'length');
  eq(r.json.usage.prompt_tokens, 4);
  const ids = await postJSON(`${U}/v1/completions`, { prompt: [1, 100, 101], max_tokens: 2 });
  eq(ids.json.usage.prompt_tokens, 3);
  const s = await postJSON(`${U}/v1/completions`, { prompt: 'abc', stream: true, stop: ['tern'] });
  const ev = parseSSE(s.text);
  eq(ev[ev.length - 1].data, '[DONE]');
  eq(ev.slice(0, -1).map((e) => e.data.choices[0].text).join(''), 'Hello from ');
});

await check('anthropic_messages', async () => {
  const r = await postJSON(`${U}/v1/messages`, {
    model: 'fake', max_tokens: 100, system: 'be brief', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }],
  });
  eq(r.status, 200);
  eq(r.json.type, 'message');
  eq(r.json.role, 'assistant');
  eq(r.json.content, [{ type: 'text', text: FAKE_REPLY }]);
  eq(r.json.stop_reason, 'end_turn');
  eq(r.json.stop_sequence, null);
  assert(/^msg_/.test(r.json.id), 'id');
  const s = await postJSON(`${U}/v1/messages`, { max_tokens: 100, stop_sequences: ['lazy'], messages: [{ role: 'user', content: 'hi' }] });
  eq(s.json.stop_reason, 'stop_sequence');
  eq(s.json.stop_sequence, 'lazy');
  eq(s.json.content[0].text, 'Hello from tern! The quick brown fox jumps over the ');
});

await check('anthropic_stream_event_order', async () => {
  const r = await postJSON(`${U}/v1/messages`, { max_tokens: 6, stream: true, messages: [{ role: 'user', content: 'hi' }] });
  const ev = parseSSE(r.text);
  const names = ev.map((e) => e.event);
  const squash = names.filter((n, i) => n !== 'content_block_delta' || names[i - 1] !== 'content_block_delta');
  eq(squash, ['message_start', 'content_block_start', 'ping', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop']);
  for (const e of ev) eq(e.data.type, e.event, 'data.type matches event');
  eq(ev.filter((e) => e.event === 'content_block_delta').map((e) => e.data.delta.text).join(''), 'Hello ');
  const md = ev.find((e) => e.event === 'message_delta').data;
  eq(md.delta.stop_reason, 'max_tokens');
  eq(md.usage.output_tokens, 6);
  eq(ev[0].data.message.usage.input_tokens > 0, true);
});

await check('tokenize_detokenize', async () => {
  const t = await postJSON(`${U}/tokenize`, { content: 'ab' });
  eq(t.json.tokens, [1, 100, 101]);
  const d = await postJSON(`${U}/detokenize`, { tokens: [100, 101] });
  eq(d.json.content, 'ab');
  eq((await postJSON(`${U}/detokenize`, { tokens: [1e9] })).status, 400);
});

await check('metrics_and_stats', async () => {
  const m = await (await fetch(`${U}/metrics`)).text();
  assert(/^tern_requests_done_total \d+$/m.test(m), 'done counter');
  assert(/^# TYPE tern_generated_tokens_total counter$/m.test(m), 'TYPE line');
  const s = await (await fetch(`${U}/stats`)).json();
  eq(s.status, 'ok');
  eq(s.model.id, 'fake');
  assert(s.engine.requests_done > 0, 'requests_done');
});

// ---- errors: every one is a 400/404/405/413 with the API's error shape ----
const openaiErr = (r, status, param) => {
  eq(r.status, status, `status for ${r.text.slice(0, 200)}`);
  assert(r.json && r.json.error && typeof r.json.error.message === 'string', `error shape: ${r.text}`);
  assert('type' in r.json.error && 'param' in r.json.error && 'code' in r.json.error, 'error fields');
  if (param !== undefined) eq(r.json.error.param, param, 'param');
};

await check('errors_bad_json_and_types', async () => {
  openaiErr(await postJSON(`${U}/v1/chat/completions`, '{"messages": [}'), 400);
  openaiErr(await postJSON(`${U}/v1/chat/completions`, ''), 400);
  openaiErr(await postJSON(`${U}/v1/chat/completions`, '[1,2]'), 400);
  openaiErr(await postJSON(`${U}/v1/chat/completions`, '"\u0000\xff\xfe'), 400);
  openaiErr(await postJSON(`${U}/v1/chat/completions`, { messages: 'hi' }), 400, 'messages');
  openaiErr(await postJSON(`${U}/v1/chat/completions`, { messages: [] }), 400, 'messages');
  openaiErr(await postJSON(`${U}/v1/chat/completions`, { messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages');
  openaiErr(await postJSON(`${U}/v1/chat/completions`, { messages: [{ role: 'user', content: 5 }] }), 400, 'messages');
  openaiErr(await postJSON(`${U}/v1/chat/completions`, { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'messages');
});

await check('errors_absurd_numbers', async () => {
  const cases = [
    [{ max_tokens: -1 }, 'max_tokens'], [{ max_tokens: 1e12 }, 'max_tokens'], [{ max_tokens: 2.5 }, 'max_tokens'],
    [{ max_tokens: '10' }, 'max_tokens'], [{ temperature: -3 }, 'temperature'], [{ temperature: 'hot' }, 'temperature'],
    [{ top_p: 0 }, 'top_p'], [{ top_p: 1.5 }, 'top_p'], [{ top_k: -5 }, 'top_k'], [{ min_p: 2 }, 'min_p'],
    [{ n: 2 }, 'n'], [{ presence_penalty: 9 }, 'presence_penalty'], [{ logit_bias: { abc: 1 } }, 'logit_bias'],
    [{ logit_bias: { 5: 1000 } }, 'logit_bias'], [{ logit_bias: { 99999999: 1 } }, 'logit_bias'],
    [{ stop: 5 }, 'stop'], [{ stop: [''] }, 'stop'], [{ top_logprobs: 50, logprobs: true }, 'top_logprobs'],
    [{ stream: 'yes' }, 'stream'], [{ response_format: { type: 'xml' } }, 'response_format'],
    [{ seed: 1.5 }, 'seed'],
  ];
  for (const [extra, param] of cases) openaiErr(await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), ...extra }), 400, param);
  const m = await postJSON(`${U}/v1/chat/completions`, { ...user('hi'), model: 'gpt-17' });
  openaiErr(m, 404, 'model');
  eq(m.json.error.code, 'model_not_found');
  openaiErr(await postJSON(`${U}/v1/completions`, { prompt: 'x', echo: true }), 400, 'echo');
  openaiErr(await postJSON(`${U}/v1/completions`, {}), 400, 'prompt');
  openaiErr(await postJSON(`${U}/v1/completions`, { prompt: [1, -4] }), 400, 'prompt');
});

await check('errors_anthropic_shape', async () => {
  for (const body of [{ messages: [{ role: 'user', content: 'hi' }] }, { max_tokens: 0, messages: [] }, '{oops',
    { max_tokens: 10, messages: [{ role: 'system', content: 'x' }] }, { max_tokens: 10, temperature: 1.5, messages: [{ role: 'user', content: 'x' }] },
    { max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }]) {
    const r = await postJSON(`${U}/v1/messages`, body);
    eq(r.status, 400, `status for ${JSON.stringify(body)}`);
    eq(r.json.type, 'error');
    eq(r.json.error.type, 'invalid_request_error');
    assert(typeof r.json.error.message === 'string', 'message');
  }
});

await check('errors_route_method', async () => {
  const r = await fetch(`${U}/v1/nothing`);
  eq(r.status, 404);
  assert((await r.json()).error.message, 'message');
  eq((await fetch(`${U}/v1/chat/completions`)).status, 405);
  eq((await fetch(`${U}/health`, { method: 'POST', body: '{}' })).status, 405);
  const o = await fetch(`${U}/v1/chat/completions`, { method: 'OPTIONS' });
  eq(o.status, 204);
  eq(o.headers.get('access-control-allow-origin'), '*');
});

await check('body_limit_413', async () => {
  const big = JSON.stringify({ ...user('x'.repeat(2 << 20)) });       // 2 MiB > --max-body 1 MB
  const r = await rawRequest(srv.port, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${big.length}\r\n\r\n${big}`);
  assert(r.data.startsWith('HTTP/1.1 413'), `got ${r.data.slice(0, 80)}`);
  // chunked body growing past the limit
  const chunk = 'a'.repeat(256 << 10);
  let payload = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n';
  for (let i = 0; i < 6; i++) payload += `${chunk.length.toString(16)}\r\n${chunk}\r\n`;
  payload += '0\r\n\r\n';
  const c = await rawRequest(srv.port, payload);
  assert(c.data.startsWith('HTTP/1.1 413'), `chunked: got ${c.data.slice(0, 80)}`);
});

await check('slow_client_times_out', async () => {
  // a request that never finishes its headers is closed after --timeout 2 s ...
  const slow = rawRequest(srv.port, 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le', { timeoutMs: 8000 });
  // ... while other clients are served meanwhile
  const ok = await postJSON(`${srv.url}/v1/chat/completions`, { ...user('hi'), max_tokens: 3 });
  eq(ok.status, 200, 'concurrent request');
  const r = await slow;
  assert(r.closed && r.ms < 7000, `slow connection not closed (closed=${r.closed}, ${r.ms} ms)`);
});

await check('disconnect_mid_stream_then_serve', async () => {
  const before = (await (await fetch(`${U}/stats`)).json()).engine.requests_cancelled;
  const body = JSON.stringify({ ...user('hi'), stream: true, ignore_eos: true, max_tokens: 3000 });
  await new Promise((resolve, reject) => {
    const s = net.connect(srv.port, '127.0.0.1', () => {
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
    });
    let got = '';
    s.on('data', (d) => { got += d; if ((got.match(/data: /g) || []).length > 5) { s.destroy(); resolve(); } });
    s.on('error', reject);
    setTimeout(() => reject(new Error('no stream data')), 5000);
  });
  let cancelled = before;
  for (let i = 0; i < 100 && cancelled === before; i++) {
    await new Promise((r) => setTimeout(r, 50));
    cancelled = (await (await fetch(`${U}/stats`)).json()).engine.requests_cancelled;
  }
  assert(cancelled > before, 'request was not cancelled after the client left');
  const st = await (await fetch(`${U}/stats`)).json();
  eq(st.engine.running, 0, 'nothing left running');
  const r = await postJSON(`${U}/v1/chat/completions`, user('hi'));
  eq(r.json.choices[0].message.content, FAKE_REPLY, 'next request');
  // non-streaming request abandoned by its client is cancelled too
  const ac = new AbortController();
  const p = fetch(`${U}/v1/chat/completions`, { method: 'POST', body: body.replace('"stream":true', '"stream":false'), signal: ac.signal }).catch(() => null);
  await new Promise((r2) => setTimeout(r2, 100));
  ac.abort();
  await p;
  let c2 = cancelled;
  for (let i = 0; i < 100 && c2 === cancelled; i++) {
    await new Promise((r2) => setTimeout(r2, 50));
    c2 = (await (await fetch(`${U}/stats`)).json()).engine.requests_cancelled;
  }
  assert(c2 > cancelled, 'non-stream request not cancelled');
});

await check('concurrent_requests', async () => {
  const rs = await Promise.all(Array.from({ length: 12 }, (_, i) => postJSON(`${U}/v1/chat/completions`, { ...user(`hi ${i}`), stream: i % 2 === 0 })));
  for (const [i, r] of rs.entries()) {
    eq(r.status, 200, `request ${i}`);
    const text = i % 2 === 0
      ? parseSSE(r.text).slice(0, -1).map((e) => e.data.choices[0].delta.content || '').join('')
      : r.json.choices[0].message.content;
    eq(text, FAKE_REPLY, `request ${i} text`);
  }
});

await check('server_alive_after_abuse', async () => {
  assert(srv.alive(), 'server died');
  eq((await fetch(`${U}/health`)).status, 200);
});

// ---- auth ----
const auth = await startServer(['--fake-engine', '--api-key', 'sekret'], { TERN_FAKE_DELAY_MS: '0' });
await check('auth_api_key', async () => {
  eq((await fetch(`${auth.url}/health`)).status, 200, 'health open');
  const no = await postJSON(`${auth.url}/v1/chat/completions`, user('hi'));
  eq(no.status, 401, 'no key');
  eq(no.json.error.code, 'invalid_api_key');
  eq((await postJSON(`${auth.url}/v1/chat/completions`, user('hi'), { authorization: 'Bearer wrong' })).status, 401, 'wrong key');
  eq((await postJSON(`${auth.url}/v1/chat/completions`, user('hi'), { authorization: 'Bearer sekret' })).status, 200, 'bearer');
  eq((await postJSON(`${auth.url}/v1/messages`, { max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }, { 'x-api-key': 'sekret' })).status, 200, 'x-api-key');
  const an = await postJSON(`${auth.url}/v1/messages`, { max_tokens: 5, messages: [] });
  eq(an.status, 401);
  eq(an.json.error.type, 'authentication_error');
  eq((await fetch(`${auth.url}/v1/models`)).status, 401, 'models needs key');
});

await check('clean_shutdown', async () => {
  eq(await auth.stop(), 0, 'exit status (auth server)');
  eq(await srv.stop(), 0, 'exit status');
});
process.exit(failures() ? 1 : 0);
