#!/usr/bin/env node
import { runProgram } from './cli/program';

// A reader that goes away (`tail … | head -1`) is not an error of ours: stop quietly.
for (const stream of [process.stdout, process.stderr])
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });

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
