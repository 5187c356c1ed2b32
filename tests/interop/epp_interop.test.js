'use strict';
// Interoperability test of `kvroute epp` (issue 8, item 6): the Envoy side of the ext_proc
// stream is played by a client built from Envoy's published protos (envoy_client.js), in
// front of `kvroute sim --replicas 4`. Run: KVROUTE_BINARY=build/kvroute node --test tests/interop
//
// Each exchange follows what Envoy's ext_proc filter sends in that body mode:
//   BUFFERED              headers; waits for their answer; the whole body in one message.
//   STREAMED              headers; waits for their answer; the body chunk by chunk, one
//                         answer per chunk. (Envoy applies a body response's header
//                         mutation only under BUFFERED, so a STREAMED pick is checked on
//                         the wire but cannot route a plain Envoy: deploy/envoy/README.md.)
//   FULL_DUPLEX_STREAMED  headers and every body chunk without waiting for answers.
// That revision of the protos has no FULL_DUPLEX_STREAMED and no protocol_config, so
// each picker's mode is its config's epp.body_mode (one picker per mode), and the
// FULL_DUPLEX_STREAMED replies (streamed_response) are read field by field from the wire.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const {
  ExtProcClient, healthCheck, headersRequest, bodyRequest, postHeaders, subsetHint,
  fromStruct, headerValueOf, protocolConfigField, grpc,
} = require('./envoy_client');
const { startSim, startSidecar, startEpp, stop, deadPorts, waitForHealth } = require('./harness');

const kModel = 'meta-llama/Llama-3.1-8B-Instruct';
const kHeader = 'x-gateway-destination-endpoint';
const kMaxStreamedChunk = 62000;
const kFallbacks = 2;

let sim;
const epp = {};      // by mode: buffered, streamed, full_duplex_streamed; dead: no endpoint up
const clients = {};  // ExtProcClient per picker
let picksChecked = 0;

before(async () => {
  sim = await startSim(4);
  const modes = ['buffered', 'streamed', 'full_duplex_streamed'];
  const started = await Promise.all([
    ...modes.map((bodyMode) => startEpp({ endpoints: sim.endpoints, bodyMode, fallbacks: kFallbacks })),
    deadPorts(3).then((ports) => startEpp({
      endpoints: ports.map((p) => `127.0.0.1:${p}`), bodyMode: 'full_duplex_streamed',
    })),
  ]);
  modes.forEach((m, i) => { epp[m] = started[i]; });
  epp.dead = started[3];
  for (const [k, e] of Object.entries(epp)) clients[k] = new ExtProcClient(e.grpc);
  // Readiness needs fresh metrics from at least one endpoint: scrapes every 50 ms.
  await Promise.all(modes.map((m) => waitForHealth(epp[m].health, 'readiness')));
});

after(async () => {
  for (const c of Object.values(clients)) c.close();
  await Promise.all([...Object.values(epp).map((e) => stop(e.proc)), sim && stop(sim.proc)]);
  process.stdout.write(`# picks checked (header == envoy.lb, one of the pool): ${picksChecked}\n`);
});

// ---------------------------------------------------------------------------------------
// Bodies.

function completionBody(prompt, extra = {}) {
  return Buffer.from(JSON.stringify({ model: kModel, prompt, max_tokens: 8, ...extra }));
}

function chatBody(content) {
  return Buffer.from(JSON.stringify({
    model: kModel, max_tokens: 8, stream: true,
    messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content }],
  }));
}

// A prompt of about `bytes` bytes of words (some multi-byte), distinct per `seed`.
function prompt(bytes, seed = 0) {
  const words = ['the', 'cache', 'prefix', 'token', 'é', 'Ω', 'router', 'endpoint', 'replica', 'batch'];
  const out = [`seed ${seed}:`];
  let n = out[0].length;
  for (let i = 0; n < bytes; i++) {
    const w = words[(i * 7 + seed) % words.length];
    out.push(w);
    n += Buffer.byteLength(w) + 1;
  }
  return out.join(' ');
}

