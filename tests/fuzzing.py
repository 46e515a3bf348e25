"""How much the property tests search, in one place: reproducible in ``make test``, wider on demand.

``make test`` (and CI) runs every Hypothesis test **derandomized**: the
examples are drawn from a seed derived from the test itself, with no example
database, so a run that passed passes again and a failure is the same failure
on every machine. ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples
each run and ten times as many of them; use it to hunt, then pin what it finds
with ``@example(...)`` on the test (a regular, always-run case) before fixing.
A failing run prints the falsifying example and its reproduction blob either way.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import settings

PROFILES = {"ci": 1, "explore": 10}  # profile -> how many times each test's own example budget

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"HYPOTHESIS_PROFILE={PROFILE!r} is not a profile of this suite; allowed: {', '.join(PROFILES)}")
settings.load_profile(PROFILE)


def fuzz(max_examples: int, **options: Any) -> settings:
    """Hypothesis settings for a test whose budget in ``make test`` is ``max_examples`` (scaled by the profile)."""
    return settings(max_examples=max_examples * PROFILES[PROFILE], deadline=None, **options)
