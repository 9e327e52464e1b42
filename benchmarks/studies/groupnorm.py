"""GroupNorm on a GPU: eager, Inductor and fuse on the norm alone and in the models built on it.

GroupNorm reduces each (sample, group) over its channels, height and width. Convolution nets run
it over channels-last activations (fuse makes them so around cuDNN's convolutions), where a
reduction that walks the channels first reads memory with a stride of the channel count. Cases:

- the norm alone, bf16: one group (PoolFormer's norm, b64 64x56x56) and 32 groups (Stable
  Diffusion's VAE decoder: b2 512x64x64, b2 128x512x512), channels-last and contiguous;
- PoolFormer-S12 (timm, b64 224), and Stable Diffusion's VAE decoder (diffusers' AutoencoderKL
  with SD 1.5's configuration, b2, latents 4x64x64 to a 512x512 image), inference.

Each is checked against eager and timed (``do_bench`` median); fuse's kernels are audited against
their floor (``benchmarks/zoo/audit.py``) and the slowest against its floor printed.

    python -m benchmarks.studies.groupnorm [--models] [--without-interleave-split] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

import torch

import fusebackend
from benchmarks.zoo import audit
from benchmarks.zoo.measure import profile_step

NORMS = [  # (name, groups, (n, c, h, w))
    ("gn1_b64_64x56x56", 1, (64, 64, 56, 56)),
    ("gn32_b2_512x64x64", 32, (2, 512, 64, 64)),
    ("gn32_b2_128x512x512", 32, (2, 128, 512, 512)),
    # BiT's stages (2 to 32 channels a group) and SD's UNet (10 a group)
    ("gn32_b64_64x56x56", 32, (64, 64, 56, 56)),
    ("gn32_b64_256x56x56", 32, (64, 256, 56, 56)),
    ("gn32_b64_512x28x28", 32, (64, 512, 28, 28)),
    ("gn32_b64_1024x14x14", 32, (64, 1024, 14, 14)),
    ("gn32_b2_320x64x64", 32, (2, 320, 64, 64)),
]


def _time(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()


def _variants(model: torch.nn.Module) -> dict[str, Callable[..., Any]]:
    torch._dynamo.reset()
    return {"eager": model, "inductor": torch.compile(model), "fuse": torch.compile(model, backend=fusebackend.fuse)}


def run_case(name: str, model: torch.nn.Module, inputs: tuple[Any, ...], bandwidth: float,
             output: Callable[[Any], torch.Tensor] = lambda o: o) -> dict[str, Any]:
    row: dict[str, Any] = {"case": name}
    with torch.no_grad():
        want = output(model(*inputs))
        for variant, fn in _variants(model).items():
            fusebackend.dump.clear()
            got = output(fn(*inputs))
            row[f"{variant}_err"] = _error(got, want)
            row[f"{variant}_ms"] = _time(lambda: fn(*inputs))
            if variant == "fuse":
                floors = audit.kernel_floors((k, s) for a in fusebackend.history() for k, s in a.kernels.items())
                profile = profile_step(lambda: fn(*inputs), inputs[0].device)
                rows = audit.audit(profile, floors, bandwidth) if profile else []
                row["fuse_generated_ms"] = round(profile.generated_us() / 1e3, 3) if profile else None
                row["fuse_floor_ms"] = round(sum(r.floor_us for r in rows) / 1e3, 3)
                row["fuse_worst"] = [{"name": r.name, "us": r.us, "of_floor": r.of_floor, "share": r.share}
                                     for r in rows[:3]]
            elif variant == "inductor":
                profile = profile_step(lambda: fn(*inputs), inputs[0].device)
                row["inductor_generated_ms"] = round(profile.generated_us() / 1e3, 3) if profile else None
    return row


def norm_cases(device: torch.device, bandwidth: float) -> list[dict[str, Any]]:
    rows = []
    for name, groups, shape in NORMS:
        for layout in ("channels_last", "contiguous"):
            torch.manual_seed(0)
            x = torch.randn(shape, device=device, dtype=torch.bfloat16)
            if layout == "channels_last":
                x = x.contiguous(memory_format=torch.channels_last)
            norm = torch.nn.GroupNorm(groups, shape[1]).to(device, torch.bfloat16)
            with torch.no_grad():
                norm.weight.normal_()
                norm.bias.normal_()
            # the norm and a SiLU after it, as in the VAE's and UNet's blocks
            model = torch.nn.Sequential(norm, torch.nn.SiLU())
            rows.append(run_case(f"{name} {layout}", model, (x,), bandwidth))
    return rows


def model_cases(device: torch.device, bandwidth: float) -> list[dict[str, Any]]:
    rows = []
    try:
        import timm

        torch.manual_seed(0)
        model = timm.create_model("poolformer_s12", pretrained=False).to(device, torch.bfloat16).eval()
        x = torch.randn(64, 3, 224, 224, device=device, dtype=torch.bfloat16)
        rows.append(run_case("poolformer_s12 b64", model, (x,), bandwidth))
    except ImportError as exc:
        print(f"no timm: {exc}")
    try:
        from diffusers import AutoencoderKL

        torch.manual_seed(0)
        vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, sample_size=512,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
                            down_block_types=("DownEncoderBlock2D",) * 4,
                            up_block_types=("UpDecoderBlock2D",) * 4).to(device, torch.bfloat16).eval()

        class Decoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.vae = vae

            def forward(self, z: torch.Tensor) -> torch.Tensor:
                return self.vae.decode(z).sample

        z = torch.randn(2, 4, 64, 64, device=device, dtype=torch.bfloat16)
        rows.append(run_case("sd_vae_decoder b2", Decoder().eval(), (z,), bandwidth))
    except ImportError as exc:
        print(f"no diffusers: {exc}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", action="store_true", help="also PoolFormer-S12 and SD's VAE decoder")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--without-interleave-split", action="store_true",
                        help="fuse as before the split over interleaved rows (builder._interleave): its size floor out "
                             "of reach; run in a process of its own, with its own FUSE_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR")
    args = parser.parse_args(argv)
    if args.without_interleave_split:
        from fusebackend.lowering import builder

        builder._INTERLEAVE_MIN_ELEMENTS = 1 << 62
    device = torch.device("cuda")
    bandwidth = audit.copy_bandwidth(device)
    rows = norm_cases(device, bandwidth) + (model_cases(device, bandwidth) if args.models else [])
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "copy_gbps": round(bandwidth / 1e9, 1)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "groupnorm.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print(json.dumps(meta))
    print(f"{'case':34s} {'eager':>8s} {'inductor':>9s} {'fuse':>8s} {'f/i':>5s} {'f gen':>7s} {'floor':>7s}  errors e/i/f")
    for r in rows:
        print(f"{r['case']:34s} {r['eager_ms']:8.3f} {r['inductor_ms']:9.3f} {r['fuse_ms']:8.3f} "
              f"{r['inductor_ms'] / r['fuse_ms']:5.2f} {r['fuse_generated_ms'] or 0:7.3f} {r['fuse_floor_ms']:7.3f}  "
              f"{r['inductor_err']:.1e} {r['fuse_err']:.1e}")
        for k in r["fuse_worst"][:2]:
            print(f"    {k['name'][:60]:60s} {k['us']:8.1f} us  {k['of_floor']:.0%} of floor  {k['share']:.0%} of step")


if __name__ == "__main__":
    main(sys.argv[1:])
