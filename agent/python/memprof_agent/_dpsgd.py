"""DP-SGD's own memory (seed 004): the per-sample gradient norms and the
temporary matrices of ghost clipping, beside the per-sample gradients the
breakdown already counts (`perSampleGradientsBytes`, Opacus `grad_sample`).

What is measured and what is modelled (the object says which):
- norms, measured: the tensors the parameters hold in `_norm_sample`
  (Opacus' fast-gradient and ghost clipping keep one [batch] vector per
  parameter until zero_grad), each memory region once;
- norms, modelled, when parameters hold `grad_sample` but no `_norm_sample`
  (Opacus' DPOptimizer computes the norms inside its step, then frees
  them): what its clipping allocates, one [batch] norm per parameter, their
  [batch, parameters] stack, the per-sample norms and the clip factors,
  each a block of the CUDA caching allocator (a multiple of 512 bytes);
- temporary matrices, modelled, for ghost clipping only and only when the
  trainer gives the sequence length T: Opacus forms ggT and aaT, two
  [batch, T, T] matrices, for one Linear layer at a time (layers run one
  after the other in backward, so the peak is the largest layer's pair, not
  the sum): 2 x batch x T^2 elements of that layer's weight dtype.
bench/gpu/oom_snapshot_check.py measures both against real CUDA tensors.

Pure walks over the parameters: no GPU work, nothing raised."""


BLOCK = 512  # the CUDA caching allocator's smallest block and rounding


def block(nbytes):
    """What the caching allocator takes for a tensor of nbytes."""
    return max(BLOCK, -(-int(nbytes) // BLOCK) * BLOCK)


def _tensors(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _samples(t):
    shape = tuple(getattr(t, "shape", ()) or ())
    return int(shape[0]) if shape else None


def dp_sgd(params, counter, sequence_length=None):
    """The `dpSgd` object of the parameters [(name, p, path)], or None when
    no parameter holds per-sample state. `counter` counts each memory
    region once (the breakdown's _Counter)."""
    measured, with_norms, with_grads, samples, itemsize = 0, 0, 0, None, 4
    for _, p, _ in params:
        norms = _tensors(getattr(p, "_norm_sample", None))
        grads = _tensors(getattr(p, "grad_sample", None))
        for t in norms:
            measured += counter.add(t)
            samples = samples or _samples(t)
        for t in grads:
            samples = samples or _samples(t)
            itemsize = int(t.element_size())
        with_norms += 1 if norms else 0
        with_grads += 1 if grads else 0
    if not (with_norms or with_grads):
        return None
    out = {"samples": samples, "parameters": max(with_norms, with_grads)}
    if with_norms:
        out["normsBytes"], out["normsSource"] = measured, "measured"
    else:
        vector = block((samples or 0) * itemsize)
        out["normsBytes"] = (with_grads + 2) * vector + block((samples or 0) * with_grads * itemsize)
        out["normsSource"] = "modelled"
    temp = temp_matrices(params, samples, sequence_length) if with_norms else None
    if temp is not None:
        out["tempMatricesBytes"], out["sequenceLength"] = temp, int(sequence_length)
    return out


def temp_matrices(params, samples, sequence_length):
    """Ghost clipping's ggT + aaT of the largest trainable 2-D weight's
    layer (the module docstring's model), or None without a sequence
    length or a batch."""
    if not samples or not isinstance(sequence_length, int) or isinstance(sequence_length, bool) or sequence_length < 1:
        return None
    widths = [int(p.element_size()) for _, p, _ in params
              if getattr(p, "requires_grad", False) and len(tuple(getattr(p, "shape", ()))) == 2]
    if not widths:
        return None
    return 2 * block(samples * sequence_length * sequence_length * max(widths))
