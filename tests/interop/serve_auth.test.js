'use strict';
// API keys in `kvroute serve` (issue 29, items 2 and 3) with the official `openai` npm
// client over HTTPS (serve's listen_tls, a certificate the openssl command makes for
// 127.0.0.1, trusted by the client and by nothing else): the right key streams a chat
// completion; a wrong or missing key is the client's AuthenticationError (401, vLLM's
// body); a key removed from the file stops working within the poll period, and a key
// added starts working.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const OpenAI = require('openai');
const undici = require('undici');
const { selfSignedPair, startSim, startServe, stop, tempDir } = require('./harness');

const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

// Written next to the config and renamed into place, as an editor or a ConfigMap does.
function writeKeys(file, text) {
  fs.writeFileSync(`${file}.tmp`, text);
  fs.renameSync(`${file}.tmp`, file);
}


async function streamChat(client) {
  const stream = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 3,
    stream: true, stream_options: { include_usage: true },
  });
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(chunks >= 3);
  return usage;
}

async function assertUnauthorized(client, what) {
  await assert.rejects(streamChat(client), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, `${what}: ${e}`);
    assert.equal(e.status, 401);
    assert.equal(e.error, 'Unauthorized');  // the client unwraps the body's "error"
    return true;
  });
}

test('API keys: the openai client with the right, a wrong and no key; a removed key stops working', async (t) => {
  const sim = await startSim(1);
  t.after(() => stop(sim.proc));
  const keysFile = path.join(tempDir, `keys-${process.pid}.txt`);
  writeKeys(keysFile, '# test keys\nalice sk-alice-1\nbob sk-bob-1\n');
  const tls = selfSignedPair('kvroute-serve');
  const serve = await startServe(sim.endpoints, [
    'auth:',
    `  api_keys_file: ${path.basename(keysFile)}`,
    '  api_keys_poll: 100ms',
  ], { tls });
  t.after(() => stop(serve.proc));
  const baseURL = `https://${serve.httpsAddress}/v1`;
  // The client trusts serve's certificate and nothing else (verification on).
  const dispatcher = new undici.Agent({ connect: { ca: tls.cert } });
  t.after(() => dispatcher.close());
  const client = (apiKey, extra = {}) => new OpenAI({
    baseURL, apiKey, maxRetries: 0, fetch: undici.fetch, fetchOptions: { dispatcher }, ...extra,
  });

  await t.test('the right key streams over HTTPS', async () => {
    const usage = await streamChat(client('sk-alice-1'));
    assert.equal(usage.completion_tokens, 3);
    // A client that does not trust the certificate never gets as far as the key.
    const untrusting = new OpenAI({ baseURL, apiKey: 'sk-alice-1', maxRetries: 0, fetch: undici.fetch });
    await assert.rejects(streamChat(untrusting), (e) => e instanceof OpenAI.APIConnectionError);
  });

  await t.test('a wrong key and no key: AuthenticationError, 401', async () => {
    await assertUnauthorized(client('sk-wrong'), 'wrong key');
    // The client always sends its key; a null header removes it.
    await assertUnauthorized(client('unused', { defaultHeaders: { Authorization: null } }), 'no key');
    // The open paths stay open.
    const health = await fetch(`http://${serve.address}/healthz`);
    assert.equal(health.status, 200);
  });

  await t.test('a key removed from the file stops working within the poll period', async () => {
    const bob = client('sk-bob-1');
    await streamChat(bob);
    writeKeys(keysFile, 'alice sk-alice-1\ncarol sk-carol-1\n');
    const start = Date.now();
    for (;;) {
      const refused = await streamChat(bob).then(() => false, (e) => {
        if (!(e instanceof OpenAI.AuthenticationError)) throw e;
        return true;
      });
      if (refused) break;
      assert.ok(Date.now() - start < 3000, 'bob still accepted 3 s after the removal');
      await new Promise((r) => setTimeout(r, 20));
    }
    await streamChat(client('sk-carol-1'));
    await streamChat(client('sk-alice-1'));
    const metrics = await (await fetch(`http://${serve.address}/metrics`)).text();
    assert.match(metrics, /^kvroute_auth_keys 2(\.0)?$/m);
    assert.match(metrics, /^kvroute_auth_reloads_total\{result="applied"\} 1(\.0)?$/m);
    assert.match(metrics, /^kvroute_auth_requests_total\{key="carol"\} 1(\.0)?$/m);
    // bob's count: 1 plus however many of his retries beat the poll; his name stays listed.
    assert.match(metrics, /^kvroute_auth_requests_total\{key="bob"\} [1-9][0-9]*(\.0)?$/m);
    // Refused: the missing key once; the wrong key and bob's first refused attempt.
    assert.match(metrics, /^kvroute_auth_rejected_total\{reason="missing"\} 1(\.0)?$/m);
    assert.match(metrics, /^kvroute_auth_rejected_total\{reason="invalid"\} 2(\.0)?$/m);
    assert.doesNotMatch(metrics, /sk-/);
  });
});
