"""The live view of the prefix cache: GET /cache (JSON pages of the radix tree), GET /cache/view
(drawn in headless Chromium), and the peers' prefix-cache metric names on /metrics."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from runtime import Engine
from tests.server.harness import RunningServer, serve

PREFIX = list(range(10, 50))  # 40 shared tokens


def _generate(url: str, ids: list[int]) -> dict:
    response = httpx.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 2, "temperature": 0}}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _all_nodes(url: str, limit: int = 1000) -> tuple[list[dict], dict]:
    nodes: list[dict] = []
    offset = 0
    while True:
        page = httpx.get(f"{url}/cache", params={"offset": offset, "limit": limit}, timeout=30).json()
        nodes.extend(page["nodes"])
        offset += limit
        if offset >= page["total_nodes"]:
            return nodes, page


@pytest.fixture(scope="module")
def warm(server: RunningServer) -> RunningServer:
    """Two prompts sharing a 40-token prefix, the second sent twice (its prefix is hit)."""
    httpx.post(f"{server.url}/flush_cache", timeout=30)
    _generate(server.url, PREFIX + [60, 61, 62])
    _generate(server.url, PREFIX + [70, 71])
    _generate(server.url, PREFIX + [70, 71])
    return server


@pytest.fixture(scope="module")
def tiered(tiny_folder: Path) -> Iterator[RunningServer]:
    """A 320-token pool over a host tier: a flood of prompts demotes the first ones, a re-send promotes."""
    with Engine(model=str(tiny_folder), dtype="float32", kv_cache_tokens=320, kv_host_tier_tokens=4096,
                max_running_requests=4) as engine:
        with serve(engine, served_model_name="tiny") as running:
            prompts = [torch.randint(3, 250, (70,), generator=torch.Generator().manual_seed(i)).tolist()
                       for i in range(8)]
            for ids in [PREFIX + [60], PREFIX + [70], *prompts]:
                _generate(running.url, ids)
            assert _generate(running.url, PREFIX + [60, 61])["meta_info"]["cached_tokens"] >= 40  # promoted
            yield running


def test_cache_json_reports_the_tree(warm: RunningServer) -> None:
    nodes, page = _all_nodes(warm.url)
    assert page["total_nodes"] == len(nodes) and len({n["id"] for n in nodes}) == len(nodes)
    ids = {n["id"] for n in nodes}
    assert all(n["parent"] in ids for n in nodes if not n["namespace_root"])
    shared = [n for n in nodes if n["key_preview"] == PREFIX[:8]]
    assert len(shared) == 1
    assert shared[0]["tokens"] >= 40 and shared[0]["tier"] == "device"
    assert shared[0]["hits"] >= 2  # the second and third prompts walked through it
    assert shared[0]["age_s"] >= 0 and shared[0]["lock_ref"] == 0 and shared[0]["retained_for_s"] is None
    device = page["tiers"]["device"]
    assert device["tokens"] == sum(n["tokens"] for n in nodes) == page["pool"]["cached"]
    assert device["capacity"] == page["pool"]["total"] == 4096
    assert page["retention"]["max_tokens"] == 4096 // 4
    # pages of two cover the same nodes in the same order
    paged, _ = _all_nodes(warm.url, limit=2)
    assert [n["id"] for n in paged] == [n["id"] for n in nodes]


@pytest.mark.parametrize(("query", "field"), [
    ("offset=-1", "offset"), ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=ten", "limit"),
    ("offset=1.5", "offset")])
def test_bad_page_values_are_400(warm: RunningServer, query: str, field: str) -> None:
    response = httpx.get(f"{warm.url}/cache?{query}", timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"] and error["type"] == "invalid_request_error"


def test_view_is_one_self_contained_page(warm: RunningServer) -> None:
    response = httpx.get(f"{warm.url}/cache/view", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "<script>" in page and "../cache?offset=" in page
    assert "src=" not in page and "<link" not in page and "http://" not in page and "https://" not in page


class _NodeCounter(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.node_ids: list[int] = []
        self.tier_rows: list[str] = []
        self.drawn_retained: list[int] = []
        self.loaded = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("data-node-id") is not None:
            self.node_ids.append(int(found["data-node-id"] or -1))
        if found.get("data-tier") is not None and "bar-row" in (found.get("class") or ""):
            self.tier_rows.append(found["data-tier"] or "")
        if found.get("data-node-id") is not None and "retained" in (found.get("class") or "").split():
            self.drawn_retained.append(int(found["data-node-id"] or -1))
        if tag == "body" and found.get("data-loaded") == "true":
            self.loaded = True


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", "--virtual-time-budget=4000", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian: apt-get install chromium); "
                           "the page's drawing is not checked")
def test_page_draws_every_node_in_chromium(tiered: RunningServer, tmp_path: Path) -> None:
    nodes, _ = _all_nodes(tiered.url)
    assert {n["tier"] for n in nodes} == {"device", "host"}
    dom = _chromium("--dump-dom", f"{tiered.url}/cache/view")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _NodeCounter()
    parsed.feed(dom.stdout)
    assert parsed.loaded, "the page never drew a snapshot: " + dom.stdout[-2000:]
    assert sorted(parsed.node_ids) == sorted(n["id"] for n in nodes)  # one element per node, no more
    assert parsed.tier_rows[:2] == ["device", "host"] and "retained" in parsed.tier_rows
    shot = tmp_path / "cache_view.png"
    taken = _chromium("--window-size=1100,700", f"--screenshot={shot}", f"{tiered.url}/cache/view")
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]


def test_metrics_carry_the_peers_prefix_cache_names(warm: RunningServer) -> None:
    stats = httpx.get(f"{warm.url}/get_server_info", timeout=30).json()["stats"]
    text = httpx.get(f"{warm.url}/metrics", timeout=30).text
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    queries, hits = samples["vllm:prefix_cache_queries_total"], samples["vllm:prefix_cache_hits_total"]
    assert queries.labels == {"model_name": "tiny", "engine": "0"}
    assert queries.value == stats["prompt_tokens_total"] >= 3 * 40
    assert hits.value == stats["cached_tokens_total"] >= 2 * 40  # tokens, as vLLM counts them
    rate = samples["sglang:cache_hit_rate"]
    assert rate.labels == {"model_name": "tiny"} and rate.value == pytest.approx(hits.value / queries.value)


def test_tiers_in_the_view_and_the_metrics(tiered: RunningServer) -> None:
    nodes, page = _all_nodes(tiered.url)
    host = [n for n in nodes if n["tier"] == "host"]
    assert host and page["tiers"]["host"]["capacity"] == 4096
    assert page["tiers"]["host"]["tokens"] == sum(n["tokens"] for n in host)
    assert page["tiers"]["device"]["tokens"] == sum(n["tokens"] for n in nodes if n["tier"] == "device")
    text = httpx.get(f"{tiered.url}/metrics", timeout=30).text
    samples = {(s.name, s.labels.get("tier")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("radixserve_kv_tier_demoted_tokens_total", None)] > 0
    assert samples[("radixserve_kv_tier_promoted_tokens_total", "host")] >= 40
    assert samples[("radixserve_kv_tier_hit_tokens_total", "host")] >= 40
    assert samples[("radixserve_kv_tier_tokens", "host")] > 0
    assert ("radixserve_kv_tier_disk_prefetched_total", None) in samples


@pytest.fixture(scope="module")
def restarted(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server with a disk tier retains a prompt (`retention_seconds`), stops, and a new one starts
    on the same folder: the tree comes back on the disk tier, with the retention's own deadline."""
    disk = tmp_path_factory.mktemp("kv-disk")
    kwargs = dict(model=str(tiny_folder), dtype="float32", kv_cache_tokens=320, kv_disk_dir=str(disk))
    with Engine(**kwargs) as engine, serve(engine, served_model_name="tiny") as first:
        response = httpx.post(f"{first.url}/generate", json={"input_ids": PREFIX + [60], "retention_seconds": 600,
                                                              "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
                              timeout=60)
        assert response.status_code == 200, response.text
        _generate(first.url, [7] * 20)  # not retained
    with Engine(**kwargs) as engine, serve(engine, served_model_name="tiny") as running:
        yield running


def test_disk_nodes_show_their_retention_after_a_restart(restarted: RunningServer) -> None:
    nodes, page = _all_nodes(restarted.url)
    disk = [n for n in nodes if n["tier"] == "disk"]
    assert disk and page["tiers"]["disk"]["tokens"] == sum(n["tokens"] for n in disk)
    retained = [n for n in disk if n["retained_for_s"] is not None]
    assert retained and all(500 < n["retained_for_s"] <= 600 for n in retained)
    assert [n["key_preview"] for n in retained] == [PREFIX[:8]]
    assert any(n["retained_for_s"] is None and n["key_preview"][:1] == [7] for n in disk)


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian: apt-get install chromium); "
                           "the page's drawing is not checked")
def test_page_draws_disk_nodes_in_chromium(restarted: RunningServer) -> None:
    nodes, _ = _all_nodes(restarted.url)
    dom = _chromium("--dump-dom", f"{restarted.url}/cache/view")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _NodeCounter()
    parsed.feed(dom.stdout)
    assert parsed.loaded and sorted(parsed.node_ids) == sorted(n["id"] for n in nodes)
    assert "disk" in parsed.tier_rows
    retained = {n["id"] for n in nodes if n["retained_for_s"] is not None}
    assert retained and retained == set(parsed.drawn_retained)  # drawn with the retained outline
