'use strict';
// The Envoy side of an ext_proc exchange, built from Envoy's own published API protos
// (the copy @grpc/grpc-js-xds ships under deps/envoy-api, with xds, googleapis and
// protoc-gen-validate), loaded with @grpc/proto-loader and spoken with @grpc/grpc-js.
//
// That revision of the protos predates ProcessingRequest.protocol_config (11),
// BodyMutation.streamed_response (3) and FULL_DUPLEX_STREAMED. Every response is
// therefore decoded twice: by the published ProcessingResponse type (fields it knows),
// and by the minimal protobuf wire reader below (field numbers only), which is how the
// FULL_DUPLEX_STREAMED replies are checked.

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const kDepsDir = path.join(path.dirname(require.resolve('@grpc/grpc-js-xds/package.json')), 'deps');
const kEnvoyIncludeDirs = ['envoy-api', 'xds', 'googleapis', 'protoc-gen-validate']
  .map((d) => path.join(kDepsDir, d));
const kExtProcProto = 'envoy/service/ext_proc/v3/external_processor.proto';
const kProcessPath = '/envoy.service.ext_proc.v3.ExternalProcessor/Process';
// Written for this test (no npm package here ships grpc.health.v1): see its header.
const kHealthProtoDir = path.join(__dirname, 'proto');

const kLoaderOptions = { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true };

// Enums as numbers: ImmediateResponse.status.code is envoy.type.v3.StatusCode (400, 503...).
const envoyDefinition = protoLoader.loadSync(kExtProcProto,
  { ...kLoaderOptions, enums: Number, includeDirs: kEnvoyIncludeDirs });
const processMethod = envoyDefinition['envoy.service.ext_proc.v3.ExternalProcessor'].Process;
if (!processMethod || !processMethod.requestStream || !processMethod.responseStream) {
  throw new Error(`${kExtProcProto}: no bidirectional Process rpc`);
}

const healthDefinition = protoLoader.loadSync('grpc/health/v1/health.proto',
  { ...kLoaderOptions, includeDirs: [kHealthProtoDir] });
const HealthClient = grpc.loadPackageDefinition(healthDefinition).grpc.health.v1.Health;

// ---------------------------------------------------------------------------------------
// Protobuf wire format, read by field number (no schema).

// Returns Map<fieldNumber, Array<{wireType, value}>>: value is a BigInt for varints and
// fixed-width fields, a Buffer for length-delimited ones. Throws on malformed input.
function decodeFields(buf) {
  const fields = new Map();
  let pos = 0;
  const readVarint = () => {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (pos >= buf.length) throw new Error('truncated varint');
      const b = buf[pos++];
      result |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return result;
      shift += 7n;
      if (shift > 63n) throw new Error('varint longer than 10 bytes');
    }
  };
  while (pos < buf.length) {
    const key = readVarint();
    const number = Number(key >> 3n);
    const wireType = Number(key & 7n);
    let value;
    switch (wireType) {
      case 0: value = readVarint(); break;
      case 1: value = buf.readBigUInt64LE(pos); pos += 8; break;
      case 2: {
        const len = Number(readVarint());
        if (pos + len > buf.length) throw new Error(`field ${number}: length ${len} past the end`);
        value = buf.subarray(pos, pos + len);
        pos += len;
        break;
      }
      case 5: value = BigInt(buf.readUInt32LE(pos)); pos += 4; break;
      default: throw new Error(`field ${number}: unsupported wire type ${wireType}`);
    }
    if (number === 0) throw new Error('field number 0');
    if (!fields.has(number)) fields.set(number, []);
    fields.get(number).push({ wireType, value });
  }
  return fields;
}

// The last occurrence of a length-delimited field (proto3 semantics for a singular
// message field split in several occurrences would merge them; our peer never splits).
function lenField(fields, number) {
  const all = fields.get(number);
  if (!all) return undefined;
  const last = all[all.length - 1];
  if (last.wireType !== 2) throw new Error(`field ${number}: wire type ${last.wireType}, expected 2`);
  return last.value;
}

function varintField(fields, number) {
  const all = fields.get(number);
  if (!all) return undefined;
  const last = all[all.length - 1];
  if (last.wireType !== 0) throw new Error(`field ${number}: wire type ${last.wireType}, expected 0`);
  return last.value;
}

function encodeVarint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) b |= 0x80;
    out.push(b);
  } while (v !== 0n);
  return Buffer.from(out);
}

function encodeVarintField(number, value) {
  return Buffer.concat([encodeVarint((number << 3) | 0), encodeVarint(value)]);
}

