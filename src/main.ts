#!/usr/bin/env node
import { runProgram } from './cli/program';

runProgram(process.argv.slice(2), { env: process.env, out: process.stdout, err: process.stderr }).then(
  (code) => {
    process.exitCode = code;
    // Anything still holding the loop after a clean shutdown is a bug; do not hang the pod.
    setTimeout(() => process.exit(code), 2000).unref();
  },
  (err) => {
    process.stderr.write(`lightning-sidecar: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
