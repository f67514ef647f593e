"""GPU tasks: the pycuda kernel conformance suite against a built target."""

from __future__ import annotations

from invoke import Context, task

from colibri_kit import gpucheck as kit_gpucheck
from colibri_kit.tasks._common import user_errors


@task(name="gpucheck", help={
    "target": "built target whose dist/TARGET/bin/colibri supplies the kernels (default host)",
    "k": "only the tests matching this pytest -k expression (e.g. linear or attention)",
    "bench": "then print decode-GEMV bandwidth vs the GPU's copy bandwidth (tests/gpu/bench_gemv.py)",
})
@user_errors
def gpucheck_task(c: Context, target: str = "host", k: str = "", bench: bool = False) -> None:
    """Run the pycuda kernel suite + CUDA-vs-CPU forward on this machine's GPU."""
    args = ["-k", k] if k else []
    rc = kit_gpucheck.run_suite(target, args)
    if rc != 0:
        raise kit_gpucheck.GpuCheckError(f"GPU conformance suite failed for {target} "
                                         f"(pytest exit status {rc}; details above)")
    print(f"gpucheck: {target} passed")
    if bench and kit_gpucheck.run_bench(target) != 0:
        raise kit_gpucheck.GpuCheckError("the GEMV bandwidth benchmark failed (details above)")


TASKS = [gpucheck_task]
