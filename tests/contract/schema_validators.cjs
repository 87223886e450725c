"use strict";
// CommonOS's golden messages read with stock JavaScript tools, as a consuming team reads them: every schema
// file of proto/schema compiled by ajv (draft 2020-12) in strict mode with ajv-formats, each case's body
// validated by the schema its `ce-dataschema` header names (and events by the union too), and each valid
// case turned into a CloudEvent by the CloudEvents SDK from its headers and body in binary mode.
//
//   node schema_validators.cjs PACKAGES_DIR SCHEMA_DIR CASES_JSON
//
// PACKAGES_DIR holds node_modules with ajv, ajv-formats and cloudevents. CASES_JSON is a list of
// {name, headers, body}. Prints one JSON object: the versions used and, per case, what each tool said.
const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");
const { isDeepStrictEqual } = require("node:util");

const [packagesDir, schemaDir, casesFile] = process.argv.slice(2);
const load = createRequire(path.join(path.resolve(packagesDir), "package.json"));
const Ajv2020 = load("ajv/dist/2020").default;
const addFormats = load("ajv-formats").default;
const { HTTP } = load("cloudevents");
const version = (name) => JSON.parse(fs.readFileSync(load.resolve(`${name}/package.json`), "utf8")).version;

function jsonFiles(dir) {
  return fs
    .readdirSync(dir, { withFileTypes: true })
    .flatMap((entry) => {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) return jsonFiles(full);
      return entry.name.endsWith(".json") ? [full] : [];
    })
    .sort();
}

function strictAjv() {
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  addFormats(ajv);
  return ajv;
}

// Each file on its own, in its own ajv: strict mode throws on an unknown keyword or format, and a file
// that is not self-contained fails to compile.
const validators = new Map();
const compiled = [];
for (const file of jsonFiles(schemaDir)) {
  const schema = JSON.parse(fs.readFileSync(file, "utf8"));
  validators.set(schema.$id, strictAjv().compile(schema));
  compiled.push(path.relative(schemaDir, file));
}
const UNION = "https://commonos.dev/schemas/events.schema.json";

function verdict(validate, body) {
  if (validate === undefined) return { ok: false, errors: ["no schema with that $id"] };
  const ok = validate(body);
  return { ok, errors: ok ? [] : validate.errors.map((e) => `${e.instancePath || "/"} ${e.message}`) };
}

// The NATS binding's binary mode: every `ce-<name>` header is the attribute <name>, percent-decoded once.
function decodedHeaders(headers) {
  const out = {};
  for (const [name, value] of Object.entries(headers)) {
    out[name.toLowerCase()] = name.toLowerCase().startsWith("ce-") ? decodeURIComponent(value) : value;
  }
  return out;
}

function cloudEvent(headers, body) {
  try {
    const event = HTTP.toEvent({ headers: decodedHeaders(headers), body: JSON.stringify(body) });
    if (Array.isArray(event)) return { ok: false, errors: ["a batch, not one event"] };
    event.validate();
    const problems = [];
    const expect = (what, got, want) => {
      if (!isDeepStrictEqual(got, want)) problems.push(`${what} is ${JSON.stringify(got)}, not ${JSON.stringify(want)}`);
    };
    expect("specversion", event.specversion, "1.0");
    expect("id", event.id, body.event_id);
    expect("type", event.type, `cos.${body.type}.v1`);
    expect("datacontenttype", event.datacontenttype, "application/json");
    expect("dataschema", event.dataschema, decodedHeaders(headers)["ce-dataschema"]);
    expect("time", new Date(event.time).getTime(), new Date(body.occurred_at).getTime());
    expect("data", event.data, body);
    return { ok: problems.length === 0, errors: problems, subject: event.subject, source: event.source };
  } catch (err) {
    return { ok: false, errors: [String(err && err.message ? err.message : err)] };
  }
}

const cases = JSON.parse(fs.readFileSync(casesFile, "utf8"));
const results = cases.map(({ name, headers, body }) => {
  const schemaId = decodedHeaders(headers)["ce-dataschema"];
  const result = { name, schema: schemaId, type: verdict(validators.get(schemaId), body) };
  if (typeof schemaId === "string" && schemaId.includes("/events/")) result.union = verdict(validators.get(UNION), body);
  result.cloudevent = cloudEvent(headers, body);
  return result;
});

process.stdout.write(
  JSON.stringify({
    versions: { node: process.versions.node, ajv: version("ajv"), "ajv-formats": version("ajv-formats"), cloudevents: version("cloudevents") },
    compiled,
    results,
  }),
);
