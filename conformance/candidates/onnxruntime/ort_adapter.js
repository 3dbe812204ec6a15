#!/usr/bin/env node
// ONNX Runtime's CPU normalization kernels as a normcheck candidate: the child side of the
// subprocess protocol (conformance/PROTOCOL.md) in Node.js, the protocol's second implementation
// after conformance/python/normcheck_protocol.py.
//
//   node ort_adapter.js --kernel layernorm|rmsnorm|skip-layernorm|skip-rmsnorm
//                       [--cache DIR] [--python /usr/bin/python3] [--threads 1]
//
// Each case runs one ONNX node in an onnxruntime-node InferenceSession (CPU execution provider):
//   layernorm       LayerNormalization (ONNX opset 17, stash_type 1): Y, Mean, InvStdDev
//   rmsnorm         SimplifiedLayerNormalization (ONNX Runtime's RMSNorm): Y, InvStdDev
//   skip-layernorm  com.microsoft SkipLayerNormalization: h = input + skip (+ bias), Y, Mean,
//                   InvStdDev and the sum h (normcheck's residual_out)
//   skip-rmsnorm    com.microsoft SkipSimplifiedLayerNormalization: the same without the mean
// The model of a case is built once by ort_models.py (onnx.helper; Node has no ONNX builder) and
// cached under --cache, named after its spec; its dims are symbolic, so one model serves every
// shape of a rank. Its epsilon attribute is a placeholder that the adapter replaces, in a copy of
// the model's bytes, by the case's epsilon (withEpsilon): one model serves every epsilon too.
// What is declined, and why, is in README.md ("What maps onto ONNX Runtime").
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');

// fd 1 belongs to the protocol: anything a library logs goes to stderr. (Node cannot move fd 1
// without a native module, as the Python module does; ONNX Runtime logs to stderr.)
console.log = console.error;
console.info = console.error;
console.warn = console.error;
process.stdout.write = (...a) => process.stderr.write(...a);

const PROTOCOL = 'normcheck-subprocess';
const VERSION = 1;
const MAX_HEADER_BYTES = 1 << 20;
const ITEMSIZE = { float64: 8, float32: 4, float16: 2, bfloat16: 2 };
const BUILDER_VERSION = 3; // part of every model's cache key: bump when ort_models.py changes a model
// The epsilon the template models are built with (float32 bits 0x0DADBEEF, a value no case's
// model holds otherwise: the graph has no initializers) and the bytes of its protobuf field:
// AttributeProto.f is field 2, wire type 5 (fixed32, little-endian), tag byte 0x15.
const EPS_PLACEHOLDER_HEX = '0xadbeefp-123';
const EPS_PLACEHOLDER_FIELD = Buffer.from([0x15, 0xef, 0xbe, 0xad, 0x0d]);
// Sessions kept open (least recently used first out): one per model and epsilon.
const MAX_SESSIONS = 64;

const KERNELS = {
  layernorm: { op: 'LayerNormalization', normOp: 'layernorm', residual: false },
  rmsnorm: { op: 'SimplifiedLayerNormalization', normOp: 'rmsnorm', residual: false },
  'skip-layernorm': { op: 'SkipLayerNormalization', normOp: 'layernorm', residual: true },
  'skip-rmsnorm': { op: 'SkipSimplifiedLayerNormalization', normOp: 'rmsnorm', residual: true },
};
// normcheck output name -> ONNX output slot (ort_models.py SLOTS).
const OUTPUT_SLOT = { y: 'Y', mean: 'Mean', rstd: 'InvStdDev', residual_out: 'Sum' };

class Declined extends Error {}
class ProtocolError extends Error {}

function parseArgs(argv) {
  const a = { kernel: null, cache: null, python: '/usr/bin/python3', threads: 1 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const v = argv[i + 1];
    if (k === '--kernel') a.kernel = v;
    else if (k === '--cache') a.cache = v;
    else if (k === '--python') a.python = v;
    else if (k === '--threads') a.threads = Number(v);
    else throw new Error(`unknown argument ${k}`);
    i++;
  }
  if (!(a.kernel in KERNELS)) throw new Error(`--kernel takes ${Object.keys(KERNELS).join(', ')}`);
  if (!a.cache) a.cache = path.join(os.tmpdir(), `normcheck-onnxruntime-models-${process.getuid()}`);
  return a;
}

