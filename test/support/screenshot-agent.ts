import OpenAI from 'openai';
import { CLICK_TOOLS, dataUrl, MODEL, pngScreenshot } from './qwen-vl-server';
import { completeChat } from './calculator-agent';
import type { TestSidecar } from './sidecar';

/** Four 1280×800 screenshots, each different. */
export const SCREENS = [0, 1, 2, 3].map((seed) => pngScreenshot(1280, 800, seed));

/**
 * A screenshot agent on the real `openai` SDK (for the Qwen-VL stand-in's click policy): a
 * screenshot with the task, then one after each click, the whole history resent each turn; a
 * screen given as a string is sent as that URL. Returns what it was answered, call by call.
 */
export async function openaiAgent(sidecar: TestSidecar, rollout: string, stream: boolean, screens: readonly (Buffer | string)[] = SCREENS): Promise<string[]> {
  const client = new OpenAI({ baseURL: `${sidecar.origin}/rollout/${rollout}/v1`, apiKey: 'sk-test', maxRetries: 0 });
  const messages: OpenAI.ChatCompletionMessageParam[] = [
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Open the settings.' },
        { type: 'image_url', image_url: { url: typeof screens[0] === 'string' ? screens[0] : dataUrl(screens[0]) } },
      ],
    },
  ];
  const answers: string[] = [];
  for (let turn = 1; turn <= 8; turn++) {
    const body = { model: MODEL, messages, tools: CLICK_TOOLS };
    const answer = await completeChat(client, body, stream);
    const content = answer.content ?? '';
    const calls = answer.calls;
    answers.push(calls.length > 0 ? `click ${JSON.stringify(JSON.parse(calls[0].arguments))}` : content);
    messages.push({
      role: 'assistant',
      content: content === '' ? null : content,
      ...(calls.length > 0
        ? { tool_calls: calls.map((c) => ({ id: c.id, type: 'function' as const, function: { name: c.name, arguments: c.arguments } })) }
        : {}),
    });
    if (calls.length === 0) break;
    for (const c of calls) messages.push({ role: 'tool', tool_call_id: c.id, content: 'clicked' });
    const next = screens[Math.min(turn, screens.length - 1)];
    messages.push({ role: 'user', content: [{ type: 'image_url', image_url: { url: typeof next === 'string' ? next : dataUrl(next) } }] });
  }
  return answers;
}
