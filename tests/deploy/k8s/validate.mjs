// Validates rendered Kubernetes manifests offline.
//
//   kubectl kustomize deploy/k8s/overlays/gpu | node validate.mjs gpu
//
// 1. Types: each object goes through its kubernetes-models class (JSON
//    schemas of the Kubernetes and Prometheus Operator APIs, via ajv).
// 2. Unknown fields: those schemas allow extra properties, so every field is
//    also checked against the packages' own TypeScript declarations (.d.ts),
//    which list each type's properties; an undeclared field fails.
// 3. The deployment's own rules: gRPC probes on the health service, a
//    non-root security context, a grace period covering the drain, a
//    selector on the disruption budget, GPUs requested by GPU overlays.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import yaml from "js-yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const overlay = process.argv[2] ?? "?";
const failures = [];
const fail = (msg) => failures.push(msg);

// ---- A small parser for the type syntax used in the .d.ts files ----------

function tokenize(src) {
  src = src.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/[^\n]*/g, " ");
  const tokens = [];
  const re = /\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_$][\w$.]*|-?\d+(?:\.\d+)?|=>|[{}\[\]<>();:?|,=&])/y;
  let m;
  re.lastIndex = 0;
  while (re.lastIndex < src.length && (m = re.exec(src))) tokens.push(m[1]);
  return tokens;
}

class Parser {
  constructor(tokens, start) {
    this.t = tokens;
    this.i = start;
  }
  peek() { return this.t[this.i]; }
  next() { return this.t[this.i++]; }
  eat(tok) {
    if (this.t[this.i] !== tok) throw new Error(`expected ${tok}, got ${this.t[this.i]}`);
    this.i++;
  }
  type() {
    const alts = [this.postfix()];
    while (this.peek() === "|") {
      this.next();
      alts.push(this.postfix());
    }
    return alts.length === 1 ? alts[0] : { kind: "union", alts };
  }
  postfix() {
    let t = this.primary();
    while (this.peek() === "[" && this.t[this.i + 1] === "]") {
      this.i += 2;
      t = { kind: "array", of: t };
    }
    return t;
  }
  primary() {
    const tok = this.next();
    if (tok === "{") return this.members();
    if (tok === "(") {
      const t = this.type();
      this.eat(")");
      return t;
    }
    if (/^["']/.test(tok)) return { kind: "literal", value: tok.slice(1, -1) };
    if (/^-?\d/.test(tok)) return { kind: "literal", value: Number(tok) };
    // Identifier, possibly generic.
    if (this.peek() === "<") {
      this.next();
      const args = [this.type()];
      while (this.peek() === ",") {
        this.next();
        args.push(this.type());
      }
      this.eat(">");
      if (tok === "Array") return { kind: "array", of: args[0] };
      return { kind: "ref", name: tok, args };
    }
    return { kind: "ref", name: tok };
  }
  members() {
    const members = new Map();
    let index = null;
    while (this.peek() !== "}") {
      if (this.peek() === "[") {  // [key: string]: T
        this.next();
        this.next();
        this.eat(":");
        this.type();
        this.eat("]");
        this.eat(":");
        index = this.type();
      } else {
        let name = this.next();
        if (/^["']/.test(name)) name = name.slice(1, -1);
        if (this.peek() === "?") this.next();
        this.eat(":");
        members.set(name, this.type());
      }
      if (this.peek() === ";" || this.peek() === ",") this.next();
    }
    this.eat("}");
    return { kind: "object", members, index };
  }
}

// Interfaces by exported full name, and the root interface of each kind.
const interfaces = new Map();
const kinds = new Map();

function loadDeclarations(dir) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const file = path.join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== "node_modules") loadDeclarations(file);
      continue;
    }
    if (!entry.name.endsWith(".d.ts")) continue;
    const tokens = tokenize(fs.readFileSync(file, "utf8"));
    const local = new Map();
    for (let i = 0; i < tokens.length; i++) {
      if (tokens[i] === "interface" && tokens[i - 1] === "export") {
        const name = tokens[i + 1];
        let j = i + 2;
        const bases = [];
        if (tokens[j] === "extends") {
          j++;
          while (tokens[j] !== "{") {
            if (tokens[j] !== ",") bases.push(tokens[j]);
            j++;
          }
        }
        const p = new Parser(tokens, j + 1);
        try {
          const t = p.members();
          t.bases = bases;
          local.set(name, t);
        } catch (e) {
          // A declaration this parser does not follow: its fields go unchecked.
        }
      }
      if (tokens[i] === "type" && tokens[i - 1] === "export" && tokens[i + 1] === "{") {
        for (let j = i + 2; tokens[j] !== "}"; j++) {
          if (tokens[j + 1] === "as" && local.has(tokens[j])) interfaces.set(tokens[j + 2], local.get(tokens[j]));
        }
      }
    }
    for (const [name, t] of local) {
      if (!interfaces.has(name)) interfaces.set(name, t);
      const api = t.members.get("apiVersion"), kind = t.members.get("kind");
      if (api?.kind === "literal" && kind?.kind === "literal") kinds.set(`${api.value}/${kind.value}`, t);
    }
  }
}

