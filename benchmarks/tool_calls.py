"""Tool use on the built-in agent model: accuracy of single calls, and agent-loop throughput.

1. Accuracy: 30 single-call tasks of our own making (a question, eight tools to choose from, the
   one call that answers it). Each is sent once, greedy, with tool_choice "auto"; scored for the
   exact function and for the exact arguments (JSON values equal; numbers by value). Run twice:
   the call parsed from free text (the server has no switch to turn the grammar off under auto, so
   this is tool_choice none on the same prompt, read by the server's own parser), and tool_choice
   auto as served, where the grammar holds a call to the tool's JSON Schema once the model opens it.
2. Agent loop: agents that each ask a question, run the tool the model calls, send the result
   back and read the final answer, four at a time; turns (chat completions) per second with the
   prefix cache on and off (a server each, `--disable-radix-cache` for off).
3. Multi-step chains (benchmarks/tool_chains.py): eight tasks whose second call needs the first
   one's result, scored for the calls in order, their exact arguments and the final answer.
`--parts` picks which of `accuracy`, `chains` and `loop` run (all by default).

Each server is `python -m server --model <model>` on a free 127.0.0.1 port, stopped at the end.

    python -m benchmarks.tool_calls [--model agent] [--agents 8] [--concurrency 4]
        [--parts accuracy chains loop] [--json benchmarks/results/tool-calls.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from server.processes import free_port, stop, wait_healthy


def _tool(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required or list(properties)}}}


S = {"type": "string"}
N = {"type": "number"}
TOOLS = [
    _tool("calculator", "Evaluate an arithmetic expression and return the number", {"expression": S}),
    _tool("get_weather", "Current weather in a city", {"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          ["city"]),
    _tool("get_capital", "Look up the capital city of a country", {"country": S}),
    _tool("convert_currency", "Convert an amount of money from one currency to another (ISO codes)",
          {"amount": N, "from_currency": S, "to_currency": S}),
    _tool("define_word", "Look up a word in the dictionary", {"word": S}),
    _tool("send_email", "Send an email", {"to": S, "subject": S, "body": S}),
    _tool("get_time", "Current local time in an IANA time zone", {"timezone": S}),
    _tool("get_stock_price", "Latest price of a stock by its ticker symbol", {"ticker": S}),
]

# (question, function, arguments): the one call that answers the question.
TASKS: list[tuple[str, str, dict]] = [
    ("What is 37 times 41?", "calculator", {"expression": "37 * 41"}),
    ("Compute 1234 + 5678.", "calculator", {"expression": "1234 + 5678"}),
    ("What is 2 to the power of 10? Use the expression 2**10.", "calculator", {"expression": "2**10"}),
    ("How much is 144 / 12?", "calculator", {"expression": "144 / 12"}),
    ("Calculate (3 + 4) * 5.", "calculator", {"expression": "(3 + 4) * 5"}),
    ("What's the weather in Paris?", "get_weather", {"city": "Paris"}),
    ("Is it raining in London right now?", "get_weather", {"city": "London"}),
    ("What is the temperature in Tokyo in celsius?", "get_weather", {"city": "Tokyo", "unit": "celsius"}),
    ("Weather in New York in fahrenheit, please.", "get_weather", {"city": "New York", "unit": "fahrenheit"}),
    ("How is the weather in Berlin today?", "get_weather", {"city": "Berlin"}),
    ("What is the capital of Australia?", "get_capital", {"country": "Australia"}),
    ("Which city is the capital of Canada?", "get_capital", {"country": "Canada"}),
    ("Tell me the capital of Japan.", "get_capital", {"country": "Japan"}),
    ("What's the capital city of Brazil?", "get_capital", {"country": "Brazil"}),
    ("Convert 100 USD to EUR.", "convert_currency", {"amount": 100, "from_currency": "USD", "to_currency": "EUR"}),
    ("How many JPY is 50 GBP?", "convert_currency", {"amount": 50, "from_currency": "GBP", "to_currency": "JPY"}),
    ("Change 20 EUR into CHF.", "convert_currency", {"amount": 20, "from_currency": "EUR", "to_currency": "CHF"}),
    ("Convert 75.5 CAD to USD.", "convert_currency", {"amount": 75.5, "from_currency": "CAD", "to_currency": "USD"}),
    ("What does the word 'ephemeral' mean?", "define_word", {"word": "ephemeral"}),
    ("Define 'serendipity'.", "define_word", {"word": "serendipity"}),
    ("Look up the meaning of the word 'ubiquitous'.", "define_word", {"word": "ubiquitous"}),
    ("What is the definition of 'laconic'?", "define_word", {"word": "laconic"}),
    ("Email bob@example.com with subject 'Lunch' and body 'Noon at the cafe?'", "send_email",
     {"to": "bob@example.com", "subject": "Lunch", "body": "Noon at the cafe?"}),
    ("Send an email to alice@example.org, subject 'Report', body 'Attached is the report.'", "send_email",
     {"to": "alice@example.org", "subject": "Report", "body": "Attached is the report."}),
    ("What time is it in the Europe/Paris time zone?", "get_time", {"timezone": "Europe/Paris"}),
    ("Current time in America/New_York?", "get_time", {"timezone": "America/New_York"}),
    ("Tell me the local time for Asia/Tokyo.", "get_time", {"timezone": "Asia/Tokyo"}),
    ("What is Apple's stock price? The ticker is AAPL.", "get_stock_price", {"ticker": "AAPL"}),
    ("Latest price of MSFT?", "get_stock_price", {"ticker": "MSFT"}),
    ("How much is one share of NVDA right now?", "get_stock_price", {"ticker": "NVDA"}),
]

SYSTEM = "You are a helpful assistant. Use a tool when one can answer the question."


def _same(got: object, want: object) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return float(got) == float(want)
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return got == want


def _reply_calls(client, model: str, question: str, constrained: bool) -> list[tuple[str, str]]:  # noqa: ANN001
    """(name, arguments) of the calls the reply makes. Constrained: tool_choice auto as the server
    runs it (the grammar holds a call to its schema once opened). Not constrained: the same prompt
    (the template renders the tools either way) decoded freely with tool_choice none, and the text
    read by the same parser the server uses (it has no switch to turn the grammar off under auto)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = client.chat.completions.create(model=model, temperature=0, max_tokens=128, tools=TOOLS,
                                           tool_choice="auto" if constrained else "none", messages=messages)
    message = reply.choices[0].message
    if constrained:
        return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    from server.parsers.tools import ToolSpec, parser_class

    parser = parser_class(_server_parser(client))([ToolSpec(t["function"]["name"], t["function"]["parameters"])
                                                   for t in TOOLS])
    return [(c.name, c.arguments) for c in parser.parse(message.content or "").calls]


