"""The GPU-idle verdict (`policy.gpuidle`) and its evidence (`rules.gpuwork`), pure: when
a GPU node takes only GPU work (admission GPUOnly), from the ledger's containers holding
GPUs, the GPU idle-since, and the probe's utilisation; the work gate's reason code and
evidence; a node running nothing, or running GPU work, is never GPUOnly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodewarden.api.containerdispatch import ContainerResources
from nodewarden.policy.facts import WorkReading
from nodewarden.policy.gpuidle import gpu_only, gpu_only_at
from nodewarden.policy.state import AdmissionState, api_admission
from nodewarden.rules.gpuwork import gpu_counts, gpu_work, with_gpu, with_utilisation
from nodewarden.scheduling.views import ContainerView, Phase

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
IDLE = timedelta(minutes=10)
AGE = timedelta(minutes=2)


def work(active: int, gpu_jobs: int, at: datetime, previous: WorkReading | None) -> WorkReading:
    reading = WorkReading(source="ssh:n/runners", observed_at=at, active_jobs=active)
    return with_gpu(reading, 2, gpu_jobs, previous)


def test_cpu_work_only_with_gpus_idle_for_the_threshold_is_gpu_only() -> None:
    w = work(1, 1, T0, None)
    assert w.gpu is not None and w.gpu.gpu_idle_since is None
    w = work(1, 0, T0 + timedelta(minutes=1), w)  # the GPU job ended, a CPU job runs on
    assert w.gpu is not None and w.gpu.gpu_idle_since == T0 + timedelta(minutes=1)
    w = work(1, 0, T0 + timedelta(minutes=5), w)  # idle-since kept
    assert w.gpu is not None and w.gpu.gpu_idle_since == T0 + timedelta(minutes=1)
    assert gpu_only_at(w, IDLE) == T0 + timedelta(minutes=11)
    assert not gpu_only(w, IDLE, AGE, T0 + timedelta(minutes=10, seconds=59))
    assert gpu_only(w, IDLE, AGE, T0 + timedelta(minutes=11))
    assert not gpu_only(w, IDLE, AGE, T0 + timedelta(minutes=11), enabled=False)
    assert gpu_only_at(w, IDLE, enabled=False) is None


def test_a_node_running_nothing_or_gpu_work_is_never_gpu_only() -> None:
    idle = work(0, 0, T0, None)
    assert not gpu_only(idle, IDLE, AGE, T0 + timedelta(hours=5))
    assert gpu_only_at(idle, IDLE) is None
    busy = work(3, 1, T0, None)
    assert not gpu_only(busy, IDLE, AGE, T0 + timedelta(hours=5))
    assert gpu_only_at(busy, IDLE) is None
    assert not gpu_only(None, IDLE, AGE, T0)
    no_gpus = WorkReading(source="s", observed_at=T0, active_jobs=1)
    assert with_gpu(no_gpus, 0, 0, None) is no_gpus  # a node without GPUs: no evidence
    assert gpu_work(0, 0, "s", T0, None) is None
    assert not gpu_only(no_gpus, IDLE, AGE, T0 + timedelta(hours=5))


def test_a_fresh_probe_reading_busy_gpus_vetoes_and_a_stale_one_does_not() -> None:
    w = work(1, 0, T0, None)
    at = T0 + timedelta(minutes=20)
    assert w.gpu is not None
    busy = w.model_copy(
        update={"gpu": with_utilisation(w.gpu, (0.0, 87.0), "ssh:n/nvidia-smi", at)}
    )
    assert not gpu_only(busy, IDLE, AGE, at)  # work nodewarden does not know of
    assert gpu_only(busy, IDLE, AGE, at + AGE + timedelta(seconds=1))  # stale: the ledger
    na = busy.model_copy(update={"gpu": with_utilisation(w.gpu, (0.0, None), "s", at)})
    assert not gpu_only(na, IDLE, AGE, at)  # [N/A]: not known idle
    quiet = busy.model_copy(update={"gpu": with_utilisation(w.gpu, (0.0, 3.0), "s", at)})
    assert gpu_only(quiet, IDLE, AGE, at)
    # the utilisation read is kept by the next work reading
    later = with_gpu(
        WorkReading(source="s", observed_at=at + timedelta(seconds=5), active_jobs=1),
        2,
        0,
        quiet,
    )
    assert later.gpu is not None and later.gpu.utilisation == (0.0, 3.0)


def test_gpu_counts_read_the_ledger_and_count_a_runner_of_unknown_size() -> None:
    def c(
        uuid: str, gpus: int, phase: Phase, node: str | None, whole: bool = False
    ) -> ContainerView:
        r = ContainerResources(vcpus=1, ram="1Gi", gpus=gpus)
        return ContainerView(uuid, phase, 1, T0, r, node, whole_node=whole)

    views = [
        c("a", 1, Phase.RUNNING, "n1"),
        c("b", 0, Phase.RUNNING, "n1"),
        c("c", 1, Phase.LOCKED, "n2"),
        c("d", 0, Phase.RUNNING, "n3", whole=True),
        c("e", 1, Phase.QUEUED, None),
    ]
    assert gpu_counts(views) == {"n1": 1, "n2": 1, "n3": 1}


def test_the_status_value_of_admission_has_a_third_state() -> None:
    assert api_admission(AdmissionState.OPEN) == "Open"
    assert api_admission(AdmissionState.OPEN, gpu_only=True) == "GPUOnly"
    assert api_admission(AdmissionState.CLOSING, gpu_only=True) == "Closed"
    assert api_admission(AdmissionState.CLOSED, gpu_only=True) == "Closed"