// Splits `buf` into `n` uneven pieces (cut anywhere, even inside a UTF-8 sequence).
function split(buf, n) {
  const cuts = new Set([0, buf.length]);
  for (let i = 1; i < n; i++) cuts.add(Math.floor((buf.length * i * i) / (n * n)) + i);
  const at = [...cuts].filter((c) => c <= buf.length).sort((a, b) => a - b);
  const pieces = [];
  for (let i = 1; i < at.length; i++) pieces.push(buf.subarray(at[i - 1], at[i]));
  return pieces.filter((p) => p.length > 0);
}

function chunksOf(buf, size) {
  const out = [];
  for (let i = 0; i < buf.length; i += size) out.push(buf.subarray(i, i + size));
  return out;
}

// ---------------------------------------------------------------------------------------
// What a response says.

function commonOf(msg) {
  const r = msg[msg.response];
  return r && r.response;
}

// The pick in one response, or undefined: the endpoint header set by its header mutation
// and the dynamic metadata's envoy.lb value.
function pickOf({ msg }) {
  const common = commonOf(msg);
  const set = (common && common.header_mutation && common.header_mutation.set_headers) || [];
  const h = set.find((o) => o.header && o.header.key.toLowerCase() === kHeader);
  if (!h) return undefined;
  const lb = msg.dynamic_metadata ? fromStruct(msg.dynamic_metadata)['envoy.lb'] : undefined;
  return {
    where: msg.response,
    header: headerValueOf(h.header),
    metadata: lb && lb[kHeader],
    clearRouteCache: !!common.clear_route_cache,
    setHeaders: Object.fromEntries(set.map((o) => [o.header.key.toLowerCase(), headerValueOf(o.header)])),
  };
}

// Checks the invariants every pick must hold; returns the endpoints, winner first.
// `exact`: all `fallbacks` present (an idle pool); under load the picker may list fewer,
// leaving out endpoints its filters rejected.
function checkPick(pick, pool, { fallbacks = kFallbacks, candidates = pool, exact = true } = {}) {
  assert.ok(pick, 'no response carried the endpoint header');
  assert.equal(pick.metadata, pick.header,
    `header ${pick.header} and dynamic_metadata envoy.lb ${pick.metadata} differ`);
  assert.equal(pick.clearRouteCache, true, 'clear_route_cache not set with the pick');
  const list = pick.header.split(',').map((s) => s.trim());
  for (const e of list) {
    assert.match(e, /^\d+\.\d+\.\d+\.\d+:\d+$/, `${e}: not ip:port`);
    assert.ok(candidates.includes(e), `${e}: not one of ${candidates.join(', ')}`);
  }
  assert.equal(new Set(list).size, list.length, `${pick.header}: an endpoint twice`);
  const most = Math.min(1 + fallbacks, candidates.length);
  if (exact) assert.equal(list.length, most, `${pick.header}: winner and ${fallbacks} fallbacks expected`);
  else assert.ok(list.length <= most, `${pick.header}: more than ${fallbacks} fallbacks`);
  assert.ok(pool.includes(list[0]));
  picksChecked++;
  return list;
}

function immediateOf({ msg }) {
  if (msg.response !== 'immediate_response') return undefined;
  const ir = msg.immediate_response;
  const headers = Object.fromEntries(((ir.headers && ir.headers.set_headers) || [])
    .map((o) => [o.header.key.toLowerCase(), headerValueOf(o.header)]));
  return { code: ir.status && ir.status.code, body: Buffer.from(ir.body || ''), headers };
}

// An immediate response with `code` and an OpenAI-shaped error body.
function checkImmediate(res, code) {
  const im = res.immediate;
  assert.ok(im, `expected an immediate_response ${code}, got ${res.responses.map((r) => r.msg.response)}`);
  assert.equal(Number(im.code), code, `immediate_response status ${im.code}, body ${im.body}`);
  let json;
  assert.doesNotThrow(() => { json = JSON.parse(im.body.toString()); }, `body not JSON: ${im.body}`);
  assert.equal(typeof json.error, 'object', `no error object: ${im.body}`);
  assert.equal(typeof json.error.message, 'string');
  assert.ok(json.error.message.length > 0);
  assert.equal(typeof json.error.type, 'string');
  if (im.headers['content-type']) assert.match(im.headers['content-type'], /application\/json/);
  return json;
}

