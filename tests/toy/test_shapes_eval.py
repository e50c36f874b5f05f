"""ShapesEval: accuracy on rendered ground truth, rejection of wrong images, robustness to the
artefacts of a small generator, and GenEval's checking rules.

Accuracy is measured on scenes rendered by the reference renderer (cairosvg) at 48 and 64 px
(alternating), 500 per category; corruptions reuse the first 40 per category.
"""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

from genalign.toy.captions import CATEGORIES, colors_spec, counting_spec, parse_caption
from genalign.toy.prompts import sample_scene_for_prompt, scene_for_spec
from genalign.toy.scenes import COLOURS, SHAPES, Scene, SceneObject, render_scene
from genalign.toy.shapes_eval import check_spec, detect_objects, evaluate

PER_CATEGORY = 500
SIZES = (48, 64)


@pytest.fixture(scope="module")
def rendered():
    """``(scenes, specs, images)``: 500 scenes per category (all prompts), images ``[3, S, S]``."""
    rng = np.random.default_rng(2024)
    scenes, specs, images = [], [], []
    for category in CATEGORIES:
        for i in range(PER_CATEGORY):
            scene, _, spec = sample_scene_for_prompt(category, rng, split="all")
            scenes.append(scene)
            specs.append(spec)
            images.append(render_scene(scene, size=SIZES[i % 2]))
    return scenes, specs, images


def subset(rendered, per_category: int):
    scenes, specs, images = rendered
    keep = [i for i in range(len(specs)) if i % PER_CATEGORY < per_category]
    return [scenes[i] for i in keep], [specs[i] for i in keep], [images[i] for i in keep]


# -- accuracy on clean renders --------------------------------------------------------------------


def test_clean_renders_are_read_correctly(rendered):
    _, specs, images = rendered
    result = evaluate(images, specs)
    assert result["counts"] == dict.fromkeys(CATEGORIES, PER_CATEGORY)
    failures = [s for s in result["per_sample"] if not s["correct"]]
    for category, accuracy in result["per_category"].items():
        assert accuracy >= 0.99, (category, accuracy, failures[:3])
    assert result["overall"] == pytest.approx(np.mean(list(result["per_category"].values())))


def test_detected_objects_match_the_scene(rendered):
    """Beyond pass/fail: every object is found with its shape, colour and position."""
    scenes, _, images = subset(rendered, 25)
    for scene, image in zip(scenes, images):
        size = image.shape[-1]
        found = detect_objects(image)
        assert len(found) == len(scene)
        for obj in scene.objects:
            nearest = min(found, key=lambda d: abs((d.box[0] + d.box[2]) / 2 / size - obj.x))
            assert (nearest.shape, nearest.colour) == (obj.shape, obj.colour)
            np.testing.assert_allclose(np.array(nearest.box) / size, obj.box, atol=1.5 / size)


# -- wrong images fail ------------------------------------------------------------------------------


def negative_scene(scene: Scene, spec: dict, rng: np.random.Generator) -> Scene:
    """The scene changed so that it no longer satisfies ``spec``."""
    objects = list(scene.objects)
    tag = spec["tag"]
    if tag in ("single_object", "two_object"):  # a required shape becomes one not asked for
        named = {c["class"] for c in spec["include"]}
        index = int(rng.integers(len(objects)))
        objects[index] = replace(objects[index], shape=str(rng.choice([s for s in SHAPES if s not in named])))
    elif tag == "counting":  # one fewer or one more
        shape, count = spec["include"][0]["class"], spec["include"][0]["count"]
        wrong = count - 1 if count == 4 or rng.random() < 0.5 else count + 1
        return scene_for_spec(counting_spec(shape, wrong), rng)
    elif tag == "colors":  # another colour
        colour = objects[0].colour
        objects[0] = replace(objects[0], colour=str(rng.choice([c for c in COLOURS if c != colour])))
    elif tag == "position":  # mirror the layout: the relation reverses
        relation = spec["include"][1]["position"][0]
        if relation in ("left of", "right of"):
            objects = [replace(o, x=round(1 - o.x, 4)) for o in objects]
        else:
            objects = [replace(o, y=round(1 - o.y, 4)) for o in objects]
    elif tag == "color_attr":  # the two colours swapped between the objects
        first, second = objects
        objects = [replace(first, colour=second.colour), replace(second, colour=first.colour)]
    return Scene(tuple(objects))


