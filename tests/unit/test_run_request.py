"""RunRequest: the options of run()/session() checked once, defaults applied by whoever runs it
(a local scheduler at once, a cluster's host on arrival). No VM."""

from __future__ import annotations

import pickle

import pytest

from exec_sandbox import InputValidationError, RunRequest, SchedulerConfig, Template


def test_a_local_request_has_the_configs_defaults() -> None:
    config = SchedulerConfig(default_timeout_seconds=12, default_memory_mb=256)
    request = RunRequest.make({}, config, code="print(1)")
    assert (request.timeout, request.memory, request.timeout_ms) == (12, 256, 12_000)


def test_a_cluster_request_takes_the_hosts_defaults_on_arrival() -> None:
    client = SchedulerConfig(default_timeout_seconds=12, default_memory_mb=256)
    request = RunRequest.make({"language": "raw"}, client, code="echo", defaults=False)
    assert (request.timeout_seconds, request.memory_mb) == (None, None)
    with pytest.raises(ValueError, match="with_defaults"):
        _ = request.timeout
    host = SchedulerConfig(default_timeout_seconds=40, default_memory_mb=512)
    arrived = pickle.loads(pickle.dumps(request)).with_defaults(host)
    assert (arrived.timeout, arrived.memory, arrived.language) == (40, 512, "raw")
    given = RunRequest.make({"timeout_seconds": 5}, client, code="1", defaults=False)
    assert given.with_defaults(host).timeout == 5


def test_bad_options_are_refused_before_anything_runs() -> None:
    config = SchedulerConfig()
    with pytest.raises(TypeError, match="timeout"):
        RunRequest.make({"timeout": 5}, config, code="1")  # type: ignore[typeddict-unknown-key]
    with pytest.raises(InputValidationError):
        RunRequest.make({"timeout_seconds": 86_401}, config, code="1", defaults=False)
    with pytest.raises(InputValidationError):
        RunRequest.make({"memory_mb": 16}, config, code="1", defaults=False)
    for vcpus in (0, 9, 1.5, True):
        with pytest.raises(InputValidationError, match="vcpus"):
            RunRequest.make({"vcpus": vcpus}, config, code="1")  # type: ignore[typeddict-item]


def test_vcpus_default_to_one_and_are_kept() -> None:
    config = SchedulerConfig()
    assert RunRequest.make({}, config, code="1").vcpus == 1
    assert RunRequest.make({"vcpus": 8}, config, code=None).vcpus == 8


def test_a_template_is_a_checked_name_whose_defaults_come_before_the_configs() -> None:
    config = SchedulerConfig(default_memory_mb=256)
    assert RunRequest.make({"template": "default"}, config, code="1").template is None
    request = RunRequest.make({"template": "go-dev"}, config, code="1", defaults=False)
    assert request.template == "go-dev"
    template = Template(
        name="go-dev", digest="sha256:" + "0" * 64, size_bytes=4096, languages={"raw": "sh"},
        env={}, workdir="/", memory_mb=1024, vcpus=2,
    )  # fmt: skip
    applied = request.with_defaults(config, template)
    assert (applied.memory, applied.cpus) == (1024, 2)
    own = RunRequest.make({"template": "go-dev", "vcpus": 1}, config, code="1", defaults=False)
    assert own.with_defaults(config, template).cpus == 1
    for bad in ("Go", "../x", "", "a" * 64, 3):
        with pytest.raises(InputValidationError, match="template name"):
            RunRequest.make({"template": bad}, config, code="1")  # type: ignore[typeddict-item]
    with pytest.raises(InputValidationError, match="packages"):
        RunRequest.make({"template": "go-dev", "packages": ["six==1.16.0"]}, config, code="1")


def test_a_cluster_refuses_templates_before_any_host_is_asked() -> None:
    from exec_sandbox.cluster.client import _refuse_tools

    with pytest.raises(InputValidationError, match="templates"):
        _refuse_tools({"template": "go-dev"})
    _refuse_tools({"template": "default"})


def test_a_timeout_of_zero_is_no_limit_and_a_day_is_the_longest() -> None:
    config = SchedulerConfig()
    assert RunRequest.make({"timeout_seconds": 0}, config, code="1").timeout_ms == 0
    assert RunRequest.make({"timeout_seconds": 86_400}, config, code="1").timeout_ms == 86_400_000


def test_disk_mb_is_checked_and_a_cluster_host_applies_its_own_default() -> None:
    config = SchedulerConfig(default_disk_mb=2048)
    assert RunRequest.make({}, config, code="1").disk == 2048
    assert RunRequest.make({"disk_mb": 64}, config, code=None).disk == 64
    for bad in (63, 1024 * 1024 + 1, 1.5, True, "64"):
        with pytest.raises(InputValidationError, match="disk_mb"):
            RunRequest.make({"disk_mb": bad}, config, code="1")  # type: ignore[typeddict-item]
    request = RunRequest.make({}, config, code="1", defaults=False)
    host = SchedulerConfig(default_disk_mb=8192)
    assert pickle.loads(pickle.dumps(request)).with_defaults(host).disk == 8192
    sized = RunRequest.make({"disk_mb": 100}, config, code="1", defaults=False)
    assert pickle.loads(pickle.dumps(sized)).with_defaults(host).disk == 100
