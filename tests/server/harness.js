// harness.js — shared helpers for the server tests (not a test itself: run.sh runs *.mjs).
// startServer() spawns `build/tern serve ... --port 0`, reads the port from the
// "listening on http://HOST:PORT" line (printed once the model is ready, after the start-up
// report: srv.stdout()), and waits for /health 200. keepAliveClient() speaks HTTP/1.1 over
// one raw socket, request after request (for the abuse tests). Results are printed as
// PASS:/FAIL:/SKIP: lines, the format tests/run.sh counts.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const TERN = process.env.TERN_BIN || path.join(ROOT, 'build', 'tern');  // TERN_BIN: e.g. a sanitizer build

let nfail = 0;
export function pass(name) { console.log(`PASS: ${name}`); }
export function fail(name, why) { nfail++; console.log(`FAIL: ${name}: ${why}`); }
export function skip(name, why) { console.log(`SKIP: ${name}: ${why}`); }
export function failures() { return nfail; }
export async function check(name, fn) {
  try {
    await fn();
    pass(name);
  } catch (e) {
    fail(name, (e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : String(e)).slice(0, 600));
  }
}
export function assert(cond, msg) { if (!cond) throw new Error(msg || 'assertion failed'); }
export function eq(a, b, msg) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg || 'mismatch'}: got ${sa.slice(0, 300)}, want ${sb.slice(0, 300)}`);
}

export async function startServer(args, env = {}, timeoutMs = 60000) {
  if (!existsSync(TERN)) throw new Error(`${TERN} not built`);
  const proc = spawn(TERN, ['serve', ...args, '--port', '0'], {
    env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '', stdout = '';
  proc.stdout.on('data', (d) => { stdout += d; });
  proc.stderr.on('data', (d) => { stderr += d; if (process.env.TERN_TEST_VERBOSE) process.stderr.write(d); });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error(`no "listening on" line within ${timeoutMs} ms; stderr: ${stderr}`)), timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/^listening on (http:\/\/\S+:(\d+))$/m);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(t); reject(new Error(`server exited (${code}): ${stderr}`)); });
  });
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch { /* not yet */ }
    if (Date.now() > deadline) throw new Error('server never became healthy');
    await new Promise((r) => setTimeout(r, 50));
  }
  const srv = {
    url, proc, port: Number(new URL(url).port), host: new URL(url).hostname,
    stderr: () => stderr,
    stdout: () => stdout,
    alive: () => proc.exitCode === null && proc.signalCode === null,
    async stop() {
      if (!srv.alive()) return proc.exitCode;
      proc.kill('SIGTERM');
      return await new Promise((resolve) => {
        const t = setTimeout(() => { proc.kill('SIGKILL'); }, 5000);
        proc.on('exit', (code, sig) => { clearTimeout(t); resolve(sig ? sig : code); });
      });
    },
  };
  return srv;
}

export async function postJSON(url, body, headers = {}) {
  const r = await fetch(url, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

// Parse an SSE body into [{event, data}] (data parsed as JSON when possible).
export function parseSSE(text) {
  const out = [];
  for (const block of text.split('\n\n')) {
    if (!block.trim()) continue;
    let event = null; const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('event: ')) event = line.slice(7);
      else if (line.startsWith('data: ')) data.push(line.slice(6));
    }
    const d = data.join('\n');
    let parsed = d;
    try { parsed = JSON.parse(d); } catch { /* [DONE] */ }
    out.push({ event, data: parsed });
  }
  return out;
}

// Raw TCP request; resolves with everything the server sent before closing (or timeout).
export function rawRequest(port, payload, { timeoutMs = 5000, host = '127.0.0.1' } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(port, host);
    let buf = '';
    const t0 = Date.now();
    const t = setTimeout(() => { s.destroy(); resolve({ data: buf, closed: false, ms: Date.now() - t0 }); }, timeoutMs);
    s.on('connect', () => { if (payload) s.write(payload); });
    s.on('data', (d) => { buf += d; });
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(t); resolve({ data: buf, closed: true, ms: Date.now() - t0 }); });
  });
}

export const FAKE_REPLY = 'Hello from tern! The quick brown fox jumps over the lazy dog. été ✓ done.';

// One keep-alive connection; send(raw) resolves with {status, headers, body, closed} for the next
// response (Content-Length or chunked body). After the server closes, every send reconnects.
export function keepAliveClient(port, host = '127.0.0.1') {
  let sock = null, buf = Buffer.alloc(0), waiter = null, closed = true;
  function connect() {
    sock = net.connect(port, host);
    closed = false;
    sock.on('data', (d) => { buf = Buffer.concat([buf, d]); pump(); });
    sock.on('error', () => {});
    sock.on('close', () => { closed = true; pump(true); });
  }
  function parse() {
    const he = buf.indexOf('\r\n\r\n');
    if (he < 0) return null;
    const head = buf.subarray(0, he).toString('latin1').split('\r\n');
    const status = Number(head[0].split(' ')[1]);
    const headers = {};
    for (const l of head.slice(1)) { const i = l.indexOf(':'); if (i > 0) headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim(); }
    let p = he + 4;
    if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (buf.length < p + n) return null;
      const body = buf.subarray(p, p + n).toString('utf8');
      buf = buf.subarray(p + n);
      return { status, headers, body };
    }
    if ((headers['transfer-encoding'] || '').includes('chunked')) {
      const parts = [];
      for (;;) {
        const le = buf.indexOf('\r\n', p);
        if (le < 0) return null;
        const n = parseInt(buf.subarray(p, le).toString('latin1'), 16);
        if (buf.length < le + 2 + n + 2) return null;
        parts.push(buf.subarray(le + 2, le + 2 + n));
        p = le + 2 + n + 2;
        if (n === 0) break;
      }
      buf = buf.subarray(p);
      return { status, headers, body: Buffer.concat(parts).toString('utf8') };
    }
    return null;   // no length: wait for close
  }
  function pump(atClose = false) {
    if (!waiter) return;
    let r = parse();
    if (!r && atClose) {
      const he = buf.indexOf('\r\n\r\n');
      r = he < 0 ? { status: 0, headers: {}, body: buf.toString('utf8') } : { status: Number(buf.subarray(0, he).toString('latin1').split(' ')[1]), headers: {}, body: buf.subarray(he + 4).toString('utf8') };
      buf = Buffer.alloc(0);
    }
    if (r) { const w = waiter; waiter = null; w({ ...r, closed: atClose || closed }); }
  }
  return {
    send(raw) {
      if (closed) { buf = Buffer.alloc(0); connect(); }
      return new Promise((resolve) => { waiter = resolve; sock.write(raw); pump(closed); });
    },
    close() { if (sock) sock.destroy(); },
  };
}

// A raw HTTP/1.1 POST (keep-alive) with a JSON (or any) body; body may be a Buffer.
export function rawPost(path, body, headers = {}) {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body), 'utf8');
  let h = `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n`;
  for (const [k, v] of Object.entries(headers)) h += `${k}: ${v}\r\n`;
  return Buffer.concat([Buffer.from(h + '\r\n', 'latin1'), b]);
}
