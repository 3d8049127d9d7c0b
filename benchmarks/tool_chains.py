"""Multi-step tool chains: tasks whose second call needs the first call's result.

Each task is a question that takes two calls in order (the capital of a country, then the weather
in that city; a stock price, then a sum on it); the agent runs the tools the model calls (fixed
answers, below), sends the results back and reads the final answer, for at most four turns.
Scored per task: the functions called in the expected order and nothing else
(`functions_exact`), the second call carrying the first one's result (`carried`: the expected
function, with the argument that depends on the result right, whatever else it holds), the calls
with exactly the expected arguments (`arguments_exact`, as strict as the single-call tasks: an
unasked `"unit"` fails it; calculator expressions by their value), and the final answer holding
the expected text (`answered`). Used by benchmarks/tool_calls.py (`--parts chains`).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from benchmarks.tool_calls import SYSTEM, TOOLS, _same

CAPITALS = {"australia": "Canberra", "japan": "Tokyo", "france": "Paris", "kenya": "Nairobi", "canada": "Ottawa"}
WEATHER = {"canberra": "18 degrees, sunny", "tokyo": "22 degrees, light rain", "paris": "15 degrees, cloudy",
           "nairobi": "25 degrees, clear", "ottawa": "-3 degrees, snow"}
PRICES = {"AAPL": 190.5, "MSFT": 410.0, "NVDA": 120.25}
RATES = {("USD", "EUR"): 0.9, ("USD", "JPY"): 150.0, ("EUR", "USD"): 1.1}


@dataclass(frozen=True)
class Chain:
    question: str
    calls: tuple[tuple[str, dict], ...]  # the expected calls, in order
    answer: str  # text the final answer must hold (case-insensitive)
    carried: str  # the second call's argument that holds the first call's result


CHAINS: tuple[Chain, ...] = (
    Chain("First look up the capital of Australia, then get the weather in that city.",
          (("get_capital", {"country": "Australia"}), ("get_weather", {"city": "Canberra"})), "sunny", "city"),
    Chain("Find the capital of Japan, then tell me the weather there.",
          (("get_capital", {"country": "Japan"}), ("get_weather", {"city": "Tokyo"})), "rain", "city"),
    Chain("Look up the capital of Kenya, and then the current weather in that city.",
          (("get_capital", {"country": "Kenya"}), ("get_weather", {"city": "Nairobi"})), "clear", "city"),
    Chain("What is the capital of Canada? Once you know it, check the weather there.",
          (("get_capital", {"country": "Canada"}), ("get_weather", {"city": "Ottawa"})), "snow", "city"),
    Chain("Get the stock price of AAPL, then use the calculator to find the cost of 10 shares.",
          (("get_stock_price", {"ticker": "AAPL"}), ("calculator", {"expression": "190.5 * 10"})), "1905", "expression"),
    Chain("Look up the price of MSFT, then convert that many USD to EUR.",
          (("get_stock_price", {"ticker": "MSFT"}),
           ("convert_currency", {"amount": 410, "from_currency": "USD", "to_currency": "EUR"})), "369", "amount"),
    Chain("Compute 37 * 41 with the calculator, then convert that many USD to JPY.",
          (("calculator", {"expression": "37 * 41"}),
           ("convert_currency", {"amount": 1517, "from_currency": "USD", "to_currency": "JPY"})), "227", "amount"),
    Chain("Use the calculator for 144 / 12, then use it again to multiply that result by 7.",
          (("calculator", {"expression": "144 / 12"}), ("calculator", {"expression": "12 * 7"})), "84", "expression"),
)


def _arithmetic(expression: str) -> float | None:
    if not expression or not set(expression) <= set("0123456789+-*/(). "):
        return None
    try:
        return float(eval(expression, {"__builtins__": {}}))  # noqa: S307 - digits and operators only
    except (SyntaxError, ZeroDivisionError, TypeError):
        return None


def run_tool(name: str, args: dict) -> str:
    """The chain's tools, with fixed answers."""
    if name == "get_capital":
        return CAPITALS.get(str(args.get("country", "")).lower(), "unknown")
    if name == "get_weather":
        return WEATHER.get(str(args.get("city", "")).lower(), "unknown city")
    if name == "get_stock_price":
        price = PRICES.get(str(args.get("ticker", "")).upper())
        return "unknown ticker" if price is None else str(price)
    if name == "calculator":
        value = _arithmetic(str(args.get("expression", "")))
        return "error: cannot evaluate" if value is None else f"{value:g}"
    if name == "convert_currency":
        rate = RATES.get((str(args.get("from_currency", "")).upper(), str(args.get("to_currency", "")).upper()))
        try:
            return "unknown rate" if rate is None else f"{float(args.get('amount', 0)) * rate:g}"
        except (TypeError, ValueError):
            return "error: amount is not a number"
    return f"error: no tool {name}"


def _arguments_ok(name: str, got: dict | None, want: dict) -> bool:
    if got is None:
        return False
    if name == "calculator":  # "190.5 * 10" and "10 * 190.5" are the same call
        value = _arithmetic(str(got.get("expression", "")))
        return got.keys() == want.keys() and value is not None and value == _arithmetic(want["expression"])
    return _same(got, want)


def _carried(made: list[tuple[str, dict | None]], chain: Chain) -> bool:
    if len(made) < 2 or made[1][0] != chain.calls[1][0] or not isinstance(made[1][1], dict):
        return False
    key, want = chain.carried, chain.calls[1][1][chain.carried]
    got = made[1][1].get(key)
    if key == "expression":
        return _arithmetic(str(got)) is not None and _arithmetic(str(got)) == _arithmetic(want)
    return _same(got, want)


def run_chain(client, model: str, chain: Chain, max_turns: int = 4) -> dict:  # noqa: ANN001 - an openai.OpenAI
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": chain.question}]
    made: list[tuple[str, dict | None]] = []
    answer = ""
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, temperature=0, max_tokens=128, tools=TOOLS,
                                               tool_choice="auto", messages=messages)
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            break
        messages.append({"role": "assistant", "content": message.content or "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
        for call in message.tool_calls:
            try:
                args = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                args = None
            made.append((call.function.name, args))
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, args if isinstance(args, dict) else {})})
    names_ok = [n for n, _ in made] == [n for n, _ in chain.calls]
    return {"question": chain.question, "calls": [[n, a] for n, a in made], "answer": answer,
            "functions_exact": names_ok, "carried": _carried(made, chain),
            "arguments_exact": names_ok and all(_arguments_ok(n, a if isinstance(a, dict) else None, w)
                                                for (n, a), (_, w) in zip(made, chain.calls)),
            "answered": chain.answer.lower() in answer.lower().replace(",", "")}


def score(client, model: str, concurrency: int) -> dict:  # noqa: ANN001
    with ThreadPoolExecutor(concurrency) as pool:  # greedy: the same answers as one at a time
        rows = list(pool.map(lambda chain: run_chain(client, model, chain), CHAINS))
    n = len(rows)
    return {"chains": n, **{key: sum(r[key] for r in rows) / n for key in ("functions_exact", "carried", "arguments_exact", "answered")},
            "rows": rows}
