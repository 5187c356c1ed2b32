'use strict';
// Processes for the interop test: `kvroute sim` replicas and `kvroute epp` pickers on
// free loopback ports, each stopped when the test process exits.

const { spawn, spawnSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { healthCheck } = require('./envoy_client');

const children = new Set();
process.on('exit', () => { for (const c of children) c.kill('SIGKILL'); });

function kvrouteBinary() {
  const bin = process.env.KVROUTE_BINARY || path.join(__dirname, '..', '..', 'build', 'kvroute');
  if (!fs.existsSync(bin)) throw new Error(`${bin}: no kvroute binary (set KVROUTE_BINARY)`);
  return bin;
}

const tempDir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvroute-interop-'));
process.on('exit', () => fs.rmSync(tempDir, { recursive: true, force: true }));

// Starts `kvroute ARGS`; resolves with {proc, match} once a line of `stream` matches
// `pattern` `count` times (matches collected), rejects if the process exits first or
// timeoutMs passes. Everything the process prints is kept in proc.log for diagnostics.
function startKvroute(args, { stream = 'stderr', pattern, count = 1, timeoutMs = 15000 }) {
  const proc = spawn(kvrouteBinary(), args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(proc);
  proc.log = [];
  proc.on('exit', () => children.delete(proc));
  for (const s of ['stdout', 'stderr']) {
    readline.createInterface({ input: proc[s] }).on('line', (l) => {
      proc.log.push(`${s}: ${l}`);
      if (proc.log.length > 200) proc.log.shift();
    });
  }
  return new Promise((resolve, reject) => {
    const matches = [];
    const fail = (why) => {
      clearTimeout(timer);
      proc.kill('SIGKILL');
      reject(new Error(`kvroute ${args.join(' ')}: ${why}\n${proc.log.join('\n')}`));
    };
    const timer = setTimeout(() => fail(`no start line within ${timeoutMs} ms`), timeoutMs);
    proc.on('exit', (code, sig) => fail(`exited (${code ?? sig}) before it was up`));
    readline.createInterface({ input: proc[stream] }).on('line', (l) => {
      const m = pattern.exec(l);
      if (!m || matches.length >= count) return;
      matches.push(m);
      if (matches.length === count) {
        clearTimeout(timer);
        proc.removeAllListeners('exit');
        proc.on('exit', () => children.delete(proc));
        resolve({ proc, matches });
      }
    });
  });
}

async function stop(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  const t = setTimeout(() => proc.kill('SIGKILL'), 3000);
  await exited;
  clearTimeout(t);
}

// `kvroute sim` with `replicas` replicas on free ports, engine time 100x faster than real.
async function startSim(replicas) {
  const { proc, matches } = await startKvroute(
    ['sim', '--replicas', String(replicas), '--port', '0', '--host', '127.0.0.1',
      '--preset', 'small-kv', '--time-scale', '0.01', '--threads', '1'],
    { stream: 'stdout', pattern: /^replica-\d+ http:\/\/(127\.0\.0\.1:\d+) /, count: replicas });
  return { proc, endpoints: matches.map((m) => m[1]) };
}

// `kvroute sidecar` on a free loopback port in front of the engine at `engine` (host:port).
async function startSidecar(engine) {
  const [host, port] = engine.split(':');
  const { proc, matches } = await startKvroute(
    ['sidecar', '--port', '0', '--host', '127.0.0.1', '--vllm-host', host, '--vllm-port', port,
      '--threads', '1'],
    { pattern: /listening on port (\d+)/ });
  return { proc, address: `127.0.0.1:${matches[0][1]}` };
}

// `kvroute serve` on a free loopback port in front of `endpoints` ("ip:port" each), with the
// kvroute policy; resolves once it is ready (an endpoint has fresh metrics).
// extra: more top-level config lines (e.g. an `auth:` block); relative paths in them are
// against tempDir, where the config is written.
// tls: {cert, key} (PEM text): an HTTPS listener too (listen_tls on another free port),
// returned as httpsAddress. An endpoint that starts with "{" is a YAML flow mapping, written
// as is (e.g. "{address: ..., kv_events: ...}"); poolExtra: more lines under pool:.
async function startServe(endpoints, extra = [], { tls, poolExtra = [] } = {}) {
  const file = path.join(tempDir, `serve-${++configCount}.yaml`);
  const [port, tlsPort] = await closedPorts(2);
  const tlsLines = [];
  if (tls) {
    fs.writeFileSync(`${file}.crt`, tls.cert);
    fs.writeFileSync(`${file}.key`, tls.key);
    tlsLines.push('listen_tls:', `  address: 127.0.0.1:${tlsPort}`, `  cert: ${path.basename(file)}.crt`,
      `  key: ${path.basename(file)}.key`);
  }
  fs.writeFileSync(file, [
    'threads: 1',
    ...tlsLines,
    'pool:',
    '  scrape_interval: 50ms',
    ...poolExtra,
    '  endpoints:',
    ...endpoints.map((e) => (e.startsWith('{') ? `    - ${e}` : `    - {address: ${e}}`)),
    'scheduling:',
    '  policy: kvroute',
    ...extra,
    ''].join('\n'));
  const { proc, matches } = await startKvroute(
    ['serve', '--config', file, '--listen', `127.0.0.1:${port}`],
    { pattern: tls ? /listening on https port (\d+)/ : /listening on port (\d+)/ });
  const address = `127.0.0.1:${port}`;
  const deadline = Date.now() + 10000;
  for (;;) {
    const r = await fetch(`http://${address}/readyz`).catch(() => null);
    if (r && r.status === 200) break;
    if (Date.now() > deadline) throw new Error(`kvroute serve at ${address}: not ready\n${proc.log.join('\n')}`);
    await new Promise((res) => setTimeout(res, 50));
  }
  return { proc, address, httpsAddress: tls ? `127.0.0.1:${matches[0][1]}` : null };
}

// A self-signed EC P-256 certificate for 127.0.0.1 (and `san`, openssl's subjectAltName
// syntax) made by the openssl command: {cert, key, sha256} (PEM text; the certificate's
// SHA-256 fingerprint as Node prints it).
function selfSignedPair(name, { days = 1, san = 'IP:127.0.0.1' } = {}) {
  const dir = fs.mkdtempSync(path.join(tempDir, 'pair-'));
  const r = spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256',
    '-nodes', '-keyout', path.join(dir, 'k'), '-out', path.join(dir, 'c'), '-days', String(days),
    '-subj', `/CN=${name}`, '-addext', `subjectAltName=${san}`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl req: ${r.stderr}`);
  const cert = fs.readFileSync(path.join(dir, 'c'), 'utf8');
  return { cert, key: fs.readFileSync(path.join(dir, 'k'), 'utf8'), sha256: new crypto.X509Certificate(cert).fingerprint256 };
}

// Loopback ports nothing listens on: bound, then closed again.
async function closedPorts(n) {
  const servers = await Promise.all(Array.from({ length: n }, () => new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => resolve(s));
  })));
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

// Ports that stay dead for the whole test (connect refused). Ports from closedPorts come from
// the kernel's ephemeral range, and a test running in parallel can be handed one and bring it
// to life; ports below 1024 are never handed out that way and no test binds them. Each
// candidate is checked to refuse before it is returned.
async function deadPorts(n) {
  const refuses = (port) => new Promise((resolve) => {
    const c = net.connect({ port, host: '127.0.0.1' });
    c.once('connect', () => { c.destroy(); resolve(false); });
    c.once('error', (e) => resolve(e.code === 'ECONNREFUSED'));
  });
  const out = [];
  for (let port = 1; port < 1024 && out.length < n; port++) {
    if (await refuses(port)) out.push(port);
  }
  if (out.length < n) throw new Error(`fewer than ${n} refusing ports below 1024`);
  return out;
}

let configCount = 0;
// endpoints: "ip:port" or a YAML flow mapping ("{address: ..., kv_events: ...}");
// poolExtra: more lines under pool: (e.g. '  kv_events: {speculative_ttl: 100ms}');
// extra: more top-level lines (e.g. a `flow:` block).
function eppConfig({ endpoints, bodyMode, maxBodyBytes = '1MiB', fallbacks = 2, poolExtra = [], extra = [] }) {
  return [
    'pool:',
    '  scrape_interval: 50ms',
    '  staleness: 2s',
    ...poolExtra,
    // No endpoints: the pool comes from the command line (--pool-name, Kubernetes).
    // An entry is "host:port" or {address, role} (role: the llm-d.ai/role label).
    ...(endpoints.length ? ['  endpoints:', ...endpoints.map((e) => (typeof e === 'string'
      ? `    - ${e}`
      : `    - {address: ${e.address}, labels: {llm-d.ai/role: ${e.role}}}`))] : []),
    'scheduling:',
    '  policy: kvroute',
    'limits:',
    `  max_body_bytes: ${maxBodyBytes}`,
    'epp:',
    `  body_mode: ${bodyMode}`,
    `  fallbacks: ${fallbacks}`,
    '  stream_timeout: 20s',
    ...extra,
    '',
  ].join('\n');
}

// "(plaintext)", "(tls, self-signed, sha256 AB:..)" or "(tls, DIR[, reloaded], sha256 AB:..)".
const kEppLine = /^kvroute epp: ext_proc on (\S+):(\d+) \(([^)]*)\), health on (\S+):(\d+), metrics on (\S+):(\d+)$/;

// `kvroute epp` on free loopback ports, with a config file written to the temp dir;
// options.args are added to the command line. Plaintext ext_proc unless options.tls:
// then TLS, and without --cert-path in options.args the self-signed certificate is
// written to the temp dir and returned as `cert` (PEM), its fingerprint as `sha256`.
async function startEpp(options) {
  const n = ++configCount;
  const file = path.join(tempDir, `epp-${n}-${options.bodyMode}.yaml`);
  fs.writeFileSync(file, eppConfig(options));
  const args = options.args || [];
  const certOut = options.tls && !args.includes('--cert-path') ? path.join(tempDir, `epp-${n}-cert.pem`) : null;
  const tlsArgs = !options.tls ? ['--secure-serving=false'] : certOut ? ['--self-signed-cert-out', certOut] : [];
  const { proc, matches } = await startKvroute(
    ['epp', '--config', file, '--host', '127.0.0.1',
      '--grpc-port', '0', '--grpc-health-port', '0', '--metrics-port', '0', ...tlsArgs, ...args],
    { stream: 'stderr', pattern: kEppLine });
  const m = matches[0];
  const fp = /sha256 ([0-9A-F:]+)/.exec(m[3]);
  return {
    proc,
    file,
    grpc: `${m[1]}:${m[2]}`,
    transport: m[3],
    sha256: fp ? fp[1] : null,
    cert: certOut ? fs.readFileSync(certOut, 'utf8') : null,
    health: `${m[4]}:${m[5]}`,
    metrics: `${m[6]}:${m[7]}`,
    endpoints: options.endpoints,
  };
}

// Polls grpc.health.v1 Check(service) until it answers `want`; resolves with the number
// of polls, rejects with the last answer after timeoutMs.
async function waitForHealth(address, service, want = 'SERVING', timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (let polls = 1; ; polls++) {
    try {
      last = await healthCheck(address, service);
      if (last === want) return polls;
    } catch (e) {
      last = e.message;
    }
    if (Date.now() > deadline) throw new Error(`${address} health(${service}): ${last}, wanted ${want}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// `kvroute sim` with `replicas` replicas publishing KV-cache events (ZMQ PUB and replay on
// free ports), `kvBlocks` blocks each and prompt_tokens_details in usage. Resolves with
// {proc, endpoints: ["ip:port"], kvEvents: ["tcp://..."], kvReplay: ["tcp://..."]}.
async function startSimWithEvents(replicas, kvBlocks) {
  const { proc, matches } = await startKvroute(
    ['sim', '--replicas', String(replicas), '--port', '0', '--host', '127.0.0.1',
      '--kv-blocks', String(kvBlocks), '--time-scale', '0.01', '--threads', '1',
      '--kv-events-port', '0', '--kv-events-replay-port', '0', '--enable-prompt-tokens-details'],
    {
      stream: 'stdout',
      pattern: /^replica-(\d+) (?:http:\/\/(127\.0\.0\.1:\d+) |kv-events (\S+) replay (\S+) )/,
      count: 2 * replicas,
    });
  const out = { proc, endpoints: [], kvEvents: [], kvReplay: [] };
  for (const m of matches) {
    const i = Number(m[1]);
    if (m[2]) out.endpoints[i] = m[2];
    else { out.kvEvents[i] = m[3]; out.kvReplay[i] = m[4]; }
  }
  return out;
}

module.exports = { selfSignedPair, startKvroute, kEppLine, startSim, startSimWithEvents, startSidecar, startServe, startEpp, stop, closedPorts, deadPorts, waitForHealth, tempDir };
