// speculative.mjs — `tern serve --speculative K` and the `speculative_k` request extension:
// greedy output with speculation equals output without; bad values are a 400; counters in /metrics.
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const tern = process.env.TERN_BIN || path.join(root, "build/tern");
const p = spawn(tern, ["serve", "demo", "--port", "0", "--threads", "1", "--speculative", "4"],
                { env: { ...process.env, TERN_CACHE: path.join(root, "build/spec_cache") } });
const timer = setTimeout(() => { console.log("FAIL: speculative: server did not start"); p.kill(); process.exit(1); }, 30000);
let url = null, buf = "";
p.stdout.on("data", d => { buf += d; const m = buf.match(/listening on (\S+)/); if (m && !url) { url = m[1]; run().finally(() => { clearTimeout(timer); p.kill(); }); } });
const check = (name, ok, why) => console.log(ok ? `PASS: ${name}` : `FAIL: ${name}: ${why}`);

async function chat(k) {
  const body = { model: "demo", messages: [{ role: "user", content: "ab ab ab ab ab ab" }], max_tokens: 24, temperature: 0 };
  if (k !== undefined) body.speculative_k = k;
  const r = await fetch(url + "/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

async function run() {
  const a = await chat(8), b = await chat(0), c = await chat();
  check("speculative_greedy_identical", a.status === 200 && b.status === 200 &&
        a.json.choices[0].message.content === b.json.choices[0].message.content &&
        c.json.choices[0].message.content === b.json.choices[0].message.content, `${a.status} ${b.status}`);
  const bad = await chat(99);
  check("speculative_k_out_of_range_400", bad.status === 400 && /speculative_k/.test(JSON.stringify(bad.json)), JSON.stringify(bad.json));
  const m = await (await fetch(url + "/metrics")).text();
  const drafted = Number((m.match(/^tern_spec_drafted_total (\d+)/m) || [])[1]);
  check("speculative_metrics", drafted > 0, `tern_spec_drafted_total ${drafted}`);
}