// A C99 hexadecimal float ("0x1.4f8b588e368f1p-17", "-0x0p+0", "inf", "nan") to the binary64 it
// denotes, exactly (the protocol's *_hex fields; JSON numbers are not relied on).
function hexToDouble(s) {
  if (typeof s !== 'string') throw new ProtocolError(`not a hex float: ${JSON.stringify(s)}`);
  const t = s.trim().toLowerCase();
  if (t === 'nan' || t === '-nan') return NaN;
  if (t === 'inf' || t === '+inf') return Infinity;
  if (t === '-inf') return -Infinity;
  const m = /^([+-]?)0x([0-9a-f]*)(?:\.([0-9a-f]*))?p([+-]?\d+)$/.exec(t);
  if (!m || (m[2] + (m[3] || '')).length === 0) throw new ProtocolError(`not a hex float: ${JSON.stringify(s)}`);
  const digits = (m[2] + (m[3] || '')).replace(/^0+/, '') || '0';
  let mant = BigInt('0x' + digits);
  let exp = Number(m[4]) - 4 * (m[3] || '').length;
  if (mant === 0n) return m[1] === '-' ? -0 : 0;
  // Keep 53 bits (a %a of a binary64 never has more; more would need rounding, refused here).
  while (mant > (1n << 53n) && (mant & 1n) === 0n) { mant >>= 1n; exp += 1; }
  if (mant >= (1n << 53n)) throw new ProtocolError(`hex float with more than 53 significant bits: ${s}`);
  let v = Number(mant); // exact
  // v * 2^exp with one rounding: 2^k is exact for k in [-1000, 1000], and a first step that keeps
  // the value normal is exact, so only the last multiplication rounds (to a subnormal, or 0).
  if (exp > 0) {
    while (exp > 1000) { v *= 2 ** 1000; exp -= 1000; }
    v *= 2 ** exp;
  } else if (exp < 0) {
    if (exp >= -1000) v *= 2 ** exp;
    else if (exp < -2022) v = 0; // below 2^53 * 2^-2022: far under half the smallest subnormal
    else { v *= 2 ** (exp + 1000); v *= 2 ** -1000; }
  }
  return m[1] === '-' ? -v : v;
}

// ---------------------------------------------------------------------------------------------
// Transport: a buffered reader of stdin (lines and exact byte counts) and blocking writes.

class Reader {
  constructor(stream) {
    this.chunks = [];
    this.len = 0;
    this.ended = false;
    this.waiter = null;
    stream.on('data', (c) => { this.chunks.push(c); this.len += c.length; this.wake(); });
    stream.on('end', () => { this.ended = true; this.wake(); });
    stream.on('error', () => { this.ended = true; this.wake(); });
  }
  wake() { const w = this.waiter; this.waiter = null; if (w) w(); }
  wait() { return new Promise((r) => { this.waiter = r; }); }
  joined() {
    if (this.chunks.length !== 1) this.chunks = [Buffer.concat(this.chunks, this.len)];
    return this.chunks[0];
  }
  // One line including its line feed, or null at end of input at a message boundary.
  async readLine() {
    for (;;) {
      const b = this.joined();
      const i = b.indexOf(10);
      if (i >= 0) {
        if (i + 1 > MAX_HEADER_BYTES) throw new ProtocolError('header longer than 1 MiB');
        this.chunks = [b.subarray(i + 1)];
        this.len -= i + 1;
        return b.subarray(0, i + 1);
      }
      if (b.length > MAX_HEADER_BYTES) throw new ProtocolError('header longer than 1 MiB');
      if (this.ended) {
        if (b.length === 0) return null;
        throw new ProtocolError('header cut off by the end of input');
      }
      await this.wait();
    }
  }
  // Exactly n bytes, in a fresh (aligned) ArrayBuffer.
  async readExact(n) {
    while (this.len < n && !this.ended) await this.wait();
    if (this.len < n) throw new ProtocolError(`end of input after ${this.len} of ${n} payload bytes`);
    const out = new Uint8Array(n);
    if (n > 0) {
      const b = this.joined();
      out.set(b.subarray(0, n));
      this.chunks = [b.subarray(n)];
      this.len -= n;
    }
    return out;
  }
}

