'use strict';
// The Grafana dashboard (deploy/grafana/kvroute.json) and the alert rules
// (deploy/prometheus/kvroute-rules.yaml) against Debian's real Prometheus scraping a live
// fleet: `kvroute sim` replicas publishing KV events, `kvroute serve` in front of them (KV
// events, flow control, API keys, an HTTPS listener) and `kvroute epp` (KV events, flow
// control) driven by the Envoy-side client. After traffic through both (shared prefixes,
// streamed answers with objectives, every replica answering 503 for a moment), every
// expression of every panel, with the dashboard's variables at "All", must return at least
// one series with a number (not NaN), and every alert rule must evaluate without error
// over series names that exist (Prometheus also scrapes the replicas, as job vllm).
// Run: KVROUTE_BINARY=build/kvroute node --test tests/interop/dashboard.test.js

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const { spawn } = require('node:child_process');
const {
  ExtProcClient, headersRequest, bodyRequest, postHeaders, headerValueOf, protocolConfigField,
} = require('./envoy_client');
const { selfSignedPair, startSimWithEvents, startServe, startEpp, stop, closedPorts, waitForHealth, tempDir } = require('./harness');
const dashboardSource = require('../../deploy/grafana/build-dashboard.js');

const kRepo = path.join(__dirname, '..', '..');
const kDashboard = path.join(kRepo, 'deploy', 'grafana', 'kvroute.json');
const kRules = path.join(kRepo, 'deploy', 'prometheus', 'kvroute-rules.yaml');
const kModel = 'meta-llama/Llama-3.1-8B-Instruct';
const kKey = 'sk-dashboard-1';
const kPrometheus = process.env.PROMETHEUS_BINARY || '/usr/bin/prometheus';
// What the panels' $__rate_interval becomes: longer than the whole test, so every rate
// covers all of its traffic.
const kRateInterval = '2m';

let sim;
let serve;
let epp;
let client;
let prom;

