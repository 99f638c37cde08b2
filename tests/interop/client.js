// Calls matmul-server through @grpc/grpc-js, a gRPC implementation that
// shares no code with the server's (C-core based) stack, and checks the
// answers against a float64 reference computed here.
//
//   node client.js HOST:PORT PROTO_DIR GRPC_PROTO_DIR
'use strict';
const assert = require('assert');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const [target, protoDir, grpcProtoDir] = process.argv.slice(2);
const options = {keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true};
const matmul = grpc.loadPackageDefinition(
    loader.loadSync('matmul/v1/matmul.proto', {...options, includeDirs: [protoDir]})).matmul.v1;
const health = grpc.loadPackageDefinition(
    loader.loadSync('grpc/health/v1/health.proto', {...options, includeDirs: [grpcProtoDir]}))
    .grpc.health.v1;

const client = new matmul.MatmulService(target, grpc.credentials.createInsecure(), {
  'grpc.max_receive_message_length': 64 << 20,
});
const call = (method, request) => new Promise((resolve, reject) =>
  client[method](request, (err, response) => err ? reject(err) : resolve(response)));

function random(n) {
  const v = new Float64Array(n);
  for (let i = 0; i < n; ++i) {
    do { v[i] = Math.random() * 2 - 1; } while (Math.abs(v[i]) < 1e-3);
  }
  return v;
}
function matrix(rows, cols, values, dtype) {
  const typed = dtype === 'DTYPE_FLOAT64' ? Float64Array.from(values) : Float32Array.from(values);
  return {rows, cols, dtype, data: Buffer.from(typed.buffer)};
}
function decode(m) {
  const bytes = Uint8Array.from(m.data);  // Own, aligned copy.
  return m.dtype === 'DTYPE_FLOAT64' ? new Float64Array(bytes.buffer) : new Float32Array(bytes.buffer);
}
// alpha * op(A) op(B) + beta * C in float64; A stored ar x ac.
function reference(a, ar, ac, ta, b, br, bc, tb, alpha, beta, c) {
  const m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  const out = new Float64Array(m * n);
  for (let i = 0; i < m; ++i) {
    for (let j = 0; j < n; ++j) {
      let s = 0;
      for (let l = 0; l < k; ++l) {
        s += (ta ? a[l * ac + i] : a[i * ac + l]) * (tb ? b[j * bc + l] : b[l * bc + j]);
      }
      out[i * n + j] = alpha * s + (c ? beta * c[i * n + j] : 0);
    }
  }
  return out;
}
function relErr(got, ref) {
  let d = 0, r = 0;
  for (let i = 0; i < ref.length; ++i) {
    if (!Number.isFinite(got[i])) return Infinity;
    d += (got[i] - ref[i]) ** 2;
    r += ref[i] ** 2;
  }
  return Math.sqrt(d / r);
}

async function main() {
  // Plain float32 product.
  const a = random(37 * 29), b = random(29 * 41);
  let r = await call('Multiply', {a: matrix(37, 29, a, 'DTYPE_FLOAT32'),
                                  b: matrix(29, 41, b, 'DTYPE_FLOAT32'), request_id: 'js-1'});
  assert.strictEqual(r.request_id, 'js-1');
  assert.strictEqual(r.c.rows, 37);
  assert.strictEqual(r.c.cols, 41);
  assert.strictEqual(r.c.dtype, 'DTYPE_FLOAT32');
  let err = relErr(decode(r.c), reference(Float32Array.from(a), 37, 29, false,
                                          Float32Array.from(b), 29, 41, false, 1, 0, null));
  assert.ok(err <= 1e-5, `float32 relative error ${err}`);
  console.log(`float32 37x41x29: relative error ${err.toExponential(2)}`);

  // float64 with transposes, alpha, beta and C.
  const a2 = random(13 * 7), b2 = random(19 * 13), c2 = random(7 * 19);
  r = await call('Multiply', {a: matrix(13, 7, a2, 'DTYPE_FLOAT64'), transpose_a: true,
                              b: matrix(19, 13, b2, 'DTYPE_FLOAT64'), transpose_b: true,
                              c: matrix(7, 19, c2, 'DTYPE_FLOAT64'), alpha: 1.5, beta: -0.5});
  err = relErr(decode(r.c), reference(a2, 13, 7, true, b2, 19, 13, true, 1.5, -0.5, c2));
  assert.ok(err <= 1e-12, `float64 relative error ${err}`);
  console.log(`float64 transposed with alpha/beta/C: relative error ${err.toExponential(2)}`);

  // Bad input: INVALID_ARGUMENT naming the field.
  try {
    await call('Multiply', {a: {rows: 2, cols: 2, dtype: 'DTYPE_FLOAT32', data: Buffer.alloc(15)},
                            b: matrix(2, 2, random(4), 'DTYPE_FLOAT32')});
    assert.fail('bad request was accepted');
  } catch (e) {
    assert.strictEqual(e.code, grpc.status.INVALID_ARGUMENT);
    assert.ok(e.details.includes('a.data'), e.details);
    console.log(`bad input: INVALID_ARGUMENT "${e.details}"`);
  }

  const info = await call('GetServerInfo', {});
  assert.ok(info.engine.length > 0);
  assert.ok(info.devices.length >= 1);
  console.log(`server ${info.version}, engine ${info.engine}`);

  const h = new health.Health(target, grpc.credentials.createInsecure());
  const status = await new Promise((resolve, reject) => h.Check(
      {service: 'matmul.v1.MatmulService'}, (e, res) => e ? reject(e) : resolve(res)));
  assert.strictEqual(status.status, 'SERVING');
  console.log('health: SERVING');
  client.close();
  h.close();
}

main().catch((e) => { console.error(e); process.exit(1); });
