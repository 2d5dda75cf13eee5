// sdk_clients.mjs — the real `openai` and `@anthropic-ai/sdk` npm clients against
// `tern serve`: first the fake engine (exact text known), then the real engine on the
// embedded demo model (shapes, streaming, usage; its text is meaningless). SKIPs visibly
// when the npm packages are not installed (no network) or the binary is missing.
import { existsSync } from 'node:fs';
import {
  FAKE_REPLY, assert, check, eq, failures, skip, startServer, TERN,
} from './harness.js';

let OpenAI, Anthropic;
try {
  OpenAI = (await import('openai')).default;
  Anthropic = (await import('@anthropic-ai/sdk')).default;
} catch (e) {
  skip('sdk_clients', `npm packages openai / @anthropic-ai/sdk not installed (cd tests && npm install): ${e.message.slice(0, 80)}`);
  process.exit(0);
}
if (!existsSync(TERN)) { skip('sdk_clients', 'build/tern not built'); process.exit(0); }

async function suite(label, srv, exact) {
  const oa = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'k', maxRetries: 0, timeout: 60000 });
  const an = new Anthropic({ baseURL: srv.url, apiKey: 'k', maxRetries: 0, timeout: 60000 });
  const models = await oa.models.list();
  const model = models.data[0].id;

  await check(`${label}_openai_models`, async () => {
    assert(models.data.length >= 1, 'no models');
    const m = await oa.models.retrieve(model);
    eq(m.id, model);
  });

  await check(`${label}_openai_chat`, async () => {
    const r = await oa.chat.completions.create({
      model, messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hi' }],
      max_tokens: 16, temperature: 0,
    });
    eq(r.object, 'chat.completion');
    eq(r.choices[0].message.role, 'assistant');
    assert(typeof r.choices[0].message.content === 'string', 'content');
    assert(['stop', 'length'].includes(r.choices[0].finish_reason), 'finish_reason');
    assert(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0, 'usage');
    if (exact) eq(r.choices[0].message.content, 'Hello from tern!');
  });

  await check(`${label}_openai_chat_stream`, async () => {
    const stream = await oa.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Say hi' }], max_tokens: 12, stream: true,
      stream_options: { include_usage: true }, temperature: 0.7, top_p: 0.9, seed: 42,
    });
    let text = '', finish = null, usage = null, n = 0;
    for await (const c of stream) {
      n++;
      if (c.choices[0]) { text += c.choices[0].delta.content || ''; finish = c.choices[0].finish_reason || finish; }
      if (c.usage) usage = c.usage;
    }
    assert(n >= 3, `only ${n} chunks`);
    assert(finish === 'length' || finish === 'stop', `finish ${finish}`);
    assert(usage && usage.completion_tokens > 0, 'usage chunk');
    if (exact) eq(text, 'Hello from t');
  });

  await check(`${label}_openai_stream_helper`, async () => {
    const runner = oa.chat.completions.stream({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 8 });
    const final = await runner.finalChatCompletion();
    assert(typeof final.choices[0].message.content === 'string', 'final content');
  });

  await check(`${label}_openai_tools_and_template_kwargs_accepted`, async () => {
    // tool definitions reach the chat template; tool-call parsing of the output is not done yet
    const r = await oa.chat.completions.create({
      model, max_tokens: 4, tool_choice: 'auto', chat_template_kwargs: { enable_thinking: false },
      tools: [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
      messages: [{ role: 'user', content: 'weather?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }],
    });
    assert(typeof r.choices[0].message.content === 'string', 'content');
  });

  await check(`${label}_openai_completions`, async () => {
    const r = await oa.completions.create({ model, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
    eq(r.object, 'text_completion');
    assert(typeof r.choices[0].text === 'string', 'text');
    if (exact) eq(r.choices[0].text, 'Hello ');
  });

  await check(`${label}_openai_error_is_APIError`, async () => {
    try {
      await oa.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], temperature: -3 });
      throw new Error('no error thrown');
    } catch (e) {
      assert(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
      eq(e.status, 400);
      eq(e.error.param, 'temperature');
    }
  });

  await check(`${label}_anthropic_messages`, async () => {
    const r = await an.messages.create({
      model, max_tokens: 16, system: 'You are terse.', messages: [{ role: 'user', content: 'Say hi' }],
    });
    eq(r.type, 'message');
    eq(r.content[0].type, 'text');
    assert(['end_turn', 'max_tokens', 'stop_sequence'].includes(r.stop_reason), 'stop_reason');
    assert(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, 'usage');
    if (exact) eq(r.content[0].text, 'Hello from tern!');
  });

  await check(`${label}_anthropic_stream`, async () => {
    const s = an.messages.stream({ model, max_tokens: 10, messages: [{ role: 'user', content: 'Say hi' }] });
    const kinds = [];
    let text = '';
    s.on('streamEvent', (ev) => kinds.push(ev.type));
    s.on('text', (t) => { text += t; });
    const final = await s.finalMessage();
    eq(kinds[0], 'message_start');
    eq(kinds[kinds.length - 1], 'message_stop');
    assert(kinds.includes('content_block_delta') && kinds.includes('message_delta'), `events ${kinds}`);
    eq(final.content[0].text, text, 'final text = streamed text');
    eq(final.usage.output_tokens, 10);
    if (exact) eq(text, 'Hello from');
  });

  await check(`${label}_anthropic_error`, async () => {
    try {
      await an.messages.create({ model, max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] });
      throw new Error('no error thrown');
    } catch (e) {
      assert(e instanceof Anthropic.APIError, `not an APIError: ${e}`);
      eq(e.status, 400);
      eq(e.error.type, 'error');
      eq(e.error.error.type, 'invalid_request_error');
    }
  });
}

const fake = await startServer(['--fake-engine'], { TERN_FAKE_DELAY_MS: '0' });
await suite('fake', fake, true);
await check('fake_clean_exit', async () => eq(await fake.stop(), 0));

let demo = null;
try {
  demo = await startServer(['demo', '--device', 'cpu', '--max-ctx', '512', '--max-concurrency', '4'], {}, 120000);
} catch (e) {
  skip('demo_model', `tern serve demo did not start: ${String(e.message).slice(0, 200)}`);
}
if (demo) {
  await suite('demo', demo, false);
  await check('demo_clean_exit', async () => eq(await demo.stop(), 0));
}
void FAKE_REPLY;
process.exit(failures() ? 1 : 0);