function writeAll(bytes) {
  let off = 0;
  while (off < bytes.length) {
    try {
      off += fs.writeSync(1, bytes, off, bytes.length - off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1); // pipe full: 1 ms
    }
  }
}

function send(header, payloads = []) {
  const parts = [Buffer.from(JSON.stringify(header) + '\n', 'utf8')];
  for (const p of payloads) parts.push(Buffer.from(p.buffer, p.byteOffset, p.byteLength));
  writeAll(Buffer.concat(parts));
}

function checkEntry(e) {
  if (!e || typeof e !== 'object' || typeof e.name !== 'string' || !(e.dtype in ITEMSIZE))
    throw new ProtocolError(`bad tensor entry ${JSON.stringify(e)}`);
  if (!Array.isArray(e.shape) || e.shape.some((d) => !Number.isInteger(d) || d < 0))
    throw new ProtocolError(`bad shape in ${JSON.stringify(e)}`);
  const n = e.shape.reduce((p, d) => p * d, 1);
  if (e.nbytes !== n * ITEMSIZE[e.dtype]) throw new ProtocolError(`nbytes does not match the shape in ${JSON.stringify(e)}`);
  return e;
}

// ---------------------------------------------------------------------------------------------
// The mapping of a case onto one ONNX Runtime node.

const FLOAT_T = ['float32', 'float16'];

// The rounding points of a contract part (reference/README.md, "Precision contracts") as the
// dtype each rounds to; ONNX Runtime's CPU kernels compute in float32 and round only the outputs,
// so a point is honoured only when it rounds to float32 (a no-op for a float32 computation) or
// when what it rounds is already a value of its dtype.
function checkContract(c, kernel) {
  for (const part of c.contract.split('+')) {
    switch (part) {
      case 'exact':
        break;
      case 'llama': // xhat -> dtype_x
      case 'onnx': // xhat -> dtype_x, mul -> dtype_x
        if (c.dtype_x !== 'float32')
          throw new Declined(`contract ${part} rounds x-hat${part === 'onnx' ? ' and x-hat*scale' : ''} to ${c.dtype_x}; ` +
                             `ONNX Runtime's CPU kernel keeps them in float32 and rounds y once`);
        break;
      case 'gemma': // scale -> dtype_compute
      case 'te':
      case 'te_wdtype': // scale -> dtype_param
        break; // weight_offset is 0 (checked): scale = weight, already a value of both dtypes
      case 'fused_add_lowp': // h -> dtype_residual, before the statistics
        if (c.residual !== 'none' && c.dtype_residual !== 'float32')
          throw new Declined(`contract fused_add_lowp takes the statistics of h rounded to ${c.dtype_residual}; ` +
                             `${kernel.op} takes them of the float32 sum`);
        break;
      default:
        throw new Declined(`contract ${part} is not one this adapter maps onto ONNX Runtime`);
    }
  }
}

