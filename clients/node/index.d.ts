// Types of pg-idempotency (hand-written; checked by `tsc --noEmit -p test/types` in test.sh).
import type { Pool, PoolClient, Client } from 'pg';

export type Queryable = Pool | PoolClient | Client;
/** Milliseconds, or PostgreSQL interval text such as '30 seconds'. */
export type IntervalInput = number | string;

export declare const Outcome: {
  readonly CLAIMED: 'claimed';
  readonly RECLAIMED: 'reclaimed';
  readonly REPLAY: 'replay';
  readonly IN_PROGRESS: 'in_progress';
  readonly MISMATCH: 'mismatch';
  readonly EXPIRED: 'expired';
};
export type Outcome = (typeof Outcome)[keyof typeof Outcome];

export interface ClaimOptions {
  fingerprint?: string | null;
  ttl?: IntervalInput;
  lease?: IntervalInput;
  /** Used when the extension has it (release 0.4.0), otherwise the claim answers at once. */
  wait?: IntervalInput;
  /** Used when the extension has it (release 0.4.0); always read the result's token. */
  token?: string;
  /**
   * Used when the extension has it (release 0.6.0): for a claim completed in the same transaction,
   * a free key's record is written once, by idem_complete (or its in_progress record at COMMIT).
   */
  deferred?: boolean;
}

export interface ClaimResult {
  outcome: Outcome;
  token: string | null;
  httpStatus: number | null;
  responseStatus: number | null;
  responseHeaders: Record<string, string> | null;
  responseBody: unknown;
  /** The stored body as jsonb prints it: what a replay sends, byte for byte. */
  responseBodyText: string | null;
  recoveryPoint: string | null;
  recoveryData: unknown;
  attempts: number | null;
  expiresAt: Date | null;
  lockedUntil: Date | null;
  /** in_progress only: whole seconds until the owner's lease ends (at least 1). */
  retryAfterSeconds: number | null;
}

export interface KeyRecord {
  scope: string;
  key: string;
  fingerprint: string | null;
  status: 'in_progress' | 'completed';
  token: string;
  attempts: number;
  lockedUntil: Date | null;
  recoveryPoint: string | null;
  recoveryData: unknown;
  responseStatus: number | null;
  responseHeaders: Record<string, string> | null;
  responseBody: unknown;
  responseBodyText: string | null;
  createdAt: Date;
  updatedAt: Date;
  completedAt: Date | null;
  expiresAt: Date;
}

export interface Features {
  wait: boolean;
  token: boolean;
  deferred: boolean;
  seenMany: boolean;
}

export declare class IdempotencyClient {
  constructor(db: Queryable);
  readonly db: Queryable;
  /** The same client running its statements on `db` (e.g. a pool client inside BEGIN). */
  on(db: Queryable): IdempotencyClient;
  features(): Promise<Features>;
  claim(scope: string, key: string, options?: ClaimOptions): Promise<ClaimResult>;
  /** Resolves to the stored body as jsonb prints it, or null. */
  complete(scope: string, key: string, token: string, status: number,
    options?: { body?: unknown; bodyJson?: string | null; headers?: Record<string, string> | null }): Promise<string | null>;
  /** BEGIN and the claim in one round trip on a connection of its own; the transaction is left open. */
  beginAndClaim(scope: string, key: string,
    options?: { fingerprint?: string | null; ttl?: IntervalInput; deferred?: boolean }): Promise<ClaimResult>;
  /** idem_complete and COMMIT in one round trip; COMMIT is not run when the completion fails. */
  completeAndCommit(scope: string, key: string, token: string, status: number,
    options?: { bodyJson?: string | null; headers?: Record<string, string> | null }): Promise<string | null>;
  checkpoint(scope: string, key: string, token: string, recoveryPoint: string,
    options?: { data?: unknown; lease?: IntervalInput }): Promise<Date>;
  release(scope: string, key: string, token: string): Promise<boolean>;
  lookup(scope: string, key: string): Promise<KeyRecord | null>;
  seen(scope: string, messageId: string, options?: { ttl?: IntervalInput }): Promise<boolean>;
  /** Throws UnsupportedFeatureError when the extension has no idem_seen_many. */
  seenMany(scope: string, messageIds: string[], options?: { ttl?: IntervalInput }): Promise<boolean[]>;
  fingerprint(value: unknown, ignore?: string[] | null): Promise<string>;
}