function encodeLenField(number, bytes) {
  return Buffer.concat([encodeVarint((number << 3) | 2), encodeVarint(bytes.length), bytes]);
}

// ProcessingResponse oneof `response`, by field number.
const kResponseCase = {
  1: 'request_headers', 2: 'response_headers', 3: 'request_body', 4: 'response_body',
  5: 'request_trailers', 6: 'response_trailers', 7: 'immediate_response',
};

// What the wire says of one ProcessingResponse, field by field:
//   { responseCase, streamed: {body: Buffer, endOfStream: bool} | undefined,
//     hasDynamicMetadata }
// `streamed` is ProcessingResponse.request_body (3) / response_body (4) -> BodyResponse
// .response (1) -> CommonResponse.body_mutation (3) -> BodyMutation.streamed_response (3)
// -> StreamedBodyResponse {body 1, end_of_stream 2}.
function decodeResponseWire(raw) {
  const top = decodeFields(raw);
  const cases = [...top.keys()].filter((n) => kResponseCase[n]);
  if (cases.length > 1) throw new Error(`ProcessingResponse: several oneof cases ${cases}`);
  const out = {
    responseCase: cases.length ? kResponseCase[cases[0]] : undefined,
    streamed: undefined,
    hasDynamicMetadata: top.has(8),
  };
  if (cases[0] === 3 || cases[0] === 4) {
    const common = lenField(decodeFields(lenField(top, cases[0])), 1);
    const mutation = common && lenField(decodeFields(common), 3);
    const mutationFields = mutation && decodeFields(mutation);
    const streamed = mutationFields && lenField(mutationFields, 3);
    if (streamed !== undefined) {
      const s = decodeFields(streamed);
      out.streamed = {
        body: Buffer.from(lenField(s, 1) || Buffer.alloc(0)),
        endOfStream: (varintField(s, 2) || 0n) !== 0n,
      };
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Requests, as Envoy's ext_proc filter builds them.

// headers: [[key, value], ...] or {key: value}. Newer Envoy sends the value as raw_value
// (bytes); older as value (string): `raw` picks which.
function headersRequest(headers, { endOfStream = false, raw = true, metadata } = {}) {
  const list = Array.isArray(headers) ? headers : Object.entries(headers);
  const req = {
    request_headers: {
      headers: {
        headers: list.map(([key, value]) => (raw
          ? { key, raw_value: Buffer.from(String(value)) }
          : { key, value: String(value) })),
      },
      end_of_stream: endOfStream,
    },
  };
  if (metadata) req.metadata_context = metadata;
  return req;
}

function bodyRequest(body, { endOfStream = false, metadata } = {}) {
  const req = { request_body: { body: Buffer.from(body), end_of_stream: endOfStream } };
  if (metadata) req.metadata_context = metadata;
  return req;
}

// The Envoy-side pseudo-headers and headers of a POST to an OpenAI path.
function postHeaders(path = '/v1/completions', extra = {}) {
  return {
    ':method': 'POST', ':path': path, ':authority': 'gateway.local', ':scheme': 'http',
    'content-type': 'application/json', 'x-request-id': `req-${process.hrtime.bigint()}`,
    ...extra,
  };
}

// google.protobuf.Struct values as proto-loader takes them.
function structValue(v) {
  if (Array.isArray(v)) return { listValue: { values: v.map(structValue) } };
  if (v !== null && typeof v === 'object') return { structValue: toStruct(v) };
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'number') return { numberValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  return { nullValue: 'NULL_VALUE' };
}

function toStruct(obj) {
  return { fields: Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, structValue(v)])) };
}

function fromStructValue(v) {
  if (!v) return undefined;
  switch (v.kind) {
    case 'structValue': return fromStruct(v.structValue);
    case 'listValue': return (v.listValue.values || []).map(fromStructValue);
    case 'stringValue': return v.stringValue;
    case 'numberValue': return v.numberValue;
    case 'boolValue': return v.boolValue;
    default: return null;
  }
}

function fromStruct(s) {
  return Object.fromEntries(Object.entries((s && s.fields) || {}).map(([k, v]) => [k, fromStructValue(v)]));
}

// config.core.v3.Metadata carrying the GIE subset hint.
function subsetHint(endpoints) {
  return { filter_metadata: { 'envoy.lb': toStruct({ 'x-gateway-destination-endpoint-subset': endpoints }) } };
}

// A HeaderValue's value, whichever field carries it.
function headerValueOf(h) {
  if (h.raw_value && h.raw_value.length) return Buffer.from(h.raw_value).toString();
  return h.value || '';
}

