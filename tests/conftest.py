"""Suite-wide set-up: the Hypothesis profile is chosen before any test module is imported; tests/npu runs apart."""

from pathlib import Path

import fuzzing  # noqa: F401  - registers and loads the profile (derandomized unless HYPOTHESIS_PROFILE=explore)

NPU_STANDIN = Path(__file__).resolve().parent / "npu"


def pytest_ignore_collect(collection_path, config):
    """tests/npu registers torch's PrivateUse1 device as ``npu`` for its whole process (torch cannot undo it), which
    changes what ``torch.accelerator`` answers for every later test: it is collected only when named (``pytest
    tests/npu``, a file or test in it); the suite runs it in a process of its own (tests/test_npu_standin.py)."""
    if Path(collection_path).resolve() != NPU_STANDIN:
        return None
    named = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    return not any(a == NPU_STANDIN or NPU_STANDIN in a.parents for a in named)
