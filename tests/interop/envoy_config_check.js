'use strict';
// Checks an Envoy bootstrap (YAML) against Envoy's published API protos (the revision
// @grpc/grpc-js-xds ships): every key must be a field of its message, `@type` of an Any
// must name a loaded message, enum values must exist, nothing deprecated. This proves
// field names and nesting, not what a running Envoy would accept (validate rules,
// cross-field constraints and runtime checks are not applied).

const fs = require('node:fs');
const path = require('node:path');
require('@grpc/proto-loader');  // registers descriptor.proto and the other common protos
const protobuf = require('protobufjs');
const YAML = require('yaml');
const { kEnvoyIncludeDirs } = require('./envoy_client');

// The protos of every extension a bootstrap names by @type must be loaded; these are the
// ones deploy/envoy/envoy.yaml uses, plus the bootstrap itself.
const kProtos = [
  'envoy/config/bootstrap/v3/bootstrap.proto',
  'envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto',
  'envoy/extensions/filters/http/ext_proc/v3/ext_proc.proto',
  'envoy/extensions/filters/http/router/v3/router.proto',
  'envoy/extensions/upstreams/http/v3/http_protocol_options.proto',
  'envoy/extensions/transport_sockets/tls/v3/tls.proto',
  'envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto',
];

function loadRoot() {
  const root = new protobuf.Root();
  root.resolvePath = (origin, target) => {
    if (target in protobuf.common) return target;
    for (const dir of kEnvoyIncludeDirs) {
      const p = path.join(dir, target);
      if (fs.existsSync(p)) return p;
    }
    return target;
  };
  root.loadSync(kProtos, { keepCase: true });
  root.resolveAll();
  return root;
}

// Values this revision predates, allowed by enum full name.
const kNewerEnumValues = {
  'envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode': ['FULL_DUPLEX_STREAMED'],
};

function fullName(t) { return t.fullName.replace(/^\./, ''); }

// Returns the list of problems ("path: what"), empty when the document fits the protos.
function checkMessage(root, obj, type, where, problems, notes) {
  const name = fullName(type);
  if (name === 'google.protobuf.Any') {
    const url = obj['@type'];
    const m = /^type\.googleapis\.com\/(.+)$/.exec(url || '');
    if (!m) { problems.push(`${where}: Any without a type.googleapis.com/ @type`); return; }
    let inner;
    try { inner = root.lookupType(m[1]); } catch { inner = null; }
    if (!inner) { problems.push(`${where}: @type ${m[1]} is not a known message`); return; }
    const rest = { ...obj };
    delete rest['@type'];
    checkMessage(root, rest, inner, `${where}<${m[1]}>`, problems, notes);
    return;
  }
  if (name === 'google.protobuf.Duration') {
    if (typeof obj !== 'string' || !/^\d+(\.\d+)?s$/.test(obj)) problems.push(`${where}: duration ${obj} is not "<seconds>s"`);
    return;
  }
  if (name === 'google.protobuf.Struct' || name === 'google.protobuf.Value') return;
  if (/^google\.protobuf\.(U?Int(32|64)|Bool|String|Double|Float|Bytes)Value$/.test(name)) {
    if (typeof obj === 'object') problems.push(`${where}: a wrapper takes a scalar`);
    return;
  }
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
    problems.push(`${where}: ${name} must be a mapping`);
    return;
  }
  for (const [key, value] of Object.entries(obj)) {
    const field = type.fields[key] || Object.values(type.fields).find((f) => f.options && f.options.json_name === key);
    const at = `${where}.${key}`;
    if (!field) { problems.push(`${at}: no such field in ${name}`); continue; }
    if (field.options && field.options.deprecated) problems.push(`${at}: deprecated in ${name}`);
    const values = field.repeated ? value : [value];
    if (field.repeated && !Array.isArray(value)) { problems.push(`${at}: repeated, needs a list`); continue; }
    if (field.map) {
      for (const [k, v] of Object.entries(value)) checkValue(root, field, v, `${at}[${k}]`, problems, notes);
      continue;
    }
    values.forEach((v, i) => checkValue(root, field, v, field.repeated ? `${at}[${i}]` : at, problems, notes));
  }
}

function checkValue(root, field, v, at, problems, notes) {
  const rt = field.resolvedType;
  if (rt instanceof protobuf.Enum) {
    if (typeof v === 'number' ? Object.values(rt.values).includes(v) : v in rt.values) return;
    if ((kNewerEnumValues[fullName(rt)] || []).includes(v)) {
      notes.push(`${at}: ${v} is newer than this revision of ${fullName(rt)}`);
      return;
    }
    problems.push(`${at}: ${v} is not a value of ${fullName(rt)}`);
  } else if (rt instanceof protobuf.Type) {
    checkMessage(root, v, rt, at, problems, notes);
  } else if (typeof v === 'object' && v !== null) {
    problems.push(`${at}: ${field.type} takes a scalar`);
  }
}

// Checks the YAML file as an envoy.config.bootstrap.v3.Bootstrap. Returns
// { doc, problems, notes }.
function checkBootstrapFile(file) {
  const root = loadRoot();
  const doc = YAML.parse(fs.readFileSync(file, 'utf8'));
  const problems = [];
  const notes = [];
  checkMessage(root, doc, root.lookupType('envoy.config.bootstrap.v3.Bootstrap'), 'bootstrap', problems, notes);
  return { doc, problems, notes };
}

module.exports = { checkBootstrapFile };
