"""Training memory of Astrolabe's trainable forward versus video length, with and without streaming
windows (issue #26 item 8; target: flat within 10% from 2x to 8x the window length).

For a window of W latent frames and videos of 1W (the reference), 2W, 4W and 8W latent frames, one
training forward + backward of the part of the Astrolabe loss that carries gradient: the policy's
x0 prediction at one noise level, as ``genalign.trainers.losses.astrolabe`` makes it, with the mean
square of the prediction as loss (memory does not depend on which loss). Modes:

* ``whole``: ``ARVideoPolicy.predict_video_x0`` over the whole video (``window_frames: null``);
* ``window``: ``predict_window_x0`` on the last W frames, the frames before it a no-gradient
  KV-cached history (``train.astrolabe.window_frames: W``), full block-causal attention;
* ``window_local``: the same under LongLive's local attention window (``policy.local_window``;
  ``--local-window``, default 4 blocks with 1 sink block), whose cache evicts what no later block sees.

The model has toy-ar-video's layout (``genalign.toy.generators.video.build_video_transformer``:
width 128, 4 layers, 4 x 4 patches of 12 x 12 x 8 latents = 9 tokens per frame, blocks of 2),
randomly initialised, fully trained (``lora: null``, as ``configs/toy/astrolabe_video.yaml``), with
random 16 x 64 prompt embeddings (toy-clip's text tower's shape). Columns per (mode, length):

* ``saved MiB``: the bytes autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``),
  each storage counted once, the model's parameters and buffers left out (they are held anyway).
  Deterministic on a given device and attention backend: the number the test asserts on. What it
  holds depends on the attention kernel (CPU's keeps different tensors than CUDA's flash kernel);
* ``cache MiB``: the keys and values the KV cache holds when the window runs (the detached
  history; 0 without a cache), and ``cache peak``: the most it held at any point of the forward
  (the history is prefilled block by block, so under a local window it stays within the span);
* ``peak MiB``: on CUDA the rise of ``torch.cuda.max_memory_allocated`` over the call (a separate
  call, no hooks); on CPU the rise of the process's resident set (``_timing.peak_memory``), rough
  and noisy (allocator reuse, other threads): a GPU run gives the real reading;
* ``x 2W``: each column's ratio to the same mode's 2W row (the target compares 2W .. 8W).

The old-policy and reference predictions of the loss run under ``torch.no_grad`` and save nothing;
their transient activations count toward a real step's peak, not toward what is kept for backward.

    python benchmarks/astrolabe_memory.py                        # CPU, W = 8, about 15 s
    python benchmarks/astrolabe_memory.py --device cuda --window 8 --batch 4 --out /tmp/mem.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from _timing import peak_memory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from genalign.policies import ar_video  # noqa: E402
from genalign.policies.video_kv_cache import LocalWindow  # noqa: E402

MODES = ("whole", "window", "window_local")
MULTIPLES = (1, 2, 4, 8)
TEXT_TOKENS, TEXT_DIM = 16, 64  # toy-clip's text tower: 16 tokens of 64 features per prompt
LATENT_SIZE = 12  # 48 px frames through the toy video VAE (4x spatial, 8 channels)
TIMESTEP = 750.0  # one of the loss's levels; memory does not depend on it
MIB = 2**20


@dataclass
class Row:
    """One (mode, length) measurement; bytes are exact, ``peak_mib`` as ``_timing.peak_memory``."""

    mode: str
    multiple: int
    frames: int
    saved_bytes: int
    saved_storages: int
    cache_bytes: int
    cache_peak_bytes: int
    peak_mib: float | None
    seconds: float


def build_policy(
    max_frames: int, width: int = 128, layers: int = 4, device: str = "cpu", seed: int = 0
) -> ar_video.ARVideoPolicy:
    """An ``ARVideoPolicy`` on a random transformer of toy-ar-video's layout (rotary positions for
    ``max_frames`` latent frames), fully trainable; the VAE and text encoder are the tiny ones
    (unused: the benchmark feeds latents and prompt embeddings)."""
    from genalign.tiny.video import ar_video_pipeline
    from genalign.toy.generators.video import build_video_transformer, build_video_vae, video_pipeline

    tiny = ar_video_pipeline(seed=seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = build_video_transformer(
            TEXT_DIM, width=width, num_layers=layers, rope_max_seq_len=max(64, max_frames)
        )
        vae = build_video_vae()
    pipeline = video_pipeline(vae, tiny.text_encoder, tiny.tokenizer, transformer)
    return ar_video.ARVideoPolicy(pipeline, lora=None, train=True, device=device)


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def saved_bytes(fn: Callable[[], torch.Tensor], held: set[int]) -> tuple[torch.Tensor, int, int]:
    """Run ``fn`` (a forward returning a loss) counting what autograd saves for backward: ``(loss,
    bytes, storages)``, each storage once, storages whose address is in ``held`` left out."""
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "meta":
            pointer, nbytes = _storage(tensor)
            if pointer not in held:
                seen[pointer] = nbytes
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = fn()
    return loss, sum(seen.values()), len(seen)


def _cache_bytes(cache: Any) -> int:
    return sum(_storage(t)[1] for t in [*cache.keys, *cache.values] if t is not None)


@contextlib.contextmanager
def recording_caches(record: list[tuple[int, int]]) -> Iterator[None]:
    """While open, every KV cache the policy opens reports ``(bytes held at its end, most bytes
    held)`` into ``record`` (the most is read before each eviction and at the end)."""
    original = ar_video.block_kv_cache

    @contextlib.contextmanager
    def recording(transformer: Any, window: LocalWindow | None = None) -> Iterator[Any]:
        with original(transformer, window) as cache:
            most = [0]
            evict = cache._evict

            def evict_and_note(tokens_per_frame: int) -> None:
                most[0] = max(most[0], _cache_bytes(cache))
                evict(tokens_per_frame)

            cache._evict = evict_and_note
            try:
                yield cache
            finally:
                end = _cache_bytes(cache)
                record.append((end, max(most[0], end)))

    ar_video.block_kv_cache = recording
    try:
        yield
    finally:
        ar_video.block_kv_cache = original


def training_forward(policy, mode: str, frames: int, window: int, batch: int, seed: int = 0):
    """``() -> loss``: the mode's x0 prediction with gradient on a fixed noised video, squared."""
    generator = torch.Generator().manual_seed(seed)
    channels = int(policy.denoiser.config.in_channels)
    shape = (batch, channels, frames, LATENT_SIZE, LATENT_SIZE)
    latents = torch.randn(shape, generator=generator).to(policy.device)
    levels = torch.full((batch, frames), TIMESTEP, device=policy.device)
    embeds = torch.randn(batch, TEXT_TOKENS, TEXT_DIM, generator=generator).to(policy.device)
    conditioning = {"prompt_embeds": embeds}
    if mode == "whole":
        return lambda: policy.predict_video_x0(latents, levels, conditioning).square().mean()
    start = frames - window
    return lambda: policy.predict_window_x0(latents, levels, conditioning, start).square().mean()


