"""The plugin's pure parts (settings, request fields, status line, metrics endpoint,
the check of vLLM's surface) and the async-scheduling variant."""

from __future__ import annotations

import abc
import json
import socket

import httpx
import pytest

from tests.integrations.vllm.harness import add, make_request, make_scheduler, runner_output
from tests.user_policies import install_module
from tokenfair.core.cost import make_cost
from tokenfair.core.policies import make_policy
from tokenfair.core.policies.catalog import BUILTINS
from tokenfair.integrations.vllm import FairAsyncScheduler
from tokenfair.integrations.vllm.config import PluginConfigError, load_plugin_config
from tokenfair.integrations.vllm.driver import PolicyDriver
from tokenfair.integrations.vllm.fields import output_hint_of, tenant_of
from tokenfair.integrations.vllm.metrics import format_status, serve_prometheus
from tokenfair.integrations.vllm.policies import VllmFCFS, VllmPriority
from tokenfair.integrations.vllm.surface import check_vllm, surface_problems


def test_defaults_without_a_tokenfair_entry():
    config = load_plugin_config({})
    assert (config.policy, config.default_tenant, config.cached_token_share) == (
        "vtc",
        "default",
        1.0,
    )
    assert load_plugin_config(None) == config


def test_settings_inline_from_a_file_and_both(tmp_path):
    inline = load_plugin_config({"tokenfair": {"policy": "wvtc", "weights": {"a": 2}}})
    assert inline.weights == {"a": 2.0}
    file = tmp_path / "tokenfair.yaml"
    file.write_text("policy: vtc-predict\ndefault_tenant: anon\n")
    assert load_plugin_config({"tokenfair": str(file)}).policy == "vtc-predict"
    both = load_plugin_config({"tokenfair": {"file": str(file), "default_tenant": "x"}})
    assert (both.policy, both.default_tenant) == ("vtc-predict", "x")
    as_json = tmp_path / "tokenfair.json"
    as_json.write_text(json.dumps({"policy": "fcfs"}))
    assert load_plugin_config({"tokenfair": str(as_json)}).policy == "fcfs"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"polcy": "vtc"}, "tokenfair.polcy: Extra inputs are not permitted"),
        ({"weights": {"a": 0}}, "tokenfair.weights.a: must be a number from 0.01 to 100"),
        ({"weights": {"a": 1e-300}}, "tokenfair.weights.a: must be a number from 0.01 to 100"),
        ({"weights": {"a": True}}, "tokenfair.weights.a: must be a number from 0.01 to 100"),
        ({"w_out": True}, "tokenfair.w_out: expected a number, got the boolean true"),
        ({"policy": "wvtc"}, "tokenfair.weights: policy 'wvtc' needs tenant weights"),
        ({"policy": "rpm:5"}, "tokenfair.policy: 'rpm:5' is not supported inside vLLM"),
        ({"policy": "vtc-preempt"}, "not supported inside vLLM"),
        ({"policy": "nope"}, "not supported inside vLLM"),
        ({"w_out": -1}, "tokenfair.w_out: Input should be greater than or equal to 0"),
        ({"metrics_port": 0}, "tokenfair.metrics_port"),
        ("/no/such/file.yaml", "cannot read config file /no/such/file.yaml"),
        (7, "expected a mapping of settings or a file path"),
    ],
)
def test_every_bad_setting_is_one_line_naming_the_key(entry, message):
    with pytest.raises(PluginConfigError) as error:
        load_plugin_config({"tokenfair": entry})
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_the_plugin_runs_the_policies_that_declare_it(name: str) -> None:
    """A built-in policy runs inside vLLM exactly when its declaration says so: the
    plugin keeps no list of its own."""
    declared = BUILTINS[name]
    spec = f"{name}:20" if declared.argument is not None else name
    entry = {"policy": spec, "weights": {"a": 2.0}}
    if declared.needs.vllm:
        plugin = load_plugin_config({"tokenfair": entry}).make_plugin_policy()
        assert plugin.policy.name.startswith(name)
    else:
        with pytest.raises(PluginConfigError, match="is not supported inside vLLM"):
            load_plugin_config({"tokenfair": entry})