// ---------------------------------------------------------------------------------------
// One ext_proc stream.

class Exchange {
  constructor(call) {
    this.call = call;
    this.queue = [];
    this.waiters = [];
    this.ended = false;
    this.error = null;
    this.status = new Promise((resolve) => call.on('status', resolve));
    call.on('data', (r) => this.push(r));
    call.on('end', () => { this.ended = true; this.flush(); });
    call.on('error', (e) => { this.error = e; this.flush(); });
  }

  push(r) {
    const w = this.waiters.shift();
    if (w) { clearTimeout(w.timer); w.resolve(r); } else this.queue.push(r);
  }

  flush() {
    for (const w of this.waiters.splice(0)) {
      clearTimeout(w.timer);
      w.reject(this.error || new Error('stream ended'));
    }
  }

  send(req, extraRaw) {
    this.call.write(extraRaw ? { req, extraRaw } : { req });
  }

  // Half-closes, as Envoy does once the HTTP request is done with the processor.
  end() { this.call.end(); }

  cancel() { this.call.cancel(); }

  // The next ProcessingResponse: {msg (published type), wire (decodeResponseWire), raw}.
  next(timeoutMs = 5000) {
    if (this.queue.length) return Promise.resolve(this.queue.shift());
    if (this.ended || this.error) return Promise.reject(this.error || new Error('stream ended'));
    return new Promise((resolve, reject) => {
      const w = { resolve, reject };
      w.timer = setTimeout(() => {
        this.waiters.splice(this.waiters.indexOf(w), 1);
        reject(new Error(`no ProcessingResponse within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.push(w);
    });
  }

  // Resolves true if no response arrives within ms (the response, if any, stays queued).
  async quietFor(ms) {
    await new Promise((r) => setTimeout(r, ms));
    return this.queue.length === 0;
  }
}

class ExtProcClient {
  // `credentials`: grpc.credentials.createSsl(...) for a picker serving TLS; plaintext
  // by default.
  constructor(address, credentials = grpc.credentials.createInsecure()) {
    this.client = new grpc.Client(address, credentials, {
      'grpc.max_receive_message_length': 64 * 1024 * 1024,
      'grpc.max_send_message_length': 64 * 1024 * 1024,
    });
  }

  // Opens a Process stream. Requests are serialized by the published ProcessingRequest
  // type; `extraRaw` bytes are appended to the encoding (a protobuf message is the
  // concatenation of its fields), which is how a field newer than that revision is sent.
  open({ deadlineMs = 20000 } = {}) {
    const call = this.client.makeBidiStreamRequest(
      kProcessPath,
      ({ req, extraRaw }) => {
        const bytes = processMethod.requestSerialize(req);
        return extraRaw ? Buffer.concat([bytes, extraRaw]) : bytes;
      },
      (raw) => ({ msg: processMethod.responseDeserialize(raw), wire: decodeResponseWire(raw), raw }),
      new grpc.Metadata(),
      { deadline: Date.now() + deadlineMs });
    return new Exchange(call);
  }

  close() { this.client.close(); }
}

// ProcessingRequest.protocol_config (11): ProtocolConfiguration {request_body_mode 1,
// response_body_mode 2} with ProcessingMode.BodySendMode values (FULL_DUPLEX_STREAMED 4).
const kBodySendMode = { NONE: 0, STREAMED: 1, BUFFERED: 2, BUFFERED_PARTIAL: 3, FULL_DUPLEX_STREAMED: 4 };
function protocolConfigField(requestBodyMode, responseBodyMode = 'NONE') {
  return encodeLenField(11, Buffer.concat([
    encodeVarintField(1, kBodySendMode[requestBodyMode]),
    encodeVarintField(2, kBodySendMode[responseBodyMode]),
  ]));
}

function healthCheck(address, service, timeoutMs = 2000) {
  const client = new HealthClient(address, grpc.credentials.createInsecure());
  return new Promise((resolve, reject) => {
    client.Check({ service }, { deadline: Date.now() + timeoutMs }, (err, res) => {
      client.close();
      if (err) reject(err); else resolve(res.status);
    });
  });
}

module.exports = {
  ExtProcClient, Exchange, healthCheck, headersRequest, bodyRequest, postHeaders,
  subsetHint, toStruct, fromStruct, headerValueOf, decodeFields, decodeResponseWire,
  protocolConfigField, envoyDefinition, kEnvoyIncludeDirs, grpc,
};