function request(address, method, urlPath, { body, headers = {}, protocol = http } = {}) {
  const [host, port] = address.split(':');
  return new Promise((resolve, reject) => {
    const req = protocol.request({ host, port: Number(port), method, path: urlPath,
      headers: body ? { 'content-type': 'application/json', 'content-length': body.length, ...headers } : headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

async function waitFor(what, cond, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}


// Debian's prometheus on a free port, scraping serve (job kvroute-serve) and epp
// (kvroute-epp) every second and evaluating the alert rules every second.
async function startPrometheus(targets) {
  const dir = fs.mkdtempSync(path.join(tempDir, 'prometheus-'));
  const [port] = await closedPorts(1);
  const config = path.join(dir, 'prometheus.yml');
  fs.writeFileSync(config, [
    'global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}',
    `rule_files: ["${kRules}"]`,
    'scrape_configs:',
    ...Object.entries(targets).map(([job, addresses]) =>
      `  - {job_name: ${job}, static_configs: [{targets: [${[addresses].flat().map((a) => `"${a}"`).join(', ')}]}]}`),
    ''].join('\n'));
  const proc = spawn(kPrometheus, [`--config.file=${config}`, `--storage.tsdb.path=${path.join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], { stdio: ['ignore', 'ignore', 'pipe'] });
  proc.log = [];
  proc.stderr.on('data', (d) => { proc.log.push(d.toString()); });
  process.on('exit', () => proc.kill('SIGKILL'));
  const address = `127.0.0.1:${port}`;
  await waitFor('prometheus ready', async () => {
    if (proc.exitCode !== null) throw new Error(`prometheus exited (${proc.exitCode}): ${proc.log.join('')}`);
    const r = await request(address, 'GET', '/-/ready').catch(() => null);
    return r && r.status === 200;
  });
  return { proc, address };
}

async function promApi(urlPath) {
  const r = await request(prom.address, 'GET', urlPath);
  const j = JSON.parse(r.body.toString());
  if (j.status !== 'success') throw new Error(`${urlPath}: ${r.body}`);
  return j.data;
}

// Resolves once every target was scraped twice after `t` (ms since the epoch).
async function scrapedAfter(t) {
  await waitFor('scrapes after the traffic', async () => {
    const targets = (await promApi('/api/v1/targets')).activeTargets;
    return targets.every((x) => Date.parse(x.lastScrape) > t + 1000);
  });
}

const query = (expr) => promApi(`/api/v1/query?query=${encodeURIComponent(expr)}`);

// One completion through serve (the API key, optionally streamed with objectives).
async function viaServe(prompt, { stream = false, maxTokens = 4 } = {}) {
  const body = Buffer.from(JSON.stringify({ model: kModel, prompt, max_tokens: maxTokens, stream }));
  const headers = { authorization: `Bearer ${kKey}` };
  if (stream) Object.assign(headers, { 'x-llm-d-slo-ttft-ms': '2000', 'x-llm-d-slo-tpot-ms': '200' });
  return request(serve.address, 'POST', '/v1/completions', { body, headers });
}

// One request as Envoy drives it through epp (FULL_DUPLEX_STREAMED), sent on to the
// replica picked and its response handed back on the stream.
async function viaEpp(prompt) {
  const body = Buffer.from(JSON.stringify({ model: kModel, prompt, max_tokens: 4 }));
  const ex = client.open();
  // Response bodies STREAMED to the picker (protocol_config, as newer Envoy sends it): it
  // times the first byte (TTFT) and the rest (TPOT).
  ex.send(headersRequest(postHeaders()), protocolConfigField('FULL_DUPLEX_STREAMED', 'STREAMED'));
  ex.send(bodyRequest(body, { endOfStream: true }));
  const first = await ex.next();
  assert.equal(first.msg.response, 'request_headers');
  const set = first.msg.request_headers.response.header_mutation.set_headers;
  const h = set.find((o) => o.header.key.toLowerCase() === 'x-gateway-destination-endpoint');
  assert.ok(h, 'no pick');
  const dest = headerValueOf(h.header).split(',')[0];
  for (;;) {
    const r = await ex.next();
    if (r.wire.streamed && r.wire.streamed.endOfStream) break;
  }
  const resp = await request(dest, 'POST', '/v1/completions', { body });
  ex.send({ response_headers: { headers: { headers: [{ key: ':status', raw_value: Buffer.from(String(resp.status)) }] } } });
  assert.equal((await ex.next()).msg.response, 'response_headers');
  // The body in two chunks a few milliseconds apart, as an engine streams it.
  const half = Math.floor(resp.body.length / 2);
  ex.send({ response_body: { body: resp.body.subarray(0, half), end_of_stream: false } });
  assert.equal((await ex.next()).msg.response, 'response_body');
  await new Promise((r) => setTimeout(r, 5));
  ex.send({ response_body: { body: resp.body.subarray(half), end_of_stream: true } });
  assert.equal((await ex.next()).msg.response, 'response_body');
  ex.end();
  await ex.status;
  return resp.status;
}

// Prompts of four families, each a long shared context and a short question.
function prompt(family, i) {
  return `${`family ${family} shared context. `.repeat(40)}question ${i}`;
}

before(async () => {
  sim = await startSimWithEvents(3, 1024);
  const endpoints = sim.endpoints.map((e, i) =>
    `{address: ${e}, name: r${i}, kv_events: "${sim.kvEvents[i]}", kv_events_replay: "${sim.kvReplay[i]}"}`);
  const keys = path.join(tempDir, 'dashboard-keys.txt');
  fs.writeFileSync(keys, `dash ${kKey}\n`);
  serve = await startServe(endpoints, [
    'flow:', '  enabled: true', '  ttl: 30s',
    'auth:', `  api_keys_file: ${path.basename(keys)}`,
  ], { tls: selfSignedPair('kvroute-serve', { days: 30 }), poolExtra: ['  kv_events: {speculative_ttl: 100ms}'] });
  epp = await startEpp({
    endpoints, bodyMode: 'full_duplex_streamed', poolExtra: ['  kv_events: {speculative_ttl: 100ms}'],
    extra: ['flow:', '  enabled: true', '  ttl: 30s'],
  });
  client = new ExtProcClient(epp.grpc);
  await waitForHealth(epp.health, 'readiness');
  // The replicas too (job vllm), as in a cluster: KvroutePrefixHitRateLow reads them.
  prom = await startPrometheus({ 'kvroute-serve': serve.address, 'kvroute-epp': epp.metrics, vllm: sim.endpoints });
});

after(async () => {
  if (client) client.close();
  await Promise.all([prom && stop(prom.proc), epp && stop(epp.proc), serve && stop(serve.proc), sim && stop(sim.proc)]);
});

test('the committed dashboard is what build-dashboard.js makes', () => {
  assert.equal(fs.readFileSync(kDashboard, 'utf8'), dashboardSource.text,
    'deploy/grafana/kvroute.json is out of date: run node deploy/grafana/build-dashboard.js');
});

test('every panel of the dashboard returns data from a live fleet; every alert rule evaluates', async () => {
  // Every target up (serve, epp, the replicas) before the traffic.
  await waitFor('every target up', async () => {
    const t = await promApi('/api/v1/targets');
    return t.activeTargets.length === 2 + sim.endpoints.length && t.activeTargets.every((x) => x.health === 'up');
  });

  // Two phases of traffic with scrapes between them: a series is born when its first
  // request is counted, and a rate sees only increases after its first sample.
  // Phase 1. serve: one unauthenticated request (refused), and 20 streamed completions
  // with objectives, enough samples (16) for the latency model to predict from then on;
  // epp: a few requests once every replica's events are live there.
  assert.equal((await request(serve.address, 'POST', '/v1/completions',
    { body: Buffer.from(JSON.stringify({ model: kModel, prompt: 'x' })) })).status, 401);
  for (let i = 0; i < 20; i++) {
    const r = await viaServe(prompt(i % 4, i), { stream: true });
    assert.equal(r.status, 200, r.body.toString());
  }
  let eppMetrics = '';
  await waitFor('KV events live at epp', async () => {
    eppMetrics = (await request(epp.metrics, 'GET', '/metrics')).body.toString();
    return (eppMetrics.match(/^kvroute_kv_events_state\{[^}]*state="live"\} 1(\.0)?$/mg) || []).length === 3;
  }).catch((e) => { throw new Error(`${e.message}\n${eppMetrics.split('\n').filter((l) => l.startsWith('kvroute_kv_events')).join('\n')}`); });
  for (let i = 0; i < 4; i++) assert.equal(await viaEpp(prompt(8 + (i % 2), i)), 200);
  await scrapedAfter(Date.now());

  // Phase 2. serve: shared-prefix completions, half of them streamed, then every replica
  // answering 503 for three requests (upstream errors, retries, 503s); epp: more
  // shared-prefix requests and one it refuses.
  for (let i = 0; i < 24; i++) {
    const r = await viaServe(prompt(i % 4, 20 + i), { stream: i % 2 === 1 });
    assert.equal(r.status, 200, r.body.toString());
  }
  for (const e of sim.endpoints) {
    const fault = await request(e, 'POST', '/admin/fault', { body: Buffer.from(JSON.stringify({ kind: 'http_error' })) });
    assert.equal(fault.status, 200, fault.body.toString());
  }
  for (let i = 0; i < 3; i++) assert.equal((await viaServe(prompt(4, i))).status, 503);
  const m = (await request(serve.address, 'GET', '/metrics')).body.toString();
  assert.match(m, /^kvroute_upstream_errors_total\{/m);
  for (const e of sim.endpoints) assert.equal((await request(e, 'DELETE', '/admin/fault')).status, 200);
  for (let i = 0; i < 12; i++) assert.equal(await viaEpp(prompt(8 + (i % 2), 4 + i)), 200);
  // And a body that is not JSON: epp answers 400 itself (llm_d_epp_request_error_total).
  const bad = client.open();
  bad.send(headersRequest(postHeaders()));
  bad.send(bodyRequest(Buffer.from('{"model": '), { endOfStream: true }));
  const refused = await bad.next();
  assert.equal(refused.msg.response, 'immediate_response');
  bad.end();
  await bad.status;

  // Every rule evaluated at least once after the traffic, without error.
  const t0 = Date.now();
  await waitFor('a rule evaluation after the traffic', async () => {
    const g = (await promApi('/api/v1/rules')).groups;
    return g.length > 0 && g.every((x) => Date.parse(x.lastEvaluation) > t0);
  });
  // And the routers scraped after it.
  await scrapedAfter(t0);

  // The variables: label_values(kvroute_endpoint_up, job) has both routers, and each
  // instance variable value is one of them.
  const dash = JSON.parse(fs.readFileSync(kDashboard, 'utf8'));
  const vars = Object.fromEntries(dash.templating.list.map((v) => [v.name, v]));
  assert.deepEqual(Object.keys(vars).sort(), ['datasource', 'instance', 'job']);
  const jobs = await promApi(`/api/v1/label/job/values?match[]=${encodeURIComponent('kvroute_endpoint_up')}`);
  assert.deepEqual(jobs.sort(), ['kvroute-epp', 'kvroute-serve']);
  const instances = await promApi(`/api/v1/label/instance/values?match[]=${encodeURIComponent('kvroute_endpoint_up{job=~".+"}')}`);
  assert.deepEqual(instances.sort(), [epp.metrics, serve.address].sort());
  assert.equal(vars.job.query.query, 'label_values(kvroute_endpoint_up, job)');
  assert.equal(vars.instance.query.query, 'label_values(kvroute_endpoint_up{job=~"$job"}, instance)');

  // Every panel's every expression, the variables at "All" (their allValue); a panel
  // whose title names one router ("(serve)", "(epp)") with the job variable at that
  // router's job alone.
  const substitute = (expr, job) => expr.replaceAll('$job', job)
    .replaceAll('$instance', vars.instance.allValue).replaceAll('$__rate_interval', kRateInterval);
  const panels = dash.panels.filter((p) => p.type !== 'row');
  assert.ok(panels.length >= 40, `${panels.length} panels`);
  const failures = [];
  let checked = 0;
  for (const p of panels) {
    assert.ok(p.targets.length > 0, `${p.title}: no targets`);
    const only = /\((serve|epp)\)$/.exec(p.title);
    const job = only ? `kvroute-${only[1]}` : vars.job.allValue;
    for (const t of p.targets) {
      assert.ok(!/\$(?!__rate_interval|job|instance)\w/.test(t.expr), `${p.title} ${t.refId}: unknown variable in ${t.expr}`);
      const data = await query(substitute(t.expr, job));
      checked++;
      const numbers = data.result.filter((s) => !Number.isNaN(Number(s.value[1])));
      if (data.result.length === 0) failures.push(`${p.title} (${t.refId}), job ${job}: no series: ${t.expr}`);
      else if (numbers.length === 0) failures.push(`${p.title} (${t.refId}), job ${job}: only NaN: ${t.expr}`);
    }
  }
  assert.deepEqual(failures, [], `${failures.length} of ${checked} expressions returned no data`);

  // The rules loaded and evaluated without error (their firing is promtool's unit tests').
  const rules = (await promApi('/api/v1/rules')).groups.flatMap((g) => g.rules);
  assert.equal(rules.length, 13);
  for (const r of rules) assert.equal(r.health, 'ok', `${r.name}: ${r.lastError}`);
  // Every series name a rule reads exists in this fleet (the unit tests' synthetic series
  // would share a misspelt name with the rule): the names, and the __name__ regexes.
  const missing = [];
  for (const r of rules) {
    const names = new Set(r.query.match(/\b(?:kvroute|llm_d_epp)_[a-z0-9_]+|\bvllm:[a-z0-9_]+\b(?!\()/g) || []);
    const selectors = [...names, ...[...r.query.matchAll(/\{__name__=~"([^"]+)"\}/g)].map((m) => `{__name__=~"${m[1]}"}`)];
    assert.ok(selectors.length > 0, `${r.name}: no series names in ${r.query}`);
    for (const sel of selectors) {
      if ((await query(`count(${sel})`)).result.length === 0) missing.push(`${r.name}: ${sel}`);
    }
  }
  assert.deepEqual(missing, []);
});
