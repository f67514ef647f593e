"""GPU tasks: the pycuda kernel conformance suite against a built target."""

from __future__ import annotations

from invoke import Context, task

from colibri_kit import gpucheck as kit_gpucheck
from colibri_kit.tasks._common import user_errors


@task(name="gpucheck", help={
    "target": "built target whose dist/TARGET/bin/colibri supplies the kernels (default host)",
    "k": "only the tests matching this pytest -k expression (e.g. linear or attention)",
})
@user_errors
def gpucheck_task(c: Context, target: str = "host", k: str = "") -> None:
    """Run the pycuda kernel suite + CUDA-vs-CPU forward on this machine's GPU."""
    args = ["-k", k] if k else []
    rc = kit_gpucheck.run_suite(target, args)
    if rc != 0:
        raise kit_gpucheck.GpuCheckError(f"GPU conformance suite failed for {target} "
                                         f"(pytest exit status {rc}; details above)")
    print(f"gpucheck: {target} passed")


TASKS = [gpucheck_task]
