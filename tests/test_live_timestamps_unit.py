"""first_at_or_after: a broker's offset-by-timestamp answer checked and, when wrong, corrected by
a binary search (model-based: every hint a broker could give, any non-decreasing store times)."""
from __future__ import annotations

import bisect

from hypothesis import given, settings, strategies as st

from rmq_source.remote.timestamps import first_at_or_after


@settings(max_examples=500, deadline=None)
@given(steps=st.lists(st.integers(0, 3), min_size=0, max_size=60), base=st.integers(0, 100),
       lo=st.integers(0, 5), target=st.integers(-5, 200), hint=st.integers(-10, 80),
       gone=st.integers(0, 3))
def test_first_at_or_after_any_hint(steps, base, lo, target, hint, gone):
    times = []
    t = base
    for s in steps:
        t += s
        times.append(t)
    hi = lo + len(times)
    asked = []

    def store_time(k):
        asked.append(k)
        assert lo <= k < hi
        return None if k < lo + gone else times[k - lo]     # the first `gone` removed meanwhile

    visible = [float("-inf")] * min(gone, len(times)) + times[gone:]     # gone: older than any
    want = lo + bisect.bisect_left(visible, target)
    assert first_at_or_after(target, lo, hi, hint, store_time) == want
    if hint == want:
        assert len(asked) <= 2                     # a right answer costs two pulls at most
