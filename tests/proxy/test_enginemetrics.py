"""enginemetrics: real-looking /metrics pages of vLLM, SGLang and llama.cpp -> EngineState."""

from __future__ import annotations

import json
import math
import random

import pytest

from flexinfer.proxy.enginemetrics import (
    _SAMPLE,
    _WANTED,
    EngineState,
    fresh,
    parse,
    parse_adapters,
    read_sample,
)


def _hist(name: str, labels: str, total: float, count: float) -> str:
    buckets = "".join(f'{name}_bucket{{{labels},le="{le}"}} {count if le == "+Inf" else 0.0}\n'
                      for le in ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "+Inf"))
    return (f"# HELP {name} Histogram.\n# TYPE {name} histogram\n{buckets}"
            f"{name}_count{{{labels}}} {count}\n{name}_sum{{{labels}}} {total}\n")


def vllm_v1(waiting: float = 2.0, running: float = 5.0, kv: float = 0.31, ttft: tuple[float, float] = (3.0, 6.0),
            itl: tuple[float, float] = (1.0, 50.0), models: tuple[str, ...] = ("Qwen/Qwen3-0.6B",)) -> str:
    """The shape vLLM v1 (0.10) serves: engine and model_name labels, the lora info gauge, counters."""
    out = ["# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"
           'vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9\n']
    for m in models:
        lab = f'engine="0",model_name="{m}"'
        out.append(f"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                   f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{lab}}} {running}\n"
                   f"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                   f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{lab}}} {waiting}\n"
                   f"# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                   f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{lab}}} {kv}\n"
                   f"# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
                   f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{lab}}} 1234.0\n"
                   f"# HELP vllm:prompt_tokens_created Number of prefill tokens processed.\n"
                   f"# TYPE vllm:prompt_tokens_created gauge\nvllm:prompt_tokens_created{{{lab}}} 1.7e9\n")
        out.append(_hist("vllm:time_to_first_token_seconds", lab, *ttft))
        out.append(_hist("vllm:inter_token_latency_seconds", lab, *itl))
        out.append(_hist("vllm:time_per_output_token_seconds", lab, 999.0, 1.0))  # deprecated twin: not used
        out.append(_hist("vllm:e2e_request_latency_seconds", lab, 40.0, 6.0))
    return "".join(out)


def test_vllm_v1_page() -> None:
    st = parse(vllm_v1(), None, 10.0)
    assert (st.engine, st.waiting, st.running, st.kv_usage) == ("vllm", 2.0, 5.0, 0.31)
    assert st.ttft_s == pytest.approx(0.5)  # first scrape: the engine's lifetime is the interval
    assert st.tpot_s == pytest.approx(0.02)  # inter_token_latency wins over time_per_output_token
    assert st.at == 10.0 and st.error is None and st.adapters == frozenset()


def test_vllm_v0_page_older_names() -> None:
    lab = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    page = ("# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
            f"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{{{lab}}} 0.75\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{lab}}} 12.0\n"
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{lab}}} 8.0\n"
            f"# TYPE vllm:num_requests_swapped gauge\nvllm:num_requests_swapped{{{lab}}} 0.0\n"
            + _hist("vllm:time_per_output_token_seconds", lab, 4.0, 100.0))
    st = parse(page, None, 1.0)
    assert (st.engine, st.waiting, st.running, st.kv_usage, st.ttft_s) == ("vllm", 12.0, 8.0, 0.75, None)
    assert st.tpot_s == pytest.approx(0.04)


def test_sums_over_label_sets_and_kv_is_the_max() -> None:
    st = parse(vllm_v1(waiting=3, running=4, kv=0.2) + vllm_v1(waiting=1, running=1, kv=0.9,
                                                              models=("other",)).replace('engine="0"', 'engine="1"'),
               None, 1.0)
    assert (st.waiting, st.running, st.kv_usage) == (4.0, 5.0, 0.9)
    assert st.ttft_s == pytest.approx(6.0 / 12.0)  # (3+3) / (6+6)


def test_ttft_tpot_are_deltas_over_the_interval() -> None:
    a = parse(vllm_v1(ttft=(10.0, 10.0), itl=(5.0, 100.0)), None, 1.0)
    assert a.ttft_s == pytest.approx(1.0)
    b = parse(vllm_v1(ttft=(10.4, 14.0), itl=(6.0, 200.0)), a, 2.0)  # 4 new TTFTs summing 0.4 s
    assert b.ttft_s == pytest.approx(0.1) and b.tpot_s == pytest.approx(0.01)
    idle = parse(vllm_v1(ttft=(10.4, 14.0), itl=(6.0, 200.0)), b, 3.0)  # nothing new: the last mean stays
    assert idle.ttft_s == pytest.approx(0.1) and idle.tpot_s == pytest.approx(0.01)
    restarted = parse(vllm_v1(ttft=(0.6, 2.0), itl=(0.3, 10.0)), idle, 4.0)  # counters went down
    assert restarted.ttft_s == pytest.approx(0.3) and restarted.tpot_s == pytest.approx(0.03)


