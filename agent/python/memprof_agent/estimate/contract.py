"""The JSON `python -m memprof_agent.estimate` prints on stdout, one object
(what `memprof estimate` reads; docs/estimate.md lists the fields):

    {"kind": "memprofEstimateRun", "version": 1, "torch": "2.11.0",
     "tracker": "MemTracker" | "dispatch", "worldSize": 1, "steps": 2,
     "rank": {...one fake run...}, "vary": null | {...}, "seconds": 3.2}

A run ("rank") holds bytes: parametersBytes, buffersBytes, gradientsBytes,
optimizerBytes, activationsBytes, temporariesBytes, otherBytes (the tracked
tensors at the tracked peak, per category), trackedPeakBytes (their sum),
allocatedPeakBytes and reservedPeakBytes (the allocator model's replay,
the measured workspace included), segments, stepsRun, value (the --vary
value it ran with, or null)."""

KIND = "memprofEstimateRun"
VERSION = 1

CATEGORIES = {
    "Parameter": "parametersBytes",
    "Buffer": "buffersBytes",
    "Gradient": "gradientsBytes",
    "Optstate": "optimizerBytes",
    "Activation": "activationsBytes",
    "Temp": "temporariesBytes",
    "Other": "otherBytes",
}


def run_record(categories, tracked_peak, allocator, steps_run, value=None):
    """One fake run's record: `categories` maps MemTracker's category names to bytes."""
    record = {field: int(categories.get(name, 0)) for name, field in CATEGORIES.items()}
    record.update(
        trackedPeakBytes=int(tracked_peak),
        allocatedPeakBytes=int(allocator.peak_allocated),
        reservedPeakBytes=int(allocator.peak_reserved),
        segments=int(allocator.segments),
        stepsRun=int(steps_run),
        value=value,
    )
    return record


def result(torch_version, tracker, world_size, steps, rank, vary, seconds):
    """The whole answer."""
    return {
        "kind": KIND,
        "version": VERSION,
        "torch": torch_version,
        "tracker": tracker,
        "worldSize": int(world_size),
        "steps": int(steps),
        "rank": rank,
        "vary": vary,
        "seconds": round(float(seconds), 3),
    }


def vary_record(name, budget, tried, largest):
    """The bisection's record: each value tried with its peaks and whether it fits."""
    return {"name": name, "budgetBytes": budget, "tried": tried, "largest": largest}