def _server_parser(client) -> str:  # noqa: ANN001
    import httpx

    info = httpx.get(str(client.base_url).removesuffix("/v1/").removesuffix("/v1") + "/get_server_info", timeout=60)
    return info.json()["tool_call_parser_resolved"]


def score(client, model: str, constrained: bool, concurrency: int) -> dict:  # noqa: ANN001 - an openai.OpenAI
    """Exact-function and exact-argument rates over TASKS for one mode."""
    rows = []
    with ThreadPoolExecutor(concurrency) as pool:  # greedy: the same answers as one at a time, sooner
        replies = list(pool.map(lambda task: _reply_calls(client, model, task[0], constrained), TASKS))
    for (question, function, arguments), calls in zip(TASKS, replies):
        got_name = calls[0][0] if calls else None
        try:
            got_args = json.loads(calls[0][1]) if calls else None
        except json.JSONDecodeError:
            got_args = None
        rows.append({"question": question, "called": got_name, "arguments": got_args,
                     "function_ok": got_name == function,
                     "arguments_ok": got_name == function and _same(got_args, arguments)})
    n = len(rows)
    return {"constrained": constrained, "tasks": n,
            "any_call": sum(r["called"] is not None for r in rows) / n,
            "function_exact": sum(r["function_ok"] for r in rows) / n,
            "arguments_exact": sum(r["arguments_ok"] for r in rows) / n, "rows": rows}


# -- the agent loop ------------------------------------------------------------------------------

CAPITALS = {"australia": "Canberra", "canada": "Ottawa", "japan": "Tokyo", "brazil": "Brasilia",
            "france": "Paris", "kenya": "Nairobi", "peru": "Lima", "norway": "Oslo"}


