"""The largest value of a swept variable whose fake run fits.

Peak memory grows with the micro-batch (and sequence length), so the values
are sorted and bisected: log2(n) fake runs instead of n. A value whose run
failed (the script raised) counts as not fitting, so an answer is always a
value that ran and fitted.
"""


def parse_vary(spec):
    """`NAME=v1,v2,...` -> (NAME, [values as given]); ValueError says what to type."""
    name, sep, values = spec.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not items:
        raise ValueError(
            f"--vary {spec!r}: expected NAME=v1,v2,... (e.g. --vary BATCH_SIZE=8,16,32)"
        )
    return name.strip(), items


def ordered(values):
    """Numbers by value (the run's memory grows with them), else as given."""
    try:
        return sorted(values, key=float)
    except ValueError:
        return list(values)


def largest_fitting(values, fits):
    """Bisect `values` (ascending) with `fits(value) -> bool`; returns
    (largest value that fits or None, [(value, fits)] in the order tried).

    Assumes fitting is monotone: if a value fits, every smaller one does."""
    tried = []

    def probe(i):
        ok = bool(fits(values[i]))
        tried.append((values[i], ok))
        return ok

    lo, hi = -1, len(values)  # values[lo] fits (or lo = -1); values[hi] does not (or hi = n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return (values[lo] if lo >= 0 else None), tried
