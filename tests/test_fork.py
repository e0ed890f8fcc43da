"""fork() after instrument(): children never hang, export their own spans; the parent goes on.

Each scenario runs in a fresh interpreter (its own tracer provider, its own
threads to fork from). Children run under a hard timeout enforced by the
parent, so a child that hangs fails the test instead of hanging CI.
"""

import collections
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is not available on this platform")


def run_script(code: str, timeout: float = 240) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    outcome["stderr"] = result.stderr
    return outcome


def spans_in(path) -> list[dict]:
    spans = []
    with open(path) as lines:
        for line in lines:
            for resource_spans in json.loads(line)["resourceSpans"]:
                for scope_spans in resource_spans["scopeSpans"]:
                    spans += scope_spans["spans"]
    return spans


def tool_of(span: dict) -> str:
    return next(a["value"]["stringValue"] for a in span["attributes"] if a["key"] == "gen_ai.tool.name")


# Shared by the scenarios: an instrumented process whose threads hold every
# lock agent-otel has as often as they can (tool calls on four threads, pool
# submissions, /metrics scrapes, a simulated GPU sampled every 10 ms, a
# small export batch so the export thread is always busy).
BUSY_PARENT = """
    import json, os, signal, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from prometheus_client import generate_latest
    import agent_otel

    TRACES = "TRACES_PATH"
    handle = agent_otel.instrument(service_name="forking", traces_file=TRACES, traces_exporters="none",
                                   gpu="simulated", gpu_poll_interval=0.01, gpu_min_idle=0.01,
                                   export_batch_size=8, export_interval=0.05, frameworks=(),
                                   prometheus_port=0)

    @agent_otel.tool
    def parent_tool(x):
        return x

    @agent_otel.tool
    def child_tool(x):
        return x

    stop = threading.Event()
    parent_calls = [0] * 6

    def call_tools(slot):
        pool = ThreadPoolExecutor(2, thread_name_prefix=f"pool{slot}")
        while not stop.is_set():
            parent_tool(slot)
            pool.submit(parent_tool, slot).result()
            parent_calls[slot] += 2
        pool.shutdown()

    def scrape(slot):
        while not stop.is_set():
            generate_latest(handle.metrics.registry)

    def model_calls(slot):
        # The GPU busy 20 ms in 50: idle windows open and close all the time;
        # half of it through model calls (the model-call log's lock and the
        # simulated GPU following them, held as often as the tools' locks).
        gpu = handle.gpu_timeline.source
        while not stop.is_set():
            gpu.run_kernel(0.01)
            with agent_otel.model_span("parent-model", provider="test"):
                time.sleep(0.01)
            time.sleep(0.03)

    threads = [threading.Thread(target=call_tools, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=scrape, args=(4,)), threading.Thread(target=model_calls, args=(5,))]
    for thread in threads:
        thread.start()
    time.sleep(0.3)

    def wait_child(pid, timeout_s):
        # A child that does not finish in time is killed and counted as a hang.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "hang"
"""


def busy_parent(traces) -> str:
    return BUSY_PARENT.replace('"TRACES_PATH"', repr(str(traces)))


@pytest.mark.slow  # a stress test: half a minute of CPU
def test_two_hundred_forks_while_four_threads_make_tool_calls(tmp_path):
    traces = tmp_path / "traces.jsonl"
    result = run_script(
        busy_parent(traces)
        + """
    outcomes = {}
    for number in range(200):
        pid = os.fork()
        if pid == 0:
            # The child: a tool call, a scrape, a pool submission, then shutdown.
            code = 1
            try:
                child_tool(number)
                with agent_otel.model_span("child-model", provider="test"):
                    pass
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(child_tool, number).result()
                text = generate_latest(handle.metrics.registry).decode()
                assert 'tool="child_tool"' in text
                code = 0 if handle.shutdown(timeout_s=5.0) else 3
            finally:
                os._exit(code)
        outcome = wait_child(pid, 20.0)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    stop.set()
    for thread in threads:
        thread.join()
    calls = sum(parent_calls)
    parent_tool("after")
    shut = handle.shutdown()
    dropped = handle.metrics.registry.get_sample_value("agent_otel_spans_dropped_total", {"kind": "tool"})
    print(json.dumps({"outcomes": {str(k): v for k, v in outcomes.items()}, "parent_calls": calls + 1,
                      "parent_dropped": int(dropped), "shutdown": shut}))
    """,
        timeout=600,
    )
    assert result["outcomes"] == {"0": 200}, result  # no hang, no failure, every child's shutdown True
    assert result["shutdown"] is True, result["stderr"]
    spans = spans_in(traces)
    tools = [tool_of(s) for s in spans if s["name"].startswith("execute_tool")]
    # Every child exported its own two calls; every call of the parent is in
    # the file or counted as dropped (a tiny export batch can fall behind four
    # threads calling as fast as they can).
    assert tools.count("child_tool") == 400
    assert [s["name"] for s in spans].count("chat child-model") == 200  # and its model call
    assert tools.count("parent_tool") + result["parent_dropped"] == result["parent_calls"]
    assert tools.count("parent_tool") > result["parent_calls"] / 2


