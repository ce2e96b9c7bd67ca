"""A request's local hits from its counter delta, mended where vLLM over-counted."""

from __future__ import annotations

from sessiongen.records.counters import local_hits


def test_an_over_counted_local_delta_is_bounded_by_the_usage() -> None:
    # the H100 run: 131,111-token prompt, usage 131,072 cached, the counter said 4x
    assert local_hits(524_288, 0, 131_072) == 131_072
    # a mixed hit: the connector loaded part, the counter over-counted the rest
    assert local_hits(40_960, 4_096, 8_192) == 4_096
    # a counter sum just above the usage is mended too, never below zero
    assert local_hits(10, 20, 15) == 0


def test_a_consistent_or_unknown_delta_stands_as_measured() -> None:
    assert local_hits(8_192, 0, 8_192) == 8_192  # CPU runs and pool-off replicas
    assert local_hits(0, 8_192, 8_192) == 0  # a pool hit on a cross-replica turn
    assert local_hits(4_096, 0, 8_192) == 4_096  # usage above the counters: kept
    assert local_hits(524_288, 0, None) == 524_288  # no usage to check against
    assert local_hits(None, 8_192, 8_192) is None
    assert local_hits(1_000, None, 500) == 500


def test_the_phase_histograms_are_read_as_sums_and_counts_over_their_labels() -> None:
    from sessiongen.client.counters import parse
    from sessiongen.records.counters import PHASES

    text = "\n".join(
        [
            "# HELP vllm:request_queue_time_seconds Queue time.",
            "# TYPE vllm:request_queue_time_seconds histogram",
            'vllm:request_queue_time_seconds_bucket{le="0.1",model_name="m"} 2.0',
            'vllm:request_queue_time_seconds_bucket{le="+Inf",model_name="m"} 3.0',
            'vllm:request_queue_time_seconds_sum{model_name="m"} 0.75',
            'vllm:request_queue_time_seconds_count{model_name="m"} 3.0',
            'vllm:request_queue_time_seconds_sum{model_name="other"} 0.25',
            'vllm:request_queue_time_seconds_count{model_name="other"} 1.0',
            "# TYPE vllm:prefix_cache_hits counter",
            'vllm:prefix_cache_hits_total{model_name="m"} 128.0',
        ]
    )
    out = parse(text)
    total, count = PHASES["queue"]
    assert out[total] == 1.0 and out[count] == 4.0  # summed over the labels
    assert out["vllm:prefix_cache_hits_total"] == 128.0
    assert not any(name.endswith("_bucket") for name in out)  # buckets are not kept
    assert PHASES["prefill"][0] not in out  # a replica without it lacks the row
