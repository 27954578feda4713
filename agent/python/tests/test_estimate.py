"""`memprof_agent.estimate` without torch: the caching-allocator model, the
--vary bisection, the JSON contract and the command line's orchestration
(the fake run itself is replaced; test_estimate_real.py runs it when torch
is installed)."""

import io
import json

import pytest

from memprof_agent.estimate import __main__ as cli
from memprof_agent.estimate import allocator, contract, search

MiB = 1 << 20


# -- the allocator model ---------------------------------------------------

def test_requests_round_up_to_512_byte_blocks():
    assert allocator.round_size(1) == 512
    assert allocator.round_size(512) == 512
    assert allocator.round_size(513) == 1024
    a = allocator.replay([("alloc", 1, 100)])
    assert a.peak_allocated == 512


def test_segments_follow_the_pool_and_size():
    assert allocator.segment_size(512) == 2 * MiB  # small pool
    assert allocator.segment_size(MiB) == 2 * MiB
    assert allocator.segment_size(MiB + 512) == 20 * MiB  # large, under 10 MiB
    assert allocator.segment_size(10 * MiB) == 10 * MiB  # large: rounded to 2 MiB
    assert allocator.segment_size(11 * MiB) == 12 * MiB


def test_a_freed_block_is_reused_and_reserved_never_shrinks():
    a = allocator.replay([("alloc", 1, 12 * MiB), ("free", 1), ("alloc", 2, 12 * MiB)])
    assert a.peak_reserved == 12 * MiB
    assert a.reserved == 12 * MiB
    assert a.allocated == 12 * MiB


def test_small_requests_share_one_segment():
    a = allocator.replay([("alloc", i, 1000) for i in range(100)])
    assert a.segments == 1
    assert a.peak_reserved == 2 * MiB
    assert a.peak_allocated == 100 * 1024