def test_a_users_policy_class_runs_as_a_core_policy(tmp_path, monkeypatch):
    module = install_module(tmp_path, monkeypatch)
    config = load_plugin_config(
        {"tokenfair": {"policy": f"{module}:Newest(scale=2)", "weights": {"a": 2}}}
    )
    assert config.user_policy and config.policy_name == f"{module}:Newest(scale=2)"
    plugin = config.make_plugin_policy()
    # vLLM's FCFS mode, `running` kept in the policy's victim order, no prefix cache.
    assert type(plugin.policy).__name__ == "Newest" and plugin.policy.scale == 2
    assert (plugin.vllm_priority, plugin.sorts_running, plugin.prefix_cache) == (
        False,
        True,
        False,
    )
    assert plugin.policy.settings.weights == {"a": 2.0}
    assert plugin.policy.settings.cost == make_cost("linear", 1.0, 2.0)
    # One that overrides attach_prefix_cache (as before declarations) gets the view of
    # vLLM's prefix cache.
    cached = load_plugin_config({"tokenfair": {"policy": f"{module}:Cached"}})
    assert cached.make_plugin_policy().prefix_cache
    # So does one declaring `Needs(prefix_cache=True)`.
    declared = load_plugin_config({"tokenfair": {"policy": f"{module}:DeclaresTheCache"}})
    assert declared.make_plugin_policy().prefix_cache
    assert load_plugin_config({"tokenfair": {"policy": "dlpm"}}).make_plugin_policy().prefix_cache
    assert not load_plugin_config({}).make_plugin_policy().prefix_cache
    with pytest.raises(PluginConfigError) as error:
        load_plugin_config({"tokenfair": {"policy": f"{module}:Newest(scale=0)"}})
    assert str(error.value) == (
        f"tokenfair.policy: policy '{module}:Newest(scale=0)': scale must be > 0, got 0"
    )
    # One that declares it cannot run inside vLLM is refused, as rpm is.
    with pytest.raises(PluginConfigError, match="NotInVllm' is not supported inside vLLM"):
        load_plugin_config({"tokenfair": {"policy": f"{module}:NotInVllm"}})
    with pytest.raises(PluginConfigError, match="cannot import module 'tf_nope'"):
        load_plugin_config({"tokenfair": {"policy": "tf_nope:P"}})


def test_a_bad_file_names_the_file_and_line(tmp_path):
    file = tmp_path / "bad.json"
    file.write_text('{\n "policy": \n}')
    with pytest.raises(PluginConfigError, match=r"bad.json:3: invalid JSON"):
        load_plugin_config({"tokenfair": str(file)})
    file.write_text('{"weights": {"a": "heavy"}}')
    with pytest.raises(PluginConfigError, match=r"bad.json: tokenfair.weights.a:"):
        load_plugin_config({"tokenfair": str(file)})
    # A key given twice is refused, not the last one kept.
    file.write_text('{"policy": "fcfs", "policy": "vtc"}')
    with pytest.raises(PluginConfigError, match=r"bad.json: the key 'policy' is given twice"):
        load_plugin_config({"tokenfair": str(file)})
    as_yaml = tmp_path / "bad.yaml"
    as_yaml.write_text("policy: fcfs\nweights: {a: 2}\npolicy: vtc\n")
    with pytest.raises(PluginConfigError, match=r"bad.yaml:3: the key 'policy' is given twice"):
        load_plugin_config({"tokenfair": str(as_yaml)})


def test_tenant_and_hint_fields():
    assert tenant_of(None, "tenant", "d") == ("d", None)
    assert tenant_of({"tenant": " team-a "}, "tenant", "d") == ("team-a", None)
    assert tenant_of({"tenant": ""}, "tenant", "d") == ("d", None)
    assert tenant_of({"tenant": 12}, "tenant", "d") == ("12", None)
    tenant, problem = tenant_of({"tenant": {"x": 1}}, "tenant", "d")
    assert tenant == "d" and "must be a string" in problem
    assert tenant_of({"user": "u"}, "user", "d") == ("u", None)
    assert output_hint_of({"predicted_output_tokens": 40}) == 40
    assert output_hint_of({"predicted_output_tokens": -3}) is None
    assert output_hint_of({"predicted_output_tokens": True}) is None


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1+cpu", "0.33.0rc1", "0.33.2", "0.34.0"])
def test_a_tested_minor_runs_silently(version):
    assert check_vllm(version, []) is None


@pytest.mark.parametrize("version", ["0.35.0", "1.0.0", "0.31.2", "dev"])
def test_an_untested_minor_with_the_surface_runs_with_one_warning(version):
    warning = check_vllm(version, [])
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"tokenfair was tested with vLLM 0.32 to 0.34; vLLM {version}'s")


