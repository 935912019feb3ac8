import { Counter, Histogram, type CounterConfiguration, type HistogramConfiguration, type LabelValues } from 'prom-client';

/*
 * prom-client's counter and histogram, with the per-call work of an update cut down: the sidecar
 * counts and times every proxied call several times over, and prom-client builds and checks a
 * hash of the labels on each update (and a histogram converts its bucket's bound to a property
 * name). Here a label set's series is found once, through prom-client itself, and kept; later
 * updates add to it in place. Everything else (the `/metrics` text, `get`, `reset`, `remove`) is
 * prom-client's, reading the same series. A property test holds both to prom-client's own output.
 *
 * Labels are read in the metric's declared label order: a label not declared is not checked here
 * (the types refuse it; prom-client would throw).
 */

type Labels = Partial<Record<string, string | number>>;
interface Series {
  labels: Labels;
  value?: number;
  sum?: number;
  count?: number;
  bucketValues?: Record<string, number>;
}
/** prom-client's own series table (not in its types): hash of the labels to series. */
interface Internals {
  hashMap: Record<string, Series>;
}
interface Kept {
  hash: string;
  series: Series;
}

const SEP = '\u0001';

/** prom-client's own updates (not in its types: its constructors bind `inc` and `observe` to them). */
type Update = (this: object, labels: unknown, value: unknown) => void;
const promInc = (Counter.prototype as unknown as { incWithoutExemplar: Update }).incWithoutExemplar;
const promObserve = (Histogram.prototype as unknown as { observeWithoutExemplar: Update }).observeWithoutExemplar;

function keyOf(names: readonly string[], labels: Labels): string {
  if (names.length === 1) return String(labels[names[0]]);
  let key = '';
  for (const n of names) key += String(labels[n]) + SEP;
  return key;
}

/** The series prom-client keeps for these labels (after an update made it), and its hash. */
function seriesOf(metric: object, names: readonly string[], labels: Labels): Kept | null {
  const map = (metric as unknown as Internals).hashMap;
  for (const hash in map) {
    const s = map[hash];
    if (names.every((n) => String(s.labels[n]) === String(labels[n]))) return { hash, series: s };
  }
  return null;
}

/**
 * The series kept for these labels, still prom-client's (a `reset` or `remove` drops it); or,
 * when there is none, null after prom-client's own `update` with `value` has made or found it,
 * now kept.
 */
function keptSeries(
  metric: object,
  names: readonly string[],
  kept: Map<string, Kept>,
  labels: Labels,
  update: Update,
  value: number | undefined,
): Series | null {
  const key = keyOf(names, labels);
  const k = kept.get(key);
  if (k !== undefined && (metric as unknown as Internals).hashMap[k.hash] === k.series) return k.series;
  update.call(metric, labels, value);
  const found = seriesOf(metric, names, labels);
  if (found) kept.set(key, found);
  return null;
}

export class FastCounter<T extends string = string> extends Counter<T> {
  private readonly names: readonly string[];
  private readonly kept = new Map<string, Kept>();

  constructor(config: CounterConfiguration<T>) {
    super(config);
    this.names = config.labelNames ?? [];
  }

  /** prom-client's `inc` (its constructor binds `inc` to this method). */
  incWithoutExemplar(labels?: LabelValues<T> | number, value?: number): void {
    if (typeof labels !== 'object' || labels === null || (value !== undefined && !(Number.isFinite(value) && value >= 0))) {
      promInc.call(this, labels, value);
      return;
    }
    const s = keptSeries(this, this.names, this.kept, labels, promInc, value);
    if (s !== null) s.value! += value ?? 1;
  }
}

export class FastHistogram<T extends string = string> extends Histogram<T> {
  private readonly names: readonly string[];
  private readonly kept = new Map<string, Kept>();
  private readonly bounds: number[];
  /** Each bound as prom-client's bucket property name. */
  private readonly boundKeys: string[];

  constructor(config: HistogramConfiguration<T>) {
    super(config);
    this.names = config.labelNames ?? [];
    this.bounds = [...(this as unknown as { upperBounds: number[] }).upperBounds];
    this.boundKeys = this.bounds.map(String);
  }

  /** prom-client's `observe` (its constructor binds `observe` to this method). */
  observeWithoutExemplar(labels: LabelValues<T> | number, value?: number): void {
    if (typeof labels !== 'object' || labels === null || typeof value !== 'number' || !Number.isFinite(value)) {
      promObserve.call(this, labels, value);
      return;
    }
    const s = keptSeries(this, this.names, this.kept, labels, promObserve, value);
    if (s === null) return;
    s.sum! += value;
    s.count! += 1;
    const bounds = this.bounds;
    let i = 0;
    while (i < bounds.length && value > bounds[i]) i++;
    if (i < bounds.length) s.bucketValues![this.boundKeys[i]] += 1;
  }
}
