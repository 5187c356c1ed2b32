'use strict';
// `kvroute epp` serving TLS on its ext_proc port (issue 29): the Envoy side, played by
// @grpc/grpc-js with Envoy's protos (envoy_client.js), picks over TLS with the picker's
// self-signed certificate (verified against the certificate it wrote, or not verified, as
// gateways configure the picker); a certificate reloaded from --cert-path is what a new
// client's handshake sees; a silent connection is cut by --handshake-timeout; health
// stays plaintext. Run: KVROUTE_BINARY=build/kvroute node --test tests/interop/epp_tls.test.js

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const tls = require('node:tls');
const { spawnSync } = require('node:child_process');
const {
  ExtProcClient, headersRequest, bodyRequest, postHeaders, fromStruct, headerValueOf, grpc,
} = require('./envoy_client');
const { selfSignedPair, startSim, startEpp, stop, waitForHealth, tempDir } = require('./harness');

const kModel = 'meta-llama/Llama-3.1-8B-Instruct';
const kHeader = 'x-gateway-destination-endpoint';

let sim;
const started = [];

before(async () => { sim = await startSim(2); });
after(async () => { await Promise.all([...started.map((e) => stop(e.proc)), sim && stop(sim.proc)]); });

async function epp(options) {
  const e = await startEpp({ endpoints: sim.endpoints, bodyMode: 'buffered', fallbacks: 1, ...options });
  started.push(e);
  await waitForHealth(e.health, 'readiness');  // plaintext grpc.health.v1
  return e;
}

// One BUFFERED exchange as Envoy runs it; resolves with the winner of the pick.
async function pick(client) {
  const ex = client.open();
  ex.send(headersRequest(postHeaders()));
  const first = await ex.next();
  assert.equal(first.msg.response, 'request_headers');
  ex.send(bodyRequest(JSON.stringify({ model: kModel, prompt: 'over tls', max_tokens: 4 }), { endOfStream: true }));
  const { msg } = await ex.next();
  ex.end();
  assert.equal(msg.response, 'request_body');
  const common = msg.request_body.response;
  const set = common.header_mutation.set_headers.find((o) => o.header.key === kHeader);
  assert.ok(set, 'no destination header in the body response');
  const value = headerValueOf(set.header);
  assert.equal(fromStruct(msg.dynamic_metadata)['envoy.lb'][kHeader], value);
  const winner = value.split(',')[0];
  assert.ok(sim.endpoints.includes(winner), `${winner}: not one of ${sim.endpoints.join(', ')}`);
  return winner;
}

// The certificate a new TLS client (ALPN h2, as gRPC offers) is shown: its SHA-256
// fingerprint, "AB:CD:...".
function peerFingerprint(address) {
  const [host, port] = address.split(':');
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host, port: Number(port), ALPNProtocols: ['h2'], servername: 'localhost', rejectUnauthorized: false }, () => {
      const fp = s.getPeerCertificate().fingerprint256;
      assert.equal(s.alpnProtocol, 'h2');
      s.destroy();
      resolve(fp);
    });
    s.on('error', reject);
  });
}

const makePair = (name) => selfSignedPair(name, { san: 'DNS:localhost,IP:127.0.0.1' });
// Replaces `file` by a rename (a reader never sees it half-written).
function put(file, text) {
  fs.writeFileSync(`${file}.tmp`, text);
  fs.renameSync(`${file}.tmp`, file);
}

