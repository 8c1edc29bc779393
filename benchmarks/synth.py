"""Seeded synthetic images for the side-by-side benchmark (``benchmarks.peers``), at a model's input size.

    draw(kind, height, width, rng) -> uint8 H,W,3 (BGR, as OpenCV writes and reads it)

Kinds: ``line`` (one text line filling the height: a text-direction classifier's crop, half of them turned 180
degrees), ``upright_line`` (the same, never turned: a recognizer's crop, which the direction classifier has turned
upright before it reaches the recognizer), ``font_line`` (an upright line in a TrueType font: the DejaVu and STIX
fonts matplotlib ships, words and codes, as printed text looks; rendered by Pillow's FreeType, so another Pillow
version may move a pixel), ``page`` (lines of text of several sizes on a page: a text detector's input), ``page4``
(a page turned by 0/90/180/270 degrees: page orientation), ``layout`` (a page of title, paragraphs, a ruled table
and a figure box: a layout detector's), ``shapes`` (filled shapes, skin-toned ellipses and a few large characters on
a gradient: a generic detector's), ``faces`` and ``faces_held_out`` (``shapes`` with one to three real faces pasted
in, and patches of real non-face photographs: a person detector's; the faces are the 100 of Labeled Faces in the
Wild that scikit-image's wheel ships as ``skimage/data/lfw_subset.npy``, 25 x 25 grey, tinted to skin tones and
scaled up; ``faces`` draws from the first half of the faces and of the non-face patches, ``faces_held_out`` from the
second, so calibration and held-out images share no face), ``scenes`` and ``scenes_held_out`` (``shapes`` with
one to three of scikit-image's photographs of things a COCO detector knows pasted in -- a person, a cat, a
motorcycle, a rocket; a man with a camera, a cup, the motorcycle from the other eye, a clock: the two kinds share no
photograph -- and faces as ``faces``: a general object detector's), ``captcha`` (a text captcha as the ``captcha`` package's
``ImageCaptcha`` draws one, but seeded, in ``font_line``'s fonts: a captcha reader's). Text is drawn with
``cv2.putText`` (Hershey fonts); the same seed gives the same images on any machine (NumPy's PCG64 and OpenCV's
deterministic rasterizer).
"""
from __future__ import annotations

import functools
import string
from pathlib import Path

import cv2
import numpy as np

KINDS = ("line", "upright_line", "font_line", "page", "page4", "layout", "shapes", "faces", "faces_held_out",
         "scenes", "scenes_held_out", "captcha")
FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX,
         cv2.FONT_HERSHEY_PLAIN)
CHARS = string.ascii_letters + string.digits + "    .,:-"


WORDS = ("the of and to in is for on with as by at from that this be are was it or an which not can each all "
         "one two three new first time year order number page total date price name code part item model "
         "type data file line text image table value report account amount invoice street road city station "
         "open close start stop left right north south east west main center service office market store "
         "bank hotel water power light green black white red blue small large high low hours daily weekly "
         "Monday Friday January March June October Tel No Ltd Inc Co Street Road Avenue Total Date Price").split()


def _text(rng, n: int) -> str:
    return "".join(rng.choice(list(CHARS), n)).strip() or "A"


def _font_files() -> list[Path]:
    import matplotlib
    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    return sorted(p for p in ttf.glob("*.ttf") if p.stem.startswith(("DejaVuSans", "DejaVuSerif", "STIXGeneral"))
                  and "Display" not in p.stem)


def _words(rng, chars: int) -> str:
    """Words, numbers and codes, about ``chars`` characters: what a printed line holds."""
    out = []
    while sum(len(w) + 1 for w in out) < chars:
        r = rng.random()
        if r < 0.7:
            w = str(rng.choice(WORDS))
            out.append(w.capitalize() if rng.random() < 0.2 else w)
        elif r < 0.85:
            out.append(f"{rng.integers(0, 10 ** int(rng.integers(1, 6)))}" + str(rng.choice(["", "", ".", ",", ":"])))
        else:
            out.append(_text(rng, int(rng.integers(3, 8))).replace(" ", ""))
    return " ".join(out)


