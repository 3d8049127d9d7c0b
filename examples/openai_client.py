"""The official OpenAI client against a running radixserve (start one with `make serve`)."""

import argparse

import openai

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--url", default="http://127.0.0.1:30000/v1")
args = parser.parse_args()

client = openai.OpenAI(base_url=args.url, api_key="unused")
model = client.models.list().data[0].id
question = [{"role": "user", "content": "What is the capital of France?"}]

reply = client.chat.completions.create(model=model, messages=question, max_tokens=32, temperature=0)
print("chat:", reply.choices[0].message.content.strip())
print("usage:", reply.usage.prompt_tokens, "prompt tokens,", reply.usage.prompt_tokens_details.cached_tokens, "cached")

print("stream:", end="", flush=True)
for chunk in client.chat.completions.create(model=model, messages=question, max_tokens=32, temperature=0, stream=True):
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()

few_shot = "Q: What is the capital of Germany?\nA: Berlin\nQ: What is the capital of France?\nA:"
completion = client.completions.create(model=model, prompt=few_shot, max_tokens=4, temperature=0)
print("completion:", completion.choices[0].text.strip())
