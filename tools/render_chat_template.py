#!/usr/bin/env python3
"""Render a model's Jinja chat template the way Hugging Face transformers'
apply_chat_template does, to get reference prompts for the recognized formats
(src/chat.rs) where llama.cpp's tests have none.

  render_chat_template.py TEMPLATE.jinja MESSAGES.json [--no-generation-prompt]

MESSAGES.json: a list of {"role": ..., "content": ...}. Prints the prompt as a
JSON string (its escapes are valid in a Rust string literal). bos_token is
"<s>" and eos_token "</s>", as in llama.cpp's tests/test-chat-template.cpp.
Needs jinja2 (not in tests/requirements.txt: only this tool uses it).
"""
import json, sys

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    with open(args[0], encoding="utf-8") as f:
        source = f.read()
    with open(args[1], encoding="utf-8") as f:
        messages = json.load(f)
    # transformers' settings for chat templates.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    prompt = env.from_string(source).render(
        messages=messages,
        add_generation_prompt="--no-generation-prompt" not in sys.argv,
        bos_token="<s>",
        eos_token="</s>",
    )
    print(json.dumps(prompt, ensure_ascii=False))


if __name__ == "__main__":
    main()
