/** Kafka wire primitives (big-endian ints, int16-length strings, int32-length bytes and arrays, zig-zag varints). */
export class Reader {
  offset = 0;
  constructor(readonly buf: Buffer) {}

  int8(): number {
    return this.buf.readInt8(this.offset++);
  }
  int16(): number {
    const v = this.buf.readInt16BE(this.offset);
    this.offset += 2;
    return v;
  }
  int32(): number {
    const v = this.buf.readInt32BE(this.offset);
    this.offset += 4;
    return v;
  }
  int64(): bigint {
    const v = this.buf.readBigInt64BE(this.offset);
    this.offset += 8;
    return v;
  }
  string(): string {
    return this.nullableString() ?? '';
  }
  nullableString(): string | null {
    const n = this.int16();
    if (n < 0) return null;
    const s = this.buf.toString('utf8', this.offset, this.offset + n);
    this.offset += n;
    return s;
  }
  bytes(): Buffer | null {
    const n = this.int32();
    if (n < 0) return null;
    const b = this.buf.subarray(this.offset, this.offset + n);
    this.offset += n;
    return b;
  }
  array<T>(item: (r: Reader) => T): T[] {
    const n = this.int32();
    const out: T[] = [];
    for (let i = 0; i < n; i++) out.push(item(this));
    return out;
  }
  nullableArray<T>(item: (r: Reader) => T): T[] | null {
    const n = this.int32();
    if (n < 0) return null;
    this.offset -= 4;
    return this.array(item);
  }
  varint(): number {
    let shift = 0;
    let result = 0;
    for (;;) {
      const b = this.buf[this.offset++];
      result |= (b & 0x7f) << shift;
      if ((b & 0x80) === 0) break;
      shift += 7;
    }
    return (result >>> 1) ^ -(result & 1);
  }
  varlong(): bigint {
    let shift = 0n;
    let result = 0n;
    for (;;) {
      const b = BigInt(this.buf[this.offset++]);
      result |= (b & 0x7fn) << shift;
      if ((b & 0x80n) === 0n) break;
      shift += 7n;
    }
    return (result >> 1n) ^ -(result & 1n);
  }
  varBytes(): Buffer | null {
    const n = this.varint();
    if (n < 0) return null;
    const b = this.buf.subarray(this.offset, this.offset + n);
    this.offset += n;
    return b;
  }
}

export class Writer {
  private parts: Buffer[] = [];

  int8(v: number): this {
    const b = Buffer.alloc(1);
    b.writeInt8(v);
    return this.push(b);
  }
  int16(v: number): this {
    const b = Buffer.alloc(2);
    b.writeInt16BE(v);
    return this.push(b);
  }
  int32(v: number): this {
    const b = Buffer.alloc(4);
    b.writeInt32BE(v);
    return this.push(b);
  }
  int64(v: bigint | number): this {
    const b = Buffer.alloc(8);
    b.writeBigInt64BE(BigInt(v));
    return this.push(b);
  }
  bool(v: boolean): this {
    return this.int8(v ? 1 : 0);
  }
  string(s: string | null): this {
    if (s === null) return this.int16(-1);
    const b = Buffer.from(s, 'utf8');
    return this.int16(b.length).push(b);
  }
  bytes(b: Buffer | null): this {
    if (b === null) return this.int32(-1);
    return this.int32(b.length).push(b);
  }
  array<T>(items: readonly T[], item: (w: Writer, v: T) => void): this {
    this.int32(items.length);
    for (const v of items) item(this, v);
    return this;
  }
  raw(b: Buffer): this {
    return this.push(b);
  }
  private push(b: Buffer): this {
    this.parts.push(b);
    return this;
  }
  build(): Buffer {
    return Buffer.concat(this.parts);
  }
}