// Reports fields of `value` that `type` does not declare.
function unknownFields(value, type, where, errors, depth = 0) {
  if (depth > 64 || value === null || value === undefined) return;
  switch (type.kind) {
    case "ref": {
      const target = interfaces.get(type.name);
      if (target) unknownFields(value, target, where, errors, depth + 1);
      return;
    }
    case "array":
      if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, type.of, `${where}[${i}]`, errors, depth + 1));
      return;
    case "union": {
      if (typeof value !== "object") return;
      const candidates = type.alts.filter((a) => a.kind !== "literal");
      let best = null;
      for (const alt of candidates) {
        const errs = [];
        unknownFields(value, alt, where, errs, depth + 1);
        if (errs.length === 0) return;
        if (best === null || errs.length < best.length) best = errs;
      }
      if (best) errors.push(...best);
      return;
    }
    case "object": {
      if (typeof value !== "object" || Array.isArray(value)) return;
      for (const [key, v] of Object.entries(value)) {
        const member = type.members.get(key);
        if (member) unknownFields(v, member, `${where}.${key}`, errors, depth + 1);
        else if (type.index) unknownFields(v, type.index, `${where}.${key}`, errors, depth + 1);
        else if (!(type.bases ?? []).includes("TypeMeta") || (key !== "apiVersion" && key !== "kind")) {
          errors.push(`${where}.${key}: unknown field`);
        }
      }
      return;
    }
    default:
      return;
  }
}

// ---- Validation ----------------------------------------------------------

function modulePath(apiVersion) {
  if (apiVersion === "v1") return "kubernetes-models/v1";
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}`;
  }
  return `kubernetes-models/${apiVersion}`;
}

loadDeclarations(path.join(here, "node_modules/kubernetes-models"));
loadDeclarations(path.join(here, "node_modules/@kubernetes-models/apimachinery"));
loadDeclarations(path.join(here, "node_modules/@kubernetes-models/prometheus-operator"));
if (interfaces.size < 500) fail(`only ${interfaces.size} types read from the declarations`);

const docs = yaml.loadAll(fs.readFileSync(0, "utf8")).filter(Boolean);
const byKind = {};
for (const doc of docs) {
  const id = `${doc.kind}/${doc.metadata?.name}`;
  (byKind[doc.kind] ??= []).push(doc);
  let Model;
  try {
    Model = (await import(modulePath(doc.apiVersion)))[doc.kind];
  } catch (e) {
    Model = undefined;
  }
  if (!Model) {
    fail(`${id}: no schema for ${doc.apiVersion} ${doc.kind}`);
    continue;
  }
  try {
    new Model(doc).validate();
  } catch (e) {
    fail(`${id}: ${e.message}`);
  }
  const root = kinds.get(`${doc.apiVersion}/${doc.kind}`);
  if (!root) {
    fail(`${id}: no declaration to check fields against`);
    continue;
  }
  const errors = [];
  unknownFields(doc, root, id, errors);
  errors.forEach(fail);
}

// ---- The deployment's own rules ---------------------------------------------

const expectKinds = ["ConfigMap", "Deployment", "Service", "ServiceMonitor", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget"];
for (const k of expectKinds) if (!byKind[k]) fail(`no ${k}`);
const deployment = byKind.Deployment?.[0];
const config = byKind.ConfigMap?.find((c) => c.metadata.name === "matmul-server-config");
if (deployment) {
  const pod = deployment.spec.template.spec;
  const c = pod.containers[0];
  for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    if (c[probe]?.grpc?.port !== 50051) fail(`${probe} is not a gRPC health probe on 50051`);
  }
  if (c.readinessProbe?.grpc?.service !== "matmul.v1.MatmulService") {
    fail("readiness must ask the health service about matmul.v1.MatmulService");
  }
  if (pod.securityContext?.runAsNonRoot !== true) fail("pod does not run as non-root");
  if (c.securityContext?.allowPrivilegeEscalation !== false) fail("privilege escalation allowed");
  const grace = Number(config?.data?.MATMUL_SHUTDOWN_GRACE_S ?? "30");
  if (!(pod.terminationGracePeriodSeconds >= grace + 5)) {
    fail(`terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} does not cover a ${grace} s drain`);
  }
  const gpus = Number(c.resources?.limits?.["nvidia.com/gpu"] ?? 0);
  if (overlay.includes("gpu") && gpus < 1) fail("GPU overlay requests no nvidia.com/gpu");
  if (overlay === "multi-gpu" && gpus < 2) fail("multi-gpu overlay requests fewer than 2 GPUs");
  if (!overlay.includes("gpu") && gpus > 0) fail("CPU overlay requests GPUs");
  const backend = config?.data?.MATMUL_BACKEND;
  if (overlay.includes("gpu") ? backend !== "cuda" : backend !== "cpu") fail(`MATMUL_BACKEND is ${backend}`);
}
const pdb = byKind.PodDisruptionBudget?.[0];
if (pdb && !pdb.spec.selector?.matchLabels) fail("PodDisruptionBudget has no selector");
const hpa = byKind.HorizontalPodAutoscaler?.[0];
if (hpa && hpa.spec.scaleTargetRef.name !== deployment?.metadata.name) fail("HPA does not target the Deployment");
if (!byKind.Service?.some((s) => s.spec.clusterIP === "None")) fail("no headless Service for client-side balancing");

if (failures.length) {
  console.error(`overlay ${overlay}: ${failures.length} problem(s)`);
  failures.forEach((f) => console.error(`  ${f}`));
  process.exit(1);
}
console.log(`overlay ${overlay}: ${docs.length} objects valid (${interfaces.size} types known)`);
