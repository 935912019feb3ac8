/**
 * A scripted stand-in for a vLLM server, to try the examples without a GPU: it answers chat
 * completions, completions, Responses and Anthropic Messages, streamed and not, with token ids
 * and logprobs, and asks for the `calculator` tool once before answering. It is the test suite's
 * fake model server (examples/README.md says why); it is not a language model.
 *
 *   node build/examples/frameworks/stand-in-model.js    # prints its URL (a free port on 127.0.0.1)
 */
import { calculatorScript, startFakeModelServer } from '../../test/support/fake-model-server';

async function main(): Promise<void> {
  const server = await startFakeModelServer({ flavor: 'vllm', script: calculatorScript, model: 'policy' });
  console.log(`stand-in model (vLLM-like, scripted) at ${server.url}`);
  const stop = () => void server.close().then(() => process.exit(0));
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