// -> {spec, feeds: [slot, dtype, dims, data], fetch: [[name, slot]], rows} or throws Declined.
function plan(kernel, c, inputs, wanted) {
  if (c.op !== kernel.normOp) throw new Declined(`${kernel.op} computes ${kernel.normOp}, not ${c.op}`);
  if (c.direction !== 'forward') throw new Declined(`ONNX Runtime's inference kernels have no backward (${kernel.op})`);
  if (c.block !== 'none') throw new Declined('residual blocks are not one ONNX Runtime node');
  const t = c.dtype_x;
  if (t === 'bfloat16') throw new Declined('onnxruntime-node cannot pass bfloat16 tensors (a bfloat16 model fails to load: "Unsupported data type: 16")');
  if (t === 'float64') throw new Declined('float64 is not run: the ONNX type of Mean/InvStdDev (U) has no double, ONNX Runtime narrows them to float32');
  if (!FLOAT_T.includes(t)) throw new Declined(`dtype ${t} is not run`);
  const same = [['dtype_param', c.dtype_param], ['dtype_out', c.dtype_out]];
  if (kernel.residual) same.push(['dtype_residual', c.dtype_residual]);
  for (const [k, v] of same)
    if (v !== t) throw new Declined(`${k} ${v} differs from dtype_x ${t}: ${kernel.op} has one type T for every tensor`);
  if (c.dtype_compute !== 'float32')
    throw new Declined(`dtype_compute ${c.dtype_compute}: ONNX Runtime's CPU kernel computes float and float16 in float32 (stash_type 1)`);
  if (hexToDouble(c.weight_offset_hex) !== 0) throw new Declined(`${kernel.op} has no weight offset (scale = weight)`);
  if (kernel.residual) {
    // residual none runs with skip = +0: x + 0 is x exactly in IEEE arithmetic (-0 becomes +0,
    // whose sign no output depends on), so the case is the Skip kernel's normalization itself.
    if (c.residual !== 'none' && hexToDouble(c.alpha_hex) !== 1) throw new Declined(`${kernel.op} computes input + skip (+ bias): alpha ${c.alpha} has no mapping`);
  } else if (c.residual !== 'none') {
    throw new Declined(`${kernel.op} has no residual input (the fused add is onnxruntime-skip-*)`);
  }
  if (c.op === 'rmsnorm' && c.affine === 'weight_bias')
    throw new Declined(kernel.residual
      ? 'SkipSimplifiedLayerNormalization has no output bias (its Bias input is added to the sum before the norm)'
      : 'SimplifiedLayerNormalization has no bias input');
  checkContract(c, kernel);

  const x = inputs.x;
  const rank = x.shape.length;
  const dims = c.norm_dims;
  const k = dims.length;
  if (!dims.every((d, i) => d === rank - k + i)) throw new Declined(`normalized dims [${dims}] are not trailing: ONNX's axis normalizes [axis, rank)`);
  if (kernel.residual && k !== 1) throw new Declined(`${kernel.op} normalizes the last dim only`);
  const hidden = x.shape.slice(rank - k).reduce((p, d) => p * d, 1);
  const rows = x.shape.slice(0, rank - k).reduce((p, d) => p * d, 1);
  // The Skip ops take [batch, sequence, hidden]: the rows are laid out as [1, rows, hidden]
  // (a reshape, the same bytes).
  const xdims = kernel.residual ? [1, rows, hidden] : x.shape;
  const pdims = kernel.residual ? [hidden] : x.shape.slice(rank - k);
  const axis = kernel.residual ? 2 : rank - k;
  // The case's own ONNX axis (negative ones too) goes into the model as given; an explicit
  // `axes` list that is a trailing range becomes its first dim.
  const axisAttr = kernel.residual || c.axes !== undefined ? axis : c.axis;

  const feeds = [['X', t, xdims, x.data]];
  const ones = () => {
    const a = t === 'float32' ? new Float32Array(hidden).fill(1) : new Uint16Array(hidden).fill(0x3c00);
    return new Uint8Array(a.buffer);
  };
  const scaleSlot = kernel.residual ? 'Gamma' : 'Scale';
  if (kernel.residual) feeds.push(['Skip', t, xdims, inputs.residual ? inputs.residual.data : new Uint8Array(x.data.length)]);
  // affine none: scale 1 (x-hat * 1 is x-hat exactly); ONNX Runtime's ops require a scale.
  feeds.push([scaleSlot, t, pdims, inputs.weight ? inputs.weight.data : ones()]);
  if (inputs.bias) feeds.push([kernel.residual ? 'Beta' : 'B', t, pdims, inputs.bias.data]);
  if (inputs.residual_bias) feeds.push(['Bias', t, pdims, inputs.residual_bias.data]);

  const fetch = [];
  for (const name of Object.keys(wanted)) {
    const slot = OUTPUT_SLOT[name];
    if (!slot) throw new Declined(`output ${name} is not one ${kernel.op} has`);
    fetch.push([name, slot]);
  }
  const spec = {
    builder: BUILDER_VERSION, op: kernel.op, dtype: t, stats_dtype: 'float32', rank: xdims.length, axis, axis_attr: axisAttr,
    inputs: feeds.map((f) => f[0]), outputs: fetch.map((f) => f[1]),
  };
  const epsilon = hexToDouble(c.epsilon_hex);
  if (!Number.isFinite(epsilon)) throw new Error(`epsilon ${c.epsilon_hex} is not a finite number`);
  return { spec, epsilon, feeds, fetch };
}