def test_wrong_images_fail(rendered):
    scenes, specs, _ = subset(rendered, 50)
    rng = np.random.default_rng(7)
    negatives = [negative_scene(scene, spec, rng) for scene, spec in zip(scenes, specs)]
    for negative, spec in zip(negatives, specs):
        assert not check_spec(negative.objects, spec).correct, (spec["prompt"], negative)
    images = [render_scene(scene, size=SIZES[i % 2]) for i, scene in enumerate(negatives)]
    result = evaluate(images, specs)
    for category, accuracy in result["per_category"].items():
        assert accuracy <= 0.02, (category, accuracy)  # at most one negative in 50 passes


def svg_image(body: str, size: int = 64) -> torch.Tensor:
    import cairosvg

    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}"><rect width="{size}" height="{size}" fill="#fff"/>{body}</svg>'
    png = cairosvg.svg2png(bytestring=svg.encode())
    return (
        torch.from_numpy(np.array(Image.open(io.BytesIO(png)).convert("RGB"))).permute(2, 0, 1).float() / 255
    )


@pytest.mark.parametrize(
    ("image", "caption"),
    [
        (torch.ones(3, 64, 64), "a photo of a circle"),  # blank
        (torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0)), "a photo of a square"),  # noise
        (
            torch.tensor([0.9, 0.1, 0.1])[:, None, None].expand(3, 64, 64),
            "a photo of a red square",
        ),  # painted canvas
        (svg_image('<circle cx="32" cy="32" r="12" fill="#ff80c0"/>'), "a photo of a red circle"),  # pink
        (
            svg_image('<circle cx="32" cy="32" r="12" fill="none" stroke="#e61a1a" stroke-width="2"/>'),
            "a photo of a circle",
        ),
        (svg_image('<ellipse cx="32" cy="32" rx="20" ry="8" fill="#e61a1a"/>'), "a photo of a circle"),
        (
            svg_image('<polygon points="20,20 44,20 32,44" fill="#1a40f2"/>'),
            "a photo of a triangle",
        ),  # apex down
        (
            svg_image(
                '<circle cx="24" cy="32" r="10" fill="#e61a1a"/><circle cx="40" cy="32" r="10" fill="#e61a1a"/>'
            ),
            "a photo of two circles",
        ),  # merged
    ],
)
def test_garbage_is_never_success(image, caption):
    assert evaluate(image[None], [parse_caption(caption)])["overall"] == 0.0


def test_touching_objects_of_different_colours_are_split():
    scene = Scene(
        (SceneObject("circle", "red", 0.35, 0.5, 0.3), SceneObject("square", "blue", 0.65, 0.5, 0.3))
    )
    for size in SIZES:
        found = detect_objects(render_scene(scene, size))
        assert sorted((o.shape, o.colour) for o in found) == [("circle", "red"), ("square", "blue")]
        assert (
            evaluate(render_scene(scene, size)[None], [parse_caption("a red circle left of a blue square")])[
                "overall"
            ]
            == 1.0
        )


# -- robustness -------------------------------------------------------------------------------------


def gaussian_blur(image: torch.Tensor, rng: np.random.Generator, sigma: float = 1.0) -> torch.Tensor:
    return torch.from_numpy(ndimage.gaussian_filter(image.numpy(), sigma=(0, sigma, sigma))).clamp(0, 1)


def gaussian_noise(image: torch.Tensor, rng: np.random.Generator, std: float = 0.05) -> torch.Tensor:
    return (image + torch.from_numpy(rng.normal(0, std, image.shape)).float()).clamp(0, 1)