def measure(policy, mode: str, frames: int, window: int, batch: int, peak: bool = True) -> Row:
    """One (mode, length) row: saved bytes and cache bytes in one forward + backward, then (when
    ``peak``) the peak rise in another, without hooks."""
    forward = training_forward(policy, mode, frames, window, batch)
    held = {_storage(t)[0] for t in [*policy.denoiser.parameters(), *policy.denoiser.buffers()]}
    policy.denoiser.zero_grad(set_to_none=True)
    caches: list[tuple[int, int]] = []
    start = time.perf_counter()
    with recording_caches(caches):
        loss, nbytes, storages = saved_bytes(forward, held)
    loss.backward()
    seconds = time.perf_counter() - start
    del loss
    policy.denoiser.zero_grad(set_to_none=True)
    peak_mib = None
    if peak:
        _, peak_mib = peak_memory(lambda: forward().backward(), policy.device)
        policy.denoiser.zero_grad(set_to_none=True)
    cache_end = max((end for end, _ in caches), default=0)
    cache_most = max((most for _, most in caches), default=0)
    return Row(mode, frames // window, frames, nbytes, storages, cache_end, cache_most, peak_mib, seconds)


def measure_all(
    window: int,
    batch: int = 1,
    device: str = "cpu",
    modes: tuple[str, ...] = MODES,
    multiples: tuple[int, ...] = MULTIPLES,
    local_window: tuple[int, int] | None = None,
    peak: bool = True,
    width: int = 128,
    layers: int = 4,
) -> list[Row]:
    """Every (mode, multiple) row on one policy; ``local_window`` (frames, sink frames) for the
    ``window_local`` mode, default 4 blocks with 1 sink block."""
    policy = build_policy(window * max(multiples), width, layers, device)
    block = policy.block_size
    if window <= 0 or window % block:
        raise ValueError(f"--window {window} must be a positive multiple of the block size {block}")
    local = LocalWindow(*(local_window or (4 * block, block)))
    local.check_block(block)
    rows = []
    for mode in modes:
        policy.local_window = local if mode == "window_local" else None
        for multiple in multiples:
            rows.append(measure(policy, mode, window * multiple, window, batch, peak))
    policy.local_window = None
    return rows


def ratios(rows: list[Row], field: str, reference: int = 2) -> dict[tuple[str, int], float | None]:
    """Each row's ``field`` over its mode's ``reference`` multiple's (None when that is 0 or missing)."""
    base = {r.mode: getattr(r, field) for r in rows if r.multiple == reference}
    out = {}
    for r in rows:
        value, ref = getattr(r, field), base.get(r.mode)
        out[(r.mode, r.multiple)] = None if value is None or not ref else value / ref
    return out


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row]) -> str:
    """A markdown table, modes side by side by row, with the ratios to each mode's 2W row."""
    saved, peak = ratios(rows, "saved_bytes"), ratios(rows, "peak_mib")
    head = "| mode | length | frames | saved MiB | x 2W | cache MiB | cache peak MiB | peak MiB | x 2W |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        key = (r.mode, r.multiple)
        lines.append(
            f"| {r.mode} | {r.multiple}W | {r.frames} | {r.saved_bytes / MIB:.2f} | {_cell(saved[key])} | "
            f"{r.cache_bytes / MIB:.2f} | {r.cache_peak_bytes / MIB:.2f} | {_cell(r.peak_mib, 1)} | {_cell(peak[key])} |"
        )
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--window", type=int, default=8, help="W, latent frames (a multiple of the block, 2)")
    parser.add_argument("--batch", type=int, default=1, help="videos per forward")
    parser.add_argument("--local-window", type=int, nargs=2, metavar=("FRAMES", "SINK"), default=None)
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory calls")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.batch <= 0:
        parser.error(f"--batch must be positive, got {args.batch}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here")
    if args.window <= 0 or args.window % 2:
        parser.error(f"--window {args.window} must be a positive multiple of the block size 2")
    if args.local_window is not None:
        frames, sink = args.local_window
        if sink < 0 or frames - sink < 2:
            parser.error(f"--local-window {frames} {sink}: need FRAMES - SINK >= 2 (a block) and SINK >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    torch.manual_seed(0)
    start = time.perf_counter()
    rows = measure_all(
        args.window, args.batch, args.device, local_window=args.local_window, peak=not args.no_peak
    )
    print(table(rows))
    kind = "CUDA max_memory_allocated rise" if args.device.startswith("cuda") else "CPU RSS rise (rough)"
    print(
        f"W = {args.window}, batch {args.batch}, {args.device}; peak: {kind}; {time.perf_counter() - start:.0f} s"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"window": args.window, "batch": args.batch, "device": args.device, "peak": kind}
        args.out.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