def run_tool(name: str, arguments: str) -> str:
    """The tools the agent loop really runs (a lookup over a small dict, a calculator)."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    if name == "get_capital":
        return CAPITALS.get(str(args.get("country", "")).lower(), "unknown")
    if name == "calculator":
        expression = str(args.get("expression", ""))
        if set(expression) <= set("0123456789+-*/(). "):
            try:
                return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - digits and operators only
            except (SyntaxError, ZeroDivisionError):
                return "error: cannot evaluate"
        return "error: only arithmetic"
    return f"error: no tool {name}"


def agent(client, model: str, question: str, max_turns: int = 3) -> int:  # noqa: ANN001
    """One agent: ask, run the tools called, answer. Returns how many turns (requests) it took."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    for turn in range(1, max_turns + 1):
        reply = client.chat.completions.create(model=model, temperature=0, max_tokens=64, tools=TOOLS,
                                               tool_choice="auto", messages=messages)
        message = reply.choices[0].message
        if not message.tool_calls:
            return turn
        messages.append({"role": "assistant", "content": message.content or "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    return max_turns


def loop_throughput(client, model: str, agents: int, concurrency: int) -> dict:  # noqa: ANN001
    countries = list(CAPITALS)
    questions = [f"What is the capital of {countries[i % len(countries)].title()}?" for i in range(agents)]
    agent(client, model, questions[0])  # warm up (and, with the cache on, cache the system prompt + tools)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        turns = sum(pool.map(lambda q: agent(client, model, q), questions))
    seconds = time.perf_counter() - start
    return {"agents": agents, "concurrency": concurrency, "turns": turns, "seconds": seconds,
            "turns_per_s": turns / seconds}


@contextmanager
def server(model: str, *flags: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "server", "--model", model, "--port", str(port),
                                "--log-level", "warning", *flags])
    try:
        wait_healthy(process, port, "radixserve", timeout=900)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop(process, timeout=60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="agent")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (accuracy and agent loop)")
    parser.add_argument("--parts", nargs="+", choices=["accuracy", "chains", "loop"],
                        default=["accuracy", "chains", "loop"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from openai import OpenAI

    from benchmarks import tool_chains

    result: dict = {"model": args.model, "tasks": len(TASKS)}
    with server(args.model) as url:
        client = OpenAI(base_url=url, api_key="none", timeout=600)
        for constrained in (False, True) if "accuracy" in args.parts else ():
            row = score(client, args.model, constrained, args.concurrency)
            result["constrained" if constrained else "parsed"] = row
            print(f"{'auto, constrained calls' if constrained else 'free text, parsed      '}: "
                  f"a call {100 * row['any_call']:5.1f}%, function exact {100 * row['function_exact']:5.1f}%, "
                  f"arguments exact {100 * row['arguments_exact']:5.1f}% ({row['tasks']} tasks)", flush=True)
        if "chains" in args.parts:
            chains = result["chains"] = tool_chains.score(client, args.model, args.concurrency)
            print(f"multi-step chains: functions in order {100 * chains['functions_exact']:5.1f}%, second call "
                  f"carries the first result {100 * chains['carried']:5.1f}%, exact arguments "
                  f"{100 * chains['arguments_exact']:5.1f}%, answered {100 * chains['answered']:5.1f}% "
                  f"({chains['chains']} chains)", flush=True)
        if "loop" in args.parts:
            result["loop_cache_on"] = loop_throughput(client, args.model, args.agents, args.concurrency)
    if "loop" in args.parts:
        with server(args.model, "--disable-radix-cache") as url:
            client = OpenAI(base_url=url, api_key="none", timeout=600)
            result["loop_cache_off"] = loop_throughput(client, args.model, args.agents, args.concurrency)
        on, off = result["loop_cache_on"], result["loop_cache_off"]
        print(f"agent loop ({args.agents} agents, {args.concurrency} at a time): cache on {on['turns_per_s']:.2f} "
              f"turns/s ({on['turns']} turns in {on['seconds']:.1f} s), cache off {off['turns_per_s']:.2f} turns/s "
              f"({off['turns']} turns in {off['seconds']:.1f} s): {on['turns_per_s'] / off['turns_per_s']:.2f}x",
              flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
