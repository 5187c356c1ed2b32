'use strict';
// End to end, with the real binaries (issue 9's "done when"): `kvroute epp --pool-name P
// --pool-namespace N --kubeconfig K` against fake-kube-apiserver, a stand-in for the
// Kubernetes API server's list/watch protocol over TLS (tests/adapters/k8s/fake_api_server.h; no
// cluster runs here). The InferencePool's targetPorts are the ports of `kvroute sim
// --replicas 4`, all on one pod IP (127.0.0.1). The Envoy side of ext_proc is played by
// the client built from Envoy's published protos (envoy_client.js).
//
// Run: KVROUTE_BINARY=build/kvroute FAKE_KUBE_APISERVER=build/tests/fake-kube-apiserver \
//        node --test tests/interop/epp_kubernetes.test.js

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const { ExtProcClient, headersRequest, bodyRequest, postHeaders, fromStruct, headerValueOf } = require('./envoy_client');
const { startSim, startEpp, stop, waitForHealth, tempDir } = require('./harness');

const kHeader = 'x-gateway-destination-endpoint';
const kPods = '/api/v1/namespaces/ns/pods';
const kPools = '/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools';

// fake-kube-apiserver driven over its stdin: one command, one answer line.
class FakeApiServer {
  static async start(kubeconfig) {
    const bin = process.env.FAKE_KUBE_APISERVER;
    if (!bin || !fs.existsSync(bin)) throw new Error(`FAKE_KUBE_APISERVER=${bin}: no such binary`);
    const s = new FakeApiServer();
    s.proc = spawn(bin, ['--kubeconfig-out', kubeconfig, '--namespace', 'ns'], { stdio: ['pipe', 'pipe', 'inherit'] });
    s.lines = [];
    s.waiters = [];
    readline.createInterface({ input: s.proc.stdout }).on('line', (l) => {
      const w = s.waiters.shift();
      if (w) w(l); else s.lines.push(l);
    });
    const first = await s.line();
    assert.match(first, /^ready \d+$/);
    return s;
  }

  line() {
    if (this.lines.length) return Promise.resolve(this.lines.shift());
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error('fake-kube-apiserver: no answer in 10 s')), 10000);
      this.waiters.push((l) => { clearTimeout(t); resolve(l); });
    });
  }

  async command(text) {
    this.proc.stdin.write(`${text}\n`);
    const answer = await this.line();
    assert.match(answer, /^ok \d+$/, `${text} -> ${answer}`);
  }

  put(collection, object) { return this.command(`put ${collection} ${JSON.stringify(object)}`); }

  async stop() {
    this.proc.stdin.end();
    await new Promise((r) => (this.proc.exitCode !== null ? r() : this.proc.once('exit', r)));
  }
}

function pod(name, ready) {
  return {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name, namespace: 'ns', labels: { app: 'vllm-llama', 'topology.kubernetes.io/zone': 'z1' } },
    status: { phase: 'Running', podIP: '127.0.0.1', conditions: [{ type: 'Ready', status: ready ? 'True' : 'False' }] },
  };
}

function pool(ports) {
  return {
    apiVersion: 'inference.networking.k8s.io/v1', kind: 'InferencePool',
    metadata: { name: 'vllm-llama', namespace: 'ns' },
    spec: {
      selector: { matchLabels: { app: 'vllm-llama' } },
      targetPorts: ports.map((number) => ({ number })),
      endpointPickerRef: { name: 'kvroute-epp', port: { number: 9002 }, failureMode: 'FailClose' },
    },
  };
}

let api;
let sim;
let epp;
let client;
const kubeconfig = path.join(tempDir, 'kubeconfig.yaml');

before(async () => {
  api = await FakeApiServer.start(kubeconfig);
  await api.command(`crd ${kPools}`);
  sim = await startSim(4);
  const ports = sim.endpoints.map((e) => Number(e.split(':')[1]));
  await api.put(kPools, pool(ports));
  await api.put(kPods, pod('vllm-llama-0', true));
  epp = await startEpp({
    endpoints: [], bodyMode: 'buffered',
    args: ['--pool-name', 'vllm-llama', '--pool-namespace', 'ns', '--kubeconfig', kubeconfig],
  });
  client = new ExtProcClient(epp.grpc);
});

