// tools_json.mjs — tool calls, reasoning, response_format (constrained decoding), the
// Responses API, count_tokens, embeddings and /metrics, driven with the real `openai` and
// `@anthropic-ai/sdk` clients. The fake engine replies with the text scripted in the prompt
// as "@@reply:TEXT@@" (exact output); the demo model (random weights) checks that
// constrained output is valid JSON matching the schema whatever the model prefers.
import { existsSync } from 'node:fs';
import { assert, check, eq, failures, postJSON, skip, startServer, TERN } from './harness.js';

let OpenAI, Anthropic;
try {
  OpenAI = (await import('openai')).default;
  Anthropic = (await import('@anthropic-ai/sdk')).default;
} catch (e) {
  skip('tools_json', `npm packages openai / @anthropic-ai/sdk not installed: ${e.message.slice(0, 80)}`);
  process.exit(0);
}
if (!existsSync(TERN)) { skip('tools_json', 'build/tern not built'); process.exit(0); }

const TOOLS = [{
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } },
}];
const CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>';
const script = (t) => `@@reply:${t}@@`;

const fake = await startServer(['--fake-engine'], { TERN_FAKE_DELAY_MS: '0' });
const U = fake.url;
const oa = new OpenAI({ baseURL: `${U}/v1`, apiKey: 'k', maxRetries: 0, timeout: 30000 });
const an = new Anthropic({ baseURL: U, apiKey: 'k', maxRetries: 0, timeout: 30000 });
const model = 'fake';

