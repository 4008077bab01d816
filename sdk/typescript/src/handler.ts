/**
 * Handlers declared with their schemas: zod types give the input and output JSON
 * Schemas the registry checks (draft 2020-12, through zod's own `toJSONSchema`), and
 * validate what arrives and what the handler answers.
 */

import { z } from "zod";

import { HandlerDefinitionError } from "./errors.js";
import type { Ctx } from "./ctx.js";

const CAPABILITY = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/;
const SEMVER = /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-.]+)?(\+[0-9A-Za-z-.]+)?$/;

export type JsonSchema = Record<string, unknown> | boolean;

interface Common<I extends z.ZodType> {
  /** Lowercase dotted name, e.g. `order.query`. */
  capability: string;
  /** Semver; default `1.0.0`. */
  version?: string;
  description?: string;
  /** The capability's default deadline when a caller gives none. */
  timeoutMs?: number;
  /**
   * Its task deliveries may be paused for higher-priority work (DESIGN §9): the handler
   * looks at `ctx.pauseRequested` at its checkpoints and throws `new Paused(checkpoint)`;
   * the resumed delivery carries it as `ctx.checkpoint`.
   */
  preemptible?: boolean;
  /** The payload's type; its JSON Schema is registered as the input schema. */
  input: I;
}

/** A handler answering once: `output` types what it returns. */
export interface HandlerSpec<I extends z.ZodType, O extends z.ZodType> extends Common<I> {
  output: O;
}

/** A streaming handler (an async generator): `item` types each item it yields. */
export interface StreamingSpec<I extends z.ZodType, T extends z.ZodType> extends Common<I> {
  item: T;
}

export type HandlerFunction<I extends z.ZodType, O extends z.ZodType> = (
  input: z.output<I>,
  ctx: Ctx,
) => Promise<z.input<O>> | z.input<O>;

export type StreamingFunction<I extends z.ZodType, T extends z.ZodType> = (
  input: z.output<I>,
  ctx: Ctx,
) => AsyncIterable<z.input<T>>;

/** A capability descriptor as registered (DESIGN §2.1). */
export interface Descriptor {
  name: string;
  version: string;
  description?: string;
  input_schema: JsonSchema;
  output_schema: JsonSchema;
  timeout_ms?: number;
  preemptible?: boolean;
}

/** One declared handler, as the server runs it. */
export interface Handler {
  readonly descriptor: Descriptor;
  readonly input: z.ZodType;
  /** The answer's type (for a streaming handler: the array of its items). */
  readonly output: z.ZodType;
  /** Set for a streaming handler: the type of one item. */
  readonly item: z.ZodType | undefined;
  readonly run: (input: unknown, ctx: Ctx) => unknown;
  /** Whether `run` declares a `ctx` parameter (one that takes only the input is given none: a Ctx per delivery costs). */
  readonly wantsCtx: boolean;
  readonly stream: ((input: unknown, ctx: Ctx) => AsyncIterable<unknown>) | undefined;
}

function schemaOf(capability: string, type: z.ZodType, io: "input" | "output"): JsonSchema {
  try {
    return z.toJSONSchema(type, { io, unrepresentable: "throw" });
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    throw new HandlerDefinitionError(capability, `its ${io} type has no JSON Schema: ${why}`);
  }
}

function checked<I extends z.ZodType>(spec: Common<I>): { version: string } {
  const version = spec.version ?? "1.0.0";
  if (!CAPABILITY.test(spec.capability)) {
    throw new HandlerDefinitionError(spec.capability, "the capability name must be lowercase dotted (`order.query`)");
  }
  if (!SEMVER.test(version)) throw new HandlerDefinitionError(spec.capability, `version \`${version}\` is not semver`);
  if (spec.timeoutMs !== undefined && !(Number.isInteger(spec.timeoutMs) && spec.timeoutMs >= 1 && spec.timeoutMs <= 3_600_000)) {
    throw new HandlerDefinitionError(spec.capability, "timeoutMs must be a whole number of ms in 1..=3600000");
  }
  return { version };
}

function descriptor<I extends z.ZodType>(spec: Common<I>, version: string, output: JsonSchema): Descriptor {
  const described: Descriptor = {
    name: spec.capability,
    version,
    input_schema: schemaOf(spec.capability, spec.input, "input"),
    output_schema: output,
  };
  if (spec.description !== undefined) described.description = spec.description;
  if (spec.timeoutMs !== undefined) described.timeout_ms = spec.timeoutMs;
  if (spec.preemptible === true) described.preemptible = true;
  return described;
}

export function defineHandler<I extends z.ZodType, O extends z.ZodType>(
  spec: HandlerSpec<I, O>,
  fn: HandlerFunction<I, O>,
): Handler {
  const { version } = checked(spec);
  return {
    descriptor: descriptor(spec, version, schemaOf(spec.capability, spec.output, "output")),
    input: spec.input,
    output: spec.output,
    item: undefined,
    run: fn as (input: unknown, ctx: Ctx) => unknown,
    // `length` counts the parameters before any default or rest one: 1 is the input alone.
    wantsCtx: fn.length !== 1,
    stream: undefined,
  };
}

export function defineStreaming<I extends z.ZodType, T extends z.ZodType>(
  spec: StreamingSpec<I, T>,
  fn: StreamingFunction<I, T>,
): Handler {
  const { version } = checked(spec);
  const items = z.array(spec.item);
  const stream = fn as (input: unknown, ctx: Ctx) => AsyncIterable<unknown>;
  return {
    // The registered output is the array of items: what a caller that did not ask for events gets.
    descriptor: descriptor(spec, version, schemaOf(spec.capability, items, "output")),
    input: spec.input,
    output: items,
    item: spec.item,
    run: async (input, ctx) => {
      const collected: unknown[] = [];
      for await (const item of stream(input, ctx)) collected.push(item);
      return collected;
    },
    wantsCtx: true,
    stream,
  };
}

/** `{pointer, message}` for each problem zod found (the router's SCHEMA_MISMATCH shape). */
export function problems(error: z.ZodError): { pointer: string; message: string }[] {
  return error.issues.slice(0, 20).map((issue) => ({
    pointer: issue.path.map((part) => `/${String(part).replaceAll("~", "~0").replaceAll("/", "~1")}`).join(""),
    message: issue.message,
  }));
}