export declare class IdempotencyError extends Error {
  /** The SQLSTATE, or null for errors raised by the client itself. */
  code: string | null;
  detail?: string;
  hint?: string;
}
export declare class NullArgumentError extends IdempotencyError {}
export declare class InvalidArgumentError extends IdempotencyError {}
export declare class NoLiveRecordError extends IdempotencyError {}
export declare class ClaimTakenOverError extends IdempotencyError {}
export declare class AlreadyCompletedError extends IdempotencyError {}
export declare class ResponseTooLargeError extends IdempotencyError {}
export declare class ReadOnlyError extends IdempotencyError {}
export declare class SerializationError extends IdempotencyError {}
export declare class LockTimeoutError extends IdempotencyError {}
export declare class PermissionDeniedError extends IdempotencyError {}
export declare class UnsupportedFeatureError extends IdempotencyError {}
/** No pool connection within the middleware's connectionTimeout, or the pool could not open one (`cause`). */
export declare class NoConnectionError extends Error {
  constructor(message: string, cause?: unknown);
}
/** Whether the error is the server's own error answer (it has a severity), not the connection's. */
export declare function isServerError(e: unknown): boolean;
/** The typed error for a node-postgres error, or the error itself. */
export declare function mapError(e: unknown): unknown;
/** Whether a node-postgres / pg-pool error means the database is unavailable (refused, reset, pool timeout, shutting down). */
export declare function isUnavailable(e: unknown): boolean;
/** SQLSTATE -> the error class `mapError` makes for it. */
export declare const BY_SQLSTATE: Readonly<Record<string, new (message: string, o?: { code?: string | null; cause?: unknown }) => IdempotencyError>>;

export declare function fingerprint(value: unknown, ignore?: string[]): string;
export declare const MAX_KEY_LENGTH: 255;
export declare function parseIdempotencyKey(values: string[]): { key: string } | { error: string };
export declare function fieldLines(rawHeaders: string[], name?: string): string[];
export declare function intervalText(v: IntervalInput | null | undefined): string | null;

export interface RefusedArguments {
  status: number;
  /** Default: the status's reason phrase. */
  title?: string;
  detail?: string;
  /** Default: about:blank. */
  type?: string;
  headers?: Record<string, string>;
}
/** A refusal, thrown to answer with a problem (RFC 9457); never stored. The same argument names as the Python package's Refused. */
export declare class Refused extends Error {
  constructor(args: RefusedArguments);
  /** The older positional form. */
  constructor(status: number, title: string, options?: { detail?: string; type?: string; headers?: Record<string, string> });
  status: number;
  title: string;
  detail?: string;
  type: string;
  headers: Record<string, string>;
  toResponse(): HandlerResponse & { body: string };
}

/** The contract's problem answer `slug` (e.g. 'service-unavailable'), with Retry-After where it has one. */
export declare function contractProblem(slug: string, retryAfterSeconds?: number): Refused;

/** The name this package first gave Refused (the same class). */
export declare const HttpProblem: typeof Refused;
export type HttpProblem = Refused;

export declare const Mode: {
  readonly SAME_TRANSACTION: 'same-transaction';
  readonly COMMITTED_FIRST: 'committed-first';
};
export type Mode = (typeof Mode)[keyof typeof Mode];

export interface HandlerResponse {
  status?: number;
  headers?: Record<string, string>;
  /** An object/array/number is sent (and stored) as JSON; a string or Buffer as text. */
  body?: unknown;
}

interface ContextBase {
  scope: string;
  key: string | null;
  token: string | null;
  outcome: 'claimed' | 'reclaimed' | null;
  attempts: number;
  recoveryPoint: string | null;
  recoveryData: unknown;
}
export interface SameTransactionContext extends ContextBase {
  mode: 'same-transaction';
  /** The connection inside the open transaction that holds the claim. */
  db: PoolClient;
  idem: IdempotencyClient;
}
export interface CommittedFirstContext extends ContextBase {
  mode: 'committed-first';
  db: Pool;
  idem: IdempotencyClient;
  /** Aborted when the claim is lost (taken over) while the handler runs. */
  signal: AbortSignal;
  /** From now on a failure is stored (idem_complete), not released. */
  sideEffectStarted(): void;
  /** idem_checkpoint (on `db`, e.g. inside the side effect's transaction); marks side effects started. */
  checkpoint(point: string, data?: unknown, options?: { db?: Queryable }): Promise<Date>;
}
export type HandlerContext = SameTransactionContext | CommittedFirstContext;
export type Handler<Req> = (req: Req, ctx: any) => Promise<HandlerResponse> | HandlerResponse;

