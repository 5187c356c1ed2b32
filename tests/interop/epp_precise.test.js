'use strict';
// Precise prefix routing through `kvroute epp` with the Envoy side played by the client
// built from Envoy's published protos (envoy_client.js): `kvroute sim --replicas 4`
// publishing KV-cache events, a picker subscribed to them (pool endpoints with
// kv_events), tokenizing each prompt with a replica's POST /tokenize before its pick. The
// test also plays Envoy's upstream: it sends each picked request to the replica and hands
// the response back on the stream (response_headers, response_body), so the picker reads
// the route receipt. The interop twin of tests/apps/epp/epp_precise_test.cc.
// Run: KVROUTE_BINARY=build/kvroute node --test tests/interop/epp_precise.test.js

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { ExtProcClient, headersRequest, bodyRequest, postHeaders, headerValueOf } = require('./envoy_client');
const { startSimWithEvents, startEpp, stop, waitForHealth } = require('./harness');

const kModel = 'meta-llama/Llama-3.1-8B-Instruct';
const kHeader = 'x-gateway-destination-endpoint';
const kBytesPerToken = 4;  // the simulated engine's tokenizer (src/core/engine/tokenizer.h)

let sim;
let epp;
let client;

before(async () => {
  // 128 blocks of 16 tokens: a few long prompts evict the oldest.
  sim = await startSimWithEvents(4, 128);
  const endpoints = sim.endpoints.map((e, i) =>
    `{address: ${e}, name: r${i}, kv_events: "${sim.kvEvents[i]}", kv_events_replay: "${sim.kvReplay[i]}"}`);
  epp = await startEpp({
    endpoints, bodyMode: 'full_duplex_streamed', poolExtra: ['  kv_events: {speculative_ttl: 100ms}'],
  });
  client = new ExtProcClient(epp.grpc);
  await waitForHealth(epp.health, 'readiness');
});

after(async () => {
  if (client) client.close();
  await Promise.all([epp && stop(epp.proc), sim && stop(sim.proc)]);
});

function request(address, method, path, body) {
  const [host, port] = address.split(':');
  return new Promise((resolve, reject) => {
    const req = http.request({ host, port: Number(port), method, path,
      headers: body ? { 'content-type': 'application/json', 'content-length': body.length } : {} }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

async function metrics() {
  const r = await request(epp.metrics, 'GET', '/metrics');
  return r.body.toString();
}

// The sum of `name`'s samples whose labels include every one of `labels`.
function metricSum(text, name, labels = {}) {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const ls = m[2] || '';
    if (Object.entries(labels).every(([k, v]) => ls.includes(`${k}="${v}"`))) sum += Number(m[3]);
  }
  return sum;
}

async function waitFor(cond, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`not within ${timeoutMs} ms: ${cond}`);
}

// A prompt of exactly `tokens` tokens, distinct per `tag`.
function prompt(tag, tokens) {
  const s = `${tag}-`;
  return (s + 'x'.repeat(Math.max(0, tokens * kBytesPerToken - s.length))).slice(0, tokens * kBytesPerToken);
}

function completionBody(p) {
  return Buffer.from(JSON.stringify({ model: kModel, prompt: p, max_tokens: 1 }));
}

// Directly to replica i, not through the picker.
async function direct(i, p) {
  const r = await request(sim.endpoints[i], 'POST', '/v1/completions', completionBody(p));
  assert.equal(r.status, 200, r.body.toString());
}

async function blocks(i) {
  return metricSum(await metrics(), 'kvroute_kv_events_blocks', { endpoint: `r${i}` });
}

// One request as Envoy drives it under FULL_DUPLEX_STREAMED, sent on to the replica
// picked, its response handed back on the stream. Returns the replica's index.
async function through(p) {
  const body = completionBody(p);
  const ex = client.open();
  ex.send(headersRequest(postHeaders()));
  ex.send(bodyRequest(body, { endOfStream: true }));
  const first = await ex.next();
  assert.equal(first.msg.response, 'request_headers');
  const set = first.msg.request_headers.response.header_mutation.set_headers;
  const h = set.find((o) => o.header.key.toLowerCase() === kHeader);
  assert.ok(h, 'no pick');
  const dest = headerValueOf(h.header).split(',')[0];
  for (;;) {
    const r = await ex.next();
    if (r.wire.streamed && r.wire.streamed.endOfStream) break;
  }
  const resp = await request(dest, 'POST', '/v1/completions', body);
  assert.equal(resp.status, 200);
  ex.send({ response_headers: { headers: { headers: [{ key: ':status', raw_value: Buffer.from('200') }] } } });
  assert.equal((await ex.next()).msg.response, 'response_headers');
  ex.send({ response_body: { body: resp.body, end_of_stream: true } });
  assert.equal((await ex.next()).msg.response, 'response_body');
  ex.end();
  await ex.status;
  const i = sim.endpoints.indexOf(dest);
  assert.ok(i >= 0, `${dest}: not one of the replicas`);
  return i;
}

test('the pick follows what the replicas report they cache; receipts agree', async () => {
  // Every replica's events are live: fresh prompts directly until the picker applied some.
  let n = 0;
  await waitFor(async () => {
    const m = await metrics();
    if (metricSum(m, 'kvroute_endpoint_metrics_fresh') < 4) return false;
    let all = true;
    for (let i = 0; i < 4; i++) {
      if (metricSum(m, 'kvroute_kv_events_state', { endpoint: `r${i}`, state: 'live' }) === 1) continue;
      all = false;
      await direct(i, prompt(`warm${n++}`, 20));
    }
    return all;
  });

  // Replica 3 computes a long prompt for a client that never went through the gateway.
  const p = prompt('shared-context', 800);  // 50 blocks
  const before3 = await blocks(3);
  await direct(3, p);
  await waitFor(async () => (await blocks(3)) >= before3 + 49);
  assert.equal(await through(`${p} and a question`), 3);
  // The receipt is counted once the picker has read the response body's end.
  let m = '';
  await waitFor(async () => metricSum(m = await metrics(), 'kvroute_route_receipts_total') === 1);
  assert.equal(metricSum(m, 'kvroute_route_receipts_mispredicted_total'), 0);
  assert.equal(metricSum(m, 'kvroute_route_receipts_reported_tokens_total'), 800);
  assert.ok(metricSum(m, 'kvroute_tokenize_requests_total') >= 1);
  assert.equal(metricSum(m, 'kvroute_tokenize_failures_total'), 0);

  // Replica 3 evicts those blocks (BlockRemoved); replica 1 computes the prompt.
  const removed = metricSum(m, 'kvroute_kv_events_events_total', { endpoint: 'r3', type: 'BlockRemoved' });
  for (let k = 0; k < 3; k++) await direct(3, prompt(`filler${k}`, 1200));
  await waitFor(async () => metricSum(await metrics(), 'kvroute_kv_events_events_total',
    { endpoint: 'r3', type: 'BlockRemoved' }) > removed);
  const before1 = await blocks(1);
  await direct(1, p);
  await waitFor(async () => (await blocks(1)) >= before1 + 49);
  assert.equal(await through(`${p} and another question`), 1);
  await waitFor(async () => metricSum(m = await metrics(), 'kvroute_route_receipts_total') === 2);
  assert.equal(metricSum(m, 'kvroute_route_receipts_mispredicted_total'), 0);
});
