/** Structured JSON logs, one object a line. Lifecycle and failures only: never per request. */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(msg: string, fields?: object): void;
  info(msg: string, fields?: object): void;
  warn(msg: string, fields?: object): void;
  error(msg: string, fields?: object): void;
  child(component: string): Logger;
  /** Logs once per key; later calls only count. Returns how many times the key was seen. */
  once(key: string, level: LogLevel, msg: string, fields?: object): number;
}

export interface LoggerOptions {
  level: LogLevel;
  write?: (line: string) => void;
  component?: string;
  clock?: () => number;
}

export function createLogger(options: LoggerOptions): Logger {
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const clock = options.clock ?? Date.now;
  const seen = new Map<string, number>();
  const make = (component: string | undefined): Logger => {
    const log = (level: LogLevel, msg: string, fields?: object): void => {
      if (ORDER[level] < ORDER[options.level]) return;
      const entry: Record<string, unknown> = { time: new Date(clock()).toISOString(), level, msg };
      if (component) entry.component = component;
      if (fields) Object.assign(entry, serializeFields(fields));
      write(`${JSON.stringify(entry)}\n`);
    };
    return {
      debug: (m, f) => log('debug', m, f),
      info: (m, f) => log('info', m, f),
      warn: (m, f) => log('warn', m, f),
      error: (m, f) => log('error', m, f),
      child: (c) => make(component ? `${component}.${c}` : c),
      once: (key, level, msg, fields) => {
        const k = `${component ?? ''}:${key}`;
        const n = (seen.get(k) ?? 0) + 1;
        seen.set(k, n);
        if (n === 1) log(level, msg, fields);
        return n;
      },
    };
  };
  return make(options.component);
}

function serializeFields(fields: object): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(fields)) {
    out[k] = v instanceof Error ? { message: v.message, code: (v as NodeJS.ErrnoException).code } : v;
  }
  return out;
}

/**
 * Warnings by key, at most one line per key each `everyMs`; the next line of a key says how many
 * were held back meanwhile (`suppressed_since_last`).
 */
export class LimitedWarnings {
  private readonly last = new Map<string, { at: number; suppressed: number }>();

  constructor(
    private readonly log: Logger,
    private readonly everyMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  warn(key: string, msg: string, fields: object): void {
    const at = this.now();
    const last = this.last.get(key);
    if (last && at - last.at < this.everyMs) {
      last.suppressed++;
      return;
    }
    this.log.warn(msg, last?.suppressed ? { ...fields, suppressed_since_last: last.suppressed } : fields);
    this.last.set(key, { at, suppressed: 0 });
  }
}

/** A logger that drops everything (tests that do not look at logs). */
export const silentLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: () => {},
  child: () => silentLogger,
  once: () => 1,
};
