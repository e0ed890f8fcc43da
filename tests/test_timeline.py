"""Idle windows from GPU samples, checked against known ground truth."""

import random

import pytest

from agent_otel.records import NS_PER_S, GpuSample
from agent_otel.gpu.timeline import IdleDetector, find_idle_windows

S = NS_PER_S
PERIOD = 1 / 6  # NVML's sample period on many GPUs


def nvml_like(busy, start_s, end_s, period_s=PERIOD, gpu="0"):
    """Samples as NVML takes them: every period, the busy fraction of the
    period ending at the sample's timestamp. ``busy`` lists (from, to) seconds."""
    samples, t = [], start_s + period_s
    while t <= end_s + 1e-9:
        overlap = sum(max(0.0, min(t, b) - max(t - period_s, a)) for a, b in busy)
        samples.append(GpuSample(gpu, round(t * S), overlap / period_s))
        t += period_s
    return samples


def seconds(windows):
    return [(w.gpu, w.start_ns / S, w.end_ns / S) for w in windows]


def test_a_stall_between_two_bursts_is_found_within_one_sample_period():
    # Busy 0-2 s, idle 2-5.03 s (the stall), busy 5.03-9 s.
    samples = nvml_like([(0, 2.0), (5.03, 9.0)], 0, 9)

    windows = find_idle_windows(samples, threshold=0.10, min_idle_s=0.5)

    assert len(windows) == 1
    window = windows[0]
    assert abs(window.start_ns / S - 2.0) <= PERIOD
    assert abs(window.end_ns / S - 5.03) <= PERIOD
    assert window.utilization_avg <= 0.10
    assert window.gpu == "0"


def test_stalls_shorter_than_the_minimum_are_ignored():
    # Idle 2-2.3 s (too short) and 4-5 s (long enough).
    samples = nvml_like([(0, 2.0), (2.3, 4.0), (5.0, 7.0)], 0, 7)

    windows = find_idle_windows(samples, threshold=0.10, min_idle_s=0.5)

    assert len(windows) == 1
    assert abs(windows[0].start_ns / S - 4.0) <= PERIOD
    assert abs(windows[0].end_ns / S - 5.0) <= PERIOD


def test_a_window_of_exactly_the_minimum_counts_and_one_just_shorter_does_not():
    def run(idle_until):
        busy_then_idle = [GpuSample("0", 1 * S, 1.0)]
        t = 1.0
        while t < idle_until - 1e-9:
            t += 0.1
            busy_then_idle.append(GpuSample("0", round(t * S), 0.0))
        busy_then_idle.append(GpuSample("0", round((t + 0.1) * S), 1.0))
        return find_idle_windows(busy_then_idle, threshold=0.1, min_idle_s=0.5)

    assert seconds(run(1.5)) == [("0", 1.0, 1.5)]
    assert run(1.4) == []