def test_a_prefork_child_exports_its_spans_while_it_runs(tmp_path):
    """A long-lived worker (gunicorn --preload style): its export, pipeline and GPU
    sampling restart by themselves; spans reach the file while it still runs."""
    traces = tmp_path / "traces.jsonl"
    result = run_script(
        busy_parent(traces)
        + f"""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            from agent_otel.capture.current import current_recorder
            names = {{t.name for t in threading.enumerate()}}
            for i in range(2000):
                child_tool(i)
            # No flush, no shutdown: the restarted threads do the work.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (current_recorder().finished or handle.span_processors[0].pending):
                time.sleep(0.01)
            calls = handle.metrics.registry.get_sample_value(
                "agent_tool_calls_total", {{"tool": "child_tool", "outcome": "ok"}})
            report = {{"threads": sorted(names), "finished_left": len(current_recorder().finished),
                      "counted": calls}}
            os.write(ready_w, (json.dumps(report) + "\\n").encode())
            time.sleep(0.5)  # still alive while the parent reads the file (read at once)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    child = json.loads(os.read(ready_r, 65536).decode())
    with open({str(traces)!r}) as file:
        exported_while_alive = file.read().count("execute_tool child_tool")
    outcome = wait_child(pid, 30.0)
    stop.set()
    for thread in threads:
        thread.join()
    handle.shutdown()
    print(json.dumps({{"child": child, "exported_while_alive": exported_while_alive, "outcome": outcome}}))
    """
    )
    child = result["child"]
    assert result["outcome"] == 0
    assert {"agent-otel-span-export", "agent-otel-pipeline", "agent-otel-gpu-sampler"} <= set(child["threads"])
    assert child["finished_left"] == 0  # the pipeline drained the child's calls: no growing queue
    assert child["counted"] == 2000  # counted in the child's metrics, by the restarted pipeline
    # The 2000 spans are in lines of many spans each: count spans, not lines.
    assert len([s for s in spans_in(traces) if s["name"] == "execute_tool child_tool"]) == 2000
    assert result["exported_while_alive"] > 0


def test_multiprocessing_with_the_fork_start_method(tmp_path):
    """Process and Pool children (which end with os._exit, no atexit) flush their spans as they exit."""
    traces = tmp_path / "traces.jsonl"
    result = run_script(
        busy_parent(traces)
        + """
    import multiprocessing
    context = multiprocessing.get_context("fork")

    def work(count):
        for i in range(count):
            child_tool(i)

    processes = [context.Process(target=work, args=(50,)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    codes = [process.exitcode for process in processes]
    pool = context.Pool(2)
    squares = pool.map(child_tool, range(100))
    pool.close()
    pool.join()
    stop.set()
    for thread in threads:
        thread.join()
    handle.shutdown()
    print(json.dumps({"codes": codes, "pool_ok": squares == list(range(100))}))
    """
    )
    assert result["codes"] == [0, 0, 0, 0] and result["pool_ok"], result
    tools = [tool_of(s) for s in spans_in(traces) if s["name"].startswith("execute_tool")]
    assert tools.count("child_tool") == 4 * 50 + 100


GPU_SEARCH_FORK = """
    import json, os, sys, threading, time
    sys.path.insert(0, {helpers!r})
    from nvml_driver import DriverGpu, StandInNvml
    sys.modules["pynvml"] = StandInNvml([DriverGpu(time.time_ns, period_s=0.02)])  # a GPU for gpu="auto"
    import agent_otel
    from agent_otel.wiring import instrumentation

    begin, entered = threading.Event(), threading.Event()
    run = instrumentation.GpuStart._run
    def held_run(self):  # the search {when}
        {hold}
        run(self)
    instrumentation.GpuStart._run = held_run
    search = instrumentation._start_gpu_timeline
    def slow_search(handle):
        entered.set()
        time.sleep(0.3)
        search(handle)
    instrumentation._start_gpu_timeline = slow_search

    handle = agent_otel.instrument(traces_exporters="none", frameworks=())  # gpu="auto"
    {before_fork}
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        begin.set()  # the child's copy: a search started here is not held
        code = 1
        try:
            found = handle.wait_for_gpu(5.0)
            time.sleep(0.2)
            alive = [t.name for t in threading.enumerate()]
            print(json.dumps({{"found": found is not None, "threads": alive}}), flush=True)
            code = 0
        finally:
            os._exit(code)
    fork_s = time.monotonic() - started
    begin.set()
    _, status = os.waitpid(pid, 0)
    handle.wait_for_gpu(5.0)
    print(json.dumps({{"fork_s": fork_s, "parent_found": handle.gpu_timeline is not None,
                      "child_exit": os.waitstatus_to_exitcode(status)}}))
    handle.shutdown()
"""