def _paper(rng, h: int, w: int) -> np.ndarray:
    """A light background with a slight tint, a gradient and sensor noise."""
    base = rng.uniform(185, 250, 3)
    ramp = np.linspace(-1, 1, w)[None, :, None] * rng.uniform(-15, 15, 3)
    img = base + ramp + rng.normal(0, rng.uniform(1, 6), (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _ink(rng) -> tuple:
    return tuple(int(v) for v in rng.uniform(0, 90, 3))


def _put_line(img, rng, x: int, y: int, height: int, width: int) -> None:
    """Text about ``height`` pixels tall from (x, baseline y), as many characters as fit in ``width``."""
    font = int(rng.choice(FONTS))
    thick = int(rng.integers(1, 3))
    scale = cv2.getFontScaleFromHeight(font, max(int(height), 4), thick)
    (cw, _), _ = cv2.getTextSize("W", font, scale, thick)
    n = max(1, int(width / max(cw * 0.75, 1)))
    cv2.putText(img, _text(rng, int(rng.integers(max(1, n // 2), n + 1))), (int(x), int(y)), font, scale, _ink(rng),
                thick, cv2.LINE_AA)


def line(rng, h: int, w: int, turned: float = 0.5) -> np.ndarray:
    img = _paper(rng, h, w)
    th = int(h * rng.uniform(0.45, 0.7))
    _put_line(img, rng, rng.integers(0, max(1, w // 10)), (h + th) // 2, th, w)
    return img[::-1, ::-1].copy() if rng.random() < turned else img


def upright_line(rng, h: int, w: int) -> np.ndarray:
    return line(rng, h, w, turned=0.0)


def font_line(rng, h: int, w: int) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    img = _paper(rng, h, w)
    fonts = _font_files()
    font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(h * rng.uniform(0.5, 0.75)))
    x = int(rng.integers(0, max(1, w // 10)))
    text = _words(rng, int(rng.integers(4, 40)))
    while " " in text and font.getlength(text) > w - x:   # whole words that fit, then characters
        text = text.rsplit(" ", 1)[0]
    while len(text) > 1 and font.getlength(text) > w - x:
        text = text[:-1]
    pil = Image.fromarray(np.ascontiguousarray(img[..., ::-1]))
    ImageDraw.Draw(pil).text((x, h / 2), text.strip() or "A", font=font, fill=_ink(rng), anchor="lm")
    return np.asarray(pil)[..., ::-1].copy()


def page(rng, h: int, w: int) -> np.ndarray:
    img = _paper(rng, h, w)
    y = int(rng.integers(4, max(5, h // 12)))
    while True:
        th = int(max(8, h * rng.uniform(0.015, 0.06)))
        y += th + int(th * rng.uniform(0.3, 1.2))
        if y >= h - 2:
            return img
        x = int(rng.integers(0, w // 4))
        _put_line(img, rng, x, y, th, int((w - x) * rng.uniform(0.3, 1.0)))


def page4(rng, h: int, w: int) -> np.ndarray:
    k = int(rng.integers(0, 4))
    img = page(rng, w, h) if k % 2 else page(rng, h, w)
    return np.ascontiguousarray(np.rot90(img, k))


def layout(rng, h: int, w: int) -> np.ndarray:
    img = _paper(rng, h, w)
    m = int(w * 0.06)
    y = m + int(h * 0.04)
    _put_line(img, rng, m, y, int(h * 0.035), w - 2 * m)       # title
    y += int(h * 0.03)
    while y < h - m:
        block = rng.choice(["text", "text", "table", "figure"])
        bh = int(h * rng.uniform(0.08, 0.2))
        if y + bh > h - m:
            break
        if block == "text":
            lh = max(4, int(h * 0.014))
            for ly in range(y + lh, y + bh, int(lh * 1.8)):
                _put_line(img, rng, m, ly, lh, w - 2 * m)
        elif block == "table":
            rows, cols = int(rng.integers(3, 7)), int(rng.integers(2, 5))
            for r in range(rows + 1):
                cv2.line(img, (m, y + r * bh // rows), (w - m, y + r * bh // rows), _ink(rng), 1)
            for c in range(cols + 1):
                x = m + c * (w - 2 * m) // cols
                cv2.line(img, (x, y), (x, y + bh), _ink(rng), 1)
            for r in range(rows):
                for c in range(cols):
                    _put_line(img, rng, m + c * (w - 2 * m) // cols + 3, y + (r + 1) * bh // rows - 3,
                              int(bh / rows * 0.5), (w - 2 * m) // cols - 6)
        else:
            x0 = int(rng.integers(m, w // 2))
            cv2.rectangle(img, (x0, y), (int(rng.integers(x0 + w // 6, w - m + 1)), y + bh),
                          tuple(int(v) for v in rng.uniform(60, 220, 3)), -1)
        y += bh + int(h * 0.02)
    return img


def shapes(rng, h: int, w: int) -> np.ndarray:
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = np.linspace(0, 1, h)[:, None, None]
    img = np.clip(c0 * (1 - t) + c1 * t + rng.normal(0, 4, (h, w, 3)), 0, 255).astype(np.uint8)
    s = min(h, w)
    for _ in range(int(rng.integers(3, 9))):
        kind = rng.choice(["rect", "circle", "ellipse", "poly", "skin", "char"])
        color = tuple(int(v) for v in rng.uniform(0, 255, 3))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        r = int(s * rng.uniform(0.05, 0.25))
        if kind == "rect":
            cv2.rectangle(img, (cx - r, cy - r // 2), (cx + r, cy + r), color, -1)
        elif kind == "circle":
            cv2.circle(img, (cx, cy), r, color, -1, cv2.LINE_AA)
        elif kind in ("ellipse", "skin"):
            if kind == "skin":  # BGR skin tones
                color = tuple(int(v) for v in np.array([120, 160, 210]) * rng.uniform(0.6, 1.15))
            cv2.ellipse(img, (cx, cy), (r, int(r * rng.uniform(0.4, 1.6))), float(rng.uniform(0, 180)), 0, 360,
                        color, -1, cv2.LINE_AA)
        elif kind == "poly":
            pts = (np.array([cx, cy]) + rng.integers(-r, r + 1, (int(rng.integers(3, 7)), 2))).astype(np.int32)
            cv2.fillPoly(img, [pts], color, cv2.LINE_AA)
        else:
            font = int(rng.choice(FONTS))
            cv2.putText(img, _text(rng, 1), (cx, cy), font, cv2.getFontScaleFromHeight(font, r, 3), color, 3,
                        cv2.LINE_AA)
    return img


def _skimage_data(kinds: str) -> Path:
    """scikit-image's data folder, found without importing skimage (``pip install --no-deps scikit-image`` is
    enough); ``kinds`` names what needs it in the message where it is missing."""
    import importlib.util

    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"the {kinds} kinds need scikit-image's data: pip install --no-deps scikit-image")
    return Path(spec.submodule_search_locations[0]) / "data"


@functools.cache
def _lfw_subset() -> np.ndarray:
    """scikit-image's 200 LFW crops (100 faces, then 100 non-faces), 25 x 25 in 0..1, read from the wheel."""
    return np.load(_skimage_data("faces") / "lfw_subset.npy")


def _paste(img, rng, patch: np.ndarray, tint: np.ndarray) -> None:
    """``patch`` (grey 0..1) scaled up, tinted (BGR gains), flipped at random, blended in through a soft ellipse."""
    h, w = img.shape[:2]
    size = int(min(h, w) * rng.uniform(0.15, 0.6))
    p = cv2.resize(patch.astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC)
    if rng.random() < 0.5:
        p = p[:, ::-1]
    p = np.clip(p[:, :, None] * 255 * tint, 0, 255)
    mask = np.zeros((size, size), np.float32)
    cv2.ellipse(mask, (size // 2, size // 2), (int(size * 0.45), int(size * 0.5)), 0, 0, 360, 1.0, -1)
    mask = cv2.GaussianBlur(mask, (0, 0), size * 0.05 + 0.5)[:, :, None]
    y, x = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
    region = img[y:y + size, x:x + size].astype(np.float32)
    img[y:y + size, x:x + size] = np.clip(region * (1 - mask) + p * mask, 0, 255).astype(np.uint8)


def lfw_half(half: int) -> tuple[np.ndarray, np.ndarray]:
    """(faces, non-face patches) of half 0 or 1: 50 of each, the two halves disjoint."""
    lfw = _lfw_subset()
    return lfw[:100][half * 50:(half + 1) * 50], lfw[100:][half * 50:(half + 1) * 50]


def _faces(rng, h: int, w: int, half: int) -> np.ndarray:
    faces, others = lfw_half(half)
    img = shapes(rng, h, w)
    for _ in range(int(rng.integers(0, 3))):
        _paste(img, rng, others[rng.integers(len(others))], rng.uniform(0.6, 1.2, 3))
    for _ in range(int(rng.integers(1, 4))):
        _paste_face(img, rng, faces)
    return img


def _paste_face(img, rng, faces: np.ndarray) -> None:
    """One of ``faces``, tinted to a skin tone (BGR gains), pasted (``_paste``)."""
    face = faces[rng.integers(len(faces))]
    _paste(img, rng, face, np.array([0.72, 0.85, 1.0]) * rng.uniform(0.6, 1.2))


def faces(rng, h: int, w: int) -> np.ndarray:
    return _faces(rng, h, w, 0)


def faces_held_out(rng, h: int, w: int) -> np.ndarray:
    return _faces(rng, h, w, 1)


# scikit-image's photographs of things a COCO detector knows, in two sets that share no photograph
SCENE_PHOTOS = (("astronaut.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg"),
                ("camera.png", "coffee.png", "motorcycle_right.png", "clock_motion.png"))


@functools.cache
def _photo(name: str) -> np.ndarray:
    """One of scikit-image's photographs (BGR uint8), read from the wheel's data folder."""
    img = cv2.imread(str(_skimage_data("scenes") / name), cv2.IMREAD_COLOR)
    if img is None:
        raise SystemExit(f"scikit-image's data holds no readable {name}")
    return img


def _scenes(rng, h: int, w: int, half: int) -> np.ndarray:
    """``shapes`` with one to three of the set's photographs pasted in (each cropped to 60-100% of its sides,
    scaled to 30-90% of the image's shorter side, flipped at random), and a face or two of that half of LFW."""
    img = shapes(rng, h, w)
    photos = SCENE_PHOTOS[half]
    for _ in range(int(rng.integers(1, 4))):
        src = _photo(photos[int(rng.integers(len(photos)))])
        sh, sw = src.shape[:2]
        ch, cw = int(sh * rng.uniform(0.6, 1.0)), int(sw * rng.uniform(0.6, 1.0))
        y0, x0 = int(rng.integers(0, sh - ch + 1)), int(rng.integers(0, sw - cw + 1))
        crop = src[y0:y0 + ch, x0:x0 + cw]
        scale = min(h, w) * rng.uniform(0.3, 0.9) / max(ch, cw)
        th, tw = max(8, int(ch * scale)), max(8, int(cw * scale))
        patch = cv2.resize(crop, (tw, th), interpolation=cv2.INTER_AREA)
        if rng.random() < 0.5:
            patch = patch[:, ::-1]
        y, x = int(rng.integers(0, h - th + 1)), int(rng.integers(0, w - tw + 1))
        img[y:y + th, x:x + tw] = patch
    faces, _ = lfw_half(half)
    for _ in range(int(rng.integers(0, 3))):
        _paste_face(img, rng, faces)
    return img


def scenes(rng, h: int, w: int) -> np.ndarray:
    return _scenes(rng, h, w, 0)


def scenes_held_out(rng, h: int, w: int) -> np.ndarray:
    return _scenes(rng, h, w, 1)


CAPTCHA_CHARS = string.digits + string.ascii_letters
CAPTCHA_FONT_SIZES = (42 / 60, 50 / 60, 56 / 60)   # ImageCaptcha's (42, 50, 56) at its 60-pixel height


@functools.cache
def _font(path: str, size: int):
    from PIL import ImageFont
    return ImageFont.truetype(path, size)


def _captcha_glyph(rng, char: str, font, ink: tuple):
    """One character as ImageCaptcha draws it: offset by up to (4, 6) pixels, cropped to its ink, rotated by up to
    30 degrees either way, then warped by a random quadrilateral; an RGBA image."""
    from PIL import Image, ImageDraw

    _, _, w, h = ImageDraw.Draw(Image.new("RGBA", (1, 1))).textbbox((1, 1), char, font=font)
    dx, dy = int(rng.integers(0, 5)), int(rng.integers(0, 7))
    im = Image.new("RGBA", (int(w) + dx, int(h) + dy))
    ImageDraw.Draw(im).text((dx, dy), char, font=font, fill=ink)
    im = im.crop(im.getbbox())
    im = im.rotate(float(rng.uniform(-30, 30)), Image.Resampling.BILINEAR, expand=True)
    w, h = im.size
    wx, wy = w * rng.uniform(0.1, 0.3), h * rng.uniform(0.2, 0.3)
    x1, x2 = (int(v) for v in rng.uniform(-wx, wx, 2))
    y1, y2 = (int(v) for v in rng.uniform(-wy, wy, 2))
    w2, h2 = w + abs(x1) + abs(x2), h + abs(y1) + abs(y2)
    quad = (x1, y1, -x1, h2 - y2, w2 + x2, h2 + y2, w2 - x2, -y1)
    return im.resize((w2, h2)).transform((w, h), Image.Transform.QUAD, quad)


def captcha(rng, h: int, w: int) -> np.ndarray:
    """A text captcha in the manner of the ``captcha`` package's ``ImageCaptcha`` (0.7.1), the standard generator,
    drawn from ``rng`` (ImageCaptcha draws from ``secrets``, which no seed repeats): 4 to 6 letters and digits, each
    in one of the TrueType fonts ``font_line`` uses at 0.7-0.93 of the height, offset, rotated and warped
    (``_captcha_glyph``), half of them after a gap, packed so that neighbours overlap and squeezed to the width
    where they overflow it; on a light background (each channel 238-255) in one ink colour (10-200), with 30 noise
    dots and an arc in the ink, then smoothed."""
    from PIL import Image, ImageDraw, ImageFilter

    fonts = _font_files()
    bg = tuple(int(v) for v in rng.integers(238, 256, 3))
    ink = tuple(int(v) for v in rng.integers(10, 201, 3)) + (int(rng.integers(220, 256)),)
    text = "".join(rng.choice(list(CAPTCHA_CHARS), int(rng.integers(4, 7))))
    glyphs = []
    for c in text:
        font = _font(str(fonts[int(rng.integers(len(fonts)))]),
                     max(4, int(h * CAPTCHA_FONT_SIZES[int(rng.integers(len(CAPTCHA_FONT_SIZES)))])))
        gap = rng.random() > 0.5   # ImageCaptcha's word space: a blank glyph before the character
        glyphs.append((gap, _captcha_glyph(rng, c, font, ink)))
    average = sum(g.size[0] for _, g in glyphs) // len(glyphs)
    text_width = sum(g.size[0] + (average // 2 if gap else 0) for gap, g in glyphs)
    image = Image.new("RGB", (max(text_width, w), h), bg)
    offset = int(average * 0.1)
    for gap, g in glyphs:
        offset += average // 2 if gap else 0
        image.paste(g, (offset, (h - g.size[1]) // 2), g)
        offset += g.size[0] - int(rng.integers(0, int(0.25 * average) + 1))
    image = image.resize((w, h)) if image.size[0] > w else image
    draw = ImageDraw.Draw(image)
    for x, y in zip(rng.integers(0, w + 1, 30), rng.integers(0, h + 1, 30)):
        draw.line(((int(x), int(y)), (int(x) - 1, int(y) - 1)), fill=ink, width=3)
    x1 = int(rng.integers(0, w // 5 + 1))
    x2 = int(rng.integers(w // 5, w + 1))
    y1 = int(rng.integers(h // 5, h - h // 5 + 1))
    y2 = int(rng.integers(y1, max(y1, h - h // 5) + 1))
    draw.arc((x1, y1, max(x1, x2), y2), int(rng.integers(0, 21)), int(rng.integers(160, 201)), fill=ink)
    return np.asarray(image.filter(ImageFilter.SMOOTH))[..., ::-1].copy()


DRAW = {"line": line, "upright_line": upright_line, "font_line": font_line, "page": page, "page4": page4,
        "layout": layout, "shapes": shapes, "faces": faces, "faces_held_out": faces_held_out, "scenes": scenes,
        "scenes_held_out": scenes_held_out, "captcha": captcha}


def held_out(kind: str) -> str:
    """The kind the held-out images of ``kind`` are drawn as: ``kind + "_held_out"`` where that exists (its
    calibration and held-out images share no source photograph), else ``kind`` itself (another seed)."""
    return f"{kind}_held_out" if f"{kind}_held_out" in DRAW else kind


def draw(kind: str, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    return DRAW[kind](rng, height, width)


def write_images(folder: Path, kind: str, height: int, width: int, count: int, seed: int, gray: bool = False) -> list:
    """``count`` images of ``kind`` as PNG files 0000.png ... in ``folder`` (made), from ``seed``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng, paths = np.random.default_rng(seed), []
    for i in range(count):
        img = draw(kind, height, width, rng)
        p = folder / f"{i:04d}.png"
        cv2.imwrite(str(p), cv2.cvtColor(img, cv2.COLOR_BGR2GRAY) if gray else img)
        paths.append(p)
    return paths
