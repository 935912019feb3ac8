'use strict';
// Jest globalSetup/globalTeardown: after the whole suite, scan every file the sidecars wrote
// (data dirs, journals, exports, dead letters, their logs) for the secrets the tests used, in any
// encoding (plain, base64, JSON-escaped, URL-encoded). A hit fails `npm test`.
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const ROOT = path.join(__dirname, '../..');
const MARK = path.join(os.tmpdir(), `lightning-suite-${process.pid}.start`);

function setup() {
  fs.writeFileSync(MARK, String(Date.now()));
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
  const started = Number(fs.existsSync(MARK) ? fs.readFileSync(MARK, 'utf8') : 0);
  fs.rmSync(MARK, { force: true });
  const list = secrets().flatMap((s) => forms(s).map((f) => ({ secret: s, form: f })));
  const hits = [];
  let files = 0;
  const scan = (p) => {
    let st;
    try {
      st = fs.statSync(p);
    } catch {
      return;
    }
    if (st.isDirectory()) {
      for (const e of fs.readdirSync(p)) scan(path.join(p, e));
      return;
    }
    if (st.size > 64 * 1024 * 1024) return;
    files++;
    const text = fs.readFileSync(p).toString('latin1');
    for (const { secret, form } of list) if (text.includes(form)) hits.push(`${p}: ${secret.slice(0, 6)}… (${form === secret ? 'plain' : 'encoded'})`);
  };
  for (const e of fs.readdirSync(os.tmpdir())) {
    if (!e.startsWith('lightning-') || e.startsWith('lightning-helm') || e.startsWith('lightning-bench') || e.startsWith('lightning-suite-')) continue;
    const p = path.join(os.tmpdir(), e);
    try {
      if (fs.statSync(p).mtimeMs < started) continue;
    } catch {
      continue;
    }
    scan(p);
  }
  if (hits.length > 0) throw new Error(`secrets found in files the sidecar wrote during the suite:\n${hits.join('\n')}`);
  if (process.env.LIGHTNING_SECRETS_SCAN_VERBOSE) process.stderr.write(`secrets scan: ${list.length / 5} secrets, ${files} files, clean\n`);
}

module.exports = { setup, teardown };