@pytest.mark.parametrize("when", ["not begun", "under way"])
def test_a_child_forked_during_the_gpu_search_samples_the_gpu(when):
    """gpu="auto" looks for the GPU on a thread after instrument() returns; a
    worker forked meanwhile (gunicorn --preload) still samples the GPU: the
    fork does not wait for the search (NVML may hang), the child searches
    itself."""
    helpers = os.path.join(os.path.dirname(__file__), "helpers")
    if when == "not begun":  # the parent's search thread waits before it begins; the fork comes first
        code = GPU_SEARCH_FORK.format(helpers=helpers, when=when, hold="begin.wait()", before_fork="")
    else:  # the parent's search is in its slow part when the fork comes
        code = GPU_SEARCH_FORK.format(helpers=helpers, when=when, hold="", before_fork="entered.wait(10)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    child, parent = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert parent["child_exit"] == 0 and parent["parent_found"], result.stderr
    assert child["found"], result.stderr
    assert "agent-otel-gpu-sampler" in child["threads"]


SLOW_ENCODER_IMPORT_FORK = """
    import importlib.abc, importlib.machinery, json, os, sys, threading, time

    importing = threading.Event()

    class SlowMsgspec(importlib.abc.MetaPathFinder):
        # msgspec's import takes 0.5 s (a cold disk): a fork lands in the middle of it.
        def find_spec(self, name, path, target=None):
            if name != "msgspec":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module
            def exec_module(module):
                importing.set()
                time.sleep(0.5)
                run(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, SlowMsgspec())
    import agent_otel

    handle = agent_otel.instrument(traces_file={traces!r}, traces_exporters="none", gpu="off", frameworks=(),
                                   export_interval=0.05)

    @agent_otel.tool
    def search(q):
        return q

    search("parent")  # the first export, on the export thread, imports msgspec
    assert importing.wait(10)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            search("child")
            code = 0 if handle.span_processors[0].force_flush(5000) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        status = None
    handle.shutdown()
    print(json.dumps({{"child_exit": None if status is None else os.waitstatus_to_exitcode(status)}}))
"""


def test_a_fork_while_the_export_thread_imports_its_encoder_does_not_stall_the_child(tmp_path):
    traces = tmp_path / "traces.jsonl"
    result = run_script(SLOW_ENCODER_IMPORT_FORK.format(traces=str(traces)), timeout=60)
    assert result["child_exit"] == 0, result["stderr"]  # its flush went through: no import lock held for good
    names = [s["name"] for s in spans_in(traces)]
    assert names.count("execute_tool search") == 2  # the parent's span and the child's


SLOW_METRICS_IMPORT_FORK = """
    import importlib.abc, importlib.machinery, json, os, sys, threading, time

    importing = threading.Event()

    class SlowImport(importlib.abc.MetaPathFinder):
        # prometheus_client.core's import takes 0.5 s (a cold disk): a fork lands in the middle of it.
        def find_spec(self, name, path, target=None):
            if name != "prometheus_client.core":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module
            def exec_module(module):
                importing.set()
                time.sleep(0.5)
                run(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, SlowImport())
    import agent_otel

    # The metrics are made by the first part that counts: here the GPU sampler's thread, at its first poll.
    handle = agent_otel.instrument(traces_file={traces!r}, traces_exporters="none", gpu="simulated",
                                   gpu_poll_interval=0.05, frameworks=())
    assert importing.wait(10)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            timeline = handle.wait_for_gpu(5)
            polls = timeline.sampler.polls
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and timeline.sampler.polls < polls + 5:
                time.sleep(0.01)
            code = 0 if timeline.sampler.polls >= polls + 5 else 2  # 2: the child's sampler hangs
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        status = None
    handle.shutdown()
    print(json.dumps({{"child_exit": None if status is None else os.waitstatus_to_exitcode(status)}}))
"""


def test_a_fork_while_the_gpu_sampler_first_makes_the_metrics_does_not_stall_the_childs_sampling(tmp_path):
    # The sampler's first poll sets a gauge, which makes the metrics, which
    # imports prometheus_client's modules on the sampler's thread: a fork then
    # would leave an import lock held in the child, whose sampler would wait on it for good.
    traces = tmp_path / "traces.jsonl"
    result = run_script(SLOW_METRICS_IMPORT_FORK.format(traces=str(traces)), timeout=60)
    assert result["child_exit"] == 0, result["stderr"]


def test_prefork_workers_sharing_a_gpu_are_reported_with_its_idle_time_once(tmp_path, capsys):
    """Workers forked after instrument() each sample the GPU (here the
    simulated one, idle throughout) and write its gpu.idle windows: the
    report over their common traces file counts each idle second once and
    blames it on the calls of every worker, not N times over."""
    from agent_otel.commands.cli import main

    traces = tmp_path / "traces.jsonl"
    run_script(
        f"""
        import json, os, sys, time
        import agent_otel
        handle = agent_otel.instrument(service_name="api", traces_file={str(traces)!r}, traces_exporters="none",
                                       gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.05,
                                       export_interval=0.1, frameworks=())

        @agent_otel.tool
        def search(seconds):
            time.sleep(seconds)

        time.sleep(0.3)
        children = []
        for worker in range(3):
            pid = os.fork()
            if pid == 0:
                time.sleep(0.3)
                search(1.0)
                time.sleep(0.3)
                sys.exit(0)  # flushes its spans
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        time.sleep(0.3)
        handle.shutdown()
        print(json.dumps({{}}))
        """
    )
    spans = spans_in(traces)
    windows = [s for s in spans if s["name"] == "gpu.idle" and not s.get("parentSpanId")]
    stretches = sorted((int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for s in windows)
    # The workers wrote windows of their own, over the parent's: some overlap.
    assert any(b_start < a_end for (_, a_end), (b_start, _) in zip(stretches, stretches[1:]))
    calls = [
        (int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for s in spans if s["name"] == "execute_tool search"
    ]
    assert len(calls) == 3
    union_of_calls = max(end for _, end in calls) - min(start for start, _ in calls)

    assert main(["report", str(traces), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (gpu,) = report["gpus"]
    run_s = (max(int(s["endTimeUnixNano"]) for s in spans) - min(int(s["startTimeUnixNano"]) for s in spans)) / 1e9
    assert gpu["idle_s"] <= run_s + 0.01  # once, not once per process (about 4x the run)
    assert gpu["idle_s"] >= 0.5 * run_s  # the simulated GPU idled all along
    (tool,) = report["tools"]
    assert 0.5 <= tool["gpu_idle_blocked_s"] <= union_of_calls / 1e9 + 0.01  # the three overlapping calls: about 1 s


def test_where_the_chosen_traces_file_is_is_said_once_not_by_every_child(tmp_path):
    # No exporter named and no endpoint: the spans go to the file agent-otel
    # picks, and the process says where at exit. Forked workers append to it.
    from agent_otel.wiring import sinks

    if sinks.collector_answers("localhost", 4317):
        pytest.skip("something listens on localhost:4317 here: the spans would be exported to it")
    code = """
        import os, sys
        import agent_otel
        agent_otel.instrument(service_name="api", gpu="off", frameworks=())

        @agent_otel.tool
        def search():
            return 1

        search()
        children = []
        for worker in range(3):
            pid = os.fork()
            if pid == 0:
                search()
                sys.exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = ""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("so the traces are in") == 1, result.stderr
    (traces,) = (tmp_path / "agent-otel-traces").glob("*.jsonl")
    assert len([s for s in spans_in(traces) if s["name"] == "execute_tool search"]) == 4  # the children's too


@pytest.mark.parametrize("mode", ["self", "at-import"])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_export_every_span_under_each_start_method(tmp_path, method, mode):
    """Workers export all their spans, whether they call instrument() themselves (a target,
    a pool's initializer) or the application's main module does as it is imported (in the
    parent, and again in each spawned or forkserver worker): those that return (os._exit
    under fork and forkserver, Python 3.14's default), those that run for several export
    intervals, and those their pool or parent terminates."""
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method on this platform")
    traces = tmp_path / "traces.jsonl"
    script = os.path.join(os.path.dirname(__file__), "helpers", "start_method_workers.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    result = subprocess.run(
        [sys.executable, script, method, str(traces), mode], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["exit_codes"] == [0, 0] and outcome["pool"], outcome
    assert outcome["terminated"] == -signal.SIGTERM  # still ended by SIGTERM, after it flushed
    tools = collections.Counter(tool_of(s) for s in spans_in(traces))
    assert tools == {"short_tool": 400, "long_tool": 400, "pool_tool": 400, "terminated_tool": 100}, result.stderr


def test_what_multiprocessing_keeps_for_a_worker_exit_does_not_keep_old_handles_alive():
    import gc
    import multiprocessing.util as mp_util

    import agent_otel

    def registered() -> int:
        gc.collect()
        return len(mp_util._afterfork_registry)

    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    agent_otel.uninstrument()
    before = registered()
    for _ in range(5):
        agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
        agent_otel.uninstrument()
    assert registered() == before