// ---------------------------------------------------------------------------------------
// Exchanges, as Envoy drives them in each body mode. Each resolves with
//   { responses, pick, immediate, streamed: [{body, endOfStream}], status }.

function finish(ex, responses) {
  ex.end();
  return ex.status.then((status) => {
    const picks = responses.map(pickOf).filter(Boolean);
    assert.ok(picks.length <= 1, `the endpoint header was set ${picks.length} times`);
    const immediate = responses.map(immediateOf).find(Boolean);
    const streamed = responses.map((r) => r.wire.streamed).filter(Boolean);
    return { responses, pick: picks[0], immediate, streamed, status };
  });
}

async function exchangeBuffered(client, body, { path, headers, metadata, raw } = {}) {
  const ex = client.open();
  const responses = [];
  ex.send(headersRequest(postHeaders(path, headers), { metadata, raw }));
  const first = await ex.next();
  responses.push(first);
  if (first.msg.response === 'request_headers') {
    assert.equal(pickOf(first), undefined, 'BUFFERED: picked before the body arrived');
    ex.send(bodyRequest(body, { endOfStream: true, metadata }));
    const second = await ex.next();
    responses.push(second);
    if (second.msg.response !== 'immediate_response') {
      assert.equal(second.msg.response, 'request_body');
    }
  }
  return finish(ex, responses);
}

async function exchangeStreamed(client, pieces, { path, headers, metadata } = {}) {
  const ex = client.open();
  const responses = [];
  ex.send(headersRequest(postHeaders(path, headers), { metadata }));
  // Envoy sends the body once the headers are answered, then chunk by chunk as it reads
  // them, each answered in turn.
  const first = await ex.next();
  responses.push(first);
  if (first.msg.response === 'request_headers') {
    assert.equal(pickOf(first), undefined, 'STREAMED: picked before the body arrived');
    pieces.forEach((p, i) => ex.send(bodyRequest(p, { endOfStream: i === pieces.length - 1 })));
    while (responses.length < 1 + pieces.length) {
      const r = await ex.next();
      responses.push(r);
      if (r.msg.response === 'immediate_response') break;
    }
  }
  const res = await finish(ex, responses);
  if (!res.immediate) {
    assert.deepEqual(responses.map((r) => r.msg.response),
      ['request_headers', ...pieces.map(() => 'request_body')]);
    assert.ok(pickOf(responses[responses.length - 1]), 'STREAMED: the pick is in the last request_body response');
  }
  return res;
}

// headersOnly: the request has no body (end_of_stream on the headers).
// protocolConfig: also send ProcessingRequest.protocol_config (field 11) on the first
// message, as newer Envoy does.
async function exchangeFullDuplex(client, pieces, {
  path, headers, metadata, headersOnly = false, protocolConfig, checkQuiet = false,
} = {}) {
  const ex = client.open();
  const responses = [];
  const extra = protocolConfig ? protocolConfigField(protocolConfig) : undefined;
  ex.send(headersRequest(postHeaders(path, headers), { metadata, endOfStream: headersOnly }), extra);
  if (!headersOnly) {
    ex.send(bodyRequest(pieces[0], { endOfStream: pieces.length === 1 }));
    if (checkQuiet && pieces.length > 1) {
      assert.ok(await ex.quietFor(150), 'FULL_DUPLEX_STREAMED: answered before the body ended');
    }
    pieces.slice(1).forEach((p, i) => ex.send(bodyRequest(p, { endOfStream: i === pieces.length - 2 })));
  }
  for (;;) {
    const r = await ex.next();
    responses.push(r);
    if (r.msg.response === 'immediate_response') break;
    if (headersOnly && r.msg.response === 'request_headers') break;
    if (r.wire.streamed && r.wire.streamed.endOfStream) break;
  }
  const res = await finish(ex, responses);
  if (!res.immediate) {
    assert.equal(responses[0].msg.response, 'request_headers', 'FULL_DUPLEX_STREAMED: headers answered first');
    assert.equal(res.pick && res.pick.where, 'request_headers', 'FULL_DUPLEX_STREAMED: pick in the headers response');
    for (const r of responses.slice(1)) {
      assert.equal(r.msg.response, 'request_body');
      assert.equal(r.wire.responseCase, 'request_body');
      assert.ok(r.wire.streamed, 'request_body response without streamed_response');
    }
  }
  return res;
}

