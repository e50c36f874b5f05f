"""Rollout with log-probs versus the plain diffusers pipeline at real model size (GPU check).

Builds an SD 1.5-sized pipeline (UNet 860M, SD VAE, CLIP ViT-L text encoder) with random weights
from its published architecture (nothing is downloaded), in fp16 on CUDA, and times
``SDPolicy.rollout`` (DDIM, eta = 0, CFG 7.5, log-probs recorded) against the pipeline's own
``__call__`` with the same scheduler, seeds, batch and steps, side by side in one run.

    python benchmarks/rollout_realsize.py --batch-size 8 --steps 20 --repeats 5
    python benchmarks/rollout_realsize.py --save /tmp/sd15-random   # then train on it:
    python benchmarks/train_step.py --recipe configs/sd15/ddpo_aesthetic.yaml model.path=/tmp/sd15-random ...

``--save DIR`` writes the random pipeline (fp16 on CUDA) as a diffusers folder, so that the real
recipes can load an SD 1.5-sized model offline (``benchmarks/gpu_checks.sh`` does this).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare  # noqa: E402


def sd15_sized_pipeline(device: str, dtype: torch.dtype):
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from genalign.tiny.tokenizers import byte_level_clip_tokenizer

    with torch.device(device):
        unet = UNet2DConditionModel(cross_attention_dim=768, sample_size=64)  # SD 1.5's architecture
        vae = AutoencoderKL(
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            latent_channels=4,
            layers_per_block=2,
            sample_size=512,
        )
        text = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=514,
                hidden_size=768,
                intermediate_size=3072,
                num_hidden_layers=12,
                num_attention_heads=12,
                bos_token_id=512,
                eos_token_id=513,
                pad_token_id=513,
            )
        )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text,
        tokenizer=byte_level_clip_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return pipe.to(device=device, dtype=dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--json", default=None)
    parser.add_argument("--save", default=None, help="write the random pipeline to this folder")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32

    from genalign.policies import SDPolicy

    pipe = sd15_sized_pipeline(device, dtype)
    pipe.set_progress_bar_config(disable=True)
    policy = SDPolicy.from_pipe(pipe, train=False, device=device)
    prompts = [f"a photo of object {i}" for i in range(args.batch_size)]
    seeds = torch.arange(args.batch_size) + 1000

    def rollout():
        return policy.rollout(
            prompts,
            num_inference_steps=args.steps,
            guidance_scale=7.5,
            eta=0.0,
            seeds=seeds,
            height=args.size,
            width=args.size,
        )

    def plain():
        generators = [torch.Generator(device).manual_seed(int(s)) for s in seeds]
        return pipe(
            prompts,
            num_inference_steps=args.steps,
            guidance_scale=7.5,
            eta=0.0,
            generator=generators,
            height=args.size,
            width=args.size,
            output_type="pt",
        )

    with torch.no_grad():
        difference = (rollout().images - plain().images.float()).abs().max().item()
        result = compare(rollout, plain, repeats=args.repeats, warmup=1, device=device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    row = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "batch": args.batch_size,
        "steps": args.steps,
        "size": args.size,
        "rollout_s": result.measured_median,
        "pipeline_s": result.baseline_median,
        "ratio": result.ratio,
        "paired_ratio": result.paired_ratio,
        "max_abs_image_diff": difference,
        "peak_gib": peak,
    }
    print(json.dumps(row, indent=2))
    print(f"rollout/pipeline = {result.ratio:.3f} (target <= 1.10)")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2))
    if args.save:
        pipe.save_pretrained(args.save)
        print(f"saved the random SD 1.5-sized pipeline to {args.save}")


if __name__ == "__main__":
    main()
