"""Renders a corpus of chat conversations the way vLLM renders them, for render-corpus.test.ts.

Reads one JSON object on stdin: {"tokenizers": {name: {"dir", "loader"}}, "conversations":
[{"name", "messages", "tools"?, "kwargs"?}]}, the messages as an OpenAI client sends them. The
loader is "auto" (`AutoTokenizer`, as vLLM loads a model's tokenizer) or "fast"
(`PreTrainedTokenizerFast`: `tokenizer.json`'s own pipeline, for a folder that `AutoTokenizer`
misloads). For each tokenizer folder and conversation it writes, as one JSON object on stdout:

- "vllm": the text and ids of `transformers`' `apply_chat_template(..., add_generation_prompt=True)`
  given the messages and tools as vLLM's chat completions endpoint hands them to it (see
  `vllm_messages` and `vllm_tools`), or the error it raised;
- "prepared": those messages and tools, so the test can also give the Node renderer exactly what
  the template got;
- "raw": the text `apply_chat_template` renders from the messages as sent, unprepared, or its error
  (shown when the Node renderer differs, to tell the template from the preparation).

The ids are `apply_chat_template(..., tokenize=True)`'s: the rendered text tokenized with no special
tokens added, as vLLM tokenizes it. "file_ids" are the same text's ids from the `tokenizers`
library reading `tokenizer.json` directly, so that a tokenizer `transformers` built differently
from its file shows as such, not as a difference of the Node renderer.
"""

import copy
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import tokenizers
import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerFast


def content_format(template):
    """The content format vLLM's "auto" detects: "openai" when the template loops over a message's
    content (it takes content as a list of parts), else "string"."""
    try:
        ast = jinja2.Environment(extensions=[jinja2.ext.loopcontrols]).parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    for loop in ast.find_all(jinja2.nodes.For):
        node = loop.iter
        while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) and node.node is not None:
            node = node.node
        if isinstance(node, jinja2.nodes.Getattr) and node.attr == "content":
            return "openai"
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content":
            return "openai"
    return "string"


def vllm_message(message, fmt):
    """One message as vLLM's chat_utils builds it: the content's text parts joined by newlines (a
    string template) or kept as text parts (an "openai" one), a null content as no parts; an
    assistant's `tool_calls` and `reasoning` (also given as `reasoning_content`); a tool result's
    `tool_call_id`; `name`. Nothing else of the message reaches the template: a `reasoning_content`
    the client sent is not passed on, vLLM reads `reasoning` only."""
    role = message["role"]
    content = message.get("content")
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = content
    texts = [p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "text" and p.get("text") is not None]
    out = {"role": role, "content": [{"type": "text", "text": t} for t in texts] if fmt == "openai" else "\n".join(texts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            out["tool_calls"] = copy.deepcopy(list(message["tool_calls"]))
        if message.get("reasoning") is not None:
            out["reasoning"] = message["reasoning"]
            out["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        if isinstance(out["content"], list):
            out["content"] = "\n".join(p["text"] for p in out["content"])
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def vllm_messages(messages, fmt):
    """The messages as vLLM gives them to `apply_chat_template`: each as `vllm_message` builds it,
    then an empty `tool_calls` dropped and each call's `arguments` parsed from its JSON string into
    an object (an empty, unparsable or non-object one becomes {}), as vLLM does "per the
    Transformers docs": templates then write them with their own `tojson`."""
    out = [vllm_message(m, fmt) for m in messages]
    for m in out:
        if m["role"] != "assistant" or not isinstance(m.get("tool_calls"), list):
            continue
        if not m["tool_calls"]:
            del m["tool_calls"]
            continue
        for call in m["tool_calls"]:
            args = call["function"].get("arguments")
            if isinstance(args, str) and args:
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = {}
            call["function"]["arguments"] = args if isinstance(args, dict) else {}
    return out


def vllm_tools(tools):
    """The tools as vLLM gives them to the template: each parsed into its request model and dumped
    back, so a function has `name`, `description` and `parameters` first, in that order (null when
    not given), then any other field the client sent."""
    if not tools:
        return None
    out = []
    for tool in tools:
        fn = tool["function"]
        dumped = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        dumped.update({k: v for k, v in fn.items() if k not in dumped})
        entry = {"type": tool.get("type", "function"), "function": dumped}
        entry.update({k: v for k, v in tool.items() if k not in entry})
        out.append(entry)
    return out


def render(tok, messages, tools, kwargs, with_ids, file_tok=None):
    """The template's text (and ids) for a conversation, or the error it raised."""
    args = dict(tools=tools, add_generation_prompt=True, **kwargs)
    try:
        text = tok.apply_chat_template(copy.deepcopy(messages), tokenize=False, **args)
        if not with_ids:
            return {"text": text}
        ids = tok.apply_chat_template(copy.deepcopy(messages), tokenize=True, **args)
        # Newer transformers answer a BatchEncoding (return_dict defaults to true); older ones the ids.
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        file_ids = file_tok.encode(text, add_special_tokens=False).ids
        return {"text": text, "ids": [int(i) for i in ids], "file_ids": file_ids}
    except Exception as err:  # noqa: BLE001 - any error of the template is a result to compare
        return {"error": f"{type(err).__name__}: {err}"}


def main():
    corpus = json.load(sys.stdin)
    results = {}
    for name, spec in corpus["tokenizers"].items():
        loader = {"auto": AutoTokenizer, "fast": PreTrainedTokenizerFast}[spec["loader"]]
        tok = loader.from_pretrained(spec["dir"])
        file_tok = tokenizers.Tokenizer.from_file(os.path.join(spec["dir"], "tokenizer.json"))
        template = tok.chat_template if isinstance(tok.chat_template, str) else tok.chat_template["default"]
        fmt = content_format(template)
        per = {}
        for conv in corpus["conversations"]:
            kwargs = conv.get("kwargs") or {}
            messages = vllm_messages(conv["messages"], fmt)
            tools = vllm_tools(conv.get("tools"))
            per[conv["name"]] = {
                "vllm": render(tok, messages, tools, kwargs, True, file_tok),
                "prepared": {"messages": messages, "tools": tools},
                "raw": render(tok, conv["messages"], conv.get("tools"), kwargs, False),
            }
        results[name] = {"tokenizer_class": type(tok).__name__, "content_format": fmt, "conversations": per}
    versions = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__}
    json.dump({"versions": versions, "results": results}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
