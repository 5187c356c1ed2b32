'use strict';
// The official `openai` npm client through `kvroute serve` against `kvroute sim` replicas
// (issue 26): every OpenAI path a newcomer calls (models, chat completions streamed and
// not, completions, embeddings in the client's default base64 form and as floats,
// responses streamed and not) answers as the client expects, and an unknown path gets an
// OpenAI-shaped 404 at once.

const test = require('node:test');
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { startSim, startServe, stop } = require('./harness');

const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

test('the openai client: models, chat, completions, embeddings, responses through serve', async (t) => {
  const sim = await startSim(2);
  t.after(() => stop(sim.proc));
  const serve = await startServe(sim.endpoints);
  t.after(() => stop(serve.proc));
  const client = new OpenAI({ baseURL: `http://${serve.address}/v1`, apiKey: 'unused', maxRetries: 0 });

  await t.test('models: the union of the replicas, the served model once', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepEqual(ids, [MODEL]);
  });

  await t.test('chat completions, whole and streamed', async () => {
    const c = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 4,
    });
    assert.equal(c.object, 'chat.completion');
    assert.equal(c.usage.completion_tokens, 4);
    assert.equal(c.choices[0].finish_reason, 'length');
    const stream = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hello again' }], max_tokens: 3,
      stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.choices.length) text += chunk.choices[0].delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(usage.completion_tokens, 3);
    assert.equal(text.trim().split(/\s+/).length, 3);
  });

  await t.test('completions', async () => {
    const c = await client.completions.create({ model: MODEL, prompt: 'Once upon', max_tokens: 2 });
    assert.equal(c.object, 'text_completion');
    assert.equal(c.usage.completion_tokens, 2);
  });

  await t.test('embeddings: the default (base64) and floats give the same unit vectors', async () => {
    const input = ['the quick brown fox', 'jumps over the lazy dog'];
    const b64 = await client.embeddings.create({ model: MODEL, input });
    const floats = await client.embeddings.create({ model: MODEL, input, encoding_format: 'float' });
    assert.equal(b64.object, 'list');
    assert.equal(b64.data.length, 2);
    for (let i = 0; i < 2; i++) {
      assert.equal(b64.data[i].index, i);
      assert.equal(b64.data[i].embedding.length, 384);
      // base64 carries float32 values; the JSON numbers are the same float32s, printed shortest.
      assert.deepEqual(b64.data[i].embedding, floats.data[i].embedding.map(Math.fround));
      const norm = Math.sqrt(b64.data[i].embedding.reduce((s, x) => s + x * x, 0));
      assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
    }
    assert.notDeepEqual(b64.data[0].embedding, b64.data[1].embedding);
    assert.equal(b64.usage.prompt_tokens, floats.usage.prompt_tokens);
    assert.ok(b64.usage.prompt_tokens > 0);
    const small = await client.embeddings.create({ model: MODEL, input: 'x', dimensions: 8 });
    assert.equal(small.data[0].embedding.length, 8);
  });

  await t.test('responses, whole and streamed', async () => {
    const r = await client.responses.create({
      model: MODEL, instructions: 'Be brief.', input: 'Say hello', max_output_tokens: 5,
    });
    assert.equal(r.object, 'response');
    assert.equal(r.status, 'incomplete');
    assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    assert.equal(r.usage.output_tokens, 5);
    assert.equal(r.output_text.trim().split(/\s+/).length, 5);
    const stream = await client.responses.create({
      model: MODEL, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Hi' }] }],
      max_output_tokens: 3, stream: true,
    });
    const types = [];
    let deltas = '';
    let final = null;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') deltas += event.delta;
      if (event.type === 'response.incomplete' || event.type === 'response.completed') final = event.response;
    }
    assert.deepEqual(types, [
      'response.created', 'response.in_progress', 'response.output_item.added',
      'response.content_part.added', 'response.output_text.delta', 'response.output_text.delta',
      'response.output_text.delta', 'response.output_text.done', 'response.content_part.done',
      'response.output_item.done', 'response.incomplete']);
    assert.equal(final.output[0].content[0].text, deltas);
    assert.equal(final.usage.output_tokens, 3);
  });

  await t.test('an unknown path: an OpenAI-shaped 404 at once, as the client raises it', async () => {
    const started = Date.now();
    await assert.rejects(client.get('/no/such/path'), (err) => {
      assert.ok(err instanceof OpenAI.NotFoundError, String(err));
      assert.equal(err.status, 404);
      assert.equal(err.error.code, 404);
      assert.match(err.error.message, /no\/such\/path/);
      return true;
    });
    assert.ok(Date.now() - started < 2000);
  });
});