// ---------------------------------------------------------------------------------------------

async function main() {
  let args;
  let ort;
  try {
    args = parseArgs(process.argv.slice(2));
  } catch (e) {
    send({ type: 'error', message: `ort_adapter.js: ${e.message}` });
    process.exit(2);
  }
  try {
    ort = require('onnxruntime-node');
  } catch (e) {
    send({ type: 'error', message: `cannot load onnxruntime-node (scripts/install-onnxruntime.sh installs it): ${e.message}` });
    process.exit(1);
  }
  ort.env.logLevel = 'error';
  const kernel = KERNELS[args.kernel];
  const version = (ort.env.versions && ort.env.versions.common) || '?';
  const templates = new Map(); // model file -> { bytes, at: offset of the epsilon field }
  const sessions = new Map();  // model file and epsilon bits -> session, least recently used first

  // The template model of `spec` (its epsilon the placeholder), built by ort_models.py on first
  // use and kept in the cache folder.
  function templateFor(spec) {
    const key = crypto.createHash('sha256').update(JSON.stringify(spec)).digest('hex').slice(0, 20);
    const file = path.join(args.cache, `${spec.op}-${spec.dtype}-r${spec.rank}-${key}.onnx`);
    let t = templates.get(file);
    if (t) return [file, t];
    if (!fs.existsSync(file)) {
      try {
        execFileSync(args.python, [path.join(__dirname, 'ort_models.py'), '--out', file, JSON.stringify(spec)],
                     { stdio: ['ignore', 'ignore', 'pipe'], maxBuffer: 1 << 20 });
      } catch (e) {
        throw new Error(`building the model failed: ${(e.stderr || e.message).toString().trim()}`);
      }
    }
    const bytes = fs.readFileSync(file);
    const at = bytes.indexOf(EPS_PLACEHOLDER_FIELD);
    if (at < 0 || bytes.indexOf(EPS_PLACEHOLDER_FIELD, at + 1) >= 0)
      throw new Error(`model ${file} does not hold its epsilon placeholder exactly once (delete the cache folder ${args.cache})`);
    t = { bytes, at };
    templates.set(file, t);
    return [file, t];
  }

  // A copy of the template whose epsilon is `epsilon` rounded to float32 (round to nearest even,
  // as onnx.helper stores a float attribute: the conv(eps) of TOLERANCE.md 3.4).
  function withEpsilon(t, epsilon) {
    const bytes = Uint8Array.from(t.bytes);
    new DataView(bytes.buffer).setFloat32(t.at + 1, Math.fround(epsilon), true);
    return bytes;
  }

  async function sessionFor(spec, epsilon) {
    const [file, t] = templateFor({ ...spec, epsilon_hex: EPS_PLACEHOLDER_HEX });
    const bits = Buffer.alloc(4);
    bits.writeFloatLE(Math.fround(epsilon));
    const key = `${file}#${bits.toString('hex')}`;
    let s = sessions.get(key);
    if (s) {
      sessions.delete(key); // most recently used last
      sessions.set(key, s);
      return s;
    }
    s = await ort.InferenceSession.create(withEpsilon(t, epsilon), {
      executionProviders: ['cpu'], intraOpNumThreads: args.threads, interOpNumThreads: 1,
    });
    sessions.set(key, s);
    if (sessions.size > MAX_SESSIONS) {
      const [oldest, old] = sessions.entries().next().value;
      sessions.delete(oldest);
      if (typeof old.release === 'function') await old.release();
    }
    return s;
  }

  async function run(c, inputs, wanted) {
    const p = plan(kernel, c, inputs, wanted);
    const session = await sessionFor(p.spec, p.epsilon);
    const feeds = {};
    for (const [slot, t, dims, bytes] of p.feeds) {
      const data = t === 'float32' ? new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4)
                                   : new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 2);
      feeds[slot] = new ort.Tensor(t, data, dims);
    }
    const got = await session.run(feeds, p.fetch.map((f) => f[1]));
    const out = {};
    for (const [name, slot] of p.fetch) {
      const tensor = got[slot];
      const w = wanted[name];
      const n = w.shape.reduce((q, d) => q * d, 1);
      if (!tensor) throw new Error(`${kernel.op} returned no ${slot}`);
      if (tensor.type !== w.dtype) throw new Error(`${kernel.op} returned ${slot} as ${tensor.type}, the case wants ${w.dtype}`);
      if (tensor.data.length !== n) throw new Error(`${kernel.op} returned ${tensor.data.length} elements of ${slot}, the case wants ${n}`);
      out[name] = tensor.data;
    }
    return out;
  }

  const hello = {
    protocol: PROTOCOL, version: VERSION, type: 'hello',
    name: `onnxruntime ${version} ${kernel.op} (cpu)`,
    description: `ONNX Runtime ${version} (onnxruntime-node), CPU execution provider, one ${kernel.op} node`,
    capabilities: {
      ops: [kernel.normOp], dtypes: ['float64', 'float32', 'float16', 'bfloat16'], compute_dtypes: ['float32'], directions: ['forward'],
      contracts: ['exact', 'llama', 'onnx', 'gemma', 'te', 'te_wdtype', 'fused_add_lowp'],
      residual: kernel.residual, blocks: false, general_axes: !kernel.residual, weight_offset: false, device: 'cpu',
    },
  };
  send(hello);

  const reader = new Reader(process.stdin);
  for (;;) {
    let header;
    const inputs = {};
    try {
      const line = await reader.readLine();
      if (line === null) break;
      try {
        header = JSON.parse(line.toString('utf8'));
      } catch (e) {
        throw new ProtocolError(`request is not JSON: ${e.message}`);
      }
      if (!header || typeof header !== 'object' || Array.isArray(header)) throw new ProtocolError('request is not a JSON object');
      if (header.type === 'bye') break;
      if (header.type !== 'run') throw new ProtocolError(`unknown request type ${JSON.stringify(header.type)}`);
      if (!Array.isArray(header.inputs)) throw new ProtocolError("request has no 'inputs' list");
      for (const e of header.inputs.map(checkEntry)) inputs[e.name] = { shape: e.shape, dtype: e.dtype, data: await reader.readExact(e.nbytes) };
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      send({ type: 'error', message: `malformed request, giving up: ${e.message}` });
      process.exit(2);
    }
    const wanted = {};
    for (const o of header.outputs || []) wanted[o.name] = { dtype: o.dtype, shape: o.shape };
    try {
      const out = await run(header.case || {}, inputs, wanted);
      const entries = [];
      const payloads = [];
      for (const [name, data] of Object.entries(out)) {
        const w = wanted[name];
        entries.push({ name, dtype: w.dtype, shape: w.shape, nbytes: data.byteLength });
        payloads.push(data);
      }
      const reply = { type: 'result', outputs: entries };
      if (header.request !== undefined) reply.request = header.request;
      send(reply, payloads);
    } catch (e) {
      if (e instanceof Declined) {
        send({ type: 'decline', reason: e.message });
      } else {
        console.error(e && e.stack ? e.stack : e);
        send({ type: 'error', message: `${e && e.name ? e.name : 'Error'}: ${e && e.message ? e.message : e}` });
      }
    }
  }
  process.exit(0);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(3);
});