export interface RouteOptions<Req = any> {
  mode?: Mode;
  /** Default: none. May throw a Refused (e.g. 401) before the key is looked at. */
  tenant?: (req: Req) => string | undefined | Promise<string | undefined>;
  /** Default: `${tenant}:${method} ${route}` (or `${method} ${route}` without a tenant). */
  scope?: (p: { tenant: string | undefined; method: string; route: string; req: Req }) => string | Promise<string>;
  /** Top-level body fields left out of the fingerprint. */
  ignore?: string[];
  /** Default true: a missing Idempotency-Key is a 400. */
  required?: boolean;
  ttl?: IntervalInput;
  /** Committed-first lease in milliseconds (default 30000), renewed every third of it. */
  lease?: number;
  wait?: IntervalInput;
  /** Default ['Location', 'Content-Type']; Content-Type is always stored. */
  replayHeaders?: string[];
  /** Default false: a 5xx answer releases the key (unless side effects started). */
  storeServerErrors?: boolean;
  /** Default REFUSED_STATUSES: answers with these statuses release the key, never stored. */
  refusedStatuses?: readonly number[];
  logger?: { warn(...a: unknown[]): void; error(...a: unknown[]): void };
}

export interface IdempotencyOptions extends RouteOptions {
  /** The application's pool. Without an 'error' listener of its own, the middleware adds one that logs. */
  pool: Pool;
  /** Milliseconds the middleware waits for a pool connection (default 1000), whatever the pool's own timeout: then 503. */
  connectionTimeout?: number;
}

export interface ExecuteInput {
  method: string;
  route: string;
  keyValues: string[];
  body: unknown;
}
export interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
  replayed: boolean;
}

export declare class Idempotency {
  constructor(options: IdempotencyOptions);
  pool: Pool;
  connectionTimeout: number;
  client: IdempotencyClient;
  execute<Req>(routeOptions: RouteOptions<Req>, handler: Handler<Req>, req: Req, input: ExecuteInput): Promise<Answer>;
}

type ExpressHandler = (req: import('express').Request, res: import('express').Response,
  next: import('express').NextFunction) => Promise<void>;
type FastifyHandler = (request: import('fastify').FastifyRequest, reply: import('fastify').FastifyReply) => Promise<unknown>;

export interface IdempotencyApp extends Idempotency {
  express(routeOptions: RouteOptions<import('express').Request> & { mode: 'same-transaction' },
    handler: (req: import('express').Request, ctx: SameTransactionContext) => Promise<HandlerResponse> | HandlerResponse): ExpressHandler;
  express(routeOptions: RouteOptions<import('express').Request> & { mode: 'committed-first' },
    handler: (req: import('express').Request, ctx: CommittedFirstContext) => Promise<HandlerResponse> | HandlerResponse): ExpressHandler;
  express(routeOptions: RouteOptions<import('express').Request>,
    handler: (req: import('express').Request, ctx: HandlerContext) => Promise<HandlerResponse> | HandlerResponse): ExpressHandler;
  fastify(routeOptions: RouteOptions<import('fastify').FastifyRequest> & { mode: 'same-transaction' },
    handler: (req: import('fastify').FastifyRequest, ctx: SameTransactionContext) => Promise<HandlerResponse> | HandlerResponse): FastifyHandler;
  fastify(routeOptions: RouteOptions<import('fastify').FastifyRequest> & { mode: 'committed-first' },
    handler: (req: import('fastify').FastifyRequest, ctx: CommittedFirstContext) => Promise<HandlerResponse> | HandlerResponse): FastifyHandler;
  fastify(routeOptions: RouteOptions<import('fastify').FastifyRequest>,
    handler: (req: import('fastify').FastifyRequest, ctx: HandlerContext) => Promise<HandlerResponse> | HandlerResponse): FastifyHandler;
}

export interface NativeOptions<Req> extends RouteOptions<Req> {
  /** Default DEFAULT_METHODS (POST, PATCH): the requests that need a key; others pass through. */
  methods?: readonly string[];
}
export interface FastifyRouteConfig {
  /** A route's own options for the plugin, or false to leave it out. */
  idempotency?: RouteOptions<import('fastify').FastifyRequest> | false;
}

export interface IdempotencyApp {
  /** Express middleware (app.use or per route) before ordinary handlers; they find the context in req.idempotency. */
  middleware(options?: NativeOptions<import('express').Request>): import('express').RequestHandler;
  /** Fastify's plugin: app.register(idem.fastifyPlugin, options); handlers find the context in request.idempotency. */
  fastifyPlugin: import('fastify').FastifyPluginAsync<NativeOptions<import('fastify').FastifyRequest>>;
}

export declare function createIdempotency(options: IdempotencyOptions): IdempotencyApp;
export declare const REFUSED_STATUSES: readonly number[];
export declare const DEFAULT_METHODS: readonly string[];
/** An Express error handler: a Refused as its problem+json, the database unavailable as 503; anything else goes on. */
export declare function expressProblemHandler(): import('express').ErrorRequestHandler;

