// harness.js — shared helpers for the server tests (not a test itself: run.sh runs *.mjs).
// startServer() spawns `build/tern serve ... --port 0`, reads the port from the
// "listening on http://HOST:PORT" line, and waits for /health 200. Results are printed as
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
  let stderr = '';
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
