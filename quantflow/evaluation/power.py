"""Whether the held-out images can decide the gate at all, estimated before any run (preflight, ``quantflow init``).

The gate PASSes a figure only when its whole bootstrap interval meets the limit (``intervals``), and the interval
of a figure measured on n images is about z * spread / sqrt(n) wide: a tight limit on few images cannot be met
whatever INT8 does, short of changing nothing.  For each gated figure this module states, from the images the
gate will judge and the limit alone, the least number of images at which a PASS is reachable under a stated
assumption, and how much INT8 may change on the images there are:

- **a drop** (top-1's ``evaluation.threshold``, a class's ``max_class_drop``, a task metric's ``*_drop``): the
  gate's paired model, one value per image (FP32 right minus INT8 right: +1 an image INT8 loses, -1 one it
  gains).  ``k`` images lost net, none gained, put the bootstrap's high end at the upper ``confidence`` quantile
  of Binomial(n, k / n) over n (each image is drawn about Poisson(1) times): ``max_net_lost`` is the largest k
  that still PASSes (0: only an INT8 that loses no image net can pass).  With no net loss but a share ``p`` of
  the images flipped both ways (INT8 rarely changes nothing), the high end is about z * sqrt(p / n), so a PASS
  needs n >= z^2 p / t^2 (``FLIP_RATE``: the assumed p).
- **a share** that must reach a (``min`` limits in (0, 1): agreement, F1, IoU) or stay under b (``max`` limits in
  (0, 1): an error rate such as CER), treated as a proportion over images: INT8 assumed halfway between the limit
  and perfect (x = (1 + a) / 2), the binomial interval's low end x - z sqrt(x (1 - x) / n) meets a at
  n >= z^2 (1 + a) / (1 - a) (likewise for b).  A share pooled over boxes, characters or pixels varies less than
  over images, so this errs towards more images.
- **cosine and SQNR** (outputs, parts) and other numbers: their spread over images depends on the network; not
  estimated (the first build's report states the images that would decide an UNDECIDED figure).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

# The assumed share of held-out images whose top-1 correctness INT8 changes (both ways, no net loss): a network
# INT8 treats well flips 1 image in 100-300 (0.3% on examples/mobilenet_v1_imbalanced retrained), a hard one
# about 5% (issue 36's mobilenet_v3_small-style classifier: 3.3 points [0, 6.6] on 181 images); 2% between them.
FLIP_RATE = 0.02
EXACT = 2000        # images lost up to which binomial_upper sums the binomial exactly
TOLERANCE = 1e-12   # a high end on the limit meets it (intervals.TOLERANCE)


@dataclass(frozen=True)
class Reach:
    """One gated figure's estimate: ``needed`` images for a PASS to be reachable under ``assumption`` (None: not
    estimated), against the ``images`` the gate will judge; ``max_net_lost``: for a drop, the most images INT8
    may lose net (none gained) and still PASS on those images."""
    figure: str
    kind: str            # "max" (stays under) or "min" (reaches)
    limit: float
    images: int
    needed: int | None
    assumption: str
    confidence: float
    max_net_lost: int | None = None

    @property
    def reachable(self) -> bool | None:
        return None if self.needed is None else self.images >= self.needed

    def record(self) -> dict:
        return dict(asdict(self), reachable=self.reachable)


def z_of(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence`` (1.96 at 95%)."""
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def binomial_upper(n: int, k: int, confidence: float) -> int:
    """The upper two-sided ``confidence`` quantile of Binomial(n, k / n): how often k images (of n) are drawn, at
    most, in all but the top (1 - confidence) / 2 of the bootstrap's draws."""
    if k <= 0:
        return 0
    if k >= n:
        return n
    p, q = k / n, 1 - (1 - confidence) / 2
    if k > EXACT:   # the normal approximation, within an image of the exact quantile there
        return min(n, math.ceil(k + z_of(confidence) * math.sqrt(k * (1 - p))))
    log_p, log_1p = math.log(p), math.log1p(-p)
    cdf = 0.0
    for j in range(n + 1):
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * log_p
                        + (n - j) * log_1p)
        if cdf >= q:
            return j
    return n


def drop_high(n: int, lost: int, confidence: float) -> float:
    """The bootstrap interval's high end of a drop of ``lost`` images (none gained) out of ``n``."""
    return binomial_upper(n, lost, confidence) / n


def max_net_lost(n: int, limit: float, confidence: float) -> int:
    """The most images INT8 may lose net (none gained) on ``n`` images with the drop's interval still within
    ``limit`` (the high end grows with the images lost: a bisection)."""
    low, high = 0, n          # low passes (no image lost: [0, 0]); the answer is in [low, high]
    while low < high:
        mid = (low + high + 1) // 2
        if drop_high(n, mid, confidence) <= limit + TOLERANCE:
            low = mid
        else:
            high = mid - 1
    return low


def drop_needed(limit: float, confidence: float, flip_rate: float = FLIP_RATE) -> int | None:
    """Images at which a drop of 0 with ``flip_rate`` of the images flipped both ways PASSes ``limit``; None for
    a limit of 0 (only an INT8 that changes no image passes it, on any number of images)."""
    return math.ceil(z_of(confidence) ** 2 * flip_rate / limit ** 2) if limit > 0 else None