def test_a_missing_surface_is_refused_in_one_line_naming_it():
    with pytest.raises(ImportError) as error:
        check_vllm("0.35.0", ["Scheduler._free_request()", "Request.block_hashes"])
    message = str(error.value)
    assert message == (
        "tokenfair.integrations.vllm cannot run on vLLM 0.35.0: its scheduler lacks "
        "Scheduler._free_request(); Request.block_hashes (tested with vLLM 0.32 to 0.34)"
    )


def test_this_vllm_has_the_surface():
    from vllm.v1.core.block_pool import BlockPool

    assert surface_problems() == []
    assert surface_problems(block_pool=BlockPool) == []


def test_the_surface_check_sees_through_a_wrapped_init():
    # Test harnesses and profilers wrap vLLM's __init__ (vLLM's conformance run does).
    from vllm.v1.core.sched.scheduler import Scheduler

    class Wrapped(Scheduler):
        pass

    original = Scheduler.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)

    Wrapped.__init__ = init
    assert surface_problems(Wrapped) == []


def test_the_surface_check_names_what_a_scheduler_lacks():
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.sched.request_queue import RequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler

    class Renamed(Scheduler):
        _free_request = None  # type: ignore[assignment]

        def update_from_output(self, output, runner_output):  # type: ignore[override]
            return None

    class BareRequest:
        def __init__(self):
            self.request_id = "r"

    class WiderQueue(RequestQueue):
        @abc.abstractmethod
        def drain(self): ...

    class OtherPool(BlockPool):
        def cache_full_blocks(self, request, blocks, block_size):  # type: ignore[override]
            return None

    problems = surface_problems(Renamed, BareRequest, WiderQueue, OtherPool)
    assert "Scheduler._free_request()" in problems
    assert (
        "Scheduler.update_from_output(scheduler_output, model_runner_output, ...) "
        "(found (output, runner_output))" in problems
    )
    assert "Request.block_hashes" in problems and "Request.request_id" not in problems
    assert "RequestQueue.drain (not implemented by PolicyQueue)" in problems
    assert any(
        p.startswith("BlockPool.cache_full_blocks(request, blocks, num_cached_blocks")
        for p in problems
    )


def test_a_scheduler_with_an_unknown_waiting_queue_is_refused(tiny_model_dir):
    from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue

    from tokenfair.integrations.vllm import FairScheduler

    class WithAnotherQueue(FairScheduler):
        def __init__(self, *args, **kwargs):
            self.side_waiting = create_request_queue(SchedulingPolicy.FCFS)
            super().__init__(*args, **kwargs)

    with pytest.raises(
        RuntimeError, match=r"a waiting queue the plugin does not know \(side_waiting\)"
    ):
        make_scheduler(tiny_model_dir, WithAnotherQueue)


def make_core_request(request_id: str, *, priority: int = 0, arrival: float = 0.0):
    from tokenfair.core.request import Request as CoreRequest
    from tokenfair.core.request import SamplingParams as CoreSampling

    return CoreRequest(request_id, "t", 8, arrival, CoreSampling(max_tokens=4), priority=priority)


def _driver_with_two_tenants() -> PolicyDriver[str]:
    driver: PolicyDriver[str] = PolicyDriver(make_policy("vtc"))
    for rid, tenant, prompt in (("r1", "a", 10), ("r2", "b", 4), ("r3", "a", 6)):
        driver.arrive(rid, rid, tenant=tenant, prompt_tokens=prompt, max_tokens=8)
    driver.pop()
    driver.started("r1")
    driver.produced("r1", 3)
    return driver


def test_the_driver_charges_a_prompt_once_though_the_request_is_put_back_and_started_again():
    driver = _driver_with_two_tenants()  # r1 (a, 10 prompt tokens) started, 3 out
    paid = driver.counters()["a"]
    first_seq = driver.view("r1").admit_seq
    assert driver.put_back("r1")  # preempted: it had started
    driver.started("r1")  # vLLM runs it again (its prompt computed again)
    assert driver.counters()["a"] == paid  # the recompute is the system's doing
    assert driver.view("r1").admit_seq > first_seq  # the newest start: first victim
    assert driver.tenants()["a"].prompt_tokens == 10  # counted once, too