def test_a_sample_at_exactly_the_threshold_is_idle():
    samples = [GpuSample("0", i * S // 10, u) for i, u in enumerate([1.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.11])]

    windows = find_idle_windows(samples, threshold=0.1, min_idle_s=0.5)

    assert seconds(windows) == [("0", 0.0, 0.5)]
    assert windows[0].utilization_avg == pytest.approx(0.1)


def test_several_gpus_are_tracked_separately_and_carry_their_uuids():
    gpu0 = nvml_like([(0, 1.0), (3.0, 6.0)], 0, 6, gpu="0")
    gpu1 = nvml_like([(0, 2.0), (4.0, 6.0)], 0, 6, gpu="1")
    interleaved = sorted(gpu0 + gpu1, key=lambda s: s.timestamp_ns)

    windows = find_idle_windows(interleaved, threshold=0.1, min_idle_s=0.5, uuids={"0": "GPU-aaa", "1": "GPU-bbb"})

    assert [(w.gpu, w.uuid) for w in windows] == [("0", "GPU-aaa"), ("1", "GPU-bbb")]
    for window, (start, end) in zip(windows, [(1.0, 3.0), (2.0, 4.0)]):
        assert abs(window.start_ns / S - start) <= PERIOD
        assert abs(window.end_ns / S - end) <= PERIOD


def test_a_gap_in_the_samples_ends_a_window_and_nothing_is_assumed_inside_it():
    # Idle samples 0-2 s, nothing from 2 to 10 s (the sampler stalled, say),
    # idle 10-11 s, then busy.
    samples = [GpuSample("0", i * S // 10, 0.0) for i in range(0, 21)]
    samples += [GpuSample("0", i * S // 10, 0.0) for i in range(100, 111)]
    samples.append(GpuSample("0", 112 * S // 10, 1.0))

    windows = find_idle_windows(samples, threshold=0.1, min_idle_s=0.5, max_gap_s=3.0)

    assert seconds(windows) == [("0", 0.0, 2.0), ("0", 10.0, 11.0)]


def test_a_slow_log_is_not_read_as_all_gaps():
    # nvidia-smi dmon -d 5: a sample every 5 s; idle from 20 to 40 s.
    samples = [GpuSample("0", t * S, 0.0 if 20 < t <= 40 else 0.9) for t in range(0, 65, 5)]

    windows = find_idle_windows(samples, threshold=0.1, min_idle_s=0.5)

    assert seconds(windows) == [("0", 20.0, 40.0)]


def test_silence_filled_by_sparse_idle_samples_counts_back_to_the_last_busy_sample():
    # What the NVML source emits: busy samples every 1/6 s until 3.0 s, then
    # nothing until a synthetic 0% sample 1.2 s later, then one per 0.5 s poll.
    busy = nvml_like([(0, 3.0)], 0, 3.0)
    idle = [GpuSample("0", round(t * S), 0.0) for t in (4.2, 4.7, 5.2, 5.7)]
    resumed = [GpuSample("0", round(t * S), 1.0) for t in (5.9, 6.1)]

    windows = find_idle_windows(busy + idle + resumed, threshold=0.1, min_idle_s=0.5)

    assert len(windows) == 1
    assert windows[0].start_ns / S == pytest.approx(3.0, abs=PERIOD)
    assert windows[0].end_ns / S == pytest.approx(5.7)


def test_live_batches_find_the_same_windows_as_the_whole_log():
    truth = [(0, 1.3), (2.1, 2.4), (3.6, 6.0), (6.2, 7.0), (8.8, 9.0)]
    samples = nvml_like(truth, 0, 10, gpu="0") + nvml_like(truth[::2], 0, 10, gpu="1")
    samples.sort(key=lambda s: s.timestamp_ns)
    rng = random.Random(7)

    detector = IdleDetector(0.1, 0.5)
    live, i = [], 0
    while i < len(samples):
        batch = rng.randint(1, 6)  # one poll's worth
        live += detector.feed(samples[i : i + batch])
        i += batch
    live += detector.flush()

    offline = find_idle_windows(samples, threshold=0.1, min_idle_s=0.5)
    assert sorted(live, key=lambda w: (w.start_ns, w.gpu)) == offline
    expected = {
        "0": [(1.3, 2.1), (2.4, 3.6), (7.0, 8.8), (9.0, 10.0)],  # 6.0-6.2 is too short
        "1": [(1.3, 3.6), (6.0, 8.8), (9.0, 10.0)],
    }
    for gpu, spans in expected.items():
        found = [(w.start_ns / S, w.end_ns / S) for w in offline if w.gpu == gpu]
        assert len(found) == len(spans)
        for (start, end), (true_start, true_end) in zip(found, spans):
            assert abs(start - true_start) <= PERIOD and abs(end - true_end) <= PERIOD


def test_open_since_flush_and_shutdown():
    detector = IdleDetector(0.1, 0.5)
    assert detector.open_since("0") is None

    assert detector.feed([GpuSample("0", 1 * S, 0.8), GpuSample("0", 2 * S, 0.0)]) == []
    assert detector.open_since("0") == 1 * S  # idle since the busy sample ended
    assert detector.feed([GpuSample("0", 3 * S, 0.05)]) == []
    assert detector.open_since("1") is None

    [window] = detector.flush()
    assert (window.start_ns, window.end_ns) == (1 * S, 3 * S)
    assert window.utilization_avg == pytest.approx(0.025)
    assert detector.open_since("0") is None
    assert detector.flush() == []


def test_flush_cuts_at_the_end_of_observation():
    detector = IdleDetector(0.1, 0.5)
    detector.feed([GpuSample("0", t * S, 0.0) for t in range(0, 11)])

    [window] = detector.flush(end_ns=4 * S)

    assert (window.start_ns, window.end_ns) == (0, 4 * S)


def test_a_busy_sample_closes_the_window_at_the_previous_sample():
    detector = IdleDetector(0.1, 0.5)
    detector.feed([GpuSample("0", t * S // 10, 0.0) for t in range(0, 11)])

    closed = detector.feed([GpuSample("0", 12 * S // 10, 0.7)])

    assert seconds(closed) == [("0", 0.0, 1.0)]
    assert detector.open_since("0") is None


def test_a_stall_of_0_6_s_is_a_window_whatever_the_grid_phase():
    # Busy until 2.03 s, idle until 2.63 s: 0.6 s hold only two or three whole
    # sample periods of 1/6 s (0.33 or 0.5 s), but the busy periods at either
    # edge were partly idle, and with them the stall lasts 0.6 s: a window at
    # every phase of the grid, each edge within one period.
    for phase in (0.0, 0.04, 0.09, 0.13):
        samples = nvml_like([(0, 2.03), (2.63, 5.0)], phase, 5.0)
        [window] = find_idle_windows(samples, threshold=0.1, min_idle_s=0.5)
        assert window.start_ns / S == pytest.approx(2.03, abs=PERIOD)
        assert window.end_ns / S == pytest.approx(2.63, abs=PERIOD)


def test_a_stall_shorter_than_the_minimum_with_its_edges_is_still_no_window():
    for phase in (0.0, 0.04, 0.09, 0.13):
        samples = nvml_like([(0, 2.03), (2.5, 5.0)], phase, 5.0)  # 0.47 s
        assert find_idle_windows(samples, threshold=0.1, min_idle_s=0.5) == []


def test_a_busy_sample_between_two_idle_stretches_counts_for_the_first():
    # 0-0.4 s idle, a 0.5 sample (0.4-0.5 s), 0.5-0.9 s idle, then busy at 10%+ idle parts.
    first = [GpuSample("0", t * S // 10, 0.0) for t in range(0, 5)]
    between = [GpuSample("0", 5 * S // 10, 0.5)]
    second = [GpuSample("0", t * S // 10, 0.0) for t in range(6, 10)]
    end = [GpuSample("0", 10 * S // 10, 0.2)]

    windows = find_idle_windows(first + between + second + end, min_idle_s=0.45)

    # 0.4 s + 0.05 s counts for the first; the second has 0.4 s + 0.08 s of the last sample.
    assert seconds(windows) == [("0", 0.0, 0.4), ("0", 0.5, 0.9)]
    assert find_idle_windows(first + between + second + end, min_idle_s=0.47) == [windows[1]]


def test_samples_that_go_back_in_time_are_dropped():
    samples = [GpuSample("0", t * S, 0.0) for t in range(0, 5)]
    samples.append(GpuSample("0", 2 * S, 1.0))  # late and out of order: ignored

    detector = IdleDetector(0.1, 0.5)
    assert detector.feed(samples[:5]) == []
    assert detector.feed(samples[5:]) == []
    assert seconds(detector.flush()) == [("0", 0.0, 4.0)]


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_threshold_must_be_a_ratio(threshold):
    with pytest.raises(ValueError, match="ratio"):
        IdleDetector(threshold, 0.5)


@pytest.mark.parametrize(
    ("idle_ns", "is_window"), [(S // 2, True), (S // 2 - 1, False)], ids=["exactly min_idle", "1 ns shorter"]
)
def test_an_idle_stretch_exactly_min_idle_long_is_a_window_and_one_ns_shorter_is_not(idle_ns, is_window):
    # Busy samples at 100% around it, so no idle part of theirs counts toward the stretch.
    start = 10 * S
    samples = [
        GpuSample("0", start, 1.0),
        GpuSample("0", start + idle_ns // 2, 0.0),
        GpuSample("0", start + idle_ns, 0.0),
        GpuSample("0", start + S, 1.0),
    ]
    expected = [("0", start / S, (start + idle_ns) / S)] if is_window else []
    detector = IdleDetector(0.1, 0.5)
    assert seconds(detector.feed(samples) + detector.flush()) == expected
    assert seconds(find_idle_windows(samples, threshold=0.1, min_idle_s=0.5)) == expected
