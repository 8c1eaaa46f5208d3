# GPU diagnostics only (not part of the project): log every Triton JIT specialization a process compiles or loads.
import os

_LOG = os.environ.get("TRITON_COMPILE_LOG")
if _LOG:
    try:
        import time

        import triton
        from triton.runtime import jit as _jit

        def _hook(*args, **kwargs):
            fn = kwargs.get("fn")
            name = getattr(fn, "name", None) or str(fn)
            with open(f"{_LOG}.{os.getpid()}", "a") as f:
                f.write(f"{time.time():.3f}\t{name}\t{str(kwargs.get('repr'))[:400]}\n")
            return False

        knobs = getattr(triton, "knobs", None)
        if knobs is not None and hasattr(knobs, "runtime") and hasattr(knobs.runtime, "jit_post_compile_hook"):
            knobs.runtime.jit_post_compile_hook = _hook
        else:
            _jit.JITFunction.compiled_hook = _hook
    except Exception as exc:  # noqa: BLE001
        print(f"sitecustomize: no Triton compile log ({exc})")
