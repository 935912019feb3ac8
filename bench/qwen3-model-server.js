'use strict';
// The suite's vLLM stand-in with Qwen3's real tokenizer and chat template (test/support/qwen3-server.ts,
// compiled into build/ by `npm run bench`), for the token-in scenario. Prints {"port": N} when up.
const { startQwen3Server } = require('../build/test/support/qwen3-server.js');

startQwen3Server().then((s) => process.stdout.write(`${JSON.stringify({ port: s.port })}\n`));
