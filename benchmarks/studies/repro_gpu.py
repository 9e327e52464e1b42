"""Find which generated kernel of a model's training step faults on the GPU (debug aid).

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python -m benchmarks.studies.repro_gpu transformer
"""

import sys
import traceback

import torch

import fusebackend
from benchmarks.models import MODELS


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "transformer"
    spec = MODELS[name]
    module, inputs_fn = spec.make(spec.gpu, torch.device("cuda"))
    def forward_loss(*xs: torch.Tensor) -> torch.Tensor:
        out = module(*xs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.float().square().mean()

    compiled = torch.compile(forward_loss, backend=fusebackend.fuse)
    import warnings

    warnings.simplefilter("error")  # a failed first run raises instead of falling back
    try:
        compiled(*inputs_fn()).backward()
        torch.cuda.synchronize()
        print("no fault")
    except Exception:
        traceback.print_exc()
        for a in fusebackend.history():
            print("compiled:", a.name, a.kernel_count, "kernels")
        last = fusebackend.history()[-1]
        print("== last compiled graph:", last.name)
        print(last.wrapper)
        for kname, src in last.kernels.items():
            print("== kernel", kname)
            print(src)


if __name__ == "__main__":
    main()
