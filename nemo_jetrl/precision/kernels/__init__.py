"""Triton kernels (CUDA only). Import submodules lazily: `from nemo_jetrl.precision.kernels import triton_quant`."""