await check('chat_tool_call_and_reasoning', async () => {
  const r = await oa.chat.completions.create({
    model, tools: TOOLS, messages: [{ role: 'user', content: script(`<think>need weather</think>${CALL}`) }],
  });
  const m = r.choices[0].message;
  eq(r.choices[0].finish_reason, 'tool_calls');
  eq(m.reasoning_content, 'need weather');
  eq(m.reasoning, 'need weather');
  eq(m.tool_calls.length, 1);
  assert(m.tool_calls[0].id.startsWith('call_'), 'id');
  eq(m.tool_calls[0].type, 'function');
  eq(m.tool_calls[0].function.name, 'get_weather');
  eq(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', days: 2 });
  assert(m.content === null || m.content === '', `content ${m.content}`);
});

await check('chat_tool_call_stream', async () => {
  const stream = await oa.chat.completions.create({
    model, tools: TOOLS, stream: true, messages: [{ role: 'user', content: script(`<think>hm</think>Sure. ${CALL}`) }],
  });
  let content = '', reasoning = '', finish = null;
  const calls = [];
  for await (const ch of stream) {
    const c = ch.choices[0];
    if (!c) continue;
    content += c.delta.content || '';
    reasoning += c.delta.reasoning_content || '';
    for (const t of c.delta.tool_calls || []) calls[t.index] = t;
    finish = c.finish_reason || finish;
  }
  eq(reasoning, 'hm');
  eq(content.trim(), 'Sure.');
  eq(finish, 'tool_calls');
  eq(calls.length, 1);
  eq(calls[0].function.name, 'get_weather');
  eq(JSON.parse(calls[0].function.arguments), { city: 'Paris', days: 2 });
});

await check('chat_tool_round_trip', async () => {
  const first = await oa.chat.completions.create({ model, tools: TOOLS, messages: [{ role: 'user', content: script(CALL) }] });
  const msg = first.choices[0].message;
  const second = await oa.chat.completions.create({
    model, tools: TOOLS,
    messages: [{ role: 'user', content: script(CALL) }, msg,
      { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: script('It is sunny in Paris.') }],
  });
  eq(second.choices[0].message.content, 'It is sunny in Paris.');
  eq(second.choices[0].finish_reason, 'stop');
});

await check('chat_tool_choice', async () => {
  const none = await oa.chat.completions.create({ model, tools: TOOLS, tool_choice: 'none', messages: [{ role: 'user', content: script(CALL) }] });
  eq(none.choices[0].finish_reason, 'stop');
  assert(!none.choices[0].message.tool_calls, 'no tool calls with tool_choice none');
  const req = await postJSON(`${U}/v1/chat/completions`, { tools: TOOLS, tool_choice: 'required', messages: [{ role: 'user', content: 'x' }] });
  eq(req.status, 400);
  eq(req.json.error.param, 'tool_choice');
});

await check('reasoning_effort_validation', async () => {
  const ok = await postJSON(`${U}/v1/chat/completions`, { reasoning_effort: 'none', max_tokens: 3, messages: [{ role: 'user', content: 'x' }] });
  eq(ok.status, 200);
  const bad = await postJSON(`${U}/v1/chat/completions`, { reasoning_effort: 'extreme', messages: [{ role: 'user', content: 'x' }] });
  eq(bad.status, 400);
});

await check('anthropic_tool_use', async () => {
  const atools = [{ name: 'get_weather', description: 'w', input_schema: TOOLS[0].function.parameters }];
  const r = await an.messages.create({ model, max_tokens: 200, tools: atools, messages: [{ role: 'user', content: script(`<think>t</think>${CALL}`) }] });
  eq(r.stop_reason, 'tool_use');
  eq(r.content.map((b) => b.type), ['thinking', 'tool_use']);
  eq(r.content[0].thinking, 't');
  eq(r.content[1].name, 'get_weather');
  eq(r.content[1].input, { city: 'Paris', days: 2 });
  const st = an.messages.stream({ model, max_tokens: 200, tools: atools, messages: [{ role: 'user', content: script(`<think>t</think>ok ${CALL}`) }] });
  const fin = await st.finalMessage();
  eq(fin.stop_reason, 'tool_use');
  eq(fin.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  eq(fin.content[2].input, { city: 'Paris', days: 2 });
  // tool_result round trip
  const r2 = await an.messages.create({ model, max_tokens: 200, tools: atools, messages: [
    { role: 'user', content: script(CALL) },
    { role: 'assistant', content: [{ type: 'tool_use', id: r.content[1].id, name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: r.content[1].id, content: script('Sunny.') }] }] });
  eq(r2.content[0].text, 'Sunny.');
  eq(r2.stop_reason, 'end_turn');
});

await check('anthropic_count_tokens', async () => {
  const r = await postJSON(`${U}/v1/messages/count_tokens`, { model, messages: [{ role: 'user', content: 'hello' }] });
  eq(r.status, 200);
  assert(r.json.input_tokens > 5, `input_tokens ${r.json.input_tokens}`);
  const bad = await postJSON(`${U}/v1/messages/count_tokens`, { messages: 3 });
  eq(bad.status, 400);
  eq(bad.json.type, 'error');
});

await check('json_object_fake_exact', async () => {
  const doc = '{"a": [1, 2.5, true], "b": "x\\u00e9"}';
  const r = await oa.chat.completions.create({ model, response_format: { type: 'json_object' }, messages: [{ role: 'user', content: script(doc) }] });
  eq(r.choices[0].message.content, doc);
  eq(r.choices[0].finish_reason, 'stop');
  // a reply that is not JSON is forced into JSON anyway
  const r2 = await oa.chat.completions.create({ model, max_tokens: 64, response_format: { type: 'json_object' }, messages: [{ role: 'user', content: script('{"k": 1} trailing') }] });
  eq(JSON.parse(r2.choices[0].message.content), { k: 1 });
});

await check('response_format_bad', async () => {
  for (const [rf, frag] of [[{ type: 'xml' }, 'type'], [{ type: 'json_schema', json_schema: {} }, 'schema'],
    [{ type: 'json_schema', json_schema: { schema: { anyOf: [{ type: 'string' }] } } }, 'anyOf']]) {
    const r = await postJSON(`${U}/v1/chat/completions`, { response_format: rf, messages: [{ role: 'user', content: 'x' }] });
    eq(r.status, 400, JSON.stringify(rf));
    assert(r.json.error.message.includes(frag), r.json.error.message);
  }
});

await check('responses_api', async () => {
  const r = await oa.responses.create({ model, input: script('Hi there.'), instructions: 'Be brief.' });
  eq(r.object, 'response');
  eq(r.status, 'completed');
  eq(r.output_text, 'Hi there.');
  assert(r.usage.input_tokens > 0 && r.usage.output_tokens === 9, JSON.stringify(r.usage));
  const fc = await oa.responses.create({ model, input: [{ role: 'user', content: script(CALL) }],
    tools: [{ type: 'function', name: 'get_weather', parameters: TOOLS[0].function.parameters }] });
  const call = fc.output.find((o) => o.type === 'function_call');
  eq(call.name, 'get_weather');
  eq(JSON.parse(call.arguments), { city: 'Paris', days: 2 });
  const r2 = await oa.responses.create({ model, previous_response_id: fc.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: script('Done.') }] });
  eq(r2.output_text, 'Done.');
  const inc = await oa.responses.create({ model, input: 'x', max_output_tokens: 4 });
  eq(inc.status, 'incomplete');
  eq(inc.incomplete_details.reason, 'max_output_tokens');
  const missing = await postJSON(`${U}/v1/responses`, { input: 'x', previous_response_id: 'resp_nope' });
  eq(missing.status, 404);
  const bad = await postJSON(`${U}/v1/responses`, { input: 5 });
  eq(bad.status, 400);
});

