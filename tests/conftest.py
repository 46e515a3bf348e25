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


#: The suite's longest files (seconds of ``--durations=0`` in docs/testing.md), longest first. ``make test`` runs
#: two pytest workers, one file each at a time, in collection order (``--no-loadscope-reorder``): starting the
#: longest files first lets the short ones fill the end, so both workers finish together instead of one running
#: a long end-to-end file alone at the end. Only an order: a file missing here just starts later.
LONGEST_FIRST = (
    "e2e/test_data_parallel.py", "e2e/test_quantization.py", "e2e/test_graph_capture.py", "e2e/test_pd_backends.py",
    "e2e/test_model_families.py", "e2e/test_sfa.py", "e2e/test_drafters.py", "e2e/test_eplb.py",
    "e2e/test_pd_disaggregation.py", "e2e/test_real_model.py", "e2e/test_serving.py", "e2e/test_ray.py",
    "e2e/test_moe_expert_parallel.py", "test_conformance.py", "e2e/test_ascend_backend.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Longest files first, then the other end-to-end files, then the rest; each file's tests stay together and
    in their order (a stable sort on a per-file key), so module-scoped engines are still started once."""
    root = Path(__file__).resolve().parent

    def rank(item) -> int:
        path = Path(str(item.fspath)).resolve()
        relative = path.relative_to(root).as_posix() if root in path.parents else path.as_posix()
        if relative in LONGEST_FIRST:
            return LONGEST_FIRST.index(relative)
        return len(LONGEST_FIRST) + (0 if relative.startswith("e2e/") else 1)

    items.sort(key=rank)