def test_sglang_page() -> None:
    lab = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    page = ("# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{lab}}} 7.0\n"
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{{lab}}} 3.0\n"
            f"# TYPE sglang:token_usage gauge\nsglang:token_usage{{{lab}}} 0.28\n"
            f"# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput{{{lab}}} 355.1\n"
            f"# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate{{{lab}}} 0.01\n"
            + _hist("sglang:time_to_first_token_seconds", lab, 2.0, 4.0)
            + _hist("sglang:inter_token_latency_seconds", lab, 1.5, 100.0))
    st = parse(page, None, 1.0)
    assert (st.engine, st.waiting, st.running, st.kv_usage) == ("sglang", 3.0, 7.0, 0.28)
    assert st.ttft_s == pytest.approx(0.5) and st.tpot_s == pytest.approx(0.015)


def test_llamacpp_page() -> None:
    page = ("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 120\n"
            "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.\n"
            "# TYPE llamacpp:prompt_tokens_seconds gauge\nllamacpp:prompt_tokens_seconds 410.3\n"
            "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n"
            "# HELP llamacpp:kv_cache_tokens KV-cache tokens.\n# TYPE llamacpp:kv_cache_tokens gauge\n"
            "llamacpp:kv_cache_tokens 512\n"
            "# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
            "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
            "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 2\n")
    st = parse(page, None, 1.0)
    assert (st.engine, st.waiting, st.running, st.kv_usage, st.ttft_s, st.tpot_s) == (
        "llamacpp", 2.0, 1.0, 0.125, None, None)


def test_unknown_engine_is_all_unknown_not_idle() -> None:
    st = parse("# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3.2\n", None, 1.0)
    assert st.engine == "unknown" and st.error is None
    assert (st.waiting, st.running, st.kv_usage, st.ttft_s, st.tpot_s) == (None,) * 5


@pytest.mark.parametrize("page", [
    "<html><body>502 Bad Gateway</body></html>\n",
    "vllm:num_requests_waiting{model_name=\"m\"} not-a-number\n",
    "vllm:num_requests_waiting{model_name=\"m\" 3\n",
    vllm_v1() + "vllm:num_requests_running{engine=\"0\",model_name=\"m\",} }{ 1\n",
    "\x00\x01\x02 garbage\n",
    'vllm:num_requests_waiting{model_name="m",engine="0",model_name="n"} 3\n',  # a label given twice
    "vllm:num_requests_waiting 3 1700000000000 7\n",
])
def test_malformed_page_is_an_error_never_an_exception(page: str) -> None:
    prev = parse(vllm_v1(), None, 1.0)
    prev = EngineState(**{**{f: getattr(prev, f) for f in prev.__slots__}, "adapters": frozenset({"lora-a"})})
    st = parse(page, prev, 2.0)
    assert st.error == "malformed" and st.waiting is None and st.running is None and st.kv_usage is None
    assert st.adapters == frozenset({"lora-a"}) and st.ttft_total == prev.ttft_total  # carried over
    assert not fresh(st, 2.0)


def test_huge_page_is_cut_not_parsed() -> None:
    page = vllm_v1() + "vllm:request_prompt_tokens_bucket{le=\"1\"} 1\n" * 20_000
    assert parse(page, None, 1.0).error is None
    st = parse(page, None, 1.0, max_bytes=len(page) - 1)
    assert st.error == "too_large" and st.waiting is None


def test_too_many_recognised_samples_are_cut() -> None:
    page = "".join(f'vllm:num_requests_waiting{{model_name="m{i}"}} 1\n' for i in range(100))
    assert parse(page, None, 1.0, max_series=100).waiting == 100.0
    st = parse(page, None, 1.0, max_series=99)
    assert st.error == "too_large" and st.waiting is None


def test_nan_and_negative_samples_are_unknown_and_kv_is_clamped() -> None:
    st = parse('vllm:num_requests_waiting{a="1"} NaN\nvllm:num_requests_running{a="1"} -3\n'
               'vllm:kv_cache_usage_perc{a="1"} 1.7\n', None, 1.0)
    assert (st.engine, st.waiting, st.running, st.kv_usage) == ("vllm", None, None, 1.0)