// The body re-emitted under FULL_DUPLEX_STREAMED: chunk sizes, end_of_stream on the last
// only, and the same bytes as were sent.
function checkStreamedBody(res, sent) {
  assert.ok(res.streamed.length >= 1, 'no streamed_response chunk');
  res.streamed.forEach((c, i) => {
    assert.ok(c.body.length <= kMaxStreamedChunk, `chunk ${i}: ${c.body.length} bytes > ${kMaxStreamedChunk}`);
    assert.equal(c.endOfStream, i === res.streamed.length - 1, `chunk ${i}: end_of_stream ${c.endOfStream}`);
  });
  const back = Buffer.concat(res.streamed.map((c) => c.body));
  assert.equal(back.length, sent.length, 'streamed body length');
  assert.ok(back.equals(sent), 'streamed body differs from the body sent');
  assert.ok(res.streamed.length >= Math.ceil(sent.length / kMaxStreamedChunk));
  const cl = res.pick.setHeaders['content-length'];
  if (cl !== undefined) assert.equal(Number(cl), sent.length, 'Content-Length set to another length');
}

function statusOk(res) {
  assert.equal(res.status.code, grpc.status.OK, `stream closed with ${res.status.code} ${res.status.details}`);
}

// ---------------------------------------------------------------------------------------

test('gRPC health: liveness, readiness and ExternalProcessor SERVING once metrics are in', async () => {
  for (const mode of ['buffered', 'streamed', 'full_duplex_streamed']) {
    const h = epp[mode].health;
    for (const service of ['liveness', 'readiness', 'envoy.service.ext_proc.v3.ExternalProcessor']) {
      assert.equal(await healthCheck(h, service), 'SERVING', `${mode}: ${service}`);
    }
    await assert.rejects(healthCheck(h, 'no.such.Service'), (e) => e.code === grpc.status.NOT_FOUND);
  }
  // No endpoint answers its scrapes: alive, never ready.
  assert.equal(await healthCheck(epp.dead.health, 'liveness'), 'SERVING');
  assert.notEqual(await healthCheck(epp.dead.health, 'readiness'), 'SERVING');
});

test('BUFFERED: completions and chat, the pick in the request_body response', async () => {
  const pool = epp.buffered.endpoints;
  for (const raw of [true, false]) {  // header values as raw_value (newer Envoy) and value
    const a = await exchangeBuffered(clients.buffered, completionBody(prompt(300, raw ? 1 : 2)), { raw });
    statusOk(a);
    assert.equal(a.pick.where, 'request_body');
    checkPick(a.pick, pool);
    const b = await exchangeBuffered(clients.buffered, chatBody(prompt(500, raw ? 3 : 4)),
      { path: '/v1/chat/completions', raw });
    statusOk(b);
    assert.equal(b.pick.where, 'request_body');
    checkPick(b.pick, pool);
  }
});

