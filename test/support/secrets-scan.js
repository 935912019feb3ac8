'use strict';
// Jest globalSetup/globalTeardown. The suite runs with its own temporary directory (TMPDIR, which
// the workers and the processes they start inherit): everything the tests write there is removed
// at the end, so `npm test` leaves nothing behind in the machine's /tmp. Before that, every file
// the sidecars wrote during the suite (data dirs, journals, exports, dead letters, their logs) is
// scanned for the secrets the tests used, in any encoding (plain, base64, JSON-escaped,
// URL-encoded). A hit fails `npm test` and keeps the directory for a look.
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.join(__dirname, '../..');

function setup() {
  const machine = os.tmpdir();
  const suite = fs.mkdtempSync(path.join(machine, 'lightning-suite-'));
  process.env.LIGHTNING_SUITE_STARTED = String(Date.now());
  process.env.LIGHTNING_SUITE_TMPDIR = suite;
  // Caches that outlive a run (the extracted helm binary) stay in the machine's directory.
  process.env.LIGHTNING_TEST_MACHINE_TMPDIR = machine;
  process.env.TMPDIR = suite;
}

/** The secrets the tests send: API keys, bearer tokens (literals of 8+ characters in the test sources). */
function secrets() {
  const found = new Set();
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (p.endsWith('.ts')) {
        const text = fs.readFileSync(p, 'utf8');
        for (const m of text.matchAll(/\b(sk-[A-Za-z0-9_-]{6,})/g)) found.add(m[1]);
        for (const m of text.matchAll(/apiKey: '([^']{8,})'/g)) found.add(m[1]);
        for (const m of text.matchAll(/(?:TOKEN|token) = '([^']{16,})'/g)) found.add(m[1]);
      }
    }
  };
  walk(path.join(ROOT, 'test'));
  return [...found];
}

function forms(secret) {
  return [
    secret,
    Buffer.from(secret).toString('base64'),
    JSON.stringify(secret).slice(1, -1),
    encodeURIComponent(secret),
    Buffer.from(`Bearer ${secret}`).toString('base64'),
  ];
}

function teardown() {
  const started = Number(process.env.LIGHTNING_SUITE_STARTED ?? 0);
  const suite = process.env.LIGHTNING_SUITE_TMPDIR;
  const machine = process.env.LIGHTNING_TEST_MACHINE_TMPDIR ?? os.tmpdir();
  const list = secrets().flatMap((s) => forms(s).map((f) => ({ secret: s, form: f })));
  const hits = [];
  let files = 0;
  const scan = (p) => {
    let st;
    try {
      st = fs.lstatSync(p);
    } catch {
      return;
    }
    if (st.isDirectory()) {
      for (const e of fs.readdirSync(p)) scan(path.join(p, e));
      return;
    }
    if (!st.isFile() || st.size > 64 * 1024 * 1024) return;
    files++;
    const text = fs.readFileSync(p).toString('latin1');
    for (const { secret, form } of list) if (text.includes(form)) hits.push(`${p}: ${secret.slice(0, 6)}… (${form === secret ? 'plain' : 'encoded'})`);
  };
  if (suite) scan(suite);
  // Processes started with an environment of their own may have written to the machine's directory.
  for (const e of fs.readdirSync(machine)) {
    if (!e.startsWith('lightning-') || e.startsWith('lightning-helm') || e.startsWith('lightning-bench') || e.startsWith('lightning-suite-')) continue;
    const p = path.join(machine, e);
    try {
      if (fs.statSync(p).mtimeMs < started) continue;
    } catch {
      continue;
    }
    scan(p);
  }
  if (hits.length > 0) throw new Error(`secrets found in files the sidecar wrote during the suite (kept in ${suite}):\n${hits.join('\n')}`);
  if (process.env.LIGHTNING_SECRETS_SCAN_VERBOSE) process.stderr.write(`secrets scan: ${list.length / 5} secrets, ${files} files, clean\n`);
  if (suite && !process.env.LIGHTNING_KEEP_TEST_TMP) fs.rmSync(suite, { recursive: true, force: true, maxRetries: 3 });
}

module.exports = { setup, teardown, secrets };