def test_fresh() -> None:
    st = parse(vllm_v1(), None, 100.0)
    assert fresh(st, 100.0) and fresh(st, 102.0)
    assert not fresh(st, 102.01)  # older than 2 s: unknown
    assert fresh(st, 104.0, max_age=5.0)
    assert not fresh(st, 99.0)  # from the future (a clock mix-up): not believed
    assert not fresh(None, 100.0)


def test_adapters_from_vllm_models() -> None:
    body = json.dumps({"object": "list", "data": [
        {"id": "llama-8b", "object": "model", "created": 1, "owned_by": "vllm",
         "root": "/models/meta-llama/Llama-3.1-8B-Instruct", "parent": None, "max_model_len": 8192,
         "permission": [{"id": "modelperm-1", "object": "model_permission"}]},
        {"id": "sql-lora", "object": "model", "created": 1, "owned_by": "vllm", "root": "/adapters/sql",
         "parent": "llama-8b", "max_model_len": None, "permission": []},
    ]}).encode()
    assert parse_adapters(body) == frozenset({"sql-lora"})
    no_parent = b'{"object":"list","data":[{"id":"base","root":"base"},{"id":"lo","root":"base"},{"id":"x"}]}'
    assert parse_adapters(no_parent) == frozenset({"lo"})
    assert parse_adapters(b'{"object":"list","data":[{"id":"stub","object":"model","owned_by":"stub"}]}') == frozenset()
    for bad in (b"not json", b'{"data": 3}', b"[]", b'{"object":"list"}', b"[" * 100_000):
        assert parse_adapters(bad) is None


def _reference(line: str) -> list[tuple[str, float]] | None:
    """prometheus_client's reading of one sample line: (name, value) pairs, None when it refuses."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [(s.name, float(s.value)) for f in text_string_to_metric_families(line + "\n") for s in f.samples]
    except Exception:
        return None


def _ours(line: str) -> list[tuple[str, float]] | None:
    got = read_sample(line)
    return None if got is None else [got]


def _same(a: list[tuple[str, float]] | None, b: list[tuple[str, float]] | None) -> bool:
    """The same readings (NaN equal to NaN; -0 and 0 equal, as the parsers read them)."""
    return a is not None and b is not None and len(a) == len(b) and all(
        x[0] == y[0] and (x[1] == y[1] or (math.isnan(x[1]) and math.isnan(y[1]))) for x, y in zip(a, b, strict=True))


def _label_value(rnd: random.Random) -> str:
    return "".join(rnd.choice(['a', 'ü', ' ', ',', '=', '{', '}', '\\\\', '\\"', '\\n', '#']) for _ in range(rnd.randrange(6)))


def test_the_line_parser_reads_well_formed_lines_as_prometheus_client_does() -> None:
    """Lines of the format (any label set with escapes, any value, a timestamp or none) are read
    alike; mutated lines and lines with a label given twice are refused or read alike: never read
    differently, never accepted where prometheus_client refuses them."""
    rnd = random.Random(5)
    names = sorted(_WANTED)
    well_formed = []
    for _ in range(3000):
        pairs = ",".join(f'{name}="{_label_value(rnd)}"'
                         for name in rnd.sample(["a", "model_name", "engine", "_x9"], rnd.randrange(4)))
        labels = rnd.choice(["", f"{{{pairs}}}", f"{{{pairs},}}" if pairs else "{}"])
        value = rnd.choice(["0", "3", "1.5e3", "-2", "NaN", "+Inf", "-Inf", "1e-9", "17.25"])
        stamp = rnd.choice(["", " 1700000000000", "\t-5"])
        well_formed.append(f"{rnd.choice(names)}{labels}{rnd.choice([' ', chr(9), '  '])}{value}{stamp}")
    for line in well_formed:
        want, got = _reference(line), _ours(line)
        assert _same(got, want), line
    twice = [line.replace("{", '{a="1",a="2",', 1) for line in well_formed if "{" in line]
    assert twice and all(_reference(line) is None and _ours(line) is None for line in twice)
    checked = 0
    for _ in range(20000):
        chars = list(rnd.choice(well_formed))
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(chars))
            op = rnd.random()
            if op < 0.4:
                chars.insert(at, rnd.choice('{}",= \t\\n01a_.e+-:'))
            elif op < 0.8:
                del chars[at]
            else:
                chars[at] = rnd.choice('{}",= \t\\n01a_.e+-:')
        line = "".join(chars).strip()
        m = _SAMPLE.match(line)
        if m is None or m.group(0) not in _WANTED:
            continue
        checked += 1
        got = _ours(line)
        if got is not None:
            assert _same(got, _reference(line)), line
    assert checked > 2000