after(async () => {
  if (client) client.close();
  await Promise.all([epp && stop(epp.proc), sim && stop(sim.proc)]);
  if (api) await api.stop();
});

// One BUFFERED exchange; resolves with the endpoint list picked, or the immediate status.
async function exchange(prompt) {
  const ex = client.open();
  ex.send(headersRequest(postHeaders('/v1/completions')));
  const first = await ex.next();
  let last = first;
  if (first.msg.response === 'request_headers') {
    ex.send(bodyRequest(Buffer.from(JSON.stringify({ model: 'm', prompt, max_tokens: 4 })), { endOfStream: true }));
    last = await ex.next();
  }
  ex.end();
  await ex.status;
  if (last.msg.response === 'immediate_response') return { immediate: Number(last.msg.immediate_response.status.code) };
  const common = last.msg[last.msg.response].response;
  const set = (common.header_mutation && common.header_mutation.set_headers) || [];
  const h = set.find((o) => o.header.key.toLowerCase() === kHeader);
  assert.ok(h, 'no endpoint header in the body response');
  const value = headerValueOf(h.header);
  assert.equal(fromStruct(last.msg.dynamic_metadata)['envoy.lb'][kHeader], value);
  return { endpoints: value.split(',') };
}

async function waitFor(pred, what, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await pred()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// Whether /metrics has the sample `series` (name and labels) with the value `value`.
async function metric(series, value) {
  const res = await fetch(`http://${epp.metrics}/metrics`);
  return (await res.text()).split('\n').some((l) => l.startsWith(`${series} `) && Number(l.slice(series.length + 1)) === value);
}
const kEndpointsSeries = 'kvroute_k8s_endpoints{namespace="ns",inference_pool="vllm-llama"}';

test('picks go to the four endpoints of the pool; deleted pod: none, NOT_SERVING; new pod: back', async () => {
  await waitForHealth(epp.health, 'readiness', 'SERVING');
  assert.ok(await metric(kEndpointsSeries, 4));
  const winners = new Set();
  for (let i = 0; i < 24; i++) {
    const r = await exchange(`prompt ${i} `.repeat(100 + i));
    assert.ok(r.endpoints, `no pick: ${JSON.stringify(r)}`);
    for (const e of r.endpoints) assert.ok(sim.endpoints.includes(e), `${e} is not one of ${sim.endpoints}`);
    winners.add(r.endpoints[0]);
  }
  assert.ok(winners.size >= 2, `every pick went to ${[...winners]}`);

  await api.command(`delete ${kPods} vllm-llama-0`);
  await waitForHealth(epp.health, 'readiness', 'NOT_SERVING');
  const gone = await exchange('after the delete');
  assert.equal(gone.immediate, 503);
  assert.ok(await metric(kEndpointsSeries, 0));

  // NotReady first (not an endpoint), then Ready.
  await api.put(kPods, pod('vllm-llama-1', false));
  await api.put(kPods, pod('vllm-llama-1', true));
  await waitForHealth(epp.health, 'readiness', 'SERVING');
  const back = await exchange('after the new pod');
  assert.ok(back.endpoints && sim.endpoints.includes(back.endpoints[0]));

  // A changed port list applies without a restart: two of the four ports.
  const two = sim.endpoints.slice(0, 2).map((e) => Number(e.split(':')[1]));
  await api.put(kPools, pool(two));
  await waitFor(() => metric(kEndpointsSeries, 2), 'two endpoints');
  for (let i = 0; i < 6; i++) {
    const r = await exchange(`two ports ${i}`);
    for (const e of r.endpoints) assert.ok(sim.endpoints.slice(0, 2).includes(e), `${e} left the pool`);
  }
});
