// A CommonOS event subscriber in TypeScript (nats.js 3): its own durable pull consumer on COS_EVENTS, printing
// every event it reads, the same as subscriber.py (same options, same output, same exit statuses).
//
//   npm ci && npm run types                         # events.d.ts from proto/schema (gen-types.mjs)
//   eval "$(cos env --user subscriber)"             # COS_NATS_URL, COS_NATS_USER, COS_NATS_PASSWORD
//   npx tsx subscriber.ts --durable my-service --filter 'cos.events.*.*.turn_finished' --idle-exit 5
//
// One line per event: `<stream seq> <ce-type> <subject> <event id>`, acknowledged after it is printed.
// deploy/SUBSCRIBERS.md explains the contract.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import {
  AckPolicy,
  DeliverPolicy,
  jetstream,
  jetstreamManager,
  type ConsumerConfig,
  type ConsumerInfo,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import type { CosEvent } from "./events.js";

const STREAM = "COS_EVENTS";
const CONNECT_TIMEOUT_MS = 10_000;

class Refused extends Error {}

/** An instant: RFC 3339 (`2026-12-01T10:00:00Z`) or a duration ago (`90s`, `15m`, `2h`, `7d`). */
function moment(text: string): Date {
  const ago = /^(\d+(?:\.\d+)?)([smhd])$/.exec(text.trim());
  if (ago) {
    const unit = { s: 1, m: 60, h: 3600, d: 86400 }[ago[2] as "s" | "m" | "h" | "d"];
    return new Date(Date.now() - Number(ago[1]) * unit * 1000);
  }
  if (!/(Z|[+-]\d\d:?\d\d)$/i.test(text.trim())) throw new Refused(`${text} has no time zone (end it with Z for UTC)`);
  const value = new Date(text);
  if (Number.isNaN(value.getTime())) throw new Refused(`${text} is neither RFC 3339 nor a duration such as 15m`);
  return value;
}

/** Seconds: `30`, `30s`, `15m`, `2h`, `7d`. */
function seconds(text: string): number {
  const match = /^(\d+(?:\.\d+)?)([smhd]?)$/.exec(text.trim());
  if (!match || Number(match[1]) <= 0) throw new Refused(`${text} is not a duration such as 30s, 15m or 7d`);
  return Number(match[1]) * ({ "": 1, s: 1, m: 60, h: 3600, d: 86400 }[match[2] as "" | "s" | "m" | "h" | "d"]);
}

const { values: opts } = parseArgs({
  options: {
    server: { type: "string", default: process.env.COS_NATS_URL ?? "nats://127.0.0.1:4222" },
    user: { type: "string", default: process.env.COS_NATS_USER ?? "" },
    password: { type: "string" },
    durable: { type: "string", default: "example-subscriber" },
    filter: { type: "string", default: "cos.events.>" },
    "from-seq": { type: "string" },
    "from-time": { type: "string" },
    new: { type: "boolean", default: false },
    reset: { type: "boolean", default: false },
    "ack-wait": { type: "string", default: "30s" },
    "inactive-threshold": { type: "string", default: "7d" },
    "occurred-after": { type: "string" },
    max: { type: "string" },
    "idle-exit": { type: "string" },
    headers: { type: "boolean", default: false },
    info: { type: "boolean", default: false },
  },
});

function password(): string {
  if (opts.password !== undefined) return opts.password;
  if (process.env.COS_NATS_PASSWORD) return process.env.COS_NATS_PASSWORD;
  const file = process.env.COS_NATS_PASSWORD_FILE;
  return file ? readFileSync(file, "utf8").trim() : "";
}

/** Connect, or fail fast with one line: bad credentials at once, an unreachable server after 10 s. */
async function open(): Promise<NatsConnection> {
  const user = opts.user ?? "";
  try {
    return await connect({
      servers: (opts.server ?? "").split(",").map((s) => s.trim()),
      name: opts.durable,
      ...(user ? { user, pass: password() } : {}),
      // Replies come to an inbox only this user may read (deploy/nats/auth.conf: `_INBOX_<user>.>`).
      inboxPrefix: user ? `_INBOX_${user}` : "_INBOX",
      timeout: CONNECT_TIMEOUT_MS,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 1000,
    });
  } catch (err) {
    const text = String(err);
    if (/authori[sz]ation/i.test(text)) throw new Refused("authorization violation: check COS_NATS_USER/COS_NATS_PASSWORD");
    throw new Refused(`cannot reach NATS at ${opts.server}: ${text} (check COS_NATS_URL)`);
  }
}