// Prefill/decode (issue 25): a picker whose pool labels two replicas prefill and two
// decode. A long prompt is routed to a decode replica with x-prefiller-host-port naming a
// prefill one (the llm-d contract); a short one goes to a decode replica without it.
test('P/D: x-prefiller-host-port names a prefill endpoint, the destination a decode one', async () => {
  const [p1, p2, d1, d2] = sim.endpoints;
  const pd = await startEpp({
    endpoints: [{ address: p1, role: 'prefill' }, { address: p2, role: 'prefill' },
      { address: d1, role: 'decode' }, { address: d2, role: 'decode' }],
    bodyMode: 'buffered', fallbacks: 1,
  });
  const client = new ExtProcClient(pd.grpc);
  try {
    await waitForHealth(pd.health, 'readiness');
    const prefillerOf = (r) => {
      const set = (commonOf(r.responses[1].msg).header_mutation || {}).set_headers || [];
      const h = set.find((o) => o.header && o.header.key === 'x-prefiller-host-port');
      return h ? headerValueOf(h.header) : undefined;
    };
    for (let i = 0; i < 4; i++) {
      const long = await exchangeBuffered(client, completionBody(prompt(6000, 40 + i)));
      statusOk(long);
      assert.ok([d1, d2].includes(long.pick.header.split(',')[0]), long.pick.header);
      for (const d of long.pick.header.split(',')) assert.ok([d1, d2].includes(d), d);
      assert.ok([p1, p2].includes(prefillerOf(long)), String(prefillerOf(long)));
    }
    const short = await exchangeBuffered(client, completionBody('short question'));
    statusOk(short);
    assert.ok([d1, d2].includes(short.pick.header.split(',')[0]), short.pick.header);
    assert.equal(prefillerOf(short), undefined);
    const metrics = await new Promise((resolve, reject) => {
      http.get(`http://${pd.metrics}/metrics`, (res) => {
        let text = '';
        res.on('data', (c) => { text += c; });
        res.on('end', () => resolve(text));
      }).on('error', reject);
    });
    assert.match(metrics, /kvroute_pd_decisions_total\{decision="disaggregate"\} 4(\.0)?\n/);
    assert.match(metrics, /kvroute_pd_decisions_total\{decision="short_prompt"\} 1(\.0)?\n/);
  } finally {
    client.close();
    await stop(pd.proc);
  }
});

