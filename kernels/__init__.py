"""pdfleet's DSA indexer kernels: index logits over bf16 keys with the per-head ReLU, fp32 accumulation.

`ragged_logits` (prefill) and `paged_logits` (decode) are fused Triton kernels that run compiled on any CUDA
GPU and interpreted on CPU; `topk_indices` selects each row's top k as SGLang expects them. `reference` is the
plain-PyTorch definition they are checked against, `fp8` an emulation of upstream's FP8 layout, `compare` the
measures the checks use.
"""

from pdfleet.kernels.paged import paged_logits
from pdfleet.kernels.ragged import ragged_logits
from pdfleet.kernels.topk import topk_indices

__all__ = ["paged_logits", "ragged_logits", "topk_indices"]
