"""Suite-wide set-up: the Hypothesis profile is chosen before any test module is imported."""

import fuzzing  # noqa: F401  - registers and loads the profile (derandomized unless HYPOTHESIS_PROFILE=explore)