await check('responses_stream', async () => {
  const st = await oa.responses.create({ model, stream: true, input: script(`<think>r</think>Yes. ${CALL}`),
    tools: [{ type: 'function', name: 'get_weather', parameters: TOOLS[0].function.parameters }] });
  const types = [];
  let text = '', final = null, seq = -1, args = '';
  for await (const ev of st) {
    types.push(ev.type);
    assert(ev.sequence_number === seq + 1, 'sequence_number');
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.function_call_arguments.done') args = ev.arguments;
    if (ev.type === 'response.completed') final = ev.response;
  }
  eq(types[0], 'response.created');
  eq(types[types.length - 1], 'response.completed');
  assert(types.includes('response.reasoning_text.delta'), 'reasoning delta');
  eq(text.trim(), 'Yes.');
  eq(JSON.parse(args), { city: 'Paris', days: 2 });
  eq(final.output.map((o) => o.type), ['reasoning', 'message', 'function_call']);
});

await check('embeddings_400', async () => {
  const r = await postJSON(`${U}/v1/embeddings`, { input: 'x', model });
  eq(r.status, 400);
  assert(r.json.error.message.includes('embedding'), r.json.error.message);
});

await check('metrics_histograms', async () => {
  const t = await (await fetch(`${U}/metrics`)).text();
  for (const k of ['tern_time_to_first_token_seconds_bucket{le="+Inf"}', 'tern_inter_token_latency_seconds_count',
    'tern_http_responses_total{code="200"}', 'tern_http_responses_total{code="400"}', 'tern_kv_blocks_free',
    'tern_prefix_hit_rate', 'tern_requests_running']) assert(t.includes(k), `missing ${k}`);
  const m = t.match(/tern_time_to_first_token_seconds_count (\d+)/);
  assert(m && Number(m[1]) > 5, 'ttft count');
});

eq(await fake.stop(), 0);

// ---- demo model: constrained decoding with random weights ----
let demo = null;
try {
  demo = await startServer(['demo', '--device', 'cpu', '--max-ctx', '2048', '--max-concurrency', '4'], {}, 120000);
} catch (e) {
  skip('demo_json', `tern serve demo did not start: ${String(e.message).slice(0, 200)}`);
}
if (demo) {
  const od = new OpenAI({ baseURL: `${demo.url}/v1`, apiKey: 'k', maxRetries: 0, timeout: 60000 });
  const schema = { type: 'object', additionalProperties: false, required: ['name', 'n', 'ok'],
    properties: { name: { type: 'string' }, n: { type: 'integer' }, ok: { type: 'boolean' },
      tags: { type: 'array', items: { enum: ['x', 'y'] } }, color: { enum: ['red', 'green'] } } };
  const valid = (v) => v && typeof v === 'object' && !Array.isArray(v) && typeof v.name === 'string' &&
    Number.isInteger(v.n) && typeof v.ok === 'boolean' && Object.keys(v).every((k) => k in schema.properties) &&
    (v.tags === undefined || (Array.isArray(v.tags) && v.tags.every((t) => t === 'x' || t === 'y'))) &&
    (v.color === undefined || ['red', 'green'].includes(v.color));
  await check('demo_json_schema_parses', async () => {
    const outs = await Promise.all([1, 2, 3, 4].map((seed) => od.chat.completions.create({
      model: 'demo', seed, temperature: 1, max_tokens: 1500, messages: [{ role: 'user', content: 'Give me JSON.' }],
      response_format: { type: 'json_schema', json_schema: { name: 't', schema } } })));
    let done = 0;
    for (const r of outs) {
      const c = r.choices[0];
      if (c.finish_reason === 'length') continue;
      eq(c.finish_reason, 'stop');
      const v = JSON.parse(c.message.content);
      assert(valid(v), `does not match the schema: ${c.message.content.slice(0, 200)}`);
      done++;
    }
    assert(done >= 1, 'no constrained output finished within max_tokens');
  });
  await check('demo_json_object_stream_parses', async () => {
    const st = await od.chat.completions.create({ model: 'demo', seed: 7, temperature: 0.8, max_tokens: 1500, stream: true,
      messages: [{ role: 'user', content: 'JSON please' }], response_format: { type: 'json_object' } });
    let text = '', finish = null;
    for await (const ch of st) if (ch.choices[0]) { text += ch.choices[0].delta.content || ''; finish = ch.choices[0].finish_reason || finish; }
    if (finish === 'stop') {
      const v = JSON.parse(text);
      assert(v && typeof v === 'object' && !Array.isArray(v), 'an object');
    } else eq(finish, 'length');
  });
  eq(await demo.stop(), 0);
}
process.exit(failures() ? 1 : 0);