function wantedConfig(): Partial<ConsumerConfig> {
  const config: Partial<ConsumerConfig> = {
    durable_name: opts.durable,
    filter_subject: opts.filter,
    deliver_policy: DeliverPolicy.All,
    ack_policy: AckPolicy.Explicit,
    ack_wait: seconds(opts["ack-wait"] ?? "30s") * 1e9, // nanoseconds
    // One event in flight: an event a crashed run held comes back (after ack_wait) before any later one,
    // so each session's events arrive in stream order, across restarts too (deploy/SUBSCRIBERS.md).
    max_ack_pending: 1,
    // Removed by the server after this long without a reader: no consumer is left behind forever.
    inactive_threshold: seconds(opts["inactive-threshold"] ?? "7d") * 1e9,
  };
  if (opts["from-seq"] !== undefined) {
    config.deliver_policy = DeliverPolicy.StartSequence;
    config.opt_start_seq = Number(opts["from-seq"]);
  } else if (opts["from-time"] !== undefined) {
    config.deliver_policy = DeliverPolicy.StartTime;
    config.opt_start_time = moment(opts["from-time"]).toISOString();
  } else if (opts.new) {
    config.deliver_policy = DeliverPolicy.New;
  }
  return config;
}

function startOf(config: Partial<ConsumerConfig>): string {
  switch (config.deliver_policy) {
    case DeliverPolicy.StartSequence:
      return `--from-seq ${config.opt_start_seq}`;
    case DeliverPolicy.StartTime:
      return `--from-time ${new Date(config.opt_start_time ?? 0).toISOString().replace(".000Z", "Z")}`;
    case DeliverPolicy.New:
      return "--new";
    default:
      return "from the first event";
  }
}

async function request(nc: NatsConnection, subject: string, body: object): Promise<Record<string, any>> {
  const reply = await nc.request(subject, JSON.stringify(body), { timeout: 5000 });
  return reply.json<Record<string, any>>();
}

async function info(jsm: JetStreamManager): Promise<ConsumerInfo | null> {
  try {
    return await jsm.consumers.info(STREAM, opts.durable ?? "");
  } catch (err) {
    if (/consumer not found/i.test(String(err))) return null;
    throw err;
  }
}

/** Create the durable consumer, or find it as it was; never change its filter or start silently. */
async function ensureConsumer(nc: NatsConnection): Promise<void> {
  const jsm = await jetstreamManager(nc);
  const wanted = wantedConfig();
  const existing = await info(jsm);
  if (existing === null) {
    await jsm.consumers.add(STREAM, wanted);
    return;
  }
  const have = existing.config;
  const haveFilter = have.filter_subject ?? (have.filter_subjects ?? []).join(", ") ?? ">";
  const startAsked = opts["from-seq"] !== undefined || opts["from-time"] !== undefined || opts.new;
  const sameFilter = haveFilter === opts.filter;
  const sameStart = !startAsked || startOf(have) === startOf(wanted);
  if (sameFilter && sameStart && !opts.reset) {
    // Goes on after its last acknowledged event, with this recipe's order and expiry (editable settings).
    const kept = {
      ack_wait: wanted.ack_wait,
      max_ack_pending: wanted.max_ack_pending,
      inactive_threshold: wanted.inactive_threshold,
    };
    if (Object.entries(kept).some(([key, value]) => have[key as keyof typeof kept] !== value)) {
      await jsm.consumers.update(STREAM, opts.durable ?? "", kept);
    }
    return;
  }
  if (!opts.reset) {
    const differs = sameFilter ? `started ${startOf(have)}` : `reads '${haveFilter}'`;
    throw new Refused(
      `consumer '${opts.durable}' exists and ${differs}, at stream sequence ${existing.delivered.stream_seq} ` +
        `(this run asked for '${opts.filter}', ${startOf(wanted)}): keep its position with --filter '${haveFilter}', ` +
        "give this reader another --durable name, or start this one over with --reset",
    );
  }
  // --reset: the position back to where this run starts, then the new filter (an editable setting). The
  // reset comes first: on a server without it (before nats-server 2.14) nothing has changed.
  let seq = 1;
  if (wanted.deliver_policy === DeliverPolicy.StartSequence) seq = wanted.opt_start_seq ?? 1;
  else if (wanted.deliver_policy === DeliverPolicy.New) seq = (await jsm.streams.info(STREAM)).state.last_seq + 1;
  else if (wanted.deliver_policy === DeliverPolicy.StartTime) {
    const found = await request(nc, `$JS.API.STREAM.MSG.GET.${STREAM}`, { start_time: wanted.opt_start_time });
    seq = found.message ? Number(found.message.seq) : (await jsm.streams.info(STREAM)).state.last_seq + 1;
  }
  let answer: Record<string, any>;
  try {
    answer = await request(nc, `$JS.API.CONSUMER.RESET.${STREAM}.${opts.durable}`, { seq });
  } catch {
    throw new Refused(
      `this NATS server cannot reset consumer '${opts.durable}' ($JS.API.CONSUMER.RESET needs nats-server 2.14 or ` +
        "newer): give this reader another --durable name, or ask an admin to delete the consumer",
    );
  }
  if (answer.error) throw new Refused(`could not reset consumer '${opts.durable}': ${answer.error.description}`);
  if (!sameFilter) await jsm.consumers.update(STREAM, opts.durable ?? "", { filter_subject: opts.filter });
}