async function metric(e, series) {
  const res = await fetch(`http://${e.metrics}/metrics`);
  const text = await res.text();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

async function until(what, fn, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('picks over TLS with the self-signed certificate, verified or not, and not in plaintext', async () => {
  const e = await epp({ tls: true });
  assert.match(e.transport, /^tls, self-signed, sha256 [0-9A-F:]{95}$/);
  assert.equal(new crypto.X509Certificate(e.cert).fingerprint256, e.sha256);
  assert.equal(await peerFingerprint(e.grpc), e.sha256);

  // Verified against the certificate it wrote (its names include 127.0.0.1).
  const verified = new ExtProcClient(e.grpc, grpc.credentials.createSsl(Buffer.from(e.cert)));
  // Not verified, as gateways configure the picker (Envoy's UpstreamTlsContext without a
  // validation context).
  const unverified = new ExtProcClient(e.grpc, grpc.credentials.createSsl(null, null, null, {
    rejectUnauthorized: false, checkServerIdentity: () => undefined,
  }));
  const plain = new ExtProcClient(e.grpc);
  try {
    await pick(verified);
    await pick(unverified);
    await assert.rejects(pick(plain));
  } finally {
    verified.close();
    unverified.close();
    plain.close();
  }
  assert.equal(await metric(e, 'kvroute_tls_cert_reloads_total{result="applied"}'), 0);
  const notAfter = Date.parse(new crypto.X509Certificate(e.cert).validTo) / 1000;
  assert.equal(await metric(e, 'kvroute_tls_cert_expiry_timestamp_seconds'), notAfter);
});

test('--secure-serving=false serves plaintext', async () => {
  const e = await epp({});
  assert.equal(e.transport, 'plaintext');
  const plain = new ExtProcClient(e.grpc);
  try { await pick(plain); } finally { plain.close(); }
  assert.equal(await metric(e, 'kvroute_tls_cert_reloads_total{result="applied"}'), undefined);
});

test('a certificate reloaded from --cert-path is seen by new clients; a broken one is not', async () => {
  const dir = fs.mkdtempSync(path.join(tempDir, 'certs-'));
  const a = makePair('epp-a');
  const b = makePair('epp-b');
  put(path.join(dir, 'tls.crt'), a.cert);
  put(path.join(dir, 'tls.key'), a.key);
  const e = await epp({ tls: true, args: ['--cert-path', dir, '--enable-cert-reload=true', '--cert-reload-interval', '100ms'] });
  assert.equal(e.transport, `tls, ${dir}, reloaded, sha256 ${a.sha256}`);
  assert.equal(await peerFingerprint(e.grpc), a.sha256);
  const trustA = new ExtProcClient(e.grpc, grpc.credentials.createSsl(Buffer.from(a.cert)));
  try { await pick(trustA); } finally { trustA.close(); }

  put(path.join(dir, 'tls.crt'), b.cert);
  put(path.join(dir, 'tls.key'), b.key);
  await until('B served to a new client', async () => (await peerFingerprint(e.grpc)) === b.sha256);
  const trustB = new ExtProcClient(e.grpc, grpc.credentials.createSsl(Buffer.from(b.cert)));
  try { await pick(trustB); } finally { trustB.close(); }
  assert.equal(await metric(e, 'kvroute_tls_cert_reloads_total{result="applied"}'), 1);

  // A key that does not load: rejected with one log line, B stays.
  const rejected = await metric(e, 'kvroute_tls_cert_reloads_total{result="rejected"}');
  put(path.join(dir, 'tls.key'), 'not a key\n');
  await until('the broken key rejected',
    async () => (await metric(e, 'kvroute_tls_cert_reloads_total{result="rejected"}')) === rejected + 1);
  assert.equal(await peerFingerprint(e.grpc), b.sha256);
  const lines = e.proc.log.filter((l) => l.includes(
    `tls: certificate from ${dir} not reloaded, serving the last good one: ${dir}/tls.key: no private key in the PEM`));
  assert.equal(lines.length, 1, e.proc.log.join('\n'));
});

test('a connection that never starts its handshake is closed after --handshake-timeout', async () => {
  const e = await epp({ tls: true, args: ['--handshake-timeout', '300ms'] });
  const [host, port] = e.grpc.split(':');
  const t0 = Date.now();
  await new Promise((resolve, reject) => {
    const s = net.connect({ host, port: Number(port) });
    const guard = setTimeout(() => { s.destroy(); reject(new Error('still open after 5 s')); }, 5000);
    s.on('close', () => { clearTimeout(guard); resolve(); });
    s.on('error', () => {});
  });
  const took = Date.now() - t0;
  assert.ok(took >= 200 && took < 3000, `closed after ${took} ms`);
  // Garbage instead of a ClientHello: dropped; the picker still serves.
  await new Promise((resolve) => {
    const s = net.connect({ host, port: Number(port) }, () => s.write(Buffer.alloc(512, 0x41)));
    s.on('close', resolve);
    s.on('error', () => {});
  });
  const c = new ExtProcClient(e.grpc, grpc.credentials.createSsl(Buffer.from(e.cert)));
  try { await pick(c); } finally { c.close(); }
});

test('bad TLS flags are refused before anything starts', () => {
  const bin = process.env.KVROUTE_BINARY || path.join(__dirname, '..', '..', 'build', 'kvroute');
  const run = (...args) => spawnSync(bin, ['epp', '--pool-name', 'p', ...args], { encoding: 'utf8' });
  let r = run('--secure-serving=false', '--cert-path', tempDir);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /need --secure-serving/);
  r = run('--handshake-timeout', 'soon');
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--handshake-timeout: not a duration: 'soon'/);
});
