"""Make the installed torchvision importable when its native ops cannot load (setup step).

Why: vLLM's Qwen2-VL / Qwen2.5-VL / Qwen3-VL modules import transformers' torchvision image and video
processors. PyPI's torchvision wheels are CUDA builds; beside torch ``+cpu`` their ``_C.so`` fails to load
(it links ``libtorch_cuda.so``). torchvision is written to run without its ops (``extension._has_ops()``
guards every meta kernel) except two unguarded ``register_fake`` calls for ``nms``/``qnms``, so
``import torchvision`` dies with "operator torchvision::nms does not exist". This script applies the same
guard upstream proposes (pytorch/vision PR 9649) to those two lines and nothing else: resize, normalize and
the other transforms the processors use are plain torch and run unchanged, while a detection op such as
``nms`` raises torchvision's own "Couldn't load custom C++ ops" error. A torchvision whose ops load is left
untouched, so a user with a working torchvision runs the very same processor code.

Usage: ``python tools/torchvision_without_native_ops.py`` (idempotent; exit 1 when it cannot make
torchvision import).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

_UNGUARDED = re.compile(r'^@torch\.library\.register_fake\("torchvision::(q?nms)"\)$', re.MULTILINE)
_GUARDED = r'@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda fn: fn))'
_CHECK = ("import torchvision, torchvision.transforms.v2.functional; "
          "print(torchvision.__version__, torchvision.extension._has_ops())")


def _import_check() -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True)


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision: not installed (the Qwen-VL models need it)", file=sys.stderr)
        return 1
    before = _import_check()
    if before.returncode == 0:
        version, has_ops = before.stdout.split()
        print(f"torchvision {version}: imports as installed (native ops loaded: {has_ops}); nothing to do")
        return 0
    meta = pathlib.Path(spec.origin).parent / "_meta_registrations.py"
    text = meta.read_text()
    patched, count = _UNGUARDED.subn(_GUARDED, text)
    if count == 0:
        print(f"torchvision does not import and {meta} has no unguarded nms fake kernel to guard:\n"
              f"{before.stderr.strip()[-2000:]}", file=sys.stderr)
        return 1
    meta.write_text(patched)
    after = _import_check()
    if after.returncode != 0:
        meta.write_text(text)
        print(f"torchvision still does not import after guarding {count} fake kernels (restored):\n"
              f"{after.stderr.strip()[-2000:]}", file=sys.stderr)
        return 1
    version, has_ops = after.stdout.split()
    print(f"torchvision {version}: native ops do not load beside this torch (native ops loaded: {has_ops}); "
          f"guarded {count} nms fake-kernel registrations in {meta.name}, the pure-torch transforms import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