function describe(msg: JsMsg, event: CosEvent | null): string {
  const ceType = decodeURIComponent(msg.headers?.get("ce-type") || "?");
  let line = `${msg.seq} ${ceType} ${msg.subject} ${event?.event_id ?? "(not an event)"}`;
  if (opts.headers && msg.headers) {
    const names = [...msg.headers.keys()].sort();
    for (const name of names) line += `\n  ${name}: ${decodeURIComponent(msg.headers.get(name))}`;
  }
  return line;
}

function decode(msg: JsMsg): CosEvent | null {
  try {
    const event = msg.json<CosEvent>();
    return typeof event === "object" && event !== null && typeof event.type === "string" ? event : null;
  } catch {
    return null;
  }
}

/** The stream's state and limits: how far back a replay can go, and the largest event. */
async function showInfo(nc: NatsConnection): Promise<void> {
  const { config, state } = await (await jetstreamManager(nc)).streams.info(STREAM);
  const maxAge = config.max_age ? `${Math.round(config.max_age / 1e9)}s` : "unbounded";
  const maxBytes = config.max_bytes > 0 ? `${config.max_bytes} bytes` : "unbounded";
  const first = state.messages ? `${state.first_seq}` : "none";
  console.log(`stream ${STREAM}: ${state.messages} events, first sequence ${first}, last sequence ${state.last_seq}`);
  console.log(`retention: max_age ${maxAge}, max_bytes ${maxBytes}`);
  console.log(`largest event (headers and body): ${nc.info?.max_payload} bytes`);
}

async function main(): Promise<number> {
  let stopping = false;
  let wake: (() => void) | null = null;
  const stop = () => {
    stopping = true;
    wake?.();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  const nc = await open();
  try {
    if (opts.info) {
      await showInfo(nc);
      return 0;
    }
    await ensureConsumer(nc);
    const consumer = await jetstream(nc).consumers.get(STREAM, opts.durable ?? "");
    const max = opts.max === undefined ? Infinity : Number(opts.max);
    const idleMs = opts["idle-exit"] === undefined ? Infinity : Number(opts["idle-exit"]) * 1000;
    const after = opts["occurred-after"] === undefined ? null : moment(opts["occurred-after"]);
    let seen = 0;
    let lastEvent = Date.now();
    while (!stopping && seen < max && Date.now() - lastEvent < idleMs) {
      // One at a time: the consumer has at most one event in flight (max_ack_pending=1).
      const batch = await consumer.fetch({ max_messages: 1, expires: 1000 });
      wake = () => batch.stop(); // SIGTERM during the wait: leave at once (nothing was handed to us)
      for await (const msg of batch) {
        const event = decode(msg);
        const occurred = event?.occurred_at ? new Date(event.occurred_at) : null;
        if (after === null || (occurred !== null && occurred >= after)) {
          console.log(describe(msg, event));
          seen += 1;
        }
        msg.ack(); // after the event is handled: a crash before it means it comes again
        lastEvent = Date.now();
      }
      wake = null;
    }
    return 0;
  } finally {
    // close, not drain: every event handed to us is acknowledged (the flush sends the last acks).
    await nc.flush().catch(() => undefined);
    await nc.close();
  }
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`error: ${err instanceof Refused ? err.message : String(err)}`);
    process.exit(1);
  },
);