// Envoy's part after the pick, played by the test: the request goes to the destination
// the picker chose (a decode pod's kvroute sidecar) with the headers it set.
function postTo(address, body, headers) {
  return new Promise((resolve, reject) => {
    const [host, port] = address.split(':');
    const req = http.request({
      host, port, method: 'POST', path: '/v1/completions',
      headers: { 'content-type': 'application/json', ...headers },
    }, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

function getText(address, path) {
  return new Promise((resolve, reject) => {
    http.get(`http://${address}${path}`, (res) => {
      let text = '';
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve(text));
    }).on('error', reject);
  });
}

// The sum of a metric family's samples whose labels include `match` (e.g. 'leg="prefill"').
function metricSum(text, name, match = '') {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name) || (line[name.length] !== '{' && line[name.length] !== ' ')) continue;
    if (match && !line.includes(match)) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

test('P/D: the decode pod\'s kvroute sidecar completes the picked request against the sim', async () => {
  const [p1, p2, d1, d2] = sim.endpoints;
  // Each decode pod: its engine (a sim replica) behind a sidecar; the pool targets the sidecars
  // (as an InferencePool's target port does) and scrapes the engines through them.
  const sidecars = await Promise.all([startSidecar(d1), startSidecar(d2)]);
  const [s1, s2] = sidecars.map((s) => s.address);
  const pd = await startEpp({
    endpoints: [{ address: p1, role: 'prefill' }, { address: p2, role: 'prefill' },
      { address: s1, role: 'decode' }, { address: s2, role: 'decode' }],
    bodyMode: 'buffered', fallbacks: 0,
  });
  const client = new ExtProcClient(pd.grpc);
  try {
    await waitForHealth(pd.health, 'readiness');
    const before = {};
    for (const e of [p1, p2, d1, d2]) before[e] = await getText(e, '/metrics');
    const body = completionBody(prompt(6000, 77), { max_tokens: 4, stream: true, stream_options: { include_usage: true } });
    const picked = await exchangeBuffered(client, body);
    statusOk(picked);
    const set = (commonOf(picked.responses[1].msg).header_mutation || {}).set_headers || [];
    const headers = {};
    for (const o of set) if (o.header) headers[o.header.key] = headerValueOf(o.header);
    const destination = picked.pick.header;
    assert.ok([s1, s2].includes(destination), destination);
    const prefiller = headers['x-prefiller-host-port'];
    assert.ok([p1, p2].includes(prefiller), String(prefiller));
    const res = await postTo(destination, body, headers);
    assert.equal(res.status, 200, res.body);
    assert.match(res.body, /"completion_tokens":4/);
    assert.ok(res.body.endsWith('data: [DONE]\n\n'), res.body.slice(-40));
    // The named prefill replica ran the prefill leg; the decode pod's engine pulled it.
    const engine = destination === s1 ? d1 : d2;
    const delta = async (e, name, match) => metricSum(await getText(e, '/metrics'), name, match) -
      metricSum(before[e], name, match);
    assert.equal(await delta(prefiller, 'kvroute_sim_pd_prefill_requests_total'), 1);
    assert.equal(await delta(prefiller === p1 ? p2 : p1, 'kvroute_sim_pd_prefill_requests_total'), 0);
    assert.equal(await delta(engine, 'kvroute_sim_pd_kv_pulls_total'), 1);
    assert.equal(await delta(engine, 'vllm:generation_tokens_total'), 4);
    const sc = await getText(destination, '/sidecar/metrics');
    assert.equal(metricSum(sc, 'kvroute_pd_legs_total', 'leg="prefill",outcome="ok"'), 1);
    assert.equal(metricSum(sc, 'kvroute_pd_legs_total', 'leg="decode",outcome="ok"'), 1);
    assert.equal(metricSum(sc, 'kvroute_pd_fallbacks_total'), 0);
  } finally {
    client.close();
    await Promise.all([stop(pd.proc), ...sidecars.map((s) => stop(s.proc))]);
  }
});

test('STREAMED: a body in several request_body messages', async () => {
  const pool = epp.streamed.endpoints;
  for (const n of [1, 3, 7]) {
    const body = completionBody(prompt(4000, 10 + n));
    const res = await exchangeStreamed(clients.streamed, split(body, n));
    statusOk(res);
    checkPick(res.pick, pool);
  }
  const chat = chatBody(prompt(3000, 20));
  const res = await exchangeStreamed(clients.streamed, split(chat, 5), { path: '/v1/chat/completions' });
  checkPick(res.pick, pool);
});

test('FULL_DUPLEX_STREAMED: silent until end_of_stream, pick in request_headers, body back as streamed_response', async () => {
  const pool = epp.full_duplex_streamed.endpoints;
  for (const n of [1, 4, 9]) {
    const body = completionBody(prompt(5000, 30 + n));
    const res = await exchangeFullDuplex(clients.full_duplex_streamed, split(body, n), { checkQuiet: n === 4 });
    statusOk(res);
    checkPick(res.pick, pool);
    checkStreamedBody(res, body);
  }
  const chat = chatBody(prompt(2000, 40));
  const res = await exchangeFullDuplex(clients.full_duplex_streamed, split(chat, 3), { path: '/v1/chat/completions' });
  checkPick(res.pick, pool);
  checkStreamedBody(res, chat);
});

test('a request without a body (end_of_stream on the headers) is picked at once', async () => {
  const res = await exchangeFullDuplex(clients.full_duplex_streamed, [], {
    headersOnly: true, headers: { ':method': 'GET', ':path': '/v1/models' },
  });
  statusOk(res);
  checkPick(res.pick, epp.full_duplex_streamed.endpoints);
  assert.equal(res.streamed.length, 0);
});

test('a 220 KB prompt in every mode', async () => {
  const body = completionBody(prompt(220 * 1024, 50));
  assert.ok(body.length > 220 * 1024);
  const buffered = await exchangeBuffered(clients.buffered, body);
  checkPick(buffered.pick, epp.buffered.endpoints);
  // Envoy forwards a streamed body in the pieces it read, here 64 KiB.
  const streamed = await exchangeStreamed(clients.streamed, chunksOf(body, 64 * 1024));
  checkPick(streamed.pick, epp.streamed.endpoints);
  const duplex = await exchangeFullDuplex(clients.full_duplex_streamed, chunksOf(body, 64 * 1024));
  checkPick(duplex.pick, epp.full_duplex_streamed.endpoints);
  checkStreamedBody(duplex, body);
  assert.equal(duplex.streamed.length, Math.ceil(body.length / kMaxStreamedChunk));
});

test('a malformed body: immediate 400 with an OpenAI-shaped error', async () => {
  const bad = Buffer.from(`{"model": "${kModel}", "prompt": "unterminated`);
  checkImmediate(await exchangeBuffered(clients.buffered, bad), 400);
  checkImmediate(await exchangeStreamed(clients.streamed, split(bad, 2)), 400);
  checkImmediate(await exchangeFullDuplex(clients.full_duplex_streamed, split(bad, 3)), 400);
  checkImmediate(await exchangeBuffered(clients.buffered, Buffer.from('not json at all')), 400);
});

test('a body over limits.max_body_bytes: immediate 413', async () => {
  const body = completionBody(prompt(1100 * 1024, 60));  // limit 1 MiB
  checkImmediate(await exchangeFullDuplex(clients.full_duplex_streamed, chunksOf(body, 64 * 1024)), 413);
  checkImmediate(await exchangeBuffered(clients.buffered, body), 413);
});

test('no endpoint up: immediate 503', async () => {
  const body = completionBody(prompt(200, 70));
  checkImmediate(await exchangeFullDuplex(clients.dead, split(body, 2)), 503);
  checkImmediate(await exchangeFullDuplex(clients.dead, [], {
    headersOnly: true, headers: { ':method': 'GET', ':path': '/v1/models' },
  }), 503);
});

test('subset hint: only the hinted endpoints are picked; none matching -> 503', async () => {
  const pool = epp.buffered.endpoints;
  for (const hinted of [pool[2], pool[0], pool[3]]) {
    const res = await exchangeBuffered(clients.buffered, completionBody(prompt(800, 80)),
      { metadata: subsetHint([hinted]) });
    assert.deepEqual(checkPick(res.pick, pool, { candidates: [hinted] }), [hinted]);
  }
  const two = [pool[1], pool[3]];
  const res = await exchangeFullDuplex(clients.full_duplex_streamed, split(completionBody(prompt(800, 81)), 2),
    { metadata: subsetHint(two) });
  assert.deepEqual(checkPick(res.pick, pool, { candidates: two }).sort(), [...two].sort());
  const [closed] = await deadPorts(1);
  checkImmediate(await exchangeBuffered(clients.buffered, completionBody(prompt(800, 82)),
    { metadata: subsetHint([`127.0.0.1:${closed}`]) }), 503);
});

test('same-prefix requests get the same endpoint', async () => {
  const shared = prompt(6000, 90);  // well past several 16-token blocks
  for (const [mode, run] of [
    ['buffered', (b) => exchangeBuffered(clients.buffered, b)],
    ['full_duplex_streamed', (b) => exchangeFullDuplex(clients.full_duplex_streamed, split(b, 3))],
  ]) {
    const winners = [];
    for (let i = 0; i < 6; i++) {
      const res = await run(completionBody(`${shared} question ${i}: ${mode}?`));
      winners.push(checkPick(res.pick, epp[mode].endpoints)[0]);
    }
    assert.equal(new Set(winners).size, 1, `${mode}: same prefix went to ${winners.join(', ')}`);
  }
});

test('200 concurrent streams are all answered with one of the pool', async () => {
  const t0 = Date.now();
  const results = await Promise.all(Array.from({ length: 200 }, (_, i) => {
    const body = completionBody(prompt(2000, 1000 + i));
    if (i % 2) return exchangeBuffered(clients.buffered, body).then((r) => [r, epp.buffered]);
    return exchangeFullDuplex(clients.full_duplex_streamed, split(body, 2))
      .then((r) => { checkStreamedBody(r, body); return [r, epp.full_duplex_streamed]; });
  }));
  const used = new Set();
  for (const [res, e] of results) {
    statusOk(res);
    used.add(checkPick(res.pick, e.endpoints, { exact: false })[0]);
  }
  assert.equal(results.length, 200);
  process.stdout.write(`# 200 concurrent streams in ${Date.now() - t0} ms, winners on ${used.size} endpoints\n`);
});

test('protocol_config (field 11) sent by newer Envoy overrides the configured mode', async () => {
  const body = completionBody(prompt(3000, 95));
  const res = await exchangeFullDuplex(clients.buffered, split(body, 3), { protocolConfig: 'FULL_DUPLEX_STREAMED' });
  statusOk(res);
  checkPick(res.pick, epp.buffered.endpoints);
  checkStreamedBody(res, body);
});

test('Prometheus text on the metrics port', async () => {
  const text = await new Promise((resolve, reject) => {
    http.get(`http://${epp.buffered.metrics}/metrics`, (r) => {
      let data = '';
      r.on('data', (d) => { data += d; });
      r.on('end', () => (r.statusCode === 200 ? resolve(data) : reject(new Error(`HTTP ${r.statusCode}`))));
    }).on('error', reject);
  });
  assert.match(text, /^# (HELP|TYPE) /m);
  assert.match(text, /^inference_pool_ready_pods(\{[^}]*\})? 4(\.0*)?$/m);
  assert.match(text, /^inference_objective_request_total(\{[^}]*\})? [1-9]/m);
});

// llm-d Router v1.0's names (REFERENCE.md 17) on the picker's /metrics, beside the older
// ones, checked by Debian's Prometheus tooling: promtool parses the exposition (exit 1 on
// a format error) and lints it; the only lint finding allowed is the one llm-d's own
// prefix draws ("llm_d_" reads as the abbreviated unit "d").
test('promtool check metrics, and llm-d Router v1.0 names beside the older ones', async () => {
  const text = await new Promise((resolve, reject) => {
    http.get(`http://${epp.buffered.metrics}/metrics`, (r) => {
      let data = '';
      r.on('data', (d) => { data += d; });
      r.on('end', () => resolve(data));
    }).on('error', reject);
  });
  for (const name of [
    'llm_d_epp_request_total', 'llm_d_epp_request_error_total', 'llm_d_epp_request_duration_seconds',
    'llm_d_epp_request_input_tokens', 'llm_d_epp_request_output_tokens', 'llm_d_epp_request_cached_tokens',
    'llm_d_epp_request_running', 'llm_d_epp_request_ttft_seconds', 'llm_d_epp_request_ntpot_seconds',
    'llm_d_epp_average_kv_cache_utilization', 'llm_d_epp_average_queue_size',
    'llm_d_epp_average_running_requests', 'llm_d_epp_std_dev_kv_cache_utilization',
    'llm_d_epp_std_dev_queue_size', 'llm_d_epp_ready_endpoints', 'llm_d_epp_per_endpoint_queue_size',
    'llm_d_epp_scheduler_e2e_duration_seconds', 'llm_d_epp_scheduler_attempts_total',
    'llm_d_epp_plugin_duration_seconds', 'inference_extension_plugin_duration_seconds',
    'llm_d_epp_flow_control_pool_saturation', 'llm_d_epp_request_predicted_ttft_seconds',
    'llm_d_epp_request_predicted_tpot_seconds', 'llm_d_epp_request_slo_violation_total',
    'inference_objective_request_total', 'inference_pool_ready_pods', 'inference_pool_per_pod_queue_size',
  ]) {
    assert.match(text, new RegExp(`^# TYPE ${name} `, 'm'), name);
  }
  // The same samples under both names.
  const sample = (re) => (text.match(re) || [])[1];
  assert.equal(sample(/^llm_d_epp_ready_endpoints\{[^}]*\} (\S+)$/m), sample(/^inference_pool_ready_pods\{[^}]*\} (\S+)$/m));
  const { spawnSync } = require('node:child_process');
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.ok(!r.error, `promtool: ${r.error} (scripts/install-deps.sh installs Debian's prometheus)`);
  assert.notEqual(r.status, 1, `promtool found format errors:\n${r.stdout}${r.stderr}`);
  const findings = `${r.stdout}${r.stderr}`.split('\n').filter((l) => l.trim() !== '');
  const others = findings.filter((l) => !/^llm_d_epp_\S+ metric names should not contain abbreviated units$/.test(l));
  assert.deepEqual(others, [], findings.join('\n'));
  assert.equal(r.status, findings.length ? 3 : 0);
});
