"""One owner per GPU: an agent reports only the device its process trains on
(`_torchread.devices_in_use`), never another rank's."""

import types

from memprof_agent import _torchread as tr


def fake_torch(reserved, current=0):
    """A torch whose allocator holds `reserved[i]` bytes on device i; every
    device the agent asks about is logged."""
    asked = []

    def memory_stats(i):
        asked.append(i)
        return {"reserved_bytes.all.current": reserved[i]}

    cuda = types.SimpleNamespace(
        device_count=lambda: len(reserved),
        current_device=lambda: current,
        memory_stats=memory_stats,
    )
    dist = types.SimpleNamespace(is_available=lambda: False)
    return types.SimpleNamespace(cuda=cuda, distributed=dist), asked


def ordinals(torch):
    return [i for i, _ in tr.devices_in_use(torch)]


def test_a_rank_that_never_called_set_device_reports_its_own_gpu_not_cuda0(monkeypatch):
    # torchrun rank 1 of 2: tensors on cuda:1, current_device() still 0.
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch, _ = fake_torch([0, 8 << 30], current=0)
    assert ordinals(torch) == [1]


def test_a_stray_tensor_on_another_ranks_gpu_does_not_make_it_ours(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch, _ = fake_torch([512 << 20, 8 << 30])
    assert ordinals(torch) == [1]


def test_one_process_on_two_gpus_reports_both(monkeypatch):
    # Model parallel in one process (no launcher): both devices are its own.
    for name in ("LOCAL_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    torch, _ = fake_torch([4 << 30, 8 << 30])
    assert ordinals(torch) == [0, 1]


def test_a_rank_whose_visible_gpu_is_renumbered_keeps_it(monkeypatch):
    # CUDA_VISIBLE_DEVICES=3 for local rank 3: its only device is ordinal 0.
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    torch, _ = fake_torch([8 << 30])
    assert ordinals(torch) == [0]


def test_before_the_first_allocation_no_device_is_claimed(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch, _ = fake_torch([0, 0], current=0)
    assert ordinals(torch) == []
