"""`memprof estimate`: a training script's GPU memory before launch, on the
CPU, with no GPU.

The script runs unchanged under PyTorch's fake tensors (shapes and dtypes,
no data) with every CUDA request sent to the fake CPU device; PyTorch's own
MemTracker (torch >= 2.5) or a small dispatch-mode tracker (older torch)
records each storage's birth and death; a model of the CUDA caching
allocator replays them into allocated and reserved peaks.

    python -m memprof_agent.estimate [--budget-bytes B] [--vary NAME=v1,v2] -- train.py ARGS

What lives here:
    __main__   the command line: one fake run, or a bisection over --vary
    allocator  the caching allocator's rounding, segments and reserve
    search     the largest value of a swept variable that fits
    fakecuda   what makes an unchanged CUDA script run on fake CPU tensors
    tracker    the storage event trace (MemTracker or the fallback)
    child      one fake run of the script, in its own interpreter
    contract   the JSON this package prints (docs/estimate.md)
"""