def jpeg(image: torch.Tensor, rng: np.random.Generator, quality: int = 75) -> torch.Tensor:
    buffer = io.BytesIO()
    Image.fromarray((image * 255).round().byte().permute(1, 2, 0).numpy()).save(
        buffer, "JPEG", quality=quality
    )
    return torch.from_numpy(np.array(Image.open(buffer).convert("RGB"))).permute(2, 0, 1).float() / 255


def colour_shift(image: torch.Tensor, rng: np.random.Generator, amount: float = 0.06) -> torch.Tensor:
    return (image + torch.from_numpy(rng.uniform(-amount, amount, (3, 1, 1))).float()).clamp(0, 1)


CORRUPTIONS = {"blur": gaussian_blur, "noise": gaussian_noise, "jpeg": jpeg, "colour_shift": colour_shift}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_robust_to_mild_corruptions(rendered, corruption):
    """Gaussian blur sigma 1 px, noise std 0.05, JPEG quality 75, colour shift up to 0.06 per
    channel, at 48 and 64 px: at least 95% of scenes read correctly."""
    _, specs, images = subset(rendered, 40)
    rng = np.random.default_rng(0)
    corrupted = [CORRUPTIONS[corruption](image, rng) for image in images]
    result = evaluate(corrupted, specs)
    assert result["overall"] >= 0.95, result["per_category"]
    assert min(result["per_category"].values()) >= 0.9, result["per_category"]


def test_corrupted_wrong_images_still_fail(rendered):
    scenes, specs, _ = subset(rendered, 20)
    rng = np.random.default_rng(3)
    negatives = [negative_scene(scene, spec, rng) for scene, spec in zip(scenes, specs)]
    images = [gaussian_noise(gaussian_blur(render_scene(s, 48), rng), rng) for s in negatives]
    assert evaluate(images, specs)["image_accuracy"] <= 0.025


# -- GenEval's rules ---------------------------------------------------------------------------------


def objects(*items):
    """SceneObjects from ``(shape, colour, x, y)`` with size 0.2."""
    return [SceneObject(shape, colour, x, y, 0.2) for shape, colour, x, y in items]


def test_counting_is_exact_and_ignores_other_shapes():
    spec = counting_spec("square", 2)
    two = objects(("square", "red", 0.2, 0.2), ("square", "blue", 0.8, 0.2))
    assert check_spec(two, spec).correct
    assert check_spec([*two, *objects(("circle", "red", 0.5, 0.8))], spec).correct
    three = [*two, *objects(("square", "red", 0.5, 0.8))]
    check = check_spec(three, spec)
    assert not check.correct and check.reasons == ["expected square<3, found 3"]
    assert not check_spec(two[:1], spec).correct


def test_colour_clause_needs_enough_objects_of_that_colour():
    spec = colors_spec("red", "circle")
    assert check_spec(objects(("circle", "blue", 0.2, 0.2), ("circle", "red", 0.8, 0.2)), spec).correct
    check = check_spec(objects(("circle", "blue", 0.2, 0.2)), spec)
    assert (check.correct, check.passed, check.total) == (False, 1, 2)


def test_position_and_partial_credit():
    spec = parse_caption("a red circle left of a blue square")
    circle, square = ("circle", "red", 0.2, 0.5), ("square", "blue", 0.8, 0.5)
    assert check_spec(objects(circle, square), spec).fraction == 1.0
    swapped = check_spec(objects(("circle", "red", 0.8, 0.5), ("square", "blue", 0.2, 0.5)), spec)
    assert not swapped.correct and swapped.passed == 4 and swapped.total == 5
    assert "found right of" in swapped.reasons[0]
    no_target = check_spec(objects(circle), spec)  # square missing: its colour and the relation fail too
    assert (no_target.passed, no_target.total) == (2, 5)
    close = check_spec(objects(("circle", "red", 0.48, 0.5), ("square", "blue", 0.52, 0.5)), spec)
    assert not close.correct  # within GenEval's margin: no relation
