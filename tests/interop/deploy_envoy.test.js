'use strict';
// deploy/envoy/envoy.yaml against Envoy's published protos (field names, nesting, @type,
// enum values; see envoy_config_check.js), and the settings the picker depends on.
// Envoy itself is not run: there is none on this machine.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const YAML = require('yaml');
const { checkBootstrapFile } = require('./envoy_config_check');

const kDeploy = path.join(__dirname, '..', '..', 'deploy', 'envoy');
const kHeader = 'x-gateway-destination-endpoint';

const { doc, problems, notes } = checkBootstrapFile(path.join(kDeploy, 'envoy.yaml'));

function httpFilters() {
  const hcm = doc.static_resources.listeners[0].filter_chains[0].filters[0].typed_config;
  return hcm.http_filters;
}

function cluster(name) {
  const c = doc.static_resources.clusters.find((x) => x.name === name);
  assert.ok(c, `no cluster ${name}`);
  return c;
}

test('envoy.yaml: every field exists in Envoy\'s published protos', () => {
  assert.deepEqual(problems, []);
  // FULL_DUPLEX_STREAMED is newer than that revision: the only values it does not know.
  assert.equal(notes.length, 2, notes.join('\n'));
  for (const n of notes) assert.match(n, /FULL_DUPLEX_STREAMED is newer/);
});

test('envoy.yaml: ext_proc first, FULL_DUPLEX_STREAMED with trailers sent, fail closed, envoy.lb both ways', () => {
  const filters = httpFilters();
  assert.equal(filters[0].name, 'envoy.filters.http.ext_proc');
  assert.equal(filters[filters.length - 1].name, 'envoy.filters.http.router');
  const ext = filters[0].typed_config;
  assert.equal(ext.grpc_service.envoy_grpc.cluster_name, 'kvroute_epp');
  assert.equal(ext.failure_mode_allow, false);
  const m = ext.processing_mode;
  assert.equal(m.request_header_mode, 'SEND');
  assert.equal(m.request_body_mode, 'FULL_DUPLEX_STREAMED');
  assert.equal(m.request_trailer_mode, 'SEND');
  if (m.response_body_mode === 'FULL_DUPLEX_STREAMED') assert.equal(m.response_trailer_mode, 'SEND');
  assert.deepEqual(ext.metadata_options.forwarding_namespaces.untyped, ['envoy.lb']);
  assert.deepEqual(ext.metadata_options.receiving_namespaces.untyped, ['envoy.lb']);
});

test('envoy.yaml: requests go to an ORIGINAL_DST cluster that follows the picker\'s header', () => {
  const routes = doc.static_resources.listeners[0].filter_chains[0].filters[0].typed_config
    .route_config.virtual_hosts[0].routes;
  for (const r of routes) assert.equal(r.route.cluster, 'inference_pool');
  const pool = cluster('inference_pool');
  assert.equal(pool.type, 'ORIGINAL_DST');
  assert.equal(pool.lb_policy, 'CLUSTER_PROVIDED');
  assert.equal(pool.original_dst_lb_config.use_http_header, true);
  assert.equal(pool.original_dst_lb_config.http_header_name, kHeader);
});

test('envoy.yaml and epp.yaml agree: ports 9002/9003 over HTTP/2, no fallbacks', () => {
  const epp = cluster('kvroute_epp');
  const ep = epp.load_assignment.endpoints[0].lb_endpoints[0].endpoint;
  assert.equal(ep.address.socket_address.port_value, 9002);         // --grpc-port default
  assert.equal(ep.health_check_config.port_value, 9003);            // --grpc-health-port default
  assert.ok(epp.typed_extension_protocol_options['envoy.extensions.upstreams.http.v3.HttpProtocolOptions']
    .explicit_http_config.http2_protocol_options);
  assert.equal(epp.health_checks[0].grpc_health_check.service_name, 'envoy.service.ext_proc.v3.ExternalProcessor');
  const eppConfig = YAML.parse(fs.readFileSync(path.join(kDeploy, 'epp.yaml'), 'utf8'));
  // ORIGINAL_DST parses one ip:port; a list of fallbacks would not parse.
  assert.equal(eppConfig.epp.fallbacks, 0);
  assert.equal(eppConfig.epp.body_mode, 'full_duplex_streamed');
});

test('envoy.yaml reaches the picker over TLS (not verified, ALPN h2), its health port in plaintext', () => {
  const epp = cluster('kvroute_epp');
  const ts = epp.transport_socket;
  assert.equal(ts.name, 'envoy.transport_sockets.tls');
  assert.equal(ts.typed_config['@type'],
    'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext');
  assert.deepEqual(ts.typed_config.common_tls_context.alpn_protocols, ['h2']);
  // Gateways do not verify the picker's (self-signed by default) certificate.
  assert.equal(ts.typed_config.common_tls_context.validation_context, undefined);
  // The health checks use the plaintext socket the cluster's matches name for them.
  const criteria = epp.health_checks[0].transport_socket_match_criteria;
  const match = epp.transport_socket_matches.find((m) => JSON.stringify(m.match) === JSON.stringify(criteria));
  assert.ok(match, 'no transport_socket_matches entry for the health checks');
  assert.equal(match.transport_socket.name, 'envoy.transport_sockets.raw_buffer');
  // The endpoint's own metadata must not select the plaintext socket for ext_proc.
  const ep = epp.load_assignment.endpoints[0].lb_endpoints[0];
  assert.equal(ep.metadata, undefined);
});

test('epp.yaml: kvroute epp --check accepts it', (t) => {
  const bin = process.env.KVROUTE_BINARY || path.join(__dirname, '..', '..', 'build', 'kvroute');
  const help = spawnSync(bin, ['epp', '--help'], { encoding: 'utf8' });
  if (help.status !== 0) {
    t.skip(`${bin} has no epp command`);
    return;
  }
  const r = spawnSync(bin, ['epp', '--config', path.join(kDeploy, 'epp.yaml'), '--check'], { encoding: 'utf8' });
  assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
});