def test_a_large_remainder_of_at_most_1_mib_is_handed_out_whole():
    # 20 MiB segment, 19.5 MiB asked: the 0.5 MiB rest is not split off,
    # so allocated counts the whole 20 MiB block (as the real allocator does).
    a = allocator.replay([("alloc", 1, 20 * MiB - MiB // 2)])
    assert a.segments == 1 and a.peak_allocated == 20 * MiB
    # 5 MiB asked from a 20 MiB segment: 15 MiB stays free for the next.
    a = allocator.replay([("alloc", 1, 5 * MiB), ("alloc", 2, 5 * MiB)])
    assert a.segments == 1 and a.peak_allocated == 10 * MiB


def test_freed_neighbours_merge_so_a_larger_block_fits_again():
    events = [("alloc", 1, 6 * MiB), ("alloc", 2, 6 * MiB), ("alloc", 3, 6 * MiB),
              ("free", 1), ("free", 2), ("alloc", 4, 12 * MiB)]
    a = allocator.replay(events)
    assert a.segments == 1, "12 MiB fits in the merged 6+6 MiB"
    assert a.peak_reserved == 20 * MiB


def test_fragmentation_takes_a_new_segment():
    # Two free 6 MiB holes that are not neighbours cannot hold 12 MiB.
    events = [("alloc", 1, 6 * MiB), ("alloc", 2, 6 * MiB), ("alloc", 3, 6 * MiB),
              ("free", 1), ("free", 3), ("alloc", 4, 12 * MiB)]
    a = allocator.replay(events)
    assert a.segments == 2
    assert a.peak_reserved == 20 * MiB + 12 * MiB


def test_a_free_of_an_unknown_key_is_ignored():
    a = allocator.replay([("free", "never"), ("alloc", 1, 512)])
    assert a.allocated == 512


# -- the bisection -----------------------------------------------------------

def test_bisection_finds_the_largest_fitting_value_in_log_runs():
    values = [str(v) for v in range(1, 65)]
    probes = []

    def fits(v):
        probes.append(v)
        return int(v) <= 37

    largest, tried = search.largest_fitting(values, fits)
    assert largest == "37"
    assert len(probes) <= 7  # log2(64) + 1
    assert [v for v, _ in tried] == probes


def test_bisection_with_nothing_or_everything_fitting():
    assert search.largest_fitting(["1", "2", "4"], lambda v: False)[0] is None
    assert search.largest_fitting(["1", "2", "4"], lambda v: True)[0] == "4"


def test_vary_parses_and_orders_numerically():
    assert search.parse_vary("BATCH=32,8, 16") == ("BATCH", ["32", "8", "16"])
    assert search.ordered(["32", "8", "16"]) == ["8", "16", "32"]
    assert search.ordered(["b", "a"]) == ["b", "a"]
    for bad in ("BATCH", "=1,2", "BATCH="):
        with pytest.raises(ValueError, match="NAME=v1,v2"):
            search.parse_vary(bad)


# -- the contract and the command line --------------------------------------

RUST_READS = {"parametersBytes", "buffersBytes", "gradientsBytes", "optimizerBytes",
              "activationsBytes", "temporariesBytes", "otherBytes", "trackedPeakBytes",
              "allocatedPeakBytes", "reservedPeakBytes", "stepsRun", "value"}


def record(reserved, value=None):
    a = allocator.CachingAllocator()
    a.peak_allocated, a.peak_reserved = reserved - 1, reserved
    return contract.run_record({"Parameter": 10, "Optstate": 20}, 30, a, 2, value)


def test_a_run_record_has_every_field_the_cli_reads():
    r = record(1000)
    assert RUST_READS <= set(r)
    assert r["parametersBytes"] == 10 and r["optimizerBytes"] == 20
    assert r["reservedPeakBytes"] == 1000


def run_main(monkeypatch, argv, runs):
    calls = []

    def one_run(args, env_name=None, value=None):
        calls.append(value)
        return runs(value)

    monkeypatch.setattr(cli, "one_run", one_run)
    out = io.StringIO()
    monkeypatch.setattr(cli.sys, "stdout", out)
    code = cli.main(argv)
    return code, json.loads(out.getvalue()), calls


def test_main_prints_the_contract(monkeypatch):
    code, answer, _ = run_main(monkeypatch, ["--", "python", "train.py"], lambda v: record(5))
    assert code == 0
    assert answer["kind"] == contract.KIND and answer["version"] == contract.VERSION
    assert answer["rank"]["reservedPeakBytes"] == 5
    assert answer["vary"] is None


def test_main_bisects_vary_against_the_budget(monkeypatch):
    argv = ["--budget-bytes", "100", "--vary", "BATCH=64,8,16,32", "--", "train.py"]
    code, answer, calls = run_main(monkeypatch, argv, lambda v: record(int(v) * 4, v))
    assert code == 0
    assert answer["vary"]["largest"] == "16"  # 16*4 = 64 <= 100 < 32*4
    assert answer["rank"]["value"] == "16"
    assert len(calls) <= 3


def test_a_failed_run_counts_as_not_fitting(monkeypatch):
    argv = ["--budget-bytes", "100", "--vary", "B=1,2", "--", "train.py"]
    runs = lambda v: record(1, v) if v == "1" else {"error": "OOM in script", "value": v}
    code, answer, _ = run_main(monkeypatch, argv, runs)
    assert answer["vary"]["largest"] == "1"


def test_a_script_failure_exits_3_with_the_error(monkeypatch, capsys):
    code, answer, _ = run_main(monkeypatch, ["--", "train.py"],
                               lambda v: {"error": "RuntimeError: boom", "at": "train.py:3"})
    assert code == 3
    assert answer["rank"]["error"] == "RuntimeError: boom"


def test_vary_without_a_budget_is_refused():
    with pytest.raises(SystemExit) as e:
        cli.parse(["--vary", "B=1,2", "--", "train.py"])
    assert e.value.code == 2


# -- running the script ------------------------------------------------------

from memprof_agent.estimate import child  # noqa: E402


def test_a_script_runs_as_main_with_its_arguments(tmp_path, monkeypatch):
    out = tmp_path / "seen"
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nif __name__ == '__main__':\n    open({str(out)!r}, 'w').write(' '.join(sys.argv))\n")
    monkeypatch.setattr(child.sys, "argv", list(child.sys.argv))
    child.run_script([str(script), "--lr", "1"])
    assert out.read_text() == f"{script} --lr 1"


def test_a_module_runs_with_dash_m(tmp_path, monkeypatch):
    out = tmp_path / "seen"
    (tmp_path / "trainmod.py").write_text(f"import sys\nopen({str(out)!r}, 'w').write(__name__ + ' ' + sys.argv[1])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(child.sys, "argv", list(child.sys.argv))
    child.run_script(["-m", "trainmod", "--bs=4"])
    assert out.read_text() == "__main__ --bs=4"


def test_the_step_budget_and_exit_0_end_a_run_quietly_but_an_error_exit_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(child.sys, "argv", list(child.sys.argv))
    script = tmp_path / "t.py"
    script.write_text("from memprof_agent.estimate.child import StepBudgetReached\nraise StepBudgetReached()\n")
    child.run_script([str(script)])
    script.write_text("raise SystemExit(0)\n")
    child.run_script([str(script)])
    script.write_text("raise SystemExit('bad flag')\n")
    with pytest.raises(SystemExit):
        child.run_script([str(script)])


def test_the_child_splits_its_flags_from_the_script():
    args = child.parse(["--out", "f.json", "--steps", "3", "--", "train.py", "--steps", "9"])
    assert (args.out, args.steps, args.command) == ("f.json", 3, ["train.py", "--steps", "9"])


# -- the committed calibration -------------------------------------------------

def test_the_committed_constants_follow_from_the_committed_points():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location(
        "estimate_calibrate", root / "bench" / "gpu" / "estimate_calibrate.py")
    calibrate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibrate)
    recorded = json.loads((root / "bench" / "estimate" / "calibration.json").read_text())
    c = recorded["constants"]
    consts = {"gpu": recorded["gpu"], "deviceTotalBytes": recorded["deviceTotalBytes"],
              "torch": recorded["torch"], "workspaceBytes": c["workspaceBytes"],
              "contextAfterMatmulBytes": c["contextAfterMatmulBytes"]}
    again = calibrate.summarize(consts, recorded["points"], recorded["gpus"])
    assert again["constants"] == c
    held = [p for p in recorded["points"] if p["split"] == "held-out"]
    assert len(held) >= 5 and not any(p["name"].startswith("ddp") for p in held)