declare module 'express-serve-static-core' {
  interface Request {
    /** Set by idem.middleware() on the requests it protects. */
    idempotency?: HandlerContext;
  }
}
declare module 'fastify' {
  interface FastifyRequest {
    /** Set by idem.fastifyPlugin on the requests it protects (null elsewhere). */
    idempotency: HandlerContext | null;
  }
}

// --- the sending side (src/sender.js, docs/sending.md) ------------------------------------

export declare const SEND_CHANNEL: 'idempotency_send';
export declare function keyHeader(key: string): string;
export declare function parseRetryAfter(value: string | null | undefined, now?: number): number | null;
/** A longer Retry-After is read as this (1000 years). */
export declare const MAX_RETRY_AFTER_MS: number;

export interface Delivered { kind: 'delivered'; status: number; headers: Record<string, string>; body: string | null }
export interface NotYet {
  kind: 'not_yet'; state: 'pending' | 'sending'; attempts: number; nextAttemptAt: Date;
  lastStatus: number | null; lastError: string | null;
}
export interface Unknown { kind: 'unknown'; key: string; attempts: number; lastStatus: number | null; lastError: string | null }
export interface Lost { kind: 'lost'; scope: string; operation: string }
export type SendResult = Delivered | NotYet | Unknown | Lost;

export interface Prepared {
  key: string; state: 'pending' | 'sending' | 'done' | 'gave_up'; attempts: number; nextAttemptAt: Date;
  response: Delivered | null;
}
export declare function prepare(client: Queryable, scope: string, operation: string, target: string, request?: unknown,
  options?: { key?: string | null; giveUpAfter?: number | string | null }): Promise<Prepared>;

export interface Attempt {
  scope: string; operation: string; target: string; key: string; request: unknown; attempt: number; token: string;
  lockedUntil: Date; giveUpAt: Date;
}
/** What one attempt got: `status` null means no answer (`error` says why). */
export interface SendAnswer { status: number | null; headers?: Record<string, string>; body?: string | null; error?: string | null }
export interface SenderOptions {
  urls?: Record<string, string>;
  /** Your own send: `signal` aborts when timeoutMs has passed (the attempt is then recorded as no answer). */
  send?: (attempt: Attempt, signal: AbortSignal) => Promise<SendAnswer>;
  headers?: Record<string, Record<string, string>>;
  /** Bounds one attempt in total (connect, send, the whole answer); below leaseMs, or the constructor throws a RangeError. */
  timeoutMs?: number; leaseMs?: number; concurrency?: number; pollIntervalMs?: number;
  /** This sender's idempotency.send_retry_budget (0 to 1,000,000); the database's when not given. */
  retryBudget?: number | null;
  /** This sender's idempotency.send_backoff_base / _cap, in milliseconds; the database's when not given. */
  backoffBaseMs?: number | null; backoffCapMs?: number | null;
  /** Given to idem_send by sender.prepare when the call gives no giveUpAfter; the database's when not given. */
  giveUpAfterMs?: number | null;
  /** The worker's waits between reconnections: full jitter up to min(cap, base * 2^(n-1)). */
  reconnectBaseMs?: number; reconnectCapMs?: number;
  logger?: { info: (message: string) => void; warn: (message: string) => void };
  onAttempt?: (attempt: Attempt, answer: SendAnswer) => void;
  onFinished?: (attempt: Attempt, result: SendResult) => void;
  /** A database error the worker met: `code` is the SQLSTATE, else the error's class; `message` its first line. */
  onDbError?: (error: Error, info: { code: string; message: string; delayMs: number }) => void;
  onDbReconnected?: () => void;
}
export declare class Sender {
  constructor(pool: import('pg').Pool, options: SenderOptions);
  /** `prepare`, with this sender's giveUpAfterMs when the call gives none. */
  prepare(client: Queryable, scope: string, operation: string, target: string, request?: unknown,
    options?: { key?: string | null; giveUpAfter?: number | string | null }): Promise<Prepared>;
  deliver(scope: string, operation: string): Promise<SendResult>;
  status(scope: string, operation: string): Promise<SendResult>;
  attempt(attempt: Attempt): Promise<SendResult>;
  runOnce(target?: string | null): Promise<number>;
  idle(target?: string | null): Promise<boolean>;
  /** The worker: only `signal` (or untilIdle) ends it; database errors are logged and outlived. */
  run(target?: string | null, options?: { signal?: AbortSignal | null; untilIdle?: boolean }): Promise<void>;
  /** Closes the HTTP connections the sender keeps (not the pool). */
  close(): void;
}
