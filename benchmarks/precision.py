"""Rollout precision: int8 vs fp32 on CPU, fp8 vs bf16 on a GPU, and how well cheap previews rank samples.

The model is the tiny SD3 pipeline (``tiny:sd3``: its text encoders and VAE) with its transformer
replaced by an SD3-layout ``SD3Transformer2DModel`` of a few tens of millions of parameters built
from a config (random weights; ``--layers``/``--heads``/``--head-dim`` size it), so that linear
layers dominate the cost as they do in real models.

1. **Speed.** ``policy.rollout`` with the fp32 denoiser and with its dynamic-int8 copy
   (``genalign.policies.precision``, every linear layer quantised) on the same prompts, seeds and
   initial noise, timed side by side in alternating repeats (``_timing.compare``); the number to
   read is the ratio of median times int8 / fp32 (below 1 is a speedup).
2. **Ranking fidelity.** A pool of ``--pool`` candidates for each of ``--prompts`` prompts is
   rendered at training settings (fp32, ``--steps`` ODE steps) and as Sol-RL previews (fewer
   ``--preview-steps``, in fp32, int8 and simulated NVFP4), all from the same seeds and initial
   noise, and scored with JPEG compressibility. Per prompt: Kendall tau and Spearman rho between
   preview and full rewards and the top-k hit rate (``genalign.algorithms.sol_rl.ranking_fidelity``),
   averaged over prompts. Simulated NVFP4 is for fidelity only: it is slower than fp32 by design.

    python benchmarks/precision.py                      # ~3-5 minutes on one CPU thread
    python benchmarks/precision.py --layers 4 --pool 8 --json /tmp/precision.json
    python benchmarks/precision.py --device cuda --layers 24 --heads 24 --size 512 --batch 4

On ``--device cuda`` the pair is bf16 (the reference, as Sol-RL trains) against torchao fp8
(needs compute capability >= 8.9 and ``pip install torchao``; ``--fast`` picks another), and the
ranking reference is bf16 at the full step count. ``--layers 24 --heads 24`` (head dim 64) is
SD3-Medium's transformer shape, about 2B parameters; ``--size 512`` gives 4,096 image tokens, as
SD3 has at 1024 px (the tiny VAE downsamples 4x, not 8x).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import compare  # noqa: E402

from genalign.algorithms.sol_rl import ranking_fidelity  # noqa: E402
from genalign.policies import load_policy  # noqa: E402
from genalign.policies.base import per_sample_generators  # noqa: E402
from genalign.policies.precision import quantize_denoiser, swapped_denoiser  # noqa: E402
from genalign.rewards import load_reward  # noqa: E402

PROMPTS = ["a red circle on a white background", "two blue squares", "a green triangle", "a yellow star"]


def build_policy(layers: int, heads: int, head_dim: int, size: int, device: str):
    from diffusers import SD3Transformer2DModel

    policy = load_policy("flow", "tiny:sd3", device=device)
    tiny = policy.denoiser.config
    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=tiny.sample_size,
        patch_size=tiny.patch_size,
        in_channels=tiny.in_channels,
        out_channels=tiny.out_channels,
        num_layers=layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=tiny.joint_attention_dim,
        caption_projection_dim=heads * head_dim,
        pooled_projection_dim=tiny.pooled_projection_dim,
        # room for the image's patch grid at --size (SD3's own table is 192 patches wide)
        pos_embed_max_size=max(
            tiny.pos_embed_max_size, size // (policy.pipeline.vae_scale_factor * tiny.patch_size)
        ),
    ).eval()
    transformer.requires_grad_(False)
    policy.pipeline.transformer = transformer.to(device)
    return policy, sum(p.numel() for p in transformer.parameters())


def initial_noise(policy, seeds: torch.Tensor, height: int, width: int) -> torch.Tensor:
    _, generators = per_sample_generators(len(seeds), None, policy.device, seeds)
    return policy.prepare_latents(len(seeds), height, width, generators)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--size", type=int, default=64, help="image height and width in pixels")
    parser.add_argument("--batch", type=int, default=2, help="samples per timed rollout")
    parser.add_argument("--steps", type=int, default=10, help="training sampling steps")
    parser.add_argument("--preview-steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--pool", type=int, default=12, help="candidates per prompt")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu (fp32 vs int8) or cuda (bf16 vs fp8)")
    parser.add_argument(
        "--fast", default=None, help="the cheap precision (default: int8 on CPU, fp8 on CUDA)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("genalign").setLevel(logging.ERROR)
    cuda = args.device.startswith("cuda")
    base_name = "bf16" if cuda else "fp32"
    fast_name = args.fast or ("fp8" if cuda else "int8")

    policy, parameters = build_policy(args.layers, args.heads, args.head_dim, args.size, args.device)
    size = args.size
    tokens = (size // (policy.pipeline.vae_scale_factor * policy.denoiser.config.patch_size)) ** 2
    where = torch.cuda.get_device_name() if cuda else f"{args.threads} CPU thread(s)"
    print(
        f"SD3-layout transformer: {parameters / 1e6:.1f}M parameters, {size}x{size} px ({tokens} tokens), {where}"
    )
    base, base_report = quantize_denoiser(policy.denoiser, base_name)
    fast, report = quantize_denoiser(policy.denoiser, fast_name)
    print(
        f"{fast_name}: {len(report.quantized)} linear layers quantised, {len(report.skipped)} kept ({report.backend})"
    )

    # 1. Speed: the same rollout with the reference and the cheap denoiser
    seeds = torch.arange(args.batch) + 100
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    kwargs = {
        "num_inference_steps": args.steps,
        "guidance_scale": 1.0,
        "mode": "ode",
        "height": size,
        "width": size,
    }
    noise = initial_noise(policy, seeds, size, size)

    def base_rollout():
        with swapped_denoiser(policy, base, base_report.compute_dtype):
            return policy.rollout(prompts, seeds=seeds, latents=noise, **kwargs)

    def fast_rollout():
        with swapped_denoiser(policy, fast, report.compute_dtype):
            return policy.rollout(prompts, seeds=seeds, latents=noise, **kwargs)

    comparison = compare(fast_rollout, base_rollout, repeats=args.repeats, warmup=1, device=args.device)
    difference = float((fast_rollout().images.float() - base_rollout().images.float()).abs().max())
    summary = comparison.summary() if hasattr(comparison, "summary") else {}
    ratio = comparison.ratio
    print(
        f"rollout ({args.batch} samples x {args.steps} steps): {base_name} {min(comparison.baseline):.3f}s, "
        f"{fast_name} {min(comparison.measured):.3f}s (best of {args.repeats}); median ratio {fast_name}/{base_name} = {ratio:.3f} "
        f"(paired {comparison.paired_ratio:.3f} +- {comparison.noise:.3f}); speedup {1 / ratio:.2f}x; "
        f"max|dimg| {difference:.4f}"
    )

    # 2. Ranking fidelity of previews against full-precision renders of the same candidates
    reward = load_reward("jpeg_compressibility")
    pool_prompts = [PROMPTS[p] for p in range(args.prompts) for _ in range(args.pool)]
    pool_seeds = torch.arange(len(pool_prompts)) + 1000
    pool_noise = initial_noise(policy, pool_seeds, size, size)

    def scores(denoiser, dtype, steps=args.steps) -> torch.Tensor:
        run = {**kwargs, "num_inference_steps": steps}
        with swapped_denoiser(policy, denoiser, dtype):
            trajectory = policy.rollout(pool_prompts, seeds=pool_seeds, latents=pool_noise, **run)
        return (
            reward(trajectory.images.float().cpu(), pool_prompts)
            .scores.float()
            .reshape(args.prompts, args.pool)
        )

    full = scores(base, base_report.compute_dtype)
    previews = {
        f"{base_name}, {args.preview_steps} steps": scores(
            base, base_report.compute_dtype, args.preview_steps
        ),
        f"{fast_name}, {args.steps} steps": scores(fast, report.compute_dtype),
        f"{fast_name}, {args.preview_steps} steps": scores(fast, report.compute_dtype, args.preview_steps),
    }
    nvfp4, nvfp4_report = quantize_denoiser(policy.denoiser, "nvfp4_simulated")
    previews[f"nvfp4 (SIMULATED), {args.preview_steps} steps"] = scores(
        nvfp4, nvfp4_report.compute_dtype, args.preview_steps
    )
    results = {
        "parameters": parameters,
        "device": where,
        "tokens": tokens,
        "base": base_name,
        "fast": fast_name,
        "speed": {
            f"ratio_{fast_name}_over_{base_name}": ratio,
            "paired_ratio": comparison.paired_ratio,
            "noise": comparison.noise,
            f"{base_name}_seconds": comparison.baseline,
            f"{fast_name}_seconds": comparison.measured,
            "max_image_difference": difference,
            **summary,
        },
        "fidelity": {},
    }
    print(
        f"ranking fidelity vs {base_name} {args.steps} steps ({args.prompts} prompts x {args.pool} candidates, "
        f"JPEG compressibility, top-{args.top_k}):"
    )
    for name, preview in previews.items():
        fidelity = ranking_fidelity(preview, full, args.top_k)
        results["fidelity"][name] = fidelity
        print(
            f"  {name:34s} Kendall tau {fidelity['kendall_tau']:.3f}  Spearman rho {fidelity['spearman_rho']:.3f}  "
            f"top-{args.top_k} hit {fidelity['top_k_hit_rate']:.3f}"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