def share_needed(limit: float, kind: str, confidence: float) -> int:
    """Images at which a per-image share halfway between ``limit`` and perfect has its binomial interval meet it
    (``kind`` "min": at least ``limit``; "max": an error share at most ``limit``)."""
    a = limit if kind == "min" else 1 - limit
    return math.ceil(z_of(confidence) ** 2 * (1 + a) / (1 - a))


def drop_reach(figure: str, limit: float, images: int, confidence: float, flip_rate: float = FLIP_RATE) -> Reach:
    said = (f"no net loss, {flip_rate:.0%} of the images flipped both ways" if limit > 0 else
            "a limit of 0 passes only where INT8 changes no image's result")
    return Reach(figure, "max", limit, images, drop_needed(limit, confidence, flip_rate), said, confidence,
                 max_net_lost(images, limit, confidence))


def number_reach(name: str, kind: str, limit: float, images: int, confidence: float) -> Reach:
    """A task metric's limited number: a drop (its name ends in ``_drop``), a share in (0, 1), or not estimated."""
    if name.endswith("_drop") and kind == "max":
        return drop_reach(name, limit, images, confidence)
    if 0 < limit < 1:
        side = "above" if kind == "min" else "below"
        return Reach(name, kind, limit, images, share_needed(limit, kind, confidence),
                     f"a per-image share halfway {side} the limit to perfect", confidence)
    return Reach(name, kind, limit, images, None, "not a drop or a share: its spread is known only after a run",
                 confidence)


def gated(cfg, images: int, smallest_class: int | None = None) -> list[Reach]:
    """Every gated figure of ``cfg`` with its estimate on ``images`` gate images (``smallest_class``: the fewest
    gate images of one class, for ``evaluation.max_class_drop``)."""
    e = cfg.evaluation
    c = e.confidence
    if e.metric == "top1":
        out = [drop_reach("top-1 drop", e.threshold, images, c)]
        if e.max_class_drop is not None and smallest_class is not None:
            out.append(drop_reach("top-1 drop of the smallest class", e.max_class_drop, smallest_class, c))
        return out
    out = []
    if e.task:
        for kind, limits in task_limits(e).items():
            out += [number_reach(name, kind, limit, images, c) for name, limit in limits.items()]
    if e.metric == "outputs" or e.parts:
        out.append(Reach("cosine / SQNR of the outputs and parts", "min", e.min_cosine, images, None,
                         "their spread over images depends on the network: known only after a run", c))
    return out


def task_limits(e) -> dict[str, dict[str, float]]:
    """The limits the task metric will be judged on: its defaults on the numbers it returns without labels (as
    ``quantflow init`` writes them), with ``evaluation.min`` / ``.max`` over them."""
    from .task import TaskMetric

    metric = TaskMetric(e.metric, dict(e.options))
    try:
        returned = set(metric.summarize([]))
    except Exception:  # a metric that cannot summarize nothing: only the configured limits are known
        returned = set()
    return {kind: {**{k: v for k, v in metric.defaults[kind].items() if k in returned}, **dict(getattr(e, kind))}
            for kind in ("min", "max")}


def _pts(x: float, drop: bool) -> str:
    return (f"{x * 100:.3g} point{'' if x == 0.01 else 's'}") if drop else f"{x:g}"


def max_flip_rate(r: Reach) -> float | None:
    """For a drop: the largest share of images INT8 may flip both ways (no net loss) and still PASS on the gate's
    images, n t^2 / z^2 (the inverse of ``drop_needed``)."""
    return None if r.max_net_lost is None else r.images * r.limit ** 2 / z_of(r.confidence) ** 2


def max_changed(images: int, limit: float, confidence: float) -> int:
    """For a drop: the most images whose result INT8 may change on ``images`` images, as many lost as gained, with
    the drop's interval still within ``limit``: (n t / z)^2, the count ``max_flip_rate`` is the share of."""
    return int(math.floor((images * limit / z_of(confidence)) ** 2 + 1e-9))


def line(r: Reach, folder_images: int | None = None) -> str:
    """One line: the figure, the gate's images, the images a PASS needs, a WARNING when they are too few.
    ``folder_images``: what the gate images are taken from (so that the line can say how big it must be)."""
    drop = r.max_net_lost is not None
    head = f"{r.figure} {'<=' if r.kind == 'max' else '>='} {_pts(r.limit, drop)} judged on {r.images} image(s)"
    if r.needed is None:
        return f"{head}: images needed not estimated ({r.assumption})"
    said = f"{head}: a PASS needs about {r.needed} ({r.assumption})"
    if drop:
        said += (f"; on {r.images}, INT8 may lose {'no image' if not r.max_net_lost else f'{r.max_net_lost} image(s)'}"
                 f" net and flip about {max_flip_rate(r):.2%} of them both ways")
        if not r.max_net_lost and r.images:
            said += (f" (one image lost puts the interval's high end at "
                     f"{drop_high(r.images, 1, r.confidence) * 100:.3g} points)")
    if not r.reachable:
        scale = f" (about {math.ceil(r.needed * folder_images / r.images)} in the folder)" if (
            folder_images and folder_images != r.images) else ""
        # a drop that some net loss can still pass is a note: the flip rate is an assumption, and a network INT8
        # flips less passes on these images; no room for a single image lost, or a share, is a warning
        level = "note" if drop and r.max_net_lost else "WARNING"
        said += (f". {level}: fewer images than a PASS needs {'at that flip rate' if drop else 'by this estimate'}: "
                 f"add about {r.needed - r.images}{scale}, or widen the limit")
    return said