def test_status_line():
    driver = _driver_with_two_tenants()
    line = format_status("vtc", driver.counters(), driver.tenants())
    assert line.startswith(
        "tokenfair vtc: 2 tenants, 1 running, 2 waiting | a: counter 16 in 10 out 3"
    )
    assert "| b: counter 0 in 0 out 0 run 0 wait 1" in line


def test_prometheus_endpoint():
    driver = _driver_with_two_tenants()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = serve_prometheus(driver, "127.0.0.1", port, "0")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        server.shutdown()
    assert 'tokenfair_vllm_counter{engine="0",tenant="a"} 16.0' in text
    assert 'tokenfair_vllm_output_tokens_total{engine="0",tenant="a"} 3.0' in text
    assert 'tokenfair_vllm_waiting{engine="0",tenant="b"} 1.0' in text
    with pytest.raises(OSError, match=r"tokenfair\.metrics_port: cannot serve metrics"):
        busy = serve_prometheus(driver, "127.0.0.1", port, "0")
        try:
            serve_prometheus(driver, "127.0.0.1", port, "0")
        finally:
            busy.shutdown()


def test_async_scheduler_variant_charges_exactly(tiny_model_dir):
    """Async scheduling: step N+1 is scheduled before step N's output arrives."""
    fair = make_scheduler(tiny_model_dir, FairAsyncScheduler, num_blocks=24, max_num_seqs=3)
    workload = [(f"{t}{i}", t, 20 + 10 * i, 30) for t in "ab" for i in range(3)]
    requests = add(fair, [make_request(fair, r, t, p, o) for r, t, p, o in workload])
    in_flight = None
    for _ in range(2000):
        if not fair.has_requests() and in_flight is None:
            break
        output = fair.schedule()
        result = runner_output(fair, output)
        if in_flight is not None:
            fair.update_from_output(*in_flight)
        in_flight = (output, result)
        if not fair.has_requests():
            fair.update_from_output(*in_flight)
            in_flight = None
    assert all(r.num_output_tokens == 30 for r in requests)
    counters = fair.driver.counters()
    for tenant in "ab":
        assert counters[tenant] == sum(p + 2 * o for _, t, p, o in workload if t == tenant)


@pytest.mark.parametrize(
    ("policy", "vllm_priority", "sorts_running", "kind"),
    [
        ("fcfs", False, False, VllmFCFS),
        ("priority", True, False, VllmPriority),
        ("vtc", False, True, None),
        ("sjf:20", False, True, None),
    ],
)
def test_each_policy_says_how_vllms_loop_runs(policy, vllm_priority, sorts_running, kind):
    plugin = load_plugin_config({"tokenfair": {"policy": policy}}).make_plugin_policy()
    assert (plugin.vllm_priority, plugin.sorts_running) == (vllm_priority, sorts_running)
    if kind is not None:
        assert type(plugin.policy) is kind
    else:
        assert plugin.policy.name == policy.partition(":")[0]


def test_vllm_fcfs_puts_the_last_put_back_first_as_vllms_deque_does():
    policy = VllmFCFS()
    requests = [make_core_request(f"r{i}") for i in range(5)]
    for request in requests[:3]:
        policy.add(request, 0.0)
    taken = [policy.pop(), policy.pop()]  # r0, r1
    policy.add(requests[3], 0.0)
    for request in taken:  # put back r0, then r1: r1 ends up in front
        policy.requeue(request)
    assert [r.request_id for r in policy.waiting_requests()] == ["r1", "r0", "r2", "r3"]
    policy.remove(requests[2])
    policy.remove(requests[4])  # not waiting: nothing happens
    assert [policy.pop().request_id for _ in range(len(policy))] == ["r1", "r0", "r3"]
    assert policy.peek() is None


def test_vllm_priority_orders_by_priority_arrival_and_id_put_backs_included():
    policy = VllmPriority()
    rows = [("b", 1, 2.0), ("a", 1, 2.0), ("c", 0, 9.0), ("d", 1, 1.0)]
    requests = {rid: make_core_request(rid, priority=p, arrival=t) for rid, p, t in rows}
    for request in requests.values():
        policy.add(request, 0.0)
    first = policy.pop()
    assert first.request_id == "c"
    policy.requeue(first)  # no front band: back in its place by priority
    assert [r.request_id for r in policy.waiting_requests()] == ["c", "d", "a", "b"]
