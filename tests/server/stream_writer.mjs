// stream_writer.mjs — the SSE stream writer (src/server/sse.c): one thread sends every stream's
// events, woken once per engine step; the HTTP thread of a stream hands its socket over. Checked
// against the fake engine (1 ms steps, fixed reply):
//  - 48 concurrent streams each get exactly the reply, in order, with [DONE];
//  - a reader that stops reading (server send buffer shrunk with TERN_SSE_SNDBUF, so sends hit
//    EAGAIN) still gets every token once it reads again, events merged while it was blocked;
//  - the same keep-alive connection serves a stream, then a plain request, then another stream;
//  - an HTTP/1.0 client (no chunked encoding) gets its stream from its own MHD thread;
//  - a client that vanishes mid-stream is counted (tern_http_disconnects_total) and its request
//    cancelled (running goes back to 0), and the server keeps serving.
import net from 'node:net';
import {
  FAKE_REPLY, assert, check, eq, failures, keepAliveClient, parseSSE, postJSON, rawPost, skip, startServer, TERN,
} from './harness.js';
import { existsSync } from 'node:fs';

if (!existsSync(TERN)) { skip('server_stream_writer', 'build/tern not built'); process.exit(0); }
const srv = await startServer(['--fake-engine', '--max-concurrency', '64'], { TERN_FAKE_DELAY_MS: '1', TERN_SSE_SNDBUF: '4096' });
const U = srv.url;
const textOf = (body) => {
  const ev = parseSSE(body);
  eq(ev[ev.length - 1].data, '[DONE]', 'ends with [DONE]');
  return ev.slice(0, -1).map((e) => e.data.choices[0].text ?? e.data.choices[0].delta?.content ?? '').join('');
};

await check('writer_many_streams', async () => {
  const one = (i) => postJSON(`${U}/v1/completions`, { prompt: `p${i}`, max_tokens: 400, stream: true });
  const rs = await Promise.all(Array.from({ length: 48 }, (_, i) => one(i)));
  for (const r of rs) {
    eq(r.status, 200);
    eq(textOf(r.text), FAKE_REPLY, 'reply');
  }
  const chat = await Promise.all(Array.from({ length: 8 }, () => postJSON(`${U}/v1/chat/completions`, {
    messages: [{ role: 'user', content: 'hi' }], stream: true,
  })));
  for (const r of chat) eq(textOf(r.text), FAKE_REPLY, 'chat reply');
});

await check('writer_blocked_reader', async () => {
  // ~1 kB per token event with logprobs: 1500 tokens overflow the client's receive buffer
  // and the 4 kB send buffer while this client does not read
  const body = JSON.stringify({ prompt: 'x', max_tokens: 1500, ignore_eos: true, stream: true, logprobs: 5 });
  const got = await new Promise((resolve, reject) => {
    const s = net.connect(srv.port, '127.0.0.1');
    const parts = [];
    s.on('connect', () => {
      s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      s.pause();
      setTimeout(() => s.resume(), 1500);
    });
    s.on('data', (d) => parts.push(d));
    s.on('error', reject);
    s.on('close', () => resolve(Buffer.concat(parts)));
    setTimeout(() => { s.destroy(); reject(new Error('no end within 20 s')); }, 20000);
  });
  const he = got.indexOf('\r\n\r\n');
  assert(/^HTTP\/1\.1 200/.test(got.subarray(0, 20).toString('latin1')), got.subarray(0, 100).toString('latin1'));
  let p = he + 4;
  const parts = [];
  for (;;) {                                        // de-chunk (sizes are in bytes)
    const le = got.indexOf('\r\n', p);
    const n = parseInt(got.subarray(p, le).toString('latin1'), 16);
    if (!n) break;
    parts.push(got.subarray(le + 2, le + 2 + n));
    p = le + 2 + n + 2;
  }
  const payload = Buffer.concat(parts).toString('utf8');
  const ev = parseSSE(payload);
  eq(ev[ev.length - 1].data, '[DONE]', 'ends with [DONE]');
  const chunks = ev.slice(0, -1).map((e) => e.data);
  const ntok = chunks.reduce((a, c) => a + (c.choices[0].logprobs ? c.choices[0].logprobs.tokens.length : 0), 0);
  eq(ntok, 1500, 'every token arrived');
  assert(chunks.length < 1500, `events were merged while blocked (${chunks.length})`);
  eq(chunks[chunks.length - 1].choices[0].finish_reason, 'length');
});

await check('writer_keep_alive_reuse', async () => {
  const c = keepAliveClient(srv.port);
  const a = await c.send(rawPost('/v1/completions', { prompt: 'a', max_tokens: 5, stream: true }));
  eq(a.status, 200);
  eq(textOf(a.body), FAKE_REPLY.slice(0, 5));
  const h = await c.send('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
  eq(h.status, 200, 'plain request after a stream');
  eq(h.closed, false, 'connection kept');
  const b = await c.send(rawPost('/v1/completions', { prompt: 'b', max_tokens: 7, stream: true }));
  eq(textOf(b.body), FAKE_REPLY.slice(0, 7));
  c.close();
});

await check('writer_http10_unchunked', async () => {
  // HTTP/1.0 has no chunked encoding: that stream stays on its MHD thread, body until close
  const body = JSON.stringify({ prompt: 'x', max_tokens: 6, stream: true });
  const got = await new Promise((resolve, reject) => {
    const s = net.connect(srv.port, '127.0.0.1');
    const parts = [];
    s.on('connect', () => s.write(`POST /v1/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${body.length}\r\n\r\n${body}`));
    s.on('data', (d) => parts.push(d));
    s.on('error', reject);
    s.on('close', () => resolve(Buffer.concat(parts).toString('utf8')));
  });
  const he = got.indexOf('\r\n\r\n');
  assert(!/transfer-encoding/i.test(got.slice(0, he)), 'no chunked encoding for HTTP/1.0');
  eq(textOf(got.slice(he + 4)), FAKE_REPLY.slice(0, 6));
});

await check('writer_client_vanishes', async () => {
  const metric = async (name) => {
    const t = await (await fetch(`${U}/metrics`)).text();
    const m = t.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  const before = await metric('tern_http_disconnects_total');
  const body = JSON.stringify({ prompt: 'x', max_tokens: 4000, ignore_eos: true, stream: true });
  await new Promise((resolve) => {
    const s = net.connect(srv.port, '127.0.0.1');
    s.on('connect', () => s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${body.length}\r\n\r\n${body}`));
    s.once('data', () => setTimeout(() => { s.destroy(); resolve(); }, 100));
    s.on('error', () => {});
  });
  let after = before, running = 1;
  for (let i = 0; i < 100 && (after === before || running); i++) {
    await new Promise((r) => setTimeout(r, 50));
    after = await metric('tern_http_disconnects_total');
    running = await metric('tern_requests_running');
  }
  eq(after, before + 1, 'disconnect counted');
  if (!Number.isNaN(running)) eq(running, 0, 'request cancelled');
  const r = await postJSON(`${U}/v1/completions`, { prompt: 'a', max_tokens: 3 });
  eq(r.json.choices[0].text, FAKE_REPLY.slice(0, 3), 'still serving');
});

const code = await srv.stop();
if (code !== 0) console.log(`FAIL: writer_clean_exit: exit ${code}`);
process.exit(failures() ? 1 : 0);
