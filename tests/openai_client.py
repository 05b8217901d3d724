"""The official `openai` Python client against `m40 serve`: each feature the
server honours, checked through the client, and the refusals it answers.

    python tests/openai_client.py BASE_URL API_KEY MODEL

Prints one line per check (the test matrix); exits non-zero on the first
failure. bindings/go/cmd/m40's TestTheOpenAIClient runs it with Gemma 3 270M.
"""
import sys

import openai

base_url, api_key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
PROMPT = "The capital of France is"
# llama.cpp's greedy continuation of PROMPT (tests/data/reference).
REFERENCE = " the capital of the country of France."
rows = []


def check(name, ok, detail=""):
    rows.append((name, ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if not ok or detail else ''}")
    if not ok:
        sys.exit(1)


# Models: the id and its creation time.
models = client.models.list().data
check("models.list: id and created", len(models) == 1 and models[0].id == model and models[0].created > 0)
check("models.retrieve", client.models.retrieve(model).id == model)

# Completions.
c = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
check("completions: greedy text, usage", c.choices[0].text.startswith(REFERENCE)
      and c.usage.completion_tokens == 8 and c.choices[0].finish_reason == "length", c)
c = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=["country"])
check("completions: stop", c.choices[0].text == " the capital of the " and c.choices[0].finish_reason == "stop", c)
c = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, n=2)
check("completions: n", len(c.choices) == 2 and all(ch.text.startswith(REFERENCE) for ch in c.choices))
c = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
lp = c.choices[0].logprobs
check("completions: logprobs", len(lp.tokens) == 4 and "".join(lp.tokens) == c.choices[0].text
      and all(len(t) == 2 for t in lp.top_logprobs) and all(v <= 0 for v in lp.token_logprobs), lp)
a = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=1, top_p=0.9, seed=11)
b = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=1, top_p=0.9, seed=11)
check("completions: seed and top_p repeat", a.choices[0].text == b.choices[0].text)
stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, stream=True)
check("completions: stream", "".join(ch.choices[0].text for ch in stream if ch.choices).startswith(REFERENCE))

# Chat.
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
r = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=6, temperature=0)
check("chat: max_completion_tokens", r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 6, r)
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
usage = [ch.usage for ch in chunks if ch.usage]
check("chat: stream equals whole", text == whole.choices[0].message.content, (text, whole.choices[0].message.content))
check("chat: stream_options.include_usage", len(usage) == 1
      and usage[0].completion_tokens == whole.usage.completion_tokens and not chunks[-1].choices)
r = client.chat.completions.create(model=model, messages=messages, max_tokens=3, temperature=0,
                                   logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
check("chat: logprobs, top_logprobs", len(content) == r.usage.completion_tokens
      and all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token for e in content), content)
# A stop string from the middle of the greedy reply: the reply ends before it.
reply = whole.choices[0].message.content
stop = reply[len(reply) // 2:len(reply) // 2 + 3]
r = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, stop=[stop])
check("chat: stop", r.choices[0].message.content == reply[:reply.index(stop)]
      and r.choices[0].finish_reason == "stop", (stop, r.choices[0].message.content))
x = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0.9, seed=5, n=2)
y = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0.9, seed=5, n=2)
check("chat: n and seed", len(x.choices) == 2
      and [c.message.content for c in x.choices] == [c.message.content for c in y.choices])

# Refusals.
for name, call, error in [
    ("max_tokens 0 -> 400", lambda: client.completions.create(model=model, prompt="x", max_tokens=0),
     openai.BadRequestError),
    ("max_tokens -1 -> 400", lambda: client.chat.completions.create(model=model, messages=messages, max_tokens=-1),
     openai.BadRequestError),
    ("unknown model -> 404", lambda: client.completions.create(model="gpt-4", prompt="x", max_tokens=1),
     openai.NotFoundError),
    ("presence_penalty -> 400", lambda: client.completions.create(model=model, prompt="x", max_tokens=1,
                                                                  presence_penalty=1), openai.BadRequestError),
    ("a wrong API key -> 401", lambda: openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
     .models.list(), openai.AuthenticationError),
]:
    try:
        call()
        check(name, False, "accepted")
    except error:
        check(name, True)

print(f"{sum(ok for _, ok in rows)} of {len(rows)} checks passed")
