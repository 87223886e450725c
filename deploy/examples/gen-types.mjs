// TypeScript types of CommonOS events, generated from the exported JSON Schema (proto/schema/) with
// json-schema-to-typescript:
//
//   node gen-types.mjs [SCHEMA_DIR] [OUT_FILE]      (default: ../../proto/schema, events.d.ts beside this file)
//
// Whatever the folder holds, the output has `CosEvent`, the union of every event type: the union the schema
// declares (`events.schema.json`, a top-level oneOf/anyOf on `type`), else the union of every file that
// describes one event type. References are followed by JSON pointer or by `$id` (files of the folder, schemas
// embedded with an `$id` of their own), bundled into one document first: nothing is ever fetched.
import { readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { compile } from "json-schema-to-typescript";

const here = dirname(fileURLToPath(import.meta.url));
const schemaDir = resolve(process.argv[2] ?? process.env.COS_SCHEMA_DIR ?? join(here, "..", "..", "proto", "schema"));
const outFile = resolve(process.argv[3] ?? join(here, "events.d.ts"));

function walkFiles(dir) {
  return readdirSync(dir)
    .sort()
    .flatMap((name) => {
      const path = join(dir, name);
      return statSync(path).isDirectory() ? walkFiles(path) : name.endsWith(".json") ? [path] : [];
    });
}

const files = walkFiles(schemaDir).map((path) => ({
  path,
  name: relative(schemaDir, path),
  schema: JSON.parse(readFileSync(path, "utf8")),
}));
if (files.length === 0) {
  console.error(`gen-types: no *.json schema under ${schemaDir}`);
  process.exit(1);
}

// Every schema resource by its URL: each file (by $id and by path) and each subschema with an $id of its own.
const byUrl = new Map();
const noFragment = (url) => url.split("#")[0];
function index(node) {
  if (Array.isArray(node)) return node.forEach(index);
  if (node === null || typeof node !== "object") return;
  if (typeof node.$id === "string") byUrl.set(noFragment(node.$id), node);
  Object.values(node).forEach(index);
}
for (const { path, schema } of files) {
  byUrl.set(`file://${path}`, schema);
  index(schema);
}

function pointer(doc, fragment) {
  let node = doc;
  for (const raw of fragment.split("/").slice(1)) {
    const key = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    node = node?.[key];
  }
  if (node === undefined) throw new Error(`gen-types: #${fragment} not found`);
  return node;
}

// One self-contained document: every reference becomes `#/$defs/<name>` of the root.
function bundle(root, rootUrl) {
  const defs = {};
  const placed = new Map();
  const unique = (base) => {
    let name = base.replace(/[^A-Za-z0-9_]/g, "_") || "Schema";
    for (let n = 2; name in defs; n++) name = `${base}${n}`;
    return name;
  };
  function walk(node, scope) {
    if (Array.isArray(node)) return node.map((item) => walk(item, scope));
    if (node === null || typeof node !== "object") return node;
    const inner = typeof node.$id === "string" ? { url: new URL(noFragment(node.$id), scope.url).href, doc: node } : scope;
    const out = {};
    for (const [key, value] of Object.entries(node)) {
      if (["$id", "$schema", "$defs", "definitions", "$comment"].includes(key)) continue;
      out[key] = key === "$ref" && typeof value === "string" ? reference(value, inner) : walk(value, inner);
    }
    // An object whose keys the schema leaves open (tool `args`: any JSON object) is a map of unknown values,
    // not `{}` (compile's additionalProperties: false is for the objects whose properties are listed).
    const open = !("properties" in out || "patternProperties" in out || "additionalProperties" in out);
    if (out.type === "object" && open) out.additionalProperties = true;
    return out;
  }
  function reference(ref, scope) {
    const [url, fragment = ""] = ref.split("#");
    const target = url === "" ? scope : { url: new URL(url, scope.url).href };
    target.doc ??= byUrl.get(target.url);
    if (target.doc === undefined) throw new Error(`gen-types: ${ref} (${target.url}) is not a schema of ${schemaDir}`);
    const key = `${target.url}#${fragment}`;
    if (!placed.has(key)) {
      const schema = fragment ? pointer(target.doc, fragment) : target.doc;
      const name = unique(schema.title ?? (fragment.split("/").pop() || target.url.split("/").slice(-2).join("_")));
      placed.set(key, name);
      defs[name] = {};
      defs[name] = walk(schema, target);
    }
    return `#/$defs/${placed.get(key)}`;
  }
  const top = walk(root, { url: rootUrl, doc: root });
  return { ...top, $defs: defs };
}

const isUnion = (s) => Array.isArray(s.oneOf) || Array.isArray(s.anyOf);
const union =
  files.find(({ name, schema }) => name === "events.schema.json" && isUnion(schema)) ??
  files.find(({ name, schema }) => /event/i.test(name) && isUnion(schema));
let root;
let rootUrl;
if (union !== undefined) {
  root = union.schema;
  rootUrl = typeof root.$id === "string" ? noFragment(root.$id) : `file://${union.path}`;
} else {
  const members = files.filter(({ name, schema }) => /event/i.test(name) && schema.properties?.type);
  root = { anyOf: members.map(({ path, schema }) => ({ $ref: schema.$id ?? `file://${path}` })) };
  rootUrl = `file://${schemaDir}/`;
}
const bundled = { ...bundle(root, rootUrl), title: "CosEvent" };

const ts = await compile(bundled, "CosEvent", {
  bannerComment: `/* Generated by gen-types.mjs from ${schemaDir}: do not edit. */`,
  additionalProperties: false,
  unreachableDefinitions: false,
  $refOptions: { resolve: { http: false, file: false } },
});
writeFileSync(outFile, ts);
console.error(`gen-types: ${outFile} (CosEvent from ${files.length} schema file(s))`);
